//! Store URLs: which backend a command talks to.
//!
//! `memory:` (this process only), `sqlite:PATH` (the default, a file under the user's
//! state directory), `postgres://...`, `etcd://HOST:PORT[,HOST:PORT...][/PREFIX]`,
//! `kube:` or `kube:NAMESPACE` (Lease objects on the Kubernetes API, configured as
//! `kubectl` is).
//! Errors name the problem and never echo a password.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[cfg(any(not(feature = "etcd"), not(feature = "kube")))]
use anyhow::bail;
use anyhow::Context;
use tenure::{
    Fence, FenceStore, InMemoryLeaseStore, InMemoryNodeRegistry, LeaseStore, NodeRegistry,
    TokioClock,
};

use crate::UsageError;

/// What every accepted URL looks like, for error messages.
const ACCEPTED: &str = "expected one of memory:, sqlite:PATH, postgres://USER@HOST/DB, \
                        etcd://HOST:PORT[/PREFIX], kube:[NAMESPACE]";

/// A parsed `--store` value. The raw URL is kept only for the backend's own parser and
/// is never printed.
#[derive(Clone)]
pub enum StoreUrl {
    /// `memory:`: in this process only.
    Memory,
    /// `sqlite:PATH`.
    Sqlite(String),
    /// `postgres://...` or `postgresql://...`.
    Postgres(String),
    /// `etcd://...`.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    Etcd(String),
    /// `kube:` or `kube:NAMESPACE`.
    #[cfg_attr(not(feature = "kube"), allow(dead_code))]
    Kube(String),
}

impl std::fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.scheme())
    }
}

impl StoreUrl {
    /// Parses a `--store` value: the scheme picks the backend, whose own parser then
    /// checks the rest, so a malformed URL is a usage error before anything is opened.
    /// Every message starts with `--store` and never repeats the URL's password.
    pub fn parse(raw: &str) -> Result<Self, UsageError> {
        let usage = |problem: String| UsageError(format!("--store: {problem}"));
        let raw = raw.trim();
        if raw.is_empty() {
            return Err(usage(format!("the store URL is empty; {ACCEPTED}")));
        }
        let Some((scheme, rest)) = raw.split_once(':') else {
            return Err(usage(format!("the store URL has no scheme; {ACCEPTED}")));
        };
        let backend = |error: tenure::Error| match error {
            tenure::Error::InvalidArgument {
                field: "url",
                reason,
            } => usage(reason),
            tenure::Error::InvalidArgument { field, reason } => usage(format!("{field} {reason}")),
            other => usage(other.to_string()),
        };
        match scheme {
            "memory" if rest.is_empty() => Ok(StoreUrl::Memory),
            "memory" => Err(usage("memory: takes nothing after the colon".to_owned())),
            "sqlite" => {
                tenure_sqlite::path_from_url(raw).map_err(backend)?;
                Ok(StoreUrl::Sqlite(raw.to_owned()))
            }
            "postgres" | "postgresql" => {
                tenure_postgres::connect_options(raw).map_err(backend)?;
                Ok(StoreUrl::Postgres(raw.to_owned()))
            }
            "etcd" => {
                #[cfg(feature = "etcd")]
                tenure_etcd::EtcdUrl::parse(raw).map_err(backend)?;
                Ok(StoreUrl::Etcd(raw.to_owned()))
            }
            "kube" => {
                #[cfg(feature = "kube")]
                tenure_kube::KubeUrl::parse(raw).map_err(backend)?;
                Ok(StoreUrl::Kube(raw.to_owned()))
            }
            other => Err(usage(match shown_scheme(other) {
                Some(shown) => format!("unknown store scheme {shown:?}; {ACCEPTED}"),
                None => format!(
                    "the store URL does not start with a scheme tenure knows (it is not shown: a \
                     mistyped URL may hold its password there); {ACCEPTED}"
                ),
            })),
        }
    }

    /// The scheme, for messages.
    pub fn scheme(&self) -> &'static str {
        match self {
            StoreUrl::Memory => "memory:",
            StoreUrl::Sqlite(_) => "sqlite:",
            StoreUrl::Postgres(_) => "postgres:",
            StoreUrl::Etcd(_) => "etcd:",
            StoreUrl::Kube(_) => "kube:",
        }
    }

    /// Refuses `memory:` for commands that need a store other processes can see.
    pub fn require_shared(&self, command: &str) -> Result<(), UsageError> {
        if matches!(self, StoreUrl::Memory) {
            return Err(UsageError(format!(
                "`tenure {command}` needs a store shared between processes; memory: lives only \
                 inside one process (use sqlite:PATH, postgres://..., etcd://... or kube:)"
            )));
        }
        Ok(())
    }
}

/// Schemes of other systems, named back when a user tries one. Any other text before
/// the first colon is never shown: in a mangled URL it may be the password (a property
/// test found `etcAAaaaAAa:...` from a password with a colon typed into it).
const OTHER_SCHEMES: &[&str] = &[
    "mysql",
    "mariadb",
    "redis",
    "rediss",
    "mongodb",
    "mongodb+srv",
    "http",
    "https",
    "file",
    "consul",
    "zk",
    "zookeeper",
    "nats",
    "sqlserver",
    "mssql",
    "oracle",
    "cockroachdb",
    "sqlite3",
    "postgre",
    "pg",
    "psql",
    "etcd3",
    "k8s",
    "kubernetes",
];

/// `scheme` if it is one of [`OTHER_SCHEMES`] (in any case).
fn shown_scheme(scheme: &str) -> Option<&'static str> {
    OTHER_SCHEMES
        .iter()
        .copied()
        .find(|known| known.eq_ignore_ascii_case(scheme))
}

/// The default store: `sqlite:` on a file under the user's state directory.
pub fn default_url() -> anyhow::Result<String> {
    let dir = state_dir()
        .context("cannot find a state directory (set XDG_STATE_HOME or HOME, or pass --store)")?;
    Ok(format!(
        "sqlite:{}",
        dir.join("tenure").join("tenure.db").display()
    ))
}

fn state_dir() -> Option<PathBuf> {
    let non_empty = |var: &str| {
        std::env::var_os(var)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    non_empty("XDG_STATE_HOME").or_else(|| non_empty("HOME").map(|home| home.join(".local/state")))
}

/// Everything a command may need from one backend.
pub struct Stores {
    /// Leases.
    pub leases: Arc<dyn LeaseStore>,
    /// Membership.
    pub registry: Arc<dyn NodeRegistry>,
    /// The store's downstream fence.
    pub fence: Arc<dyn FenceStore>,
    /// What to close when the command is done, if anything (see [`Closer::close`]).
    closer: Closer,
}

/// Opens the store at `url` (see [`open`]), runs `work` on it, then closes it (see
/// [`Closer::close`]), whatever `work` returned.
pub async fn with_store<F, Fut, T>(
    url: &StoreUrl,
    registry_ttl: Duration,
    work: F,
) -> anyhow::Result<T>
where
    F: FnOnce(Stores) -> Fut,
    Fut: Future<Output = anyhow::Result<T>>,
{
    let stores = open(url, registry_ttl).await?;
    let closer = stores.closer.clone();
    let done = work(stores).await;
    closer.close().await;
    done
}

/// The connections a command closes before tenure exits.
#[derive(Clone, Default)]
struct Closer(Option<tenure_sqlite::SqliteDatabase>);

impl Closer {
    /// Closes a SQLite file's connections so that the last one checkpoints its WAL:
    /// left open at exit, the WAL grows run after run, and every `tenure` that opens
    /// the file next reads all of it first (see `SqliteDatabase::close`). Other stores
    /// need nothing: their connections end with the process.
    async fn close(self) {
        if let Some(db) = self.0 {
            // A connection held by a call that never returns would hold the exit up:
            // the WAL is then left as it was before this close existed.
            let closed = tokio::time::timeout(CLOSE_WAIT, db.close()).await;
            if closed.is_err() {
                tracing::debug!("the store's connections did not close in time");
            }
        }
    }
}

/// How long a command waits at exit for the store's connections to close.
const CLOSE_WAIT: Duration = Duration::from_secs(1);

/// Opens the in-memory backends on a clock that follows tokio's (possibly paused) time.
pub fn memory(registry_ttl: Duration) -> anyhow::Result<Stores> {
    let clock = TokioClock::new();
    Ok(Stores {
        leases: Arc::new(InMemoryLeaseStore::with_clock(clock.clone())),
        registry: Arc::new(InMemoryNodeRegistry::with_clock(registry_ttl, clock)?),
        fence: Arc::new(Fence::new()),
        closer: Closer::default(),
    })
}

/// Opens a store; `registry_ttl` is the liveness TTL membership is judged with.
pub async fn open(url: &StoreUrl, registry_ttl: Duration) -> anyhow::Result<Stores> {
    match url {
        StoreUrl::Memory => memory(registry_ttl),
        StoreUrl::Sqlite(raw) => {
            if let Ok(path) = tenure_sqlite::path_from_url(raw) {
                create_default_dir(&path)?;
            }
            // One connection: opening one is most of a command's start-up, each one's first
            // commit also syncs the directory, and a command's store calls are short. (With
            // two, sqlx opens the second whenever a call comes while the first is still
            // being pinged back into the pool.)
            let options = tenure_sqlite::SqliteOptions::new().max_connections(1);
            let db = tenure_sqlite::connect_with(raw, options).await?;
            Ok(Stores {
                leases: Arc::new(db.lease_store()),
                registry: Arc::new(db.node_registry(registry_ttl)?),
                fence: Arc::new(db.fence()),
                closer: Closer(Some(db)),
            })
        }
        StoreUrl::Postgres(raw) => {
            let backend = tenure_postgres::connect(
                raw,
                tenure_postgres::ConnectOptions {
                    registry_ttl,
                    ..Default::default()
                },
            )
            .await?;
            Ok(Stores {
                leases: Arc::new(backend.leases),
                registry: Arc::new(backend.registry),
                fence: Arc::new(backend.fence),
                closer: Closer::default(),
            })
        }
        #[cfg(feature = "etcd")]
        StoreUrl::Etcd(raw) => {
            let url = tenure_etcd::EtcdUrl::parse(raw)?;
            let (client, version) = tenure_etcd::connect_client(&url).await?;
            let leases =
                tenure_etcd::EtcdLeaseStore::new(client.clone(), url.prefix())?.for_server(version);
            // Made from the store: a shard member's session keep-alive is its heartbeat.
            let registry = leases.registry(registry_ttl)?;
            Ok(Stores {
                leases: Arc::new(leases),
                registry: Arc::new(registry),
                fence: Arc::new(tenure_etcd::EtcdFence::new(client, url.prefix())?),
                closer: Closer::default(),
            })
        }
        #[cfg(feature = "kube")]
        StoreUrl::Kube(raw) => {
            let url = tenure_kube::KubeUrl::parse(raw)?;
            let conn = tenure_kube::connect(&url).await?;
            Ok(Stores {
                leases: Arc::new(tenure_kube::KubeLeaseStore::new(conn.clone())),
                registry: Arc::new(tenure_kube::KubeNodeRegistry::new(
                    conn.clone(),
                    registry_ttl,
                )?),
                fence: Arc::new(tenure_kube::KubeFence::new(conn)),
                closer: Closer::default(),
            })
        }
        #[cfg(not(feature = "kube"))]
        StoreUrl::Kube(_) => bail!(UsageError(
            "this build of tenure has no Kubernetes backend: build it with `--features kube` \
             (a default feature)"
                .to_owned()
        )),
        #[cfg(not(feature = "etcd"))]
        StoreUrl::Etcd(_) => bail!(UsageError(
            "this build of tenure has no etcd backend: build it with `--features etcd` \
             (needs protoc, Debian package protobuf-compiler)"
                .to_owned()
        )),
    }
}

/// The default database's directory is created on first use (mode 0700); any other
/// missing directory is the user's mistake and reported as such by the backend.
fn create_default_dir(path: &std::path::Path) -> anyhow::Result<()> {
    let Some(state) = state_dir() else {
        return Ok(());
    };
    let default_dir = state.join("tenure");
    if path.parent() != Some(default_dir.as_path()) || default_dir.exists() {
        return Ok(());
    }
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&default_dir)
        .with_context(|| {
            format!(
                "cannot create the state directory {}",
                default_dir.display()
            )
        })
}
