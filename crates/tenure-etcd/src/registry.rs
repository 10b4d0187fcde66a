//! [`EtcdNodeRegistry`]: heartbeat membership on etcd leases.
//!
//! Node ID is the key `<prefix>/nodes/ID` attached to an etcd lease of twice the
//! registry's TTL; its value records first seen, last heartbeat and metadata (JSON). A
//! heartbeat keeps the node's lease alive and records the time. The live set is one range read,
//! filtered by `now < last_heartbeat + ttl` on this host's clock, so a node is gone at
//! its TTL even in the up to 500 ms before etcd's expiry check deletes its key. Times are
//! this host's clock (etcd has none to offer): membership is a hint, not a lease.
//!
//! Waits for a change of the members share one watch of the nodes' keys per registry
//! (`wait.rs`): a wait whose caller observed this registry's last read, made after the
//! watch opened, needs no request of its own.
//!
//! **Membership through a session.** A registry made by
//! [`EtcdLeaseStore::registry`](crate::EtcdLeaseStore::registry) shares that store's
//! [`SessionLinks`](tenure::session::SessionLinks): which owner's session the store
//! last kept alive, when, and whether that keep-alive found the owner's node record
//! naming the session. A heartbeat names
//! the owner's session in the node's record ([`NodeRecord::session`]); every reader
//! counts that session's last open or keep-alive (its record's `kept_at_ns`) as a
//! heartbeat of the node while the session's key exists and its owner is the node; and
//! the registry skips its write while its last write named that session with the same
//! metadata and the store's last keep-alive, which found the record naming it, was sent
//! less than half the TTL ago; then it only keeps the node's etcd lease alive (which
//! writes nothing), and only once a TTL passed since the lease's last keep-alive, as the
//! lease lasts two. So a shard member writes once per interval, its session's
//! keep-alive, and keeps its node's lease alive once per TTL. A
//! closed session stops counting at once for readers; membership waiters still wake on
//! the node's key alone (a leave deletes it; a dead member's goes with its etcd lease,
//! up to two TTLs after its last heartbeat: readers judge by time, so it is no longer
//! live after one): the shared watch does not cover the sessions' keys. Instead, while
//! a registry shares the store's links, each session keep-alive reads the nodes' and
//! sessions' keys too and tells when the first other node lapses (`peers_lapse`,
//! judged by `heard_nodes` as the reads of the members judge), so a shard member reads
//! the members only when one is due to lapse.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use etcd_client::{
    Client, Compare, CompareOp, DeleteOptions, Event, EventType, GetOptions, PutOptions, Txn,
    TxnOp, TxnResponse, WatchOptions, WatchStream,
};
use parking_lot::Mutex;
use tenure::lease::validate_name;
use tenure::registry::{validate_heartbeat, LastRead};
use tenure::session::{HeartbeatsWritten, SessionLink};
use tenure::{Error, Metadata, NodeInfo, NodeRegistry, Result, SessionId};

use crate::conn::{next_response, Conn, BACKEND};
use crate::lease::{gets_of, lease_of, ranges, DEFAULT_REQUEST_TIMEOUT};
use crate::schema::{
    decode, encode, from_ns, name_under, round_trip, to_ns, ttl_secs, Keys, NodeRecord,
    SessionRecord,
};

/// Which owner's session the stores sharing one set of links last kept alive, by owner
/// (on the monotonic clock): see the module docs.
pub(crate) type SessionLinks = tenure::session::SessionLinks<tokio::time::Instant>;

mod wait;

const MAX_ATTEMPTS: usize = 6;

/// A [`NodeRegistry`] on etcd: one key per node on a per-node etcd lease.
#[derive(Clone)]
pub struct EtcdNodeRegistry {
    conn: Conn,
    keys: Keys,
    ttl: Duration,
    /// The TTL of a node's etcd lease: two of the registry's, so that a lease kept alive
    /// less than one TTL ago has a TTL left (see [`Self::keep_own_lease`]).
    node_lease_secs: i64,
    /// The memberships this registry (and its clones) last wrote, so a heartbeat of a
    /// live one is one round trip (its transaction beside the keep-alive) instead of a
    /// read first. A stale entry only costs a failed compare and the read after it.
    own: Arc<Mutex<HashMap<String, OwnMembership>>>,
    /// The live nodes the last read showed, and the revision it read at: a wait for a
    /// change of those watches from the next revision instead of reading again.
    last_read: Arc<LastRead<i64>>,
    /// The watch its membership waits share (see `wait.rs`).
    members_watch: wait::Slot,
    /// The links of the store this registry was made from, if any (see the module
    /// docs), and what its heartbeats last wrote.
    links: Option<Arc<SessionLinks>>,
    written: Arc<HeartbeatsWritten>,
}

/// A membership this registry wrote: its etcd lease, the key's mod revision after the
/// write, the record written, and when the lease's last grant or keep-alive was sent.
#[derive(Clone)]
struct OwnMembership {
    lease: i64,
    mod_revision: i64,
    record: NodeRecord,
    kept: tokio::time::Instant,
}

impl std::fmt::Debug for EtcdNodeRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdNodeRegistry")
            .field("prefix", &self.keys.prefix())
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

/// One change of membership, from [`MembershipWatch::next`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MembershipChange {
    /// A node started a membership (first heartbeat, or the first after it lapsed).
    Joined {
        /// The node's id.
        node_id: String,
        /// What the node said about itself.
        metadata: Metadata,
    },
    /// A node left, or etcd expired its lease.
    Left {
        /// The node's id.
        node_id: String,
    },
}

/// A stream of [`MembershipChange`]s from an etcd watch on the registry's nodes.
pub struct MembershipWatch {
    stream: WatchStream,
    dir: String,
    pending: std::collections::VecDeque<MembershipChange>,
}

impl std::fmt::Debug for MembershipWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MembershipWatch")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl MembershipWatch {
    /// The next change; `Ok(None)` when etcd closed the watch, `Err` when it broke
    /// (watch again, after reading [`EtcdNodeRegistry::members`] to catch up).
    pub async fn next(&mut self) -> Result<Option<MembershipChange>> {
        loop {
            if let Some(change) = self.pending.pop_front() {
                return Ok(Some(change));
            }
            let Some(response) = next_response(&mut self.stream, "membership").await? else {
                return Ok(None);
            };
            let changes = response
                .events()
                .iter()
                .filter_map(|event| membership_change(event, &self.dir));
            self.pending.extend(changes);
        }
    }
}

/// The join or leave `event` (of a watch on the nodes' directory `dir`) is, if any: a
/// delete is a leave; a put is a join when it starts a membership (its first heartbeat),
/// and nothing when it is a later heartbeat.
fn membership_change(event: &Event, dir: &str) -> Option<MembershipChange> {
    let kv = event.kv()?;
    let node_id = name_under(kv.key(), dir)?.to_owned();
    match event.event_type() {
        EventType::Delete => Some(MembershipChange::Left { node_id }),
        EventType::Put => {
            let record = decode::<NodeRecord>(kv.value())?;
            (record.first_seen_ns == record.last_heartbeat_ns).then_some(MembershipChange::Joined {
                node_id,
                metadata: record.metadata,
            })
        }
    }
}

impl EtcdNodeRegistry {
    /// A registry over `client` with keys under `prefix` and liveness TTL `ttl`, which
    /// must be whole seconds, at least one (etcd lease TTLs are).
    pub fn new(client: Client, prefix: &str, ttl: Duration) -> Result<Self> {
        let keys = Keys::new(prefix)?;
        if ttl < Duration::from_secs(1) {
            return Err(Error::invalid(
                "ttl",
                format!("{ttl:?} is below etcd's minimum of 1s"),
            ));
        }
        let node_lease_secs = ttl_secs(ttl)?.saturating_mul(2);
        Ok(EtcdNodeRegistry {
            conn: Conn {
                client,
                timeout: DEFAULT_REQUEST_TIMEOUT,
            },
            keys,
            ttl,
            node_lease_secs,
            own: Arc::default(),
            last_read: Arc::default(),
            members_watch: Arc::default(),
            links: None,
            written: Arc::default(),
        })
    }

    /// Shares a store's links (see the module docs).
    pub(crate) fn with_links(mut self, links: Arc<SessionLinks>) -> Self {
        links.registry_made(self.ttl);
        self.links = Some(links);
        self
    }

    /// The open session of `node_id` (its owner) that the linked store keeps alive.
    fn link_of(&self, node_id: &str) -> Option<SessionLink<tokio::time::Instant>> {
        self.links.as_ref()?.of(node_id)
    }

    /// Whether `record`, this registry's own node's, is live through its owner's session
    /// as the linked store last kept it alive: it names the session, the last keep-alive
    /// found it naming it, and that was sent less than a TTL ago.
    fn live_by_session(&self, node_id: &str, record: &NodeRecord) -> bool {
        self.link_of(node_id).is_some_and(|link| {
            link.named
                && lease_of(SessionId::from(link.id)).is_some_and(|l| record.session == Some(l))
                && link.kept.elapsed() < self.ttl
        })
    }

    /// Sets the timeout of each etcd request (default 5 s).
    pub fn with_request_timeout(mut self, timeout: Duration) -> Result<Self> {
        self.conn.set_timeout(timeout)?;
        Ok(self)
    }

    /// Watches membership from now on: joins and departures (including etcd expiring a
    /// node's lease, which lasts two TTLs: a node that stops heartbeating is no longer
    /// live after one, by [`members`](NodeRegistry::members), but leaves this stream only
    /// when its lease expires) as they happen.
    pub async fn watch_members(&self) -> Result<MembershipWatch> {
        let dir = self.keys.nodes_dir();
        let stream = self
            .conn
            .watch(
                "watching membership",
                &dir,
                WatchOptions::new().with_prefix(),
            )
            .await?;
        Ok(MembershipWatch {
            stream,
            dir,
            pending: Default::default(),
        })
    }

    fn is_live(&self, record: &NodeRecord, now: SystemTime) -> bool {
        self.lives_after(from_ns(record.last_heartbeat_ns), now)
    }

    /// Whether a node last heard of at `heard` is live at `now`.
    fn lives_after(&self, heard: SystemTime, now: SystemTime) -> bool {
        tenure::registry::is_live(heard, self.ttl, now)
    }

    /// Whether `node_id`, this registry's own, is live by its record's heartbeat or
    /// through its session (see [`live_by_session`](Self::live_by_session)).
    fn own_is_live(&self, node_id: &str, record: &NodeRecord, now: SystemTime) -> bool {
        self.is_live(record, now) || self.live_by_session(node_id, record)
    }

    /// Remembers what a successful write left at `node_id`'s key, on `lease` kept alive
    /// (or granted) at `kept`.
    fn remember(
        &self,
        node_id: &str,
        (lease, kept): (i64, tokio::time::Instant),
        response: &TxnResponse,
        record: NodeRecord,
    ) {
        let Some(mod_revision) = response.header().map(|h| h.revision()) else {
            return;
        };
        self.own.lock().insert(
            node_id.to_owned(),
            OwnMembership {
                lease,
                mod_revision,
                record,
                kept,
            },
        );
    }

    /// A heartbeat of a membership this registry wrote and still believes live, without
    /// reading it first. `Ok(false)`: the key changed or the lease is gone; read it.
    async fn beat_own(
        &self,
        node_id: &str,
        key: &str,
        metadata: Option<&Metadata>,
        session: Option<i64>,
    ) -> Result<bool> {
        let cached = self.own.lock().get(node_id).cloned();
        let now = round_trip(SystemTime::now());
        let Some(mut own) = cached.filter(|own| self.own_is_live(node_id, &own.record, now)) else {
            return Ok(false);
        };
        own.record.last_heartbeat_ns = to_ns(now);
        own.record.session = session;
        if let Some(metadata) = metadata {
            own.record.metadata = metadata.clone();
        }
        let txn = node_txn(key, own.mod_revision, &own.record, own.lease)?;
        let sent = tokio::time::Instant::now();
        let (written, alive) = tokio::join!(
            self.conn.txn("recording a heartbeat", txn),
            self.conn.keep_alive_once(own.lease),
        );
        match (written, alive) {
            (Ok(response), Ok(true)) if response.succeeded() => {
                self.remember(node_id, (own.lease, sent), &response, own.record);
                Ok(true)
            }
            (written, alive) => {
                self.own.lock().remove(node_id);
                match (written, alive?) {
                    // Changed by someone else, or the lease is gone (then the put failed
                    // too): the read path starts over from what the key holds.
                    (Ok(_), _) | (Err(_), false) => Ok(false),
                    (Err(error), true) => Err(error),
                }
            }
        }
    }

    async fn beat(&self, node_id: &str, metadata: Option<&Metadata>) -> Result<()> {
        validate_heartbeat(node_id, metadata)?;
        let encoded = metadata.and_then(|m| serde_json::to_string(m).ok());
        let link = self.link_of(node_id);
        if let Some(link) = link {
            let recent = link.kept.elapsed() < self.ttl / 2;
            if recent
                && self.written.stood_in(node_id, encoded.as_deref(), &link)
                && self.keep_own_lease(node_id).await?
            {
                return Ok(());
            }
        }
        let session = link.and_then(|link| lease_of(SessionId::from(link.id)));
        let beat = self.write_beat(node_id, metadata, session).await;
        match &beat {
            Ok(()) => self.written.wrote(node_id, link.map(|l| l.id), encoded),
            Err(_) => self.written.forget(node_id),
        }
        beat
    }

    /// Keeps the etcd lease of `node_id`'s membership alive without writing its record
    /// (its session's keep-alive stood in for the heartbeat), unless it was kept alive
    /// less than a TTL ago: it lasts two, so it has a TTL left, and a deleted key is
    /// found by the session's next keep-alive, which then no longer stands in.
    /// `Ok(false)`: no membership is known here, or its lease is gone; write one.
    async fn keep_own_lease(&self, node_id: &str) -> Result<bool> {
        let Some((lease, kept)) = self
            .own
            .lock()
            .get(node_id)
            .map(|own| (own.lease, own.kept))
        else {
            return Ok(false);
        };
        if kept.elapsed() < self.ttl {
            return Ok(true);
        }
        let sent = tokio::time::Instant::now();
        match self.conn.keep_alive_once(lease).await {
            Ok(true) => {
                if let Some(own) = self.own.lock().get_mut(node_id) {
                    if own.lease == lease {
                        own.kept = own.kept.max(sent);
                    }
                }
                Ok(true)
            }
            Ok(false) => {
                self.own.lock().remove(node_id);
                self.written.forget(node_id);
                Ok(false)
            }
            Err(error) => {
                self.written.forget(node_id);
                Err(error)
            }
        }
    }

    /// A heartbeat's write of `node_id`'s record, naming `session`.
    async fn write_beat(
        &self,
        node_id: &str,
        metadata: Option<&Metadata>,
        session: Option<i64>,
    ) -> Result<()> {
        let key = self.keys.node(node_id);
        if self.beat_own(node_id, &key, metadata, session).await? {
            return Ok(());
        }
        for _ in 0..MAX_ATTEMPTS {
            let current = self.conn.get("reading a node", &key, None).await?;
            let kv = current.kvs().first().cloned();
            let now = round_trip(SystemTime::now());
            let record = kv
                .as_ref()
                .and_then(|kv| decode::<NodeRecord>(kv.value()).map(|r| (kv.clone(), r)));
            let observed_revision = kv.as_ref().map_or(0, |kv| kv.mod_revision());
            let live = record
                .as_ref()
                .filter(|(kv, r)| kv.lease() != 0 && self.own_is_live(node_id, r, now))
                .cloned();
            if let Some((kv, mut record)) = live {
                // A live membership: refresh its lease and record the heartbeat.
                record.last_heartbeat_ns = to_ns(now);
                record.session = session;
                if let Some(metadata) = metadata {
                    record.metadata = metadata.clone();
                }
                let txn = node_txn(&key, observed_revision, &record, kv.lease())?;
                let sent = tokio::time::Instant::now();
                let (written, alive) = tokio::join!(
                    self.conn.txn("recording a heartbeat", txn),
                    self.conn.keep_alive_once(kv.lease()),
                );
                match (written, alive?) {
                    (Ok(response), true) if response.succeeded() => {
                        self.remember(node_id, (kv.lease(), sent), &response, record);
                        return Ok(());
                    }
                    // Raced with another heartbeat of this node; read again.
                    (Ok(_), true) => continue,
                    // The lease expired under us: start a new membership below, next round.
                    (_, false) => {
                        let old_metadata = Some(record.metadata.clone());
                        if self
                            .start_membership(
                                node_id,
                                &key,
                                (kv.mod_revision(), kv.lease()),
                                metadata,
                                old_metadata,
                                session,
                            )
                            .await?
                        {
                            return Ok(());
                        }
                        continue;
                    }
                    (Err(error), true) => return Err(error),
                }
            }
            // Absent, lapsed or unreadable: a new membership on a new lease.
            let previous = record.map(|(kv, r)| (kv.lease(), r.metadata));
            let (old_lease, old_metadata) = previous.map_or((0, None), |(l, m)| (l, Some(m)));
            if self
                .start_membership(
                    node_id,
                    &key,
                    (observed_revision, old_lease),
                    metadata,
                    old_metadata,
                    session,
                )
                .await?
            {
                return Ok(());
            }
        }
        Err(Error::store_msg(
            BACKEND,
            "the node's record kept changing during the heartbeat; try again",
        ))
    }

    /// Writes a fresh membership (first seen = now, naming `session`) on a new etcd
    /// lease if the key is still at the observed revision (`observed`: it and the
    /// previous lease); revokes the previous lease. Returns whether it won.
    async fn start_membership(
        &self,
        node_id: &str,
        key: &str,
        (observed_revision, old_lease): (i64, i64),
        metadata: Option<&Metadata>,
        old_metadata: Option<Metadata>,
        session: Option<i64>,
    ) -> Result<bool> {
        let sent = tokio::time::Instant::now();
        let (lease, _) = self.conn.grant(self.node_lease_secs).await?;
        let now = to_ns(round_trip(SystemTime::now()));
        let record = NodeRecord {
            first_seen_ns: now,
            last_heartbeat_ns: now,
            metadata: metadata.cloned().or(old_metadata).unwrap_or_default(),
            session,
        };
        let txn = node_txn(key, observed_revision, &record, lease)?;
        let written = self.conn.txn("recording a heartbeat", txn).await;
        match written {
            Ok(response) if response.succeeded() => {
                self.remember(node_id, (lease, sent), &response, record);
                if old_lease != lease {
                    self.conn.revoke_quietly(old_lease).await;
                }
                tracing::debug!(node_id, "membership started");
                Ok(true)
            }
            other => {
                self.conn.revoke_quietly(lease).await;
                other.map(|_| false)
            }
        }
    }

    /// The live nodes, each last heard of at the later of its own heartbeat and the
    /// last keep-alive of the session its record names (see the module docs).
    async fn read_nodes(&self) -> Result<Vec<NodeInfo>> {
        let txn = Txn::new().and_then(nodes_and_sessions(&self.keys));
        let response = self.conn.txn("listing nodes", txn).await?;
        let revision = response.header().map(|h| h.revision());
        let [nodes, sessions] = gets_of(ranges(&response))?;
        let now = SystemTime::now();
        let mut nodes: Vec<NodeInfo> = heard_nodes(&nodes, &sessions, &self.keys, now)
            .into_iter()
            .filter(|node| self.lives_after(node.heard, now))
            .map(|node| NodeInfo {
                node_id: node.node_id,
                last_heartbeat: node.heard,
                first_seen: from_ns(node.record.first_seen_ns),
                metadata: node.record.metadata,
                now,
            })
            .collect();
        nodes.sort_by(|a, b| a.node_id.cmp(&b.node_id));
        let live = nodes.iter().map(|n| n.node_id.clone()).collect();
        self.last_read.remember(revision, live);
        Ok(nodes)
    }
}

/// The two ranges a judgement of the members reads ([`heard_nodes`]): every node's key
/// and every session's key.
pub(crate) fn nodes_and_sessions(keys: &Keys) -> [TxnOp; 2] {
    let all = || Some(GetOptions::new().with_prefix());
    [
        TxnOp::get(keys.nodes_dir(), all()),
        TxnOp::get(keys.sessions_dir(), all()),
    ]
}

/// A node's key as readers judge it at some `now`.
pub(crate) struct HeardNode {
    pub(crate) node_id: String,
    pub(crate) record: NodeRecord,
    /// When it was last heard of: the later of its own heartbeat and the last
    /// keep-alive of the session its record names, while that session's key exists
    /// and its owner is the node.
    pub(crate) heard: SystemTime,
    /// When it was last heard of by any means: `now` for a node whose record names a
    /// session that is gone (when that session was last kept alive is gone with its key;
    /// the node's key, on a lease of two TTLs, still stands for a member heard of
    /// within them), else `heard`.
    pub(crate) recent: SystemTime,
}

/// Every node under `keys`' nodes' directory in one read of `nodes` and `sessions`
/// (the answers of [`nodes_and_sessions`]), judged at `now`.
pub(crate) fn heard_nodes(
    nodes: &etcd_client::GetResponse,
    sessions: &etcd_client::GetResponse,
    keys: &Keys,
    now: SystemTime,
) -> Vec<HeardNode> {
    let dir = keys.nodes_dir();
    let kept: HashMap<i64, (String, SystemTime)> = sessions
        .kvs()
        .iter()
        .filter_map(|kv| {
            let record = decode::<SessionRecord>(kv.value())?;
            Some((kv.lease(), (record.owner, from_ns(record.kept_at_ns))))
        })
        .collect();
    nodes
        .kvs()
        .iter()
        .filter_map(|kv| {
            let node_id = name_under(kv.key(), &dir)?;
            let record = decode::<NodeRecord>(kv.value())?;
            let own = from_ns(record.last_heartbeat_ns);
            let by_session = record
                .session
                .and_then(|lease| kept.get(&lease))
                .filter(|(owner, _)| owner == node_id)
                .map(|&(_, at)| at);
            let heard = by_session.map_or(own, |at| at.max(own));
            let session_gone = record.session.is_some() && by_session.is_none();
            Some(HeardNode {
                node_id: node_id.to_owned(),
                record,
                heard,
                recent: if session_gone { now.max(heard) } else { heard },
            })
        })
        .collect()
}

/// When the first node other than `owner` lapses, for a registry of TTL `ttl`, from one
/// read of `nodes` and `sessions` (see [`nodes_and_sessions`]) judged at `now`: what a
/// session's keep-alive tells ([`tenure::SessionGrant::peers_lapse`]).
pub(crate) fn peers_lapse(
    nodes: &etcd_client::GetResponse,
    sessions: &etcd_client::GetResponse,
    keys: &Keys,
    owner: &str,
    ttl: Duration,
    now: SystemTime,
) -> tenure::PeersLapse {
    let others = heard_nodes(nodes, sessions, keys, now)
        .into_iter()
        .filter(|node| node.node_id != owner)
        .map(|node| (node.heard, node.recent));
    tenure::PeersLapse::judge(others, ttl, now)
}

/// The heartbeat transaction, and the one that starts a membership: put `record` on
/// etcd lease `lease` if the node's key is still at `observed_revision` (0: absent).
/// A heartbeat of a live membership sends it with a keep-alive of the node's lease.
/// Public (hidden) for [`crate::requests`].
#[doc(hidden)]
pub fn node_txn(key: &str, observed_revision: i64, record: &NodeRecord, lease: i64) -> Result<Txn> {
    Ok(Txn::new()
        .when([Compare::mod_revision(
            key,
            CompareOp::Equal,
            observed_revision,
        )])
        .and_then([TxnOp::put(
            key,
            encode(record)?,
            Some(PutOptions::new().with_lease(lease)),
        )]))
}

#[async_trait]
impl NodeRegistry for EtcdNodeRegistry {
    async fn record_heartbeat(&self, node_id: &str, metadata: Option<&Metadata>) -> Result<()> {
        self.beat(node_id, metadata).await
    }

    async fn members(&self) -> Result<Vec<NodeInfo>> {
        self.read_nodes().await
    }

    async fn leave(&self, node_id: &str) -> Result<bool> {
        validate_name("node_id", node_id)?;
        self.own.lock().remove(node_id);
        self.written.forget(node_id);
        let response = self
            .conn
            .delete(
                "removing a node",
                &self.keys.node(node_id),
                Some(DeleteOptions::new().with_prev_key()),
            )
            .await?;
        let Some(previous) = response.prev_kvs().first() else {
            return Ok(false);
        };
        self.conn.revoke_quietly(previous.lease()).await;
        let was_live = decode::<NodeRecord>(previous.value())
            .is_some_and(|record| self.own_is_live(node_id, &record, SystemTime::now()));
        Ok(was_live)
    }

    fn ttl(&self) -> Duration {
        self.ttl
    }

    async fn wait_for_members_change(&self, observed: &[String], deadline: tokio::time::Instant) {
        self.wait_members(observed, deadline).await;
    }
}
