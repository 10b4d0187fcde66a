//! Fenced transactions: the compare-and-reject inside the caller's own transaction.
//!
//! [`PgFence::fence_in_transaction`] locks the resource's fence row (an upsert, so the
//! first writer creates it), rejects a token lower than the highest admitted, and
//! advances it. The row lock is held until the caller's transaction ends, so concurrent
//! writers serialise on it: a stale writer that arrives after a fresh one is rejected,
//! and the caller's writes in that transaction commit only under a current token.
//!
//! A rejection also aborts the caller's transaction (an error is raised inside it), so
//! even a caller that ignores the error and commits writes nothing.
//!
//! [`PgFence::hold_lease_in_transaction`] is the stronger same-database form: it checks
//! that the token is still the live term of the role and takes `FOR SHARE` on the
//! lease row, which blocks any takeover until the caller's transaction ends.
//!
//! Both refuse to run outside READ COMMITTED: under REPEATABLE READ or SERIALIZABLE the
//! check would read a snapshot older than the lock it takes.

use async_trait::async_trait;
use sqlx::{PgConnection, PgPool, Row};
use tenure::lease::validate_name;
use tenure::{Error, FenceStore, FencingToken, Result};

use crate::error::pg_error;
use crate::lease::{token_from_db, token_to_db};
use crate::schema::Schema;

/// Fences kept in `<schema>.tenure_fences`, shared by every process on the database.
///
/// Needs `SELECT, INSERT, UPDATE` on `<schema>.tenure_fences` (and `SELECT, UPDATE` on
/// `<schema>.tenure_leases` for [`hold_lease_in_transaction`](PgFence::hold_lease_in_transaction),
/// since `FOR SHARE` requires it).
#[derive(Clone, Debug)]
pub struct PgFence {
    pool: PgPool,
    admit_sql: String,
    highest_sql: String,
    lease_sql: String,
}

impl PgFence {
    /// Fences over `pool` in `schema`. A fence's highest token is as durable as the
    /// commit that raised it: see [`durable_commit_options`](crate::durable_commit_options).
    pub fn new(pool: PgPool, schema: Schema) -> PgFence {
        let fences = schema.table("tenure_fences");
        let leases = schema.table("tenure_leases");
        PgFence {
            pool,
            admit_sql: format!(
                "INSERT INTO {fences} AS f (resource, highest) VALUES ($1, $2)
                 ON CONFLICT (resource) DO UPDATE SET highest = GREATEST(f.highest, EXCLUDED.highest)
                 RETURNING f.highest, current_setting('transaction_isolation') AS isolation"
            ),
            highest_sql: format!("SELECT highest FROM {fences} WHERE resource = $1"),
            lease_sql: format!(
                "SELECT fencing_token,
                     holder IS NOT NULL AND expires_at > statement_timestamp() AS live,
                     current_setting('transaction_isolation') AS isolation
                 FROM {leases} WHERE role = $1 FOR SHARE"
            ),
        }
    }

    /// Inside the caller's transaction on `conn`: locks `resource`'s fence row, rejects
    /// `token` if it is lower than the highest admitted ([`Error::Fenced`], and the
    /// transaction is aborted), otherwise records it. Do this before the writes it
    /// guards; the lock is held until the transaction commits or rolls back.
    ///
    /// ```no_run
    /// # async fn demo(pool: sqlx::PgPool, fence: tenure_postgres::PgFence, token: tenure::FencingToken) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = pool.begin().await?;
    /// fence.fence_in_transaction(&mut tx, "ledger", token).await?;
    /// sqlx::query("INSERT INTO ledger (entry) VALUES ('paid')").execute(&mut *tx).await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    pub async fn fence_in_transaction(
        &self,
        conn: &mut PgConnection,
        resource: &str,
        token: FencingToken,
    ) -> Result<()> {
        validate_name("resource", resource)?;
        let presented = token_to_db("token", token)?;
        let row = sqlx::query(&self.admit_sql)
            .bind(resource)
            .bind(presented)
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| pg_error("could not lock the fence row", e))?;
        let highest = token_from_db(
            row.try_get("highest")
                .map_err(|e| pg_error("could not decode the fence", e))?,
        )?;
        let isolation: String = row
            .try_get("isolation")
            .map_err(|e| pg_error("could not decode the isolation level", e))?;
        check_isolation(conn, &isolation).await?;
        if token < highest {
            abort_transaction(conn, token, highest).await;
            return Err(Error::Fenced {
                presented: token,
                highest,
            });
        }
        Ok(())
    }

    /// Inside the caller's transaction on `conn`: checks that `token` is still the live
    /// term of `role` and holds `FOR SHARE` on the lease row until the transaction ends,
    /// so no other owner can take the lease before this transaction commits.
    ///
    /// A token that is not the live term is [`Error::Fenced`] (and the transaction is
    /// aborted): `highest` is the role's current token, or `token + 1` when `token`'s
    /// own term has ended (any successor's token is at least that).
    ///
    /// The leader's own renewals also wait for the transaction, so keep it short.
    pub async fn hold_lease_in_transaction(
        &self,
        conn: &mut PgConnection,
        role: &str,
        token: FencingToken,
    ) -> Result<()> {
        validate_name("role", role)?;
        token_to_db("token", token)?;
        let row = sqlx::query(&self.lease_sql)
            .bind(role)
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| pg_error("could not lock the lease row", e))?;
        let Some(row) = row else {
            // No term of this role ever existed: nothing this token could hold.
            let isolation: String =
                sqlx::query_scalar("SELECT current_setting('transaction_isolation')")
                    .fetch_one(&mut *conn)
                    .await
                    .map_err(|e| pg_error("could not read the isolation level", e))?;
            check_isolation(conn, &isolation).await?;
            abort_transaction(conn, token, token.next()).await;
            return Err(Error::Fenced {
                presented: token,
                highest: token.next(),
            });
        };
        let get = |e| pg_error("could not decode the lease", e);
        let current = token_from_db(row.try_get("fencing_token").map_err(get)?)?;
        let live: bool = row.try_get("live").map_err(get)?;
        let isolation: String = row.try_get("isolation").map_err(get)?;
        check_isolation(conn, &isolation).await?;
        if current == token && live {
            return Ok(());
        }
        let highest = if current > token {
            current
        } else {
            token.next()
        };
        abort_transaction(conn, token, highest).await;
        Err(Error::Fenced {
            presented: token,
            highest,
        })
    }
}

async fn check_isolation(conn: &mut PgConnection, isolation: &str) -> Result<()> {
    if isolation == "read committed" {
        return Ok(());
    }
    abort_with(conn, "tenure: fenced transactions need READ COMMITTED").await;
    Err(Error::invalid(
        "transaction",
        format!(
            "runs at {}; fenced transactions need READ COMMITTED, where the locked row is \
             re-read at its latest version",
            isolation.to_uppercase()
        ),
    ))
}

async fn abort_transaction(
    conn: &mut PgConnection,
    presented: FencingToken,
    highest: FencingToken,
) {
    abort_with(
        conn,
        &format!(
            "tenure: fenced: token {presented} is older than the highest admitted token {highest}"
        ),
    )
    .await;
}

/// Raises an error inside the caller's transaction so that it can only roll back: a
/// COMMIT of an aborted transaction is a ROLLBACK. The message is built from numbers and
/// fixed text only, so formatting it into the statement is safe.
async fn abort_with(conn: &mut PgConnection, message: &str) {
    let sql = format!(
        "DO $tenure$ BEGIN RAISE EXCEPTION '{}' USING ERRCODE = 'P0001'; END $tenure$",
        message.replace('\'', "''")
    );
    // The error is the point; anything else (a broken connection) aborts it too.
    let _ = sqlx::query(&sql)
        .persistent(false)
        .execute(&mut *conn)
        .await;
}

#[async_trait]
impl FenceStore for PgFence {
    /// Admits `token` for `resource` in a transaction of its own (the CLI's
    /// `tenure fence`): the same check as [`PgFence::fence_in_transaction`].
    async fn admit(&self, resource: &str, token: FencingToken) -> Result<()> {
        validate_name("resource", resource)?;
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(|e| pg_error("could not begin a transaction", e))?;
        // Boxed with an explicit `Send` bound: without it the compiler cannot prove the
        // borrowed-connection future `Send` for every lifetime (a known HRTB limitation).
        let admitted: std::pin::Pin<Box<dyn std::future::Future<Output = Result<()>> + Send + '_>> =
            Box::pin(self.fence_in_transaction(&mut tx, resource, token));
        admitted.await?;
        tx.commit()
            .await
            .map_err(|e| pg_error("could not commit the fence", e))
    }

    async fn highest(&self, resource: &str) -> Result<Option<FencingToken>> {
        validate_name("resource", resource)?;
        let highest: Option<i64> = sqlx::query_scalar(&self.highest_sql)
            .bind(resource)
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| pg_error("could not read the fence", e))?;
        highest.map(token_from_db).transpose()
    }
}
