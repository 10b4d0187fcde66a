//! What every tenure-kube test shares: the throwaway API server (one per test binary)
//! and connections to a fresh namespace as the tenant service account, whose only
//! permissions are the documented Role on leases.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use tenure::{LeaseLeaderElector, LeaseLeaderOptions};
use tenure_kube::{KubeConnection, KubeLeaseStore, KubeUrl};
use tenure_testkit::kube::KubeServer;

/// How far past a TTL tests wait before expecting a term to have lapsed: observation
/// is exact on this process's clock, so only scheduling delay matters.
pub const EXPIRY_MARGIN: Duration = Duration::from_millis(150);

/// The API server of this test binary.
pub fn server() -> &'static KubeServer {
    KubeServer::shared().expect("throwaway kube-apiserver")
}

/// A new namespace with the tenant's RoleBinding in it.
pub fn new_namespace(prefix: &str) -> String {
    server().new_namespace(prefix).expect("new namespace")
}

/// A connection to `namespace` as the tenant service account.
pub async fn tenant(namespace: &str) -> KubeConnection {
    let path = server()
        .tenant_kubeconfig(namespace)
        .expect("tenant kubeconfig");
    connect_kubeconfig(&path, "kube:").await
}

/// An elector for `owner` on a connection of its own to `namespace` (as another
/// process would have): terms of `ttl`, renewed every second, retried every half second.
pub async fn elector(namespace: &str, owner: &str, ttl: Duration) -> LeaseLeaderElector {
    let store = Arc::new(KubeLeaseStore::new(tenant(namespace).await));
    let options = LeaseLeaderOptions {
        owner_id: owner.to_owned(),
        lease_ttl: ttl,
        renew_interval: Duration::from_secs(1),
        retry_interval: Duration::from_millis(500),
        ..Default::default()
    };
    LeaseLeaderElector::new(store, options).unwrap()
}

/// A connection from a kubeconfig file and a `kube:` URL.
pub async fn connect_kubeconfig(path: &std::path::Path, url: &str) -> KubeConnection {
    try_connect_kubeconfig(path, url)
        .await
        .unwrap_or_else(|error| panic!("connect with {}: {error}", path.display()))
}

/// [`connect_kubeconfig`], returning the error.
pub async fn try_connect_kubeconfig(
    path: &std::path::Path,
    url: &str,
) -> tenure::Result<KubeConnection> {
    let kubeconfig = kube::config::Kubeconfig::read_from(path).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("config");
    tenure_kube::connect_with(config, &KubeUrl::parse(url).unwrap()).await
}

/// A connection to a fresh namespace.
pub async fn fresh(prefix: &str) -> KubeConnection {
    tenant(&new_namespace(prefix)).await
}

/// The requests one client sent (watches left out: they are long-lived streams, not
/// requests per operation), as `VERB path`, in order.
#[derive(Clone, Debug, Default)]
pub struct Requests(std::sync::Arc<parking_lot::Mutex<Vec<String>>>);

impl Requests {
    /// Everything sent since the last `take`.
    pub fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock())
    }
}

/// Counts the requests of the client it wraps into [`Requests`].
#[derive(Clone)]
struct Counting<S> {
    inner: S,
    requests: Requests,
}

impl<S, B> tower::Service<http::Request<B>> for Counting<S>
where
    S: tower::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let query = request.uri().query().unwrap_or_default();
        let watch = query
            .split('&')
            .any(|pair| pair == "watch=true" || pair == "watch=1");
        if !watch {
            let line = format!("{} {}", request.method(), request.uri().path());
            self.requests.0.lock().push(line);
        }
        self.inner.call(request)
    }
}

struct CountingLayer(Requests);

impl<S> tower::Layer<S> for CountingLayer {
    type Service = Counting<S>;

    fn layer(&self, inner: S) -> Counting<S> {
        Counting {
            inner,
            requests: self.0.clone(),
        }
    }
}

/// A store on `namespace` as the tenant, whose requests are counted.
pub async fn counted(namespace: &str) -> (KubeLeaseStore, Requests) {
    let path = server()
        .tenant_kubeconfig(namespace)
        .expect("tenant kubeconfig");
    let kubeconfig = kube::config::Kubeconfig::read_from(&path).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("config");
    let requests = Requests::default();
    let client = kube::client::ClientBuilder::try_from(config)
        .expect("client")
        .with_layer(&CountingLayer(requests.clone()))
        .build();
    let connection = KubeConnection::new(client, namespace);
    (KubeLeaseStore::new(connection), requests)
}

/// Runs `kubectl` as the admin against the shared server; a failure fails the test.
pub fn kubectl(args: &[&str]) -> String {
    server()
        .kubectl(args)
        .unwrap_or_else(|error| panic!("kubectl {args:?}: {error}"))
}

/// One field of a Lease object, by JSONPath.
pub fn field(namespace: &str, object: &str, path: &str) -> String {
    kubectl(&[
        "get",
        "lease",
        "-n",
        namespace,
        object,
        "-o",
        &format!("jsonpath={path}"),
    ])
}

/// The request line of a `PUT` of a Lease object, as the request log shows it.
pub fn put(namespace: &str, object: &str) -> String {
    format!("PUT /apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{object}")
}
