//! The write steps of the acquire and release paths: the statements each runs inside
//! one `BEGIN IMMEDIATE` transaction, and the one decision every acquire makes (the
//! same as the in-memory reference store's). A new term ends its holder's candidacy,
//! and ending a term hands it to the next candidate (see `queue.rs`) in the same
//! transaction.

use sqlx::sqlite::SqliteConnection;
use tenure::{Error, Result};

use super::queue;
use crate::database::{column, execute, store_error};
use crate::BACKEND;

// The statements of the write paths, each run inside one `BEGIN IMMEDIATE` transaction
// after `READ_BOOT`; times are monotonic nanoseconds.

/// Reads a role's term: `holder, token, expires_at, session_id` for role `?1`, where
/// `expires_at` is the session's for a term held under one.
const READ_LEASE: &str =
    "SELECT holder, token, expires_at, session_id FROM tenure_terms WHERE role = ?1";
/// Creates the first term of role `?1` for owner `?2`, token 1, expiring at `?3`, under
/// session `?4` (NULL for a plain lease), advertising `?5` (NULL for none).
const INSERT_LEASE: &str =
    "INSERT INTO tenure_leases (role, holder, token, expires_at, session_id, value, value_token) \
     VALUES (?1, ?2, 1, ?3, ?4, ?5, 1)";
/// Renews role `?1`'s live plain term to expire at `?2`.
const RENEW_LEASE: &str = "UPDATE tenure_leases SET expires_at = ?2 WHERE role = ?1";
/// Renews role `?1`'s live term held under a session as a plain lease expiring at `?2`.
const DETACH_LEASE: &str =
    "UPDATE tenure_leases SET expires_at = ?2, session_id = NULL WHERE role = ?1";
/// Starts a new term of role `?1`: owner `?2`, token `?3`, expiring at `?4`, under
/// session `?5` (NULL for a plain lease), advertising `?6` (NULL for none).
const TAKE_OVER_LEASE: &str = "UPDATE tenure_leases \
     SET holder = ?2, token = ?3, expires_at = ?4, session_id = ?5, value = ?6, value_token = ?3 \
     WHERE role = ?1";
/// Ends role `?1`'s term at store time `?2`, keeping the token and dropping the value.
const RELEASE_LEASE: &str = "UPDATE tenure_leases \
     SET holder = NULL, expires_at = ?2, session_id = NULL, value = NULL WHERE role = ?1";

/// The term of one role.
pub(super) struct LeaseRow {
    pub(super) holder: Option<String>,
    pub(super) token: i64,
    /// Its end: its own, or its session's.
    pub(super) expires_at: i64,
    pub(super) session_id: Option<i64>,
}

impl LeaseRow {
    pub(super) fn is_live_term(&self, token: i64, now: i64) -> bool {
        self.holder.is_some() && self.token == token && now < self.expires_at
    }
}

async fn read_row(conn: &mut SqliteConnection, role: &str) -> Result<Option<LeaseRow>> {
    let row = sqlx::query(READ_LEASE)
        .bind(role)
        .fetch_optional(conn)
        .await
        .map_err(store_error("cannot read the lease"))?;
    row.map(|row| {
        Ok(LeaseRow {
            holder: column(&row, 0)?,
            token: column(&row, 1)?,
            expires_at: column(&row, 2)?,
            session_id: column(&row, 3)?,
        })
    })
    .transpose()
}

/// Who takes a term in [`write_term`], and what a live term of its own means to it.
#[derive(Clone, Copy, Debug)]
pub(super) enum Claim<'a> {
    /// `try_acquire_or_renew`: `owner`'s own live term is renewed, as a plain lease
    /// ending at `expires_at` and keeping its value; a new term advertises `value`.
    Lease {
        owner: &'a str,
        expires_at: i64,
        value: Option<&'a str>,
    },
    /// `acquire_in_session`: a live term under `session` is kept as it is; a new term
    /// is `owner`'s under `session`, ending at `expires_at` (the session's), with no
    /// value.
    Session {
        session: i64,
        owner: &'a str,
        expires_at: i64,
    },
}

impl Claim<'_> {
    fn holds(&self, row: &LeaseRow) -> bool {
        match *self {
            Claim::Lease { owner, .. } => row.holder.as_deref() == Some(owner),
            Claim::Session { session, .. } => {
                row.holder.is_some() && row.session_id == Some(session)
            }
        }
    }
}

/// What [`write_lease`] found and did.
#[derive(Debug)]
pub enum LeaseWrite {
    /// `owner` holds term `token` now: a `new_term`, or its live term renewed (kept, under a session).
    Written {
        /// The term's token.
        token: i64,
        /// Whether the term is new (first, or taken over), not renewed.
        new_term: bool,
    },
    /// Another owner's live term; nothing was written.
    Refused {
        /// The live holder.
        holder: String,
        /// Its term's token.
        token: i64,
        /// When its term ends, in store time.
        expires_at: i64,
    },
}

/// The lease step of `try_acquire_or_renew` inside an open `BEGIN IMMEDIATE`
/// transaction at store time `now`: reads the role's row, decides, writes the term
/// ending at `expires_at`, advertising no value. The caller commits.
pub async fn write_lease(
    conn: &mut SqliteConnection,
    role: &str,
    owner: &str,
    now: i64,
    expires_at: i64,
) -> Result<LeaseWrite> {
    write_lease_with_value(conn, role, owner, now, expires_at, None).await
}

/// [`write_lease`] whose new term advertises `value` (already validated); a renewal
/// keeps the value its term began with.
pub(crate) async fn write_lease_with_value(
    conn: &mut SqliteConnection,
    role: &str,
    owner: &str,
    now: i64,
    expires_at: i64,
    value: Option<&str>,
) -> Result<LeaseWrite> {
    let claim = Claim::Lease {
        owner,
        expires_at,
        value,
    };
    write_term(conn, role, now, claim).await
}

/// The one decision of both acquire paths (see [`write_lease`]): reads the role's term,
/// keeps or renews the claimant's own live one, refuses another live one, or starts a
/// new term.
pub(super) async fn write_term(
    conn: &mut SqliteConnection,
    role: &str,
    now: i64,
    claim: Claim<'_>,
) -> Result<LeaseWrite> {
    let (owner, expires_at, session, value) = match claim {
        Claim::Lease {
            owner,
            expires_at,
            value,
        } => (owner, expires_at, None, value),
        Claim::Session {
            session,
            owner,
            expires_at,
        } => (owner, expires_at, Some(session), None),
    };
    let (token, new_term) = match read_row(conn, role).await? {
        None => {
            let insert = sqlx::query(INSERT_LEASE)
                .bind(role)
                .bind(owner)
                .bind(expires_at)
                .bind(session)
                .bind(value);
            execute(&mut *conn, insert, "cannot write the lease").await?;
            queue::sweep(conn, role, owner, now).await?;
            (1, true)
        }
        Some(row) if now < row.expires_at && claim.holds(&row) => {
            if let Claim::Lease { .. } = claim {
                // The holder renews on its own from here: a session's term becomes a
                // plain lease, same token.
                let renew = match row.session_id {
                    None => RENEW_LEASE,
                    Some(_) => DETACH_LEASE,
                };
                let renew = sqlx::query(renew).bind(role).bind(expires_at);
                execute(conn, renew, "cannot renew the lease").await?;
            }
            (row.token, false)
        }
        Some(LeaseRow {
            holder: Some(holder),
            token,
            expires_at: held_until,
            ..
        }) if now < held_until => {
            return Ok(LeaseWrite::Refused {
                holder,
                token,
                expires_at: held_until,
            })
        }
        Some(row) => {
            let next = next_token(role, row.token)?;
            let term = NewTerm {
                owner,
                token: next,
                expires_at,
                session,
                value,
            };
            take_over(conn, role, term).await?;
            queue::sweep(conn, role, owner, now).await?;
            (next, true)
        }
    };
    Ok(LeaseWrite::Written { token, new_term })
}

/// The token after `token`, or a store error once the counter is exhausted.
fn next_token(role: &str, token: i64) -> Result<i64> {
    token.checked_add(1).ok_or_else(|| {
        Error::store_msg(
            BACKEND,
            format!("the token counter of role {role:?} is exhausted"),
        )
    })
}

/// A term [`take_over`] begins.
struct NewTerm<'a> {
    owner: &'a str,
    token: i64,
    expires_at: i64,
    session: Option<i64>,
    value: Option<&'a str>,
}

/// `owner`'s live session opened last at store time `now`: its id and expiry. (Sessions
/// of an earlier boot are deleted when the file is opened under a new one.)
async fn newest_live_session(
    conn: &mut SqliteConnection,
    owner: &str,
    now: i64,
) -> Result<Option<(i64, i64)>> {
    let row = sqlx::query(
        "SELECT id, expires_at FROM tenure_sessions WHERE owner = ?1 AND expires_at > ?2 \
         ORDER BY id DESC LIMIT 1",
    )
    .bind(owner)
    .bind(now)
    .fetch_optional(&mut *conn)
    .await
    .map_err(store_error("cannot read the sessions"))?;
    row.map(|row| Ok((column(&row, 0)?, column(&row, 1)?)))
        .transpose()
}

/// Begins `term` on `role`'s row, replacing the term there.
async fn take_over(conn: &mut SqliteConnection, role: &str, term: NewTerm<'_>) -> Result<()> {
    let write = sqlx::query(TAKE_OVER_LEASE)
        .bind(role)
        .bind(term.owner)
        .bind(term.token)
        .bind(term.expires_at)
        .bind(term.session)
        .bind(term.value);
    execute(conn, write, "cannot write the lease").await
}

/// The step of `release` inside an open `BEGIN IMMEDIATE` transaction at store time
/// `now`: ends `owner`'s live term `token` on `role` and hands the role to the oldest
/// live candidate (token + 1), or frees it keeping the token. Whether it did; the
/// caller commits.
pub async fn release_lease(
    conn: &mut SqliteConnection,
    role: &str,
    owner: &str,
    token: i64,
    now: i64,
) -> Result<bool> {
    let ended = end_term(conn, role, owner, token, now, Successor::OldestOrFree).await?;
    Ok(ended != Ended::Not)
}

/// What [`end_term`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Ended {
    /// Nothing: the term was not live, or the named candidate was not there.
    Not,
    /// The term ended and the role is free.
    Freed,
    /// The term ended and this candidate's began.
    HandedTo(String),
}

/// Counts one more term handed to session `?1`.
const COUNT_TERM_HANDED: &str =
    "UPDATE tenure_sessions SET terms_handed = terms_handed + 1 WHERE id = ?1";

/// Whom [`end_term`] hands the role to.
#[derive(Clone, Copy, Debug)]
pub(super) enum Successor<'a> {
    /// `release`: the oldest live candidate, or nobody (the role is freed).
    OldestOrFree,
    /// `hand_over`: this live candidate (the oldest for `None`), or nothing changes.
    Candidate(Option<&'a str>),
    /// `hand_to_session`: the newest live session of this owner, or as
    /// [`Successor::OldestOrFree`] when it has none.
    SessionOf(&'a str),
}

/// Ends `owner`'s live term `token` on `role` at store time `now` and, in the same
/// transaction, begins the next candidate's as `successor` says: token + 1, holder the
/// candidate, its queued value, ending when its candidacy would have lapsed; the
/// candidacy (and the role's lapsed ones) is deleted. Whether the term ended, and to
/// whom: it never ends when it is not live, nor for [`Successor::Candidate`] without
/// such a candidate (then nothing is written).
pub(super) async fn end_term(
    conn: &mut SqliteConnection,
    role: &str,
    owner: &str,
    token: i64,
    now: i64,
    successor: Successor<'_>,
) -> Result<Ended> {
    let row = match read_row(conn, role).await? {
        Some(row) if row.is_live_term(token, now) && row.holder.as_deref() == Some(owner) => row,
        _ => return Ok(Ended::Not),
    };
    let named = match successor {
        Successor::OldestOrFree => None,
        Successor::Candidate(named) => named,
        Successor::SessionOf(to) => {
            if let Some((session, expires_at)) = newest_live_session(conn, to, now).await? {
                let term = NewTerm {
                    owner: to,
                    token: next_token(role, row.token)?,
                    expires_at,
                    session: Some(session),
                    value: None,
                };
                take_over(conn, role, term).await?;
                // A term begun for a queued owner ends its candidacy, as every acquire.
                queue::sweep(conn, role, to, now).await?;
                // Told by the session's keep-alives (`SessionGrant::terms_handed`).
                let count = sqlx::query(COUNT_TERM_HANDED).bind(session);
                execute(
                    &mut *conn,
                    count,
                    "cannot count the term handed to the session",
                )
                .await?;
                return Ok(Ended::HandedTo(to.to_owned()));
            }
            None
        }
    };
    match (queue::next(conn, role, named, now).await?, successor) {
        (Some(next), _) => {
            let term = NewTerm {
                owner: &next.owner,
                token: next_token(role, row.token)?,
                expires_at: next.expires_at,
                session: None,
                value: next.value.as_deref(),
            };
            take_over(conn, role, term).await?;
            queue::sweep(conn, role, &next.owner, now).await?;
            Ok(Ended::HandedTo(next.owner))
        }
        (None, Successor::OldestOrFree | Successor::SessionOf(_)) => {
            let release_lease = sqlx::query(RELEASE_LEASE).bind(role).bind(now);
            execute(&mut *conn, release_lease, "cannot release the lease").await?;
            // Any candidates left have lapsed.
            queue::sweep(conn, role, owner, now).await?;
            Ok(Ended::Freed)
        }
        (None, Successor::Candidate(_)) => Ok(Ended::Not),
    }
}
