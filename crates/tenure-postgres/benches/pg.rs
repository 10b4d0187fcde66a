//! PostgreSQL store hot paths against a throwaway server, each beside the same SQL
//! statement issued directly in the same run.
//!
//! - `pg_renew/{1,16}`: `PgLeaseStore::try_acquire_or_renew` renewing a live term, each
//!   client (a tokio task with its own connection) on its own role;
//!   - `store`: over a pool built as `tenure_postgres::connect` builds it (sqlx
//!     defaults, so `test_before_acquire` pings the connection on every checkout);
//!   - `store_noping`: the same over a pool with `test_before_acquire(false)`;
//!   - `raw`: the store's statement text on a plain `PgConnection` (the baseline).
//! - `pg_heartbeat/{1,16}`: `PgNodeRegistry::heartbeat`, same three variants.
//!
//! After criterion, with `--bench` (that is, under `cargo bench`):
//! - an interleaved A/B run (rounds of a fixed op count, variants alternating, median
//!   per variant) giving the store/raw ratios on a noisy machine;
//! - pgbench running the same upsert, when `pgbench` is installed;
//! - statements per operation, from `pg_stat_statements` (preloaded by restarting the
//!   throwaway server after `ALTER SYSTEM`);
//! - release -> successor running latency of two `LeaseLeaderElector`s (60 s retry
//!   interval, so only the LISTEN/NOTIFY push can wake the successor).
//!
//! The raw baseline issues the store's own statements (`tenure_postgres::statements`),
//! so the two cannot drift apart.
//!
//! Run: `cargo bench -p tenure-postgres --bench pg`.

use std::future::Future;
use std::process::Command;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgConnection, PgPool};
use tenure::{LeaseLeaderElector, LeaseLeaderOptions, LeaseStore, NodeRegistry};
use tenure_postgres::{PgLeaseStore, PgNodeRegistry, Schema};
use tenure_testkit::postgres::PgServer;
use tokio::runtime::Runtime;
use tokio::sync::{mpsc, Mutex, Notify};
use tokio_util::sync::CancellationToken;

const SCHEMA: &str = "bench";
const TTL: Duration = Duration::from_secs(600);
const REGISTRY_TTL: Duration = Duration::from_secs(600);
const CLIENT_COUNTS: [usize; 2] = [1, 16];

use tenure_postgres::statements::{
    acquire_statement as acquire_sql, heartbeat_statement as heartbeat_sql,
    release_statement as release_sql,
};

fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Renew,
    Heartbeat,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    Store,
    StoreNoPing,
    StorePool8,
    Raw,
}

impl Variant {
    const ALL: [Variant; 4] = [
        Variant::Raw,
        Variant::Store,
        Variant::StoreNoPing,
        Variant::StorePool8,
    ];

    fn name(self) -> &'static str {
        match self {
            Variant::Store => "store",
            Variant::StoreNoPing => "store_noping",
            Variant::StorePool8 => "store_pool8",
            Variant::Raw => "raw",
        }
    }
}

/// One benchmark client: a task's own connection (a one-connection pool for the
/// store variants, a plain connection for the baseline) and its own role or node.
enum Client {
    Lease {
        store: PgLeaseStore,
        role: String,
    },
    LeaseRaw {
        conn: PgConnection,
        sql: Arc<str>,
        role: String,
        channel: String,
    },
    Heartbeat {
        registry: PgNodeRegistry,
        node: String,
    },
    HeartbeatRaw {
        conn: PgConnection,
        sql: Arc<str>,
        node: String,
    },
}

impl Client {
    async fn op(&mut self) {
        match self {
            Client::Lease { store, role } => {
                let lease = store
                    .try_acquire_or_renew(role, role, TTL)
                    .await
                    .expect("renew");
                assert!(lease.acquired);
            }
            Client::LeaseRaw {
                conn,
                sql,
                role,
                channel,
            } => {
                let row = sqlx::query(sql)
                    .bind(&*role)
                    .bind(&*role)
                    .bind(micros(TTL))
                    .bind(&*channel)
                    .fetch_one(conn)
                    .await
                    .expect("raw renew");
                let holder: Option<String> = sqlx::Row::get(&row, 0);
                assert_eq!(holder.as_deref(), Some(role.as_str()));
            }
            Client::Heartbeat { registry, node } => registry.heartbeat(node).await.expect("hb"),
            Client::HeartbeatRaw { conn, sql, node } => {
                sqlx::query(sql)
                    .bind(micros(REGISTRY_TTL))
                    .bind(&*node)
                    .bind(None::<String>)
                    .execute(conn)
                    .await
                    .expect("raw heartbeat");
            }
        }
    }
}

type Clients = Vec<Arc<Mutex<Client>>>;

struct Env {
    rt: Runtime,
    server: PgServer,
    options: PgConnectOptions,
    schema: Schema,
    /// pg_stat_statements could be preloaded.
    stat_statements: bool,
}

impl Env {
    fn start() -> Env {
        let server = PgServer::start();
        // Preloading needs a restart; the harness keeps the data directory and port.
        let stat_statements = std::panic::catch_unwind(|| {
            server.psql("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'");
            server.restart();
            server.psql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements");
        })
        .is_ok();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let options = PgConnectOptions::from_str(&server.url())
            .unwrap()
            .application_name("tenure-bench");
        let schema = Schema::new(SCHEMA).unwrap();
        let env = Env {
            rt,
            server,
            options,
            schema,
            stat_statements,
        };
        env.rt.block_on(async {
            let pool = env.pool(true, 1).await;
            tenure_postgres::migrate(&pool, &env.schema).await.unwrap();
        });
        env
    }

    async fn pool(&self, ping: bool, size: u32) -> PgPool {
        PgPoolOptions::new()
            .max_connections(size)
            .min_connections(size)
            .test_before_acquire(ping)
            .connect_with(self.options.clone())
            .await
            .unwrap()
    }

    async fn conn(&self) -> PgConnection {
        self.options.connect().await.unwrap()
    }

    fn table(&self, table: &str) -> String {
        format!("\"{}\".\"{table}\"", self.schema.name())
    }

    fn channel(&self) -> String {
        format!("tenure:{}", self.schema.name())
    }

    /// `n` clients of `variant` for `op`, each holding its own live term (renew) or a
    /// registered node (heartbeat) before measuring.
    async fn clients(&self, op: Op, variant: Variant, n: usize) -> Clients {
        let mut out = Vec::with_capacity(n);
        // What `tenure_postgres::connect` builds: 8 connections, sqlx's defaults.
        let shared = self.pool(true, 8).await;
        for i in 0..n {
            let pool = match variant {
                Variant::Store => self.pool(true, 1).await,
                Variant::StoreNoPing => self.pool(false, 1).await,
                Variant::StorePool8 | Variant::Raw => shared.clone(),
            };
            let name = format!("{}-{}-{n}-{i}", variant.name(), op_name(op));
            let mut client = match (op, variant) {
                (Op::Renew, Variant::Raw) => Client::LeaseRaw {
                    conn: self.conn().await,
                    sql: acquire_sql(&self.table("tenure_leases")).into(),
                    role: name,
                    channel: self.channel(),
                },
                (Op::Renew, _) => Client::Lease {
                    store: PgLeaseStore::new(pool, self.schema.clone()),
                    role: name,
                },
                (Op::Heartbeat, Variant::Raw) => Client::HeartbeatRaw {
                    conn: self.conn().await,
                    sql: heartbeat_sql(&self.table("tenure_nodes")).into(),
                    node: name,
                },
                (Op::Heartbeat, _) => Client::Heartbeat {
                    registry: PgNodeRegistry::new(pool, self.schema.clone(), REGISTRY_TTL).unwrap(),
                    node: name,
                },
            };
            // The first call creates the row (and prepares the statement).
            client.op().await;
            out.push(Arc::new(Mutex::new(client)));
        }
        out
    }
}

fn op_name(op: Op) -> &'static str {
    match op {
        Op::Renew => "renew",
        Op::Heartbeat => "heartbeat",
    }
}

/// Runs `per_client` operations on every client at once (one task each) and returns
/// the wall time until the last one finished.
async fn run_clients(clients: &Clients, per_client: u64) -> Duration {
    let start = Instant::now();
    let tasks: Vec<_> = clients
        .iter()
        .map(|client| {
            let client = Arc::clone(client);
            tokio::spawn(async move {
                let mut client = client.lock().await;
                for _ in 0..per_client {
                    client.op().await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    start.elapsed()
}

fn throughput(c: &mut Criterion, env: &Env) {
    for op in [Op::Renew, Op::Heartbeat] {
        for n in CLIENT_COUNTS {
            let mut group = c.benchmark_group(format!("pg_{}/{n}", op_name(op)));
            group.throughput(Throughput::Elements(1));
            for variant in Variant::ALL {
                let clients = env.rt.block_on(env.clients(op, variant, n));
                group.bench_function(variant.name(), |b| {
                    b.iter_custom(|iters| {
                        // A fixed op count split over the clients; scaled back to `iters`.
                        let per_client = iters.div_ceil(n as u64).max(1);
                        let elapsed = env.rt.block_on(run_clients(&clients, per_client));
                        elapsed.mul_f64(iters as f64 / (per_client * n as u64) as f64)
                    })
                });
            }
            group.finish();
        }
    }
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

fn quartiles(values: &mut [f64]) -> (f64, f64, f64) {
    values.sort_by(|a, b| a.total_cmp(b));
    let at = |p: f64| values[((values.len() - 1) as f64 * p).round() as usize];
    (at(0.25), at(0.5), at(0.75))
}

/// CPU time (user + system) of this whole process, the benchmark client's side.
fn process_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer for the duration of the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0);
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Rounds of a fixed op count, the variants taking turns, so load spikes from other
/// users of the machine hit every variant alike. Reports the median ops/s per variant,
/// the median (and quartiles) of the per-round ratio against `raw` measured right
/// before it, and the client-side CPU per operation.
fn interleaved(env: &Env, rounds: usize) {
    println!("\n== interleaved A/B: {rounds} rounds; median ops/s; per-round ratio to raw p25/p50/p75; client CPU us/op ==");
    print!("{:<10} {:>3}", "op", "n");
    for v in Variant::ALL {
        print!(" {:>12}", v.name());
    }
    for v in &Variant::ALL[1..] {
        print!("   {:<16}", format!("{}/raw", v.name()));
    }
    for v in Variant::ALL {
        print!(" {:>12}", format!("cpu:{}", v.name()));
    }
    println!();
    for op in [Op::Renew, Op::Heartbeat] {
        for n in CLIENT_COUNTS {
            let total: u64 = if n == 1 { 600 } else { 3_200 };
            let per_client = total / n as u64;
            let ops = (per_client * n as u64) as f64;
            let sets: Vec<Clients> = Variant::ALL
                .iter()
                .map(|&v| env.rt.block_on(env.clients(op, v, n)))
                .collect();
            let mut rates = vec![Vec::new(); Variant::ALL.len()];
            let mut ratios = vec![Vec::new(); Variant::ALL.len()];
            let mut cpu = vec![Duration::ZERO; Variant::ALL.len()];
            for _ in 0..rounds {
                for (i, clients) in sets.iter().enumerate() {
                    let cpu_before = process_cpu();
                    let elapsed = env.rt.block_on(run_clients(clients, per_client));
                    cpu[i] += process_cpu() - cpu_before;
                    rates[i].push(ops / elapsed.as_secs_f64());
                    let raw = rates[0][rates[0].len() - 1];
                    ratios[i].push(rates[i][rates[i].len() - 1] / raw);
                }
            }
            print!("{:<10} {:>3}", op_name(op), n);
            for rate in &mut rates {
                print!(" {:>12.0}", median(rate));
            }
            for ratio in &mut ratios[1..] {
                let (lo, mid, hi) = quartiles(ratio);
                print!("   {:<16}", format!("{lo:.2}/{mid:.2}/{hi:.2}"));
            }
            for c in &cpu {
                print!(" {:>12.1}", c.as_secs_f64() * 1e6 / (ops * rounds as f64));
            }
            println!();
        }
    }
}

/// The same upsert through pgbench (prepared mode), when it is installed.
fn pgbench(env: &Env) {
    let Some(bin) = ["/usr/bin/pgbench", "/usr/local/bin/pgbench"]
        .iter()
        .find(|p| std::path::Path::new(p).is_file())
    else {
        println!("\npgbench not installed; skipped");
        return;
    };
    let dir = std::env::temp_dir().join(format!("tenure-bench-pgbench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("upsert.sql");
    // The store's statement with parameters as literals; each pgbench connection
    // renews its own role, named after its backend pid.
    let sql = acquire_sql(&env.table("tenure_leases"))
        .replace("$1", "('pgbench-' || pg_backend_pid())")
        .replace("$2", "('pgbench-' || pg_backend_pid())")
        .replace("$3", &micros(TTL).to_string())
        // pgbench takes `:name` for a variable even inside a string literal.
        .replace(
            "$4",
            &format!("'tenure' || chr(58) || '{}'", env.schema.name()),
        );
    std::fs::write(&script, format!("{sql};\n")).unwrap();
    println!("\n== pgbench -M prepared, the store's upsert (renewing) ==");
    for n in CLIENT_COUNTS {
        let output = Command::new(bin)
            .args(["-n", "-M", "prepared", "-T", "4", "-c", &n.to_string()])
            .args(["-j", if n == 1 { "1" } else { "2" }])
            .arg("-f")
            .arg(&script)
            .args(["-h", "127.0.0.1", "-p", &env.server.port().to_string()])
            .args(["-U", "postgres", "postgres"])
            .env("PGPASSWORD", env.server.password())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        let tps = stdout
            .lines()
            .find(|l| l.starts_with("tps"))
            .unwrap_or("(no tps line)");
        if output.status.success() {
            println!("clients {n:>2}: {tps}");
        } else {
            println!(
                "clients {n:>2}: pgbench failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Executions recorded by pg_stat_statements since the last reset, by statement,
/// leaving out the bookkeeping queries themselves.
fn statement_calls(env: &Env) -> Vec<(i64, String)> {
    let out = env.server.psql(
        "SELECT calls, regexp_replace(left(query, 60), '\\s+', ' ', 'g') FROM pg_stat_statements \
         WHERE query NOT ILIKE '%pg_stat_statements%' ORDER BY calls DESC",
    );
    out.lines()
        .filter_map(|l| {
            let (calls, query) = l.split_once('|')?;
            Some((calls.parse().ok()?, query.to_owned()))
        })
        .collect()
}

fn statements_per_op(env: &Env) {
    if !env.stat_statements {
        println!("\npg_stat_statements could not be preloaded; statement counts skipped");
        return;
    }
    const N: usize = 200;
    println!("\n== statements per operation (pg_stat_statements, {N} operations each) ==");
    let ttl = Duration::from_secs(60);
    let (store, registry) = env.rt.block_on(async {
        let pool = env.pool(true, 1).await;
        (
            PgLeaseStore::new(pool.clone(), env.schema.clone()),
            PgNodeRegistry::new(pool, env.schema.clone(), REGISTRY_TTL).unwrap(),
        )
    });
    let tag = std::process::id();
    let report = |what: &str| {
        let calls = statement_calls(env);
        let total: i64 = calls.iter().map(|(c, _)| c).sum();
        let detail: Vec<String> = calls.iter().map(|(c, q)| format!("{c} x {q}")).collect();
        println!(
            "{what:<22} {:.2} statements/op   [{}]",
            total as f64 / N as f64,
            detail.join("; ")
        );
    };
    let reset = || {
        env.server.psql("SELECT pg_stat_statements_reset()");
    };
    reset();
    env.rt.block_on(async {
        for i in 0..N {
            let role = format!("count-{tag}-{i}");
            assert!(
                store
                    .try_acquire_or_renew(&role, "a", ttl)
                    .await
                    .unwrap()
                    .acquired
            );
        }
    });
    report("acquire (new role)");
    reset();
    env.rt.block_on(async {
        for i in 0..N {
            let role = format!("count-{tag}-{i}");
            assert!(
                store
                    .try_acquire_or_renew(&role, "a", ttl)
                    .await
                    .unwrap()
                    .acquired
            );
        }
    });
    report("renew");
    reset();
    env.rt.block_on(async {
        for i in 0..N {
            let role = format!("count-{tag}-{i}");
            let token = store.get(&role).await.unwrap().unwrap().fencing_token;
            // Not counted: the `get` above is one statement per op, subtracted below.
            assert!(store.release(&role, "a", token).await.unwrap());
        }
    });
    let calls = statement_calls(env);
    let total: i64 = calls.iter().map(|(c, _)| c).sum();
    println!(
        "{:<22} {:.2} statements/op   (total {} less {N} gets)",
        "release",
        (total - N as i64) as f64 / N as f64,
        total
    );
    reset();
    env.rt.block_on(async {
        for i in 0..N {
            let role = format!("count-{tag}-{i}");
            assert!(
                store
                    .try_acquire_or_renew(&role, "b", ttl)
                    .await
                    .unwrap()
                    .acquired
            );
        }
    });
    report("acquire (after release)");
    reset();
    env.rt.block_on(async {
        for i in 0..N {
            registry
                .heartbeat(&format!("count-{tag}-{i}"))
                .await
                .unwrap();
        }
    });
    report("heartbeat");
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index]
}

enum Event {
    Started(usize, Instant),
    Released(Instant),
}

/// The signals one elector listens to: end the current term; contend again.
#[derive(Default)]
struct Steering {
    step_down: Notify,
    rejoin: Notify,
}

/// A pause of 30 to 50 ms, uniformly spread, between a successor starting and the next
/// step-down, so the new follower is surely parked waiting for the push.
fn settle_pause() -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let mut x = (nanos as u64) | 1;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    Duration::from_micros(30_000 + x % 20_000)
}

/// Release -> successor running: two electors on one role, handing the lease back and
/// forth. Each leader's work reports when it starts and, when told to step down, the
/// instant it returns (the elector then releases at once); the successor only learns of
/// the release by push, since its retry interval is 60 s. The elector that stepped
/// down stays out until the successor has started, so it cannot take the lease
/// straight back.
fn handover<S, F, Fut>(rt: &Runtime, label: &str, handovers: usize, make_store: F)
where
    S: LeaseStore + 'static,
    F: Fn() -> Fut,
    Fut: Future<Output = S>,
{
    let latencies = rt.block_on(async {
        let (events_tx, mut events) = mpsc::unbounded_channel();
        let shutdown = CancellationToken::new();
        let steering: Vec<Arc<Steering>> = (0..2).map(|_| Arc::default()).collect();
        let role = format!("handover-{}-{label}", std::process::id()).replace(' ', "_");
        let mut tasks = Vec::new();
        for (id, steer) in steering.iter().enumerate() {
            let store: Arc<dyn LeaseStore> = Arc::new(make_store().await);
            let elector = LeaseLeaderElector::new(
                store,
                LeaseLeaderOptions {
                    owner_id: format!("elector-{id}-{}", std::process::id()),
                    lease_ttl: Duration::from_secs(30),
                    renew_interval: Duration::from_secs(10),
                    retry_interval: Duration::from_secs(60),
                    ..Default::default()
                },
            )
            .unwrap();
            let events_tx = events_tx.clone();
            let shutdown = shutdown.clone();
            let steer = Arc::clone(steer);
            let role = role.clone();
            tasks.push(tokio::spawn(async move {
                loop {
                    let events_tx = events_tx.clone();
                    let work_steer = Arc::clone(&steer);
                    elector
                        .run(
                            &role,
                            move |_token, leadership: CancellationToken| {
                                let events_tx = events_tx.clone();
                                let steer = Arc::clone(&work_steer);
                                async move {
                                    let _ = events_tx.send(Event::Started(id, Instant::now()));
                                    tokio::select! {
                                        _ = steer.step_down.notified() => {
                                            let _ = events_tx.send(Event::Released(Instant::now()));
                                        }
                                        _ = leadership.cancelled() => {}
                                    }
                                }
                            },
                            shutdown.clone(),
                        )
                        .await
                        .unwrap();
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = steer.rejoin.notified() => {}
                    }
                }
            }));
        }
        let mut latencies = Vec::with_capacity(handovers);
        let mut released: Option<(usize, Instant)> = None;
        let mut leader: Option<usize> = None;
        while latencies.len() < handovers {
            let event = tokio::time::timeout(Duration::from_secs(10), events.recv())
                .await
                .expect("a handover within 10 s")
                .unwrap();
            match event {
                Event::Released(at) => released = Some((leader.expect("a leader"), at)),
                Event::Started(id, at) => {
                    if let Some((from, released_at)) = released.take() {
                        assert_ne!(from, id, "the stepping-down elector came back first");
                        latencies.push(at - released_at);
                        steering[from].rejoin.notify_one();
                    }
                    leader = Some(id);
                    tokio::time::sleep(settle_pause()).await;
                    steering[id].step_down.notify_one();
                }
            }
        }
        shutdown.cancel();
        for task in tasks {
            task.await.unwrap();
        }
        latencies
    });
    report_latencies(label, latencies);
}

/// Acquires `role` for `owner` with the store's statement; returns the token.
async fn raw_acquire(
    conn: &mut PgConnection,
    sql: &str,
    role: &str,
    owner: &str,
    channel: &str,
) -> i64 {
    let row = sqlx::query(sql)
        .bind(role)
        .bind(owner)
        .bind(micros(TTL))
        .bind(channel)
        .fetch_one(conn)
        .await
        .unwrap();
    let holder: Option<String> = sqlx::Row::get(&row, 0);
    assert_eq!(holder.as_deref(), Some(owner));
    sqlx::Row::get(&row, 1)
}

/// The floor of a push handover, without the store or the elector: on plain
/// connections, one releases with the store's release statement, a `PgListener` (one
/// per process, as the store has) receives the notification, and the other acquires
/// with the store's acquire statement. Measured from before the release to after the
/// acquire returned, in one task.
fn raw_handover(env: &Env, handovers: usize) {
    let latencies = env.rt.block_on(async {
        let role = format!("raw-handover-{}", std::process::id());
        let acquire = acquire_sql(&env.table("tenure_leases"));
        let release = release_sql(&env.table("tenure_leases"));
        let channel = env.channel();
        let pool = env.pool(true, 1).await;
        let mut listener = sqlx::postgres::PgListener::connect_with(&pool)
            .await
            .unwrap();
        listener.listen(&channel).await.unwrap();
        let mut conns = [env.conn().await, env.conn().await];
        let owners = ["raw-a", "raw-b"];
        let mut token = raw_acquire(&mut conns[0], &acquire, &role, owners[0], &channel).await;
        // Drain the notification of that first term.
        listener.recv().await.unwrap();
        let mut latencies = Vec::with_capacity(handovers);
        for i in 0..handovers {
            let (from, to) = if i % 2 == 0 { (0, 1) } else { (1, 0) };
            tokio::time::sleep(settle_pause()).await;
            let start = Instant::now();
            let released: i64 = sqlx::query_scalar(&release)
                .bind(&role)
                .bind(owners[from])
                .bind(token)
                .bind(&channel)
                .fetch_one(&mut conns[from])
                .await
                .unwrap();
            assert_eq!(released, 1);
            let note = listener.recv().await.unwrap();
            assert_eq!(note.payload(), role);
            token = raw_acquire(&mut conns[to], &acquire, &role, owners[to], &channel).await;
            latencies.push(start.elapsed());
            // The new term notifies too; take it so it is not mistaken for the next release.
            listener.recv().await.unwrap();
        }
        latencies
    });
    report_latencies("raw statements + PgListener (floor)", latencies);
}

fn report_latencies(label: &str, mut sorted: Vec<Duration>) {
    sorted.sort();
    println!(
        "{label:<38} n={:<4} p50 {:>7.3} ms  p90 {:>7.3} ms  p99 {:>7.3} ms  max {:>7.3} ms",
        sorted.len(),
        percentile(&sorted, 0.5).as_secs_f64() * 1e3,
        percentile(&sorted, 0.9).as_secs_f64() * 1e3,
        percentile(&sorted, 0.99).as_secs_f64() * 1e3,
        sorted[sorted.len() - 1].as_secs_f64() * 1e3,
    );
}

/// Profiling mode (`TENURE_PG_BENCH_PROFILE=store|store_noping|raw`): renews from 16
/// clients for 20 s and exits, for `perf record`.
fn profile(env: &Env, variant: &str) {
    let variant = Variant::ALL
        .into_iter()
        .find(|v| v.name() == variant)
        .expect("a variant name");
    let clients = env.rt.block_on(env.clients(Op::Renew, variant, 16));
    let start = Instant::now();
    let mut ops = 0;
    while start.elapsed() < Duration::from_secs(20) {
        env.rt.block_on(run_clients(&clients, 100));
        ops += 1_600;
    }
    println!("{variant:?}: {ops} renewals in {:?}", start.elapsed());
}

/// The round trip floor on this machine: `SELECT 1` on a plain connection.
fn round_trip(env: &Env) {
    let mut samples = env.rt.block_on(async {
        let mut conn = env.conn().await;
        let mut samples = Vec::with_capacity(2_000);
        for _ in 0..2_000 {
            let start = Instant::now();
            sqlx::query("SELECT 1").execute(&mut conn).await.unwrap();
            samples.push(start.elapsed());
        }
        conn.close().await.unwrap();
        samples
    });
    samples.sort();
    println!(
        "\nround trip (SELECT 1, plain connection): p50 {:.3} ms  p99 {:.3} ms",
        percentile(&samples, 0.5).as_secs_f64() * 1e3,
        percentile(&samples, 0.99).as_secs_f64() * 1e3
    );
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` does not (a smoke run).
    let full = std::env::args().any(|a| a == "--bench");
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(10)
        .configure_from_args();
    let env = Env::start();
    if let Ok(variant) = std::env::var("TENURE_PG_BENCH_PROFILE") {
        profile(&env, &variant);
        return;
    }
    throughput(&mut c, &env);
    c.final_summary();
    if !full {
        handover(&env.rt, "handover smoke", 3, || async {
            PgLeaseStore::new(env.pool(true, 2).await, env.schema.clone())
        });
        return;
    }
    interleaved(&env, 15);
    pgbench(&env);
    statements_per_op(&env);
    round_trip(&env);
    println!("\n== release -> successor work started ==");
    raw_handover(&env, 150);
    handover(&env.rt, "two electors, separate stores", 150, || async {
        PgLeaseStore::new(env.pool(true, 2).await, env.schema.clone())
    });
    handover(
        &env.rt,
        "separate stores, pools without ping",
        150,
        || async { PgLeaseStore::new(env.pool(false, 2).await, env.schema.clone()) },
    );
    let shared = env
        .rt
        .block_on(async { PgLeaseStore::new(env.pool(true, 4).await, env.schema.clone()) });
    handover(&env.rt, "two electors, one shared store", 150, || {
        let store = shared.clone();
        async move { store }
    });
}
