//! Leadership on the Kubernetes API through its faults: the API server killed and
//! restarted, etcd restarted under it. Two electors on separate connections contend
//! for one role; every term's work records when it started and when it was told to
//! stop, on this process's clock. No two terms may overlap, and a leader must be back
//! soon after each fault.
//!
//! This binary owns its API server (the faults would disturb other tests).

mod common;

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tenure_testkit::eventually;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const TTL: Duration = Duration::from_secs(3);

#[derive(Debug, Clone)]
struct Term {
    owner: String,
    token: u64,
    start: Instant,
    end: Option<Instant>,
}

type Terms = Arc<Mutex<Vec<Term>>>;

async fn contender(namespace: &str, owner: &str, terms: Terms, stop: CancellationToken) {
    let elector = common::elector(namespace, owner, TTL).await;
    let owner = owner.to_owned();
    elector
        .run(
            "singleton",
            move |token, leadership| {
                let terms = Arc::clone(&terms);
                let owner = owner.clone();
                async move {
                    let index = {
                        let mut terms = terms.lock();
                        terms.push(Term {
                            owner,
                            token: token.get(),
                            start: Instant::now(),
                            end: None,
                        });
                        terms.len() - 1
                    };
                    leadership.cancelled().await;
                    terms.lock()[index].end = Some(Instant::now());
                    Ok::<(), tenure::Error>(())
                }
            },
            stop,
        )
        .await
        .unwrap();
}

fn leading(terms: &Terms) -> Option<Term> {
    terms.lock().iter().find(|term| term.end.is_none()).cloned()
}

async fn wait_for_leader(terms: &Terms, within: Duration, after: &str) -> Term {
    eventually(within, Duration::from_millis(50), || async {
        leading(terms).ok_or_else(|| {
            format!(
                "no leader within {within:?} after {after}: {:#?}",
                terms.lock()
            )
        })
    })
    .await
}

fn assert_no_overlap(terms: &Terms) {
    let mut terms = terms.lock().clone();
    terms.sort_by_key(|term| term.start);
    for pair in terms.windows(2) {
        let end = pair[0].end.expect("only the last term may still run");
        assert!(
            end <= pair[1].start,
            "terms overlap by {:?}: {:#?}",
            end - pair[1].start,
            pair
        );
        assert!(pair[1].token > pair[0].token, "tokens grow: {pair:#?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_two_terms_overlap_through_api_server_and_etcd_restarts() {
    let server = common::server();
    let namespace = common::new_namespace("faults");
    let terms: Terms = Arc::default();
    let stop = CancellationToken::new();
    let tasks: Vec<_> = ["node-a", "node-b"]
        .into_iter()
        .map(|owner| {
            let (namespace, terms, stop) = (namespace.clone(), terms.clone(), stop.clone());
            tokio::spawn(async move { contender(&namespace, owner, terms, stop).await })
        })
        .collect();
    wait_for_leader(&terms, Duration::from_secs(20), "start").await;

    // Killed for two TTLs: the leader's local deadline ends its term; after the restart
    // a contender takes over at once (it saw the record unchanged for longer than a TTL).
    server.kill_apiserver();
    tokio::time::sleep(TTL * 2).await;
    assert!(
        leading(&terms).is_none(),
        "no term outlives its TTL without the API server"
    );
    let restarted = Instant::now();
    tokio::task::spawn_blocking(|| common::server().restart_apiserver())
        .await
        .unwrap()
        .expect("restart the API server");
    let back = wait_for_leader(&terms, TTL * 3, "the API server restart").await;
    eprintln!(
        "leader {} (token {}) {:?} after the API server restart began",
        back.owner,
        back.token,
        back.start - restarted
    );

    tokio::task::spawn_blocking(|| common::server().restart_etcd())
        .await
        .unwrap()
        .expect("restart etcd");
    wait_for_leader(&terms, TTL * 3, "the etcd restart").await;
    tokio::time::sleep(TTL).await;

    stop.cancel();
    for task in tasks {
        task.await.unwrap();
    }
    assert_no_overlap(&terms);
    assert!(
        terms.lock().len() >= 2,
        "the kill ended a term: {:#?}",
        terms.lock()
    );
}
