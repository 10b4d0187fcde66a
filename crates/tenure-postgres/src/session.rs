//! Sessions on PostgreSQL: one row in `tenure_sessions` per session, and lease rows that
//! name the session their term is held under (`tenure_leases.session_id`).
//!
//! A role held under a session is live exactly while the session row's `expires_at` is
//! in the future: that is the only expiry consulted for such a role (the lease row's own
//! `expires_at` is then just the session's expiry as last seen). So keeping a session
//! alive is one `UPDATE` of one row, whatever the number of roles, and a session that
//! ended frees every role at once without touching them.
//!
//! **Races across the two rows.** A statement that takes a role held under another
//! session judges that session dead on its `statement_timestamp()`, then writes the
//! lease row; a keep-alive that started earlier but commits later would otherwise
//! extend a session whose role was just taken. Two rules close that gap:
//! - deciding whether a session-held role is free reads the session row `FOR SHARE`,
//!   so it waits for a keep-alive in flight and sees its result;
//! - a keep-alive first locks the session row (`FOR NO KEY UPDATE`), then judges
//!   liveness on `clock_timestamp()` read after the lock was granted, not on the
//!   earlier `statement_timestamp()`. Every takeover that locked the row before it has
//!   committed by then, so one that waited behind a takeover finds the session ended.
//!
//! The lock has to come first. A plain `UPDATE ... WHERE expires_at > clock_timestamp()`
//! evaluates its `WHERE` when it reads the row, before it locks it; at READ COMMITTED
//! the condition is evaluated again (EvalPlanQual) only if the row it waited for was
//! updated or deleted, never when a concurrent transaction merely locked it. Share
//! locks do not queue behind a waiting writer, so a keep-alive that read the row while
//! the session lived and then waited for a contender's `FOR SHARE` could let a
//! takeover's own `FOR SHARE` in, and once both committed it wrote the extension
//! unchecked: the session came back after a role of it was taken under a new token.
//!
//! Lock order is always lease row, then session row (the upsert locks the lease row
//! before evaluating its `SET`; closing releases the roles before ending the session),
//! so these statements cannot deadlock each other.

use std::collections::HashMap;
use std::time::Duration;

use sqlx::postgres::PgRow;
use tenure::{ChangeMark, Error, LeaseResult, PeersLapse, Result, SessionGrant, SessionId};

use crate::direct::DirectConnections;
use crate::error::BACKEND;
use crate::lease::{decode, system_time, token_from_db};
use crate::registry::heard_sql;
use crate::succession::{began_sql, ended_sql, notify_sql};

/// How often [`SessionStatements::acquire`] runs its statement again when the snapshot
/// missed a term its own session started concurrently (see [`acquire_statement`]);
/// each run sees every commit before it began.
const ACQUIRE_ATTEMPTS: usize = 3;

/// The session statements of one schema, and the calls running them on the store's
/// own connections (arguments already validated by the store).
#[derive(Debug)]
pub(crate) struct SessionStatements {
    open: String,
    keep_alive: String,
    acquire: String,
    close: String,
}

impl SessionStatements {
    /// The statements on lease table `t`, session table `sessions`, candidates table
    /// `candidates` and node table `nodes` (all quoted, qualified names).
    pub(crate) fn new(t: &str, sessions: &str, candidates: &str, nodes: &str) -> SessionStatements {
        SessionStatements {
            open: open_statement(t, sessions),
            keep_alive: keep_alive_statement(t, sessions, nodes),
            acquire: acquire_statement(t, sessions, candidates),
            close: close_statement(t, sessions, nodes),
        }
    }

    /// Opens a session for `owner` of `micros` microseconds.
    pub(crate) async fn open(
        &self,
        direct: &DirectConnections,
        owner: &str,
        micros: i64,
    ) -> Result<SessionGrant> {
        let query = sqlx::query(&self.open).bind(owner).bind(micros);
        let row = direct
            .fetch_one("could not open the session", query)
            .await?;
        grant(&row)
    }

    /// Keeps `session` alive for `micros` more microseconds; `None` once it ended. With
    /// the grant, whether the owner's node row names the session (so the keep-alive
    /// was also the node's heartbeat). With `registry_ttl` (the TTL of the registry
    /// sharing the store's links, and it in microseconds), the grant tells when the
    /// other nodes lapse.
    pub(crate) async fn keep_alive(
        &self,
        direct: &DirectConnections,
        session: SessionId,
        micros: i64,
        registry_ttl: Option<(Duration, i64)>,
    ) -> Result<Option<(SessionGrant, bool)>> {
        let Some(id) = session_to_db(session) else {
            // No such id was ever handed out.
            return Ok(None);
        };
        let query = sqlx::query(&self.keep_alive)
            .bind(id)
            .bind(micros)
            .bind(registry_ttl.map(|(_, micros)| micros));
        let row = direct
            .fetch_optional_reserved("could not keep the session alive", query)
            .await?;
        row.map(|row| {
            let mut grant = grant(&row)?;
            let lapse_at = decode::<Option<_>>(&row, "peers_lapse_at")?;
            let live = decode::<Option<i64>>(&row, "peers_live")?;
            grant.peers_lapse = match (lapse_at, live, registry_ttl) {
                (Some(at), Some(live), Some((ttl, _))) => Some(PeersLapse {
                    after: system_time(at)
                        .duration_since(grant.now)
                        .unwrap_or_default(),
                    live: usize::try_from(live).unwrap_or(usize::MAX),
                    ttl,
                }),
                _ => None,
            };
            Ok((grant, decode::<bool>(&row, "named")?))
        })
        .transpose()
    }

    /// Acquires each of `roles` under `session` in one statement (run again for the
    /// roles a concurrent statement of the same session hid from its snapshot),
    /// announcing each new term on `channel`. Answers in the order of `roles`.
    pub(crate) async fn acquire(
        &self,
        direct: &DirectConnections,
        roles: &[String],
        session: SessionId,
        channel: &str,
    ) -> Result<Vec<LeaseResult>> {
        let Some(id) = session_to_db(session) else {
            return Err(Error::SessionEnded(session));
        };
        let mut answers: HashMap<&str, LeaseResult> = HashMap::with_capacity(roles.len());
        let mut asking: Vec<&str> = roles.iter().map(String::as_str).collect();
        asking.sort_unstable();
        asking.dedup();
        for _ in 0..ACQUIRE_ATTEMPTS {
            let query = sqlx::query(&self.acquire)
                .bind(&asking)
                .bind(id)
                .bind(channel);
            let rows = direct
                .fetch_all("could not acquire the leases in the session", query)
                .await?;
            for row in &rows {
                let role: String = decode(row, "role")?;
                match acquired(row, session, id)? {
                    Some(result) => {
                        // `asking` stays sorted: a row is matched in O(log n).
                        if let Ok(at) = asking.binary_search(&role.as_str()) {
                            answers.insert(asking[at], result);
                        }
                    }
                    None => tracing::debug!(role, %session,
                        "a concurrent acquire under the same session; again"),
                }
            }
            asking.retain(|role| !answers.contains_key(role));
            if asking.is_empty() {
                return roles
                    .iter()
                    .map(|role| {
                        answers.get(role.as_str()).cloned().ok_or_else(|| {
                            Error::store_msg(BACKEND, format!("no answer for {role:?}"))
                        })
                    })
                    .collect();
            }
        }
        Err(Error::store_msg(
            BACKEND,
            format!(
                "acquiring {:?} in session {session} kept racing with itself",
                asking.first().copied().unwrap_or_default()
            ),
        ))
    }

    /// Closes `session`, releasing its roles with a notification each on `channel`,
    /// and telling membership waiters on `members_channel` when a node names it;
    /// whether it was live.
    pub(crate) async fn close(
        &self,
        direct: &DirectConnections,
        session: SessionId,
        channel: &str,
        members_channel: &str,
    ) -> Result<bool> {
        let Some(id) = session_to_db(session) else {
            return Ok(false);
        };
        let query = sqlx::query(&self.close)
            .bind(id)
            .bind(channel)
            .bind(members_channel);
        let row = direct
            .fetch_one("could not close the session", query)
            .await?;
        let ended: i64 = decode(&row, "ended")?;
        Ok(ended > 0)
    }
}

/// A session id as the table keeps it, or `None` for one above `i64::MAX`: no such id
/// was ever handed out.
pub(crate) fn session_to_db(id: SessionId) -> Option<i64> {
    i64::try_from(id.get()).ok()
}

/// A session id as the table keeps it; a negative one is a store error.
pub(crate) fn session_from_db(id: i64) -> Result<SessionId> {
    u64::try_from(id)
        .map(SessionId::from)
        .map_err(|_| Error::store_msg(BACKEND, format!("session id {id} is negative")))
}

fn grant(row: &PgRow) -> Result<SessionGrant> {
    Ok(SessionGrant {
        id: session_from_db(decode(row, "id")?)?,
        owner: decode(row, "owner")?,
        expires_at: system_time(decode(row, "expires_at")?),
        now: system_time(decode(row, "now")?),
        peers_lapse: None,
        terms_handed: Some(u64::try_from(decode::<i64>(row, "terms_handed")?).unwrap_or(0)),
        latest_change: Some(ChangeMark::from_stored(
            BACKEND,
            decode(row, "latest_change")?,
        )?),
    })
}

/// The answer of one run of [`acquire_statement`] for session `session` (`id` in the
/// database); `None` when the statement must run again.
fn acquired(row: &PgRow, session: SessionId, id: i64) -> Result<Option<LeaseResult>> {
    let Some(owner) = decode::<Option<String>>(row, "owner")? else {
        return Err(Error::SessionEnded(session));
    };
    let now = system_time(decode(row, "now")?);
    if let Some(holder) = decode::<Option<String>>(row, "holder")? {
        // A new term under this session, or the live holder's term.
        let held_here = decode::<Option<i64>>(row, "session_id")? == Some(id);
        return Ok(Some(LeaseResult {
            acquired: held_here,
            fencing_token: token_from_db(decode(row, "fencing_token")?)?,
            expires_at: system_time(decode(row, "expires_at")?),
            holder,
            now,
        }));
    }
    let Some(token) = decode::<Option<i64>>(row, "held_token")? else {
        return Ok(None);
    };
    // Already held under this session: nothing was written.
    Ok(Some(LeaseResult {
        acquired: true,
        fencing_token: token_from_db(token)?,
        expires_at: system_time(decode(row, "session_expires_at")?),
        holder: owner,
        now,
    }))
}

/// When the term in lease row `l` ends: its own expiry, or the expiry of the session it
/// is held under (`-infinity` if that session row is missing). `lock` reads the session
/// row `FOR SHARE`: needed wherever the answer decides a takeover (see the module docs).
/// Evaluated lazily by `CASE`, so a plain lease never reads the session table.
pub(crate) fn term_end(sessions: &str, lock: bool) -> String {
    let lock = if lock { " FOR SHARE" } else { "" };
    format!(
        "CASE WHEN l.session_id IS NULL THEN l.expires_at ELSE COALESCE(
            (SELECT s.expires_at FROM {sessions} s WHERE s.id = l.session_id{lock}),
            '-infinity'::timestamptz) END"
    )
}

/// Whether lease row `l` is free for a new term, as an acquire decides it: no holder,
/// or its term (`end`, a [`term_end`] that locks) over by the statement's time.
pub(crate) fn term_free(end: &str) -> String {
    format!("l.holder IS NULL OR {end} <= statement_timestamp()")
}

/// Opens a session: `(owner, ttl in microseconds)`. It also forgets up to 100 ended
/// sessions that no lease row names: every statement reads a missing session as ended,
/// so forgetting one changes no answer, and the table stays as small as the sessions
/// alive. (Sessions are only ever named by a lease row while alive, by their owner, so
/// one unnamed once it ended stays unnamed.)
fn open_statement(t: &str, sessions: &str) -> String {
    let latest = latest_change_sql(t);
    format!(
        "WITH forgotten AS (
            DELETE FROM {sessions} s
            WHERE s.id IN (SELECT id FROM {sessions}
                           WHERE expires_at <= statement_timestamp() ORDER BY id LIMIT 100)
              AND s.id NOT IN (SELECT session_id FROM {t} WHERE session_id IS NOT NULL)
        )
        INSERT INTO {sessions} (owner, expires_at, kept_at)
         VALUES ($1, statement_timestamp() + $2 * interval '1 microsecond', statement_timestamp())
         RETURNING id, owner, expires_at, terms_handed, statement_timestamp() AS now,
             {latest}"
    )
}

/// The column `latest_change` of a session's grant, from lease table `t`
/// ([`SessionGrant::latest_change`]): one past the largest `term_txid`, read backwards
/// through its index. A read of changes whose mark (the lowest transaction id running at
/// its snapshot, see `changes_statement`) is at or past it had every term change
/// numbered so far in its snapshot.
fn latest_change_sql(t: &str) -> String {
    format!("(SELECT coalesce(max(term_txid), 0) + 1 FROM {t}) AS latest_change")
}

/// Keeps a live session alive: `(id, ttl in microseconds, registry ttl in microseconds
/// or NULL)`; no row when it has ended. One row version per call, whatever the number
/// of roles held under it. Public only so a test can run the store's statement late.
///
/// It also stamps `kept_at`, which readers of node table `nodes` count as a heartbeat
/// of the node naming the session (see `registry.rs`), and answers `named`: whether the
/// owner's node row names this session (read through the partial index on
/// `tenure_nodes.session_id`; nothing is written there).
///
/// With a registry TTL it answers `peers_lapse_at`, when the first other node lapses
/// unless it is heard from again, and `peers_live`, how many other nodes are live, both
/// judged as the registry's readers judge them (the later of a node's heartbeat and its
/// open session's keep-alive). A node last heard of (by its heartbeat or its session's
/// last keep-alive, even once the session ended: with it the node's liveness falls back
/// to its own heartbeat, which may be long past) less than two TTLs ago still counts, so
/// one that lapsed less than a TTL ago makes the answer past and the caller reads the
/// members. With no other node it is a TTL from now (a node that comes later joins,
/// which is announced). The peers are read in the statement's snapshot, as `RETURNING`
/// would read them. Without a registry TTL (`$3` NULL) both are NULL, and the test of
/// `$3` sits in the lateral's `WHERE`, where PostgreSQL makes it a one-time filter that
/// skips the scan of the nodes (as a join condition it was tested after the scan).
///
/// `held` locks the row before liveness is judged, and the judgement reads
/// `clock_timestamp()` off the locked row: an `UPDATE`'s own `WHERE` is evaluated when
/// the row is read, before the row lock, and a concurrent lock that is merely waited for
/// (a takeover's `FOR SHARE`) leaves no new row version, so nothing would re-check it.
/// Once `held` has the row, every takeover that locked it earlier has committed, and
/// every later one waits for this statement.
#[doc(hidden)]
pub fn keep_alive_statement(t: &str, sessions: &str, nodes: &str) -> String {
    let heard = heard_sql(sessions);
    let latest = latest_change_sql(t);
    let ttl = "$3::bigint * interval '1 microsecond'";
    format!(
        "WITH held AS (
            SELECT id, owner, expires_at FROM {sessions} WHERE id = $1 FOR NO KEY UPDATE
        ),
        kept AS (
            UPDATE {sessions} s
             SET expires_at = GREATEST(s.expires_at, statement_timestamp() + $2 * interval '1 microsecond'),
                 kept_at = GREATEST(s.kept_at, statement_timestamp())
             FROM held
             WHERE s.id = held.id AND held.expires_at > clock_timestamp()
             RETURNING s.id, s.owner, s.expires_at, s.terms_handed, statement_timestamp() AS now,
                 {latest},
                 EXISTS (SELECT 1 FROM {nodes} n WHERE n.session_id = s.id AND n.node_id = s.owner)
                     AS named
        )
        SELECT kept.*, peers.lapse_at AS peers_lapse_at, peers.live AS peers_live
        FROM kept LEFT JOIN LATERAL (
            SELECT COALESCE(min(p.heard), statement_timestamp()) + {ttl} AS lapse_at,
                count(*) FILTER (WHERE p.heard + {ttl} > statement_timestamp()) AS live
            FROM (SELECT {heard} AS heard, GREATEST(n.last_heartbeat,
                    (SELECT k.kept_at FROM {sessions} k
                     WHERE k.id = n.session_id AND k.owner = n.node_id)) AS recent
                  FROM {nodes} n WHERE n.node_id <> kept.owner) p
            WHERE $3::bigint IS NOT NULL AND p.recent + 2 * {ttl} > statement_timestamp()
        ) peers ON true"
    )
}

/// Acquires roles under a session: `(roles, session id, channel)`, one row per
/// distinct role (`roles` sorted, so concurrent batches lock rows in one order). A term
/// it starts advertises no value (`value` NULL), and ends the owner's candidacy for the
/// role (with the role's lapsed ones), as any acquire does (see `queue.rs`).
///
/// `me` is the session if it is live. The upsert starts a new term under it for each
/// role that is free, rewrites a live holder's row unchanged (so the answer names the
/// latest committed term, as in the single-role statement), and skips a role already
/// held under this session: nothing is written then, and `held` reads its token.
/// `held` reads the statement's snapshot, which misses a term this same session started
/// in a concurrent statement that committed after the snapshot; that role's row then
/// has no token, and the caller runs the statement again for it.
fn acquire_statement(t: &str, sessions: &str, c: &str) -> String {
    let end = term_end(sessions, true);
    let free = term_free(&end);
    let notify = notify_sql(
        "$3",
        &began_sql("up.role", "up.fencing_token", "up.holder"),
        "up.role",
    );
    format!(
        "WITH me AS (
            SELECT id, owner, expires_at FROM {sessions}
            WHERE id = $2 AND expires_at > statement_timestamp()
        ),
        wanted AS (SELECT DISTINCT unnest($1::text[]) AS role),
        up AS (
            INSERT INTO {t} AS l (role, holder, fencing_token, expires_at, term_txid, session_id)
            SELECT w.role, me.owner, 1, me.expires_at, txid_current(), me.id
            FROM wanted w CROSS JOIN me ORDER BY w.role
            ON CONFLICT (role) DO UPDATE SET
                holder = CASE WHEN {free} THEN EXCLUDED.holder ELSE l.holder END,
                fencing_token = CASE WHEN {free}
                    THEN l.fencing_token + 1 ELSE l.fencing_token END,
                expires_at = CASE WHEN {free} THEN EXCLUDED.expires_at ELSE {end} END,
                term_txid = CASE WHEN {free} THEN EXCLUDED.term_txid ELSE l.term_txid END,
                session_id = CASE WHEN {free} THEN EXCLUDED.session_id ELSE l.session_id END,
                value = CASE WHEN {free} THEN NULL ELSE l.value END
            WHERE l.session_id IS DISTINCT FROM EXCLUDED.session_id
            RETURNING l.role, l.holder, l.fencing_token, l.expires_at, l.session_id,
                l.term_txid = txid_current() AS new_term
        ),
        held AS (
            SELECT l.role, l.fencing_token FROM {t} l
            WHERE l.role IN (SELECT role FROM wanted) AND l.session_id = $2
                AND l.holder IS NOT NULL AND l.role NOT IN (SELECT role FROM up)
        ),
        joined AS (
            DELETE FROM {c} c
            WHERE c.role IN (SELECT role FROM up WHERE up.new_term)
                AND (c.owner = (SELECT owner FROM me)
                    OR c.expires_at <= statement_timestamp())
        ),
        notified AS (SELECT count(*) AS n FROM (SELECT {notify} FROM up WHERE up.new_term) n)
        SELECT w.role, me.owner, me.expires_at AS session_expires_at,
            up.holder, up.fencing_token, up.expires_at, up.session_id,
            held.fencing_token AS held_token, statement_timestamp() AS now, notified.n AS notified
        FROM wanted w CROSS JOIN notified LEFT JOIN me ON true
            LEFT JOIN up ON up.role = w.role LEFT JOIN held ON held.role = w.role"
    )
}

/// Closes a session: `(id, channel, members channel)`, one row: whether it was live,
/// and how many roles it released (each announced on the channel, as a release is).
/// The roles go first (`ended` waits on `rel`), keeping the lease-then-session lock
/// order, and are locked in role order first (`locked`), as an acquire locks them: an
/// acquire of the session's roles locks each row, then takes a share lock on the
/// holder's session row; a close locking its rows in the table's order would hold some
/// the acquire reaches later while waiting on one it holds, a deadlock PostgreSQL breaks
/// only after `deadlock_timeout` (a second), failing one of the two. They are freed,
/// not handed to a candidate: a release hands over, closing a session ends its terms
/// (as the in-memory store does). A node of node table `nodes` that names the session
/// may go with it (see `registry.rs`): membership waiters are told on the members
/// channel.
fn close_statement(t: &str, sessions: &str, nodes: &str) -> String {
    let notify = notify_sql(
        "$2",
        &ended_sql("rel.role", "rel.fencing_token"),
        "rel.role",
    );
    format!(
        "WITH locked AS (
            SELECT role FROM {t} WHERE session_id = $1 ORDER BY role FOR UPDATE
        ),
        rel AS (
            UPDATE {t} l SET holder = NULL, session_id = NULL, value = NULL,
                expires_at = statement_timestamp(), term_txid = txid_current()
            FROM locked
            WHERE l.role = locked.role AND l.session_id = $1
            RETURNING l.role, l.fencing_token
        ),
        ended AS (
            UPDATE {sessions} SET expires_at = statement_timestamp()
            WHERE id = $1 AND expires_at > statement_timestamp()
                AND (SELECT count(*) FROM rel) >= 0
            RETURNING id
        )
        SELECT (SELECT count(*) FROM ended) AS ended,
            (SELECT count(*) FROM (SELECT {notify} FROM rel) n) AS released,
            (SELECT count(*) FROM (SELECT pg_notify($3, '') FROM ended
                WHERE EXISTS (SELECT 1 FROM {nodes} n WHERE n.session_id = ended.id)) m)
                AS members_told"
    )
}
