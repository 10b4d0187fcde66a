//! [`KubeLeaseStore`]: tenure leases on `coordination.k8s.io/v1` Lease objects.
//!
//! Every role is one Lease object (see [`crate::names`] for its name and
//! [`crate::record`] for its fields and token). Every write is a `PUT` carrying the
//! `resourceVersion` just read, so of two writers that read the same version exactly one
//! succeeds and the other gets 409 Conflict and reads again: nothing is ever
//! overwritten blind. Expiry is judged by observation ([`crate::observe`]).
//!
//! One call, as the contract's single atomic step:
//!
//! 1. read the role's object (and the session object it is held under, if any); a
//!    contender woken by the watch first tries a takeover written on the event's copy,
//!    and a store renewing or releasing its own term writes on the version it wrote;
//! 2. held by the caller and live: write a renewal (new `renewTime`), token unchanged;
//! 3. absent: create the object empty (a lost create race reads again), then start the
//!    first term on it with an epoch taken after that read ([`epochs`]);
//! 4. released, expired, or held under a session that ended or lapsed: end that lapsed
//!    session first (a conditional write on the session object, so its late keep-alive
//!    fails), then write the caller in as holder with `leaseTransitions + 1`;
//! 5. otherwise: not acquired, reporting the live holder.
//!
//! A contender that waits its turn is also queued, one Lease object per candidacy
//! ([`queue`]); a release hands the role to the oldest live candidate in its one
//! conditional write ([`handover`]), and waiters learn who leads next from the watch
//! alone ([`wait`]). Acquiring and renewing, and what they answer from the watch's copy
//! of a role without a read, are in [`acquire`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, PostParams};
use parking_lot::Mutex;
use tenure::lease::{validate_name, AcquireRequest, EndRequest};
use tenure::{
    Error, FencingToken, LeaseInfo, LeaseResult, LeaseStore, Result, SessionGrant, SessionId,
    TermChange,
};
use tokio::time::Instant;

use crate::conn::{api_error, is_conflict, KubeConnection};
use crate::names::{object_name, session_name, Kind, CANDIDATE};
use crate::record::{
    annotate, begin_term, label, new_object, selector, token, Record, EPOCH, NAME, SESSION, VALUE,
};
use crate::watch::{Shared, Watch};
use crate::BACKEND;

mod acquire;
mod epochs;
mod handover;
mod queue;
mod session;
mod wait;

use epochs::{AllocationHook, Epochs};
use queue::Used;
use session::SessionState;

/// How many conditional writes one call may lose before it reports an error.
const ATTEMPTS: usize = 8;

/// A record together with when this process first saw its version.
#[derive(Clone, Debug)]
pub(crate) struct Seen {
    pub record: Record,
    pub first: Instant,
}

/// What a session object says about the roles held under it.
#[derive(Clone, Debug)]
pub(crate) enum SessionView {
    /// Ended, closed, or gone: its roles are free.
    Ended,
    /// Not marked ended; live until `first + duration` as this process judges it.
    Open(Box<Seen>),
}

/// A role's record with its liveness judged.
#[derive(Clone, Debug)]
struct Judged {
    seen: Seen,
    /// `None` on an object just created, before its first term.
    token: Option<FencingToken>,
    session: Option<u64>,
    live: bool,
    expires_at: SystemTime,
    /// The session the term is held under, when it lapsed but is not yet marked ended:
    /// a takeover ends it first.
    lapsed_session: Option<Record>,
}

impl Judged {
    /// The token of a live term. A live term always has one ([`KubeLeaseStore::judge`]
    /// refuses a record that names a holder without an epoch); should that ever not
    /// hold, the call fails rather than answer with a made-up token.
    fn live_token(&self) -> Result<FencingToken> {
        self.token.ok_or_else(|| {
            crate::record::corrupt(format!(
                "{} has a live term without a token",
                self.seen.record.object
            ))
        })
    }
}

/// Tenure's lease store on the Kubernetes API: one Lease object per role in one
/// namespace, sessions for shard groups, push wake-ups from a watch.
///
/// TTLs are whole seconds, at least one (`leaseDurationSeconds`).
pub struct KubeLeaseStore {
    conn: KubeConnection,
    api: Api<Lease>,
    shared: Arc<Shared>,
    watch: Watch,
    sessions: Mutex<HashMap<u64, SessionState>>,
    /// Fresh epochs and session ids, one counter write per batch of callers.
    epochs: Arc<Epochs>,
    /// The plain terms this store wrote last, per role: a renewal or release by their
    /// owner is one conditional write on the version written, with no read first (a
    /// 409 means someone else wrote since, and the call reads as usual).
    own: Mutex<HashMap<String, OwnTerm>>,
    /// A test's fail point, awaited after each epoch is taken and before the write that
    /// uses it (see [`KubeLeaseStore::pause_after_epoch`]).
    after_epoch: Option<EpochHook>,
}

/// What [`KubeLeaseStore::pause_after_epoch`] awaits.
type EpochHook =
    Arc<dyn Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> + Send + Sync>;

/// A plain term as this store last wrote it.
#[derive(Clone, Debug)]
struct OwnTerm {
    owner: String,
    token: FencingToken,
    record: Record,
    sent: Instant,
}

impl std::fmt::Debug for KubeLeaseStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeLeaseStore")
            .field("namespace", &self.conn.namespace)
            .finish_non_exhaustive()
    }
}

impl KubeLeaseStore {
    /// A store on the connection's namespace.
    pub fn new(conn: KubeConnection) -> KubeLeaseStore {
        let api = conn.leases();
        let shared = Shared::new();
        let epochs = Epochs::new(api.clone(), conn.namespace.clone(), shared.clone(), None);
        KubeLeaseStore {
            conn,
            api,
            shared,
            watch: Watch::new(selector(&[Kind::Role.label(), "session", CANDIDATE])),
            sessions: Mutex::new(HashMap::new()),
            epochs,
            own: Mutex::new(HashMap::new()),
            after_epoch: None,
        }
    }

    /// For tests: awaits `hook` after each epoch this store takes from the counter and
    /// before the write that uses it, so a test can put an operator's delete, or another
    /// contender, into that window.
    #[doc(hidden)]
    pub fn pause_after_epoch(mut self, hook: EpochHook) -> Self {
        self.after_epoch = Some(hook);
        self
    }

    /// For tests: awaits `hook` in each epoch allocation of this store, given how many
    /// callers it serves, after it took them and before it writes the counter, so a test
    /// can queue another caller while an allocation is in flight.
    #[doc(hidden)]
    pub fn pause_in_allocation(mut self, hook: AllocationHook) -> Self {
        self.epochs = Epochs::new(
            self.api.clone(),
            self.conn.namespace.clone(),
            self.shared.clone(),
            Some(hook),
        );
        self
    }

    /// For tests: a fresh epoch from this store's allocator, as a role's first term or
    /// a session id takes one.
    #[doc(hidden)]
    pub async fn take_epoch(&self) -> Result<u64> {
        self.allocate_epoch().await
    }

    /// The namespace the store's objects live in.
    pub fn namespace(&self) -> &str {
        &self.conn.namespace
    }

    fn error(&self, verb: &str, object: &str, error: kube::Error) -> Error {
        api_error(&self.conn.namespace, verb, object, error)
    }

    fn instant(&self) -> Instant {
        self.shared.observer.instant()
    }

    fn wall(&self, at: Instant) -> SystemTime {
        self.shared.observer.wall(at)
    }

    /// Reads an object, recording the sighting of its version.
    async fn read(&self, object: &str) -> Result<Option<(Record, Instant)>> {
        let read = self
            .shared
            .get(&self.api, &self.conn.namespace, object)
            .await?;
        Ok(read.map(|(record, first, _)| (record, first)))
    }

    async fn read_role(&self, role: &str) -> Result<Option<Seen>> {
        let object = object_name(Kind::Role, role);
        let Some((record, first)) = self.read(&object).await? else {
            return Ok(None);
        };
        let record = Record::read(record.lease, role)?;
        Ok(Some(Seen { record, first }))
    }

    /// The role's object as the namespace watch last delivered it (see
    /// [`Shared::watched`]), if the watch runs and that is the newest version known here.
    fn watched_role(&self, role: &str) -> Result<Option<Seen>> {
        if !self.watch.running() {
            return Ok(None);
        }
        let object = object_name(Kind::Role, role);
        let Some((record, first)) = self.shared.watched(&object) else {
            return Ok(None);
        };
        let record = Record::read(record.lease, role)?;
        Ok(Some(Seen { record, first }))
    }

    /// A takeover written on the watch's copy of the role, with no read first: the
    /// successor woken by a release (or waiting out an expiry) saves a round trip. Only
    /// ever a write conditional on that copy's version; a copy showing a live term is not
    /// trusted (it may be older than a release), so `None` sends the caller to read.
    async fn take_watched(
        &self,
        role: &str,
        owner: &str,
        secs: i32,
        session: Option<u64>,
        value: Option<&str>,
    ) -> Result<Option<(FencingToken, Instant, Record)>> {
        let Some(seen) = self.watched_role(role)? else {
            return Ok(None);
        };
        let judged = self.judge(seen).await?;
        if judged.live {
            return Ok(None);
        }
        self.take(&judged, role, owner, secs, session, value).await
    }

    pub(crate) async fn session_view(&self, id: u64) -> Result<SessionView> {
        let Some((record, first)) = self.read(&session_name(id)).await? else {
            return Ok(SessionView::Ended);
        };
        Ok(session_view_of(Seen { record, first }))
    }

    async fn judge(&self, seen: Seen) -> Result<Judged> {
        let view = match (&seen.record.holder, seen.record.session()?) {
            (Some(_), Some(id)) => Some(self.session_view(id).await?),
            _ => None,
        };
        self.judge_with(seen, view)
    }

    /// Judges a role's record; `view` is its session's, when it is held under one.
    fn judge_with(&self, seen: Seen, view: Option<SessionView>) -> Result<Judged> {
        let token = seen.record.token()?;
        let session = seen.record.session()?;
        if token.is_none() && seen.record.holder.is_some() {
            return Err(crate::record::corrupt(format!(
                "{} names a holder but has no {EPOCH} annotation",
                seen.record.object
            )));
        }
        let (until, open_session) = match (&seen.record.holder, session) {
            (None, _) => (None, None),
            (Some(_), None) => (Some(seen.first + seen.record.duration), None),
            (Some(_), Some(_)) => match view {
                Some(SessionView::Open(session)) => (
                    Some(session.first + session.record.duration),
                    Some(*session),
                ),
                Some(SessionView::Ended) | None => (None, None),
            },
        };
        let now = self.instant();
        let live = until.is_some_and(|until| now < until);
        let end = match until {
            Some(until) if live => until,
            _ => until.unwrap_or(seen.first).min(now),
        };
        let expires_at = self.wall(end);
        Ok(Judged {
            token,
            session,
            live,
            expires_at,
            lapsed_session: if live {
                None
            } else {
                open_session.map(|s| s.record)
            },
            seen,
        })
    }

    /// The answer to a caller refused by a live term.
    fn refusal(&self, judged: &Judged) -> Result<LeaseResult> {
        Ok(LeaseResult {
            acquired: false,
            fencing_token: judged.live_token()?,
            expires_at: judged.expires_at,
            holder: judged.seen.record.holder.clone().unwrap_or_default(),
            now: self.shared.observer.now(),
        })
    }

    /// Hands out an epoch no object of this namespace had before, reserved by a counter
    /// write sent after this call began (see [`epochs`]): a caller that read a role's
    /// empty object first gets an epoch above every one an earlier incarnation used.
    pub(crate) async fn allocate_epoch(&self) -> Result<u64> {
        let epoch = self.epochs.take().await?;
        if let Some(hook) = &self.after_epoch {
            hook().await;
        }
        Ok(epoch)
    }

    /// Creates the role's object empty: no holder and no epoch. The first term is then
    /// started on it like any other, by a write conditional on reading it (the created
    /// object is that read), with an epoch taken after it (see [`crate::record`]).
    /// `None` when another writer created it first (read it).
    async fn create_empty(&self, role: &str) -> Result<Option<Seen>> {
        let object = object_name(Kind::Role, role);
        let lease = new_object(&object, Kind::Role.label(), Some(role));
        match self.api.create(&PostParams::default(), &lease).await {
            Ok(created) => {
                let arrived = self.instant();
                let record = Record::read_any(created)?;
                let first = self.shared.observer.saw(&object, &record.version, arrived);
                Ok(Some(Seen { record, first }))
            }
            Err(error) if is_conflict(&error) => Ok(None),
            Err(error) => Err(self.error("create", &object, error)),
        }
    }

    /// The role's record, creating the object empty when there is none; `None` when a
    /// create race was lost (read again).
    async fn read_or_create(&self, role: &str) -> Result<Option<Seen>> {
        match self.read_role(role).await? {
            Some(seen) => Ok(Some(seen)),
            None => self.create_empty(role).await,
        }
    }

    /// Starts a new term for `owner` over a record that is not live, advertising
    /// `value`; `None` when a conditional write lost (read again). The write also spends
    /// the owner's place in the role's queue, if it has one ([`queue`]).
    async fn take(
        &self,
        judged: &Judged,
        role: &str,
        owner: &str,
        secs: i32,
        session: Option<u64>,
        value: Option<&str>,
    ) -> Result<Option<(FencingToken, Instant, Record)>> {
        if let Some(lapsed) = &judged.lapsed_session {
            if !self.end_session(lapsed).await? {
                return Ok(None);
            }
        }
        let record = &judged.seen.record;
        let (epoch, transitions) = self.next_term(record).await?;
        let mut lease = record.to_write();
        annotate(&mut lease, EPOCH, Some(epoch.to_string()));
        annotate(&mut lease, VALUE, value.map(str::to_owned));
        set_session(&mut lease, session);
        begin_term(&mut lease, owner, secs, Some(transitions));
        if let Some(place) = self.known_candidacy(role, owner) {
            let mut used = Used::of(record);
            used.spend(&place);
            self.clear_dropped(role, &mut used).await?;
            used.write(&mut lease);
        }
        let token = token(epoch, transitions)?;
        let written = self.replace_read(&record.object, &lease).await?;
        Ok(written.map(|(sent, record)| (token, sent, record)))
    }

    /// The epoch and `leaseTransitions` of the next term on `record`: one more change of
    /// holder, or a fresh epoch for the object's first term or past `i32::MAX` changes.
    async fn next_term(&self, record: &Record) -> Result<(u64, i32)> {
        match (record.epoch()?, record.transitions.checked_add(1)) {
            (Some(epoch), Some(next)) => Ok((epoch, next)),
            (None, _) | (Some(_), None) => Ok((self.allocate_epoch().await?, 0)),
        }
    }

    /// A conditional `PUT`; the send time on success, `None` on 409 Conflict (or when
    /// the object is gone).
    async fn replace(&self, object: &str, lease: &Lease) -> Result<Option<Instant>> {
        Ok(self
            .replace_read(object, lease)
            .await?
            .map(|(sent, _)| sent))
    }

    /// [`replace`](Self::replace), also returning the object as written.
    async fn replace_read(&self, object: &str, lease: &Lease) -> Result<Option<(Instant, Record)>> {
        match self.put(object, lease).await? {
            Some((sent, written)) => Ok(Some((sent, Record::read_any(written)?))),
            None => Ok(None),
        }
    }

    /// A conditional `PUT` of any object of this store: the send time and the object as
    /// written, `None` when it lost (409) or the object is gone (404).
    pub(super) async fn put(
        &self,
        object: &str,
        lease: &Lease,
    ) -> Result<Option<(Instant, Lease)>> {
        let sending = self.shared.sending(object);
        let sent = self.instant();
        match self
            .api
            .replace(object, &PostParams::default(), lease)
            .await
        {
            Ok(written) => {
                self.wrote(object, &written, sent);
                // Readers of the watch's copies in this process (`candidates`, the
                // queue) see this write at once, not when the watch delivers it.
                self.shared.fresher(&written, sent, &sending);
                Ok(Some((sent, written)))
            }
            Err(error) if is_conflict(&error) => Ok(None),
            Err(error) if matches!(&error, kube::Error::Api(s) if s.code == 404) => Ok(None),
            Err(error) => Err(self.error("update", object, error)),
        }
    }

    fn wrote(&self, object: &str, written: &Lease, sent: Instant) {
        if let Some(version) = written.metadata.resource_version.as_deref() {
            self.shared.observer.wrote(object, version, sent);
        }
    }

    /// The plain term this store last wrote for `role`, if `owner` holds it and it is
    /// live on this process's clock.
    fn own_live(&self, role: &str, owner: &str) -> Option<OwnTerm> {
        let own = self.own.lock().get(role).cloned()?;
        (own.owner == owner && self.instant() < own.sent + own.record.duration).then_some(own)
    }

    /// Records a plain term this store wrote, and answers that `owner` holds it.
    fn hold(
        &self,
        role: &str,
        owner: &str,
        token: FencingToken,
        sent: Instant,
        record: Record,
        ttl: Duration,
    ) -> LeaseResult {
        self.own.lock().insert(
            role.to_owned(),
            OwnTerm {
                owner: owner.to_owned(),
                token,
                record,
                sent,
            },
        );
        self.granted(owner, token, sent, ttl)
    }

    fn granted(
        &self,
        owner: &str,
        token: FencingToken,
        sent: Instant,
        ttl: Duration,
    ) -> LeaseResult {
        LeaseResult {
            acquired: true,
            fencing_token: token,
            expires_at: self.wall(sent) + ttl,
            holder: owner.to_owned(),
            now: self.wall(sent),
        }
    }

    fn lost_races(&self, role: &str) -> Error {
        Error::store_msg(
            BACKEND,
            format!("role {role:?}: lost {ATTEMPTS} conditional writes in a row; try again"),
        )
    }
}

/// A session object as seen: ended, or open since `first`.
pub(crate) fn session_view_of(seen: Seen) -> SessionView {
    if seen.record.ended() || seen.record.holder.is_none() {
        SessionView::Ended
    } else {
        SessionView::Open(Box::new(seen))
    }
}

/// Marks (or unmarks) the role's object as held under `session`: annotation and label.
fn set_session(lease: &mut Lease, session: Option<u64>) {
    let value = session.map(|id| format!("{id:x}"));
    annotate(lease, SESSION, value.clone());
    label(lease, SESSION, value);
}

#[async_trait]
impl LeaseStore for KubeLeaseStore {
    async fn contend(&self, request: AcquireRequest<'_>) -> Result<LeaseResult> {
        self.acquire(request).await
    }

    async fn withdraw(&self, role: &str, owner: &str) -> Result<bool> {
        self.withdraw_candidacy(role, owner).await
    }

    async fn candidates(&self, role: &str) -> Result<Vec<String>> {
        validate_name("role", role)?;
        self.queued(role).await
    }

    async fn end_term(&self, end: EndRequest<'_>) -> Result<bool> {
        self.close_term(end).await
    }

    async fn get(&self, role: &str) -> Result<Option<LeaseInfo>> {
        validate_name("role", role)?;
        let Some(seen) = self.read_role(role).await? else {
            return Ok(None);
        };
        let judged = self.judge(seen).await?;
        Ok(self.info(role.to_owned(), &judged))
    }

    async fn list_prefix(&self, prefix: &str) -> Result<Vec<LeaseInfo>> {
        let (records, _) = self
            .shared
            .list(
                &self.api,
                &self.conn.namespace,
                &selector(&[Kind::Role.label(), "session"]),
            )
            .await?;
        let mut sessions = HashMap::new();
        let mut roles = Vec::new();
        for (record, first) in records {
            let kind = record.kind().map(str::to_owned);
            let seen = Seen { record, first };
            if kind.as_deref() == Some("session") {
                sessions.insert(seen.record.object.clone(), seen);
            } else if let Some(role) = seen.record.annotations.get(NAME).cloned() {
                if role.starts_with(prefix) {
                    roles.push((role, seen));
                }
            }
        }
        let mut infos = Vec::with_capacity(roles.len());
        for (role, seen) in roles {
            let view = seen.record.session()?.map(|id| {
                sessions
                    .get(&session_name(id))
                    .cloned()
                    .map_or(SessionView::Ended, session_view_of)
            });
            let judged = self.judge_with(seen, view)?;
            infos.extend(self.info(role, &judged));
        }
        infos.sort_by(|a, b| a.role.cmp(&b.role));
        Ok(infos)
    }

    async fn wait_for_change(
        &self,
        role: &str,
        observed: FencingToken,
        deadline: tokio::time::Instant,
    ) {
        self.change(role, observed, deadline).await;
    }

    async fn wait_for_successor(
        &self,
        role: &str,
        observed: FencingToken,
        deadline: tokio::time::Instant,
    ) -> TermChange {
        self.successor(role, observed, deadline).await
    }

    async fn wait_for_term(&self, role: &str, after: FencingToken, deadline: tokio::time::Instant) {
        self.term(role, after, deadline).await;
    }

    fn min_ttl(&self) -> Duration {
        Duration::from_secs(1)
    }

    async fn open_session(&self, owner: &str, ttl: Duration) -> Result<SessionGrant> {
        self.open(owner, ttl).await
    }

    async fn keep_alive_session(
        &self,
        session: SessionId,
        ttl: Duration,
    ) -> Result<Option<SessionGrant>> {
        self.keep_alive(session.get(), ttl).await
    }

    async fn acquire_in_session(&self, role: &str, session: SessionId) -> Result<LeaseResult> {
        self.acquire_under(role, session.get()).await
    }

    async fn close_session(&self, session: SessionId) -> Result<bool> {
        self.close(session.get()).await
    }
}

impl KubeLeaseStore {
    /// The read-only view of a role; `None` before its first term.
    fn info(&self, role: String, judged: &Judged) -> Option<LeaseInfo> {
        Some(LeaseInfo {
            role,
            holder: judged.seen.record.holder.clone(),
            fencing_token: judged.token?,
            expires_at: judged.expires_at,
            now: self.shared.observer.now(),
            value: judged.seen.record.annotations.get(VALUE).cloned(),
        })
    }
}
