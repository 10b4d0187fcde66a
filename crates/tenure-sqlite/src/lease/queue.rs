//! The queue of candidates in the file (`tenure_candidates`, see the schema): the steps
//! that queue, withdraw, and take the next candidate, each run inside the caller's
//! `BEGIN IMMEDIATE` transaction at store time `now` (see
//! [`LeaseStore::try_acquire_or_queue`](tenure::LeaseStore::try_acquire_or_queue)).
//!
//! A candidacy's place is `seq`: joining takes the role's largest plus one, so order
//! among the role's candidates is arrival order, and a refresh of a live candidacy
//! leaves it alone. Lapsed candidacies are swept when a contender joins and when a term
//! begins or ends, so contenders that died leave no rows behind; one that lapsed is
//! never taken meanwhile (every read asks for `expires_at > now`).

use sqlx::sqlite::SqliteConnection;
use tenure::Result;

use crate::database::{column, execute, store_error};

/// Refreshes the live candidacy of owner `?2` for role `?1` at store time `?5`: expiry
/// `?3`, value `?4`; its place is kept.
const REFRESH: &str = "UPDATE tenure_candidates SET expires_at = ?3, value = ?4 \
     WHERE role = ?1 AND owner = ?2 AND expires_at > ?5";
/// Queues owner `?2` for role `?1` at the back: expiry `?3`, value `?4`.
const JOIN: &str = "INSERT INTO tenure_candidates (role, owner, seq, expires_at, value) \
     VALUES (?1, ?2, \
         (SELECT coalesce(max(seq), 0) + 1 FROM tenure_candidates WHERE role = ?1), ?3, ?4)";
/// Deletes owner `?2`'s candidacy for role `?1` and every one of the role that lapsed
/// by store time `?3`.
const LEAVE: &str = "DELETE FROM tenure_candidates \
     WHERE role = ?1 AND (owner = ?2 OR expires_at <= ?3)";
/// Withdraws owner `?2` from role `?1`: when its candidacy would have lapsed.
const WITHDRAW: &str =
    "DELETE FROM tenure_candidates WHERE role = ?1 AND owner = ?2 RETURNING expires_at";
/// The oldest candidate of role `?1` live at store time `?2` (only owner `?3` when it is
/// not NULL): `owner, expires_at, value`.
const NEXT: &str = "SELECT owner, expires_at, value FROM tenure_candidates \
     WHERE role = ?1 AND expires_at > ?2 AND (?3 IS NULL OR owner = ?3) \
     ORDER BY seq LIMIT 1";

/// A candidate taken from the queue.
#[derive(Debug)]
pub(super) struct Candidate {
    pub(super) owner: String,
    /// When its candidacy would have lapsed: its term ends then.
    pub(super) expires_at: i64,
    pub(super) value: Option<String>,
}

/// Queues `owner` for `role` until `expires_at` with `value`, keeping the place of a
/// live candidacy; a lapsed one (the caller's too) is swept and the caller joins at
/// the back.
pub(super) async fn enqueue(
    conn: &mut SqliteConnection,
    role: &str,
    owner: &str,
    expires_at: i64,
    value: Option<&str>,
    now: i64,
) -> Result<()> {
    let refreshed = sqlx::query(REFRESH)
        .bind(role)
        .bind(owner)
        .bind(expires_at)
        .bind(value)
        .bind(now)
        .execute(&mut *conn)
        .await
        .map_err(store_error("cannot refresh the candidacy"))?
        .rows_affected();
    if refreshed > 0 {
        return Ok(());
    }
    sweep(conn, role, owner, now).await?;
    let join = sqlx::query(JOIN)
        .bind(role)
        .bind(owner)
        .bind(expires_at)
        .bind(value);
    execute(conn, join, "cannot queue the candidate").await
}

/// Ends `owner`'s candidacy for `role` (its term began) and sweeps the role's lapsed
/// ones.
pub(super) async fn sweep(
    conn: &mut SqliteConnection,
    role: &str,
    owner: &str,
    now: i64,
) -> Result<()> {
    let leave = sqlx::query(LEAVE).bind(role).bind(owner).bind(now);
    execute(conn, leave, "cannot leave the queue").await
}

/// Removes `owner`'s candidacy for `role`; whether it was live.
pub(super) async fn withdraw(
    conn: &mut SqliteConnection,
    role: &str,
    owner: &str,
    now: i64,
) -> Result<bool> {
    let lapses: Option<i64> = sqlx::query_scalar(WITHDRAW)
        .bind(role)
        .bind(owner)
        .fetch_optional(conn)
        .await
        .map_err(store_error("cannot withdraw the candidacy"))?;
    Ok(lapses.is_some_and(|at| now < at))
}

/// The oldest live candidate of `role` (`successor` only, when given), left in the
/// queue: the caller takes it with [`sweep`] once its term is written.
pub(super) async fn next(
    conn: &mut SqliteConnection,
    role: &str,
    successor: Option<&str>,
    now: i64,
) -> Result<Option<Candidate>> {
    let row = sqlx::query(NEXT)
        .bind(role)
        .bind(now)
        .bind(successor)
        .fetch_optional(conn)
        .await
        .map_err(store_error("cannot read the queue"))?;
    row.map(|row| {
        Ok(Candidate {
            owner: column(&row, 0)?,
            expires_at: column(&row, 1)?,
            value: column(&row, 2)?,
        })
    })
    .transpose()
}
