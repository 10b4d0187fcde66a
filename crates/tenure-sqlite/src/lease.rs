//! [`SqliteLeaseStore`]: the lease contract on one row per role in a local file.
//!
//! Each call that writes is one `BEGIN IMMEDIATE` transaction: it takes the file's
//! write lock, reads store time (starting a new boot in the file if needed), reads the
//! role's row and decides exactly as the in-memory reference store does. Rows are never
//! deleted; release clears the holder and keeps the token, so the counter survives
//! everything.

use std::path::Path;

use async_trait::async_trait;
use sqlx::sqlite::SqliteConnection;
use tenure::lease::{validate_acquire, validate_name, validate_release};
use tenure::{Error, FencingToken, LeaseInfo, LeaseResult, LeaseStore, Result};
use tokio::time::Instant;

use crate::clock::StoreNow;
use crate::database::{
    column, store_error, token_from_db, token_to_db, SqliteDatabase, SqliteOptions,
};
use crate::BACKEND;

// The statements of the write paths, each run inside one `BEGIN IMMEDIATE` transaction
// after `READ_BOOT`; times are monotonic nanoseconds.

/// Reads a role's row: `holder, token, expires_at` for role `?1`.
const READ_LEASE: &str = "SELECT holder, token, expires_at FROM tenure_leases WHERE role = ?1";
/// Creates the first term of role `?1` for owner `?2`, token 1, expiring at `?3`.
const INSERT_LEASE: &str =
    "INSERT INTO tenure_leases (role, holder, token, expires_at) VALUES (?1, ?2, 1, ?3)";
/// Renews role `?1`'s live term to expire at `?2`.
const RENEW_LEASE: &str = "UPDATE tenure_leases SET expires_at = ?2 WHERE role = ?1";
/// Starts a new term of role `?1`: owner `?2`, token `?3`, expiring at `?4`.
const TAKE_OVER_LEASE: &str =
    "UPDATE tenure_leases SET holder = ?2, token = ?3, expires_at = ?4 WHERE role = ?1";
/// Ends role `?1`'s term at store time `?2`, keeping the token.
const RELEASE_LEASE: &str =
    "UPDATE tenure_leases SET holder = NULL, expires_at = ?2 WHERE role = ?1";

/// The lease row of one role.
struct LeaseRow {
    holder: Option<String>,
    token: i64,
    expires_at: i64,
}

impl LeaseRow {
    fn is_live_term(&self, token: i64, now: i64) -> bool {
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
        })
    })
    .transpose()
}

/// What [`write_lease`] found and did.
#[derive(Debug)]
pub enum LeaseWrite {
    /// `owner` holds term `token` now: a `new_term`, or its live term renewed.
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
/// ending at `expires_at`. The caller commits.
pub async fn write_lease(
    conn: &mut SqliteConnection,
    role: &str,
    owner: &str,
    now: i64,
    expires_at: i64,
) -> Result<LeaseWrite> {
    let (token, new_term) = match read_row(conn, role).await? {
        None => {
            sqlx::query(INSERT_LEASE)
                .bind(role)
                .bind(owner)
                .bind(expires_at)
                .execute(conn)
                .await
                .map_err(store_error("cannot write the lease"))?;
            (1, true)
        }
        Some(row) if now < row.expires_at && row.holder.as_deref() == Some(owner) => {
            sqlx::query(RENEW_LEASE)
                .bind(role)
                .bind(expires_at)
                .execute(conn)
                .await
                .map_err(store_error("cannot renew the lease"))?;
            (row.token, false)
        }
        Some(LeaseRow {
            holder: Some(holder),
            token,
            expires_at: held_until,
        }) if now < held_until => {
            return Ok(LeaseWrite::Refused {
                holder,
                token,
                expires_at: held_until,
            })
        }
        Some(row) => {
            let next = row.token.checked_add(1).ok_or_else(|| {
                Error::store_msg(
                    BACKEND,
                    format!("the token counter of role {role:?} is exhausted"),
                )
            })?;
            sqlx::query(TAKE_OVER_LEASE)
                .bind(role)
                .bind(owner)
                .bind(next)
                .bind(expires_at)
                .execute(conn)
                .await
                .map_err(store_error("cannot write the lease"))?;
            (next, true)
        }
    };
    Ok(LeaseWrite::Written { token, new_term })
}

/// The step of `release` inside an open `BEGIN IMMEDIATE` transaction at store time
/// `now`: ends `owner`'s live term `token` on `role`, keeping the token. Whether it did;
/// the caller commits.
pub async fn release_lease(
    conn: &mut SqliteConnection,
    role: &str,
    owner: &str,
    token: i64,
    now: i64,
) -> Result<bool> {
    match read_row(conn, role).await? {
        Some(row) if row.is_live_term(token, now) && row.holder.as_deref() == Some(owner) => {
            sqlx::query(RELEASE_LEASE)
                .bind(role)
                .bind(now)
                .execute(conn)
                .await
                .map_err(store_error("cannot release the lease"))?;
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// Durable, fenced leases in a SQLite file, shared by every process on the host that
/// opens the same file.
///
/// Store time is the host's monotonic clock under its boot id (see [`SqliteDatabase`]).
/// [`wait_for_change`](LeaseStore::wait_for_change) wakes at once for a release or
/// takeover written through the same [`SqliteDatabase`], and within the polling
/// interval (10 ms by default) for one written by another process.
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

    /// Whether `(role, observed)` is still the live term, on store time.
    async fn is_live_term(&self, role: &str, observed: i64) -> Result<bool> {
        let now = self.db.now()?;
        let row = sqlx::query(
            "SELECT holder, token, expires_at, \
             coalesce((SELECT boot_id FROM tenure_boot WHERE id = 0) = ?2, 0) \
             FROM tenure_leases WHERE role = ?1",
        )
        .bind(role)
        .bind(&now.boot_id)
        .fetch_optional(self.db.pool())
        .await
        .map_err(store_error("cannot read the lease"))?;
        let Some(row) = row else {
            return Ok(false);
        };
        let current = LeaseRow {
            holder: column(&row, 0)?,
            token: column(&row, 1)?,
            expires_at: column(&row, 2)?,
        };
        let this_boot: bool = column(&row, 3)?;
        Ok(this_boot && current.is_live_term(observed, now.mono))
    }

    fn info_from(&self, row: &sqlx::sqlite::SqliteRow, now: &StoreNow) -> Result<LeaseInfo> {
        let role: String = column(row, 0)?;
        let holder: Option<String> = column(row, 1)?;
        let token: i64 = column(row, 2)?;
        let this_boot: bool = column(row, 4)?;
        // Under another boot the time means nothing: the lease ended by now.
        let expires_at: i64 = if this_boot { column(row, 3)? } else { now.mono };
        Ok(LeaseInfo {
            role,
            holder,
            fencing_token: token_from_db(token)?,
            expires_at: now.wall_at(expires_at)?,
            now: now.wall,
        })
    }

    async fn read_leases(&self, role: Option<&str>) -> Result<Vec<LeaseInfo>> {
        let now = self.db.now()?;
        // One statement, so the leases and the boot they belong to come from one snapshot.
        let rows = sqlx::query(
            "SELECT role, holder, token, expires_at, \
             coalesce((SELECT boot_id FROM tenure_boot WHERE id = 0) = ?2, 0) \
             FROM tenure_leases WHERE ?1 IS NULL OR role = ?1 ORDER BY role",
        )
        .bind(role)
        .bind(&now.boot_id)
        .fetch_all(self.db.pool())
        .await
        .map_err(store_error("cannot read leases"))?;
        rows.iter().map(|row| self.info_from(row, &now)).collect()
    }
}

#[async_trait]
impl LeaseStore for SqliteLeaseStore {
    async fn try_acquire_or_renew(
        &self,
        role: &str,
        owner: &str,
        ttl: std::time::Duration,
    ) -> Result<LeaseResult> {
        // Bad input is refused before the store is touched.
        let too_large = || {
            Error::invalid(
                "ttl",
                format!("{ttl:?} is too large for the sqlite store's nanosecond clock (292 years)"),
            )
        };
        validate_acquire(role, owner, ttl, self.min_ttl(), self.db.now()?.wall)?;
        let ttl_nanos = i64::try_from(ttl.as_nanos()).map_err(|_| too_large())?;
        let (_writer, mut tx) = self.db.begin_write().await?;
        let store_now = self.db.write_now(&mut tx).await?;
        let (now, now_time) = (store_now.mono, store_now.wall);
        // Shown as wall now + ttl, which is what `wall_at(expires_at)` gives.
        let expires_time = tenure::lease::validate_ttl(ttl, self.min_ttl(), now_time)?;
        let expires_at = now.checked_add(ttl_nanos).ok_or_else(too_large)?;
        let (token, new_term) = match write_lease(&mut tx, role, owner, now, expires_at).await? {
            LeaseWrite::Written { token, new_term } => (token, new_term),
            LeaseWrite::Refused {
                holder,
                token,
                expires_at: held_until,
            } => {
                // Not acquired. Commit, not roll back: the transaction may have started
                // a new boot, which every later call must see.
                tx.commit()
                    .await
                    .map_err(store_error("cannot commit the lease check"))?;
                return Ok(LeaseResult {
                    acquired: false,
                    fencing_token: token_from_db(token)?,
                    expires_at: store_now.wall_at(held_until)?,
                    holder,
                    now: now_time,
                });
            }
        };
        tx.commit()
            .await
            .map_err(store_error("cannot commit the lease"))?;
        if new_term {
            self.db.signal_change(role);
        }
        Ok(LeaseResult {
            acquired: true,
            fencing_token: token_from_db(token)?,
            expires_at: expires_time,
            holder: owner.to_owned(),
            now: now_time,
        })
    }

    async fn release(&self, role: &str, owner: &str, token: FencingToken) -> Result<bool> {
        validate_release(role, owner)?;
        let Ok(token) = token_to_db(token) else {
            // No such token was ever handed out, so it is not the live term.
            return Ok(false);
        };
        let (_writer, mut tx) = self.db.begin_write().await?;
        let now = self.db.write_now(&mut tx).await?.mono;
        let released = release_lease(&mut tx, role, owner, token, now).await?;
        tx.commit()
            .await
            .map_err(store_error("cannot commit the release"))?;
        if released {
            self.db.signal_change(role);
        }
        Ok(released)
    }

    async fn get(&self, role: &str) -> Result<Option<LeaseInfo>> {
        validate_name("role", role)?;
        Ok(self.read_leases(Some(role)).await?.pop())
    }

    async fn list(&self) -> Result<Vec<LeaseInfo>> {
        self.read_leases(None).await
    }

    async fn wait_for_change(&self, role: &str, observed: FencingToken, deadline: Instant) {
        if validate_name("role", role).is_err() {
            tokio::time::sleep_until(deadline).await;
            return;
        }
        let Ok(observed) = token_to_db(observed) else {
            return;
        };
        let signal = self.db.change_signal(role);
        let poll = self.db.poll_interval();
        loop {
            let notified = signal.notified();
            tokio::pin!(notified);
            // Subscribe before reading, so a change between the read and the wait wakes us.
            notified.as_mut().enable();
            match tokio::time::timeout_at(deadline, self.is_live_term(role, observed)).await {
                Ok(Ok(false)) => return,
                Ok(Ok(true)) => {}
                // A failing store is not a change: keep polling until the deadline
                // rather than returning early in a loop.
                Ok(Err(error)) => {
                    tracing::debug!(role, %error, "cannot poll the lease; retrying");
                }
                Err(_) => return,
            }
            let next = (Instant::now() + poll).min(deadline);
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(next) => {}
            }
            if Instant::now() >= deadline {
                return;
            }
        }
    }
}
