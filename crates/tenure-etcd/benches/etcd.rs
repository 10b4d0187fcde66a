//! etcd store hot paths against one throwaway etcd, each beside the same requests issued
//! directly through etcd-client (or etcd's own election API) in the same run.
//!
//! - `etcd_renew/{1,16}`: `EtcdLeaseStore::try_acquire_or_renew` renewing a live term;
//!   each client is a tokio task on its own role with its own `Client` (connection):
//!   - `store`: the store;
//!   - `raw`: what the store sends per renewal, issued directly: the compare + put
//!     transaction and, concurrently, a keep-alive of the term's etcd lease (a fresh
//!     `LeaseKeepAlive` stream answered once, as `Conn::keep_alive_once` does).
//!
//! After criterion, with `--bench` (that is, under `cargo bench`):
//! - an interleaved A/B run (rounds of a fixed op count, variants alternating, median
//!   per variant and per-round ratio to `raw`), adding `store_shared`/`raw_shared`
//!   (all 16 clients on clones of one `Client`, so one HTTP/2 connection);
//! - sequential latency of one renewal beside one plain range read, the transaction
//!   alone and the keep-alive alone: how many round trips a renewal costs;
//! - gRPC requests per operation, from etcd's `/metrics` counters;
//! - release -> takeover p50/p99 (200 trials each, interleaved): a waiter in
//!   `wait_for_change` (direct store calls) against etcd's election API (`resign` ->
//!   the waiting `campaign` returns), both settled (the contender waited 120-150 ms)
//!   and just joined (the release comes 0-100 ms after the contender started); beside
//!   them the floor of a two-commit handover issued directly (100 trials), and a
//!   `LeaseLeaderElector` successor (60 s retry interval) to its work starting;
//! - stall -> takeover: a leader stops renewing; a `LeaseLeaderElector` successor
//!   (60 s retry interval, so only the watch push or its expiry wake can wake it) runs
//!   its work; measured from just before the last renewal was sent, TTL 1 s (20
//!   trials) and 2 s (10 trials).
//!
//! `TENURE_ETCD_BENCH_ONLY=throughput,handover,stall` (any subset) skips criterion and
//! the sections not named.
//!
//! The raw requests come from `tenure_etcd::requests`, the builders the store itself
//! uses, so raw and store send the same bytes.
//!
//! Run: `cargo bench -p tenure-etcd --bench etcd`.

use std::collections::BTreeMap;
use std::future::Future;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use criterion::{Criterion, Throughput};
use tenure::{FencingToken, LeaseLeaderElector, LeaseLeaderOptions, LeaseStore};
use tenure_etcd::etcd_client::{Client, EventType, LeaderKey, ResignOptions, Txn, WatchOptions};
use tenure_etcd::requests::{self, Keys, TermRecord};
use tenure_etcd::EtcdLeaseStore;
use tenure_testkit::etcd::EtcdServer;
use tokio::runtime::Runtime;
use tokio::sync::{oneshot, Mutex};
use tokio_util::sync::CancellationToken;

const PREFIX: &str = "/bench";
/// Long enough that no benchmark term lapses.
const TTL: Duration = Duration::from_secs(600);
const CLIENT_COUNTS: [usize; 2] = [1, 16];
/// A follower's retry interval: only the push (or the expiry wake) can beat it.
const RETRY: Duration = Duration::from_secs(60);

/// The term record the store writes for `owner`'s term `token` (`None` in the acquire
/// transaction), with a TTL of [`TTL`].
fn record(owner: &str, token: Option<u64>, released: bool) -> TermRecord {
    let ttl = TTL.as_secs() as i64;
    TermRecord {
        owner: owner.to_owned(),
        token,
        expires_at_ns: now_ns() + TTL.as_nanos() as u64,
        ttl_secs: ttl,
        lease_secs: ttl,
        released,
    }
}

fn keys() -> Keys {
    Keys::new(PREFIX).unwrap()
}

/// A settled contender has waited this long: past etcd's 100 ms loop that moves
/// watchers started at a past revision (as its election API starts them) into its live set.
fn settle(rng: &mut Rng) -> Duration {
    rng.millis(120, 150)
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// A small xorshift generator seeded from the clock: trial spacing only.
struct Rng(u64);

impl Rng {
    fn new() -> Rng {
        Rng(now_ns() | 1)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }

    fn millis(&mut self, from: u64, to: u64) -> Duration {
        Duration::from_micros(from * 1_000 + self.below((to - from) * 1_000 + 1))
    }
}

struct Env {
    rt: Runtime,
    server: EtcdServer,
}

impl Env {
    fn start() -> Env {
        let server = EtcdServer::start().expect("start etcd");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        Env { rt, server }
    }

    /// A client with the options `tenure_etcd::connect` uses: one HTTP/2 connection.
    async fn client(&self) -> Client {
        Client::connect(
            [self.server.endpoint()],
            Some(tenure_etcd::connect_options()),
        )
        .await
        .unwrap()
    }

    async fn store(&self) -> EtcdLeaseStore {
        EtcdLeaseStore::new(self.client().await, PREFIX).unwrap()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    Raw,
    Store,
    RawShared,
    StoreShared,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Raw => "raw",
            Variant::Store => "store",
            Variant::RawShared => "raw_shared",
            Variant::StoreShared => "store_shared",
        }
    }

    fn shared(self) -> bool {
        matches!(self, Variant::RawShared | Variant::StoreShared)
    }
}

/// One live term renewed directly: the requests of `EtcdLeaseStore::renew`.
struct RawTerm {
    client: Client,
    keys: Keys,
    owner: String,
    lease_key: String,
    token: i64,
    lease: i64,
}

impl RawTerm {
    /// Takes `role` for `owner` through a store on `client` (so the keys and term are
    /// the store's) and reads back the etcd lease id it attached.
    async fn acquire(client: Client, role: &str) -> RawTerm {
        let store = EtcdLeaseStore::new(client.clone(), PREFIX).unwrap();
        let lease = store.try_acquire_or_renew(role, role, TTL).await.unwrap();
        assert!(lease.acquired);
        let lease_key = store.lease_key(role).unwrap();
        let kv = client
            .kv_client()
            .get(lease_key.as_str(), None)
            .await
            .unwrap();
        let kv = &kv.kvs()[0];
        assert_eq!(kv.create_revision() as u64, lease.fencing_token.get());
        RawTerm {
            keys: keys(),
            owner: role.to_owned(),
            token: kv.create_revision(),
            lease: kv.lease(),
            lease_key,
            client,
        }
    }

    fn txn(&self) -> Txn {
        let record = record(&self.owner, Some(self.token as u64), false);
        // The role is the owner (see `acquire`).
        requests::renew_txn(&self.keys, &self.owner, &self.owner, self.token, &record).unwrap()
    }

    async fn txn_only(&self) {
        let response = self.client.kv_client().txn(self.txn()).await.unwrap();
        assert!(response.succeeded());
    }

    async fn keep_alive_only(&self) {
        // The keeper and stream are dropped at once, closing the stream, as the store does.
        let (_keeper, _stream) = self
            .client
            .lease_client()
            .keep_alive(self.lease)
            .await
            .unwrap();
    }

    async fn renew(&self) {
        let mut kv = self.client.kv_client();
        let mut leases = self.client.lease_client();
        let (txn, alive) = tokio::join!(kv.txn(self.txn()), leases.keep_alive(self.lease));
        assert!(txn.unwrap().succeeded());
        alive.unwrap();
    }
}

enum BenchClient {
    Store { store: EtcdLeaseStore, role: String },
    Raw(RawTerm),
}

impl BenchClient {
    async fn op(&self) {
        match self {
            BenchClient::Store { store, role } => {
                let lease = store.try_acquire_or_renew(role, role, TTL).await.unwrap();
                assert!(lease.acquired);
            }
            BenchClient::Raw(term) => term.renew().await,
        }
    }
}

type Clients = Vec<Arc<Mutex<BenchClient>>>;

/// `n` clients of `variant`, each holding a live term of its own role.
async fn clients(env: &Env, variant: Variant, n: usize) -> Clients {
    let shared = env.client().await;
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let client = if variant.shared() {
            shared.clone()
        } else {
            env.client().await
        };
        let role = format!("{}-{n}-{i}", variant.name());
        let bench_client = match variant {
            Variant::Raw | Variant::RawShared => {
                BenchClient::Raw(RawTerm::acquire(client, &role).await)
            }
            Variant::Store | Variant::StoreShared => {
                let store = EtcdLeaseStore::new(client, PREFIX).unwrap();
                BenchClient::Store { store, role }
            }
        };
        // The first call acquires (store) or proves the term renewable (raw).
        bench_client.op().await;
        out.push(Arc::new(Mutex::new(bench_client)));
    }
    out
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
                let client = client.lock().await;
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
    for n in CLIENT_COUNTS {
        let mut group = c.benchmark_group(format!("etcd_renew/{n}"));
        group.throughput(Throughput::Elements(1));
        for variant in [Variant::Raw, Variant::Store] {
            let clients = env.rt.block_on(clients(env, variant, n));
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

fn sorted(mut values: Vec<f64>) -> Vec<f64> {
    values.sort_by(|a, b| a.total_cmp(b));
    values
}

fn at(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Rounds of a fixed op count, the variants taking turns, so load spikes from other
/// users of the machine hit every variant alike. Reports the median ops/s per variant
/// and the quartiles of the per-round ratio against the matching raw variant measured
/// in the same round.
fn interleaved(env: &Env, rounds: usize) {
    const VARIANTS: [Variant; 4] = [
        Variant::Raw,
        Variant::Store,
        Variant::RawShared,
        Variant::StoreShared,
    ];
    println!("\n== interleaved A/B: {rounds} rounds; median ops/s; per-round ratio p25/p50/p75 ==");
    println!(
        "{:>3} {:>10} {:>10} {:>12} {:>12}   {:<16} {:<16}",
        "n", "raw", "store", "raw_shared", "store_shared", "store/raw", "shared s/r"
    );
    for n in CLIENT_COUNTS {
        let total: u64 = if n == 1 { 400 } else { 1_600 };
        let per_client = total / n as u64;
        let ops = (per_client * n as u64) as f64;
        let sets: Vec<Clients> = VARIANTS
            .iter()
            .map(|&v| env.rt.block_on(clients(env, v, n)))
            .collect();
        let mut rates = vec![Vec::new(); VARIANTS.len()];
        let mut ratios = [Vec::new(), Vec::new()];
        for _ in 0..rounds {
            for (i, set) in sets.iter().enumerate() {
                let elapsed = env.rt.block_on(run_clients(set, per_client));
                rates[i].push(ops / elapsed.as_secs_f64());
            }
            let last = |i: usize| rates[i][rates[i].len() - 1];
            ratios[0].push(last(1) / last(0));
            ratios[1].push(last(3) / last(2));
        }
        let medians: Vec<f64> = rates.into_iter().map(|r| at(&sorted(r), 0.5)).collect();
        let quart = |r: &Vec<f64>| {
            let s = sorted(r.clone());
            format!("{:.2}/{:.2}/{:.2}", at(&s, 0.25), at(&s, 0.5), at(&s, 0.75))
        };
        println!(
            "{n:>3} {:>10.0} {:>10.0} {:>12.0} {:>12.0}   {:<16} {:<16}",
            medians[0],
            medians[1],
            medians[2],
            medians[3],
            quart(&ratios[0]),
            quart(&ratios[1])
        );
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn report_latencies(label: &str, mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    let (p50, p99) = (percentile(&samples, 0.5), percentile(&samples, 0.99));
    println!(
        "{label:<46} n={:<4} p50 {:>8.3} ms  p90 {:>8.3} ms  p99 {:>8.3} ms  max {:>8.3} ms",
        samples.len(),
        ms(p50),
        ms(percentile(&samples, 0.9)),
        ms(p99),
        ms(samples[samples.len() - 1]),
    );
    (p50, p99)
}

async fn timed<F: Future<Output = ()>>(f: F) -> Duration {
    let start = Instant::now();
    f.await;
    start.elapsed()
}

/// Sequential latency of one renewal and of its parts, one client, the kinds taking
/// turns: the number of round trips a renewal costs is its latency over one request's.
fn round_trips(env: &Env, rounds: usize) {
    println!("\n== sequential latency, one client, {rounds} rounds (kinds take turns) ==");
    let samples = env.rt.block_on(async {
        let raw = RawTerm::acquire(env.client().await, "rtt-raw").await;
        let store = env.store().await;
        let role = "rtt-store";
        assert!(
            store
                .try_acquire_or_renew(role, role, TTL)
                .await
                .unwrap()
                .acquired
        );
        let mut samples: [Vec<Duration>; 5] = Default::default();
        for _ in 0..rounds {
            samples[0].push(
                timed(async {
                    raw.client
                        .kv_client()
                        .get(raw.lease_key.as_str(), None)
                        .await
                        .unwrap();
                })
                .await,
            );
            samples[1].push(timed(raw.txn_only()).await);
            samples[2].push(timed(raw.keep_alive_only()).await);
            samples[3].push(timed(raw.renew()).await);
            samples[4].push(
                timed(async {
                    assert!(
                        store
                            .try_acquire_or_renew(role, role, TTL)
                            .await
                            .unwrap()
                            .acquired
                    );
                })
                .await,
            );
        }
        samples
    });
    let labels = [
        "range read (one unary request)",
        "renewal txn alone",
        "keep-alive alone (new stream, one answer)",
        "raw renewal (txn || keep-alive)",
        "store renewal (try_acquire_or_renew)",
    ];
    let mut p50s = Vec::new();
    for (label, s) in labels.iter().zip(samples) {
        p50s.push(report_latencies(label, s).0);
    }
    let one = p50s[1].max(p50s[2]);
    println!(
        "store renewal p50 / max(txn, keep-alive) p50 = {:.2}; store / raw renewal p50 = {:.2}; \
         sum of the parts would be {:.2}",
        p50s[4].as_secs_f64() / one.as_secs_f64(),
        p50s[4].as_secs_f64() / p50s[3].as_secs_f64(),
        (p50s[1] + p50s[2]).as_secs_f64() / one.as_secs_f64(),
    );
}

/// etcd's gRPC counters from `/metrics`: started calls (and received stream messages)
/// per method.
fn grpc_counts(env: &Env) -> BTreeMap<String, f64> {
    let mut stream = TcpStream::connect(env.server.host_port()).unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .unwrap();
    let mut body = String::new();
    stream.read_to_string(&mut body).unwrap();
    let mut counts = BTreeMap::new();
    for line in body.lines() {
        let (kind, rest) = if let Some(rest) = line.strip_prefix("grpc_server_started_total{") {
            ("", rest)
        } else if let Some(rest) = line.strip_prefix("grpc_server_msg_received_total{") {
            (" msgs", rest)
        } else {
            continue;
        };
        let Some(method) = rest
            .split("grpc_method=\"")
            .nth(1)
            .and_then(|m| m.split('"').next())
        else {
            continue;
        };
        // Unary calls receive exactly one message each; only streams are interesting.
        if !kind.is_empty() && !matches!(method, "LeaseKeepAlive" | "Watch") {
            continue;
        }
        let value: f64 = rest
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        *counts.entry(format!("{method}{kind}")).or_insert(0.0) += value;
    }
    counts
}

fn requests_per_op<F, Fut>(env: &Env, label: &str, n: usize, op: F)
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = ()>,
{
    let before = grpc_counts(env);
    env.rt.block_on(async {
        for i in 0..n {
            op(i).await;
        }
    });
    let after = grpc_counts(env);
    let per_op: Vec<String> = after
        .iter()
        .filter_map(|(method, value)| {
            let delta = value - before.get(method).copied().unwrap_or(0.0);
            (delta > 0.0).then(|| format!("{:.2} {method}", delta / n as f64))
        })
        .collect();
    println!("{label:<28} per op: {}", per_op.join(", "));
}

/// gRPC requests per operation, counted by etcd itself.
fn request_counts(env: &Env) {
    const N: usize = 200;
    println!(
        "\n== gRPC requests per operation (etcd /metrics, {N} operations each, sequential) =="
    );
    let (store, raw) = env.rt.block_on(async {
        (
            env.store().await,
            RawTerm::acquire(env.client().await, "count-raw").await,
        )
    });
    let role = |i: usize| format!("count-{i}");
    requests_per_op(env, "store acquire (new role)", N, |i| {
        let store = &store;
        async move {
            let r = store
                .try_acquire_or_renew(&role(i), "a", TTL)
                .await
                .unwrap();
            assert!(r.acquired);
        }
    });
    requests_per_op(env, "store renew", N, |i| {
        let store = &store;
        async move {
            let r = store
                .try_acquire_or_renew(&role(i), "a", TTL)
                .await
                .unwrap();
            assert!(r.acquired);
        }
    });
    requests_per_op(env, "raw renew", N, |_| raw.renew());
    requests_per_op(env, "store release", N, |i| {
        let store = &store;
        async move {
            let token = store.get(&role(i)).await.unwrap().unwrap().fencing_token;
            assert!(store.release(&role(i), "a", token).await.unwrap());
        }
    });
    println!("(store release includes one `get` per op, to learn the token: 1 Txn of the count)");
}

/// Two direct store contenders handing one role back and forth: the successor loops
/// `try_acquire_or_renew` / `wait_for_change(.., 60 s)`; timed from the release call
/// to the successor's acquire returning.
struct StorePair {
    stores: [Arc<EtcdLeaseStore>; 2],
    owners: [String; 2],
    role: String,
    leader: usize,
    token: FencingToken,
}

impl StorePair {
    async fn new(env: &Env) -> StorePair {
        let stores = [Arc::new(env.store().await), Arc::new(env.store().await)];
        let owners = ["store-a".to_owned(), "store-b".to_owned()];
        let role = "handover-store".to_owned();
        let lease = stores[0]
            .try_acquire_or_renew(&role, &owners[0], TTL)
            .await
            .unwrap();
        assert!(lease.acquired);
        StorePair {
            stores,
            owners,
            role,
            leader: 0,
            token: lease.fencing_token,
        }
    }

    async fn trial(&mut self, pause: Duration) -> Duration {
        let next = 1 - self.leader;
        let store = Arc::clone(&self.stores[next]);
        let owner = self.owners[next].clone();
        let role = self.role.clone();
        let (tx, rx) = oneshot::channel();
        let successor = tokio::spawn(async move {
            loop {
                let lease = store
                    .try_acquire_or_renew(&role, &owner, TTL)
                    .await
                    .unwrap();
                if lease.acquired {
                    let _ = tx.send((Instant::now(), lease.fencing_token));
                    return;
                }
                let deadline = tokio::time::Instant::now() + RETRY;
                store
                    .wait_for_change(&role, lease.fencing_token, deadline)
                    .await;
            }
        });
        tokio::time::sleep(pause).await;
        let start = Instant::now();
        let released = self.stores[self.leader]
            .release(&self.role, &self.owners[self.leader], self.token)
            .await
            .unwrap();
        assert!(released);
        let (at, token) = tokio::time::timeout(Duration::from_secs(30), rx)
            .await
            .expect("a takeover within 30 s")
            .unwrap();
        successor.await.unwrap();
        assert!(token > self.token);
        self.leader = next;
        self.token = token;
        at.saturating_duration_since(start)
    }
}

/// The floor of a two-commit handover, issued directly: the leader sends the store's
/// release (the compare + delete + put transaction, then the revoke of its etcd lease);
/// the successor, parked on a watch started at the revision after its read (as
/// `wait_for_change` does), acquires on the delete event with one acquire
/// transaction and keep-alive sent together, on an etcd lease granted beforehand: no
/// read and no grant after the push.
struct RawPair {
    clients: [Client; 2],
    owners: [String; 2],
    keys: Keys,
    role: &'static str,
    lease_key: String,
    leader: usize,
    token: i64,
    lease: i64,
}

impl RawPair {
    async fn new(env: &Env) -> RawPair {
        let clients = [env.client().await, env.client().await];
        let owners = ["raw-a".to_owned(), "raw-b".to_owned()];
        let role = "handover-raw";
        let lease = grant(&clients[0]).await;
        let mut pair = RawPair {
            clients,
            owners,
            keys: keys(),
            role,
            lease_key: keys().lease(role),
            leader: 0,
            token: 0,
            lease,
        };
        let (token, _) = pair.acquire(0, lease).await;
        pair.token = token;
        pair
    }

    /// The store's acquire transaction and keep-alive, sent together; the token and the
    /// instant the answers arrived.
    async fn acquire(&self, owner: usize, lease: i64) -> (i64, Instant) {
        let owner_id = &self.owners[owner];
        let record = record(owner_id, None, false);
        let txn = requests::acquire_txn(&self.keys, self.role, owner_id, lease, &record).unwrap();
        let client = &self.clients[owner];
        let mut kv = client.kv_client();
        let mut leases = client.lease_client();
        let (txn, alive) = tokio::join!(kv.txn(txn), leases.keep_alive(lease));
        let at = Instant::now();
        let txn = txn.unwrap();
        assert!(txn.succeeded());
        alive.unwrap();
        (txn.header().unwrap().revision(), at)
    }

    async fn trial(self: &mut Arc<Self>, pause: Duration) -> Duration {
        let next = 1 - self.leader;
        let lease = grant(&self.clients[next]).await;
        let (tx, rx) = oneshot::channel();
        let pair = Arc::clone(self);
        let successor = tokio::spawn(async move {
            let client = &pair.clients[next];
            let read = client
                .kv_client()
                .get(pair.lease_key.as_str(), None)
                .await
                .unwrap();
            let revision = read.header().unwrap().revision();
            let mut stream = client
                .watch_client()
                .watch(
                    pair.lease_key.as_str(),
                    Some(WatchOptions::new().with_start_revision(revision + 1)),
                )
                .await
                .unwrap();
            'watch: while let Some(message) = stream.message().await.unwrap() {
                for event in message.events() {
                    if event.event_type() == EventType::Delete {
                        break 'watch;
                    }
                }
            }
            let _ = tx.send(pair.acquire(next, lease).await);
        });
        tokio::time::sleep(pause).await;
        let start = Instant::now();
        let released = self.release().await;
        assert!(released);
        let (token, at) = tokio::time::timeout(Duration::from_secs(30), rx)
            .await
            .expect("a takeover within 30 s")
            .unwrap();
        successor.await.unwrap();
        let this = Arc::get_mut(self).unwrap();
        this.leader = next;
        this.token = token;
        this.lease = lease;
        at.saturating_duration_since(start)
    }

    /// The store's release: one transaction, then the revoke of the term's etcd lease.
    async fn release(&self) -> bool {
        let leader = self.leader;
        let owner = &self.owners[leader];
        let record = record(owner, Some(self.token as u64), true);
        let txn = requests::release_txn(&self.keys, self.role, owner, self.token, &record).unwrap();
        let client = &self.clients[leader];
        let released = client.kv_client().txn(txn).await.unwrap().succeeded();
        client.lease_client().revoke(self.lease).await.unwrap();
        released
    }
}

async fn grant(client: &Client) -> i64 {
    client
        .lease_client()
        .grant(TTL.as_secs() as i64, None)
        .await
        .unwrap()
        .id()
}

/// Two contenders of etcd's election API (v3election, served by etcd), each on its own
/// client and etcd lease: timed from the `resign` call to the waiting `campaign`
/// returning.
struct ElectionPair {
    clients: [Client; 2],
    leases: [i64; 2],
    name: String,
    leader: usize,
    key: LeaderKey,
}

impl ElectionPair {
    async fn new(env: &Env) -> ElectionPair {
        let clients = [env.client().await, env.client().await];
        let mut leases = [0; 2];
        for (lease, client) in leases.iter_mut().zip(&clients) {
            *lease = client
                .lease_client()
                .grant(TTL.as_secs() as i64, None)
                .await
                .unwrap()
                .id();
        }
        let name = format!("{PREFIX}/election");
        let won = clients[0]
            .election_client()
            .campaign(name.as_str(), "a", leases[0])
            .await
            .unwrap();
        ElectionPair {
            key: won.leader().unwrap().clone(),
            clients,
            leases,
            name,
            leader: 0,
        }
    }

    async fn trial(&mut self, pause: Duration) -> Duration {
        let next = 1 - self.leader;
        let mut election = self.clients[next].election_client();
        let name = self.name.clone();
        let lease = self.leases[next];
        let (tx, rx) = oneshot::channel();
        let contender = tokio::spawn(async move {
            let won = election.campaign(name, "v", lease).await.unwrap();
            let _ = tx.send((Instant::now(), won.leader().unwrap().clone()));
        });
        tokio::time::sleep(pause).await;
        let start = Instant::now();
        self.clients[self.leader]
            .election_client()
            .resign(Some(ResignOptions::new().with_leader(self.key.clone())))
            .await
            .unwrap();
        let (at, key) = tokio::time::timeout(Duration::from_secs(30), rx)
            .await
            .expect("a takeover within 30 s")
            .unwrap();
        contender.await.unwrap();
        self.leader = next;
        self.key = key;
        at.saturating_duration_since(start)
    }
}

/// Release -> takeover, store and etcd election trials interleaved, settled and just
/// joined. Just-joined trials use the same delay for both in each pair of trials.
fn handover(env: &Env, trials: usize) {
    println!("\n== release -> takeover ({trials} trials each, interleaved) ==");
    let mut rng = Rng::new();
    let results = env.rt.block_on(async {
        let mut store = StorePair::new(env).await;
        let mut election = ElectionPair::new(env).await;
        let mut raw = Arc::new(RawPair::new(env).await);
        // [store settled, election settled, store joined, election joined, raw settled]
        let mut samples: [Vec<Duration>; 5] = Default::default();
        let mut joined: Vec<(Duration, Duration, Duration)> = Vec::new();
        for _ in 0..trials {
            samples[0].push(store.trial(settle(&mut rng)).await);
            samples[1].push(election.trial(settle(&mut rng)).await);
            if samples[4].len() < trials / 2 {
                samples[4].push(raw.trial(settle(&mut rng)).await);
            }
            let delay = rng.millis(0, 100);
            let s = store.trial(delay).await;
            let e = election.trial(delay).await;
            samples[2].push(s);
            samples[3].push(e);
            joined.push((delay, s, e));
        }
        (samples, joined)
    });
    let (samples, joined) = results;
    let labels = [
        "store: wait_for_change, settled",
        "etcd election: campaign, settled",
        "store: wait_for_change, joined 0-100 ms before",
        "etcd election: campaign, joined 0-100 ms before",
        "raw floor: release, push, acquire txn, settled",
    ];
    for (label, s) in labels.iter().zip(samples) {
        report_latencies(label, s);
    }
    println!("just joined, by how long before the release the contender started:");
    for (lo, hi) in [(0, 5), (5, 20), (20, 50), (50, 101)] {
        let bin: Vec<_> = joined
            .iter()
            .filter(|(d, _, _)| (lo..hi).contains(&(d.as_millis() as u64)))
            .collect();
        if bin.is_empty() {
            continue;
        }
        report_latencies(
            &format!("  store, joined {lo}-{hi} ms before"),
            bin.iter().map(|(_, s, _)| *s).collect(),
        );
        report_latencies(
            &format!("  election, joined {lo}-{hi} ms before"),
            bin.iter().map(|(_, _, e)| *e).collect(),
        );
    }
}

/// A `LeaseLeaderElector` successor (60 s retry interval) for one term: its work
/// reports the instant it started and returns at once (the elector then releases).
fn spawn_elector(
    store: Arc<dyn LeaseStore>,
    owner: String,
    role: String,
    ttl: Duration,
) -> (
    tokio::task::JoinHandle<()>,
    oneshot::Receiver<(Instant, FencingToken)>,
) {
    let (tx, rx) = oneshot::channel();
    let tx = Arc::new(std::sync::Mutex::new(Some(tx)));
    let elector = LeaseLeaderElector::new(
        store,
        LeaseLeaderOptions {
            owner_id: owner,
            lease_ttl: ttl,
            renew_interval: ttl / 3,
            retry_interval: RETRY,
            ..Default::default()
        },
    )
    .unwrap();
    let task = tokio::spawn(async move {
        elector
            .run(
                &role,
                move |token, _leadership| {
                    let tx = Arc::clone(&tx);
                    async move {
                        let now = Instant::now();
                        if let Some(tx) = tx.lock().unwrap().take() {
                            let _ = tx.send((now, token));
                        }
                    }
                },
                CancellationToken::new(),
            )
            .await
            .unwrap();
    });
    (task, rx)
}

/// Release by a direct store call -> a `LeaseLeaderElector` successor's work starting.
fn elector_handover(env: &Env, trials: usize) {
    let mut rng = Rng::new();
    let samples = env.rt.block_on(async {
        let leader = env.store().await;
        let successor: Arc<dyn LeaseStore> = Arc::new(env.store().await);
        let role = "handover-elector";
        let mut samples = Vec::with_capacity(trials);
        for i in 0..trials {
            let lease = leader
                .try_acquire_or_renew(role, "leader", TTL)
                .await
                .unwrap();
            assert!(lease.acquired);
            let (task, rx) = spawn_elector(
                Arc::clone(&successor),
                format!("elector-{i}"),
                role.to_owned(),
                Duration::from_secs(30),
            );
            tokio::time::sleep(settle(&mut rng)).await;
            let start = Instant::now();
            assert!(leader
                .release(role, "leader", lease.fencing_token)
                .await
                .unwrap());
            let (at, _) = tokio::time::timeout(Duration::from_secs(30), rx)
                .await
                .expect("a takeover within 30 s")
                .unwrap();
            samples.push(at.saturating_duration_since(start));
            task.await.unwrap();
        }
        samples
    });
    report_latencies("elector successor (work starts), settled", samples);
}

/// Stall -> takeover: the leader acquires, renews once 100-300 ms later and stops; a
/// `LeaseLeaderElector` successor waits (watch push or its expiry wake) and runs work.
fn stall(env: &Env, ttl: Duration, trials: usize) {
    let mut rng = Rng::new();
    let samples = env.rt.block_on(async {
        let leader = env.store().await;
        let successor: Arc<dyn LeaseStore> = Arc::new(env.store().await);
        let role = format!("stall-{}s", ttl.as_secs());
        let mut from_sent = Vec::with_capacity(trials);
        let mut from_answer = Vec::with_capacity(trials);
        for i in 0..trials {
            let lease = leader
                .try_acquire_or_renew(&role, "leader", ttl)
                .await
                .unwrap();
            assert!(lease.acquired, "trial {i}: leader could not acquire");
            let (task, rx) = spawn_elector(
                Arc::clone(&successor),
                format!("successor-{i}"),
                role.clone(),
                ttl,
            );
            tokio::time::sleep(rng.millis(100, 300)).await;
            let sent = Instant::now();
            let renewed = leader
                .try_acquire_or_renew(&role, "leader", ttl)
                .await
                .unwrap();
            let answered = Instant::now();
            assert!(renewed.acquired && renewed.fencing_token == lease.fencing_token);
            // The leader stalls: no more calls.
            let (at, token) = tokio::time::timeout(ttl + Duration::from_secs(10), rx)
                .await
                .expect("a takeover after the stall")
                .unwrap();
            assert!(token > lease.fencing_token);
            from_sent.push(at.saturating_duration_since(sent));
            from_answer.push(at.saturating_duration_since(answered));
            task.await.unwrap();
        }
        (from_sent, from_answer)
    });
    let secs = ttl.as_secs();
    let (_, p99) = report_latencies(
        &format!("TTL {secs} s: from last renewal sent"),
        samples.0.clone(),
    );
    report_latencies(
        &format!("TTL {secs} s: from last renewal answered"),
        samples.1,
    );
    let over: Vec<Duration> = samples.0.iter().map(|d| d.saturating_sub(ttl)).collect();
    let max_over = over.iter().max().copied().unwrap_or_default();
    println!(
        "TTL {secs} s: beyond the TTL: p99 {:.0} ms, max {:.0} ms (bound TTL + 600 ms: {})",
        ms(p99.saturating_sub(ttl)),
        ms(max_over),
        if max_over <= Duration::from_millis(600) {
            "met"
        } else {
            "MISSED"
        }
    );
}

fn machine() {
    let nproc = std::thread::available_parallelism().map_or(0, |n| n.get());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("model name"))
        .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        .unwrap_or_default();
    println!("machine: {nproc} cpus ({cpu}); loadavg {}", load.trim());
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
    machine();
    if std::env::var_os("TENURE_ETCD_BENCH_ONLY").is_none() {
        throughput(&mut c, &env);
        c.final_summary();
    }
    if !full {
        handover(&env, 2);
        stall(&env, Duration::from_secs(1), 1);
        return;
    }
    // `TENURE_ETCD_BENCH_ONLY=handover,stall` runs only the sections named.
    let only = std::env::var("TENURE_ETCD_BENCH_ONLY").ok();
    let run = |section: &str| {
        only.as_ref()
            .is_none_or(|o| o.split(',').any(|s| s == section))
    };
    if run("throughput") {
        interleaved(&env, 12);
        round_trips(&env, 500);
        request_counts(&env);
    }
    if run("handover") {
        handover(&env, 200);
        elector_handover(&env, 60);
    }
    if run("stall") {
        println!("\n== stall -> takeover (elector successor, 60 s retry interval) ==");
        stall(&env, Duration::from_secs(1), 20);
        stall(&env, Duration::from_secs(2), 10);
    }
    machine();
}
