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
//! the counter survives release, expiry, server restarts and new store instances.
//!
//! **Values.** A new term's advertised value is written by the same upsert, into
//! `value`, with `value_token` set to the new token; a renewal keeps both and a release
//! clears the value. Reads show `value` only while `value_token` is the row's token, so
//! a term started by an older tenure (whose statement knows neither column) never shows
//! the value of the term before it. A call without a value runs the statement with a
//! `NULL` literal in place of the parameter, so it binds the four parameters it always
//! did (and is the statement `tenure bench` issues).
//!
//! Release and every change of term (a takeover, or a role's first term) `NOTIFY` the
//! schema's channel from inside the same statement; [`LeaseStore::wait_for_change`] and
//! [`LeaseStore::wait_for_term`] listen through one shared connection.
//!
//! **Sessions** (see `session.rs`) are rows of `tenure_sessions`; a lease row held under
//! one names it in `session_id` and lives exactly while it does. Every statement here
//! judges such a row by its session's expiry; for a plain lease (`session_id` NULL) the
//! session table is never read, so the single-role path keeps its one statement.
//!
//! Tokens are only as durable as the commit: run with `synchronous_commit = on` (the
//! default), and with synchronous replication when the database may fail over, or a
//! failover can hand out a token twice.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use sqlx::{PgPool, Row};
use tenure::lease::{
    validate_acquire, validate_name, validate_release, validate_ttl, validate_value,
};
use tenure::session::validate_open;
use tenure::{
    Error, FencingToken, LeaseInfo, LeaseResult, LeaseStore, Result, SessionGrant, SessionId,
};
use time::OffsetDateTime;
use tokio::time::Instant;

use crate::direct::DirectConnections;
use crate::error::{pg_error, BACKEND};
use crate::notify::Notifier;
use crate::schema::Schema;
use crate::session::{self, SessionStatements};

/// The longest TTL accepted: PostgreSQL timestamps end in 294276 AD, and a lease that
/// outlives its holder by centuries is a mistake, not a configuration.
pub const MAX_TTL: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// The smallest TTL: PostgreSQL keeps time in microseconds; tenure asks for a millisecond.
pub const MIN_TTL: Duration = Duration::from_millis(1);

/// A [`LeaseStore`] on PostgreSQL, over the caller's own pool.
///
/// Cloning is cheap and clones share the notification listener. Call
/// [`migrate`](crate::migrate) (or [`PgLeaseStore::migrate`]) once before use.
///
/// Acquire/renew and release keep the connections they run on: the store detaches up to
/// the pool's `max_connections` from it, as many as calls run at once, because sqlx pings
/// every connection returned to a pool (a second round trip per call). The listener
/// holds one more pool connection while anyone waits in
/// [`wait_for_change`](LeaseStore::wait_for_change) or
/// [`wait_for_term`](LeaseStore::wait_for_term).
///
/// Needs `SELECT, INSERT, UPDATE` on `<schema>.tenure_leases` and
/// `<schema>.tenure_sessions` (and `CREATE` for the migration). Runs at READ COMMITTED:
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
    release_sql: String,
    get_sql: String,
    list_sql: String,
    sessions: SessionStatements,
}

impl PgLeaseStore {
    /// A store over `pool` using tables in `schema` (see [`Schema::new`]).
    pub fn new(pool: PgPool, schema: Schema) -> PgLeaseStore {
        let t = schema.table("tenure_leases");
        let sessions = schema.table("tenure_sessions");
        let acquire_sql = acquire_statement(&t, &sessions);
        let acquire_value_sql = acquire_statement_with(&t, &sessions, "$5");
        let release_sql = release_statement(&t, &sessions);
        // A session-held row shows its session's expiry; one whose session row is
        // missing (forgotten once it ended, see `session.rs`) reads as expired.
        let read = format!(
            "SELECT l.role, l.holder, l.fencing_token, CASE WHEN l.session_id IS NULL
                THEN l.expires_at
                ELSE COALESCE(s.expires_at, LEAST(l.expires_at, statement_timestamp())) END
                AS expires_at, statement_timestamp() AS now,
                CASE WHEN l.holder IS NOT NULL AND l.value_token = l.fencing_token
                THEN l.value END AS value
             FROM {t} l LEFT JOIN {sessions} s ON s.id = l.session_id"
        );
        let get_sql = format!("{read} WHERE l.role = $1");
        // starts_with, not LIKE: a prefix needs no escaping.
        let list_sql =
            format!("{read} WHERE starts_with(l.role, $1) ORDER BY l.role COLLATE \"C\"");
        let notifier = Notifier::new(pool.clone(), schema.channel());
        PgLeaseStore {
            inner: Arc::new(Inner {
                direct: DirectConnections::for_pool(&pool),
                pool,
                schema,
                notifier,
                acquire_sql,
                acquire_value_sql,
                release_sql,
                get_sql,
                list_sql,
                sessions: SessionStatements::new(&t, &sessions),
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

    /// The acquire or release statement: `(role, owner, ttl or token, channel)`, and
    /// `advertised` as `$5` when given, one row.
    async fn term_statement(
        &self,
        what: &str,
        sql: &str,
        role: &str,
        owner: &str,
        number: i64,
        advertised: Option<&str>,
    ) -> Result<sqlx::postgres::PgRow> {
        let query = sqlx::query(sql)
            .bind(role)
            .bind(owner)
            .bind(number)
            .bind(self.inner.schema.channel());
        let query = match advertised {
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
    async fn try_acquire_or_renew_with_value(
        &self,
        role: &str,
        owner: &str,
        ttl: Duration,
        value: Option<&str>,
    ) -> Result<LeaseResult> {
        // The overflow check needs some "now"; the host's is close enough to the
        // database's for a bound measured in centuries.
        validate_acquire(role, owner, ttl, MIN_TTL, SystemTime::now())?;
        validate_value("value", value)?;
        let micros = ttl_micros(ttl)?;
        let sql = match value {
            Some(_) => &self.inner.acquire_value_sql,
            None => &self.inner.acquire_sql,
        };
        let row = self
            .term_statement(
                "could not acquire or renew the lease",
                sql,
                role,
                owner,
                micros,
                value,
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

    async fn release(&self, role: &str, owner: &str, token: FencingToken) -> Result<bool> {
        validate_release(role, owner)?;
        let Ok(token) = i64::try_from(token.get()) else {
            // No such token was ever handed out.
            return Ok(false);
        };
        let row = self
            .term_statement(
                "could not release the lease",
                &self.inner.release_sql,
                role,
                owner,
                token,
                None,
            )
            .await?;
        let released: i64 = row
            .try_get(0)
            .map_err(|e| pg_error("could not decode the release count", e))?;
        Ok(released > 0)
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

    async fn wait_for_change(&self, role: &str, observed: FencingToken, deadline: Instant) {
        let unchanged = async {
            let info = self.fetch_info(role).await?;
            Ok(info
                .is_some_and(|info| info.fencing_token == observed && info.live_holder().is_some()))
        };
        self.inner
            .notifier
            .wait(deadline, unchanged, |payload| payload == role)
            .await;
    }

    async fn wait_for_term(&self, role: &str, after: FencingToken, deadline: Instant) {
        if validate_name("role", role).is_err() {
            tokio::time::sleep_until(deadline).await;
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
            .wait(deadline, unchanged, |payload| payload == role)
            .await;
    }

    fn min_ttl(&self) -> Duration {
        MIN_TTL
    }

    async fn open_session(&self, owner: &str, ttl: Duration) -> Result<SessionGrant> {
        validate_open(owner, ttl, MIN_TTL, SystemTime::now())?;
        let micros = ttl_micros(ttl)?;
        self.inner
            .sessions
            .open(&self.inner.direct, owner, micros)
            .await
    }

    async fn keep_alive_session(
        &self,
        session: SessionId,
        ttl: Duration,
    ) -> Result<Option<SessionGrant>> {
        validate_ttl(ttl, MIN_TTL, SystemTime::now())?;
        let micros = ttl_micros(ttl)?;
        self.inner
            .sessions
            .keep_alive(&self.inner.direct, session, micros)
            .await
    }

    async fn acquire_in_session(&self, role: &str, session: SessionId) -> Result<LeaseResult> {
        validate_name("role", role)?;
        let channel = self.inner.schema.channel();
        self.inner
            .sessions
            .acquire(&self.inner.direct, role, session, &channel)
            .await
    }

    async fn close_session(&self, session: SessionId) -> Result<bool> {
        let channel = self.inner.schema.channel();
        self.inner
            .sessions
            .close(&self.inner.direct, session, &channel)
            .await
    }
}

/// The acquire-or-renew statement on lease table `t` (a quoted, qualified name): one
/// upsert deciding renew / acquire / refuse on `statement_timestamp()` and notifying on a
/// new term. A renewal never moves the expiry back: a statement that waited after it
/// arrived (behind a lock, on a starved backend) carries an older timestamp than a
/// renewal that already committed, and the holder's deadline follows the later one.
///
/// A role held under a session (`session_id` set) is judged by the session's expiry
/// (`sessions`, the session table), read only for such a role; any acquire by the
/// holder makes it a plain lease again. Public only so the benchmark issues exactly the
/// store's statement.
///
/// This is the statement of a call advertising no value; see [`acquire_statement_with`].
#[doc(hidden)]
pub fn acquire_statement(t: &str, sessions: &str) -> String {
    acquire_statement_with(t, sessions, "NULL")
}

/// [`acquire_statement`] whose new term advertises `value`: an SQL expression, `NULL` or
/// a parameter. The value and `value_token` (the new token) are written only when a
/// term starts; a renewal or a refusal keeps them.
fn acquire_statement_with(t: &str, sessions: &str, value: &str) -> String {
    let end = session::term_end(sessions, true);
    let free = format!("l.holder IS NULL OR {end} <= statement_timestamp()");
    format!(
            "WITH up AS (
                INSERT INTO {t} AS l (role, holder, fencing_token, expires_at, term_txid,
                    value, value_token)
                VALUES ($1, $2, 1, statement_timestamp() + $3 * interval '1 microsecond', txid_current(),
                    {value}, 1)
                ON CONFLICT (role) DO UPDATE SET
                    holder = CASE WHEN {free} OR l.holder = EXCLUDED.holder
                        THEN EXCLUDED.holder ELSE l.holder END,
                    fencing_token = CASE WHEN {free}
                        THEN l.fencing_token + 1 ELSE l.fencing_token END,
                    expires_at = CASE WHEN {free} THEN EXCLUDED.expires_at
                        WHEN l.holder = EXCLUDED.holder
                        THEN GREATEST(CASE WHEN l.session_id IS NULL THEN l.expires_at END,
                            EXCLUDED.expires_at)
                        ELSE {end} END,
                    term_txid = CASE WHEN {free}
                        THEN EXCLUDED.term_txid ELSE l.term_txid END,
                    session_id = CASE WHEN {free} OR l.holder = EXCLUDED.holder
                        THEN NULL ELSE l.session_id END,
                    value = CASE WHEN {free} THEN EXCLUDED.value ELSE l.value END,
                    value_token = CASE WHEN {free}
                        THEN l.fencing_token + 1 ELSE l.value_token END
                RETURNING l.holder, l.fencing_token, l.expires_at, l.term_txid = txid_current() AS new_term
            )
            SELECT up.holder, up.fencing_token, up.expires_at, statement_timestamp() AS now,
                (SELECT count(*) FROM (SELECT pg_notify($4, $1) FROM up WHERE up.new_term) n) AS notified
            FROM up"
    )
}

/// The release statement on lease table `t`; see [`acquire_statement`]. A role held
/// under a session is released alone (the session goes on). The session's expiry is
/// read without a lock: a release decides no takeover, and locking the session before
/// the lease row would invert the lock order of closing a session.
#[doc(hidden)]
pub fn release_statement(t: &str, sessions: &str) -> String {
    let end = session::term_end(sessions, false);
    format!(
        "WITH rel AS (
                UPDATE {t} AS l SET holder = NULL, session_id = NULL, value = NULL,
                    expires_at = statement_timestamp()
                WHERE l.role = $1 AND l.holder = $2 AND l.fencing_token = $3
                    AND {end} > statement_timestamp()
                RETURNING role
            )
            SELECT count(*) FROM (SELECT pg_notify($4, rel.role) FROM rel) n"
    )
}
