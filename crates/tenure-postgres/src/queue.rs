//! The queue of candidates on PostgreSQL: the `tenure_candidates` table and the
//! statements that read and write it (see
//! [`LeaseStore::try_acquire_or_queue`](tenure::LeaseStore::try_acquire_or_queue)).
//!
//! A candidacy is one row keyed `(role, owner)`: `seq`, its place in the queue, and
//! `expires_at` (on the database clock, as a lease's), with the `value` the candidate's
//! term will advertise. `seq` is the `txid_current()` of the statement that queued it:
//! transaction ids only grow, every queueing statement writes (so has one), and no two
//! statements share one, so it is an arrival order with no sequence object to create,
//! grant or migrate. A refresh of a live candidacy keeps `seq` (the place); one that
//! lapsed takes the refreshing statement's, joining at the back.
//!
//! Every statement here is one autocommit statement, as the lease statements are:
//! - **queue** is the acquire-or-renew upsert plus an upsert of the caller's candidacy
//!   when another owner holds the live term (and, when the caller joins, a sweep of the
//!   role's lapsed candidacies, so crashed contenders leave no rows behind);
//! - **release / hand over** lock the lease row, then the oldest live candidate (the
//!   named one for a chosen successor), and begin its term in the same `UPDATE` that
//!   ends the caller's, deleting the candidacy (and the lapsed ones);
//! - **any new term** (an acquire, one in a session) deletes its holder's candidacy;
//! - **withdraw** deletes it.
//!
//! **Locks.** Every statement that touches both tables locks the lease row first and the
//! candidate rows after it; withdraw locks one candidate row and nothing else. So no two
//! of them wait on each other in a cycle. The handover locks its candidate
//! (`FOR UPDATE`) rather than reading it from the statement's snapshot: a withdrawal
//! that commits while the release waits for the lease row is then seen (the row is
//! gone, the next candidate is taken), and one that comes later waits and finds the
//! candidacy already turned into a term (the elector's `leave_queue` then releases it).
//!
//! Every statement that begins or ends a term notifies the lease channel with the new
//! state (see `succession.rs`). Candidacies are as durable as the commit, like terms
//! (`synchronous_commit = on`; see the crate docs).

use crate::session;
use crate::succession::{began_in_session_sql, began_sql, ended_sql, notify_sql};

/// Creates the candidates table `c` (a quoted, qualified name), for `migrate`. The
/// primary key is also the index every statement reads it by: a role's candidates
/// are few, so picking the oldest sorts them rather than keeping a second index that
/// every refresh would have to update.
pub(crate) fn create_table(c: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {c} (
            role text NOT NULL,
            owner text NOT NULL,
            seq bigint NOT NULL,
            expires_at timestamptz NOT NULL,
            value text,
            PRIMARY KEY (role, owner)
        )"
    )
}

/// The CTEs an acquire-or-renew statement adds after `up` (the lease upsert returning
/// `holder` and `new_term`): a new term ends the caller's candidacy (and sweeps the
/// role's lapsed ones); with `queue`, a caller refused by another live holder is
/// queued until `now + $3` microseconds with value `$5`. Each starts with a comma.
pub(crate) fn acquire_ctes(c: &str, queue: bool) -> String {
    let mut ctes = format!(
        ",
        joined AS (
            DELETE FROM {c} c
            WHERE c.role = $1 AND (c.owner = $2 OR c.expires_at <= statement_timestamp())
                AND EXISTS (SELECT 1 FROM up WHERE up.new_term)
        )"
    );
    if queue {
        ctes.push_str(&format!(
            ",
        queued AS (
            INSERT INTO {c} AS c (role, owner, seq, expires_at, value)
            SELECT $1, $2, txid_current(),
                statement_timestamp() + $3 * interval '1 microsecond', $5
            FROM up WHERE up.holder <> $2
            ON CONFLICT (role, owner) DO UPDATE SET
                seq = CASE WHEN c.expires_at > statement_timestamp()
                    THEN c.seq ELSE EXCLUDED.seq END,
                expires_at = EXCLUDED.expires_at,
                value = EXCLUDED.value
            RETURNING c.seq = txid_current() AS joined
        ),
        swept AS (
            DELETE FROM {c} c
            WHERE c.role = $1 AND c.owner <> $2 AND c.expires_at <= statement_timestamp()
                AND EXISTS (SELECT 1 FROM queued WHERE queued.joined)
        )"
        ));
    }
    ctes
}

/// Whom a statement ending a term hands the role to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Successor {
    /// [`release`](tenure::LeaseStore::release): the oldest live candidate, or nobody
    /// (the role is freed).
    OldestOrFree,
    /// [`hand_over`](tenure::LeaseStore::hand_over) with no name: the oldest live
    /// candidate, or nothing changes.
    Oldest,
    /// `hand_over` to the live candidate `$5`, or nothing changes.
    Named,
    /// [`hand_to_session`](tenure::LeaseStore::hand_to_session): the newest live
    /// session of owner `$5`, or as [`Successor::OldestOrFree`] when it has none.
    SessionOf,
}

/// The statement ending the live term `($1 role, $2 owner, $3 token)` and handing the
/// role as `successor` says, notifying `$4` (and naming the candidate or session owner
/// `$5` for [`Successor::Named`] and [`Successor::SessionOf`]). One row: `ended`, 1 when
/// the term ended, else 0.
///
/// A role held under a session is released alone (the session goes on); its expiry is
/// read without locking the session row, since a release decides no takeover and
/// locking the session before the lease row would invert the lock order of closing a
/// session. `held` locks the lease row before `next` locks a candidate (see the module
/// docs); `next` is the oldest by `seq` whose candidacy is live.
///
/// For [`Successor::SessionOf`], `to_session` reads (without locking, as an acquire
/// under a session reads its own) the newest live session of `$5`, and `next` is only
/// looked for when there is none. A session closed while this runs leaves the row
/// naming a session that is gone, which every statement reads as a term that ended. The
/// notification names the session, so the member it was handed to starts on the push
/// alone, and the session counts it (`terms_handed`, told by its keep-alives), so a
/// member that did not wait on the role still hears of it. The session row is locked
/// after the lease row, as closing a session locks them (its own lease rows, then its
/// row).
pub(crate) fn end_term_statement(t: &str, sessions: &str, c: &str, successor: Successor) -> String {
    let end = session::term_end(sessions, false);
    let (named, join) = match successor {
        Successor::OldestOrFree | Successor::SessionOf => ("", "LEFT JOIN"),
        Successor::Oldest => ("", "JOIN"),
        Successor::Named => (" AND c.owner = $5", "JOIN"),
    };
    // What the new term is taken from: the candidate `next`, or first the session `ts`.
    let (to_session, unless_session, owner, expires_at, session_id, from, taken) = match successor {
        Successor::SessionOf => (
            format!(
                "
        to_session AS MATERIALIZED (
            SELECT s.id, s.owner, s.expires_at FROM {sessions} s
            WHERE s.owner = $5 AND s.expires_at > statement_timestamp()
                AND EXISTS (SELECT 1 FROM held)
            ORDER BY s.id DESC LIMIT 1
        ),"
            ),
            " AND NOT EXISTS (SELECT 1 FROM to_session)",
            "COALESCE(ts.owner, next.owner)",
            "COALESCE(ts.expires_at, next.expires_at, statement_timestamp())",
            "ts.id",
            format!("held LEFT JOIN to_session ts ON true {join} next ON true"),
            "COALESCE((SELECT owner FROM to_session), (SELECT owner FROM next))",
        ),
        _ => (
            String::new(),
            "",
            "next.owner",
            "COALESCE(next.expires_at, statement_timestamp())",
            "NULL",
            format!("held {join} next ON true"),
            "(SELECT owner FROM next)",
        ),
    };
    let payload = format!(
        "CASE WHEN rel.holder IS NULL THEN {} WHEN rel.session_id IS NULL THEN {} ELSE {} END",
        ended_sql("$1", "rel.fencing_token"),
        began_sql("$1", "rel.fencing_token", "rel.holder"),
        began_in_session_sql("$1", "rel.fencing_token", "rel.session_id", "rel.holder")
    );
    let notify = notify_sql("$4", &payload, "$1");
    let counted = match successor {
        Successor::SessionOf => format!(
            "
        counted AS (
            UPDATE {sessions} s SET terms_handed = s.terms_handed + 1
            FROM rel WHERE s.id = rel.session_id
        ),"
        ),
        _ => String::new(),
    };
    format!(
        "WITH held AS MATERIALIZED (
            SELECT l.role FROM {t} l
            WHERE l.role = $1 AND l.holder = $2 AND l.fencing_token = $3
                AND {end} > statement_timestamp()
            FOR NO KEY UPDATE OF l
        ),{to_session}
        next AS MATERIALIZED (
            SELECT c.owner, c.expires_at, c.value FROM {c} c
            WHERE c.role = $1 AND c.expires_at > statement_timestamp(){named}
                AND EXISTS (SELECT 1 FROM held){unless_session}
            ORDER BY c.seq LIMIT 1
            FOR UPDATE OF c
        ),
        rel AS (
            UPDATE {t} AS l SET
                holder = {owner},
                fencing_token = CASE WHEN {owner} IS NULL
                    THEN l.fencing_token ELSE l.fencing_token + 1 END,
                expires_at = {expires_at},
                session_id = {session_id},
                value = next.value,
                value_token = CASE WHEN {owner} IS NULL
                    THEN l.value_token ELSE l.fencing_token + 1 END,
                term_txid = txid_current()
            FROM {from}
            WHERE l.role = held.role
            RETURNING l.holder, l.fencing_token, l.session_id
        ),
{counted}
        gone AS (
            DELETE FROM {c} c
            WHERE c.role = $1 AND EXISTS (SELECT 1 FROM rel)
                AND (c.owner = {taken}
                    OR c.expires_at <= statement_timestamp())
        )
        SELECT count(*) AS ended FROM (SELECT {notify} FROM rel) n"
    )
}

/// Withdraws `($1 role, $2 owner)`: at most one row, `live`, whether the candidacy
/// was live when it was deleted.
pub(crate) fn withdraw_statement(c: &str) -> String {
    format!(
        "DELETE FROM {c} WHERE role = $1 AND owner = $2
         RETURNING expires_at > statement_timestamp() AS live"
    )
}
