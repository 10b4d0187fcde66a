//! PostgreSQL store hot paths against a throwaway server, each beside the same SQL
//! statement issued directly in the same run.
//!
//! - `pg_renew/{1,16}`: `PgLeaseStore::try_acquire_or_renew` renewing a live term, each
//!   client (a tokio task) on its own role;
//!   - `store`: a store per client, over a one-connection pool (the store keeps the
//!     connection its statements run on out of the pool: see `src/direct.rs`);
//!   - `raw`: the store's statement text on a plain `PgConnection` (the baseline).
//! - `pg_heartbeat/{1,16}`: `PgNodeRegistry::heartbeat`, same two variants.
//!
//! After criterion, with `--bench` (that is, under `cargo bench`): an interleaved A/B run
//! (rounds of a fixed op count, variants alternating, median per variant) giving the
//! store/raw ratios on a noisy machine; pgbench running the same upsert, when installed;
//! the round-trip floor (`SELECT 1`). Statements per operation and failover times are
//! measured by `tenure bench --store postgres:throwaway` (crate `tenure-bench`).
//!
//! The raw baseline issues the store's own statements (`tenure_postgres::statements`),
//! so the two cannot drift apart.
//!
//! Run: `cargo bench -p tenure-postgres --bench pg`.

use std::process::Command;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgConnection, PgPool};
use tenure::{LeaseStore, NodeRegistry};
use tenure_postgres::{PgLeaseStore, PgNodeRegistry, Schema};
use tenure_testkit::postgres::PgServer;
use tokio::runtime::Runtime;
use tokio::sync::Mutex;

const SCHEMA: &str = "bench";
const TTL: Duration = Duration::from_secs(600);
const REGISTRY_TTL: Duration = Duration::from_secs(600);
const CLIENT_COUNTS: [usize; 2] = [1, 16];

use tenure_postgres::statements::{
    acquire_statement as acquire_sql, heartbeat_statement as heartbeat_sql,
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
    Raw,
}

impl Variant {
    const ALL: [Variant; 2] = [Variant::Raw, Variant::Store];

    fn name(self) -> &'static str {
        match self {
            Variant::Store => "store",
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
                    .bind("tenure-members:bench")
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
}

impl Env {
    fn start() -> Env {
        let server = PgServer::start().expect("start PostgreSQL");
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
        };
        env.rt.block_on(async {
            let pool = env.pool(1).await;
            tenure_postgres::migrate(&pool, &env.schema).await.unwrap();
        });
        env
    }

    async fn pool(&self, size: u32) -> PgPool {
        PgPoolOptions::new()
            .max_connections(size)
            .min_connections(size)
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
        for i in 0..n {
            let pool = self.pool(1).await;
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

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index]
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
    throughput(&mut c, &env);
    c.final_summary();
    if !full {
        return;
    }
    interleaved(&env, 15);
    pgbench(&env);
    round_trip(&env);
}
