//! [`EtcdLeaseStore`]: tenure leases on etcd leases, fencing tokens from create revisions.
//!
//! The term of role R is the key `<prefix>/leases/R`, holding the owner and attached to
//! an etcd lease of the term's TTL. Its create revision is the fencing token: etcd
//! revisions only grow, survive restarts, and a key deleted and created again gets a
//! new one, so tokens strictly increase per role (they are not consecutive). Expiry is
//! etcd's: the term ends when etcd expires or revokes the lease and deletes the key.
//!
//! # Records
//!
//! Beside the lease key, `<prefix>/terms/R` records the latest term (owner, token,
//! expiry, whether released; rewritten by every renewal, kept after expiry), and
//! `<prefix>/values/R` the value it advertised
//! ([`try_acquire_or_renew_with_value`](LeaseStore::try_acquire_or_renew_with_value)):
//! put (or, for a term advertising nothing, deleted) by the transaction that starts the
//! term, deleted by release, never touched by a renewal, so a term keeps the value it
//! began with and a renewal costs nothing more for it. Neither is on the etcd lease, so
//! a term that lapses unreleased keeps its holder and value for readers. See
//! the crate's `schema.rs` for the layout.
//!
//! # Time
//!
//! etcd has no wall clock in its answers. `expires_at` is this host's wall clock read
//! just before the request that (re)started the etcd lease was sent, plus the TTL; `now`
//! is that same reading plus the time passed since on the monotonic clock (this host's
//! wall clock when the answer arrived, unless it stepped). So the time left, `expires_at
//! - now`, is measured on the monotonic clock alone: a wall-clock step during or between
//! calls cannot stretch it past the etcd lease. etcd counts the TTL from when it handled
//! the request, so the reported end is a lower bound of the real one (up to one round
//! trip early, ignoring clock rate), which is the safe side for a holder. Other contenders read
//! the holder's `expires_at` from the `terms/R` record. etcd checks expiry every 500 ms,
//! so a key can outlive its reported `expires_at` by about that much: such a term is
//! still held (nobody else can acquire it) and is reported live with `expires_at` =
//! `now` + 500 ms. A holder renewing in that window keeps its token.
//!
//! # The queue of candidates
//!
//! [`try_acquire_or_queue`](LeaseStore::try_acquire_or_queue) queues a contender that
//! does not acquire, as etcd's own election recipe does: a candidate is the key
//! `<prefix>/queue/N/R/O` (N the length of R, O the owner) on an etcd lease of its TTL,
//! written by the acquire transaction's failure branch beside a keep-alive of that lease,
//! so a refresh is one round trip (one transaction and one keep-alive) and a candidate
//! that stops refreshing drops out when its lease expires. A refresh puts the key again
//! (its create revision, so its place, is kept); a candidacy whose key vanished joins at
//! the back. The queue's order is the candidate keys' create revisions.
//!
//! A release (or [`hand_over`](LeaseStore::hand_over)) with candidates queued hands the
//! role to the oldest (or the named one) in **two** transactions, because the new token
//! must be the lease key's create revision and etcd refuses a transaction that deletes
//! and creates one key: the first ends the term, reserves the role with the key
//! `<prefix>/leases/R` NUL `handoff` (every acquire requires it absent) and reads the
//! candidate; the second puts the lease key for the candidate on the candidate's own
//! etcd lease (its renewals extend the term, and a dead candidate's term ends when its
//! candidacy would have), with its value, and deletes the reservation and the candidate
//! key. Between the two nobody holds the role and nobody but that candidate can take it;
//! should the releaser stop there, the next contender to try (a candidate refreshes every
//! retry interval) sends the second transaction itself. A handover costs etcd two
//! transactions and the revoke of the old term's lease, however many candidates wait.
//! The successor's first call then sends nothing: its candidacy's lease is the term's,
//! and lasts its TTL from the candidacy's last keep-alive, so the answer counts from
//! that (on an etcd whose keep-alive may answer for a lease it revokes, see
//! [`EtcdLeaseStore::for_server`], it renews instead: one transaction after one
//! keep-alive). The candidates learn
//! who leads next from the events of one watch per role and store
//! ([`wait_for_successor`](LeaseStore::wait_for_successor)), which they share and keep
//! between waits. See `queue.rs` and `successor.rs`.
//!
//! # Sessions
//!
//! A session is an etcd lease, its id the etcd lease id: roles acquired under it have
//! their lease keys attached to that one etcd lease, so one keep-alive (and one write of
//! the session's own `sessions/L` record) keeps them all however many there are, and
//! revoking it ends them all at once (the deletes wake every waiter's watch). Session
//! ids are unique because etcd's are: etcd refuses to grant the id of a live lease, and
//! builds new ids from the member id, the member's start time in milliseconds and a
//! counter, so an id comes back only if a member restarts with its clock set back (or
//! two members share the low 16 bits of their ids and one runs far ahead). Even then a
//! store that opened or used a session pins it by its key's create revision, so it never
//! takes a later session under the same id for the one it knew.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use etcd_client::{
    Client, Compare, CompareOp, DeleteOptions, Event, EventType, GetOptions, KeyValue, PutOptions,
    SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse, TxnResponse, WatchOptions,
};
use parking_lot::Mutex;
use tenure::lease::{validate_name, AcquireRequest, ChangesRead, EndRequest, PrefixChanges};
use tenure::{
    Clock, Error, FencingToken, LeaseInfo, LeaseResult, LeaseStore, Result, SessionGrant,
    SessionId, SystemClock, TermChange,
};

use crate::conn::{next_response, Conn, BACKEND};
use crate::registry::SessionLinks;
use crate::schema::{
    decode, encode, from_ns, name_under, round_trip, to_ns, ttl_secs, Keys, SessionMark,
    TermRecord, ValueRecord,
};
use crate::version::EtcdVersion;

mod changes;
mod fenced;
#[cfg(test)]
mod handover_tests;
mod queue;
mod requests;
mod seen;
mod session;
mod successor;
mod term;
#[cfg(test)]
mod tests;
mod watch;

use queue::Candidacy;
use requests::*;
pub use requests::{acquire_txn, release_txn, renew_txn};
pub(crate) use requests::{gets_of, ranges};
use seen::{Holder, Seen, Step};
pub(crate) use session::lease_of;
use watch::until_watched;

/// How long a key may outlive its reported expiry before etcd deletes it: etcd's
/// expiry check period.
pub const EXPIRY_GRACE: Duration = Duration::from_millis(500);

/// The default timeout of one etcd request.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// How many times one call re-reads after losing a race before giving up.
const MAX_ATTEMPTS: usize = 6;

/// At most this many unused etcd leases are kept for the next acquire.
const MAX_SPARE_LEASES: usize = 8;

/// A [`LeaseStore`] on etcd (v3 API, etcd 3.4 or later).
///
/// Takes the caller's own [`etcd_client::Client`] and a key prefix. Every operation is
/// one transaction (plus, for renewals, a keep-alive of the term's etcd lease: sent
/// together with it against a server whose keep-alive answers are safe, so a renewal
/// costs one round trip, and before it otherwise; see [`for_server`](Self::for_server));
/// release is a transaction that compares the create revision, never an unconditional
/// delete.
///
/// Sessions cost one etcd keep-alive and one write per keep-alive however many roles
/// they hold (see the module docs); acquiring under one is one transaction.
///
/// Queued contenders are candidate keys on etcd leases of their own; a release hands
/// the role to the oldest in two transactions with the role reserved between them (see
/// the module docs).
///
/// Tokens are the lease key's create revision: strictly increasing per role and durable
/// across etcd restarts, but not consecutive. `get` and `list` also show terms that
/// ended (released or expired), from the `terms/R` record, and the value the latest
/// term advertised, from `values/R` (see the module docs).
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> tenure::Result<()> {
/// use std::time::Duration;
/// use tenure::LeaseStore;
/// use tenure_etcd::EtcdLeaseStore;
///
/// let client = etcd_client::Client::connect(["http://127.0.0.1:2379"], None)
///     .await
///     .map_err(|e| tenure::Error::store("etcd", "connect", e))?;
/// let store = EtcdLeaseStore::new(client, "/myapp")?;
/// let lease = store.try_acquire_or_renew("reports", "node-a", Duration::from_secs(10)).await?;
/// if lease.acquired {
///     // ... work stamped with lease.fencing_token ...
///     store.release("reports", "node-a", lease.fencing_token).await?;
/// }
/// # Ok(()) }
/// ```
pub struct EtcdLeaseStore {
    conn: Conn,
    keys: Keys,
    /// Our live terms as last seen by this instance, so a renewal needs no read first.
    /// Only a hint: every renewal is checked by the transaction's compares.
    terms: Mutex<HashMap<String, OwnTerm>>,
    /// Granted but unused etcd leases, so an acquire after a lost race (or a push) is
    /// one round trip.
    spare: Mutex<Vec<SpareLease>>,
    /// Sessions this instance opened or looked up, by etcd lease id (`None` once it saw
    /// one end), so keeping one alive or acquiring under it needs no read first. Every
    /// write is still checked against the session's key.
    sessions: Mutex<HashMap<i64, Option<session::KnownSession>>>,
    /// The candidacies this instance queued, by (role, owner), so a refresh keeps its
    /// etcd lease (see `queue.rs`). Only a hint: every write is checked by etcd.
    candidacies: Mutex<HashMap<(String, String), Candidacy>>,
    /// The roles' shared watches for [`LeaseStore::wait_for_successor`] (see
    /// `successor.rs`).
    watches: successor::Watches,
    /// Send a renewal's transaction only after its keep-alive answered: needed against
    /// servers whose keep-alive may report a lease alive while it is being revoked
    /// (see [`crate::version`]).
    keep_alive_first: bool,
    /// The wall clock answers are dressed in; only ever read once per answer (see the
    /// module docs), so a step of it cannot stretch a reported remaining time.
    clock: Arc<dyn Clock>,
    /// Which owner's session this store last kept alive, shared with the registries
    /// made by [`registry`](Self::registry) (see `registry.rs`).
    links: Arc<SessionLinks>,
}

impl std::fmt::Debug for EtcdLeaseStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdLeaseStore")
            .field("prefix", &self.keys.prefix())
            .field("request_timeout", &self.conn.timeout)
            .finish_non_exhaustive()
    }
}

#[derive(Clone, Debug)]
struct OwnTerm {
    owner: String,
    token: i64,
    lease: i64,
    /// The TTL the caller asked for.
    ttl_secs: i64,
    /// The TTL etcd granted (etcd raises TTLs below its minimum).
    lease_secs: i64,
    /// Whether `lease` is a session's (then it is never renewed or revoked for this term).
    in_session: bool,
    /// Set when a handover began this term on our candidacy's etcd lease and no call has
    /// answered for it yet: when the candidacy's last keep-alive was sent. The lease
    /// lasts its TTL from then, so the successor's first call can answer from it without
    /// a request (see `EtcdLeaseStore::answer_handed`).
    handed: Option<Sent>,
}

impl OwnTerm {
    /// The answer for this term once etcd has expired its lease.
    fn lapsing(&self) -> Step {
        Step::Lapsing(FencingToken::from(u64::try_from(self.token).unwrap_or(0)))
    }
}

/// Both clocks, read together just before a request that (re)starts an etcd lease:
/// etcd counts the lease's TTL from some time after this.
#[derive(Clone, Copy, Debug)]
struct Sent {
    wall: SystemTime,
    mono: tokio::time::Instant,
}

impl Sent {
    /// The `(expires_at, now)` of an answer about an etcd lease of `length` (re)started
    /// after this: `expires_at` on this reading's wall clock, `now` derived from it so
    /// that `expires_at - now` is the time left on the monotonic clock. Never the
    /// difference of two wall readings, which a step between them would stretch.
    fn answer(&self, length: Duration) -> (SystemTime, SystemTime) {
        let expires_at = round_trip(self.wall + length);
        let left = (self.mono + length).saturating_duration_since(tokio::time::Instant::now());
        (
            expires_at,
            expires_at.checked_sub(left).unwrap_or(expires_at),
        )
    }
}

#[derive(Clone, Copy, Debug)]
struct SpareLease {
    id: i64,
    ttl_secs: i64,
    lease_secs: i64,
    /// Just before the request that last (re)started it was sent.
    started: Sent,
    /// Usable until then: half its TTL after the request that (re)started it was sent.
    usable_until: tokio::time::Instant,
}

impl EtcdLeaseStore {
    /// A store over `client`, keeping its keys under `prefix` (for example `/myapp`).
    ///
    /// `prefix` must be non-empty, printable, without whitespace and not end in `/`;
    /// anything else is `InvalidArgument` naming `prefix`.
    pub fn new(client: Client, prefix: &str) -> Result<Self> {
        Ok(EtcdLeaseStore {
            conn: Conn {
                client,
                timeout: DEFAULT_REQUEST_TIMEOUT,
            },
            keys: Keys::new(prefix)?,
            terms: Mutex::new(HashMap::new()),
            spare: Mutex::new(Vec::new()),
            sessions: Mutex::new(HashMap::new()),
            candidacies: Mutex::new(HashMap::new()),
            watches: Arc::default(),
            keep_alive_first: true,
            clock: Arc::new(SystemClock),
            links: Arc::default(),
        })
    }

    /// A registry of liveness TTL `ttl` (whole seconds, at least one) on this store's
    /// client and prefix that counts the keep-alives of this store's sessions as
    /// heartbeats of their owners' nodes: a shard member whose store and registry are
    /// made so writes once per interval, its keep-alive, instead of twice (see
    /// [`EtcdNodeRegistry`](crate::EtcdNodeRegistry)).
    pub fn registry(&self, ttl: Duration) -> Result<crate::EtcdNodeRegistry> {
        let registry = crate::EtcdNodeRegistry::new(self.conn.client.clone(), self.prefix(), ttl)?
            .with_request_timeout(self.conn.timeout)?;
        Ok(registry.with_links(self.links.clone()))
    }

    /// Reads the wall clock from `clock` instead of the host's ([`SystemClock`]). etcd
    /// keeps no wall time, so this clock only dresses answers (`now`, `expires_at`) and
    /// the expiries recorded for readers; remaining times are measured on the monotonic
    /// clock whatever it does. Tests inject a clock they can step.
    pub fn with_wall_clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    fn wall(&self) -> SystemTime {
        self.clock.now()
    }

    /// Reads both clocks just before a request that (re)starts an etcd lease.
    fn sent(&self) -> Sent {
        Sent {
            wall: self.wall(),
            mono: tokio::time::Instant::now(),
        }
    }

    /// Tunes renewals to the server: against a release whose keep-alive answers are
    /// safe ([`EtcdVersion::keep_alive_is_safe`]) a renewal's keep-alive and transaction
    /// go out together (one round trip); against an older or unknown one (`None`), the
    /// default, the transaction follows the keep-alive's answer (two round trips). Only
    /// against a safe one does a successor answer its first call after a handover from
    /// its candidacy's last keep-alive, with no request. Use the version
    /// [`connect_client`](crate::connect_client) reports.
    pub fn for_server(mut self, version: Option<EtcdVersion>) -> Self {
        self.keep_alive_first = crate::version::keep_alive_first(version);
        self
    }

    /// Whether a renewal waits for its keep-alive's answer before sending its
    /// transaction (see [`for_server`](Self::for_server)).
    pub fn keeps_alive_first(&self) -> bool {
        self.keep_alive_first
    }

    /// Sets the timeout of each etcd request (default [`DEFAULT_REQUEST_TIMEOUT`]); a
    /// request without an answer by then fails with `Error::Store`.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Result<Self> {
        self.conn.set_timeout(timeout)?;
        Ok(self)
    }

    /// The etcd client this store uses.
    pub fn client(&self) -> &Client {
        &self.conn.client
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        self.keys.prefix()
    }

    /// The key of role `role`'s live term, `<prefix>/leases/<role>`; its create revision
    /// is the fencing token.
    pub fn lease_key(&self, role: &str) -> Result<String> {
        validate_name("role", role)?;
        Ok(self.keys.lease(role))
    }

    /// Reads the role's lease key, term record and handover key in one transaction;
    /// also returns the store revision of the read.
    async fn read_role(&self, role: &str) -> Result<(Seen, Option<(TermRecord, i64)>, i64)> {
        let txn = Txn::new().and_then([
            TxnOp::get(self.keys.lease(role), None),
            TxnOp::get(self.keys.term(role), None),
            TxnOp::get(self.keys.handoff(role), None),
        ]);
        let response = self.conn.txn("reading a lease", txn).await?;
        let revision = response.header().map_or(0, |h| h.revision());
        let mut gets = first_kvs(&response).into_iter();
        let (lease_kv, term_kv) = (gets.next().flatten(), gets.next().flatten());
        let handoff_kv = gets.next().flatten();
        let (seen, record) = seen_in(lease_kv.as_ref(), term_kv.as_ref(), handoff_kv.as_ref());
        Ok((seen, record, revision))
    }

    /// [`read_role`](Self::read_role) that also reads the role's advertised value (see
    /// [`advertised`]), in the same transaction.
    async fn read_role_and_value(
        &self,
        role: &str,
    ) -> Result<(Seen, Option<(TermRecord, i64)>, Option<(String, i64)>)> {
        let txn = Txn::new().and_then([
            TxnOp::get(self.keys.lease(role), None),
            TxnOp::get(self.keys.term(role), None),
            TxnOp::get(self.keys.value(role), None),
        ]);
        let response = self.conn.txn("reading a lease", txn).await?;
        let mut gets = first_kvs(&response).into_iter();
        let lease_kv = gets.next().flatten();
        let term_kv = gets.next().flatten();
        let value = gets.next().flatten().as_ref().and_then(parse_value);
        let (seen, record) = seen_in(lease_kv.as_ref(), term_kv.as_ref(), None);
        Ok((seen, record, value))
    }

    /// A spare or freshly granted etcd lease for `ttl_secs`: its id, the TTL etcd
    /// granted, and the clocks just before the request that last started it was sent
    /// (it ends no earlier than that plus the granted TTL).
    async fn lease_for(&self, ttl_secs: i64) -> Result<(i64, i64, Sent)> {
        let started = self.sent();
        let now = started.mono;
        {
            let mut spare = self.spare.lock();
            spare.retain(|s| s.usable_until > now);
            if let Some(at) = spare.iter().position(|s| s.ttl_secs == ttl_secs) {
                let lease = spare.swap_remove(at);
                return Ok((lease.id, lease.lease_secs, lease.started));
            }
        }
        let (id, lease_secs) = self.conn.grant(ttl_secs).await?;
        Ok((id, lease_secs, started))
    }

    async fn put_back_spare(&self, lease: SpareLease) {
        let surplus = {
            let mut spare = self.spare.lock();
            if spare.len() < MAX_SPARE_LEASES {
                spare.push(lease);
                None
            } else {
                Some(lease.id)
            }
        };
        if let Some(id) = surplus {
            self.conn.revoke_quietly(id).await;
        }
    }
}

#[async_trait]
impl LeaseStore for EtcdLeaseStore {
    /// A new term writes `value` to `values/R` in the transaction that starts it; a
    /// renewal (and a change of TTL) leaves `values/R` alone, so the term keeps the
    /// value it began with whatever a renewal offers. With `queue`, the acquire
    /// transaction's failure branch queues the caller (see `queue.rs`): one
    /// transaction, beside a keep-alive of the candidacy's etcd lease.
    async fn contend(&self, request: AcquireRequest<'_>) -> Result<LeaseResult> {
        self.acquire_or_renew(request).await
    }

    async fn withdraw(&self, role: &str, owner: &str) -> Result<bool> {
        self.withdraw_candidacy(role, owner).await
    }

    /// One range over the role's queue, in create-revision order: a candidate key lives
    /// exactly as long as its etcd lease.
    async fn candidates(&self, role: &str) -> Result<Vec<String>> {
        validate_name("role", role)?;
        let dir = self.keys.queue_dir(role);
        let options = GetOptions::new()
            .with_range(self.keys.queue_end(role))
            .with_keys_only()
            .with_sort(SortTarget::Create, SortOrder::Ascend);
        let response = self
            .conn
            .get("reading the queue", &dir, Some(options))
            .await?;
        response
            .kvs()
            .iter()
            .map(|kv| {
                kv.key()
                    .strip_prefix(dir.as_bytes())
                    .and_then(|owner| std::str::from_utf8(owner).ok())
                    .map(str::to_owned)
                    .ok_or_else(|| Error::store_msg(BACKEND, "a candidate key names no owner"))
            })
            .collect()
    }

    /// With candidates queued, and for a handover to a candidate, two transactions, not
    /// one (etcd cannot delete and create one key in one): see `queue.rs`. Should the
    /// named candidate leave between them, the oldest one left (or nobody) gets the
    /// role, and the answer is still `true`: the term has ended.
    async fn end_term(&self, end: EndRequest<'_>) -> Result<bool> {
        self.close_term(end).await
    }

    async fn get(&self, role: &str) -> Result<Option<LeaseInfo>> {
        validate_name("role", role)?;
        let (seen, record, value) = self.read_role_and_value(role).await?;
        let seen = match seen {
            Seen::Held(holder) => Seen::Held(self.with_session_expiry(holder).await?),
            absent => absent,
        };
        Ok(lease_info(
            role,
            &seen,
            record.as_ref(),
            value.as_ref(),
            self.wall(),
        ))
    }

    async fn list_prefix(&self, prefix: &str) -> Result<Vec<LeaseInfo>> {
        let listed = self.list_complete(prefix).await?;
        Ok(listed.leases.into_iter().map(|lease| lease.info).collect())
    }

    /// See `changes.rs`: the term records changed since the mark, a count of the held
    /// leases, and every session.
    async fn list_prefix_changes(&self, read: ChangesRead<'_>) -> Result<PrefixChanges> {
        self.list_changes(read).await
    }

    /// Watches the role's lease key from the revision after a fresh read, and returns
    /// on its delete (release or expiry) or on a new term. Sleeps to the deadline when
    /// the watch cannot be set up or breaks.
    async fn wait_for_change(
        &self,
        role: &str,
        observed: FencingToken,
        deadline: tokio::time::Instant,
    ) {
        until_watched(role, deadline, self.watch_term(role, observed)).await;
    }

    /// Answered from the events of a watch of the role's lease and handover keys, one
    /// per role shared by this store's waiters (see `successor.rs`).
    async fn wait_for_successor(
        &self,
        role: &str,
        observed: FencingToken,
        deadline: tokio::time::Instant,
    ) -> TermChange {
        self.successor(role, observed, deadline).await
    }

    /// Watches the role's lease key from the revision after a fresh read, and returns
    /// when it is put with a create revision above `after` (a term that began since),
    /// including the first term of a role whose key never existed; at once when the read
    /// shows such a term already. Sleeps to the deadline when the watch cannot be set up
    /// or breaks.
    async fn wait_for_term(&self, role: &str, after: FencingToken, deadline: tokio::time::Instant) {
        until_watched(role, deadline, self.watch_for_term(role, after)).await;
    }

    fn min_ttl(&self) -> Duration {
        Duration::from_secs(1)
    }

    /// One transaction's worth (see `session.rs`): a shard member taking thousands of
    /// shards sends 64/120 of the round trips it would in batches of the default 64.
    fn acquire_batch_size(&self) -> usize {
        session::ROLES_PER_TXN
    }

    async fn open_session(&self, owner: &str, ttl: Duration) -> Result<SessionGrant> {
        self.open(owner, ttl).await
    }

    async fn keep_alive_session(
        &self,
        session: SessionId,
        ttl: Duration,
    ) -> Result<Option<SessionGrant>> {
        self.keep_alive(session, ttl).await
    }

    async fn acquire_in_session(&self, role: &str, session: SessionId) -> Result<LeaseResult> {
        self.acquire_under(role, session).await
    }

    async fn acquire_many_in_session(
        &self,
        roles: &[String],
        session: SessionId,
    ) -> Result<Vec<LeaseResult>> {
        self.acquire_many_under(roles, session).await
    }

    async fn close_session(&self, session: SessionId) -> Result<bool> {
        self.close(session).await
    }
}
