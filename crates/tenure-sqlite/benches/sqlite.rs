//! SQLite store hot paths on one file, each beside the store's own statements issued
//! directly with sqlx in the same run.
//!
//! - `sqlite_renew/1`: `SqliteLeaseStore::try_acquire_or_renew` renewing a live term
//!   from one task; `sqlite_renew/4proc`: the same from 4 OS processes on one file at
//!   once (this binary re-executed as children, selected by an environment variable),
//!   each process on its own role. Variants:
//!   - `store`: `SqliteLeaseStore::open` as `tenure run` opens it (sqlx pool defaults,
//!     so `test_before_acquire` pings the connection on every checkout);
//!   - `store_noping`: the same store over a pool with `test_before_acquire(false)`;
//!   - `raw`: the store's renewal statements (boot-id read, row read, row update)
//!     in one `BEGIN IMMEDIATE` transaction on a plain `SqliteConnection`, with the
//!     store's settings (WAL, `synchronous = FULL`, 5 s busy timeout): the baseline.
//!
//! After criterion, with `--bench` (that is, under `cargo bench`):
//! - an interleaved A/B run (rounds of a fixed op count, variants alternating, median
//!   per variant), adding `raw_sync_normal` (the baseline without the commit fsync) to
//!   show what the fsync costs;
//! - release -> takeover latency of two `LeaseLeaderElector`s (60 s retry interval):
//!   sharing one `SqliteDatabase` (in-process signal), on two databases in one process
//!   (polling), and across two processes (polling).
//!
//! The raw baseline issues the store's own statements (`tenure_sqlite::statements`),
//! so the two cannot drift apart.
//!
//! Run: `cargo bench -p tenure-sqlite --bench sqlite`.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use criterion::{Criterion, Throughput};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{ConnectOptions, Connection};
use tenure::{LeaseLeaderElector, LeaseLeaderOptions, LeaseStore};
use tenure_sqlite::{statements, SqliteDatabase, SqliteLeaseStore};
use tokio::io::AsyncBufReadExt;
use tokio::runtime::Runtime;
use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;

const TTL: Duration = Duration::from_secs(600);
const PROCESSES: usize = 4;
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Child mode: `throughput` or `handover`; the rest of the setup comes in the
/// variables below.
const CHILD: &str = "TENURE_SQLITE_BENCH_CHILD";
const CHILD_DB: &str = "TENURE_SQLITE_BENCH_DB";
const CHILD_VARIANT: &str = "TENURE_SQLITE_BENCH_VARIANT";
const CHILD_ROLE: &str = "TENURE_SQLITE_BENCH_ROLE";

fn now_nanos() -> i64 {
    i64::try_from(
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_nanos(),
    )
    .unwrap()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    Store,
    StoreNoPing,
    Raw,
    RawSyncNormal,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Store => "store",
            Variant::StoreNoPing => "store_noping",
            Variant::Raw => "raw",
            Variant::RawSyncNormal => "raw_sync_normal",
        }
    }

    fn parse(s: &str) -> Variant {
        match s {
            "store" => Variant::Store,
            "store_noping" => Variant::StoreNoPing,
            "raw" => Variant::Raw,
            "raw_sync_normal" => Variant::RawSyncNormal,
            other => panic!("unknown variant {other}"),
        }
    }
}

/// The store's connection settings (see `SqliteDatabase::open_with`).
fn connect_options(path: &Path, synchronous: SqliteSynchronous) -> SqliteConnectOptions {
    SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(false)
        .busy_timeout(BUSY_TIMEOUT)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(synchronous)
}

/// One renewing client on its own role.
enum Client {
    Store {
        store: SqliteLeaseStore,
        role: String,
    },
    Raw {
        conn: SqliteConnection,
        role: String,
    },
}

impl Client {
    async fn open(path: &Path, variant: Variant, role: String) -> Client {
        let mut client = match variant {
            Variant::Store => Client::Store {
                store: SqliteLeaseStore::open(path).await.unwrap(),
                role,
            },
            Variant::StoreNoPing => {
                let pool = SqlitePoolOptions::new()
                    .max_connections(8)
                    .test_before_acquire(false)
                    .connect_with(connect_options(path, SqliteSynchronous::Full))
                    .await
                    .unwrap();
                Client::Store {
                    store: SqliteLeaseStore::from_pool(pool).await.unwrap(),
                    role,
                }
            }
            Variant::Raw | Variant::RawSyncNormal => {
                let sync = if variant == Variant::Raw {
                    SqliteSynchronous::Full
                } else {
                    SqliteSynchronous::Normal
                };
                Client::Raw {
                    conn: connect_options(path, sync).connect().await.unwrap(),
                    role,
                }
            }
        };
        // The first renewal must find a live term to renew: take it through the store.
        if let Client::Raw { role, .. } = &client {
            let store = SqliteLeaseStore::open(path).await.unwrap();
            assert!(
                store
                    .try_acquire_or_renew(role, role, TTL)
                    .await
                    .unwrap()
                    .acquired
            );
        }
        client.op().await;
        client
    }

    async fn op(&mut self) {
        match self {
            Client::Store { store, role } => {
                let lease = store.try_acquire_or_renew(role, role, TTL).await.unwrap();
                assert!(lease.acquired);
            }
            Client::Raw { conn, role } => raw_renew(conn, role).await,
        }
    }
}

/// The statements `SqliteLeaseStore::try_acquire_or_renew` issues to renew a live
/// term (the boot-id read, the row read and the renewal update), in one
/// `BEGIN IMMEDIATE` transaction; the decision is reduced to the renewal case.
async fn raw_renew(conn: &mut SqliteConnection, role: &str) {
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.unwrap();
    let _boot: Option<String> = sqlx::query_scalar(statements::READ_BOOT)
        .fetch_optional(&mut *tx)
        .await
        .unwrap();
    let now = statements::monotonic_nanos().unwrap();
    let (holder, _token, expires_at): (Option<String>, i64, i64) =
        sqlx::query_as(statements::READ_LEASE)
            .bind(role)
            .fetch_one(&mut *tx)
            .await
            .unwrap();
    assert!(holder.as_deref() == Some(role) && now < expires_at);
    let ttl = i64::try_from(TTL.as_nanos()).unwrap();
    sqlx::query(statements::RENEW_LEASE)
        .bind(role)
        .bind(now + ttl)
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
}

/// Four child processes renewing on one file, driven over their stdin/stdout.
struct Workers {
    children: Vec<(Child, ChildStdin, BufReader<ChildStdout>)>,
}

impl Workers {
    fn spawn(path: &Path, variant: Variant, tag: &str) -> Workers {
        let exe = std::env::current_exe().unwrap();
        let children = (0..PROCESSES)
            .map(|i| {
                let mut child = Command::new(&exe)
                    .env(CHILD, "throughput")
                    .env(CHILD_DB, path)
                    .env(CHILD_VARIANT, variant.name())
                    .env(CHILD_ROLE, format!("{tag}-{}-proc-{i}", variant.name()))
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .spawn()
                    .unwrap();
                let stdin = child.stdin.take().unwrap();
                let mut stdout = BufReader::new(child.stdout.take().unwrap());
                let mut line = String::new();
                stdout.read_line(&mut line).unwrap();
                assert_eq!(line.trim(), "ready", "child failed to start");
                (child, stdin, stdout)
            })
            .collect();
        Workers { children }
    }

    /// `per_child` renewals in every child at once: the wall time until the last is
    /// done, and the CPU time the children spent on them.
    fn run(&mut self, per_child: u64) -> (Duration, Duration) {
        let start = Instant::now();
        for (_, stdin, _) in &mut self.children {
            writeln!(stdin, "go {per_child}").unwrap();
            stdin.flush().unwrap();
        }
        let mut cpu = Duration::ZERO;
        for (_, _, stdout) in &mut self.children {
            let mut line = String::new();
            stdout.read_line(&mut line).unwrap();
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                ["done", _elapsed, nanos] => cpu += Duration::from_nanos(nanos.parse().unwrap()),
                _ => panic!("child answered {line:?}"),
            }
        }
        (start.elapsed(), cpu)
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for (child, stdin, _) in &mut self.children {
            let _ = writeln!(stdin, "exit");
            let _ = stdin.flush();
            let _ = child.wait();
        }
    }
}

/// Child `throughput` mode: renew on command until told to exit.
fn throughput_child() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let path = PathBuf::from(std::env::var(CHILD_DB).unwrap());
    let variant = Variant::parse(&std::env::var(CHILD_VARIANT).unwrap());
    let role = std::env::var(CHILD_ROLE).unwrap();
    let mut client = rt.block_on(Client::open(&path, variant, role));
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready").unwrap();
    out.flush().unwrap();
    for line in std::io::stdin().lock().lines() {
        let line = line.unwrap();
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["go", n] => {
                let n: u64 = n.parse().unwrap();
                let start = Instant::now();
                let cpu = process_cpu();
                rt.block_on(async {
                    for _ in 0..n {
                        client.op().await;
                    }
                });
                let cpu = process_cpu() - cpu;
                writeln!(
                    out,
                    "done {} {}",
                    start.elapsed().as_nanos(),
                    cpu.as_nanos()
                )
                .unwrap();
                out.flush().unwrap();
            }
            ["exit"] => return,
            other => panic!("unknown command {other:?}"),
        }
    }
}

struct Env {
    rt: Runtime,
    _dir: PathBuf,
    path: PathBuf,
}

impl Env {
    fn start() -> Env {
        // On the disk, not a tmpfs, so commits pay a real fsync (/tmp here is ext4).
        let dir = std::env::temp_dir().join(format!("tenure-sqlite-bench-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("bench.db");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(SqliteDatabase::open(&path)).unwrap();
        Env {
            rt,
            _dir: dir,
            path,
        }
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self._dir);
    }
}

const VARIANTS: [Variant; 3] = [Variant::Raw, Variant::Store, Variant::StoreNoPing];

fn throughput(c: &mut Criterion, env: &Env) {
    let mut group = c.benchmark_group("sqlite_renew/1");
    group.throughput(Throughput::Elements(1));
    for variant in VARIANTS {
        let mut client = env.rt.block_on(Client::open(
            &env.path,
            variant,
            format!("crit-{}-1", variant.name()),
        ));
        group.bench_function(variant.name(), |b| {
            b.iter_custom(|iters| {
                env.rt.block_on(async {
                    let start = Instant::now();
                    for _ in 0..iters {
                        client.op().await;
                    }
                    start.elapsed()
                })
            })
        });
    }
    group.finish();

    let mut group = c.benchmark_group(format!("sqlite_renew/{PROCESSES}proc"));
    group.throughput(Throughput::Elements(1));
    for variant in VARIANTS {
        let mut workers = Workers::spawn(&env.path, variant, "crit");
        group.bench_function(variant.name(), |b| {
            b.iter_custom(|iters| {
                let per_child = iters.div_ceil(PROCESSES as u64).max(1);
                let (elapsed, _) = workers.run(per_child);
                elapsed.mul_f64(iters as f64 / (per_child * PROCESSES as u64) as f64)
            })
        });
    }
    group.finish();
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

/// CPU time (user + system) of this whole process.
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

/// Per-variant samples of the interleaved run.
#[derive(Clone, Default)]
struct Samples {
    rates: Vec<f64>,
    ratios: Vec<f64>,
    cpu: Duration,
    ops: u64,
}

impl Samples {
    fn push(&mut self, ops: u64, elapsed: Duration, cpu: Duration) {
        self.rates.push(ops as f64 / elapsed.as_secs_f64());
        self.cpu += cpu;
        self.ops += ops;
    }

    fn last_rate(&self) -> f64 {
        self.rates[self.rates.len() - 1]
    }
}

const AB_VARIANTS: [Variant; 4] = [
    Variant::Raw,
    Variant::Store,
    Variant::StoreNoPing,
    Variant::RawSyncNormal,
];

/// Rounds of a fixed op count with the variants taking turns, so load spikes from other
/// users of the machine hit every variant alike. Reports the median ops/s per variant,
/// the median (and quartiles) of the per-round ratio against `raw` measured right
/// before it, and CPU per renewal (this process, or the children's).
fn interleaved(env: &Env, rounds: usize, ops: u64) {
    println!(
        "\n== interleaved A/B: {rounds} rounds of {ops} renewals; median ops/s; per-round ratio p25/p50/p75; CPU us/op =="
    );
    print!("{:<8}", "clients");
    for v in AB_VARIANTS {
        print!(" {:>15}", v.name());
    }
    println!(
        "   {:<16} {:<16}   {:>6} {:>6} {:>6} {:>6}",
        "store/raw", "noping/raw", "raw", "store", "noping", "normal"
    );
    // One task.
    let mut clients: Vec<Client> = AB_VARIANTS
        .iter()
        .map(|&v| {
            env.rt
                .block_on(Client::open(&env.path, v, format!("ab-{}-1", v.name())))
        })
        .collect();
    let mut samples = vec![Samples::default(); AB_VARIANTS.len()];
    for _ in 0..rounds {
        for (i, client) in clients.iter_mut().enumerate() {
            let cpu = process_cpu();
            let elapsed = env.rt.block_on(async {
                let start = Instant::now();
                for _ in 0..ops {
                    client.op().await;
                }
                start.elapsed()
            });
            samples[i].push(ops, elapsed, process_cpu() - cpu);
            let ratio = samples[i].last_rate() / samples[0].last_rate();
            samples[i].ratios.push(ratio);
        }
    }
    print_samples("1 task", &mut samples);
    drop(clients);
    // Four processes.
    let mut workers: Vec<Workers> = AB_VARIANTS
        .iter()
        .map(|&v| Workers::spawn(&env.path, v, "ab"))
        .collect();
    let mut samples = vec![Samples::default(); AB_VARIANTS.len()];
    let per_child = ops / PROCESSES as u64;
    for _ in 0..rounds {
        for (i, w) in workers.iter_mut().enumerate() {
            let (elapsed, cpu) = w.run(per_child);
            samples[i].push(per_child * PROCESSES as u64, elapsed, cpu);
            let ratio = samples[i].last_rate() / samples[0].last_rate();
            samples[i].ratios.push(ratio);
        }
    }
    print_samples(&format!("{PROCESSES} procs"), &mut samples);
}

fn print_samples(label: &str, samples: &mut [Samples]) {
    print!("{label:<8}");
    for s in samples.iter_mut() {
        print!(" {:>15.0}", median(&mut s.rates));
    }
    let q: Vec<String> = samples[1..3]
        .iter_mut()
        .map(|s| {
            let (lo, mid, hi) = quartiles(&mut s.ratios);
            format!("{lo:.2}/{mid:.2}/{hi:.2}")
        })
        .collect();
    print!("   {:<16} {:<16}  ", q[0], q[1]);
    for s in samples.iter() {
        print!(" {:>6.1}", s.cpu.as_secs_f64() * 1e6 / s.ops as f64);
    }
    println!();
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index]
}

/// What an elector's work reports, stamped in Unix nanoseconds so that instants from
/// two processes compare.
enum Event {
    Started(usize, i64),
    Released(i64),
}

fn elector_options(id: usize) -> LeaseLeaderOptions {
    LeaseLeaderOptions {
        owner_id: format!("elector-{id}-{}", std::process::id()),
        lease_ttl: Duration::from_secs(30),
        renew_interval: Duration::from_secs(10),
        retry_interval: Duration::from_secs(60),
        ..Default::default()
    }
}

/// How the driver steers an elector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Control {
    /// End the current term (the work returns; the elector releases at once).
    StepDown,
    /// Contend again after stepping down.
    Rejoin,
}

/// The signals one elector listens to.
#[derive(Default)]
struct Steering {
    step_down: Notify,
    rejoin: Notify,
}

impl Steering {
    fn send(&self, control: Control) {
        match control {
            Control::StepDown => self.step_down.notify_one(),
            Control::Rejoin => self.rejoin.notify_one(),
        }
    }
}

/// Runs an elector on `role` until `shutdown`: each term's work reports `Started`, and
/// on `StepDown` reports `Released` and returns (the elector then releases at once).
/// After stepping down the elector stays out until `Rejoin`, so that it cannot take
/// the lease straight back before the successor's push or poll arrives.
fn spawn_elector(
    id: usize,
    store: Arc<dyn LeaseStore>,
    role: String,
    events: mpsc::UnboundedSender<Event>,
    steering: Arc<Steering>,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let elector = LeaseLeaderElector::new(store, elector_options(id)).unwrap();
    tokio::spawn(async move {
        loop {
            let events = events.clone();
            let work_steering = Arc::clone(&steering);
            elector
                .run(
                    &role,
                    move |_token, leadership: CancellationToken| {
                        let events = events.clone();
                        let steering = Arc::clone(&work_steering);
                        async move {
                            let _ = events.send(Event::Started(id, now_nanos()));
                            tokio::select! {
                                _ = steering.step_down.notified() => {
                                    let _ = events.send(Event::Released(now_nanos()));
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
                _ = steering.rejoin.notified() => {}
            }
        }
    })
}

/// A pause of 30 to 50 ms, uniformly spread, so that the step-down does not fall at a
/// fixed phase of a polling follower's 10 ms cycle.
fn settle_pause() -> Duration {
    let mut x = u64::try_from(now_nanos()).unwrap() | 1;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    Duration::from_micros(30_000 + x % 20_000)
}

/// Collects `handovers` latencies from (work returned, release follows) to (the other
/// elector's work started), steering both electors through `control`.
async fn drive(
    events: &mut mpsc::UnboundedReceiver<Event>,
    handovers: usize,
    control: impl Fn(usize, Control),
) -> Vec<Duration> {
    let mut latencies = Vec::with_capacity(handovers);
    let mut released: Option<(usize, i64)> = None;
    let mut leader: Option<usize> = None;
    while latencies.len() < handovers {
        let event = tokio::time::timeout(Duration::from_secs(10), events.recv())
            .await
            .expect("a handover within 10 s")
            .unwrap();
        match event {
            Event::Released(at) => {
                released = Some((leader.expect("a leader released"), at));
            }
            Event::Started(id, at) => {
                if let Some((from, released_at)) = released.take() {
                    assert_ne!(from, id, "the stepping-down elector came back first");
                    latencies.push(Duration::from_nanos(
                        u64::try_from(at - released_at).unwrap(),
                    ));
                    control(from, Control::Rejoin);
                }
                leader = Some(id);
                // Let the other elector settle into waiting (its 60 s retry timer).
                tokio::time::sleep(settle_pause()).await;
                control(id, Control::StepDown);
            }
        }
    }
    latencies
}

fn report(label: &str, mut latencies: Vec<Duration>) {
    latencies.sort();
    println!(
        "{label:<34} n={:<4} p50 {:>8.3} ms  p90 {:>8.3} ms  p99 {:>8.3} ms  max {:>8.3} ms",
        latencies.len(),
        percentile(&latencies, 0.5).as_secs_f64() * 1e3,
        percentile(&latencies, 0.9).as_secs_f64() * 1e3,
        percentile(&latencies, 0.99).as_secs_f64() * 1e3,
        latencies[latencies.len() - 1].as_secs_f64() * 1e3,
    );
}

/// Two electors in this process; `shared` puts both on one `SqliteDatabase` (woken by
/// its in-process signal), otherwise each opens its own (woken by polling).
fn handover_in_process(env: &Env, shared: bool, handovers: usize) {
    let latencies = env.rt.block_on(async {
        let role = format!("handover-{}-{shared}", std::process::id());
        let first = SqliteDatabase::open(&env.path).await.unwrap();
        let second = if shared {
            first.clone()
        } else {
            SqliteDatabase::open(&env.path).await.unwrap()
        };
        let (tx, mut events) = mpsc::unbounded_channel();
        let shutdown = CancellationToken::new();
        let steering: Vec<Arc<Steering>> = (0..2).map(|_| Arc::default()).collect();
        let tasks: Vec<_> = [first, second]
            .into_iter()
            .enumerate()
            .map(|(id, db)| {
                spawn_elector(
                    id,
                    Arc::new(db.lease_store()),
                    role.clone(),
                    tx.clone(),
                    Arc::clone(&steering[id]),
                    shutdown.clone(),
                )
            })
            .collect();
        let latencies = drive(&mut events, handovers, |id, control| {
            steering[id].send(control)
        })
        .await;
        shutdown.cancel();
        for task in tasks {
            task.await.unwrap();
        }
        latencies
    });
    let label = if shared {
        "one process, one SqliteDatabase"
    } else {
        "one process, two SqliteDatabases"
    };
    report(label, latencies);
}

/// Child `handover` mode: one elector; `step` on stdin makes its current term end;
/// events go to stdout as `started NANOS` / `released NANOS`.
fn handover_child() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let path = PathBuf::from(std::env::var(CHILD_DB).unwrap());
    let role = std::env::var(CHILD_ROLE).unwrap();
    rt.block_on(async {
        let store = Arc::new(SqliteLeaseStore::open(&path).await.unwrap());
        let (tx, mut events) = mpsc::unbounded_channel();
        let steering = Arc::new(Steering::default());
        let shutdown = CancellationToken::new();
        let elector = spawn_elector(1, store, role, tx, Arc::clone(&steering), shutdown.clone());
        let printer = tokio::spawn(async move {
            while let Some(event) = events.recv().await {
                let line = match event {
                    Event::Started(_, at) => format!("started {at}"),
                    Event::Released(at) => format!("released {at}"),
                };
                let mut out = std::io::stdout().lock();
                writeln!(out, "{line}").unwrap();
                out.flush().unwrap();
            }
        });
        let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
        while let Some(line) = lines.next_line().await.unwrap() {
            match line.trim() {
                "step" => steering.send(Control::StepDown),
                "rejoin" => steering.send(Control::Rejoin),
                "exit" => break,
                other => panic!("unknown command {other:?}"),
            }
        }
        shutdown.cancel();
        elector.await.unwrap();
        printer.abort();
    });
}

/// One elector here and one in a child process, on one file.
fn handover_across_processes(env: &Env, handovers: usize) {
    let latencies = env.rt.block_on(async {
        let role = format!("handover-{}-procs", std::process::id());
        let mut child = tokio::process::Command::new(std::env::current_exe().unwrap())
            .env(CHILD, "handover")
            .env(CHILD_DB, &env.path)
            .env(CHILD_ROLE, &role)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let (tx, mut events) = mpsc::unbounded_channel();
        let child_out = child.stdout.take().unwrap();
        let forward = tx.clone();
        let reader = tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(child_out).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let event = match line.split_once(' ') {
                    Some(("started", at)) => Event::Started(1, at.parse().unwrap()),
                    Some(("released", at)) => Event::Released(at.parse().unwrap()),
                    _ => panic!("child said {line:?}"),
                };
                let _ = forward.send(event);
            }
        });
        let (to_child, mut commands) = mpsc::unbounded_channel::<&'static str>();
        let mut child_in = child.stdin.take().unwrap();
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            while let Some(command) = commands.recv().await {
                child_in.write_all(command.as_bytes()).await.unwrap();
                child_in.flush().await.unwrap();
                if command == "exit\n" {
                    return;
                }
            }
        });
        let store = Arc::new(SqliteLeaseStore::open(&env.path).await.unwrap());
        let steering = Arc::new(Steering::default());
        let shutdown = CancellationToken::new();
        let elector = spawn_elector(0, store, role, tx, Arc::clone(&steering), shutdown.clone());
        let latencies = drive(&mut events, handovers, |id, control| match (id, control) {
            (0, control) => steering.send(control),
            (_, Control::StepDown) => {
                let _ = to_child.send("step\n");
            }
            (_, Control::Rejoin) => {
                let _ = to_child.send("rejoin\n");
            }
        })
        .await;
        let _ = to_child.send("exit\n");
        shutdown.cancel();
        elector.await.unwrap();
        writer.await.unwrap();
        child.wait().await.unwrap();
        reader.await.unwrap();
        latencies
    });
    report("two processes", latencies);
}

fn main() {
    match std::env::var(CHILD).as_deref() {
        Ok("throughput") => {
            throughput_child();
            return;
        }
        Ok("handover") => {
            handover_child();
            return;
        }
        _ => {}
    }
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
        handover_across_processes(&env, 3);
        return;
    }
    interleaved(&env, 15, 120);
    println!("\n== release -> successor work started ==");
    handover_in_process(&env, true, 120);
    handover_in_process(&env, false, 120);
    handover_across_processes(&env, 120);
}
