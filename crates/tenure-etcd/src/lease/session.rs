//! Sessions on etcd: a session is one etcd lease `L` with the key `<prefix>/sessions/L`
//! attached (its [`SessionRecord`]: owner, TTL, the expiry last reported). A role taken
//! under the session has its lease key attached to `L` too, and its term record names
//! `L`, so readers take the role's expiry from the session record.
//!
//! - open: grant `L`, put the session key on it (two round trips, once per session);
//! - keep-alive: one etcd keep-alive of `L` plus one transaction that puts the session
//!   key and reads the change key (the latest change it tells, see `schema.rs`), O(1)
//!   however many roles; with a registry sharing the store's links it also reads every
//!   node's and session's key, so the answer tells when the other nodes lapse
//!   (O(members)); against a server whose keep-alive answers are unsafe (see
//!   [`crate::version`]) the put is sent after the keep-alive answered and is guarded by
//!   the session key still existing (the one created at open: same create revision),
//!   which confirms the lease was not being revoked as the keep-alive was answered;
//! - acquire under it: one transaction (role key absent and session key still the one
//!   created at open => put the role key on `L` and its term record; either way read
//!   the session key);
//! - close: delete the session key (the session has ended from here on), release every
//!   role still on `L` as `release` does (a few round trips, once per session), then
//!   revoke `L` (etcd deletes whatever is still attached).

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use etcd_client::{
    Compare, CompareOp, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse,
};
use tenure::lease::{validate_name, validate_roles, validate_ttl};
use tenure::session::validate_open;
use tenure::{ChangeMark, Error, LeaseResult, LeaseStore, Result, SessionGrant, SessionId};

use super::{
    acquire_txn_with, changed_put, first_kvs, held_result, lease_duration, own_term_compares,
    ranges, seen_in, EtcdLeaseStore, Extra, Holder, Seen, MAX_ATTEMPTS,
};
use crate::schema::{
    decode, encode, from_ns, name_under, round_trip, to_ns, ttl_secs, Keys, NodeRecord,
    SessionRecord, SessionTermRecord, TermRecord,
};

/// Roles acquired (or, when a session closes, released) per transaction. etcd allows 128
/// operations per transaction by default, and a transaction nested in another may hold
/// only what its parent leaves: 128 less the parent's own count. A batch is this many
/// nested acquires and the put of the change key, which leaves each acquire 7 (it has
/// at most 5: three compares; five operations when it succeeds, four when not).
pub(super) const ROLES_PER_TXN: usize = 120;

/// Sessions remembered beyond this many are pruned of those ended or past their expiry.
const MAX_KNOWN_SESSIONS: usize = 1024;

/// What this instance knows of a session (from opening it or reading its key).
#[derive(Clone, Debug)]
pub(super) struct KnownSession {
    owner: String,
    ttl_secs: i64,
    lease_secs: i64,
    /// The expiry last reported for it; a lower bound of its real end.
    expires_at: SystemTime,
    /// The same end on the monotonic clock, once this instance opened or kept it alive:
    /// every remaining time reported for it is measured on it (a session only looked up
    /// has none until kept alive).
    ends: Option<tokio::time::Instant>,
    /// The create revision of its key: pins this very session, so should etcd ever hand
    /// out its lease id again, the new session is not taken for this one.
    created: i64,
    /// When the open or keep-alive that last wrote its record was sent (the record's
    /// `kept_at_ns`, which registries count as a heartbeat of its owner's node).
    kept_at: SystemTime,
}

impl KnownSession {
    fn from_record(record: SessionRecord, created: i64) -> Self {
        KnownSession {
            created,
            owner: record.owner,
            ttl_secs: record.ttl_secs,
            lease_secs: record.lease_secs,
            expires_at: from_ns(record.expires_at_ns),
            ends: None,
            kept_at: from_ns(record.kept_at_ns),
        }
    }

    fn record(&self) -> SessionRecord {
        SessionRecord {
            owner: self.owner.clone(),
            expires_at_ns: to_ns(self.expires_at),
            ttl_secs: self.ttl_secs,
            lease_secs: self.lease_secs,
            kept_at_ns: to_ns(self.kept_at),
        }
    }

    /// `(expires_at, now)` for an answer: `now` derived from the monotonic end when
    /// this instance knows one (so `expires_at - now` is the monotonic time left, however
    /// the wall clock stepped since), else `wall_now`.
    fn answer(&self, wall_now: SystemTime) -> (SystemTime, SystemTime) {
        let now = match self.ends {
            Some(ends) => {
                let left = ends.saturating_duration_since(tokio::time::Instant::now());
                self.expires_at.checked_sub(left).unwrap_or(self.expires_at)
            }
            None => wall_now,
        };
        (self.expires_at, now)
    }

    fn grant(&self, lease: i64, wall_now: SystemTime, latest_change: ChangeMark) -> SessionGrant {
        let (expires_at, now) = self.answer(wall_now);
        SessionGrant {
            id: session_id(lease),
            owner: self.owner.clone(),
            expires_at,
            now,
            peers_lapse: None,
            terms_handed: None,
            latest_change: Some(latest_change),
        }
    }
}

/// The latest change (see the `changed` key in `schema.rs`) as read by a transaction
/// that wrote a session's record: the key's mod revision, comparable with the marks of
/// reads of changes (their revisions); zero while no term ever changed.
fn latest_change(response: &TxnResponse) -> ChangeMark {
    let revision = first_kvs(response)
        .into_iter()
        .next()
        .flatten()
        .map_or(0, |kv| kv.mod_revision());
    ChangeMark::new(u64::try_from(revision).unwrap_or(0))
}

/// The etcd lease of a session id; `None` for ids etcd never hands out.
pub(crate) fn lease_of(id: SessionId) -> Option<i64> {
    i64::try_from(id.get()).ok().filter(|&lease| lease > 0)
}

pub(super) fn session_id(lease: i64) -> SessionId {
    // etcd lease ids are positive.
    SessionId::from(u64::try_from(lease).unwrap_or(0))
}

/// The `(lease, expiry)` of a session key, for readers of many roles.
pub(super) fn expiry_of(kv: &KeyValue) -> Option<(i64, SystemTime)> {
    decode::<SessionRecord>(kv.value()).map(|r| (kv.lease(), from_ns(r.expires_at_ns)))
}

/// Holds exactly while the session lives: its key (always written on its own lease) is
/// the one created at revision `session.created`.
fn session_compare(keys: &Keys, lease: i64, session: &KnownSession) -> Compare {
    Compare::create_revision(keys.session(lease), CompareOp::Equal, session.created)
}

/// The put of a session's key on its own lease.
fn session_put(keys: &Keys, lease: i64, record: &SessionRecord) -> Result<TxnOp> {
    Ok(TxnOp::put(
        keys.session(lease),
        encode(record)?,
        Some(PutOptions::new().with_lease(lease)),
    ))
}

/// The transaction acquiring `role` under `session` (etcd lease `lease`) for its owner:
/// when the role's key is absent and the session lives, put the key on the session's
/// lease and the term `record` (naming the session); otherwise read the role's key and
/// record. Both read the session key. `batched`: nested in a batch that puts the change
/// key itself.
fn acquire_under_txn(
    keys: &Keys,
    role: &str,
    (lease, session): (i64, &KnownSession),
    record: &TermRecord,
    batched: bool,
) -> Result<Txn> {
    let owner = &session.owner;
    let stored = SessionTermRecord {
        term: record,
        session: lease,
    };
    let guard = (
        session_compare(keys, lease, session),
        TxnOp::get(keys.session(lease), None),
    );
    Ok(acquire_txn_with(
        keys,
        role,
        owner,
        lease,
        encode(&stored)?,
        // A term under a session advertises nothing.
        None,
        Extra::Session {
            guard: guard.0,
            read: guard.1,
            batched,
        },
    ))
}

impl EtcdLeaseStore {
    fn remember(&self, lease: i64, session: KnownSession) {
        let mut sessions = self.sessions.lock();
        if sessions.len() >= MAX_KNOWN_SESSIONS {
            let now = self.wall();
            sessions.retain(|_, s| s.as_ref().is_some_and(|s| s.expires_at > now));
        }
        sessions.insert(lease, Some(session));
    }

    /// Notes that session `lease` has ended: this instance answers so from here on
    /// without asking etcd, and never takes a later session under the same id for it.
    fn forget(&self, lease: i64) {
        self.sessions.lock().insert(lease, None);
        self.links.ended(session_id(lease).get());
    }

    /// The session `lease` as this instance knows it, or as its key says; `None` when
    /// the key is gone (the session ended).
    async fn known(&self, lease: i64) -> Result<Option<KnownSession>> {
        if let Some(known) = self.sessions.lock().get(&lease).cloned() {
            return Ok(known);
        }
        let response = self
            .conn
            .get("reading a session", &self.keys.session(lease), None)
            .await?;
        let Some(kv) = response.kvs().first().filter(|kv| kv.lease() == lease) else {
            return Ok(None);
        };
        let Some(record) = decode::<SessionRecord>(kv.value()) else {
            return Err(Error::store_msg(
                crate::conn::BACKEND,
                format!("corrupt session record at {}", self.keys.session(lease)),
            ));
        };
        let session = KnownSession::from_record(record, kv.create_revision());
        self.remember(lease, session.clone());
        Ok(Some(session))
    }

    /// `holder` with the expiry of the session it is held under, when it is: read from
    /// the session key (unknown, so `now + EXPIRY_GRACE`, once the key is gone).
    pub(super) async fn with_session_expiry(&self, mut holder: Holder) -> Result<Holder> {
        let Some(lease) = holder.session else {
            return Ok(holder);
        };
        let response = self
            .conn
            .get("reading a session", &self.keys.session(lease), None)
            .await?;
        holder.expires_at = response
            .kvs()
            .first()
            .and_then(expiry_of)
            .filter(|&(on, _)| on == lease)
            .map(|(_, at)| at);
        Ok(holder)
    }

    /// The answer refusing the caller because `holder` holds the role.
    pub(super) async fn refusal(&self, holder: Holder) -> Result<LeaseResult> {
        Ok(self.with_session_expiry(holder).await?.refusal(self.wall()))
    }

    pub(super) async fn open(&self, owner: &str, ttl: Duration) -> Result<SessionGrant> {
        validate_open(owner, ttl, self.min_ttl(), self.wall())?;
        let secs = ttl_secs(ttl)?;
        let started = self.sent();
        let (lease, lease_secs) = self.conn.grant(secs).await?;
        // The lease's TTL counts from the grant, sent after `started`.
        let length = lease_duration(ttl, secs, lease_secs);
        let session = KnownSession {
            owner: owner.to_owned(),
            ttl_secs: secs,
            lease_secs,
            expires_at: round_trip(started.wall + length),
            ends: Some(started.mono + length),
            created: 0,
            kept_at: round_trip(started.wall),
        };
        let key = self.keys.session(lease);
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([
                session_put(&self.keys, lease, &session.record())?,
                TxnOp::get(self.keys.changed(), None),
            ]);
        let opened = self.conn.txn("opening a session", txn).await;
        let mut session = session;
        let latest = match opened {
            Ok(response) if response.succeeded() => {
                session.created = response.header().map_or(0, |h| h.revision());
                latest_change(&response)
            }
            Ok(_) => {
                self.conn.revoke_quietly(lease).await;
                return Err(Error::store_msg(
                    crate::conn::BACKEND,
                    format!("etcd granted lease {lease:x}, which already names a session"),
                ));
            }
            Err(error) => {
                self.conn.revoke_quietly(lease).await;
                return Err(error);
            }
        };
        self.links
            .kept(owner, session_id(lease).get(), started.mono, false);
        self.remember(lease, session.clone());
        Ok(session.grant(lease, self.wall(), latest))
    }

    pub(super) async fn keep_alive(
        &self,
        id: SessionId,
        ttl: Duration,
    ) -> Result<Option<SessionGrant>> {
        validate_ttl(ttl, self.min_ttl(), self.wall())?;
        let secs = ttl_secs(ttl)?;
        let Some(lease) = lease_of(id) else {
            return Ok(None);
        };
        let Some(mut session) = self.known(lease).await? else {
            return Ok(None);
        };
        if secs > session.ttl_secs {
            return Err(Error::invalid(
                "ttl",
                format!(
                    "{ttl:?} is longer than session {id}'s {} s: an etcd lease keeps the TTL it was granted",
                    session.ttl_secs
                ),
            ));
        }
        let own_ttl = Duration::from_secs(u64::try_from(session.ttl_secs).unwrap_or(0));
        let sent = self.sent();
        // etcd restarts the lease's whole TTL, so it ends no earlier than this (which is
        // at least `now + ttl`) and never earlier than before: compared on the monotonic
        // clock, as the wall clock may have stepped back since the last keep-alive.
        let ends = sent.mono + lease_duration(own_ttl, session.ttl_secs, session.lease_secs);
        let ends = session.ends.map_or(ends, |before| before.max(ends));
        session.ends = Some(ends);
        session.expires_at = round_trip(sent.wall + ends.saturating_duration_since(sent.mono));
        session.kept_at = round_trip(sent.wall);
        // The owner's node record is read too: whether it names this session tells the
        // registry sharing this store's links whether the keep-alive stood in for a
        // heartbeat (see `registry.rs`). With a registry sharing the links, so are every
        // node's and session's keys, from which the answer tells when the other nodes
        // lapse, as that registry's reads would judge them: a settled shard member then
        // reads the members only when one is due to lapse.
        let peers_ttl = self.links.peers_ttl();
        let mut ops = vec![
            session_put(&self.keys, lease, &session.record())?,
            TxnOp::get(self.keys.changed(), None),
            TxnOp::get(self.keys.node(&session.owner), None),
        ];
        if peers_ttl.is_some() {
            ops.extend(crate::registry::nodes_and_sessions(&self.keys));
        }
        let txn = Txn::new()
            .when([session_compare(&self.keys, lease, &session)])
            .and_then(ops);
        // Only etcd's own answers end a session here: the lease not found, or the session
        // key gone or not the one created at open. A failed request (timeout, reset,
        // leader change) says nothing about the lease, which may well live on and keep
        // the session's roles held; forgetting it would make every later keep-alive answer
        // "ended" while nobody else can take those roles until etcd expires it. So an
        // error is returned as is and the caller retries within the session's window.
        let (written, alive) = if self.keep_alive_first {
            // The guarded put then confirms the lease was not being revoked while the
            // keep-alive was answered.
            if !self.conn.keep_alive_once(lease).await? {
                self.forget(lease);
                return Ok(None);
            }
            (
                self.conn.txn("keeping a session alive", txn).await,
                Ok(true),
            )
        } else {
            tokio::join!(
                self.conn.txn("keeping a session alive", txn),
                self.conn.keep_alive_once(lease),
            )
        };
        let written = written?;
        if !written.succeeded() || !alive? {
            // Ended (expired or closed): never revived.
            self.forget(lease);
            return Ok(None);
        }
        let named = first_kvs(&written)
            .get(1)
            .cloned()
            .flatten()
            .and_then(|kv| decode::<NodeRecord>(kv.value()))
            .is_some_and(|node| node.session == Some(lease));
        self.links.kept(&session.owner, id.get(), sent.mono, named);
        self.remember(lease, session.clone());
        let mut grant = session.grant(lease, self.wall(), latest_change(&written));
        if let (Some(ttl), [_, _, nodes, sessions]) = (peers_ttl, ranges(&written).as_slice()) {
            grant.peers_lapse = Some(crate::registry::peers_lapse(
                nodes,
                sessions,
                &self.keys,
                &session.owner,
                ttl,
                grant.now,
            ));
        }
        Ok(Some(grant))
    }

    /// The live session `id` (its lease and what this instance knows of it), and the
    /// record of a term under it; `SessionEnded` when it has ended.
    async fn session_term(&self, id: SessionId) -> Result<(i64, KnownSession, TermRecord)> {
        let ended = || Error::SessionEnded(id);
        let Some(lease) = lease_of(id) else {
            return Err(ended());
        };
        let Some(session) = self.known(lease).await? else {
            return Err(ended());
        };
        let record = TermRecord {
            owner: session.owner.clone(),
            token: None,
            expires_at_ns: to_ns(session.expires_at),
            ttl_secs: session.ttl_secs,
            lease_secs: session.lease_secs,
            released: false,
        };
        Ok((lease, session, record))
    }

    /// Acquires `roles` under session `id`, up to [`ROLES_PER_TXN`] in one transaction:
    /// each role's acquire transaction nested in it, so each is decided on its own and
    /// all in one round trip. A role a handover under way had reserved is then acquired
    /// alone (which finishes the handover first).
    pub(super) async fn acquire_many_under(
        &self,
        roles: &[String],
        id: SessionId,
    ) -> Result<Vec<LeaseResult>> {
        validate_roles(roles)?;
        if roles.is_empty() {
            return Ok(Vec::new());
        }
        let (lease, session, record) = self.session_term(id).await?;
        let mut answers = Vec::with_capacity(roles.len());
        for chunk in roles.chunks(ROLES_PER_TXN) {
            // etcd refuses a transaction that writes one key twice.
            let mut distinct: Vec<&str> = Vec::with_capacity(chunk.len());
            for role in chunk {
                if !distinct.contains(&role.as_str()) {
                    distinct.push(role);
                }
            }
            let mut nested = Vec::with_capacity(distinct.len());
            for role in &distinct {
                let txn = acquire_under_txn(&self.keys, role, (lease, &session), &record, true)?;
                nested.push(TxnOp::txn(txn));
            }
            // Once for the batch, after the acquires (their answers are read by position),
            // whether or not any of them began a term: an extra look at worst.
            nested.push(changed_put(&self.keys));
            let response = self
                .conn
                .txn("acquiring leases in a session", Txn::new().and_then(nested))
                .await?;
            let revision = response.header().map_or(0, |h| h.revision());
            let mut by_role = HashMap::with_capacity(distinct.len());
            for (role, op) in distinct.iter().zip(response.op_responses()) {
                let TxnOpResponse::Txn(answer) = op else {
                    return Err(Error::store_msg(
                        crate::conn::BACKEND,
                        "a batch of acquires was answered with something else than transactions",
                    ));
                };
                let result = match self
                    .acquired_under(role, id, lease, &session, &answer, revision)
                    .await?
                {
                    Some(result) => result,
                    None => self.acquire_under(role, id).await?,
                };
                by_role.insert(*role, result);
            }
            for role in chunk {
                let Some(result) = by_role.get(role.as_str()) else {
                    return Err(Error::store_msg(
                        crate::conn::BACKEND,
                        format!("a batch of acquires was not answered for {role:?}"),
                    ));
                };
                answers.push(result.clone());
            }
        }
        Ok(answers)
    }

    pub(super) async fn acquire_under(&self, role: &str, id: SessionId) -> Result<LeaseResult> {
        validate_name("role", role)?;
        let (lease, session, record) = self.session_term(id).await?;
        let txn = acquire_under_txn(&self.keys, role, (lease, &session), &record, false)?;
        for _ in 0..MAX_ATTEMPTS {
            let response = self
                .conn
                .txn("acquiring a lease in a session", txn.clone())
                .await?;
            let revision = response.header().map_or(0, |h| h.revision());
            match self
                .acquired_under(role, id, lease, &session, &response, revision)
                .await?
            {
                Some(result) => return Ok(result),
                // A handover under way reserved the role: finish it, then try again.
                None => self.finish_handover(role, None).await?,
            }
        }
        Err(Error::store_msg(
            crate::conn::BACKEND,
            "the lease kept changing during the call; try again",
        ))
    }

    /// The answer of [`acquire_under_txn`] (run alone or nested in a transaction at
    /// `revision`): `None` when a handover under way kept the role from being acquired.
    async fn acquired_under(
        &self,
        role: &str,
        id: SessionId,
        lease: i64,
        session: &KnownSession,
        response: &etcd_client::TxnResponse,
        revision: i64,
    ) -> Result<Option<LeaseResult>> {
        let ended = || Error::SessionEnded(id);
        let mut kvs = first_kvs(response).into_iter();
        let session_kv = kvs.next_back().flatten();
        let Some((_, expires_at)) = session_kv
            .as_ref()
            .filter(|kv| kv.create_revision() == session.created)
            .and_then(expiry_of)
        else {
            self.forget(lease);
            return Err(ended());
        };
        let (expires_at, now) = match self.sessions.lock().get_mut(&lease) {
            // The end this instance measured when it last (re)started the lease: the
            // record's is a wall time from then, which a step since would stretch.
            Some(Some(known)) if known.ends.is_some() => known.answer(self.wall()),
            Some(Some(known)) => {
                known.expires_at = known.expires_at.max(expires_at);
                (expires_at, self.wall())
            }
            _ => (expires_at, self.wall()),
        };
        let done = |token: i64| held_result(&session.owner, token, expires_at, now);
        if response.succeeded() {
            // A plain term of ours this instance remembered is over.
            self.terms.lock().remove(role);
            return Ok(Some(done(revision)));
        }
        let lease_kv = kvs.next().flatten();
        let term_kv = kvs.next().flatten();
        let handoff_kv = kvs.next().flatten();
        match seen_in(lease_kv.as_ref(), term_kv.as_ref(), handoff_kv.as_ref()).0 {
            Seen::Held(holder) if holder.lease == lease => Ok(Some(done(holder.token))),
            Seen::Held(holder) => self.refusal(holder).await.map(Some),
            Seen::Handing => Ok(None),
            // The role was free, so the session compare failed: its key is gone or is
            // another session's.
            Seen::Absent => {
                self.forget(lease);
                Err(ended())
            }
        }
    }

    pub(super) async fn close(&self, id: SessionId) -> Result<bool> {
        let Some(lease) = lease_of(id) else {
            return Ok(false);
        };
        // Only a session's lease is closed, never a plain term's under a wrong id.
        let Some(session) = self.known(lease).await? else {
            return Ok(false);
        };
        self.forget(lease);
        // End the session first: from here on keep-alives and acquires under it fail, so
        // no role joins it while its roles are released.
        let txn = Txn::new()
            .when([session_compare(&self.keys, lease, &session)])
            .and_then([TxnOp::delete(self.keys.session(lease), None)]);
        if !self.conn.txn("closing a session", txn).await?.succeeded() {
            return Ok(false);
        }
        if let Err(error) = self.release_roles_of(lease).await {
            // The revoke below still ends them; they then read as lapsed, not released.
            tracing::debug!(lease, %error, "releasing a closed session's roles failed");
        }
        // etcd deletes whatever is still on the lease (a role this could not release).
        self.conn.revoke(lease).await?;
        Ok(true)
    }

    /// Releases every role still held under the (ended) session `lease`, as `release`
    /// does (key deleted, record marked released, token kept), so readers see them
    /// released; the deletes wake their waiters.
    async fn release_roles_of(&self, lease: i64) -> Result<()> {
        let Some(attached) = self.conn.attached_keys(lease).await? else {
            return Ok(());
        };
        let leases_dir = self.keys.leases_dir();
        let roles: Vec<&str> = attached
            .iter()
            .filter_map(|key| name_under(key, &leases_dir))
            .collect();
        for chunk in roles.chunks(ROLES_PER_TXN) {
            let read = chunk
                .iter()
                .map(|role| TxnOp::get(self.keys.lease(role), None))
                .collect::<Vec<_>>();
            let response = self
                .conn
                .txn(
                    "reading a closed session's roles",
                    Txn::new().and_then(read),
                )
                .await?;
            let now = round_trip(self.wall());
            let mut releases = Vec::new();
            for (role, kv) in chunk.iter().zip(first_kvs(&response)) {
                let Some(kv) = kv.filter(|kv| kv.lease() == lease) else {
                    continue;
                };
                let owner = String::from_utf8_lossy(kv.value());
                let record = TermRecord {
                    owner: owner.clone().into_owned(),
                    token: u64::try_from(kv.create_revision()).ok(),
                    expires_at_ns: to_ns(now),
                    ttl_secs: 0,
                    lease_secs: 0,
                    released: true,
                };
                let mut compares =
                    own_term_compares(&self.keys, role, &owner, kv.create_revision());
                // Still on the session's lease: not moved to a plain lease since the read.
                compares.push(Compare::lease(
                    self.keys.lease(role),
                    CompareOp::Equal,
                    lease,
                ));
                releases.push(TxnOp::txn(Txn::new().when(compares).and_then([
                    TxnOp::delete(self.keys.lease(role), None),
                    TxnOp::put(self.keys.term(role), encode(&record)?, None),
                ])));
            }
            if !releases.is_empty() {
                releases.push(changed_put(&self.keys));
                self.conn
                    .txn(
                        "releasing a closed session's roles",
                        Txn::new().and_then(releases),
                    )
                    .await?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_ids_are_positive_lease_ids() {
        assert_eq!(lease_of(SessionId::from(0x1234)), Some(0x1234));
        assert_eq!(lease_of(SessionId::from(0)), None);
        assert_eq!(lease_of(SessionId::from(u64::MAX)), None);
        assert_eq!(session_id(0x1234), SessionId::from(0x1234));
    }
}
