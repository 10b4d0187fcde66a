//! [`PgLeaseStore`]: the lease contract on PostgreSQL, decided on the database clock.
//!
//! Every operation is one autocommit statement and one round trip; acquire/renew and
//! release run on connections the store keeps for them (see `direct.rs`: sqlx would
//! otherwise ping each connection it takes back into the pool). Expiry is judged on
//! `statement_timestamp()`, a single value per statement taken after the request
//! arrived, so hosts' clocks never matter.
//!
//! **Acquire-or-renew** is one `INSERT ... ON CONFLICT DO UPDATE ... RETURNING`. The
//! update always fires; for a caller that loses it rewrites the row unchanged. That is
//! deliberate: a `DO UPDATE ... WHERE` that skips losers returns no row, and reading the
//! holder with a second `SELECT` in the same statement sees the statement's snapshot,
//! which under READ COMMITTED predates a concurrent winner's commit (it would report the
//! previous term, or no row at all when the winner created it). The row version the
//! upsert locks and returns is always the latest committed one, so every answer names
//! the current term. The cost is one small HOT update per losing call, and losers that
//! arrive together queue on the row lock for microseconds.
//!
//! **Release** clears the holder and keeps the token; a lease row is never deleted, so
//! the counter survives release, expiry, server restarts and new store instances. When
//! the role has live candidates (see `queue.rs`), the same statement instead begins the
//! oldest one's term (token + 1, its value, its candidacy's expiry) and deletes the
//! candidacy: a handover is this one statement plus the successor's renewal.
//!
//! **The queue** is `tenure_candidates`, rows keyed `(role, owner)` with an arrival
//! `seq` and an expiry on the database clock (see `queue.rs`). Queueing is the
//! acquire-or-renew upsert with the candidacy's upsert in the same statement, so a
//! contender's refresh is still one statement; `hand_over` and `withdraw` are one each.
//!
//! **Values.** A new term's advertised value is written by the same upsert, into
//! `value`, with `value_token` set to the new token; a renewal keeps both and a release
//! clears the value. Reads show `value` only while `value_token` is the row's token, so
//! a term started by an older tenure (whose statement knows neither column) never shows
//! the value of the term before it. A call without a value runs the statement with a
//! `NULL` literal in place of the parameter, so it binds the four parameters it always
//! did (and is the statement `tenure bench` issues).
//!
//! Every statement that begins or ends a term (a release, a handover, a takeover, a
//! role's first term, a session's) `NOTIFY`s the schema's channel from inside the same
//! statement with the role's new state (see `succession.rs`);
//! [`LeaseStore::wait_for_change`], [`LeaseStore::wait_for_term`] and
//! [`LeaseStore::wait_for_successor`] listen through one shared connection, and the
//! last answers from the payload alone: waiting contenders read nothing when a release
//! hands the role to one of them.
//!
//! **Sessions** (see `session.rs`) are rows of `tenure_sessions`; a lease row held under
//! one names it in `session_id` and lives exactly while it does. Every statement here
//! judges such a row by its session's expiry; for a plain lease (`session_id` NULL) the
//! session table is never read, so the single-role path keeps its one statement.
//!
//! Tokens are only as durable as the commit: never `synchronous_commit = off` (which
//! `connect` raises to `on`), and synchronous replication when the database may fail
//! over, or a crash or failover can hand out a token twice. The same holds for the
//! queue: a failover that loses a commit can forget a candidacy or a handover (never
//! hand a token out twice while commits are durable).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use sqlx::{PgPool, Row};
use tenure::lease::{
    acquire_in_session_as_batch, mark_to_i64, validate_name, validate_release, validate_roles,
    validate_ttl, wait_out_bad_role, AcquireRequest, ChangeRow, ChangesRead, EndRequest, Handover,
    ListedLease, PrefixChanges,
};
use tenure::session::validate_open;
use tenure::{
    Error, FencingToken, LeaseInfo, LeaseResult, LeaseStore, Result, SessionGrant, SessionId,
    TermChange,
};
use time::OffsetDateTime;
use tokio::time::Instant;

use crate::direct::DirectConnections;
use crate::error::{pg_error, BACKEND};
use crate::links::SessionLinks;
use crate::notify::Notifier;
use crate::queue::{self, Successor};
use crate::registry::PgNodeRegistry;
use crate::schema::Schema;
use crate::session::{self, SessionStatements};
use crate::succession::{began_sql, notify_sql};

mod sql;

pub use sql::{acquire_statement, release_statement};
use sql::{acquire_statement_with, changes_statement};

/// The longest TTL accepted: PostgreSQL timestamps end in 294276 AD, and a lease that
/// outlives its holder by centuries is a mistake, not a configuration.
pub const MAX_TTL: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// The smallest TTL: PostgreSQL keeps time in microseconds; tenure asks for a millisecond.
pub const MIN_TTL: Duration = Duration::from_millis(1);

/// How many roles [`LeaseStore::acquire_batch_size`] asks for in one acquire statement.
pub const ACQUIRE_BATCH_SIZE: usize = 256;

/// A [`LeaseStore`] on PostgreSQL, over the caller's own pool.
///
/// Cloning is cheap and clones share the notification listener. Call
/// [`migrate`](crate::migrate) (or [`PgLeaseStore::migrate`]) once before use, and
/// after upgrading from a tenure without the queue: every acquire and release
/// statement reads `tenure_candidates`.
///
/// Acquire/renew and release keep the connections they run on: the store detaches up to
/// the pool's `max_connections` from it, as many as calls run at once, because sqlx pings
/// every connection returned to a pool (a second round trip per call). The listener
/// holds one more pool connection from the first wait in
/// [`wait_for_change`](LeaseStore::wait_for_change),
/// [`wait_for_successor`](LeaseStore::wait_for_successor) or
/// [`wait_for_term`](LeaseStore::wait_for_term) on.
///
/// Needs `SELECT, INSERT, UPDATE` on `<schema>.tenure_leases` and
/// `<schema>.tenure_sessions`, `SELECT` on `<schema>.tenure_nodes` (a keep-alive reads
/// whether a node names the session), and also `DELETE` on `<schema>.tenure_candidates` (and
/// `CREATE` for the migration). Runs at READ COMMITTED:
/// a database or role whose `default_transaction_isolation` is stricter makes racing
/// acquires fail with serialization errors (reported as store errors and retried by the
/// elector), never hand out a token twice.
#[derive(Clone, Debug)]
pub struct PgLeaseStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    pool: PgPool,
    /// Acquire/renew and release: one statement each, on the store's own connections.
    direct: DirectConnections,
    schema: Schema,
    notifier: Notifier,
    /// Acquire-or-renew advertising no value: `(role, owner, ttl, channel)`.
    acquire_sql: String,
    /// Acquire-or-renew advertising `$5`.
    acquire_value_sql: String,
    /// Acquire-or-renew, queueing the caller with value `$5` (which may be NULL).
    queue_sql: String,
    withdraw_sql: String,
    /// The owners of `$1`'s live candidacies, oldest first.
    candidates_sql: String,
    release_sql: String,
    /// Hand over to the oldest live candidate, or change nothing.
    hand_over_sql: String,
    /// Hand over to the live candidate `$5`, or change nothing.
    hand_over_to_sql: String,
    /// End the term and begin the next under the newest live session of `$5`, or
    /// release.
    hand_to_session_sql: String,
    get_sql: String,
    list_sql: String,
    changes_sql: String,
    sessions: SessionStatements,
    /// The sessions this store keeps alive, by owner: what its registries (see
    /// [`PgLeaseStore::registry`]) count as heartbeats.
    links: Arc<SessionLinks>,
}

impl PgLeaseStore {
    /// A store over `pool` using tables in `schema` (see [`Schema::new`]). The pool's
    /// connections must not commit with `synchronous_commit = off` (a crash could then
    /// forget a term and hand its token out again); [`connect`](crate::connect) sees to
    /// that for the pool it makes.
    pub fn new(pool: PgPool, schema: Schema) -> PgLeaseStore {
        let t = schema.table("tenure_leases");
        let sessions = schema.table("tenure_sessions");
        let c = schema.table("tenure_candidates");
        let nodes = schema.table("tenure_nodes");
        let acquire_sql = acquire_statement(&t, &sessions, &c);
        let acquire_value_sql = acquire_statement_with(&t, &sessions, &c, "$5", false);
        let queue_sql = acquire_statement_with(&t, &sessions, &c, "$5", true);
        let release_sql = release_statement(&t, &sessions, &c);
        let end_term = |successor| queue::end_term_statement(&t, &sessions, &c, successor);
        let hand_over_sql = end_term(Successor::Oldest);
        let hand_over_to_sql = end_term(Successor::Named);
        let hand_to_session_sql = end_term(Successor::SessionOf);
        // A session-held row shows its session's expiry; one whose session row is
        // missing (forgotten once it ended, see `session.rs`) reads as expired.
        let columns = "l.role, l.holder, l.fencing_token, CASE WHEN l.session_id IS NULL
                THEN l.expires_at
                ELSE COALESCE(s.expires_at, LEAST(l.expires_at, statement_timestamp())) END
                AS expires_at, statement_timestamp() AS now,
                CASE WHEN l.holder IS NOT NULL AND l.value_token = l.fencing_token
                THEN l.value END AS value";
        let read =
            format!("SELECT {columns} FROM {t} l LEFT JOIN {sessions} s ON s.id = l.session_id");
        let get_sql = format!("{read} WHERE l.role = $1");
        // starts_with, not LIKE: a prefix needs no escaping.
        let list_sql =
            format!("{read} WHERE starts_with(l.role, $1) ORDER BY l.role COLLATE \"C\"");
        let changes_sql = changes_statement(&t, &sessions, columns);
        let notifier = Notifier::for_terms(pool.clone(), schema.channel());
        PgLeaseStore {
            inner: Arc::new(Inner {
                direct: DirectConnections::for_pool(&pool),
                pool,
                schema,
                notifier,
                acquire_sql,
                acquire_value_sql,
                queue_sql,
                withdraw_sql: queue::withdraw_statement(&c),
                candidates_sql: format!(
                    "SELECT owner FROM {c} WHERE role = $1 \
                     AND expires_at > statement_timestamp() ORDER BY seq"
                ),
                release_sql,
                hand_over_sql,
                hand_over_to_sql,
                hand_to_session_sql,
                get_sql,
                list_sql,
                changes_sql,
                sessions: SessionStatements::new(&t, &sessions, &c, &nodes),
                links: Arc::default(),
            }),
        }
    }

    /// Creates the schema and tables if missing; see [`migrate`](crate::migrate).
    pub async fn migrate(&self) -> Result<()> {
        crate::schema::migrate(&self.inner.pool, &self.inner.schema).await
    }

    /// The pool this store runs on.
    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    /// The schema holding the tables.
    pub fn schema(&self) -> &Schema {
        &self.inner.schema
    }

    /// A [`PgNodeRegistry`] over this store's pool and schema, where a node is live for
    /// `ttl` after its last heartbeat, that counts this store's session keep-alives as
    /// heartbeats: a node that holds a session of this store (its id the session's
    /// owner, as a shard group's member) names it in its heartbeat, and the registry
    /// skips its own heartbeat write while the store keeps that session alive, so one
    /// write per interval keeps both (see `registry.rs` and `docs/semantics.md`).
    /// [`connect`](crate::connect) builds its registry this way.
    pub fn registry(&self, ttl: Duration) -> Result<PgNodeRegistry> {
        PgNodeRegistry::linked(
            self.inner.pool.clone(),
            self.inner.schema.clone(),
            ttl,
            self.inner.links.clone(),
        )
    }

    /// A statement of the lease and its queue: `(role, owner, ttl or token, channel)`,
    /// and `fifth` as `$5` when given (a value, or a successor; `Some(None)` binds NULL),
    /// one row.
    async fn term_statement(
        &self,
        what: &str,
        sql: &str,
        role: &str,
        owner: &str,
        number: i64,
        fifth: Option<Option<&str>>,
    ) -> Result<sqlx::postgres::PgRow> {
        let query = sqlx::query(sql)
            .bind(role)
            .bind(owner)
            .bind(number)
            .bind(self.inner.schema.channel());
        let query = match fifth {
            Some(value) => query.bind(value),
            None => query,
        };
        self.inner.direct.fetch_one(what, query).await
    }

    async fn fetch_info(&self, role: &str) -> Result<Option<LeaseInfo>> {
        let row = sqlx::query(&self.inner.get_sql)
            .bind(role)
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(|e| pg_error("could not read the lease", e))?;
        row.map(|row| lease_info(&row)).transpose()
    }

    /// Acquire-or-renew, queueing the caller when `queue` and another owner holds the
    /// live term.
    async fn acquire(&self, request: AcquireRequest<'_>) -> Result<LeaseResult> {
        let (role, owner, ttl) = (request.role, request.owner, request.ttl);
        let (value, queue) = (request.value, request.queue);
        // The overflow check needs some "now"; the host's is close enough to the
        // database's for a bound measured in centuries.
        request.validate(MIN_TTL, SystemTime::now())?;
        let micros = ttl_micros(ttl)?;
        let (sql, fifth) = match (queue, value) {
            (true, value) => (&self.inner.queue_sql, Some(value)),
            (false, Some(value)) => (&self.inner.acquire_value_sql, Some(Some(value))),
            (false, None) => (&self.inner.acquire_sql, None),
        };
        let row = self
            .term_statement(
                "could not acquire or renew the lease",
                sql,
                role,
                owner,
                micros,
                fifth,
            )
            .await?;
        let holder: Option<String> = decode(&row, "holder")?;
        let holder = holder.ok_or_else(|| {
            Error::store_msg(BACKEND, "acquire returned a lease without a holder")
        })?;
        Ok(LeaseResult {
            acquired: holder == owner,
            fencing_token: token_from_db(decode(&row, "fencing_token")?)?,
            expires_at: system_time(decode(&row, "expires_at")?),
            holder,
            now: system_time(decode(&row, "now")?),
        })
    }

    /// Runs `sql`, a statement ending the live term `(role, owner, token)` (see
    /// `queue::end_term_statement`), with `successor` as `$5` when given; whether the
    /// term ended. Arguments are validated by the caller; failures start with `what`.
    async fn close_term(
        &self,
        what: &str,
        role: &str,
        owner: &str,
        token: FencingToken,
        sql: &str,
        successor: Option<Option<&str>>,
    ) -> Result<bool> {
        let Ok(token) = i64::try_from(token.get()) else {
            // No such token was ever handed out.
            return Ok(false);
        };
        let row = self
            .term_statement(what, sql, role, owner, token, successor)
            .await?;
        let ended: i64 = decode(&row, "ended")?;
        Ok(ended > 0)
    }
}

pub(crate) fn system_time(t: OffsetDateTime) -> SystemTime {
    SystemTime::from(t)
}

pub(crate) fn token_from_db(value: i64) -> Result<FencingToken> {
    tenure::lease::token_from_i64(BACKEND, value)
}

pub(crate) fn token_to_db(field: &'static str, token: FencingToken) -> Result<i64> {
    tenure::lease::token_to_i64(field, BACKEND, token)
}

pub(crate) fn decode<'r, T>(row: &'r sqlx::postgres::PgRow, column: &str) -> Result<T>
where
    T: sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    row.try_get(column)
        .map_err(|e| pg_error(format!("could not decode column {column}"), e))
}

fn lease_info(row: &sqlx::postgres::PgRow) -> Result<LeaseInfo> {
    Ok(LeaseInfo {
        role: decode(row, "role")?,
        holder: decode(row, "holder")?,
        fencing_token: token_from_db(decode(row, "fencing_token")?)?,
        expires_at: system_time(decode(row, "expires_at")?),
        now: system_time(decode(row, "now")?),
        value: decode(row, "value")?,
    })
}

fn ttl_micros(ttl: Duration) -> Result<i64> {
    if ttl > MAX_TTL {
        return Err(Error::invalid(
            "ttl",
            format!("{ttl:?} is too large: at most {MAX_TTL:?} on postgres"),
        ));
    }
    // Whole microseconds, rounded up so the granted term is never shorter than asked.
    let micros = ttl.as_nanos().div_ceil(1_000);
    i64::try_from(micros).map_err(|_| Error::invalid("ttl", format!("{ttl:?} is too large")))
}

#[async_trait]
impl LeaseStore for PgLeaseStore {
    async fn contend(&self, request: AcquireRequest<'_>) -> Result<LeaseResult> {
        self.acquire(request).await
    }

    async fn withdraw(&self, role: &str, owner: &str) -> Result<bool> {
        validate_release(role, owner)?;
        let query = sqlx::query(&self.inner.withdraw_sql).bind(role).bind(owner);
        let row = self
            .inner
            .direct
            .fetch_optional("could not withdraw the candidacy", query)
            .await?;
        row.map_or(Ok(false), |row| decode(&row, "live"))
    }

    async fn candidates(&self, role: &str) -> Result<Vec<String>> {
        validate_name("role", role)?;
        let rows = sqlx::query(&self.inner.candidates_sql)
            .bind(role)
            .fetch_all(&self.inner.pool)
            .await
            .map_err(|e| pg_error("could not list the candidates", e))?;
        rows.iter().map(|row| decode(row, "owner")).collect()
    }

    async fn end_term(&self, end: EndRequest<'_>) -> Result<bool> {
        end.validate()?;
        let handing = "could not hand the lease over";
        let (what, sql, successor) = match end.how {
            Handover::Release => ("could not release the lease", &self.inner.release_sql, None),
            Handover::To(None) => (handing, &self.inner.hand_over_sql, None),
            Handover::To(Some(named)) => (handing, &self.inner.hand_over_to_sql, Some(Some(named))),
            Handover::ToSessionOf(to) => (handing, &self.inner.hand_to_session_sql, Some(Some(to))),
        };
        self.close_term(what, end.role, end.owner, end.token, sql, successor)
            .await
    }

    async fn get(&self, role: &str) -> Result<Option<LeaseInfo>> {
        validate_name("role", role)?;
        self.fetch_info(role).await
    }

    async fn list_prefix(&self, prefix: &str) -> Result<Vec<LeaseInfo>> {
        let rows = sqlx::query(&self.inner.list_sql)
            .bind(prefix)
            .fetch_all(&self.inner.pool)
            .await
            .map_err(|e| pg_error("could not list leases", e))?;
        rows.iter().map(lease_info).collect()
    }

    async fn list_prefix_changes(&self, read: ChangesRead<'_>) -> Result<PrefixChanges> {
        let since = mark_to_i64(read.since)?;
        let ids = read
            .sessions
            .iter()
            .map(|id| session::session_to_db(*id))
            .collect::<Option<Vec<i64>>>()
            .ok_or_else(|| Error::invalid("sessions", "not a session this store made"))?;
        // Planned for the mark given, not once for any mark: a plan made for any mark
        // reads the whole table, one for a recent mark only the index's newest entries.
        let rows = sqlx::query(&self.inner.changes_sql)
            .persistent(false)
            .bind(read.prefix)
            .bind(since)
            .bind(&ids)
            .fetch_all(&self.inner.pool)
            .await
            .map_err(|e| pg_error("could not read the changes of leases", e))?;
        let decoded = rows.iter().map(|row| {
            let session = decode::<Option<i64>>(row, "session_id")?
                .map(session::session_from_db)
                .transpose()?;
            Ok(match (decode::<i32>(row, "kind")?, session) {
                (0, session) => ChangeRow::Lease(ListedLease {
                    info: lease_info(row)?,
                    session,
                }),
                (1, Some(id)) => {
                    let left: i64 = decode(row, "left_us")?;
                    ChangeRow::Session(id, Duration::from_micros(u64::try_from(left).unwrap_or(0)))
                }
                _ => ChangeRow::Mark(decode(row, "mark")?),
            })
        });
        PrefixChanges::from_rows(since.is_none(), decoded)
    }

    async fn wait_for_change(&self, role: &str, observed: FencingToken, deadline: Instant) {
        let unchanged = async {
            let info = self.fetch_info(role).await?;
            Ok(info
                .is_some_and(|info| info.fencing_token == observed && info.live_holder().is_some()))
        };
        self.inner
            .notifier
            .wait(deadline, None, unchanged, |note| *note.role == *role)
            .await;
    }

    async fn wait_for_term(&self, role: &str, after: FencingToken, deadline: Instant) {
        if wait_out_bad_role(role, deadline).await {
            return;
        }
        // Every new term notifies, a role's first one (its row's insert) included, so
        // a role that does not exist yet is waited for like any other.
        let unchanged = async {
            let info = self.fetch_info(role).await?;
            Ok(info.is_none_or(|info| info.fencing_token <= after))
        };
        self.inner
            .notifier
            .wait(deadline, None, unchanged, |note| *note.role == *role)
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
        // Read only when the listener knows nothing of the role yet (see `notify.rs`).
        let read = self.fetch_info(role);
        self.inner
            .notifier
            .wait_for_successor(role, observed, deadline, read)
            .await
    }

    fn min_ttl(&self) -> Duration {
        MIN_TTL
    }

    /// A batch is one statement whose rows lock only themselves, so a larger one costs
    /// no one else a wait: 256 took a killed member's 10,000 shards over in about half
    /// the time 64 did (BENCHMARKS.md).
    fn acquire_batch_size(&self) -> usize {
        ACQUIRE_BATCH_SIZE
    }

    async fn open_session(&self, owner: &str, ttl: Duration) -> Result<SessionGrant> {
        validate_open(owner, ttl, MIN_TTL, SystemTime::now())?;
        let micros = ttl_micros(ttl)?;
        let sent = Instant::now();
        let grant = self
            .inner
            .sessions
            .open(&self.inner.direct, owner, micros)
            .await?;
        self.inner
            .links
            .kept(&grant.owner, grant.id.get(), sent, false);
        Ok(grant)
    }

    async fn keep_alive_session(
        &self,
        session: SessionId,
        ttl: Duration,
    ) -> Result<Option<SessionGrant>> {
        validate_ttl(ttl, MIN_TTL, SystemTime::now())?;
        let micros = ttl_micros(ttl)?;
        let registry_ttl = match self.inner.links.peers_ttl() {
            Some(ttl) => Some((ttl, ttl_micros(ttl)?)),
            None => None,
        };
        let sent = Instant::now();
        let kept = self
            .inner
            .sessions
            .keep_alive(&self.inner.direct, session, micros, registry_ttl)
            .await?;
        match kept {
            Some((grant, named)) => {
                self.inner
                    .links
                    .kept(&grant.owner, grant.id.get(), sent, named);
                Ok(Some(grant))
            }
            None => {
                self.inner.links.ended(session.get());
                Ok(None)
            }
        }
    }

    async fn acquire_in_session(&self, role: &str, session: SessionId) -> Result<LeaseResult> {
        acquire_in_session_as_batch(self, BACKEND, role, session).await
    }

    /// One statement for the whole batch (see `session.rs`).
    async fn acquire_many_in_session(
        &self,
        roles: &[String],
        session: SessionId,
    ) -> Result<Vec<LeaseResult>> {
        validate_roles(roles)?;
        if roles.is_empty() {
            return Ok(Vec::new());
        }
        let channel = self.inner.schema.channel();
        self.inner
            .sessions
            .acquire(&self.inner.direct, roles, session, &channel)
            .await
    }

    async fn close_session(&self, session: SessionId) -> Result<bool> {
        let channel = self.inner.schema.channel();
        let members = self.inner.schema.members_channel();
        // Before the statement: from now on the node's own heartbeats keep it alive.
        self.inner.links.ended(session.get());
        self.inner
            .sessions
            .close(&self.inner.direct, session, &channel, &members)
            .await
    }
}
