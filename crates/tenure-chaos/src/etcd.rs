//! The etcd side of a chaos run (feature `etcd`): leases from [`EtcdLeaseStore`], and a
//! fenced log of one key per entry.
//!
//! An entry is the key `<prefix>/chaos/<role>/log/<worker>/<seq>` holding its token,
//! written by [`EtcdLeaseStore::commit_fenced`]: the put commits only while the term
//! `(role, token)` is live (`create_revision(lease key) == token`), so a stalled leader's
//! write after its term ended is refused. The etcd revision of each put is its commit
//! order; the checker reads the log back sorted by it.

use std::sync::Arc;

use tenure::{Error, LeaseStore, NodeRegistry};
use tenure_etcd::etcd_client::{Client, GetOptions, KeyValue, TxnOp};
use tenure_etcd::{connect_options, EtcdLeaseStore, EtcdUrl};

use crate::backend::{short, Connect, Entry, LogRow, WriteOutcome};
use crate::ChaosError;

/// Entries read per request when reading the log back.
const PAGE: i64 = 2_000;

/// An etcd client with tenure's lease store and the chaos log on it.
#[derive(Clone)]
pub struct EtcdLog {
    store: Arc<EtcdLeaseStore>,
}

impl EtcdLog {
    /// Connects to `etcd://host:port[,...][/prefix]`, through `connect.via` (proxies
    /// standing in for the endpoints) when given. Requests time out after the TTL (at
    /// least a second): an answer later than that is of no use to a term.
    pub async fn open(url: &str, connect: Connect<'_>) -> Result<Self, ChaosError> {
        let url = EtcdUrl::parse(url).map_err(|e| ChaosError::Usage(e.to_string()))?;
        let endpoints: Vec<String> = if connect.via.is_empty() {
            url.endpoints().to_vec()
        } else {
            connect.via.iter().map(|a| format!("http://{a}")).collect()
        };
        let client = Client::connect(&endpoints, Some(connect_options()))
            .await
            .map_err(|e| Error::store("etcd", "cannot connect to the chaos store", e))?;
        let store = EtcdLeaseStore::new(client, url.prefix())?
            .with_request_timeout(connect.ttl.max(std::time::Duration::from_secs(1)))?;
        Ok(EtcdLog {
            store: Arc::new(store),
        })
    }

    /// The lease store.
    pub fn leases(&self) -> Arc<dyn LeaseStore> {
        self.store.clone()
    }

    /// The membership registry made from the lease store (a member is live for `ttl`
    /// after its last heartbeat, or its session's last keep-alive); its requests time
    /// out as the store's do (see [`EtcdLog::open`]).
    pub fn registry(&self, ttl: std::time::Duration) -> Result<Arc<dyn NodeRegistry>, ChaosError> {
        Ok(Arc::new(self.store.registry(ttl)?))
    }

    fn log_prefix(&self, role: &str) -> String {
        format!("{}/chaos/{role}/log/", self.store.prefix())
    }

    /// Puts the entry's key, in a transaction fenced on the term unless `unfenced`.
    /// A store error leaves the outcome unknown: the request may have been applied.
    pub async fn append(&self, entry: Entry<'_>, unfenced: bool) -> WriteOutcome {
        let key = format!(
            "{}{}/{:020}",
            self.log_prefix(entry.role),
            entry.worker,
            entry.seq
        );
        let token = entry.token.get().to_string();
        let committed = if unfenced {
            let mut kv = self.store.client().kv_client();
            kv.put(key, token, None)
                .await
                .map(drop)
                .map_err(|e| Error::store("etcd", "unfenced write", e))
        } else {
            let put = TxnOp::put(key, token, None);
            self.store
                .commit_fenced(entry.role, entry.token, vec![put])
                .await
                .map(drop)
        };
        match committed {
            Ok(()) => WriteOutcome::Ok,
            Err(Error::Fenced { .. }) => WriteOutcome::Fenced,
            Err(e @ Error::InvalidArgument { .. }) => WriteOutcome::Error(short(e)),
            Err(e) => WriteOutcome::Unknown(short(e)),
        }
    }

    /// The role's log, in commit (revision) order, read a page at a time.
    pub async fn read_log(&self, role: &str) -> Result<Vec<LogRow>, ChaosError> {
        let prefix = self.log_prefix(role);
        // The prefix ends in '/'; the next byte up ends its range.
        let end = format!("{}0", &prefix[..prefix.len() - 1]);
        let mut kv = self.store.client().kv_client();
        let mut from = prefix.clone().into_bytes();
        let mut rows = Vec::new();
        loop {
            let options = GetOptions::new().with_range(end.as_str()).with_limit(PAGE);
            let page = kv
                .get(from.clone(), Some(options))
                .await
                .map_err(|e| Error::store("etcd", "cannot read the chaos log", e))?;
            for entry in page.kvs() {
                rows.push(decode(&prefix, entry)?);
            }
            match page.kvs().last() {
                Some(last) if page.more() => {
                    from = last.key().to_vec();
                    from.push(0);
                }
                _ => break,
            }
        }
        rows.sort_by_key(|r| r.id);
        Ok(rows)
    }
}

fn decode(prefix: &str, kv: &KeyValue) -> Result<LogRow, ChaosError> {
    let bad = || {
        ChaosError::Store(Error::store_msg(
            "etcd",
            "a chaos log key is not <worker>/<seq> holding a token",
        ))
    };
    let key = std::str::from_utf8(kv.key()).map_err(|_| bad())?;
    let (worker, seq) = key
        .strip_prefix(prefix)
        .and_then(|rest| rest.rsplit_once('/'))
        .ok_or_else(bad)?;
    let token: u64 = std::str::from_utf8(kv.value())
        .ok()
        .and_then(|v| v.parse().ok())
        .ok_or_else(bad)?;
    Ok(LogRow {
        id: kv.mod_revision(),
        worker: worker.to_owned(),
        token,
        seq: seq.parse().map_err(|_| bad())?,
    })
}
