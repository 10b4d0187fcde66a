//! `kube:throwaway` and `kube:NAMESPACE`: the Kubernetes store beside the conditional
//! Lease updates client-go makes, and its release handover beside a watch-woken raw one.
//!
//! On Kubernetes every lease operation is one or more HTTPS requests to the API server,
//! which writes to its etcd: the store's cost is which requests it sends, so the raw side
//! sends what client-go's `LeaderElector` (v0.36.3) sends for the same operation, with
//! kube-rs directly on plain `Lease` objects (no annotations, no epoch counter):
//!
//! - acquire: `GET`, then `POST` of a new object (or `PUT` of a released one, with
//!   `leaseTransitions + 1`, on the `resourceVersion` read);
//! - renew: `GET`, then `PUT` on the `resourceVersion` read (client-go's slow path). Its
//!   fast path, a bare `PUT` on the object it last wrote, is an extra row (`renew-put`):
//!   it is what the store does too when it wrote the term itself;
//! - release: `GET`, then `PUT` clearing `holderIdentity`, as client-go's `release`;
//! - heartbeat: `GET`, then `PUT` (or `POST`) of a member's object, as a client with no
//!   cached object renews a Lease (client-go has no membership). The registry itself
//!   sends one `PUT` on the object it last wrote (a `GET` only after a 409);
//! - takeover (extra row): acquire of a role whose object exists, released: `GET`, then
//!   `PUT`, where the `acquire` row always creates (the store then also takes an epoch
//!   from the namespace's counter object: one more request, a `PUT` of the counter as the
//!   store last wrote it, shared by every acquire waiting at that moment).
//!
//! Store and raw clients each share one `kube::Client` (a connection pool), as a
//! process's stores do. `kube:throwaway` starts a kube-apiserver on its own etcd
//! ([`KubeServer`]) and runs everything as the tenant service account in a fresh
//! namespace, so the documented RBAC (leases: get, list, watch, create, update, patch) is
//! what is measured; `kube:NAMESPACE` uses the kubeconfig (or the pod's service account)
//! as `kubectl` would.
//!
//! Requests come from the API server's own counters, `apiserver_request_total` of
//! `leases` in `coordination.k8s.io` (every verb but `WATCH`, whose count comes when a
//! watch ends), read from `/metrics` (as the admin on a throwaway server). They count
//! every client's lease requests, the API server's own among them: it renews its identity
//! lease every 10 s, which a shard run's quiet window measures. The release floor is the
//! same handover without the store or the elector: a bare `PUT` release, the contender's
//! watch event, its `PUT` on the event's `resourceVersion`.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::{Stream, StreamExt};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, DeleteParams, ListParams, WatchEvent, WatchParams};
use parking_lot::Mutex;
use tenure::{Error, LeaseStore, Result};
use tenure_kube::names::{object_name, Kind};
use tenure_kube::{KubeConnection, KubeLeaseStore, KubeNodeRegistry, KubeUrl};
use tenure_throwaway::kube::KubeServer;
use tokio::time::{timeout, Instant};

use crate::backend::{blocking, Backend, Client, Counter, ExtraCell, ExtraKind, Handles};
use crate::failover::STALL_RETRY;
use crate::report::Floor;
use crate::stats::summarize;
use crate::BenchError;

mod raw;
mod scrape;

use raw::RawClient;
use scrape::Scrape;

const BACKEND: &str = tenure_kube::BACKEND;

/// The longest wait for one metrics read or one step of the release floor.
const STEP_TIMEOUT: Duration = Duration::from_secs(10);

/// A label on the raw side's objects naming the run (client-go's `LeaseLock` may set
/// labels too), so a run in a user's namespace finds them to delete.
const RUN_LABEL: &str = "tenure.dev/bench-run";

/// The annotation tenure-kube puts the role's or member's name in (`docs/semantics.md`,
/// "Kubernetes"): how a run in a user's namespace finds the store's objects.
const NAME_ANNOTATION: &str = "tenure.dev/name";

/// How old the last scrape may be for [`Backend::rows_written`] to answer from it: the
/// shard bench reads both counters of one snapshot back to back.
const SCRAPE_REUSE: Duration = Duration::from_secs(1);

/// The namespace prefix of `kube:throwaway`.
const NAMESPACE_PREFIX: &str = "tenure-bench";

fn err(what: &'static str) -> impl FnOnce(kube::Error) -> Error {
    move |e| Error::store(BACKEND, what, e)
}

fn secs(d: Duration) -> i32 {
    i32::try_from(d.as_secs()).unwrap_or(i32::MAX)
}

fn micro_now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

pub(crate) struct Kube {
    /// What every store and raw client connects with (on a throwaway server: the tenant
    /// service account's token).
    config: kube::Config,
    namespace: String,
    run_id: String,
    /// The client `/metrics` is read with, or why requests cannot be counted.
    metrics: std::result::Result<kube::Client, String>,
    /// The last scrape and when it was taken.
    last: Mutex<Option<(Instant, Scrape)>>,
    /// The throwaway server's etcd (`host:port`), for its version.
    etcd: Option<String>,
    server: Mutex<Option<KubeServer>>,
}

/// A kubeconfig file as a client configuration.
async fn config_from(path: &Path) -> Result<kube::Config, BenchError> {
    let setup = |e: &dyn std::fmt::Display| {
        BenchError::Setup(format!(
            "cannot read the kubeconfig {}: {e}",
            path.display()
        ))
    };
    let kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(|e| setup(&e))?;
    kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .map_err(|e| setup(&e))
}

fn client(config: &kube::Config) -> Result<kube::Client> {
    kube::Client::try_from(config.clone())
        .map_err(|e| Error::store(BACKEND, "cannot make a Kubernetes client", e))
}

impl Kube {
    /// The user's cluster, as `kubectl` finds it, in the namespace `url` names.
    pub(crate) async fn open(url: &str, run_id: &str) -> Result<Kube, BenchError> {
        let url = KubeUrl::parse(url).map_err(|e| BenchError::Usage(format!("--store: {e}")))?;
        let config = kube::Config::infer().await.map_err(|e| {
            BenchError::Setup(format!(
                "no Kubernetes configuration found: not in a pod (no service account) and no \
                 kubeconfig ($KUBECONFIG or ~/.kube/config): {e}"
            ))
        })?;
        let metrics = client(&config)?;
        Kube::new(config, &url, run_id, metrics, None).await
    }

    /// Starts a kube-apiserver on its own etcd, makes a namespace bound to the tenant
    /// service account, and measures as that account; everything is removed when the
    /// run ends.
    pub(crate) async fn throwaway(run_id: &str) -> Result<Kube, BenchError> {
        let (server, namespace, tenant, admin) =
            blocking("start a throwaway Kubernetes API server", || {
                let server = KubeServer::start()?;
                let namespace = server.new_namespace(NAMESPACE_PREFIX)?;
                let tenant = server.tenant_kubeconfig(&namespace)?;
                let admin = server.admin_kubeconfig().to_path_buf();
                Ok((server, namespace, tenant, admin))
            })
            .await?;
        let etcd = server.etcd().host_port();
        let url = KubeUrl::parse(&format!("kube:{namespace}"))?;
        // Counters are read as the admin: the tenant may read leases only.
        let metrics = client(&config_from(&admin).await?)?;
        let config = config_from(&tenant).await?;
        Kube::new(config, &url, run_id, metrics, Some((server, etcd))).await
    }

    async fn new(
        config: kube::Config,
        url: &KubeUrl,
        run_id: &str,
        metrics: kube::Client,
        server: Option<(KubeServer, String)>,
    ) -> Result<Kube, BenchError> {
        let (server, etcd) = server.unzip();
        // Checks the namespace and the permissions, with errors that say what to fix.
        let conn = tenure_kube::connect_with(config.clone(), url).await?;
        let mut kube = Kube {
            config,
            namespace: conn.namespace,
            run_id: run_id.to_owned(),
            metrics: Ok(metrics),
            last: Mutex::new(None),
            etcd,
            server: Mutex::new(server),
        };
        if let Err(problem) = kube.scrape().await {
            kube.metrics = Err(format!(
                "the API server's /metrics is not readable with this configuration (it needs \
                 get on the non-resource URL /metrics, e.g. the ClusterRole \
                 system:monitoring): {problem}"
            ));
        }
        Ok(kube)
    }

    fn connection(&self) -> Result<KubeConnection> {
        Ok(KubeConnection::new(
            client(&self.config)?,
            self.namespace.clone(),
        ))
    }

    fn raw_clients(&self, clients: usize, bare: bool) -> Result<Vec<Box<dyn Client>>> {
        let api = Api::namespaced(client(&self.config)?, &self.namespace);
        Ok((0..clients)
            .map(|_| Box::new(RawClient::new(api.clone(), &self.run_id, bare)) as Box<dyn Client>)
            .collect())
    }

    /// Reads `/metrics` once; the error says why it could not.
    async fn scrape(&self) -> std::result::Result<Scrape, String> {
        let client = self.metrics.as_ref().map_err(String::clone)?;
        let request = http::Request::get("/metrics")
            .body(Vec::new())
            .map_err(|e| e.to_string())?;
        let body = timeout(STEP_TIMEOUT, client.request_text(request))
            .await
            .map_err(|_| format!("no answer within {STEP_TIMEOUT:?}"))?
            .map_err(|e| match e {
                kube::Error::Api(status) => format!("{} {}", status.code, status.message),
                other => other.to_string(),
            })?;
        let scrape = Scrape::parse(&body);
        if scrape.counts.is_empty() {
            return Err("no apiserver_request_total counters of leases".to_owned());
        }
        let mut last = self.last.lock();
        if let Some((_, earlier)) = last.as_ref() {
            tracing::debug!(
                added = %scrape.added_since(earlier),
                "lease requests since the last count"
            );
        }
        *last = Some((Instant::now(), scrape.clone()));
        Ok(scrape)
    }

    async fn counted(&self, pick: fn(&Scrape) -> u64) -> Result<Counter> {
        if let Err(problem) = &self.metrics {
            return Ok(Counter::NotMeasured(problem.clone()));
        }
        let scrape = self.scrape().await.map_err(|problem| {
            Error::store_msg(
                BACKEND,
                format!("cannot read the API server's counters: {problem}"),
            )
        })?;
        Ok(Counter::Count(pick(&scrape)))
    }

    /// Deletes this run's objects from a user's namespace: the raw side's (by label)
    /// and the store's roles and members (by the name tenure-kube annotates them with).
    /// Ended session objects carry no owner and stay, as tenure leaves them. Returns how
    /// many were deleted.
    async fn remove_objects(&self) -> Result<usize> {
        let api: Api<Lease> = Api::namespaced(client(&self.config)?, &self.namespace);
        let listed = api
            .list(&ListParams::default())
            .await
            .map_err(err("listing the bench's leases"))?;
        let ours = listed.into_iter().filter(|lease| {
            let meta = &lease.metadata;
            let by = |map: &Option<BTreeMap<String, String>>, key: &str| {
                map.as_ref().and_then(|m| m.get(key)).cloned()
            };
            by(&meta.labels, RUN_LABEL).as_deref() == Some(self.run_id.as_str())
                || by(&meta.annotations, NAME_ANNOTATION)
                    .is_some_and(|name| name.starts_with(&self.run_id))
        });
        let mut deleted = 0;
        for name in ours.filter_map(|lease| lease.metadata.name) {
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => deleted += 1,
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(kube::Error::Api(status)) => {
                    return Err(Error::store_msg(
                        BACKEND,
                        format!("deleting lease {name}: {} {}", status.code, status.message),
                    ))
                }
                Err(error) => {
                    return Err(Error::store(BACKEND, "deleting the bench's leases", error))
                }
            }
        }
        Ok(deleted)
    }

    /// Release handovers on raw clients: A holds the object and releases it with a bare
    /// `PUT`; B, watching it, takes it with a `PUT` on the event's object. Untimed
    /// between trials: B releases and A takes it back.
    async fn floor_trials(&self, trials: usize, run_id: &str) -> Result<Vec<Duration>> {
        let mut a = RawClient::new(
            Api::namespaced(client(&self.config)?, &self.namespace),
            run_id,
            true,
        );
        let mut b = RawClient::new(
            Api::namespaced(client(&self.config)?, &self.namespace),
            run_id,
            true,
        );
        let role = format!("{run_id}-floor");
        let name = object_name(Kind::Role, &role);
        a.acquire(&role, "floor-a").await?;
        let version = a.version_of(&name)?;
        let params = WatchParams::default()
            .fields(&format!("metadata.name={name}"))
            .timeout(290);
        let mut events = b
            .api
            .watch(&params, &version)
            .await
            .map_err(err("watching the floor's lease"))?
            .boxed();
        let mut samples = Vec::with_capacity(trials);
        for _ in 0..trials {
            tokio::time::sleep(Duration::from_millis(5)).await;
            let start = Instant::now();
            a.release_cached(&name).await?;
            let released = next_event(&mut events, |spec| holder(spec).is_none()).await?;
            b.take(released, "floor-b").await?;
            samples.push(start.elapsed());
            b.release_cached(&name).await?;
            a.acquire(&role, "floor-a").await?;
            // Past B's own writes and A's retake, so the next release is the next event
            // B waits for.
            let version = a.version_of(&name)?;
            loop {
                let lease = next_event(&mut events, |_| true).await?;
                if lease.metadata.resource_version.as_deref() == Some(version.as_str()) {
                    break;
                }
            }
        }
        Ok(samples)
    }
}

/// The holder of a Lease's spec, when it names one.
fn holder(spec: &LeaseSpec) -> Option<&str> {
    spec.holder_identity.as_deref().filter(|h| !h.is_empty())
}

type Events = std::pin::Pin<Box<dyn Stream<Item = kube::Result<WatchEvent<Lease>>> + Send>>;

/// The next watch event's object that `wanted` accepts (skipping others).
async fn next_event(events: &mut Events, wanted: impl Fn(&LeaseSpec) -> bool) -> Result<Lease> {
    loop {
        let event = timeout(STEP_TIMEOUT, events.next())
            .await
            .map_err(|_| Error::store_msg(BACKEND, "no watch event within 10 s"))?
            .ok_or_else(|| Error::store_msg(BACKEND, "the watch ended"))?
            .map_err(err("watching the floor's lease"))?;
        match event {
            WatchEvent::Added(lease) | WatchEvent::Modified(lease) => {
                if wanted(lease.spec.as_ref().unwrap_or(&LeaseSpec::default())) {
                    return Ok(lease);
                }
            }
            WatchEvent::Bookmark(_) => {}
            WatchEvent::Deleted(_) => {
                return Err(Error::store_msg(BACKEND, "the floor's lease was deleted"))
            }
            WatchEvent::Error(status) => {
                return Err(Error::store_msg(
                    BACKEND,
                    format!("the watch failed: {} {}", status.code, status.message),
                ))
            }
        }
    }
}

#[async_trait]
impl Backend for Kube {
    async fn stores(&self, _clients: usize, registry_ttl: Duration) -> Result<Handles> {
        let conn = self.connection()?;
        Ok(Handles {
            leases: Arc::new(KubeLeaseStore::new(conn.clone())),
            registry: Arc::new(KubeNodeRegistry::new(conn, registry_ttl)?),
        })
    }

    async fn raw(&self, clients: usize) -> Result<Vec<Box<dyn Client>>> {
        self.raw_clients(clients, false)
    }

    fn raw_label(&self) -> &'static str {
        "client-go v0.36.3's LeaderElector requests on plain Lease objects, sent with kube-rs \
         (one kube::Client shared by the clients, as the store's are): acquire = GET, then \
         POST; renew = GET, then PUT on the resourceVersion read (client-go's slow path; the \
         bare PUT of its fast path is row renew-put); release = GET, then PUT clearing the \
         holder; heartbeat = GET, then PUT of a member's object (the registry: one PUT on the \
         object it last wrote)"
    }

    async fn extra_cells(&self, clients: usize) -> Result<Vec<ExtraCell>> {
        Ok(vec![
            ExtraCell {
                kind: ExtraKind::Renew,
                op: "renew-put",
                baseline: "a bare PUT on the object this client last wrote (client-go's fast \
                           path; no read), the request the store sends to renew a term it wrote",
                raw: self.raw_clients(clients, true)?,
            },
            ExtraCell {
                kind: ExtraKind::Takeover,
                op: "takeover",
                baseline: "acquire of an existing, released Lease as client-go does it: GET, \
                           then PUT with the new holder and leaseTransitions + 1",
                raw: self.raw_clients(clients, false)?,
            },
        ])
    }

    async fn pair(&self) -> Result<(Arc<dyn LeaseStore>, Arc<dyn LeaseStore>)> {
        Ok((
            Arc::new(KubeLeaseStore::new(self.connection()?)),
            Arc::new(KubeLeaseStore::new(self.connection()?)),
        ))
    }

    async fn requests(&self) -> Result<Counter> {
        self.counted(Scrape::requests).await
    }

    fn requests_label(&self) -> &'static str {
        if self.etcd.is_some() {
            "Lease requests the API server counted (apiserver_request_total of leases, every \
             verb but WATCH, from its /metrics), its own among them: it renews its identity \
             lease with a PUT every 10 s"
        } else {
            "Lease requests the API server that answered /metrics counted \
             (apiserver_request_total of leases, every verb but WATCH): every client's in the \
             cluster (kubelets, controllers), and only that API server's share of them"
        }
    }

    async fn rows_written(&self) -> Result<Counter> {
        let recent = self
            .last
            .lock()
            .as_ref()
            .filter(|(at, _)| at.elapsed() < SCRAPE_REUSE)
            .map(|(_, scrape)| scrape.writes());
        match (recent, &self.metrics) {
            (Some(writes), Ok(_)) => Ok(Counter::Count(writes)),
            _ => self.counted(Scrape::writes).await,
        }
    }

    fn rows_label(&self) -> &'static str {
        "Lease objects written: POST, PUT, PATCH and DELETE of leases that succeeded (2xx), \
         from the same counters"
    }

    fn counts_own_traffic(&self) -> bool {
        true
    }

    fn observes_expiry(&self) -> bool {
        true
    }

    fn creates_contend(&self) -> bool {
        true
    }

    async fn release_floor(&self, trials: usize, run_id: &str) -> Result<Floor> {
        Ok(Floor {
            label: "raw: PUT releasing (no read) -> the contender's watch event -> its PUT on \
                    the event's resourceVersion"
                .to_owned(),
            latency: Some(summarize(&self.floor_trials(trials, run_id).await?)),
            bound_ms: None,
        })
    }

    fn release_goal_ms(&self) -> Option<f64> {
        Some(10.0)
    }

    /// The goal: TTL + the follower's retry interval + 100 ms.
    fn stall_goal(&self) -> Duration {
        STALL_RETRY + Duration::from_millis(100)
    }

    async fn version(&self) -> Option<String> {
        let kubernetes = client(&self.config)
            .ok()?
            .apiserver_version()
            .await
            .ok()?
            .git_version;
        let Some(etcd) = &self.etcd else {
            return Some(format!("Kubernetes {kubernetes}"));
        };
        let answer = timeout(STEP_TIMEOUT, crate::http::get(etcd, "/version"))
            .await
            .ok()
            .and_then(Result::ok)
            .and_then(|body| serde_json::from_str::<serde_json::Value>(&body).ok());
        let etcd = answer
            .as_ref()
            .and_then(|v| v["etcdserver"].as_str())
            .unwrap_or("?");
        Some(format!(
            "Kubernetes {kubernetes} on etcd {etcd} (throwaway API server)"
        ))
    }

    async fn close(&self) {
        let server = self.server.lock().take();
        match server {
            // Killing the servers removes their data with them.
            Some(server) => {
                let _ = tokio::task::spawn_blocking(move || drop(server)).await;
            }
            None => match self.remove_objects().await {
                Ok(deleted) => tracing::info!(deleted, "removed the bench's Lease objects"),
                Err(error) => tracing::warn!(
                    %error,
                    namespace = %self.namespace,
                    "cannot delete the bench's Lease objects (the documented Role has no \
                     delete): delete the namespace, or the leases whose tenure.dev/name \
                     annotation or tenure.dev/bench-run label names this run"
                ),
            },
        }
    }
}
