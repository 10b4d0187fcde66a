//! The queue of candidates on a real PostgreSQL server, beyond the shared scenarios: a
//! schema the previous `migrate` made gains the queue, every change of term is notified
//! with its new state (and the bare role earlier tenures wait for), an earlier tenure's
//! notification tells a waiter nothing, lapsed candidacies are swept, a withdrawal
//! during a release is seen, and racing refreshes, withdrawals and handovers never
//! deadlock nor share a token. (What a handover costs: `handover_cost.rs`.)

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::postgres::PgListener;
use sqlx::PgPool;
use tenure::{FencingToken, LeaseStore, TermChange};
use tenure_postgres::{migrate, PgLeaseStore, Schema};
use tenure_testkit::postgres::PgServer;
use tenure_testkit::{in_time, MustAnswer};
use tokio::time::Instant;

use common::{migrated as setup, table};

const LONG: Duration = Duration::from_secs(60);
const US: char = '\u{1f}';

fn began(role: &str, token: u64, holder: &str) -> String {
    format!("{role}{US}began{US}{token}{US}{holder}")
}

fn ended(role: &str, token: u64) -> String {
    format!("{role}{US}ended{US}{token}")
}

/// A store on a pool of its own (what another process would have), tagged `app`.
async fn other_store(server: &PgServer, schema: &Schema, app: &str) -> PgLeaseStore {
    PgLeaseStore::new(common::pool(server, 2, app).await, schema.clone())
}

fn shared() -> &'static PgServer {
    PgServer::shared().expect("shared PostgreSQL server")
}

async fn candidates(pool: &PgPool, schema: &Schema, role: &str) -> Vec<String> {
    sqlx::query_scalar(&format!(
        "SELECT owner FROM {} WHERE role = $1 ORDER BY seq",
        table(schema, "tenure_candidates")
    ))
    .bind(role)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// A schema as the previous `migrate` left it (everything but the candidates table),
/// holding a live term, gains the queue on `migrate` (twice: nothing changes the second
/// time): the term goes on, and its release hands the role to a candidate queued since.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_adds_the_queue_to_an_existing_schema() {
    let (pool, schema, store) = common::with_store(setup("queue-migrate").await);
    let a = store.try_acquire("live", "node-a", LONG).await;
    assert!(a.acquired);
    let c = table(&schema, "tenure_candidates");
    // What the previous migrate made is exactly this schema without the queue.
    sqlx::query(&format!("DROP TABLE {c}"))
        .execute(&pool)
        .await
        .unwrap();
    migrate(&pool, &schema).await.unwrap();
    migrate(&pool, &schema).await.unwrap();

    let info = store.get("live").await.unwrap().unwrap();
    assert_eq!(info.live_holder(), Some("node-a"));
    assert_eq!(info.fencing_token, a.fencing_token);
    let b = store
        .try_acquire_or_queue("live", "node-b", LONG, Some("b:1"))
        .await
        .unwrap();
    assert!(!b.acquired);
    assert!(store.release_term("live", "node-a", a.fencing_token).await);
    let info = store.get("live").await.unwrap().unwrap();
    assert_eq!(info.live_holder(), Some("node-b"));
    assert_eq!(info.fencing_token.get(), a.fencing_token.get() + 1);
    assert_eq!(info.value.as_deref(), Some("b:1"));
    assert!(candidates(&pool, &schema, "live").await.is_empty());
}

/// Every statement that begins or ends a term notifies its new state, then the bare
/// role (what earlier tenures wait for); a refresh, a renewal, a withdrawal and a
/// refused handoff notify nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_change_of_term_notifies_its_new_state() {
    let (pool, schema, store) = common::with_store(setup("queue-payloads").await);
    let mut listener = PgListener::connect_with(&pool).await.unwrap();
    listener
        .listen(&format!("tenure:{}", schema.name()))
        .await
        .unwrap();
    let r = "jobs/eu";
    let a = store.acquire_or_queue(r, "node-a", LONG).await;
    // A renewal, a candidacy and its refresh, and a candidacy then withdrawn.
    for owner in ["node-a", "node-b", "node-b", "node-x"] {
        store.acquire_or_queue(r, owner, LONG).await;
    }
    assert!(store.withdraw(r, "node-x").await.unwrap());
    assert!(!store
        .hand_over(r, "node-a", a.fencing_token, Some("node-x"))
        .await
        .unwrap());
    assert!(store.release_term(r, "node-a", a.fencing_token).await);
    store.acquire_or_queue(r, "node-c", LONG).await;
    assert!(store
        .hand_over(r, "node-b", FencingToken::from(2), None)
        .await
        .unwrap());
    assert!(store.release_term(r, "node-c", FencingToken::from(3)).await);
    let session = store.open_session("node-s", LONG).await.unwrap();
    assert!(
        store
            .acquire_in_session(r, session.id)
            .await
            .unwrap()
            .acquired
    );
    assert!(store.close_session(session.id).await.unwrap());

    let expected = [
        began(r, 1, "node-a"),
        r.to_owned(),
        began(r, 2, "node-b"),
        r.to_owned(),
        began(r, 3, "node-c"),
        r.to_owned(),
        ended(r, 3),
        r.to_owned(),
        began(r, 4, "node-s"),
        r.to_owned(),
        ended(r, 4),
        r.to_owned(),
    ];
    for want in expected {
        let got = in_time(Duration::from_secs(5), listener.recv(), "a notification").await;
        assert_eq!(got.payload(), want);
    }
    let more = tokio::time::timeout(Duration::from_millis(300), listener.recv()).await;
    assert!(more.is_err(), "nothing else: {more:?}");
}

/// A waiter learns nothing from an earlier tenure's notification (the bare role alone)
/// or an unreadable payload: it answers `Unknown` at once rather than at its deadline.
/// A state with its companion, as this tenure sends them, is read from the push.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_tenures_notification_tells_nothing() {
    let (pool, schema, store) = common::with_store(setup("queue-earlier").await);
    let a = store.try_acquire("r", "node-a", LONG).await;
    let channel = format!("tenure:{}", schema.name());
    let waiter = Arc::new(other_store(shared(), &schema, "queue-earlier-waiter").await);
    for (sql, want) in [
        ("SELECT pg_notify($1, 'r')".to_owned(), TermChange::Unknown),
        (
            format!("SELECT pg_notify($1, 'r{US}moved{US}9')"),
            TermChange::Unknown,
        ),
        (
            format!("SELECT pg_notify($1, 'r{US}began{US}9{US}node-z'), pg_notify($1, 'r')"),
            TermChange::Began {
                holder: "node-z".to_owned(),
                fencing_token: FencingToken::from(9),
                session: None,
            },
        ),
    ] {
        let started = Instant::now();
        let waiting = {
            let waiter = Arc::clone(&waiter);
            tokio::spawn(async move {
                waiter
                    .wait_for_successor("r", a.fencing_token, Instant::now() + LONG)
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        sqlx::query(&sql)
            .bind(&channel)
            .execute(&pool)
            .await
            .unwrap();
        let change = in_time(Duration::from_secs(5), waiting, "woken by the notification").await;
        assert_eq!(change, want, "{sql}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}

/// The listener's connection is terminated while a candidate waits: the waiter answers
/// `Unknown` once (notifications may have been lost), never spins, and a release after
/// the listener is back still names the successor from the push.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gap_in_listening_is_unknown_then_pushes_resume() {
    let (pool, schema) = setup("queue-gap").await;
    let store = PgLeaseStore::new(pool, schema.clone());
    let waiter = Arc::new(other_store(shared(), &schema, "queue-gap-waiter").await);
    let a = store.try_acquire("r", "node-a", LONG).await;
    let b = waiter.acquire_or_queue("r", "node-b", LONG).await;
    assert!(!b.acquired);
    let answers = Arc::new(Mutex::new(Vec::new()));
    let waiting = {
        let (waiter, answers) = (Arc::clone(&waiter), Arc::clone(&answers));
        tokio::spawn(async move {
            loop {
                let change = waiter
                    .wait_for_successor("r", a.fencing_token, Instant::now() + LONG)
                    .await;
                answers.lock().unwrap().push(change.clone());
                if change != TermChange::Unknown {
                    return change;
                }
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    shared()
        .psql(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE application_name = 'queue-gap-waiter' AND query ILIKE 'LISTEN%'",
        )
        .expect("psql");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let early = answers.lock().unwrap().len();
    assert!((1..=3).contains(&early), "{early} answers during the gap");
    assert!(store.release_term("r", "node-a", a.fencing_token).await);
    let change = in_time(Duration::from_secs(5), waiting, "pushed").await;
    assert_eq!(
        change,
        TermChange::Began {
            holder: "node-b".to_owned(),
            fencing_token: FencingToken::from(a.fencing_token.get() + 1),
            session: None,
        }
    );
}

/// Candidacies that lapsed are swept when a contender joins the queue and when a term
/// is handed over, so crashed contenders leave no rows; a refresh sweeps nothing and a
/// live candidacy is never swept. A term begun in a session ends its owner's
/// candidacy, as any acquire does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lapsed_candidacies_are_swept() {
    let (pool, schema, store) = common::with_store(setup("queue-sweep").await);
    let short = Duration::from_millis(200);
    let end_term = || async {
        sqlx::query(&format!(
            "UPDATE {} SET expires_at = now() - interval '1 second' WHERE role = 'r'",
            table(&schema, "tenure_leases")
        ))
        .execute(&pool)
        .await
        .unwrap();
    };
    tenure_testkit::queue::lapsed_candidacies_are_swept(
        &store,
        short,
        LONG,
        || tokio::time::sleep(short * 2),
        end_term,
        || candidates(&pool, &schema, "r"),
    )
    .await;
}

/// A withdrawal that commits while a release waits for the lease row is seen: the
/// release's snapshot still shows the candidacy, but it locks the candidate row before
/// taking it, finds it gone, and hands the role to the next candidate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_withdrawal_while_a_release_waits_is_seen() {
    let (pool, schema) = setup("queue-withdrawn").await;
    let store = Arc::new(PgLeaseStore::new(pool.clone(), schema.clone()));
    let a = store.try_acquire("r", "node-a", LONG).await;
    for owner in ["node-b", "node-c"] {
        let queued = store.acquire_or_queue("r", owner, LONG).await;
        assert!(!queued.acquired);
    }
    let blocker = common::row_locked(&pool, &schema, "tenure_leases", "r").await;
    let releasing = {
        let store = Arc::clone(&store);
        tokio::spawn(async move { store.release("r", "node-a", a.fencing_token).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !releasing.is_finished(),
        "the release waits for the lease row"
    );
    assert!(store.withdraw("r", "node-b").await.unwrap());
    blocker.rollback().await.unwrap();
    assert!(releasing.await.unwrap().unwrap());
    let info = store.get("r").await.unwrap().unwrap();
    assert_eq!(info.live_holder(), Some("node-c"), "{info:?}");
    assert_eq!(info.fencing_token.get(), a.fencing_token.get() + 1);
    assert!(candidates(&pool, &schema, "r").await.is_empty());
}

/// Contenders on their own connections race for a role: they queue and refresh, the
/// holder releases or hands over at once, some withdraw. No statement fails (a
/// deadlock would be an error), no token is held by two owners, and tokens only grow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_refreshes_withdrawals_and_handovers() {
    let (_pool, schema) = setup("queue-race").await;
    let terms: Arc<Mutex<HashMap<u64, String>>> = Arc::default();
    let mut tasks = Vec::new();
    for n in 0..8 {
        let store = other_store(shared(), &schema, "queue-race").await;
        let terms = Arc::clone(&terms);
        tasks.push(tokio::spawn(async move {
            let me = format!("node-{n}");
            let stop = Instant::now() + Duration::from_secs(3);
            let mut led = 0;
            let mut i = 0u64;
            let mut last = FencingToken::from(0);
            while Instant::now() < stop {
                i += 1;
                let r = store
                    .acquire_or_queue("race", &me, Duration::from_secs(5))
                    .await;
                assert!(r.fencing_token >= last, "{last} then {r:?}");
                last = r.fencing_token;
                if !r.acquired {
                    if (i + n) % 7 == 0 {
                        store.withdraw("race", &me).await.unwrap();
                    }
                    continue;
                }
                led += 1;
                let previous = terms
                    .lock()
                    .unwrap()
                    .insert(r.fencing_token.get(), me.clone());
                assert!(
                    previous.as_ref().is_none_or(|p| *p == me),
                    "token {} held by {previous:?} and {me}",
                    r.fencing_token
                );
                if i % 2 == 0 {
                    store.release("race", &me, r.fencing_token).await.unwrap();
                } else {
                    store
                        .hand_over("race", &me, r.fencing_token, None)
                        .await
                        .unwrap();
                }
            }
            led
        }));
    }
    let mut leaderships = 0;
    for task in tasks {
        leaderships += task.await.unwrap();
    }
    assert!(leaderships > 8, "only {leaderships} terms in 3 s");
    let terms = terms.lock().unwrap();
    assert!(terms.len() >= 8, "{} distinct terms", terms.len());
}
