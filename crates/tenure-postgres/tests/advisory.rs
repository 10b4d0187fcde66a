//! The advisory-lock elector on a real PostgreSQL server.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::PgPool;
use tenure::FencingToken;
use tenure_postgres::{AdvisoryLockElector, AdvisoryLockOptions, Schema};
use tenure_testkit::in_time;
use tenure_testkit::postgres::PgServer;
use tokio_util::sync::CancellationToken;

async fn setup(app: &str) -> (PgPool, Schema) {
    common::migrated_with(app, 8).await
}

/// The advisory-lock elector: one leader at a time; when the leader's connection is
/// terminated its work is cancelled and a new term begins with a higher token; shutdown
/// cancels the work and ends `run`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_lock_elector_hands_over_on_connection_loss() {
    let (_pool, schema) = setup("advisory-setup").await;
    let options = AdvisoryLockOptions {
        retry_interval: Duration::from_millis(100),
        check_interval: Duration::from_millis(100),
        check_timeout: Duration::from_secs(2),
    };
    // (elector, token, when work started, when its leadership was cancelled)
    type Term = (&'static str, FencingToken, Instant, Option<Instant>);
    let terms = Arc::new(Mutex::new(Vec::<Term>::new()));
    let stop = CancellationToken::new();
    let mut tasks = Vec::new();
    for name in ["adv-a", "adv-b"] {
        let pool = common::pool(
            PgServer::shared().expect("shared PostgreSQL server"),
            2,
            name,
        )
        .await;
        let elector = AdvisoryLockElector::new(pool, schema.clone(), options.clone()).unwrap();
        let (terms, stop) = (terms.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            elector
                .run(
                    "adv",
                    move |token, leadership| {
                        let terms = terms.clone();
                        async move {
                            let index = {
                                let mut terms = terms.lock().unwrap();
                                terms.push((name, token, Instant::now(), None));
                                terms.len() - 1
                            };
                            leadership.cancelled().await;
                            terms.lock().unwrap()[index].3 = Some(Instant::now());
                        }
                    },
                    stop,
                )
                .await
        }));
    }
    let wait_terms = |n: usize| {
        let terms = terms.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            common::poll_until(deadline, &format!("no term {n} within 10 s"), || {
                let terms = terms.lock().unwrap();
                (terms.len() >= n).then(|| terms.clone())
            })
            .await
        }
    };
    let first = wait_terms(1).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(terms.lock().unwrap().len(), 1, "the lock has one holder");
    let (leader, token, _, _) = first[0];
    let terminated = Instant::now();
    PgServer::shared()
        .expect("shared PostgreSQL server")
        .psql(&format!(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '{leader}'"
    ))
        .expect("psql");
    let after = wait_terms(2).await;
    // Either contender may win the next term (the old leader reconnects too).
    let (_, next_token, _, _) = after[1];
    assert!(next_token > token, "advisory terms carry increasing tokens");
    let deadline = Instant::now() + Duration::from_secs(5);
    let cancelled = common::poll_until(deadline, "the old leader's work was not cancelled", || {
        terms.lock().unwrap()[0].3
    })
    .await;
    assert!(cancelled.duration_since(terminated) < Duration::from_secs(3));
    stop.cancel();
    for task in tasks {
        in_time(Duration::from_secs(10), task, "electors stop")
            .await
            .unwrap();
    }
    let terms = terms.lock().unwrap();
    assert!(
        terms.iter().all(|t| t.3.is_some()),
        "shutdown cancels the running work"
    );
}
