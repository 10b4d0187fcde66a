//! Faults on real servers: restarts, kills, outages, terminated connections, and
//! contenders in separate OS processes.
//!
//! Tests that stop or kill a server start their own throwaway server; the rest share
//! one. Every wait is bounded.

mod common;

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::Row;
use tenure::{ElectionState, LeaseLeaderElector, LeaseLeaderOptions, LeaseStore};
use tenure_postgres::{migrate, PgLeaseStore, Schema};
use tenure_testkit::postgres::PgServer;
use tenure_testkit::stalled_disk::{
    self, elector, first_term_ends_within_ttl, log_term, wait_for, Running, StalledDisk, TermLog,
};
use tenure_testkit::{eventually, in_time, MustAnswer};
use tokio_util::sync::CancellationToken;

/// Tokens keep increasing across release, a new store instance, a clean server
/// restart and a SIGKILL of the server; an old pool recovers after the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_survive_release_restart_and_kill() {
    common::init_tracing();
    let server = PgServer::start().expect("start PostgreSQL");
    let schema = common::fresh_schema();
    let ttl = Duration::from_secs(5);
    let first_pool = common::pool(&server, 2, "survive").await;
    migrate(&first_pool, &schema).await.unwrap();
    let first = PgLeaseStore::new(first_pool, schema.clone());

    let t1 = first.try_acquire("r", "a", ttl).await;
    assert!(t1.acquired);
    assert!(first.release_term("r", "a", t1.fencing_token).await);

    let second = PgLeaseStore::new(common::pool(&server, 2, "survive").await, schema.clone());
    let t2 = second.try_acquire("r", "b", ttl).await;
    assert!(t2.acquired && t2.fencing_token > t1.fencing_token, "{t2:?}");
    assert!(second.release_term("r", "b", t2.fencing_token).await);

    tokio::task::block_in_place(|| server.restart().expect("restart"));
    let third = PgLeaseStore::new(common::pool(&server, 2, "survive").await, schema.clone());
    let t3 = third.try_acquire("r", "c", ttl).await;
    assert!(
        t3.acquired && t3.fencing_token > t2.fencing_token,
        "after restart: {t3:?}"
    );

    // Killed with the lease held: the term is still there after crash recovery, and
    // the next owner gets a higher token once it expires.
    tokio::task::block_in_place(|| {
        server.kill();
        server.start_again().expect("start again");
    });
    let fourth = PgLeaseStore::new(common::pool(&server, 2, "survive").await, schema.clone());
    let held = fourth.try_acquire("r", "d", ttl).await;
    assert!(
        !held.acquired && held.fencing_token == t3.fencing_token,
        "{held:?}"
    );
    tokio::time::sleep(held.remaining() + Duration::from_millis(50)).await;
    // The first store's pool lost its connections twice; it recovers on its own.
    let mut t4 = None;
    for _ in 0..20 {
        match first.try_acquire_or_renew("r", "a", ttl).await {
            Ok(result) => {
                t4 = Some(result);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let t4 = t4.expect("old pool reconnects");
    assert!(t4.acquired && t4.fencing_token > t3.fencing_token, "{t4:?}");
}

/// The server stops for longer than the TTL while an elector leads: its local deadline
/// cancels `leadership` before the lease could have expired, it logs and retries, and
/// after the restart it leads again with a higher token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_outage_longer_than_ttl() {
    common::init_tracing();
    let server = Arc::new(PgServer::start().expect("start PostgreSQL"));
    let schema = common::fresh_schema();
    let pool = common::lazy_pool(&server, 4, "outage");
    migrate(&pool, &schema).await.unwrap();
    let ttl = Duration::from_secs(2);
    let elector = elector(
        Arc::new(PgLeaseStore::new(pool, schema)),
        "outage-leader",
        ttl,
        Duration::from_millis(400),
        Duration::from_millis(300),
    );
    let terms = TermLog::default();
    let work = {
        let terms = terms.clone();
        move |token, leadership| log_term(terms.clone(), token, leadership)
    };
    let run = Running::start(&elector, "outage", work);
    let first = wait_for(&terms, 1, Duration::from_secs(10)).await[0].0;

    tracing::info!("--- stopping the server");
    let stopped = {
        let server = server.clone();
        tokio::task::spawn_blocking(move || {
            server.stop();
            Instant::now()
        })
        .await
        .unwrap()
    };
    first_term_ends_within_ttl(&terms, stopped, ttl, "stop").await;
    // Stay down past the TTL; the elector keeps retrying without panicking.
    tokio::time::sleep(ttl + Duration::from_millis(500)).await;
    assert!(!run.is_finished(), "store errors never end run");
    assert_eq!(
        terms.lock().unwrap().len(),
        1,
        "no term while the server is down"
    );

    tracing::info!("--- restarting the server");
    {
        let server = server.clone();
        tokio::task::spawn_blocking(move || server.start_again().expect("start again"))
            .await
            .unwrap();
    }
    let terms_now = wait_for(&terms, 2, Duration::from_secs(15)).await;
    assert!(
        terms_now[1].0 > first,
        "a new term after the outage: {:?}",
        terms_now[1].0
    );
    run.stop().await;
}

/// `pg_terminate_backend` on every connection of the leader's pool: the next renewal
/// runs on a new connection, leadership is never lost, and the lease is renewed within
/// about one renew interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_connections_do_not_lose_leadership() {
    common::init_tracing();
    let server = PgServer::shared().expect("shared PostgreSQL server");
    let schema = common::fresh_schema();
    let pool = common::pool(server, 4, "terminated-leader").await;
    migrate(&pool, &schema).await.unwrap();
    let observer = PgLeaseStore::new(common::pool(server, 1, "observer").await, schema.clone());
    let renew = Duration::from_millis(500);
    let elector = elector(
        Arc::new(PgLeaseStore::new(pool, schema)),
        "terminated",
        Duration::from_secs(4),
        renew,
        Duration::from_millis(200),
    );
    let cancelled = CancellationToken::new();
    let work = {
        let cancelled = cancelled.clone();
        move |_, leadership: CancellationToken| {
            let cancelled = cancelled.clone();
            async move {
                leadership.cancelled().await;
                cancelled.cancel();
            }
        }
    };
    let run = Running::start(&elector, "terminated", work);
    let mut state = elector.watch();
    let token = in_time(
        Duration::from_secs(10),
        state.wait_for(ElectionState::is_leader),
        "leads",
    )
    .await
    .clone();
    let before = observer.get("terminated").await.unwrap().unwrap();
    let killed = server
        .psql(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE application_name = 'terminated-leader'",
        )
        .expect("psql");
    assert_ne!(killed, "0", "the leader's connections were terminated");
    let terminated_at = std::time::SystemTime::now();
    // Within about one renew interval (plus a retry), the lease is renewed again.
    let within = renew * 2 + Duration::from_secs(1);
    eventually(within, Duration::from_millis(50), || async {
        let now = observer.get("terminated").await.unwrap().unwrap();
        assert_eq!(now.fencing_token, before.fencing_token, "same term");
        if now.expires_at > before.expires_at
            && now.expires_at > terminated_at + Duration::from_secs(2)
        {
            Ok(())
        } else {
            Err("no renewal after the connections were terminated".to_owned())
        }
    })
    .await;
    tokio::time::sleep(renew * 2).await;
    assert!(
        !cancelled.is_cancelled(),
        "leadership must survive a terminated connection"
    );
    assert_eq!(*elector.watch().borrow(), token);
    run.stop().await;
}

/// The server is down when the elector starts: store errors are logged (without the
/// password), nothing panics, and the elector leads once the server is up.
#[test]
fn server_down_at_start_then_leads() {
    let logs = common::Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::DEBUG)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let server = Arc::new(PgServer::start().expect("start PostgreSQL"));
    let schema = common::fresh_schema();
    runtime.block_on(async {
        let pool = common::lazy_pool(&server, 2, "down-at-start");
        migrate(&pool, &schema).await.unwrap();
        server.stop();
        let elector = elector(
            Arc::new(PgLeaseStore::new(pool, schema.clone())),
            "late",
            Duration::from_secs(2),
            Duration::from_millis(500),
            Duration::from_millis(300),
        );
        let work = |_, leadership: CancellationToken| async move { leadership.cancelled().await };
        let run = Running::start(&elector, "late", work);
        // Longer than the pool's 2 s acquire timeout, so attempts fail and are retried.
        tokio::time::sleep(Duration::from_millis(4500)).await;
        assert!(!run.is_finished(), "store errors never end run");
        assert!(!elector.watch().borrow().is_leader());
        let restarting = server.clone();
        tokio::task::spawn_blocking(move || restarting.start_again().expect("start again"))
            .await
            .unwrap();
        let mut state = elector.watch();
        in_time(
            Duration::from_secs(15),
            state.wait_for(ElectionState::is_leader),
            "leads once the server is up",
        )
        .await;
        run.stop().await;
    });
    let logs = logs.text();
    let warned = logs
        .lines()
        .take_while(|line| !line.contains("elected"))
        .any(|line| line.contains("WARN") && line.contains("role=\"late\""));
    assert!(
        warned,
        "failed attempts are logged as warnings before leading:\n{logs}"
    );
    assert!(logs.contains("elected"), "{logs}");
    assert!(
        !logs.contains(server.password()),
        "the password leaked into the logs"
    );
}

const CHILD_URL: &str = "TENURE_PG_CHILD_URL";
const CHILD_SCHEMA: &str = "TENURE_PG_CHILD_SCHEMA";
const CHILD_OWNER: &str = "TENURE_PG_CHILD_OWNER";
const CHILD_SECONDS: &str = "TENURE_PG_CHILD_SECONDS";

/// Electors in separate OS processes (this test binary re-executed in child mode)
/// never run work at the same time: every process stamps database-clock marks while it
/// leads, handing over by release and by being killed with SIGKILL; ordered by time,
/// the marks' tokens never go back and each token belongs to one process.
#[test]
fn elector_processes_never_overlap() {
    let server = PgServer::shared().expect("shared PostgreSQL server");
    let schema = common::fresh_schema();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let pool = common::pool(server, 1, "processes").await;
        migrate(&pool, &schema).await.unwrap();
        sqlx::query(&format!(
            "CREATE TABLE \"{}\".marks (owner text, token bigint, at timestamptz)",
            schema.name()
        ))
        .execute(&pool)
        .await
        .unwrap();
    });
    let spawn = |owner: &str, seconds: u64| {
        Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "elector_child_process",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_URL, server.url())
            .env(CHILD_SCHEMA, schema.name())
            .env(CHILD_OWNER, owner)
            .env(CHILD_SECONDS, seconds.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut a = spawn("proc-a", 8);
    let b = spawn("proc-b", 8);
    std::thread::sleep(Duration::from_secs(3));
    a.kill().unwrap();
    let _ = a.wait();
    let c = spawn("proc-c", 4);
    for (name, child) in [("proc-b", b), ("proc-c", c)] {
        let output = child.wait_with_output().unwrap();
        assert!(
            output.status.success(),
            "{name} failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let marks: Vec<(String, i64)> = runtime.block_on(async {
        let pool = common::pool(server, 1, "processes").await;
        sqlx::query(&format!(
            "SELECT owner, token FROM \"{}\".marks ORDER BY at, token",
            schema.name()
        ))
        .fetch_all(&pool)
        .await
        .unwrap()
        .into_iter()
        .map(|row| (row.get("owner"), row.get("token")))
        .collect()
    });
    assert!(
        marks.len() > 50,
        "the processes did work: {} marks",
        marks.len()
    );
    let mut owners = std::collections::BTreeMap::new();
    for window in marks.windows(2) {
        assert!(
            window[1].1 >= window[0].1,
            "two processes worked at once: {:?} then {:?}",
            window[0],
            window[1]
        );
    }
    for (owner, token) in &marks {
        let first = owners.entry(*token).or_insert_with(|| owner.clone());
        assert_eq!(first, owner, "token {token} used by two processes");
    }
    let distinct: std::collections::BTreeSet<_> = marks.iter().map(|(o, _)| o).collect();
    assert!(owners.len() >= 3, "several terms: {owners:?}");
    assert!(distinct.len() >= 2, "several processes led: {distinct:?}");
}

/// Child mode of [`elector_processes_never_overlap`]: does nothing unless started by it.
#[test]
fn elector_child_process() {
    let (Ok(url), Ok(schema), Ok(owner), Ok(seconds)) = (
        std::env::var(CHILD_URL),
        std::env::var(CHILD_SCHEMA),
        std::env::var(CHILD_OWNER),
        std::env::var(CHILD_SECONDS),
    ) else {
        return;
    };
    let seconds: u64 = seconds.parse().unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async move {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(4)
            .connect(&url)
            .await
            .unwrap();
        let schema = Schema::new(&schema).unwrap();
        let marks = format!("\"{}\".marks", schema.name());
        let store = Arc::new(PgLeaseStore::new(pool.clone(), schema));
        let elector = LeaseLeaderElector::new(
            store,
            LeaseLeaderOptions {
                owner_id: owner.clone(),
                lease_ttl: Duration::from_secs(2),
                renew_interval: Duration::from_millis(300),
                retry_interval: Duration::from_millis(200),
                max_clock_drift: 0.1,
                ..Default::default()
            },
        )
        .unwrap();
        let end = Instant::now() + Duration::from_secs(seconds);
        while Instant::now() < end {
            let (pool, owner, marks) = (pool.clone(), owner.clone(), marks.clone());
            let shutdown = CancellationToken::new();
            let stop_at = {
                let shutdown = shutdown.clone();
                tokio::spawn(async move {
                    tokio::time::sleep_until(end.into()).await;
                    shutdown.cancel();
                })
            };
            elector
                .run(
                    "processes",
                    move |token, leadership| {
                        let (pool, owner, marks) = (pool.clone(), owner.clone(), marks.clone());
                        async move {
                            // Lead for about a second, then hand over by returning.
                            let until = Instant::now() + Duration::from_millis(900);
                            while !leadership.is_cancelled() && Instant::now() < until {
                                sqlx::query(&format!(
                                    "INSERT INTO {marks} VALUES ($1, $2, clock_timestamp())"
                                ))
                                .bind(&owner)
                                .bind(token.get() as i64)
                                .execute(&pool)
                                .await
                                .unwrap();
                                tokio::time::sleep(Duration::from_millis(10)).await;
                            }
                        }
                    },
                    shutdown,
                )
                .await
                .unwrap();
            stop_at.abort();
            // Give the others a chance at the next term.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
}

/// After a server restart, a store that kept several connections fails at most one call:
/// the first connection-level error closes the other kept ones and the next call opens a
/// new connection instead of taking one of the pool's (also dead, unpinged) idle ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_costs_at_most_one_failed_call() {
    common::init_tracing();
    let server = PgServer::start().expect("start PostgreSQL");
    let schema = common::fresh_schema();
    let backend = tenure_postgres::connect(
        &server.url(),
        tenure_postgres::ConnectOptions {
            schema: schema.name().to_owned(),
            max_connections: 4,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let store = backend.leases;
    let ttl = Duration::from_secs(30);
    // Four calls at once: the store keeps four connections.
    let calls: Vec<_> = (0..4)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let role = format!("r{i}");
                store.try_acquire(&role, "a", ttl).await
            })
        })
        .collect();
    for call in calls {
        assert!(call.await.unwrap().acquired);
    }

    tokio::task::block_in_place(|| server.restart().expect("restart"));
    let mut failures = Vec::new();
    let renewed = loop {
        match store.try_acquire_or_renew("r0", "a", ttl).await {
            Ok(lease) => break lease,
            Err(error) => failures.push(error.to_string()),
        }
        assert!(failures.len() < 10, "{failures:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(renewed.acquired, "{renewed:?}");
    assert!(failures.len() <= 1, "{failures:#?}");
}

/// A throwaway server for one test (which stalls its disk), a pool of `max`
/// connections named `app`, and a fresh schema migrated on it.
async fn migrated_on_a_server_of_its_own(max: u32, app: &str) -> (PgServer, sqlx::PgPool, Schema) {
    common::init_tracing();
    let server = PgServer::start().expect("start PostgreSQL");
    let schema = common::fresh_schema();
    let pool = common::pool(&server, max, app).await;
    migrate(&pool, &schema).await.unwrap();
    (server, pool, schema)
}

/// The server's WAL disk ([`PgServer::stall_wal`]) until the test heals it: commits
/// hang inside the server while their clients give up, which neither a restart nor a
/// row lock produces for every write at once; reads answer meanwhile.
struct WalDisk<'a>(&'a PgServer);

impl StalledDisk for WalDisk<'_> {
    fn stall(&self) {
        self.0.stall_wal().expect("stall the WAL disk");
    }

    async fn heal(&self) {
        self.0.heal_wal();
    }

    fn reads_answer(&self) -> bool {
        true
    }
}

/// A release given up while the server's disk stalls lands when the disk answers
/// again, with no further call from its caller; meanwhile the server answers reads,
/// every write waits, and the term stands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_given_up_on_a_stalled_disk_lands_when_it_answers() {
    let (server, pool, schema) = migrated_on_a_server_of_its_own(4, "stalled-disk").await;
    let store = PgLeaseStore::new(pool, schema);
    let (first, next) =
        stalled_disk::a_given_up_release_lands_when_the_disk_answers(&store, &WalDisk(&server))
            .await;
    assert_eq!(next, first.next(), "PostgreSQL's tokens are consecutive");
}

/// A server whose disk stalls for longer than the TTL, under a leader and a contender:
/// the leader stops by its local deadline, nobody leads while every commit waits, the
/// role is led again after the heal, and no two terms' work overlaps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_on_a_stalled_disk_stops_by_its_deadline() {
    let (server, pool, schema) = migrated_on_a_server_of_its_own(8, "stalled-disk-leader").await;
    let stores = [(); 2]
        .map(|()| Arc::new(PgLeaseStore::new(pool.clone(), schema.clone())) as Arc<dyn LeaseStore>);
    stalled_disk::a_leader_on_a_stalled_disk_stops_by_its_deadline(stores, &WalDisk(&server)).await;
}

/// A server whose default is `synchronous_commit = off` (a common tuning for speed)
/// acknowledges a commit before its WAL record is written, and a crash loses it. The
/// connections `connect` opens commit tenure's terms durably all the same: a term
/// acknowledged just before a SIGKILL of the server is there after its recovery, and
/// nobody else is handed its token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_term_acknowledged_before_a_crash_survives_asynchronous_commit() {
    common::init_tracing();
    let server = PgServer::start().expect("start PostgreSQL");
    server
        .commit_asynchronously()
        .expect("make commits asynchronous");
    let options = tenure_postgres::ConnectOptions {
        schema: common::fresh_schema().name().to_owned(),
        ..Default::default()
    };
    let backend = tenure_postgres::connect(&server.url(), options.clone())
        .await
        .expect("connect");
    // Without the raise to `on` the migration's commits are asynchronous too: a
    // checkpoint writes them, so that the term's commit is the one a crash can lose.
    tokio::task::block_in_place(|| server.psql("CHECKPOINT")).expect("checkpoint");
    let ttl = Duration::from_secs(30);
    let held = backend.leases.try_acquire("r", "a", ttl).await;
    assert!(held.acquired, "{held:?}");
    tokio::task::block_in_place(|| {
        server.kill();
        server.start_again().expect("start again");
    });
    let after = tenure_postgres::connect(&server.url(), options)
        .await
        .expect("connect after the crash");
    let other = after.leases.try_acquire("r", "b", ttl).await;
    assert!(
        !other.acquired && other.fencing_token == held.fencing_token,
        "the term acknowledged before the crash was lost: {other:?} after {held:?}"
    );
}

/// `connect` to a server that takes the TCP connection and then answers nothing (frozen)
/// gives up within its connect time limit with an error that says so, and connects once
/// the server answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_to_a_frozen_server_gives_up_in_time() {
    common::init_tracing();
    let server = PgServer::start().expect("start PostgreSQL");
    let options = tenure_postgres::ConnectOptions {
        schema: common::fresh_schema().name().to_owned(),
        connect_timeout: Duration::from_secs(1),
        ..Default::default()
    };
    tokio::task::block_in_place(|| server.pause());
    let started = Instant::now();
    let refused = tenure_postgres::connect(&server.url(), options.clone()).await;
    let took = started.elapsed();
    tokio::task::block_in_place(|| server.resume());
    let error = refused.expect_err("a frozen server cannot be connected to");
    assert!(took < Duration::from_secs(3), "gave up after {took:?}");
    assert!(error.to_string().contains("no answer within"), "{error}");
    tenure_postgres::connect(&server.url(), options)
        .await
        .expect("connect once the server answers");
}
