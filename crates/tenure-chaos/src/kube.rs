//! The Kubernetes side of a chaos run (feature `kube`): leases and membership from
//! tenure-kube, and a fenced log kept in Lease objects.
//!
//! A tenant on Kubernetes has the API server and nothing else, and tenure's documented
//! Role grants leases only, so the log lives in `coordination.k8s.io/v1` Lease objects
//! of the run's namespace too. The API server has no transaction over two objects: a
//! fence kept in one object and entries in another could not commit together, and a
//! leader stalled between its fence check and its append would land its entry after its
//! successor's. So each append is one conditional write of one object that holds both
//! the fence and the entries.
//!
//! ## The log
//!
//! A role's log is a chain of Lease objects named after the role's own object with
//! `.log-0`, `.log-1`, ... appended (role objects never hold a dot after `tenure`, so no
//! tenure object has such a name), labelled `app.kubernetes.io/managed-by=tenure-chaos`
//! (outside the label selectors of tenure's watches and lists). Each holds, in
//! annotations:
//!
//! - `chaos.tenure.dev/role`: the role, checked on every read;
//! - `chaos.tenure.dev/highest-token`: the highest token admitted to the log so far;
//! - `chaos.tenure.dev/entries`: the entries appended to this object, one line
//!   `worker token seq` each;
//! - `chaos.tenure.dev/next`: set once the object is sealed; a sealed object takes no
//!   more entries and its successor is the next index.
//!
//! An append is ONE `PUT` of the current object carrying the `resourceVersion` it was
//! read at: checked `token >= highest`, it raises `highest` and adds the line. Of two
//! writers that read one version, one succeeds and the other gets 409 Conflict and reads
//! again, so the check and the append commit together, and commit order is (object
//! index, line): [`LogRow::id`] is `index << 32 | line`.
//!
//! When an object's entries pass [`SEAL_AT`], a conditional `PUT` seals it, and the next
//! object is created carrying the sealed one's `highest`. Whoever finds a sealed object
//! without a successor creates it (a writer may die between seal and create); a second
//! create gets 409 AlreadyExists and reads. A sealed object takes no more writes, so its
//! `highest` is final and every creator writes the same.
//!
//! Objects are sealed at 16 KiB (about 650 entries), not near the 256 KiB the API allows
//! for annotations: the API server has no append, so every append rewrites the whole
//! object through the API server and its etcd (which keeps every revision until the
//! next compaction). At the ~100 appends a second of a leader writing every 10 ms, a
//! 100 KB object would push several MB/s through a server that shares two cores with the
//! workers; at 16 KiB the cost of sealing (two more requests per 650 appends) is noise.
//!
//! Each process keeps, per role, the object as it last wrote or read it, and appends on
//! that version without reading first: the leader writing continuously makes one request
//! per append, and a stale version (another writer came between) costs a 409 and a read.
//!
//! ## Outcomes
//!
//! A failed read, seal or create puts no entry anywhere: [`WriteOutcome::Error`]. A
//! failed `PUT` of the entry may have been applied: [`WriteOutcome::Unknown`]. A 409 is
//! not always a clean loss: the client retries a request answered 429, 503 or 504 (kube's
//! default), and when the first try was applied (a 504 from an API server whose etcd
//! answered late) the retry gets 409. So every object the entry was sent to is checked
//! for it when read again, and an entry found there is [`WriteOutcome::Ok`].
//!
//! The negative control (`--unsafe-skip-fence`) makes the same write without the check:
//! writers still take turns on the object's version, but a stale leader's entry lands
//! after its successor's, which the checker must catch.
//!
//! ## Connecting
//!
//! The configuration is found as `kubectl` finds it (`$KUBECONFIG`, `~/.kube/config`,
//! the pod's service account) unless the run names a kubeconfig. Through a cut proxy
//! ([`Connect::via`]), the client's server address is the proxy's and TLS still checks
//! the server's certificate against the configured server's host name. The client keeps
//! kube's defaults (no read timeout: the elector's local deadline bounds a term, and a
//! worker gives up on a write after two TTLs), as `tenure run` does.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use tenure::{Error, LeaseStore, NodeRegistry};
use tenure_kube::names::{object_name, Kind, MAX_OBJECT_NAME};
use tenure_kube::{KubeConnection, KubeLeaseStore, KubeNodeRegistry, KubeUrl, BACKEND};

use crate::backend::{short, Connect, Entry, LogRow, WriteOutcome};
use crate::ChaosError;

/// The size of an object's entries past which it is sealed (see the module docs).
pub const SEAL_AT: usize = 16 * 1024;

/// How many conditional writes one append may lose before it gives up.
const ATTEMPTS: usize = 16;

const ROLE: &str = "chaos.tenure.dev/role";
const HIGHEST: &str = "chaos.tenure.dev/highest-token";
const ENTRIES: &str = "chaos.tenure.dev/entries";
const NEXT: &str = "chaos.tenure.dev/next";
const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "tenure-chaos");

/// A connection to the API server with tenure's lease store and the chaos log on it.
#[derive(Clone)]
pub struct KubeLog {
    conn: KubeConnection,
    store: Arc<KubeLeaseStore>,
    api: Api<Lease>,
    /// Per role, the current object as this process last saw it.
    current: Arc<Mutex<HashMap<String, Current>>>,
}

/// A role's current log object as this process last saw it.
#[derive(Clone, Debug, Default)]
struct Current {
    index: u64,
    /// The object as last written or read; `None` after a write that lost or failed
    /// (read it again before writing).
    object: Option<LogObject>,
}

/// One object of a role's log, as read or written.
#[derive(Clone, Debug)]
struct LogObject {
    index: u64,
    highest: u64,
    entries: String,
    sealed: bool,
    /// The object itself (its `resourceVersion` makes a write of it conditional).
    lease: Lease,
}

impl KubeLog {
    /// Connects to `kube:NAMESPACE` (or `kube:`) with the kubeconfig `connect.kubeconfig`
    /// names, else as `kubectl` would, through `connect.via`'s first proxy when given.
    /// A configuration that cannot be loaded is a usage error; an API server that does
    /// not answer, a store error (a worker retries those).
    pub async fn open(url: &str, connect: Connect<'_>) -> Result<Self, ChaosError> {
        let url = KubeUrl::parse(url).map_err(|e| ChaosError::Usage(e.to_string()))?;
        let mut config = load_config(connect.kubeconfig).await?;
        if let Some(proxy) = connect.via.first() {
            through(&mut config, *proxy)?;
        }
        let conn = tenure_kube::connect_with(config, &url).await?;
        let api = Api::namespaced(conn.client.clone(), &conn.namespace);
        Ok(KubeLog {
            store: Arc::new(KubeLeaseStore::new(conn.clone())),
            conn,
            api,
            current: Arc::default(),
        })
    }

    /// The lease store.
    pub fn leases(&self) -> Arc<dyn LeaseStore> {
        self.store.clone()
    }

    /// The membership registry on the same client (a member is live for `ttl` after its
    /// last heartbeat, as this process observes it).
    pub fn registry(&self, ttl: Duration) -> Result<Arc<dyn NodeRegistry>, ChaosError> {
        Ok(Arc::new(KubeNodeRegistry::new(self.conn.clone(), ttl)?))
    }

    /// Appends the entry in one conditional write of the role's current log object,
    /// checked against its highest token unless `unfenced` (see the module docs).
    pub async fn append(&self, entry: Entry<'_>, unfenced: bool) -> WriteOutcome {
        if entry.worker.is_empty() || entry.worker.contains([' ', '\n']) {
            return WriteOutcome::Error(format!("worker name {:?} is not one word", entry.worker));
        }
        let token = entry.token.get();
        let line = format!("{} {token} {}", entry.worker, entry.seq);
        let Current {
            mut index,
            mut object,
        } = self.cached(entry.role);
        // The objects the entry was sent to and refused with 409, which a retried
        // request may have written after all: until it is looked for there again, a
        // failure leaves the outcome unknown.
        let mut sent_to = HashSet::new();
        let failed = |sent_to: &HashSet<u64>, message: String| {
            if sent_to.is_empty() {
                WriteOutcome::Error(message)
            } else {
                WriteOutcome::Unknown(message)
            }
        };
        for _ in 0..ATTEMPTS {
            let current = match object.take() {
                Some(current) => current,
                None => match self.open_at(entry.role, index).await {
                    Ok(current) => current,
                    Err(e) => return failed(&sent_to, short(e)),
                },
            };
            index = current.index;
            if sent_to.remove(&index) && current.holds(&line) {
                self.keep(entry.role, index, Some(current));
                return WriteOutcome::Ok;
            }
            if current.sealed {
                match self.successor(entry.role, &current).await {
                    Ok(next) => object = Some(next),
                    Err(e) => return failed(&sent_to, short(e)),
                }
                continue;
            }
            if !unfenced && token < current.highest {
                self.keep(entry.role, index, Some(current));
                return WriteOutcome::Fenced;
            }
            let full = current.entries.len() + line.len() + 1 > SEAL_AT;
            let mut lease = current.to_write();
            if full {
                annotate(&mut lease, NEXT, (index + 1).to_string());
            } else {
                annotate(&mut lease, HIGHEST, current.highest.max(token).to_string());
                annotate(&mut lease, ENTRIES, format!("{}{line}\n", current.entries));
            }
            match (self.replace(entry.role, index, &lease).await, full) {
                (Ok(sealed), true) => object = Some(sealed),
                (Ok(written), false) => {
                    self.keep(entry.role, index, Some(written));
                    return WriteOutcome::Ok;
                }
                (Err(Written::Conflict), full) => {
                    if !full {
                        sent_to.insert(index);
                    }
                    self.keep(entry.role, index, None);
                }
                // A failed seal wrote no entry.
                (Err(Written::Failed(e)), true) => {
                    self.keep(entry.role, index, None);
                    return failed(&sent_to, short(e));
                }
                (Err(Written::Failed(e)), false) => {
                    self.keep(entry.role, index, None);
                    return WriteOutcome::Unknown(short(e));
                }
            }
        }
        let lost = format!("lost {ATTEMPTS} conditional writes of the chaos log in a row");
        failed(&sent_to, lost)
    }

    /// The role's log, in commit order: every object of the chain, line by line.
    pub async fn read_log(&self, role: &str) -> Result<Vec<LogRow>, ChaosError> {
        let mut rows = Vec::new();
        let mut index = 0;
        loop {
            let Some(object) = self.read(role, index).await? else {
                break;
            };
            for (line, text) in (0u32..).zip(object.entries.lines()) {
                let (worker, token, seq) = parse_line(text).ok_or_else(|| {
                    corrupt(format!(
                        "{} has the entry {text:?}, not `worker token seq`",
                        log_object_name(role, index)
                    ))
                })?;
                rows.push(LogRow {
                    id: i64::try_from((index << 32) | u64::from(line))
                        .map_err(|_| corrupt("more log objects than an id can count"))?,
                    worker: worker.to_owned(),
                    token,
                    seq,
                });
            }
            if !object.sealed {
                break;
            }
            index += 1;
        }
        Ok(rows)
    }

    /// The role's current object as last seen (index 0 when none was).
    fn cached(&self, role: &str) -> Current {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(role)
            .cloned()
            .unwrap_or_default()
    }

    /// Remembers the role's current object (`None`: its index only, to be read again).
    fn keep(&self, role: &str, index: u64, object: Option<LogObject>) {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(role.to_owned(), Current { index, object });
    }

    /// Object `index` of the role's log, created (empty, with `highest` 0) when it is
    /// the first and does not exist yet.
    async fn open_at(&self, role: &str, index: u64) -> tenure::Result<LogObject> {
        if let Some(object) = self.read(role, index).await? {
            return Ok(object);
        }
        if index == 0 {
            return self.create(role, 0, 0).await;
        }
        // Only a sealed predecessor names this object; the chain is read from it.
        let previous = self
            .read(role, index - 1)
            .await?
            .ok_or_else(|| corrupt(format!("{} is missing", log_object_name(role, index - 1))))?;
        self.successor(role, &previous).await
    }

    /// The object after the sealed `sealed`, created with its highest token when nobody
    /// has yet.
    async fn successor(&self, role: &str, sealed: &LogObject) -> tenure::Result<LogObject> {
        let index = sealed.index + 1;
        match self.read(role, index).await? {
            Some(next) => Ok(next),
            None => self.create(role, index, sealed.highest).await,
        }
    }

    /// Creates object `index` with `highest`; when another writer created it first,
    /// reads theirs.
    async fn create(&self, role: &str, index: u64, highest: u64) -> tenure::Result<LogObject> {
        let name = log_object_name(role, index);
        if name.len() > MAX_OBJECT_NAME {
            return Err(Error::invalid(
                "role",
                format!("the chaos log object of {role:?} would have a name too long"),
            ));
        }
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some(BTreeMap::from([(
                    MANAGED_BY.0.to_owned(),
                    MANAGED_BY.1.to_owned(),
                )])),
                annotations: Some(BTreeMap::from([
                    (ROLE.to_owned(), role.to_owned()),
                    (HIGHEST.to_owned(), highest.to_string()),
                    (ENTRIES.to_owned(), String::new()),
                ])),
                ..ObjectMeta::default()
            },
            spec: None,
        };
        match self.api.create(&PostParams::default(), &lease).await {
            Ok(created) => LogObject::parse(created, role, index),
            Err(kube::Error::Api(status)) if status.code == 409 => self
                .read(role, index)
                .await?
                .ok_or_else(|| corrupt(format!("{name} was created and is gone"))),
            Err(error) => Err(self.error("create", &name, error)),
        }
    }

    async fn read(&self, role: &str, index: u64) -> tenure::Result<Option<LogObject>> {
        let name = log_object_name(role, index);
        match self.api.get_opt(&name).await {
            Ok(Some(lease)) => LogObject::parse(lease, role, index).map(Some),
            Ok(None) => Ok(None),
            Err(error) => Err(self.error("get", &name, error)),
        }
    }

    /// A conditional `PUT` of object `index` (as `lease`, with its version).
    async fn replace(&self, role: &str, index: u64, lease: &Lease) -> Result<LogObject, Written> {
        let name = log_object_name(role, index);
        match self.api.replace(&name, &PostParams::default(), lease).await {
            Ok(written) => LogObject::parse(written, role, index).map_err(Written::Failed),
            Err(kube::Error::Api(status)) if status.code == 409 => Err(Written::Conflict),
            Err(error) => Err(Written::Failed(self.error("update", &name, error))),
        }
    }

    fn error(&self, verb: &str, object: &str, error: kube::Error) -> Error {
        Error::store(
            BACKEND,
            format!(
                "chaos log: {verb} lease {object} in namespace {}",
                self.conn.namespace
            ),
            error,
        )
    }
}

/// How a conditional write ended.
enum Written {
    /// 409: someone wrote the object since it was read (or a retried request did).
    Conflict,
    /// Anything else: the write may or may not have been applied.
    Failed(Error),
}

impl LogObject {
    fn parse(lease: Lease, role: &str, index: u64) -> tenure::Result<LogObject> {
        let name = log_object_name(role, index);
        let annotations = lease.metadata.annotations.as_ref();
        let get = |key: &str| annotations.and_then(|a| a.get(key));
        if get(ROLE).map(String::as_str) != Some(role) {
            return Err(corrupt(format!(
                "{name} is not the chaos log of {role:?} (its {ROLE} is {:?})",
                get(ROLE)
            )));
        }
        if lease.metadata.resource_version.is_none() {
            return Err(corrupt(format!("{name} has no resourceVersion")));
        }
        let highest = get(HIGHEST)
            .and_then(|raw| raw.parse().ok())
            .ok_or_else(|| corrupt(format!("{name} has {HIGHEST} {:?}", get(HIGHEST))))?;
        let sealed = match get(NEXT) {
            None => false,
            Some(next) if *next == (index + 1).to_string() => true,
            Some(next) => return Err(corrupt(format!("{name} has {NEXT} {next:?}"))),
        };
        Ok(LogObject {
            index,
            highest,
            entries: get(ENTRIES).cloned().unwrap_or_default(),
            sealed,
            lease,
        })
    }

    /// Whether the object holds `line` as one of its entries.
    fn holds(&self, line: &str) -> bool {
        self.entries.lines().any(|entry| entry == line)
    }

    /// A copy to write back, conditional on the version read.
    fn to_write(&self) -> Lease {
        let mut lease = self.lease.clone();
        lease.metadata.managed_fields = None;
        lease
    }
}

fn annotate(lease: &mut Lease, key: &str, value: String) {
    lease
        .metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(key.to_owned(), value);
}

/// Object `index` of the role's log: the role's object name with `.log-INDEX`.
fn log_object_name(role: &str, index: u64) -> String {
    format!("{}.log-{index}", object_name(Kind::Role, role))
}

fn parse_line(text: &str) -> Option<(&str, u64, u64)> {
    let mut parts = text.split(' ');
    let worker = parts.next().filter(|w| !w.is_empty())?;
    let token = parts.next()?.parse().ok()?;
    let seq = parts.next()?.parse().ok()?;
    parts.next().is_none().then_some((worker, token, seq))
}

fn corrupt(message: impl std::fmt::Display) -> Error {
    Error::store_msg(BACKEND, format!("corrupt chaos log: {message}"))
}

/// The kubeconfig at `path`, else the configuration `kubectl` would use. Either
/// failing is a usage error: nothing to retry.
async fn load_config(path: Option<&Path>) -> Result<kube::Config, ChaosError> {
    let usage = |what: String, error: &dyn std::error::Error| {
        ChaosError::Usage(format!("{what}: {}", short(error)))
    };
    match path {
        Some(path) => {
            let file = Kubeconfig::read_from(path)
                .map_err(|e| usage(format!("cannot read the kubeconfig {}", path.display()), &e))?;
            kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .map_err(|e| usage(format!("cannot use the kubeconfig {}", path.display()), &e))
        }
        None => kube::Config::infer().await.map_err(|e| {
            usage(
                "no Kubernetes configuration found (not in a pod, no $KUBECONFIG or \
                 ~/.kube/config)"
                    .to_owned(),
                &e,
            )
        }),
    }
}

/// The API server's `host:port`, from the kubeconfig at `path` or as `kubectl` finds it:
/// the address the cut proxy stands in for.
pub async fn server_address(path: Option<&Path>) -> Result<String, ChaosError> {
    let config = load_config(path).await?;
    let url = &config.cluster_url;
    let host = url
        .host()
        .ok_or_else(|| ChaosError::Usage(format!("the Kubernetes server {url} names no host")))?;
    let port = url
        .port_u16()
        .unwrap_or(if url.scheme_str() == Some("http") {
            80
        } else {
            443
        });
    Ok(format!("{host}:{port}"))
}

/// Points `config` at `proxy`, keeping the scheme and path, and has TLS check the
/// server's certificate against the configured host as before.
fn through(config: &mut kube::Config, proxy: SocketAddr) -> Result<(), ChaosError> {
    let url = &config.cluster_url;
    let host = url
        .host()
        .ok_or_else(|| ChaosError::Usage(format!("the Kubernetes server {url} names no host")))?;
    if config.tls_server_name.is_none() {
        config.tls_server_name = Some(
            host.trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
        );
    }
    let rerouted = format!(
        "{}://{proxy}{}",
        url.scheme_str().unwrap_or("https"),
        url.path_and_query().map_or("", |p| p.as_str())
    );
    config.cluster_url = rerouted.parse().map_err(|_| {
        ChaosError::Setup(format!(
            "cannot route the Kubernetes client through {proxy}"
        ))
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_parse_back() {
        assert_eq!(parse_line("w1.0 5 12"), Some(("w1.0", 5, 12)));
        for bad in [
            "",
            "w1.0 5",
            "w1.0 5 12 3",
            " 5 12",
            "w1.0 x 12",
            "w1.0 5 -1",
        ] {
            assert_eq!(parse_line(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn log_objects_are_named_after_the_role_and_never_like_a_tenure_object() {
        let name = log_object_name("chaos-1a2b/3", 7);
        assert_eq!(name, "tenure-chaos-2d1a2b-2f3.log-7");
        assert!(tenure_kube::names::role_of(&name).is_none());
    }

    // The log on a real API server (the shared throwaway one, a fresh namespace per
    // test, as the tenant service account): sealing, several writers, a writer that died
    // between seal and create, and a 409 that answers a write already applied.

    /// A log on a fresh namespace.
    async fn fresh_log() -> KubeLog {
        let (namespace, kubeconfig) = tokio::task::spawn_blocking(|| {
            let server = tenure_throwaway::kube::KubeServer::shared()
                .unwrap_or_else(|e| panic!("throwaway kube-apiserver: {e}"));
            let namespace = server.new_namespace("chaos-log").expect("a namespace");
            let kubeconfig = server.tenant_kubeconfig(&namespace).expect("a kubeconfig");
            (namespace, kubeconfig)
        })
        .await
        .unwrap();
        another(&namespace, &kubeconfig).await
    }

    /// A second log on the same namespace: another process, with a cache of its own.
    async fn another(namespace: &str, kubeconfig: &Path) -> KubeLog {
        let connect = Connect {
            app_name: "chaos-log-test",
            ttl: Duration::from_secs(1),
            sqlite_busy: Duration::from_secs(1),
            via: &[],
            kubeconfig: Some(kubeconfig),
        };
        KubeLog::open(&format!("kube:{namespace}"), connect)
            .await
            .expect("connect")
    }

    fn kubeconfig_of(log: &KubeLog) -> std::path::PathBuf {
        let server = tenure_throwaway::kube::KubeServer::shared().unwrap();
        server.tenant_kubeconfig(&log.conn.namespace).unwrap()
    }

    /// A worker name long enough that an object holds about 50 entries.
    fn long_worker(tag: char) -> String {
        std::iter::repeat_n(tag, 300).collect()
    }

    async fn append(log: &KubeLog, worker: &str, token: u64, seq: u64) -> WriteOutcome {
        let entry = Entry {
            role: "chaos-test/0",
            worker,
            token: tenure::FencingToken::from(token),
            seq,
        };
        log.append(entry, false).await
    }

    /// The sequence numbers of the role's log, in commit order.
    async fn logged_seqs(log: &KubeLog, role: &str) -> Vec<u64> {
        let rows = log.read_log(role).await.unwrap();
        rows.iter().map(|r| r.seq).collect()
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn two_writers_seal_and_chain_objects_in_commit_order() {
        let a = fresh_log().await;
        let b = another(&a.conn.namespace, &kubeconfig_of(&a)).await;
        let (wa, wb) = (long_worker('a'), long_worker('b'));
        for seq in 0..80 {
            assert_eq!(append(&a, &wa, 5, seq).await, WriteOutcome::Ok, "{seq}");
        }
        // b's first append walks the chain from the first object.
        for seq in 0..80 {
            assert_eq!(append(&b, &wb, 7, seq).await, WriteOutcome::Ok, "{seq}");
        }
        // a's cached object is stale: its write loses, it reads, and the fence refuses.
        assert_eq!(append(&a, &wa, 5, 80).await, WriteOutcome::Fenced);
        assert_eq!(append(&a, &wa, 6, 81).await, WriteOutcome::Fenced);
        let entry = Entry {
            role: "chaos-test/0",
            worker: &wa,
            token: tenure::FencingToken::from(6),
            seq: 82,
        };
        assert_eq!(a.append(entry, true).await, WriteOutcome::Ok, "unfenced");
        let rows = a.read_log("chaos-test/0").await.unwrap();
        assert_eq!(rows.len(), 161);
        assert!(rows.windows(2).all(|w| w[0].id < w[1].id));
        assert!(rows[..80].iter().all(|r| r.worker == wa && r.token == 5));
        assert!(rows[80..160].iter().all(|r| r.worker == wb && r.token == 7));
        assert_eq!((rows[160].token, rows[160].seq), (6, 82));
        let objects = rows.last().unwrap().id >> 32;
        assert!(objects >= 2, "sealed only {objects} objects");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_sealed_object_without_successor_is_continued_with_its_highest_token() {
        let log = fresh_log().await;
        let worker = long_worker('c');
        for seq in 0..3 {
            assert_eq!(append(&log, &worker, 9, seq).await, WriteOutcome::Ok);
        }
        // A writer sealed object 0 and died before it created object 1.
        let role = "chaos-test/0";
        let current = log.read(role, 0).await.unwrap().unwrap();
        let mut sealed = current.to_write();
        annotate(&mut sealed, NEXT, "1".to_owned());
        assert!(log.replace(role, 0, &sealed).await.is_ok());
        assert!(log.read(role, 1).await.unwrap().is_none());
        let other = another(&log.conn.namespace, &kubeconfig_of(&log)).await;
        assert_eq!(append(&other, &worker, 8, 3).await, WriteOutcome::Fenced);
        assert_eq!(append(&other, &worker, 9, 4).await, WriteOutcome::Ok);
        assert_eq!(log.read(role, 1).await.unwrap().unwrap().highest, 9);
        let seqs = logged_seqs(&log, role).await;
        assert_eq!(seqs, [0, 1, 2, 4]);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn an_entry_found_after_a_conflict_was_written_once() {
        let log = fresh_log().await;
        let role = "chaos-test/0";
        assert_eq!(append(&log, "w0.0", 3, 1).await, WriteOutcome::Ok);
        let before = log.read(role, 0).await.unwrap();
        assert_eq!(append(&log, "w0.0", 3, 2).await, WriteOutcome::Ok);
        // As if the write of seq 2 had been answered 504, applied, and retried: the
        // retry loses on the version it carries; the entry is found, not added again.
        log.keep(role, 0, before);
        assert_eq!(append(&log, "w0.0", 3, 2).await, WriteOutcome::Ok);
        let seqs = logged_seqs(&log, role).await;
        assert_eq!(seqs, [1, 2]);
    }

    #[test]
    fn a_proxy_takes_the_address_and_tls_keeps_the_host() {
        let mut config = kube::Config::new("https://api.example.com:6443/prefix".parse().unwrap());
        through(&mut config, "127.0.0.1:4000".parse().unwrap()).unwrap();
        assert_eq!(
            config.cluster_url.to_string(),
            "https://127.0.0.1:4000/prefix"
        );
        assert_eq!(config.tls_server_name.as_deref(), Some("api.example.com"));
    }
}
