//! What a handover costs on a real PostgreSQL server (the goals: at most 3
//! statements per handover however many contenders wait, release -> successor's work
//! p99 <= 3 ms), counted with `pg_stat_statements` on a throwaway server of its own.

mod common;

use std::time::Duration;

use sqlx::PgPool;
use tenure::{LeaseStore, TermChange};
use tenure_postgres::{migrate, PgLeaseStore, Schema};
use tenure_testkit::postgres::PgServer;
use tenure_testkit::MustAnswer;
use tokio::sync::mpsc;
use tokio::time::Instant;

const LONG: Duration = Duration::from_secs(60);

/// A store on a pool of its own (what another process would have), tagged `app`.
async fn other_store(server: &PgServer, schema: &Schema, app: &str) -> PgLeaseStore {
    PgLeaseStore::new(common::pool(server, 2, app).await, schema.clone())
}

/// What one contender of [`handovers_cost_two_statements_however_many_wait`] reports.
enum Report {
    /// It queued (or, the first, acquired).
    Queued,
    /// It began the term `token` (renewed it, ready to work) at `at`.
    Leads {
        me: usize,
        /// When the push said so (before the renewal).
        told: Instant,
        at: Instant,
    },
    /// The leader's release, sent at `started`, returned at `returned`.
    Released { started: Instant, returned: Instant },
    /// The releaser queued again.
    Requeued,
    /// It learned from the push that `token` began for another.
    Saw,
}

/// One contender: queue, then wait for the push as the elector does; when handed the
/// role, renew it (the successor's one statement), report, and release when told
/// (`requeue`: then queue again at the back).
async fn contend(
    store: PgLeaseStore,
    me: usize,
    reports: mpsc::UnboundedSender<Report>,
    mut release: mpsc::UnboundedReceiver<bool>,
) {
    let name = format!("node-{me}");
    let queued = store.acquire_or_queue("handed", &name, LONG).await;
    let _ = reports.send(Report::Queued);
    let mut observed = queued.fencing_token;
    let mut token = queued.acquired.then_some(queued.fencing_token);
    let mut told = Instant::now();
    loop {
        if let Some(held) = token.take() {
            let _ = reports.send(Report::Leads {
                me,
                told,
                at: Instant::now(),
            });
            let Some(requeue) = release.recv().await else {
                return;
            };
            let started = Instant::now();
            assert!(store.release_term("handed", &name, held).await);
            let returned = Instant::now();
            let _ = reports.send(Report::Released { started, returned });
            if !requeue {
                // Gone from the queue, but the store stays open: dropping it would
                // unlisten, a statement of its own in the count.
                while release.recv().await.is_some() {}
                return;
            }
            let again = store.acquire_or_queue("handed", &name, LONG).await;
            assert!(!again.acquired);
            observed = again.fencing_token;
            let _ = reports.send(Report::Requeued);
        }
        match store
            .wait_for_successor("handed", observed, Instant::now() + LONG)
            .await
        {
            TermChange::Began {
                holder,
                fencing_token,
                ..
            } if holder == name => {
                told = Instant::now();
                let renewed = store.acquire_or_queue("handed", &name, LONG).await;
                assert!(renewed.acquired && renewed.fencing_token == fencing_token);
                token = Some(fencing_token);
                observed = fencing_token;
            }
            TermChange::Began { fencing_token, .. } => {
                observed = fencing_token;
                let _ = reports.send(Report::Saw);
            }
            other => panic!("{name}: {other:?}"),
        }
    }
}

/// Calls of the statements whose text starts with `start` and contains `needle`.
async fn calls(admin: &PgPool, start: &str, needle: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT COALESCE(sum(calls), 0)::bigint FROM pg_stat_statements
         WHERE starts_with(ltrim(query), $1) AND strpos(query, $2) > 0",
    )
    .bind(start)
    .bind(needle)
    .fetch_one(admin)
    .await
    .unwrap()
}

/// Statements run on `server` by this user, leaving out reads of the counter itself.
async fn statements(admin: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT COALESCE(sum(calls), 0)::bigint FROM pg_stat_statements
         WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
           AND query NOT ILIKE '%pg_stat_statements%'",
    )
    .fetch_one(admin)
    .await
    .unwrap()
}

/// The goal: a handover costs at most 3 statements however many contenders
/// wait. Here it is 2 (the release that begins the successor's term, the successor's
/// renewal) with 3 and with 30 contenders, each on its own store (its own listener):
/// the others learn the new holder from the push and read nothing. Also measures
/// release -> successor renewed over 100 handovers among 10 contenders (printed; the
/// goal is p99 <= 3 ms on an unloaded machine).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handovers_cost_two_statements_however_many_wait() {
    common::init_tracing();
    let server = PgServer::start().expect("a PostgreSQL server");
    server
        .psql("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
        .unwrap();
    server.restart().unwrap();
    server
        .psql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .unwrap();
    let admin = common::pool(&server, 1, "queue-cost-admin").await;
    for (contenders, handovers, requeue) in [(3, 2, false), (30, 5, false), (10, 100, true)] {
        let schema = common::fresh_schema();
        migrate(&admin, &schema).await.unwrap();
        let (reports_tx, mut reports) = mpsc::unbounded_channel();
        let mut commands = Vec::new();
        for me in 0..contenders {
            let store = other_store(&server, &schema, "queue-cost").await;
            let (tx, rx) = mpsc::unbounded_channel();
            commands.push(tx);
            tokio::spawn(contend(store, me, reports_tx.clone(), rx));
            // In arrival order: node-0 leads, the others queue behind it.
            loop {
                match reports.recv().await.expect("reports") {
                    Report::Queued => break,
                    Report::Leads { me, .. } => assert_eq!(me, 0),
                    Report::Saw | Report::Requeued | Report::Released { .. } => {}
                }
            }
        }
        let mut leader = 0;
        // Every waiter's first wait reads the role once (its listener knew nothing yet);
        // the count starts once they all have.
        let waiters = i64::try_from(contenders - 1).unwrap();
        let settle = Instant::now() + Duration::from_secs(30);
        let name = schema.name();
        while calls(&admin, "LISTEN", &format!("tenure:{name}\"")).await < waiters
            || calls(&admin, "SELECT l.role", &format!("\"{name}\".")).await < waiters
        {
            assert!(Instant::now() < settle, "the waiters did not settle");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut costs = Vec::new();
        let mut latencies = Vec::new();
        let mut parts = Vec::new();
        for _ in 0..handovers {
            let before = statements(&admin).await;
            commands[leader].send(requeue).unwrap();
            let mut seen = 0;
            let mut requeued = !requeue;
            let (mut next, mut released) = (None, None);
            while next.is_none() || released.is_none() || !requeued {
                match reports.recv().await.expect("reports") {
                    Report::Leads { me, told, at } => next = Some((me, told, at)),
                    Report::Released { started, returned } => released = Some((started, returned)),
                    Report::Saw => seen += 1,
                    Report::Requeued => requeued = true,
                    Report::Queued => {}
                }
            }
            let (Some((next, told, at)), Some((started, returned))) = (next, released) else {
                unreachable!("both arrived");
            };
            latencies.push(at - started);
            parts.push((returned - started, told - started, at - told));
            assert_eq!(next, (leader + 1) % contenders, "queue order");
            leader = next;
            if requeue {
                // The releaser queues again meanwhile: this round measures latency.
                continue;
            }
            // Every waiter but the successor learns of the new term from the push.
            while seen < contenders - 2 - costs.len() {
                if let Report::Saw = reports.recv().await.expect("reports") {
                    seen += 1;
                }
            }
            costs.push(statements(&admin).await - before);
        }
        drop(commands);
        let mut floor = Vec::new();
        for _ in 0..20 {
            let sent = Instant::now();
            sqlx::query("SELECT 1").execute(&admin).await.unwrap();
            floor.push(sent.elapsed());
        }
        floor.sort();
        latencies.sort();
        let median = |mut v: Vec<Duration>| {
            v.sort();
            v[v.len() / 2]
        };
        let (release, told, renew) = (
            median(parts.iter().map(|p| p.0).collect()),
            median(parts.iter().map(|p| p.1).collect()),
            median(parts.iter().map(|p| p.2).collect()),
        );
        let p = |q: f64| latencies[((latencies.len() - 1) as f64 * q).round() as usize];
        println!(
            "{contenders} contenders, {handovers} handovers: statements per handover \
             {costs:?}; release -> successor renewed p50 {:?}, p99 {:?}, max {:?} \
             (medians: release returned {release:?}, successor told {told:?}, its renewal \
             {renew:?}; one round trip here: {:?})",
            p(0.5),
            p(0.99),
            p(1.0),
            floor[floor.len() / 2],
        );
        assert!(costs.iter().all(|&c| c == 2), "{costs:?}");
        assert_eq!(costs.len(), if requeue { 0 } else { handovers });
    }
}
