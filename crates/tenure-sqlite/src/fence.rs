//! Fencing downstream writes: the token check inside the caller's own transaction.
//!
//! A fencing token protects a write only where the write is checked against it. Here
//! the check is one upsert on the resource's row of `tenure_fences`, run inside the
//! transaction that carries the caller's writes: a stale token makes the call fail,
//! the caller rolls back, and nothing it wrote commits. SQLite has one writer at a
//! time, so a stale and a fresh writer serialise on the file's write lock.

use async_trait::async_trait;
use sqlx::sqlite::SqliteConnection;
use tenure::lease::validate_name;
use tenure::{Error, FenceStore, FencingToken, Result};

use crate::database::{store_error, token_from_db, token_to_db, SqliteDatabase};

/// Admits `token` for `resource` inside the caller's transaction, or rejects it.
///
/// If `token` is at least the highest token admitted for `resource` it becomes the
/// highest and the call returns `Ok(())`; the caller's writes in the same transaction
/// then commit only under a current token. A lower token is
/// [`Error::Fenced`]`{ presented, highest }`: roll the transaction back (dropping it
/// does). Pass a transaction begun with [`SqliteDatabase::begin_immediate`] (or fence
/// before any read in a deferred one), so the check and the writes hold the write
/// lock from the start.
///
/// The database must have tenure's schema ([`SqliteDatabase::open`] or
/// [`create_schema`](crate::create_schema)).
///
/// # Examples
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use tenure::{Error, FencingToken};
/// use tenure_sqlite::{fence_in_transaction, SqliteDatabase};
///
/// let dir = tempfile::tempdir().unwrap();
/// let db = SqliteDatabase::open(dir.path().join("app.db")).await?;
/// sqlx::query("CREATE TABLE ledger (entry TEXT)").execute(db.pool()).await.unwrap();
///
/// let mut tx = db.begin_immediate().await?;
/// fence_in_transaction(&mut tx, "ledger", FencingToken::from(7)).await?;
/// sqlx::query("INSERT INTO ledger VALUES ('paid')").execute(&mut *tx).await.unwrap();
/// tx.commit().await.unwrap();
///
/// let mut stale = db.begin_immediate().await?;
/// let refused = fence_in_transaction(&mut stale, "ledger", FencingToken::from(6)).await;
/// assert!(matches!(refused, Err(Error::Fenced { .. })));
/// # Ok::<(), tenure::Error>(())
/// # }).unwrap();
/// ```
pub async fn fence_in_transaction(
    conn: &mut SqliteConnection,
    resource: &str,
    token: FencingToken,
) -> Result<()> {
    validate_name("resource", resource)?;
    let presented = token_to_db(token)?;
    // The write comes first: it takes the write lock (when the transaction does not
    // hold it yet) before anything is read, and leaves the row unchanged when refused.
    let highest: i64 = sqlx::query_scalar(
        "INSERT INTO tenure_fences (resource, highest) VALUES (?1, ?2) \
         ON CONFLICT (resource) DO UPDATE SET highest = max(highest, excluded.highest) \
         RETURNING highest",
    )
    .bind(resource)
    .bind(presented)
    .fetch_one(conn)
    .await
    .map_err(|e| {
        let doing = if e.to_string().contains("no such table") {
            "cannot check the fence: the tenure_fences table is missing \
             (open the database with SqliteDatabase::open or run create_schema)"
        } else {
            "cannot check the fence"
        };
        store_error(doing)(e)
    })?;
    if highest > presented {
        return Err(Error::Fenced {
            presented: token,
            highest: token_from_db(highest)?,
        });
    }
    Ok(())
}

/// The fence table as a [`FenceStore`]: each `admit` is its own `BEGIN IMMEDIATE`
/// transaction. For writes of your own, use [`fence_in_transaction`] instead, so the
/// check and the write commit together.
#[derive(Clone, Debug)]
pub struct SqliteFence {
    db: SqliteDatabase,
}

impl SqliteFence {
    /// The fence of an opened database.
    pub fn new(db: &SqliteDatabase) -> Self {
        SqliteFence { db: db.clone() }
    }

    /// Admits `token` for `resource` if it is at least the highest admitted so far and
    /// records it; otherwise [`Error::Fenced`].
    pub async fn admit(&self, resource: &str, token: FencingToken) -> Result<()> {
        validate_name("resource", resource)?;
        token_to_db(token)?;
        let (_writer, mut tx) = self.db.begin_write().await?;
        fence_in_transaction(&mut tx, resource, token).await?;
        tx.commit()
            .await
            .map_err(store_error("cannot commit the fence"))
    }

    /// The highest token admitted for `resource`, if any.
    pub async fn highest(&self, resource: &str) -> Result<Option<FencingToken>> {
        validate_name("resource", resource)?;
        self.db.check_file()?;
        let highest: Option<i64> =
            sqlx::query_scalar("SELECT highest FROM tenure_fences WHERE resource = ?1")
                .bind(resource)
                .fetch_optional(self.db.pool())
                .await
                .map_err(store_error("cannot read the fence"))?;
        highest.map(token_from_db).transpose()
    }
}

#[async_trait]
impl FenceStore for SqliteFence {
    async fn admit(&self, resource: &str, token: FencingToken) -> Result<()> {
        SqliteFence::admit(self, resource, token).await
    }

    async fn highest(&self, resource: &str) -> Result<Option<FencingToken>> {
        SqliteFence::highest(self, resource).await
    }
}
