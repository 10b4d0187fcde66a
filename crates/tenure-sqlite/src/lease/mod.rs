//! [`SqliteLeaseStore`]: the lease contract on one row per role in a local file.
//!
//! Each call that writes is one `BEGIN IMMEDIATE` transaction: it takes the file's
//! write lock, reads store time (starting a new boot in the file if needed), reads the
//! role's row and decides exactly as the in-memory reference store does. Lease rows are
//! never deleted; release clears the holder and keeps the token, so the counter survives
//! everything.
//!
//! A term's advertised value is written by the statement that starts the term, beside
//! its token (`value`, and `value_token` naming the term it belongs to); a renewal
//! leaves both alone and a release clears the value.
//!
//! A session is one row of `tenure_sessions`; a role held under it names it in its
//! `session_id` and ends when it does (the `tenure_terms` view reads each term's end),
//! so keeping a session alive writes that one row however many roles it holds.
//!
//! The write steps of acquire and release, and their statements, are in `term.rs`; the
//! reads of the lease table in `read.rs`.
//!
//! **The queue of candidates** is `tenure_candidates` (see `queue.rs`): one row per
//! `(role, owner)` with its place, expiry and value. Queueing, withdrawing, a release
//! that hands the role to the oldest live candidate and a planned handoff are each one
//! transaction, like every other write. A waiter for a successor reads the role's row
//! and answers who leads next from it; it never writes. It reads again when woken: by
//! a write through the same [`SqliteDatabase`], or, in another process, by the
//! release that handed its owner the role (`wake.rs`, Linux); and on a poll meanwhile.
use std::path::Path;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use tenure::lease::{
    acquire_in_session_as_batch, mark_to_i64, validate_name, validate_release, validate_roles,
    validate_ttl, wait_out_bad_role, AcquireRequest, ChangeMark, ChangeRow, ChangesRead,
    EndRequest, Handover, ListedLease, PrefixChanges, ACQUIRE_BATCH_SIZE,
};
use tenure::session::validate_open;
use tenure::{
    Error, FencingToken, LeaseInfo, LeaseResult, LeaseStore, Result, SessionGrant, SessionId,
    TermChange,
};
use tokio::time::Instant;

use crate::clock::StoreNow;
use crate::database::{
    column, store_error, token_from_db, token_to_db, SqliteDatabase, SqliteOptions,
};
use crate::BACKEND;

mod commit;
mod queue;
mod read;
mod term;

use commit::{commit, commit_and_tell, new_term, News};

use term::{end_term, write_lease_with_value, write_term, Claim, Ended, LeaseRow, Successor};
pub use term::{release_lease, write_lease, LeaseWrite};

/// Forgets the sessions that ended before store time `?1` (their terms read as ended
/// through their own `expires_at`, see the schema).
const SWEEP_SESSIONS: &str = "DELETE FROM tenure_sessions WHERE expires_at <= ?1";
/// Opens a session for owner `?1` expiring at `?2`, kept alive as of `?3`.
const OPEN_SESSION: &str =
    "INSERT INTO tenure_sessions (owner, expires_at, kept_at) VALUES (?1, ?2, ?3)";
/// Moves live session `?1`'s expiry to `?2` (never earlier) at store time `?3`, and
/// stamps it kept alive at `?3` (what readers count as a heartbeat of the node naming
/// it, see `registry.rs`): the one row a keep-alive writes. Answers the owner, the
/// expiry, whether the owner's node row names the session (read through the
/// partial index on `tenure_nodes.session_id`; nothing is written there), the count of
/// terms handed to it and the latest change number (through `tenure_leases_changed`).
const KEEP_ALIVE_SESSION: &str = "UPDATE tenure_sessions \
     SET expires_at = max(expires_at, ?2), kept_at = max(coalesce(kept_at, ?3), ?3) \
     WHERE id = ?1 AND expires_at > ?3 RETURNING owner, expires_at, \
     EXISTS (SELECT 1 FROM tenure_nodes n \
         WHERE n.session_id = tenure_sessions.id AND n.node_id = tenure_sessions.owner), \
     terms_handed, (SELECT coalesce(max(changed), 0) FROM tenure_leases)";
/// The latest change number (see `schema.rs`): a session's grant tells it
/// ([`SessionGrant::latest_change`]).
const LATEST_CHANGE: &str = "SELECT coalesce(max(changed), 0) FROM tenure_leases";
/// Whether a node names session `?1` (closing it may end that node's membership).
const SESSION_NAMED: &str = "SELECT EXISTS (SELECT 1 FROM tenure_nodes WHERE session_id = ?1)";
/// Reads live session `?1` at store time `?2`: `owner, expires_at`.
const READ_SESSION: &str =
    "SELECT owner, expires_at FROM tenure_sessions WHERE id = ?1 AND expires_at > ?2";
/// Ends session `?1`, returning when it would have expired.
const CLOSE_SESSION: &str = "DELETE FROM tenure_sessions WHERE id = ?1 RETURNING expires_at";
/// Releases every role held under session `?1` at store time `?2` (the session expiring
/// at `?3`, if known), keeping the tokens; returns the roles.
const RELEASE_SESSION_ROLES: &str = "UPDATE tenure_leases \
     SET holder = NULL, session_id = NULL, expires_at = min(?2, coalesce(?3, expires_at)), \
     value = NULL WHERE session_id = ?1 RETURNING role";
/// Reads role `?1`'s latest token, for [`LeaseStore::wait_for_term`].
/// [`LeaseStore::list_prefix_changes`]: `(?1 boot id, ?2 prefix, ?3 mark or NULL, ?4
/// session ids as a JSON array)`, one statement, so everything comes from one snapshot.
/// Columns 0-5 are those `info_from` reads, then the session (6), the row's kind (7: 0 a
/// lease, 1 a session asked about, 2 the mark) and the mark (8: the largest change
/// number in the snapshot; see `schema.rs`). Held leases of their own (no session) are
/// read every time: their renewals change no term, and so no number.
const READ_CHANGES: &str = "WITH boot AS (
    SELECT coalesce((SELECT boot_id FROM tenure_boot WHERE id = 0) = ?1, 0) AS this
)
SELECT role, holder, token, expires_at, (SELECT this FROM boot), value, session_id, 0, NULL
FROM tenure_terms WHERE substr(role, 1, length(?2)) = ?2 AND (?3 IS NULL OR (changed > ?3
    AND NOT (session_id IS NULL AND holder IS NOT NULL)))
UNION ALL
SELECT role, holder, token, expires_at, (SELECT this FROM boot), value, session_id, 0, NULL
FROM tenure_terms WHERE ?3 IS NOT NULL AND session_id IS NULL AND holder IS NOT NULL
    AND substr(role, 1, length(?2)) = ?2
UNION ALL
SELECT NULL, NULL, NULL, expires_at, (SELECT this FROM boot), NULL, id, 1, NULL
FROM tenure_sessions WHERE id IN (SELECT value FROM json_each(?4))
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, 2,
    (SELECT coalesce(max(changed), 0) FROM tenure_leases)";

const READ_TOKEN: &str = "SELECT token FROM tenure_leases WHERE role = ?1";

/// Durable, fenced leases in a SQLite file, shared by every process on the host that
/// opens the same file.
///
/// Store time is the host's monotonic clock under its boot id (see [`SqliteDatabase`]).
/// [`wait_for_change`](LeaseStore::wait_for_change),
/// [`wait_for_successor`](LeaseStore::wait_for_successor) and
/// [`wait_for_term`](LeaseStore::wait_for_term) wake at once for a release or new term
/// written through the same [`SqliteDatabase`], and within the polling interval (10 ms
/// by default) for one written by another process; they only read. On Linux one
/// process at a time watches each role its waits wait on: every write that begins or
/// ends a term of the role wakes that process at once, and its waits then read the file
/// every 10 s (or at their deadline, a lapse being no write) rather than every polling
/// interval: an observer waiting for requests for as long as it leads, or the one
/// follower of a pair, costs the file almost nothing.
///
/// Contenders that queue ([`try_acquire_or_queue`](LeaseStore::try_acquire_or_queue))
/// wait in `tenure_candidates`, and a release hands the role to the oldest live one in
/// its own transaction (see the module docs).
///
/// Sessions are durable rows too, with ids that are never handed out twice. Keeping one
/// alive writes its row alone, whatever the number of roles held under it; closing one
/// releases those roles in the same transaction and wakes their waiters as a release
/// does. A new boot ends every session.
///
/// # Examples
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use std::time::Duration;
/// use tenure::LeaseStore;
/// use tenure_sqlite::SqliteLeaseStore;
///
/// let dir = tempfile::tempdir().unwrap();
/// let store = SqliteLeaseStore::open(dir.path().join("leases.db")).await?;
/// let lease = store.try_acquire_or_renew("reports", "node-a", Duration::from_secs(15)).await?;
/// assert!(lease.acquired);
/// assert_eq!(lease.fencing_token.get(), 1);
/// assert!(store.release("reports", "node-a", lease.fencing_token).await?);
/// let next = store.try_acquire_or_renew("reports", "node-b", Duration::from_secs(15)).await?;
/// assert_eq!(next.fencing_token.get(), 2);
/// # Ok::<(), tenure::Error>(())
/// # }).unwrap();
/// ```
#[derive(Clone, Debug)]
pub struct SqliteLeaseStore {
    db: SqliteDatabase,
}

/// A TTL in the file's unit, nanoseconds; beyond 292 years is [`Error::InvalidArgument`].
fn ttl_nanos(ttl: Duration) -> Result<i64> {
    i64::try_from(ttl.as_nanos()).map_err(|_| ttl_too_large(ttl))
}

/// Store time `now + ttl` in the file's unit.
fn ends_at(now: i64, ttl_nanos: i64, ttl: Duration) -> Result<i64> {
    now.checked_add(ttl_nanos).ok_or_else(|| ttl_too_large(ttl))
}

fn ttl_too_large(ttl: Duration) -> Error {
    Error::invalid(
        "ttl",
        format!("{ttl:?} is too large for the sqlite store's nanosecond clock (292 years)"),
    )
}

/// A session id as stored; one above `i64::MAX` was never handed out.
fn session_to_db(session: SessionId) -> Option<i64> {
    i64::try_from(session.get()).ok()
}

fn session_from_db(id: i64) -> Result<SessionId> {
    u64::try_from(id).map(SessionId::from).map_err(|_| {
        Error::store_msg(
            BACKEND,
            format!("the database holds a negative session id, {id}"),
        )
    })
}

impl SqliteLeaseStore {
    /// A lease store over an opened database.
    pub fn new(db: &SqliteDatabase) -> Self {
        SqliteLeaseStore { db: db.clone() }
    }

    /// Opens the file at `path`; see [`SqliteDatabase::open`].
    pub async fn open(path: impl AsRef<Path>) -> Result<Self> {
        Ok(Self::new(&SqliteDatabase::open(path).await?))
    }

    /// Opens the file at `path` with options (an injected clock, for instance).
    pub async fn open_with(path: impl AsRef<Path>, options: SqliteOptions) -> Result<Self> {
        Ok(Self::new(&SqliteDatabase::open_with(path, options).await?))
    }

    /// A store over an existing pool; see [`SqliteDatabase::from_pool`].
    pub async fn from_pool(pool: sqlx::SqlitePool) -> Result<Self> {
        Ok(Self::new(&SqliteDatabase::from_pool(pool).await?))
    }

    /// A store over an existing pool with options.
    pub async fn from_pool_with(pool: sqlx::SqlitePool, options: SqliteOptions) -> Result<Self> {
        Ok(Self::new(
            &SqliteDatabase::from_pool_with(pool, options).await?,
        ))
    }

    /// The database this store writes to.
    pub fn database(&self) -> &SqliteDatabase {
        &self.db
    }

    /// The answer of a committed `write` for `owner`: acquired until `acquired_until`,
    /// or refused with the live holder's term.
    fn result_of(
        &self,
        owner: &str,
        write: LeaseWrite,
        now: &StoreNow,
        acquired_until: SystemTime,
    ) -> Result<LeaseResult> {
        match write {
            LeaseWrite::Written { token, .. } => Ok(LeaseResult {
                acquired: true,
                fencing_token: token_from_db(token)?,
                expires_at: acquired_until,
                holder: owner.to_owned(),
                now: now.wall,
            }),
            LeaseWrite::Refused {
                holder,
                token,
                expires_at,
            } => Ok(LeaseResult {
                acquired: false,
                fencing_token: token_from_db(token)?,
                expires_at: now.wall_at(expires_at)?,
                holder,
                now: now.wall,
            }),
        }
    }

    /// Acquire-or-renew in one transaction, queueing the caller as a candidate until
    /// `now + ttl` when `queue` is set and another owner holds the live term.
    async fn acquire(&self, request: AcquireRequest<'_>) -> Result<LeaseResult> {
        let (role, owner, ttl) = (request.role, request.owner, request.ttl);
        let (value, queue) = (request.value, request.queue);
        // Bad input is refused before the store is touched.
        request.validate(self.min_ttl(), self.db.now()?.wall)?;
        let ttl_nanos = ttl_nanos(ttl)?;
        let (writer, mut tx) = self.db.begin_write().await?;
        let store_now = self.db.write_now(&mut tx).await?;
        // Shown as wall now + ttl, which is what `wall_at(expires_at)` gives.
        let expires_time = validate_ttl(ttl, self.min_ttl(), store_now.wall)?;
        let expires_at = ends_at(store_now.mono, ttl_nanos, ttl)?;
        let now = store_now.mono;
        let write = write_lease_with_value(&mut tx, role, owner, now, expires_at, value).await?;
        if queue && matches!(write, LeaseWrite::Refused { .. }) {
            queue::enqueue(&mut tx, role, owner, expires_at, value, now).await?;
            // Before the commit: a release in another process may hand it the role
            // the moment the candidacy is in the file.
            self.db.listen_for_wakes(owner);
        }
        let news = News::of_role(role, new_term(&write));
        commit_and_tell(&self.db, writer, tx, "cannot commit the lease", news).await?;
        self.result_of(owner, write, &store_now, expires_time)
    }

    /// Ends the live term `(role, owner, token)` in one transaction, handing the role as
    /// `successor` says (see `term::end_term`); waiters in this process are woken.
    async fn close_term(
        &self,
        role: &str,
        owner: &str,
        token: FencingToken,
        successor: Successor<'_>,
    ) -> Result<bool> {
        let Ok(token) = token_to_db(token) else {
            // No such token was ever handed out, so it is not the live term.
            return Ok(false);
        };
        let (writer, mut tx) = self.db.begin_write().await?;
        let now = self.db.write_now(&mut tx).await?.mono;
        let ended = end_term(&mut tx, role, owner, token, now, successor).await?;
        let news = News {
            handed: match &ended {
                Ended::HandedTo(next) => Some((next.clone(), role.to_owned())),
                _ => None,
            },
            ..News::of_role(role, ended != Ended::Not)
        };
        commit_and_tell(&self.db, writer, tx, "cannot commit the release", news).await?;
        Ok(ended != Ended::Not)
    }
}

#[async_trait]
impl LeaseStore for SqliteLeaseStore {
    async fn contend(&self, request: AcquireRequest<'_>) -> Result<LeaseResult> {
        self.acquire(request).await
    }

    async fn withdraw(&self, role: &str, owner: &str) -> Result<bool> {
        validate_release(role, owner)?;
        let (_writer, mut tx) = self.db.begin_write().await?;
        let now = self.db.write_now(&mut tx).await?.mono;
        let withdrawn = queue::withdraw(&mut tx, role, owner, now).await?;
        commit(tx, "cannot commit the withdrawal").await?;
        Ok(withdrawn)
    }

    async fn candidates(&self, role: &str) -> Result<Vec<String>> {
        validate_name("role", role)?;
        let now = self.db.read_now()?;
        // Candidacies of another boot have no live time left on this one.
        sqlx::query_scalar(
            "SELECT owner FROM tenure_candidates WHERE role = ?1 AND expires_at > ?2 \
             AND coalesce((SELECT boot_id FROM tenure_boot WHERE id = 0) = ?3, 0) ORDER BY seq",
        )
        .bind(role)
        .bind(now.mono)
        .bind(&now.boot_id)
        .fetch_all(self.db.pool())
        .await
        .map_err(store_error("cannot read the queue"))
    }

    async fn end_term(&self, end: EndRequest<'_>) -> Result<bool> {
        end.validate()?;
        let successor = match end.how {
            Handover::Release => Successor::OldestOrFree,
            Handover::To(successor) => Successor::Candidate(successor),
            Handover::ToSessionOf(to) => Successor::SessionOf(to),
        };
        self.close_term(end.role, end.owner, end.token, successor)
            .await
    }

    async fn get(&self, role: &str) -> Result<Option<LeaseInfo>> {
        validate_name("role", role)?;
        Ok(self.read_leases(Some(role), "").await?.pop())
    }

    async fn list_prefix(&self, prefix: &str) -> Result<Vec<LeaseInfo>> {
        self.read_leases(None, prefix).await
    }

    async fn list_prefix_changes(&self, read: ChangesRead<'_>) -> Result<PrefixChanges> {
        let now = self.db.read_now()?;
        let since = mark_to_i64(read.since)?;
        let ids = read
            .sessions
            .iter()
            .filter_map(|id| session_to_db(*id))
            .map(|id| id.to_string())
            .collect::<Vec<_>>()
            .join(",");
        let rows = sqlx::query(READ_CHANGES)
            .bind(&now.boot_id)
            .bind(read.prefix)
            .bind(since)
            .bind(format!("[{ids}]"))
            .fetch_all(self.db.pool())
            .await
            .map_err(store_error("cannot read the changes of leases"))?;
        let decoded = rows.iter().map(|row| {
            let session = column::<Option<i64>>(row, 6)?
                .map(session_from_db)
                .transpose()?;
            Ok(match (column::<i64>(row, 7)?, session) {
                (0, session) => ChangeRow::Lease(ListedLease {
                    info: self.info_from(row, &now)?,
                    session,
                }),
                (1, Some(id)) => {
                    let this_boot: bool = column(row, 4)?;
                    let expires_at: i64 = column(row, 3)?;
                    let left = if this_boot { expires_at - now.mono } else { 0 };
                    ChangeRow::Session(id, Duration::from_nanos(u64::try_from(left).unwrap_or(0)))
                }
                _ => ChangeRow::Mark(column(row, 8)?),
            })
        });
        PrefixChanges::from_rows(since.is_none(), decoded)
    }

    async fn wait_for_change(&self, role: &str, observed: FencingToken, deadline: Instant) {
        if wait_out_bad_role(role, deadline).await {
            return;
        }
        let Ok(observed) = token_to_db(observed) else {
            return;
        };
        let poll = self.db.poll_interval();
        self.db
            .wait_polling(role, true, poll, deadline, || {
                self.is_live_term(role, observed)
            })
            .await;
    }

    async fn wait_for_successor(
        &self,
        role: &str,
        observed: FencingToken,
        deadline: Instant,
    ) -> TermChange {
        if wait_out_bad_role(role, deadline).await {
            return TermChange::Unknown;
        }
        // A token above `i64::MAX` was never handed out: any live term is another.
        let observed = token_to_db(observed).ok();
        let poll = self.db.successor_poll();
        self.db
            .wait_polling_for(role, true, poll, deadline, || {
                self.succession(role, observed)
            })
            .await
            .unwrap_or(TermChange::Unknown)
    }

    async fn wait_for_term(&self, role: &str, after: FencingToken, deadline: Instant) {
        let Ok(after) = token_to_db(after) else {
            // No token above `i64::MAX` is ever handed out.
            tokio::time::sleep_until(deadline).await;
            return;
        };
        if wait_out_bad_role(role, deadline).await {
            return;
        }
        // A new term through this database signals the role at once (as a release
        // does); one written by another process is announced to the process watching
        // the role, and seen by the others within the poll interval.
        let poll = self.db.poll_interval();
        self.db
            .wait_polling(role, true, poll, deadline, || {
                self.no_term_after(role, after)
            })
            .await;
    }

    /// The default, kept on purpose: a batch is one write transaction, and the file has
    /// one writer at a time, so every other write (a member's session keep-alive too)
    /// waits for the whole batch. 64 already takes a killed member's 2,500 shards over
    /// in about 0.3 s after its session lapsed; 256 did no better.
    fn acquire_batch_size(&self) -> usize {
        ACQUIRE_BATCH_SIZE
    }

    /// `None` on Linux for a file: every write of a term is announced to the process
    /// watching the role (see the type's docs). Elsewhere another process's writes are
    /// seen only by reading the file again.
    fn change_poll(&self) -> Option<Duration> {
        (!self.db.hears_announcements()).then(|| self.db.poll_interval())
    }

    async fn open_session(&self, owner: &str, ttl: Duration) -> Result<SessionGrant> {
        validate_open(owner, ttl, self.min_ttl(), self.db.now()?.wall)?;
        let ttl_nanos = ttl_nanos(ttl)?;
        let (_writer, mut tx) = self.db.begin_write().await?;
        let now = self.db.write_now(&mut tx).await?;
        let expires_at = ends_at(now.mono, ttl_nanos, ttl)?;
        // Ended sessions are never revived, so their rows only take room.
        sqlx::query(SWEEP_SESSIONS)
            .bind(now.mono)
            .execute(&mut *tx)
            .await
            .map_err(store_error("cannot forget ended sessions"))?;
        let id = sqlx::query(OPEN_SESSION)
            .bind(owner)
            .bind(expires_at)
            .bind(now.mono)
            .execute(&mut *tx)
            .await
            .map_err(store_error("cannot open the session"))?
            .last_insert_rowid();
        let latest: i64 = sqlx::query_scalar(LATEST_CHANGE)
            .fetch_one(&mut *tx)
            .await
            .map_err(store_error("cannot read the latest change"))?;
        commit(tx, "cannot commit the session").await?;
        let id = session_from_db(id)?;
        self.db.links().kept(owner, id.get(), now.mono, false);
        Ok(SessionGrant {
            id,
            owner: owner.to_owned(),
            expires_at: now.wall_at(expires_at)?,
            now: now.wall,
            peers_lapse: None,
            terms_handed: Some(0),
            latest_change: Some(ChangeMark::from_stored(BACKEND, latest)?),
        })
    }

    async fn keep_alive_session(
        &self,
        session: SessionId,
        ttl: Duration,
    ) -> Result<Option<SessionGrant>> {
        validate_ttl(ttl, self.min_ttl(), self.db.now()?.wall)?;
        let ttl_nanos = ttl_nanos(ttl)?;
        let Some(id) = session_to_db(session) else {
            return Ok(None);
        };
        let (_writer, mut tx) = self.db.begin_write().await?;
        let now = self.db.write_now(&mut tx).await?;
        let renewed_until = ends_at(now.mono, ttl_nanos, ttl)?;
        let kept: Option<(String, i64, bool, i64, i64)> = sqlx::query_as(KEEP_ALIVE_SESSION)
            .bind(id)
            .bind(renewed_until)
            .bind(now.mono)
            .fetch_optional(&mut *tx)
            .await
            .map_err(store_error("cannot keep the session alive"))?;
        // The account is an optimisation: failing to read it must not fail the
        // keep-alive (the member reads the members itself).
        let peers_lapse = match (&kept, self.db.links().peers_ttl()) {
            (Some((owner, ..)), Some(ttl)) => {
                crate::registry::peers_lapse(&mut tx, &now, owner, ttl)
                    .await
                    .inspect_err(|error| tracing::debug!(%error, "the keep-alive tells no lapse"))
                    .ok()
            }
            _ => None,
        };
        commit(tx, "cannot commit the keep-alive").await?;
        match &kept {
            Some((owner, _, named, ..)) => {
                self.db.links().kept(owner, session.get(), now.mono, *named)
            }
            None => self.db.links().ended(session.get()),
        }
        kept.map(|(owner, expires_at, _, handed, latest)| {
            Ok(SessionGrant {
                id: session,
                owner,
                expires_at: now.wall_at(expires_at)?,
                now: now.wall,
                peers_lapse,
                terms_handed: Some(u64::try_from(handed).unwrap_or(0)),
                latest_change: Some(ChangeMark::from_stored(BACKEND, latest)?),
            })
        })
        .transpose()
    }

    async fn acquire_in_session(&self, role: &str, session: SessionId) -> Result<LeaseResult> {
        acquire_in_session_as_batch(self, BACKEND, role, session).await
    }

    /// One write transaction for the whole batch: each role is decided as
    /// `acquire_in_session` decides it, and nothing is visible before the commit.
    async fn acquire_many_in_session(
        &self,
        roles: &[String],
        session: SessionId,
    ) -> Result<Vec<LeaseResult>> {
        validate_roles(roles)?;
        let Some(id) = session_to_db(session) else {
            return Err(Error::SessionEnded(session));
        };
        let (writer, mut tx) = self.db.begin_write().await?;
        let now = self.db.write_now(&mut tx).await?;
        let live: Option<(String, i64)> = sqlx::query_as(READ_SESSION)
            .bind(id)
            .bind(now.mono)
            .fetch_optional(&mut *tx)
            .await
            .map_err(store_error("cannot read the session"))?;
        let Some((owner, expires_at)) = live else {
            commit(tx, "cannot commit the session check").await?;
            return Err(Error::SessionEnded(session));
        };
        let mut writes = Vec::with_capacity(roles.len());
        for role in roles {
            let claim = Claim::Session {
                session: id,
                owner: &owner,
                expires_at,
            };
            writes.push(write_term(&mut tx, role, now.mono, claim).await?);
        }
        let news = News {
            terms: roles
                .iter()
                .zip(&writes)
                .filter(|(_, write)| new_term(write))
                .map(|(role, _)| role.clone())
                .collect(),
            ..News::default()
        };
        commit_and_tell(&self.db, writer, tx, "cannot commit the lease", news).await?;
        let until = now.wall_at(expires_at)?;
        writes
            .into_iter()
            .map(|write| self.result_of(&owner, write, &now, until))
            .collect()
    }

    async fn close_session(&self, session: SessionId) -> Result<bool> {
        let Some(id) = session_to_db(session) else {
            return Ok(false);
        };
        // Before the close: from now on the node's own heartbeats keep it alive.
        self.db.links().ended(session.get());
        let (writer, mut tx) = self.db.begin_write().await?;
        let now = self.db.write_now(&mut tx).await?.mono;
        let named: bool = sqlx::query_scalar(SESSION_NAMED)
            .bind(id)
            .fetch_one(&mut *tx)
            .await
            .map_err(store_error("cannot read the nodes the session keeps alive"))?;
        let ended: Option<i64> = sqlx::query_scalar(CLOSE_SESSION)
            .bind(id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(store_error("cannot close the session"))?;
        let released: Vec<String> = sqlx::query_scalar(RELEASE_SESSION_ROLES)
            .bind(id)
            .bind(now)
            .bind(ended)
            .fetch_all(&mut *tx)
            .await
            .map_err(store_error("cannot release the session's roles"))?;
        let news = News {
            terms: released,
            // A node kept alive by the session may have gone with it.
            membership: named,
            ..News::default()
        };
        commit_and_tell(&self.db, writer, tx, "cannot commit the close", news).await?;
        Ok(ended.is_some_and(|expires_at| now < expires_at))
    }
}
