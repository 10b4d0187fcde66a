//! The lease table's own statements: acquire or renew, release, and the read of a
//! prefix's changes (the queue's are in `queue.rs`, the session's in `session.rs`).

use super::*;

/// The acquire-or-renew statement on lease table `t` (a quoted, qualified name): one
/// upsert deciding renew / acquire / refuse on `statement_timestamp()` and notifying on a
/// new term. A renewal never moves the expiry back: a statement that waited after it
/// arrived (behind a lock, on a starved backend) carries an older timestamp than a
/// renewal that already committed, and the holder's deadline follows the later one.
///
/// A role held under a session (`session_id` set) is judged by the session's expiry
/// (`sessions`, the session table), read only for such a role; any acquire by the
/// holder makes it a plain lease again. A new term ends its holder's candidacy in
/// `candidates` (see `queue.rs`). Public only so the benchmark issues exactly the
/// store's statement.
///
/// This is the statement of a call advertising no value; see [`acquire_statement_with`].
#[doc(hidden)]
pub fn acquire_statement(t: &str, sessions: &str, candidates: &str) -> String {
    acquire_statement_with(t, sessions, candidates, "NULL", false)
}

/// [`acquire_statement`] whose new term advertises `value`: an SQL expression, `NULL` or
/// a parameter. The value and `value_token` (the new token) are written only when a
/// term starts; a renewal or a refusal keeps them. With `queue`, a caller refused by
/// another live holder is also queued as a candidate with value `$5` (see `queue.rs`).
pub(super) fn acquire_statement_with(
    t: &str,
    sessions: &str,
    candidates: &str,
    value: &str,
    queue: bool,
) -> String {
    let end = session::term_end(sessions, true);
    let free = session::term_free(&end);
    let candidacy = queue::acquire_ctes(candidates, queue);
    let notify = notify_sql(
        "$4",
        &began_sql("$1", "up.fencing_token", "up.holder"),
        "$1",
    );
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
            ){candidacy}
            SELECT up.holder, up.fencing_token, up.expires_at, statement_timestamp() AS now,
                (SELECT count(*) FROM (SELECT {notify} FROM up WHERE up.new_term) n) AS notified
            FROM up"
    )
}

/// The statement of [`LeaseStore::list_prefix_changes`] on lease table `t` and session
/// table `sessions`, selecting `columns` of a lease (those `lease_info` decodes, over
/// `{t} l LEFT JOIN {sessions} s`): `($1 prefix, $2 mark or NULL, $3 session ids)`.
/// Rows of `kind` 0 are leases (with `session_id`), 1 the sessions asked about that
/// exist (`session_id`, `left_us` microseconds left), and one of kind 2 the mark
/// (`mark`).
///
/// Every statement that begins or ends a term sets the row's `term_txid` to its
/// transaction's id (`txid_current()`), and the mark is the lowest transaction id still
/// running when this statement's snapshot was taken (`pg_snapshot_xmin`): every
/// transaction below it had finished and is in this read, so the next read, of
/// `term_txid >= mark`, misses none that commits later, out of id order. A long
/// transaction elsewhere in the database holds the mark back, and reads return more
/// (never less) meanwhile. Held leases of their own (no session) are read every time:
/// their renewals change no term. Each part has its own index (`schema.rs`).
pub(super) fn changes_statement(t: &str, sessions: &str, columns: &str) -> String {
    format!(
        "SELECT 0 AS kind, {columns}, l.session_id, NULL::bigint AS left_us, NULL::bigint AS mark
         FROM {t} l LEFT JOIN {sessions} s ON s.id = l.session_id
         WHERE starts_with(l.role, $1) AND ($2::bigint IS NULL OR (l.term_txid >= $2
             AND NOT (l.session_id IS NULL AND l.holder IS NOT NULL)))
         UNION ALL
         SELECT 0, {columns}, l.session_id, NULL, NULL
         FROM {t} l LEFT JOIN {sessions} s ON s.id = l.session_id
         WHERE $2::bigint IS NOT NULL AND l.session_id IS NULL AND l.holder IS NOT NULL
             AND starts_with(l.role, $1)
         UNION ALL
         SELECT 1, NULL, NULL, NULL, NULL, NULL, NULL, s.id,
             floor(extract(epoch FROM s.expires_at - statement_timestamp()) * 1000000)::bigint,
             NULL
         FROM {sessions} s WHERE s.id = ANY($3::bigint[])
         UNION ALL
         SELECT 2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
             pg_snapshot_xmin(pg_current_snapshot())::text::bigint"
    )
}

/// The release statement on lease table `t`; see [`acquire_statement`] and
/// `queue::end_term_statement`: it ends the live term `($1, $2, $3)` and, in the same
/// step, begins the oldest live candidate's or frees the role, notifying `$4`.
#[doc(hidden)]
pub fn release_statement(t: &str, sessions: &str, candidates: &str) -> String {
    queue::end_term_statement(t, sessions, candidates, Successor::OldestOrFree)
}
