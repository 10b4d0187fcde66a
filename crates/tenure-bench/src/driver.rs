//! Throughput and latency, store beside raw, in interleaved rounds; and round trips.
//!
//! A cell is one operation at one client count. It runs `rounds` round pairs; in each,
//! the store and the raw baseline take a turn of `slice` (the order alternates, so
//! neither always runs right after the other), and the ratio of their rates in that
//! round is kept. A noisy neighbour then hits both sides of a ratio alike; the report
//! gives medians. Acquire and release share a cell: each side releases, in a timed
//! release turn, exactly the roles it acquired in its acquire turn just before.
//!
//! A backend may add cells ([`ExtraCell`]): the store against another raw baseline
//! (Kubernetes: renewal against a bare `PUT` on a cached `resourceVersion`), or an
//! operation the four do not cover (a takeover: acquire of a role whose object exists and
//! was released, where `acquire` always creates).

use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Backend, Client, Counter, ExtraCell, ExtraKind, StoreClient, REGISTRY_TTL};
use crate::config::BenchConfig;
use crate::report::{RoundTripRow, RoundTrips, ThroughputRow};
use crate::stats::{median, Histogram};
use crate::BenchError;

type Clients = Vec<Box<dyn Client>>;

/// What one client does in one turn.
enum Job {
    Renew {
        role: String,
        owner: String,
    },
    Heartbeat {
        node: String,
    },
    Acquire {
        owner: String,
        held: Vec<(String, u64)>,
    },
    Release {
        owner: String,
        held: Vec<(String, u64)>,
    },
    /// Acquire the roles of `pool` in order (each released before), until the deadline
    /// or the pool's end.
    Takeover {
        owner: String,
        pool: Vec<String>,
        held: Vec<(String, u64)>,
    },
}

/// One side's results for one operation across the rounds.
#[derive(Default)]
struct Side {
    rates: Vec<f64>,
    latency: Histogram,
}

impl Side {
    fn record(&mut self, ops: u64, elapsed: Duration, latency: &Histogram) {
        self.rates
            .push(ops as f64 / elapsed.as_secs_f64().max(1e-9));
        self.latency.merge(latency);
    }

    fn last_rate(&self) -> f64 {
        self.rates.last().copied().unwrap_or(0.0)
    }
}

/// One operation's store and raw sides plus the per-round ratios.
#[derive(Default)]
struct Cell {
    sides: [Side; 2],
    ratios: Vec<f64>,
}

impl Cell {
    fn close_round(&mut self) {
        let raw = self.sides[RAW].last_rate();
        if raw > 0.0 {
            self.ratios.push(self.sides[STORE].last_rate() / raw);
        }
    }

    fn row(&self, op: &str, clients: usize, roles: Option<usize>) -> ThroughputRow {
        let [store, raw] = &self.sides;
        ThroughputRow {
            op: op.to_owned(),
            clients,
            roles,
            store_ops_per_sec: median(&store.rates).unwrap_or(0.0),
            raw_ops_per_sec: median(&raw.rates).unwrap_or(0.0),
            ratio: median(&self.ratios).unwrap_or(0.0),
            store: store.latency.summary(),
            raw: raw.latency.summary(),
            store_histogram: store.latency.clone(),
            raw_histogram: raw.latency.clone(),
            baseline: None,
        }
    }
}

const STORE: usize = 0;
const RAW: usize = 1;
const SIDE_NAMES: [&str; 2] = ["s", "r"];

/// Runs `jobs` (one per client) on every client at once, each until `deadline` (or,
/// for releases, through its list), and gives the clients and jobs back.
async fn turn(
    clients: &mut Clients,
    jobs: Vec<Job>,
    deadline: Instant,
) -> Result<(Vec<Job>, u64, Duration, Histogram), BenchError> {
    let start = Instant::now();
    let tasks: Vec<_> = std::mem::take(clients)
        .into_iter()
        .zip(jobs)
        .map(|(mut client, mut job)| {
            tokio::spawn(async move {
                let mut latency = Histogram::default();
                let outcome = run_job(&mut *client, &mut job, deadline, &mut latency).await;
                (client, job, latency, outcome)
            })
        })
        .collect();
    let mut jobs = Vec::with_capacity(tasks.len());
    let mut total = Histogram::default();
    let mut ops = 0;
    let mut failure = None;
    for task in tasks {
        let (client, job, latency, outcome) = task
            .await
            .map_err(|e| BenchError::Setup(format!("a bench client panicked: {e}")))?;
        clients.push(client);
        jobs.push(job);
        total.merge(&latency);
        match outcome {
            Ok(n) => ops += n,
            Err(error) => failure = failure.or(Some(error)),
        }
    }
    let elapsed = start.elapsed();
    match failure {
        Some(error) => Err(error.into()),
        None => Ok((jobs, ops, elapsed, total)),
    }
}

/// One client's turn; every operation's latency is recorded with one clock read.
async fn run_job(
    client: &mut dyn Client,
    job: &mut Job,
    deadline: Instant,
    latency: &mut Histogram,
) -> tenure::Result<u64> {
    let mut ops = 0;
    let mut last = Instant::now();
    let mut tick = |ops: &mut u64| {
        let now = Instant::now();
        latency.record(now - last);
        last = now;
        *ops += 1;
        now < deadline
    };
    match job {
        Job::Renew { role, owner } => loop {
            client.renew(role, owner).await?;
            if !tick(&mut ops) {
                break;
            }
        },
        Job::Heartbeat { node } => loop {
            client.heartbeat(node).await?;
            if !tick(&mut ops) {
                break;
            }
        },
        Job::Acquire { owner, held } => loop {
            let role = format!("{owner}-{}", held.len());
            let token = client.acquire(&role, owner).await?;
            held.push((role, token));
            if !tick(&mut ops) {
                break;
            }
        },
        Job::Release { owner, held } => {
            for (role, token) in held.drain(..) {
                client.release(&role, owner, token).await?;
                tick(&mut ops);
            }
        }
        Job::Takeover { owner, pool, held } => {
            for role in pool.iter() {
                let token = client.acquire(role, owner).await?;
                held.push((role.clone(), token));
                if !tick(&mut ops) {
                    break;
                }
            }
        }
    }
    Ok(ops)
}

/// Every cell of the throughput section.
pub(crate) async fn throughput(
    backend: &dyn Backend,
    config: &BenchConfig,
    run_id: &str,
) -> Result<Vec<ThroughputRow>, BenchError> {
    let mut rows = Vec::new();
    let slice = config.slice();
    for &n in &config.clients {
        let handles = backend.stores(n, REGISTRY_TTL).await?;
        let store: Clients = (0..n)
            .map(|_| Box::new(StoreClient(handles.clone())) as Box<dyn Client>)
            .collect();
        let mut sides = [store, backend.raw(n).await?];
        let roles = config.roles.unwrap_or(n).min(n);

        let renew = renew_cell(&mut sides, config, run_id, n, roles).await?;
        rows.push(renew.row("renew", n, Some(roles)));

        // Heartbeat: one node per client, registered before measuring.
        let mut heartbeat = Cell::default();
        let mut jobs: [Vec<Job>; 2] = [Vec::new(), Vec::new()];
        for (side, clients) in sides.iter_mut().enumerate() {
            for (i, client) in clients.iter_mut().enumerate() {
                let node = format!("{run_id}-{}{n}-node-{i}", SIDE_NAMES[side]);
                client.heartbeat(&node).await?;
                jobs[side].push(Job::Heartbeat { node });
            }
        }
        run_cell(
            &mut sides,
            &mut jobs,
            &mut heartbeat,
            config.rounds(),
            slice,
        )
        .await?;

        // Acquire (a fresh role each time), then release of exactly those roles.
        let mut acquire = Cell::default();
        let mut release = Cell::default();
        // Round 0 is a warm-up (one acquire and release per client), not recorded.
        for round in 0..=config.rounds() {
            for side in order(round) {
                let jobs = (0..n)
                    .map(|i| Job::Acquire {
                        owner: format!("{run_id}-{}{n}-c{i}-r{round}", SIDE_NAMES[side]),
                        held: Vec::new(),
                    })
                    .collect();
                let deadline = Instant::now() + if round == 0 { Duration::ZERO } else { slice };
                let (jobs, ops, elapsed, latency) = turn(&mut sides[side], jobs, deadline).await?;
                if round > 0 {
                    acquire.sides[side].record(ops, elapsed, &latency);
                }
                let (_, ops, elapsed, latency) =
                    turn(&mut sides[side], releases(jobs), deadline).await?;
                if round > 0 {
                    release.sides[side].record(ops, elapsed, &latency);
                }
            }
            if round > 0 {
                acquire.close_round();
                release.close_round();
            }
        }
        rows.push(acquire.row("acquire", n, None));
        rows.push(release.row("release", n, None));
        rows.push(heartbeat.row("heartbeat", n, None));

        for (e, extra) in backend.extra_cells(n).await?.into_iter().enumerate() {
            let ExtraCell {
                kind,
                op,
                baseline,
                raw,
            } = extra;
            let mut pair = [std::mem::take(&mut sides[STORE]), raw];
            let prefix = format!("{run_id}-x{e}");
            let measured = match kind {
                ExtraKind::Renew => renew_cell(&mut pair, config, &prefix, n, roles).await,
                ExtraKind::Takeover => takeover_cell(&mut pair, config, &prefix, n).await,
            };
            sides[STORE] = std::mem::take(&mut pair[STORE]);
            let row = measured?.row(op, n, matches!(kind, ExtraKind::Renew).then_some(roles));
            rows.push(ThroughputRow {
                baseline: Some(baseline.to_owned()),
                ..row
            });
        }
    }
    Ok(rows)
}

/// Renew: client i renews role i % roles as its owner; the first client of each role
/// takes it first.
async fn renew_cell(
    sides: &mut [Clients; 2],
    config: &BenchConfig,
    prefix: &str,
    n: usize,
    roles: usize,
) -> Result<Cell, BenchError> {
    let mut renew = Cell::default();
    let mut jobs: [Vec<Job>; 2] = [Vec::new(), Vec::new()];
    for (side, clients) in sides.iter_mut().enumerate() {
        for (i, client) in clients.iter_mut().enumerate() {
            let role = format!("{prefix}-{}{n}-renew-{}", SIDE_NAMES[side], i % roles);
            if i < roles {
                client.acquire(&role, &role).await?;
            }
            jobs[side].push(Job::Renew {
                owner: role.clone(),
                role,
            });
        }
    }
    run_cell(
        sides,
        &mut jobs,
        &mut renew,
        config.rounds(),
        config.slice(),
    )
    .await?;
    Ok(renew)
}

/// Roles in each client's takeover pool: enough that a turn rarely runs out (one that
/// does ends early, and its rate is over the time it took).
fn pool_size(clients: usize) -> usize {
    (512 / clients).max(32)
}

/// Takeovers: each client first acquires and releases every role of its pool (untimed,
/// so each object exists, released); then, per round, each side acquires from its
/// pools until the slice ends (timed) and releases what it took (untimed).
async fn takeover_cell(
    sides: &mut [Clients; 2],
    config: &BenchConfig,
    prefix: &str,
    n: usize,
) -> Result<Cell, BenchError> {
    let pools: [Vec<Vec<String>>; 2] = std::array::from_fn(|side| {
        (0..n)
            .map(|i| {
                (0..pool_size(n))
                    .map(|k| format!("{prefix}-{}{n}-c{i}-t{k}", SIDE_NAMES[side]))
                    .collect()
            })
            .collect()
    });
    let mut cell = Cell::default();
    // Round 0 makes the pools' objects (every role, no deadline), round 1 is a warm-up
    // (one takeover per client); neither is recorded.
    for round in 0..=config.rounds() + 1 {
        for side in order(round) {
            let jobs = pools[side]
                .iter()
                .enumerate()
                .map(|(i, pool)| Job::Takeover {
                    owner: format!("{prefix}-{}{n}-c{i}-o{round}", SIDE_NAMES[side]),
                    pool: pool.clone(),
                    held: Vec::new(),
                })
                .collect();
            let deadline = Instant::now()
                + match round {
                    0 => Duration::from_secs(24 * 3600),
                    1 => Duration::ZERO,
                    _ => config.slice(),
                };
            let (jobs, ops, elapsed, latency) = turn(&mut sides[side], jobs, deadline).await?;
            if round > 1 {
                cell.sides[side].record(ops, elapsed, &latency);
            }
            turn(&mut sides[side], releases(jobs), Instant::now()).await?;
        }
        if round > 1 {
            cell.close_round();
        }
    }
    Ok(cell)
}

/// Each acquiring job as the job releasing what it acquired.
fn releases(jobs: Vec<Job>) -> Vec<Job> {
    jobs.into_iter()
        .map(|job| match job {
            Job::Acquire { owner, held } | Job::Takeover { owner, held, .. } => {
                Job::Release { owner, held }
            }
            other => other,
        })
        .collect()
}

/// The store goes first in even rounds, the raw side in odd ones.
fn order(round: usize) -> [usize; 2] {
    if round.is_multiple_of(2) {
        [STORE, RAW]
    } else {
        [RAW, STORE]
    }
}

/// Time-sliced rounds of the same jobs (renew, heartbeat) on both sides.
async fn run_cell(
    sides: &mut [Clients; 2],
    jobs: &mut [Vec<Job>; 2],
    cell: &mut Cell,
    rounds: usize,
    slice: Duration,
) -> Result<(), BenchError> {
    // Round 0 is a warm-up (one operation per client, so every pool has opened its
    // connections), not recorded.
    for round in 0..=rounds {
        for side in order(round) {
            let deadline = Instant::now() + if round == 0 { Duration::ZERO } else { slice };
            let taken = std::mem::take(&mut jobs[side]);
            let (back, ops, elapsed, latency) = turn(&mut sides[side], taken, deadline).await?;
            jobs[side] = back;
            if round > 0 {
                cell.sides[side].record(ops, elapsed, &latency);
            }
        }
        if round > 0 {
            cell.close_round();
        }
    }
    Ok(())
}

/// Operations per kind in the round-trip count.
const COUNTED_OPS: u64 = 100;

/// Server requests per store operation, one client, one kind at a time.
pub(crate) async fn round_trips(
    backend: &dyn Backend,
    run_id: &str,
) -> Result<RoundTrips, BenchError> {
    if let Counter::NotMeasured(reason) = backend.requests().await? {
        return Ok(RoundTrips {
            method: format!("not measured: {reason}"),
            measured: false,
            ops: Vec::new(),
        });
    }
    let mut client = StoreClient(backend.stores(1, REGISTRY_TTL).await?);
    let roles: Vec<String> = (0..COUNTED_OPS)
        .map(|i| format!("{run_id}-count-{i}"))
        .collect();
    let mut tokens = Vec::with_capacity(roles.len());
    let mut ops = Vec::new();
    let before = count(backend).await?;
    for role in &roles {
        tokens.push(client.acquire(role, "counter-a").await?);
    }
    ops.push(row("acquire (new role)", before, count(backend).await?));
    let before = count(backend).await?;
    for role in &roles {
        client.renew(role, "counter-a").await?;
    }
    ops.push(row("renew", before, count(backend).await?));
    let before = count(backend).await?;
    for (role, token) in roles.iter().zip(&tokens) {
        client.release(role, "counter-a", *token).await?;
    }
    ops.push(row("release", before, count(backend).await?));
    let before = count(backend).await?;
    for role in &roles {
        client.acquire(role, "counter-b").await?;
    }
    ops.push(row(
        "acquire (after release)",
        before,
        count(backend).await?,
    ));
    let before = count(backend).await?;
    for role in &roles {
        client.heartbeat(role).await?;
    }
    ops.push(row("heartbeat (new node)", before, count(backend).await?));
    let before = count(backend).await?;
    for role in &roles {
        client.heartbeat(role).await?;
    }
    ops.push(row("heartbeat (live node)", before, count(backend).await?));
    Ok(RoundTrips {
        method: backend.requests_label().to_owned(),
        measured: true,
        ops,
    })
}

async fn count(backend: &dyn Backend) -> Result<u64, BenchError> {
    match backend.requests().await? {
        Counter::Count(n) => Ok(n),
        Counter::NotMeasured(reason) => Err(BenchError::Setup(format!(
            "the request counter stopped working: {reason}"
        ))),
    }
}

fn row(op: &str, before: u64, after: u64) -> RoundTripRow {
    RoundTripRow {
        op: op.to_owned(),
        ops: COUNTED_OPS,
        per_op: after.saturating_sub(before) as f64 / COUNTED_OPS as f64,
    }
}
