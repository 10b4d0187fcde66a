//! Reaching the API server: `kube:` URLs, connecting, and errors that say what to fix.
//!
//! `kube:` takes the namespace from where the configuration came from (the service
//! account's namespace in a pod, the kubeconfig context's namespace elsewhere, else
//! `default`); `kube:NAMESPACE` names it. The configuration itself is found as
//! `kubectl` finds it ([`kube::Config::infer`]): `$KUBECONFIG` or `~/.kube/config`, else
//! the pod's service account.

use std::sync::Arc;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, PostParams};
use tenure::{Error, Result};

use crate::links::SessionLinks;
use crate::record::new_object;
use crate::BACKEND;

/// The permissions every tenure process needs, for messages.
pub const NEEDED_RBAC: &str = "a Role granting get, list, watch, create, update and patch on \
                               leases (apiGroup coordination.k8s.io)";

/// A parsed `kube:` or `kube:NAMESPACE` URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KubeUrl {
    namespace: Option<String>,
}

impl KubeUrl {
    /// Parses `kube:` or `kube:NAMESPACE`; a namespace must be a DNS label (at most 63
    /// characters of `[a-z0-9-]`, starting and ending with a letter or digit).
    pub fn parse(raw: &str) -> Result<KubeUrl> {
        let bad = |reason: String| Error::invalid("url", reason);
        let rest = raw
            .strip_prefix("kube:")
            .ok_or_else(|| bad("a Kubernetes store URL starts with kube:".to_owned()))?;
        if rest.starts_with("//") {
            return Err(bad(
                "kube: takes a namespace, not a server address (kube:NAMESPACE); the server \
                 comes from the kubeconfig or the pod's service account"
                    .to_owned(),
            ));
        }
        if rest.is_empty() {
            return Ok(KubeUrl { namespace: None });
        }
        validate_namespace(rest).map_err(bad)?;
        Ok(KubeUrl {
            namespace: Some(rest.to_owned()),
        })
    }

    /// The namespace the URL names, if it names one.
    pub fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }
}

fn validate_namespace(namespace: &str) -> std::result::Result<(), String> {
    let bytes = namespace.as_bytes();
    let valid = !bytes.is_empty()
        && bytes.len() <= 63
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[0] != b'-'
        && bytes[bytes.len() - 1] != b'-';
    if valid {
        Ok(())
    } else {
        Err(format!(
            "{namespace:?} is not a Kubernetes namespace name (1 to 63 characters of a-z, 0-9 \
             and '-', starting and ending with a letter or digit)"
        ))
    }
}

/// A client and the namespace tenure's objects live in.
///
/// Clones share one client, and what the stores made from them tell each other: a
/// [`KubeLeaseStore`](crate::KubeLeaseStore) and a
/// [`KubeNodeRegistry`](crate::KubeNodeRegistry) made from one connection let a
/// member's session keep-alive serve as its membership heartbeat.
#[derive(Clone)]
pub struct KubeConnection {
    /// The client (shared by every store made from this connection).
    pub client: kube::Client,
    /// The namespace.
    pub namespace: String,
    pub(crate) links: Arc<SessionLinks>,
}

impl std::fmt::Debug for KubeConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeConnection")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

/// Connects as `kubectl` would, then checks that the namespace exists and that leases
/// may be read and created there (a dry-run create, which writes nothing), so a missing
/// namespace or permission is reported now, by name, not at the first election.
pub async fn connect(url: &KubeUrl) -> Result<KubeConnection> {
    let config = kube::Config::infer().await.map_err(|error| {
        Error::store(
            BACKEND,
            "no Kubernetes configuration found: not in a pod (no service account) and no \
             kubeconfig ($KUBECONFIG or ~/.kube/config)",
            error,
        )
    })?;
    connect_with(config, url).await
}

/// [`connect`] with a configuration the caller built.
pub async fn connect_with(config: kube::Config, url: &KubeUrl) -> Result<KubeConnection> {
    let namespace = url
        .namespace()
        .map_or_else(|| config.default_namespace.clone(), str::to_owned);
    let server = config.cluster_url.to_string();
    let client = kube::Client::try_from(config).map_err(|error| {
        Error::store(BACKEND, format!("cannot make a client for {server}"), error)
    })?;
    let connection = KubeConnection::new(client, namespace);
    connection.check().await?;
    Ok(connection)
}

impl KubeConnection {
    /// A connection from a client the caller made, with no checks (see [`connect`]).
    pub fn new(client: kube::Client, namespace: impl Into<String>) -> KubeConnection {
        KubeConnection {
            client,
            namespace: namespace.into(),
            links: Arc::new(SessionLinks::default()),
        }
    }

    /// The namespace's Lease API.
    pub(crate) fn leases(&self) -> Api<Lease> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    async fn check(&self) -> Result<()> {
        let api = self.leases();
        let probe = "tenure.probe";
        api.get_opt(probe)
            .await
            .map_err(|error| api_error(&self.namespace, "get", probe, error))?;
        let params = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        match api.create(&params, &new_object(probe, "probe", None)).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
            Err(error) => Err(api_error(&self.namespace, "create", probe, error)),
        }
    }
}

/// Maps a failed call to an [`Error::Store`] that names what to fix: the verb and
/// resource the account lacks, a namespace that does not exist, an API server that
/// cannot be reached.
pub(crate) fn api_error(namespace: &str, verb: &str, object: &str, error: kube::Error) -> Error {
    match error {
        kube::Error::Api(status) => {
            let message = match status.code {
                403 => format!(
                    "the API server refused to {verb} leases (coordination.k8s.io) in namespace \
                     {namespace}: forbidden; tenure's service account needs {NEEDED_RBAC}"
                ),
                401 => "the API server did not accept the credentials (401 Unauthorized); check \
                        the kubeconfig or the service account token"
                    .to_owned(),
                404 if status
                    .details
                    .as_ref()
                    .is_some_and(|details| details.kind == "namespaces") =>
                {
                    format!("namespace {namespace} does not exist")
                }
                code => format!(
                    "{verb} lease {object} in namespace {namespace}: {code} {}",
                    status.reason
                ),
            };
            Error::store(BACKEND, message, status)
        }
        other => Error::store(
            BACKEND,
            format!("cannot reach the Kubernetes API server ({verb} lease {object})"),
            other,
        ),
    }
}

/// Whether `error` is a 409 Conflict (a conditional write lost) or AlreadyExists.
pub(crate) fn is_conflict(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 409)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(KubeUrl::parse("kube:").unwrap().namespace(), None);
        assert_eq!(
            KubeUrl::parse("kube:team-a").unwrap().namespace(),
            Some("team-a")
        );
        for bad in ["kube:Team", "kube:-a", "kube:a_b", "kube://host", "etcd:x"] {
            let error = KubeUrl::parse(bad).unwrap_err().to_string();
            assert!(error.starts_with("invalid url"), "{bad}: {error}");
        }
        let long = format!("kube:{}", "a".repeat(64));
        assert!(KubeUrl::parse(&long).is_err());
    }
}
