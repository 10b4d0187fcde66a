//! Fenced transactions on a real PostgreSQL server: a stale token writes nothing, racing
//! writers serialise on the fence row, a transaction holding the live lease blocks a
//! takeover, and stricter isolation levels are refused.

mod common;

use std::time::{Duration, Instant};

use sqlx::PgPool;
use tenure::{Error, FenceStore, FencingToken};
use tenure_postgres::{PgFence, Schema};
use tenure_testkit::MustAnswer;

async fn setup(app: &str) -> (PgPool, Schema) {
    common::migrated_with(app, 8).await
}

/// A fresh schema's pool and fence, and a table `ledger` of `columns` in that schema
/// (returned by its qualified name) for fenced transactions to write.
async fn with_ledger(app: &str, columns: &str) -> (PgPool, PgFence, String) {
    let (pool, schema) = setup(app).await;
    let fence = PgFence::new(pool.clone(), schema.clone());
    let ledger = format!("\"{}\".ledger", schema.name());
    sqlx::query(&format!("CREATE TABLE {ledger} ({columns})"))
        .execute(&pool)
        .await
        .unwrap();
    (pool, fence, ledger)
}

/// A fresh token's fenced transaction commits; a stale token's is rejected with
/// `Fenced`, and even committing it afterwards writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_transaction_stale_writes_nothing() {
    let (pool, fence, ledger) = with_ledger("fence", "token bigint, note text").await;

    let mut tx = pool.begin().await.unwrap();
    fence
        .fence_in_transaction(&mut tx, "ledger", FencingToken::from(5))
        .await
        .unwrap();
    sqlx::query(&format!("INSERT INTO {ledger} VALUES (5, 'fresh')"))
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    // A term writes many times: the same token is admitted again.
    fence.admit("ledger", FencingToken::from(5)).await.unwrap();

    let mut tx = pool.begin().await.unwrap();
    sqlx::query(&format!(
        "INSERT INTO {ledger} VALUES (4, 'stale, written before the check')"
    ))
    .execute(&mut *tx)
    .await
    .unwrap();
    let stale = fence
        .fence_in_transaction(&mut tx, "ledger", FencingToken::from(4))
        .await;
    assert!(
        matches!(stale, Err(Error::Fenced { presented, highest }) if presented.get() == 4 && highest.get() == 5),
        "{stale:?}"
    );
    // A careless caller commits anyway: the transaction was aborted, so nothing lands.
    let _ = sqlx::query(&format!("INSERT INTO {ledger} VALUES (4, 'stale, after')"))
        .execute(&mut *tx)
        .await;
    let _ = tx.commit().await;
    let notes: Vec<String> =
        sqlx::query_scalar(&format!("SELECT note FROM {ledger} ORDER BY token"))
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(notes, ["fresh"]);
    assert_eq!(
        fence.highest("ledger").await.unwrap(),
        Some(FencingToken::from(5))
    );
    assert_eq!(fence.highest("other").await.unwrap(), None);
    let late = fence.admit("ledger", FencingToken::from(3)).await;
    assert!(matches!(late, Err(Error::Fenced { .. })), "{late:?}");
}

/// A fresh and a stale writer racing serialise on the fence row: the stale one waits
/// for the fresh transaction to end and is then rejected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_transactions_racing_serialise() {
    let (pool, fence, ledger) = with_ledger("fence-race", "token bigint").await;
    fence.admit("ledger", FencingToken::from(6)).await.unwrap();

    let hold = Duration::from_millis(500);
    let (locked_tx, locked) = tokio::sync::oneshot::channel();
    let fresh = {
        let (pool, fence, ledger) = (pool.clone(), fence.clone(), ledger.clone());
        tokio::spawn(async move {
            let mut tx = pool.begin().await.unwrap();
            fence
                .fence_in_transaction(&mut tx, "ledger", FencingToken::from(7))
                .await
                .unwrap();
            let _ = locked_tx.send(());
            sqlx::query(&format!("INSERT INTO {ledger} VALUES (7)"))
                .execute(&mut *tx)
                .await
                .unwrap();
            tokio::time::sleep(hold).await;
            tx.commit().await.unwrap();
        })
    };
    locked.await.unwrap();
    let started = Instant::now();
    let mut tx = pool.begin().await.unwrap();
    // Token 6 was current a moment ago; the fresh transaction now holds the row.
    let stale = fence
        .fence_in_transaction(&mut tx, "ledger", FencingToken::from(6))
        .await;
    let waited = started.elapsed();
    drop(tx);
    fresh.await.unwrap();
    assert!(
        matches!(stale, Err(Error::Fenced { presented, highest }) if presented.get() == 6 && highest.get() == 7),
        "{stale:?}"
    );
    assert!(
        waited >= hold / 2,
        "the stale writer must wait for the row lock, waited {waited:?}"
    );
    let tokens: Vec<i64> = sqlx::query_scalar(&format!("SELECT token FROM {ledger}"))
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(tokens, [7]);
}

/// The same-database form: a transaction holding the live lease blocks a takeover until
/// it commits, and a token that is no longer live is rejected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_lease_blocks_takeover_and_rejects_stale() {
    let (pool, schema, store) = common::with_store(setup("hold").await);
    let fence = PgFence::new(pool.clone(), schema.clone());
    let ttl = Duration::from_secs(1);
    let a = store.try_acquire("job", "node-a", ttl).await;

    let mut tx = pool.begin().await.unwrap();
    fence
        .hold_lease_in_transaction(&mut tx, "job", a.fencing_token)
        .await
        .unwrap();
    // The lease expires while the transaction runs; b's takeover must wait for it.
    tokio::time::sleep(ttl + Duration::from_millis(100)).await;
    let taker = {
        let store = store.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let b = store.try_acquire("job", "node-b", ttl).await;
            (started.elapsed(), b)
        })
    };
    tokio::time::sleep(Duration::from_millis(400)).await;
    tx.commit().await.unwrap();
    let (waited, b) = taker.await.unwrap();
    assert!(b.acquired && b.fencing_token > a.fencing_token, "{b:?}");
    assert!(
        waited >= Duration::from_millis(300),
        "takeover must wait for the holder's transaction: {waited:?}"
    );

    let mut tx = pool.begin().await.unwrap();
    let stale = fence
        .hold_lease_in_transaction(&mut tx, "job", a.fencing_token)
        .await;
    assert!(
        matches!(stale, Err(Error::Fenced { presented, highest }) if presented == a.fencing_token && highest == b.fencing_token),
        "{stale:?}"
    );
    drop(tx);
    let mut tx = pool.begin().await.unwrap();
    let unknown = fence
        .hold_lease_in_transaction(&mut tx, "never", FencingToken::from(1))
        .await;
    assert!(matches!(unknown, Err(Error::Fenced { .. })), "{unknown:?}");
}

/// Fenced transactions refuse REPEATABLE READ (and roll the transaction back), and the
/// fence is not advanced by the refused attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeatable_read_is_refused() {
    let (pool, schema) = setup("rr").await;
    let fence = PgFence::new(pool.clone(), schema.clone());
    fence.admit("res", FencingToken::from(1)).await.unwrap();
    for level in ["REPEATABLE READ", "SERIALIZABLE"] {
        let mut tx = pool.begin().await.unwrap();
        sqlx::query(&format!("SET TRANSACTION ISOLATION LEVEL {level}"))
            .execute(&mut *tx)
            .await
            .unwrap();
        let refused = fence
            .fence_in_transaction(&mut tx, "res", FencingToken::from(9))
            .await;
        assert!(
            matches!(&refused, Err(Error::InvalidArgument { field: "transaction", reason }) if reason.contains(level)),
            "{level}: {refused:?}"
        );
        let _ = tx.commit().await;
        assert_eq!(
            fence.highest("res").await.unwrap(),
            Some(FencingToken::from(1)),
            "{level}"
        );
    }
}
