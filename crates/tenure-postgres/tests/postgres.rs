//! PostgreSQL-specific behaviour on real throwaway servers: races over separate
//! connections, push takeover, migrations, bad input and the store's own connections
//! (fenced transactions are in `fences.rs`, the advisory-lock elector in
//! `advisory.rs`).
//!
//! Tests that only read and write use the binary's shared server; tests that stop,
//! kill or restart a server start their own (see `faults.rs`).

mod common;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::PgPool;
use tenure::{Error, FenceStore, FencingToken, LeaseLeaderElector, LeaseLeaderOptions, LeaseStore};
use tenure_postgres::{connect, migrate, ConnectOptions, PgLeaseStore, Schema};
use tenure_testkit::postgres::PgServer;
use tenure_testkit::{in_time, MustAnswer};
use tokio_util::sync::CancellationToken;

async fn setup(app: &str) -> (PgPool, Schema) {
    common::migrated_with(app, 8).await
}

/// 32 tasks, each on its own connection (its own pool), race for one role over
/// several rounds: a fresh role (the row is created by the race), after a release, and
/// after an expiry. Exactly one winner per round, every answer names the winner's
/// term, and no token is handed out twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_32_connections_one_winner_per_term() {
    let (pool, schema) = setup("race-setup").await;
    let mut stores = Vec::new();
    for _ in 0..32 {
        let pool = common::pool(
            PgServer::shared().expect("shared PostgreSQL server"),
            1,
            "race",
        )
        .await;
        stores.push(Arc::new(PgLeaseStore::new(pool, schema.clone())));
    }
    let ttl = Duration::from_millis(1500);
    let admin = PgLeaseStore::new(pool, schema.clone());
    let mut seen = BTreeSet::new();
    for round in 0..6 {
        // Rounds 0 and 3 race for a role no one ever held: the row is created by the race.
        let role = format!("race-{}", round / 3);
        let barrier = Arc::new(tokio::sync::Barrier::new(stores.len()));
        let tasks: Vec<_> = stores
            .iter()
            .enumerate()
            .map(|(i, store)| {
                let store = Arc::clone(store);
                let barrier = Arc::clone(&barrier);
                let role = role.clone();
                tokio::spawn(async move {
                    barrier.wait().await;
                    let owner = format!("owner-{round}-{i}");
                    let result = store.try_acquire_or_renew(&role, &owner, ttl).await;
                    (owner, result.unwrap())
                })
            })
            .collect();
        let mut winners = Vec::new();
        let mut tokens = BTreeSet::new();
        let mut holders = BTreeSet::new();
        for task in tasks {
            let (owner, result) = task.await.unwrap();
            tokens.insert(result.fencing_token);
            holders.insert(result.holder.clone());
            if result.acquired {
                assert_eq!(result.holder, owner);
                winners.push((owner, result));
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: one winner: {winners:?}");
        assert_eq!(
            tokens.len(),
            1,
            "round {round}: one term in every answer: {tokens:?}"
        );
        assert_eq!(
            holders.len(),
            1,
            "round {round}: one holder in every answer: {holders:?}"
        );
        let (winner, result) = winners.remove(0);
        assert!(
            seen.insert((role.clone(), result.fencing_token)),
            "round {round}: token {} handed out twice",
            result.fencing_token
        );
        match round % 3 {
            0 | 1 => assert!(
                admin
                    .release_term(&role, &winner, result.fencing_token)
                    .await
            ),
            _ => tokio::time::sleep(ttl + Duration::from_millis(50)).await,
        }
    }
    // Per role, tokens 1, 2, 3 in order.
    for role in ["race-0", "race-1"] {
        let tokens: Vec<u64> = seen
            .iter()
            .filter(|(r, _)| r == role)
            .map(|(_, t)| t.get())
            .collect();
        assert_eq!(tokens, [1, 2, 3], "{role}");
    }
}

/// A released lease is taken over by a waiting elector in well under a second, although
/// its retry interval is 60 s and the lease's TTL 30 s: the release is pushed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_takeover_well_under_a_second() {
    let (pool, schema) = setup("push").await;
    let options = |owner: &str| LeaseLeaderOptions {
        owner_id: owner.to_owned(),
        lease_ttl: Duration::from_secs(30),
        renew_interval: Duration::from_secs(10),
        retry_interval: Duration::from_secs(60),
        ..Default::default()
    };
    let store_a = Arc::new(PgLeaseStore::new(pool.clone(), schema.clone()));
    let other_pool = common::pool(
        PgServer::shared().expect("shared PostgreSQL server"),
        4,
        "push-b",
    )
    .await;
    let store_b = Arc::new(PgLeaseStore::new(other_pool, schema.clone()));
    let a = Arc::new(LeaseLeaderElector::new(store_a, options("node-a")).unwrap());
    let b = Arc::new(LeaseLeaderElector::new(store_b, options("node-b")).unwrap());

    let stop_a = CancellationToken::new();
    let (a_led_tx, a_led) = tokio::sync::oneshot::channel();
    let a_task = {
        let a = Arc::clone(&a);
        let stop_a = stop_a.clone();
        let mut a_led_tx = Some(a_led_tx);
        tokio::spawn(async move {
            a.run(
                "push",
                move |token, leadership| {
                    if let Some(tx) = a_led_tx.take() {
                        let _ = tx.send(token);
                    }
                    async move { leadership.cancelled().await }
                },
                stop_a,
            )
            .await
        })
    };
    let a_token = in_time(Duration::from_secs(10), a_led, "a leads").await;

    let stop_b = CancellationToken::new();
    let b_started = Arc::new(Mutex::new(None::<(Instant, FencingToken)>));
    let b_task = {
        let b = Arc::clone(&b);
        let stop_b = stop_b.clone();
        let b_started = Arc::clone(&b_started);
        tokio::spawn(async move {
            b.run(
                "push",
                move |token, leadership| {
                    *b_started.lock().unwrap() = Some((Instant::now(), token));
                    async move { leadership.cancelled().await }
                },
                stop_b,
            )
            .await
        })
    };
    // Let b lose once and settle into waiting on the lease.
    let mut watch = b.watch();
    in_time(
        Duration::from_secs(10),
        watch.wait_for(|s| matches!(s, tenure::ElectionState::Follower { holder: Some(_) })),
        "b follows",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    stop_a.cancel();
    in_time(Duration::from_secs(10), a_task, "a stops")
        .await
        .unwrap();
    let released = Instant::now();
    let deadline = released + Duration::from_secs(5);
    let (started, b_token) = loop {
        if let Some(started) = *b_started.lock().unwrap() {
            break started;
        }
        assert!(Instant::now() < deadline, "b did not take over within 5 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let takeover = started.saturating_duration_since(released);
    assert!(b_token > a_token);
    assert!(
        takeover < Duration::from_millis(800),
        "takeover took {takeover:?}; expected a push, not the 60 s retry"
    );
    stop_b.cancel();
    b_task.await.unwrap().unwrap();
}

/// The shared listener's connection is terminated while a contender waits: the waiter
/// never spins (a few early returns at most), the listener reconnects, and a later
/// release is still pushed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listener_reconnects_without_spinning() {
    let (pool, schema) = setup("listener-setup").await;
    let holder = PgLeaseStore::new(pool, schema.clone());
    let waiter_pool = common::pool(
        PgServer::shared().expect("shared PostgreSQL server"),
        4,
        "listener-waiter",
    )
    .await;
    let waiter = PgLeaseStore::new(waiter_pool, schema.clone());
    let lease = holder
        .try_acquire("listened", "node-a", Duration::from_secs(30))
        .await;
    let returns = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let released = Arc::new(Mutex::new(None::<Instant>));
    let woke = {
        let (returns, released) = (returns.clone(), released.clone());
        tokio::spawn(async move {
            // What an elector does: wait, and on an early return re-check and wait again.
            loop {
                let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
                waiter
                    .wait_for_change("listened", lease.fencing_token, deadline)
                    .await;
                returns.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if let Some(at) = *released.lock().unwrap() {
                    return at.elapsed();
                }
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    for _ in 0..2 {
        PgServer::shared()
            .expect("shared PostgreSQL server")
            .psql(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE application_name = 'listener-waiter'",
            )
            .expect("psql");
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    let early = returns.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        early <= 4,
        "the waiter spun: {early} returns while the lease was held"
    );
    *released.lock().unwrap() = Some(Instant::now());
    assert!(
        holder
            .release_term("listened", "node-a", lease.fencing_token)
            .await
    );
    let after = in_time(
        Duration::from_secs(5),
        woke,
        "the release is pushed after the listener reconnected",
    )
    .await;
    assert!(
        after < Duration::from_secs(2),
        "woke {after:?} after the release"
    );
}

/// Several processes' worth of concurrent `migrate` calls on one fresh schema all
/// succeed, and `migrate` is idempotent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_migrations_succeed() {
    common::init_tracing();
    let schema = common::fresh_schema();
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let schema = schema.clone();
        tasks.push(tokio::spawn(async move {
            let pool = common::pool(
                PgServer::shared().expect("shared PostgreSQL server"),
                1,
                "migrate",
            )
            .await;
            migrate(&pool, &schema).await
        }));
    }
    for task in tasks {
        task.await.unwrap().expect("concurrent migrate");
    }
    let pool = common::pool(
        PgServer::shared().expect("shared PostgreSQL server"),
        1,
        "migrate",
    )
    .await;
    migrate(&pool, &schema).await.expect("idempotent");
}

/// `connect` builds everything from a URL; bad input is refused with messages that
/// never contain the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_and_bad_input() {
    common::init_tracing();
    let server = PgServer::shared().expect("shared PostgreSQL server");
    let options = |schema: &str| ConnectOptions {
        schema: schema.to_owned(),
        connect_timeout: Duration::from_secs(3),
        ..Default::default()
    };
    let schema = common::fresh_schema();
    let backend = connect(&server.url(), options(schema.name()))
        .await
        .expect("connect");
    let lease = backend
        .leases
        .try_acquire("cli", "node-a", Duration::from_secs(5))
        .await;
    assert!(lease.acquired);
    backend
        .fence
        .admit("res", lease.fencing_token)
        .await
        .unwrap();

    // Invalid schema names never reach SQL.
    for bad in ["bad-name", "x\"; DROP TABLE y; --", "", "pg_catalog"] {
        let refused = connect(&server.url(), options(bad)).await;
        assert!(
            matches!(
                refused,
                Err(Error::InvalidArgument {
                    field: "schema",
                    ..
                })
            ),
            "{bad:?}: {:?}",
            refused.err()
        );
    }

    // Not a URL.
    let refused = connect("postgres://u:sekrit@[::1:5/x", options("tenure")).await;
    let message = format!("{:?}", refused.err());
    assert!(
        message.contains("url") && !message.contains("sekrit"),
        "{message}"
    );

    // Unreachable: a port nothing listens on.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let started = Instant::now();
    let unreachable = connect(
        &format!("postgres://postgres:hunter2-unreachable@127.0.0.1:{port}/postgres"),
        options("tenure"),
    )
    .await;
    assert!(
        matches!(unreachable, Err(Error::Store { .. })),
        "{unreachable:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    let chain = error_chain(&unreachable.err().unwrap());
    assert!(!chain.contains("hunter2-unreachable"), "{chain}");

    // Wrong password: refused, and the password appears nowhere.
    let wrong = "Wr0ng-Pa55word-xyzzy";
    let url = server.url_for("postgres", wrong, "postgres");
    let refused = connect(&url, options("tenure")).await;
    let error = refused.expect_err("wrong password must fail");
    let chain = error_chain(&error);
    assert!(matches!(error, Error::Store { .. }), "{chain}");
    assert!(chain.contains("password authentication failed"), "{chain}");
    assert!(
        !chain.contains(wrong) && !format!("{error:?}").contains(wrong),
        "{chain}"
    );
}

/// `connect`'s pool commits durably whatever the URL asks for: a `synchronous_commit`
/// of `off` (here in the URL's options, as a server's or a role's default would be) is
/// raised to `on`, and any other value is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_never_commits_asynchronously() {
    common::init_tracing();
    let server = PgServer::shared().expect("shared PostgreSQL server");
    let schema = common::fresh_schema();
    for (asked, used) in [("off", "on"), ("local", "local"), ("on", "on")] {
        let url = format!("{}?options[synchronous_commit]={asked}", server.url());
        let options = ConnectOptions {
            schema: schema.name().to_owned(),
            ..Default::default()
        };
        let backend = connect(&url, options).await.expect("connect");
        let setting: String = sqlx::query_scalar("SHOW synchronous_commit")
            .fetch_one(&backend.pool)
            .await
            .unwrap();
        assert_eq!(setting, used, "asked for {asked}");
    }
}

/// A role without CREATE cannot migrate, and a role without table privileges cannot
/// acquire: both are store errors that say "permission denied".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_privileges_are_reported() {
    let (_pool, schema) = setup("privileges").await;
    let server = PgServer::shared().expect("shared PostgreSQL server");
    let role = format!("limited_{}", std::process::id());
    server
        .psql(&format!(
            "DROP ROLE IF EXISTS {role}; CREATE ROLE {role} LOGIN PASSWORD 'limited-pw';
         REVOKE CREATE ON DATABASE postgres FROM PUBLIC;
         GRANT USAGE ON SCHEMA \"{}\" TO {role};",
            schema.name()
        ))
        .expect("psql");
    let url = server.url_for(&role, "limited-pw", "postgres");
    let fresh = common::fresh_schema();
    let refused = connect(
        &url,
        ConnectOptions {
            schema: fresh.name().to_owned(),
            ..Default::default()
        },
    )
    .await;
    let chain = error_chain(&refused.expect_err("migrate without CREATE must fail"));
    assert!(chain.contains("permission denied"), "{chain}");

    let backend = connect(
        &url,
        ConnectOptions {
            schema: schema.name().to_owned(),
            migrate: false,
            ..Default::default()
        },
    )
    .await
    .expect("connect without migrating");
    let refused = backend
        .leases
        .try_acquire_or_renew("r", "a", Duration::from_secs(5))
        .await;
    let error = refused.expect_err("acquire without privileges must fail");
    assert!(error.is_transient());
    let chain = error_chain(&error);
    assert!(chain.contains("permission denied"), "{chain}");
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut chain = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        chain.push_str(": ");
        chain.push_str(&cause.to_string());
        source = cause.source();
    }
    chain
}

/// The store's own connections: renewals run on kept connections (no new connection per
/// call), and an acquire cancelled while its statement waits on a row lock leaves the
/// store answering correctly, with the same term, once the lock is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_calls_leave_the_store_usable_and_connections_are_kept() {
    let (admin, schema) = setup("direct-admin").await;
    let store_pool = common::pool(
        PgServer::shared().expect("shared PostgreSQL server"),
        4,
        "direct-store",
    )
    .await;
    let store = PgLeaseStore::new(store_pool, schema.clone());
    let ttl = Duration::from_secs(30);
    let first = store.try_acquire("r", "a", ttl).await;
    assert!(first.acquired);

    let pids = || async {
        let pids: Vec<i32> = sqlx::query_scalar(
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'direct-store' ORDER BY pid",
        )
        .fetch_all(&admin)
        .await
        .unwrap();
        pids
    };
    let before = pids().await;
    for _ in 0..20 {
        assert!(store.try_acquire("r", "a", ttl).await.acquired);
    }
    assert_eq!(pids().await, before, "renewals reuse the same connections");

    // Hold the row lock so the next renewal blocks inside its statement, then give up on it.
    let blocker = common::row_locked(&admin, &schema, "tenure_leases", "r").await;
    let cancelled = tokio::time::timeout(
        Duration::from_millis(300),
        store.try_acquire_or_renew("r", "a", ttl),
    )
    .await;
    assert!(cancelled.is_err(), "the renewal waits on the row lock");
    blocker.rollback().await.unwrap();

    for _ in 0..5 {
        let lease = in_time(
            Duration::from_secs(10),
            store.try_acquire_or_renew("r", "a", ttl),
            "no call hangs on a connection left mid-statement",
        )
        .await;
        assert!(lease.acquired);
        assert_eq!(
            lease.fencing_token, first.fencing_token,
            "still the same term"
        );
    }
    assert!(store.release_term("r", "a", first.fencing_token).await);
    assert!(!store.release_term("r", "a", first.fencing_token).await);
}

/// A call given up while its statement waits on a row lock must not leave its server
/// backend waiting too: the caller closed the connection, but a backend blocked on a lock
/// does not read its socket, so each give-up kept one backend (and its late statement)
/// until the lock was freed. A lock held for long (a holder's transaction stalled inside
/// [`PgFence::hold_lease_in_transaction`](tenure_postgres::PgFence), a migration) then
/// piled up one backend per retry, up to the server's `max_connections`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_given_up_in_a_lock_wait_do_not_keep_server_backends() {
    const APP: &str = "giveup-store";
    let (admin, schema) = setup("giveup-admin").await;
    let server = PgServer::shared().expect("shared PostgreSQL server");
    let store = PgLeaseStore::new(common::pool(server, 4, APP).await, schema.clone());
    let ttl = Duration::from_secs(30);
    let first = store.try_acquire("r", "a", ttl).await;
    assert!(first.acquired);

    let waiting = || async {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
             WHERE application_name = $1 AND wait_event_type = 'Lock'",
        )
        .bind(APP)
        .fetch_one(&admin)
        .await
        .unwrap();
        n
    };
    let blocker = common::row_locked(&admin, &schema, "tenure_leases", "r").await;
    for _ in 0..4 {
        let given_up = tokio::time::timeout(
            Duration::from_millis(200),
            store.try_acquire_or_renew("r", "a", ttl),
        )
        .await;
        assert!(given_up.is_err(), "the renewal waits on the row lock");
    }
    let asked = Instant::now();
    loop {
        let left = waiting().await;
        if left == 0 {
            break;
        }
        assert!(
            asked.elapsed() < Duration::from_secs(5),
            "{left} backends of given-up renewals still wait on the lock"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    blocker.rollback().await.unwrap();
    let lease = store
        .try_acquire_or_renew("r", "a", ttl)
        .await
        .expect("the store answers once the lock is gone");
    assert!(lease.acquired);
    assert_eq!(
        lease.fencing_token, first.fencing_token,
        "still the same term"
    );
}

/// A renewal that executes late must not move the lease's expiry backwards within a
/// term. `statement_timestamp()` is taken when the statement arrives; here the late
/// renewal arrives first and then waits (as it would behind a lock or a starved backend)
/// while a later renewal commits, so it runs with an older timestamp than the expiry
/// already granted. The elector's deadline follows the later renewal, so an expiry that
/// moved back would end the term on the store before the holder stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_renewal_never_moves_the_expiry_back() {
    let (pool, schema, store) = common::with_store(setup("late").await);
    let ttl = Duration::from_secs(30);
    let first = store.try_acquire("job", "node-a", ttl).await;
    assert!(first.acquired);

    // The store's own acquire statement, with its parameters as literals, behind a
    // sleep in the same simple-query message: both share one statement_timestamp().
    let table = format!("\"{}\".\"tenure_leases\"", schema.name());
    let sessions = format!("\"{}\".\"tenure_sessions\"", schema.name());
    let candidates = format!("\"{}\".\"tenure_candidates\"", schema.name());
    let late_sql = tenure_postgres::statements::acquire_statement(&table, &sessions, &candidates)
        .replace("$1", "'job'")
        .replace("$2", "'node-a'")
        .replace("$3", &ttl.as_micros().to_string())
        .replace("$4", &format!("'tenure:{}'", schema.name()));
    let late = common::run_late(&pool, 1.5, late_sql);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let renewed = store.try_acquire("job", "node-a", ttl).await;
    assert!(renewed.acquired && renewed.fencing_token == first.fencing_token);
    late.await.unwrap();

    let after = store.get("job").await.unwrap().expect("lease row");
    assert_eq!(after.fencing_token, first.fencing_token);
    assert!(
        after.expires_at >= renewed.expires_at,
        "the late renewal moved the expiry back by {:?}",
        renewed
            .expires_at
            .duration_since(after.expires_at)
            .unwrap_or_default()
    );
}
