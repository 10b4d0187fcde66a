//! Advertised values and `wait_for_term` on a real PostgreSQL server, beyond the shared
//! scenarios: a lease table made by an earlier tenure gains the value columns, a term an
//! earlier tenure starts never shows the value of the term before it, a session's term
//! advertises nothing, and an observer's wait for a role that does not exist yet wakes
//! on its first term.

mod common;

use std::time::Duration;

use tenure::{FencingToken, LeaseStore};
use tenure_postgres::PgLeaseStore;
use tokio::time::Instant;

const URL: &str = "http://10.0.0.7:8080";
const LONG: Duration = Duration::from_secs(30);
const SHORT: Duration = Duration::from_millis(200);

use common::{migrated as setup, table};
use tenure_testkit::MustAnswer;

/// A schema as the previous `migrate` left it (sessions, no values), with a live term
/// (token 7) and a released one (token 9), gains the value columns on `migrate`: the
/// live term keeps its holder and token and shows no value, a renewal does not give it
/// one, the released role is taken with the next token and its value, and migrating
/// again changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_adds_values_to_an_existing_lease_table() {
    let (pool, schema, leases) = common::first_version("values-migrate").await;
    let sessions = table(&schema, "tenure_sessions");
    // What the previous `migrate` added to it.
    let previous = format!(
        "ALTER TABLE {leases} ADD COLUMN session_id bigint;
         CREATE INDEX tenure_leases_session_id ON {leases} (session_id)
             WHERE session_id IS NOT NULL;
         CREATE TABLE {sessions} (
             id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
             owner text NOT NULL,
             expires_at timestamptz NOT NULL
         );
         INSERT INTO {leases} VALUES
             ('live', 'node-a', 7, now() + interval '30 seconds', 1, NULL),
             ('released', NULL, 9, now() - interval '1 second', 1, NULL);"
    );
    let store = common::upgraded(&pool, &schema, &previous).await;
    let live = store.get("live").await.unwrap().expect("kept");
    assert_eq!(live.live_holder(), Some("node-a"));
    assert_eq!(live.fencing_token.get(), 7);
    assert_eq!(live.value, None);
    let renewed = store
        .try_acquire_with_value("live", "node-a", LONG, Some(URL))
        .await;
    assert!(renewed.acquired && renewed.fencing_token.get() == 7);
    assert_eq!(store.get("live").await.unwrap().unwrap().value, None);

    let taken = store
        .try_acquire_with_value("released", "node-b", LONG, Some(URL))
        .await;
    assert!(
        taken.acquired && taken.fencing_token.get() == 10,
        "{taken:?}"
    );
    let listed = store.list().await.unwrap();
    let values: Vec<_> = listed
        .iter()
        .map(|info| (info.role.as_str(), info.value.as_deref()))
        .collect();
    assert_eq!(values, [("live", None), ("released", Some(URL))]);
}

/// An earlier tenure, whose statements know no values, takes over a lapsed term that
/// advertised one, or releases one: the value is shown for neither the term it started
/// nor the role it released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_tenures_term_never_shows_its_predecessors_value() {
    let (pool, schema, store) = common::with_store(setup("values-mixed").await);
    let leases = table(&schema, "tenure_leases");
    let lapse = || tokio::time::sleep(SHORT + Duration::from_millis(100));
    // What the earlier acquire statement writes when it takes a lapsed term over.
    let take_over = || async {
        sqlx::query(&format!(
            "UPDATE {leases} SET holder = 'old-b', fencing_token = fencing_token + 1,
                expires_at = statement_timestamp() + interval '30 seconds',
                term_txid = txid_current(), session_id = NULL
             WHERE role = 'taken'"
        ))
        .execute(&pool)
        .await
        .unwrap();
    };
    // What the earlier release statement writes.
    let release = || async {
        sqlx::query(&format!(
            "UPDATE {leases} SET holder = NULL, session_id = NULL,
                expires_at = statement_timestamp() WHERE role = 'released'"
        ))
        .execute(&pool)
        .await
        .unwrap();
    };
    tenure_testkit::observe::an_earlier_term_never_shows_its_predecessors_value(
        &store, SHORT, LONG, lapse, take_over, release,
    )
    .await;
}

/// A term started under a session advertises nothing, also when it takes over a lapsed
/// term that advertised a value; the holder's own later acquire (a plain lease from
/// then on) keeps its term's value, none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_term_shows_no_value() {
    let (pool, schema) = setup("values-session").await;
    let store = PgLeaseStore::new(pool, schema);
    let lapse = || tokio::time::sleep(SHORT + Duration::from_millis(100));
    tenure_testkit::observe::a_session_term_shows_no_value(&store, SHORT, LONG, lapse).await;
}

/// Starts `watcher` waiting for a term above `after` on `role`, then (once it waits)
/// starts one with `owner`'s acquire on `writer`; asserts the waiter saw it within 2 s
/// of the answer, far before its 30 s deadline. The
/// waiter reads again after each return and waits on while no such term exists, as an
/// observer does: a wait may return early (a release's notification arriving late).
async fn assert_woken_by_a_term(
    watcher: &PgLeaseStore,
    writer: &PgLeaseStore,
    role: &'static str,
    after: FencingToken,
    owner: &str,
) -> FencingToken {
    let deadline = Instant::now() + LONG;
    let waiting = tokio::spawn({
        let watcher = watcher.clone();
        async move {
            loop {
                watcher.wait_for_term(role, after, deadline).await;
                let info = watcher.get(role).await.unwrap();
                if info.is_some_and(|info| info.fencing_token > after) || Instant::now() >= deadline
                {
                    return Instant::now();
                }
            }
        }
    });
    tokio::time::sleep(SHORT).await;
    let term = writer.try_acquire(role, owner, LONG).await;
    assert!(term.acquired && term.fencing_token > after, "{term:?}");
    let answered = Instant::now();
    let woke = waiting.await.unwrap();
    let delay = woke.saturating_duration_since(answered);
    assert!(
        delay < Duration::from_secs(2),
        "woke {delay:?} after the term began"
    );
    term.fencing_token
}

/// `wait_for_term` on a role that does not exist wakes when another store instance
/// creates it (by notification: well before the deadline), and again for the next term
/// after a release; with nothing happening it returns at its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_term_wakes_on_a_roles_first_term() {
    let (pool, schema) = setup("values-wait").await;
    let writer = PgLeaseStore::new(pool.clone(), schema.clone());
    let watcher = PgLeaseStore::new(pool, schema);

    let start = Instant::now();
    watcher
        .wait_for_term("quiet", FencingToken::from(0), start + SHORT)
        .await;
    assert!(
        start.elapsed() >= SHORT,
        "returned early: {:?}",
        start.elapsed()
    );

    let first =
        assert_woken_by_a_term(&watcher, &writer, "fresh", FencingToken::from(0), "node-a").await;
    assert!(writer.release_term("fresh", "node-a", first).await);
    assert_woken_by_a_term(&watcher, &writer, "fresh", first, "node-b").await;
}
