//! `etcd://HOST:PORT[/PREFIX]` and `etcd:throwaway`: the etcd store beside its own
//! requests, and its release handover beside etcd's own election API.
//!
//! The store side is an `EtcdLeaseStore` and `EtcdNodeRegistry` on one etcd-client
//! `Client` (one HTTP/2 connection, as `tenure_etcd::connect` gives a process); the raw
//! side sends the requests from `tenure_etcd::requests` (the builders the store itself
//! uses) through clones of one other `Client`, in the store's pattern: a renewal is the
//! compare-and-put transaction with a keep-alive of the term's etcd lease sent beside
//! it; an acquire grants an etcd lease first; a release revokes it after the
//! transaction; a heartbeat reads the node, then writes it beside a keep-alive.
//!
//! Requests per operation come from the members' own `grpc_server_handled_total`
//! (summed over members and gRPC methods), read with a plain HTTP/1.0 GET of
//! `/metrics` ([`crate::http`]). The release floor is etcd's election API in the same
//! run: `resign` -> the contender's waiting `campaign` returns.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use parking_lot::Mutex;
use tenure::{Error, LeaseStore, Result};
use tenure_etcd::etcd_client::{
    self, Client, DeleteOptions, GetOptions, LeaderKey, ResignOptions, TxnResponse,
};
use tenure_etcd::requests::{self, Keys, NodeRecord, TermRecord};
use tenure_etcd::{EtcdLeaseStore, EtcdUrl};
use tenure_throwaway::etcd::EtcdServer;
use tokio::time::{timeout, Instant};

use crate::backend::{
    blocking, unexpected, Backend, Client as BenchClient, Counter, Handles, BENCH_TTL, REGISTRY_TTL,
};
use crate::report::Floor;
use crate::stats::summarize;
use crate::BenchError;

const BACKEND: &str = "etcd";

/// Where the bench's keys go, under the URL's prefix.
const SUBPREFIX: &str = "/tenure-bench";

/// The longest wait for one metrics read or one election step.
const STEP_TIMEOUT: Duration = Duration::from_secs(10);

/// How often, and how many times at most, the counters are re-read until the
/// operations just counted have all been handled (a keep-alive stream the client
/// dropped is counted when the server sees it end, a little later).
const SETTLE_PAUSE: Duration = Duration::from_millis(20);
const SETTLE_READS: usize = 50;

fn err(what: &'static str) -> impl FnOnce(etcd_client::Error) -> Error {
    move |e| Error::store(BACKEND, what, e)
}

fn secs(d: Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX)
}

fn now_ns() -> u64 {
    requests::to_ns(SystemTime::now())
}

pub(crate) struct Etcd {
    url: EtcdUrl,
    /// The oldest version the endpoints reported, which decides how the store renews.
    server_version: Option<tenure_etcd::EtcdVersion>,
    /// The URL's prefix plus [`SUBPREFIX`].
    prefix: String,
    keys: Arc<Keys>,
    run_id: String,
    /// Why requests cannot be counted, if they cannot.
    no_counter: Option<String>,
    /// Calls started but not yet handled when the run began (other clients' streams).
    idle_in_flight: u64,
    /// The last counters read, to log what each count added by method.
    last_counts: Mutex<BTreeMap<String, u64>>,
    server: Mutex<Option<EtcdServer>>,
}

impl Etcd {
    /// Connects to the user's cluster at `url` (or the run's own member).
    pub(crate) async fn open(
        url: &str,
        run_id: &str,
        server: Option<EtcdServer>,
    ) -> Result<Etcd, BenchError> {
        let url = EtcdUrl::parse(url).map_err(|e| BenchError::Usage(format!("--store: {e}")))?;
        let prefix = format!("{}{SUBPREFIX}", url.prefix());
        let keys = Arc::new(Keys::new(&prefix)?);
        // Checks that an endpoint answers, with errors that name no URL.
        let (_, server_version) = tenure_etcd::connect_client(&url).await?;
        let mut etcd = Etcd {
            url,
            server_version,
            prefix,
            keys,
            run_id: run_id.to_owned(),
            no_counter: None,
            idle_in_flight: 0,
            last_counts: Mutex::new(BTreeMap::new()),
            server: Mutex::new(server),
        };
        match etcd.scrape().await {
            Ok(counts) => {
                etcd.idle_in_flight = counts.in_flight();
                *etcd.last_counts.lock() = counts.handled;
            }
            Err(problem) => {
                etcd.no_counter = Some(format!(
                    "etcd's /metrics is not readable over plain HTTP on the client port \
                     ({problem})"
                ))
            }
        }
        Ok(etcd)
    }

    /// Starts one member on loopback; it is stopped and its data removed when the run
    /// ends.
    pub(crate) async fn throwaway(run_id: &str) -> Result<Etcd, BenchError> {
        let server = blocking("start a throwaway etcd member", EtcdServer::start).await?;
        let url = format!("etcd://{}", server.host_port());
        Etcd::open(&url, run_id, Some(server)).await
    }

    /// A store as `tenure` builds one: renewals tuned to the server's version.
    fn store(&self, client: Client) -> Result<EtcdLeaseStore> {
        Ok(EtcdLeaseStore::new(client, &self.prefix)?.for_server(self.server_version))
    }

    async fn client(&self) -> Result<Client> {
        Ok(tenure_etcd::connect_client(&self.url).await?.0)
    }

    /// Every member's gRPC counters, summed.
    async fn scrape(&self) -> std::result::Result<GrpcCounts, String> {
        let mut total = GrpcCounts::default();
        for (i, endpoint) in self.url.endpoints().iter().enumerate() {
            let host_port = endpoint.trim_start_matches("http://");
            let body = timeout(STEP_TIMEOUT, crate::http::get(host_port, "/metrics"))
                .await
                .map_err(|_| format!("endpoint {}: no answer within {STEP_TIMEOUT:?}", i + 1))?
                .map_err(|e| format!("endpoint {}: {e}", i + 1))?;
            total.add(&body);
        }
        if total.handled.is_empty() {
            return Err("no grpc_server_handled_total counters".to_owned());
        }
        Ok(total)
    }

    /// Removes this run's keys from a user's cluster: revoking the etcd leases removes
    /// the keys on them, then the rest (term records) goes by prefix.
    async fn remove_keys(&self) -> Result<()> {
        let client = self.client().await?;
        let mut kv = client.kv_client();
        let mut leases = client.lease_client();
        let dirs = ["leases", "terms", "nodes", "election"]
            .map(|dir| format!("{}/{dir}/{}", self.prefix, self.run_id));
        for dir in &dirs[..] {
            let found = kv
                .get(dir.as_str(), Some(GetOptions::new().with_prefix()))
                .await
                .map_err(err("listing the bench's keys"))?;
            let mut ids: Vec<i64> = found.kvs().iter().map(|kv| kv.lease()).collect();
            ids.sort_unstable();
            ids.dedup();
            for id in ids.into_iter().filter(|&id| id != 0) {
                // Already expired or revoked is fine: its keys are gone either way.
                let _ = leases.revoke(id).await;
            }
            kv.delete(dir.as_str(), Some(DeleteOptions::new().with_prefix()))
                .await
                .map_err(err("removing the bench's keys"))?;
        }
        Ok(())
    }

    /// Release handovers through etcd's election API between two clients, each
    /// campaigning with its own etcd lease.
    async fn election_trials(
        &self,
        clients: &[Client; 2],
        leases: [i64; 2],
        trials: usize,
    ) -> Result<Vec<Duration>> {
        let name = format!("{}/election/{}", self.prefix, self.run_id);
        let first = timeout(
            STEP_TIMEOUT,
            clients[0]
                .election_client()
                .campaign(name.as_str(), "a", leases[0]),
        )
        .await
        .map_err(|_| Error::store_msg(BACKEND, "the first campaign did not win within 10 s"))?
        .map_err(err("campaigning"))?;
        let mut key = leader_key(first.leader())?;
        let mut leader = 0;
        let mut samples = Vec::with_capacity(trials);
        for _ in 0..trials {
            let next = 1 - leader;
            let mut election = clients[next].election_client();
            let (name, lease) = (name.clone(), leases[next]);
            let contender = tokio::spawn(async move {
                let won = election.campaign(name, "b", lease).await;
                (Instant::now(), won)
            });
            tokio::time::sleep(settled_pause()).await;
            let start = Instant::now();
            let resigned = clients[leader]
                .election_client()
                .resign(Some(ResignOptions::new().with_leader(key.clone())))
                .await;
            if let Err(error) = resigned {
                contender.abort();
                return Err(Error::store(BACKEND, "resigning", error));
            }
            let abort = contender.abort_handle();
            let (at, won) = match timeout(STEP_TIMEOUT, contender).await {
                Ok(Ok(answer)) => answer,
                Ok(Err(panic)) => {
                    return Err(Error::store(BACKEND, "a campaign task failed", panic))
                }
                Err(_) => {
                    abort.abort();
                    return Err(Error::store_msg(
                        BACKEND,
                        "the waiting campaign did not win within 10 s of the resign",
                    ));
                }
            };
            key = leader_key(won.map_err(err("campaigning"))?.leader())?;
            leader = next;
            samples.push(at.saturating_duration_since(start));
        }
        Ok(samples)
    }
}

fn leader_key(key: Option<&LeaderKey>) -> Result<LeaderKey> {
    key.cloned()
        .ok_or_else(|| Error::store_msg(BACKEND, "a won campaign named no leader key"))
}

/// 120 to 150 ms, varied from trial to trial: long enough for a waiting campaign to be
/// settled (etcd moves a watch started at a past revision, as `campaign`'s is, into
/// its live set on a 100 ms loop), so the election API is measured at its best.
fn settled_pause() -> Duration {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos();
    Duration::from_micros(120_000 + u64::from(nanos) % 30_000)
}

/// gRPC calls by method: started, and handled (finished, any status code).
#[derive(Default)]
struct GrpcCounts {
    started: BTreeMap<String, u64>,
    handled: BTreeMap<String, u64>,
}

impl GrpcCounts {
    /// Adds one member's Prometheus text.
    fn add(&mut self, body: &str) {
        for line in body.lines() {
            let (counts, rest) = if let Some(rest) = line.strip_prefix("grpc_server_handled_total{")
            {
                (&mut self.handled, rest)
            } else if let Some(rest) = line.strip_prefix("grpc_server_started_total{") {
                (&mut self.started, rest)
            } else {
                continue;
            };
            let Some((labels, value)) = rest.rsplit_once("} ") else {
                continue;
            };
            let Some(method) = labels
                .split("grpc_method=\"")
                .nth(1)
                .and_then(|m| m.split('"').next())
            else {
                continue;
            };
            // Counters are printed as floats (`1.234567e+06` past a million).
            let Ok(value) = value.trim().parse::<f64>() else {
                continue;
            };
            *counts.entry(method.to_owned()).or_insert(0) += value.round() as u64;
        }
    }

    fn total(&self) -> u64 {
        self.handled.values().sum()
    }

    /// Calls started and not yet handled: open streams, and calls in progress.
    fn in_flight(&self) -> u64 {
        let started: u64 = self.started.values().sum();
        started.saturating_sub(self.total())
    }
}

/// The raw side of one client: the store's requests, sent directly.
struct RawClient {
    client: Client,
    keys: Arc<Keys>,
    /// This client's live terms: role -> (token, etcd lease), as the store caches them.
    terms: HashMap<String, (i64, i64)>,
    /// The memberships this client wrote: node -> (mod revision, etcd lease, record), as
    /// the registry remembers them.
    nodes: HashMap<String, (i64, i64, NodeRecord)>,
    /// Renew as the store does against this server: the transaction after the
    /// keep-alive's answer (see `EtcdLeaseStore::for_server`).
    keep_alive_first: bool,
}

impl RawClient {
    /// A transaction and a keep-alive of `lease`, sent together (one round trip).
    async fn with_keep_alive(
        &self,
        txn: etcd_client::Txn,
        lease: i64,
        what: &'static str,
    ) -> Result<TxnResponse> {
        let mut kv = self.client.kv_client();
        let mut leases = self.client.lease_client();
        let (written, alive) = tokio::join!(kv.txn(txn), leases.keep_alive(lease));
        // The keeper and stream drop here, closing the stream, as the store's do.
        alive.map_err(err("raw keep-alive"))?;
        written.map_err(err(what))
    }

    /// A transaction alone; an answer other than success is an error naming `what`.
    async fn commit(&self, txn: etcd_client::Txn, what: &'static str, subject: &str) -> Result<()> {
        let response = self.client.kv_client().txn(txn).await.map_err(err(what))?;
        if !response.succeeded() {
            return Err(unexpected(format!("{what} of {subject}: refused")));
        }
        Ok(())
    }

    async fn grant(&self, ttl: Duration) -> Result<(i64, i64)> {
        let granted = self
            .client
            .lease_client()
            .grant(secs(ttl), None)
            .await
            .map_err(err("raw lease grant"))?;
        Ok((granted.id(), granted.ttl().max(secs(ttl))))
    }
}

fn term_record(owner: &str, token: Option<i64>, lease_secs: i64) -> TermRecord {
    TermRecord {
        owner: owner.to_owned(),
        token: token.and_then(|t| u64::try_from(t).ok()),
        expires_at_ns: requests::to_ns(SystemTime::now() + BENCH_TTL),
        ttl_secs: secs(BENCH_TTL),
        lease_secs,
        released: false,
    }
}

#[async_trait]
impl BenchClient for RawClient {
    async fn acquire(&mut self, role: &str, owner: &str) -> Result<u64> {
        let (lease, lease_secs) = self.grant(BENCH_TTL).await?;
        let record = term_record(owner, None, lease_secs);
        let txn = requests::acquire_txn(&self.keys, role, owner, lease, &record)?;
        let response = self.with_keep_alive(txn, lease, "raw acquire").await?;
        if !response.succeeded() {
            return Err(unexpected(format!("raw acquire of {role}: held")));
        }
        let token = response.header().map_or(0, |h| h.revision());
        self.terms.insert(role.to_owned(), (token, lease));
        u64::try_from(token).map_err(|_| unexpected(format!("raw acquire of {role}: bad token")))
    }

    async fn renew(&mut self, role: &str, owner: &str) -> Result<()> {
        let Some(&(token, lease)) = self.terms.get(role) else {
            return Err(unexpected(format!("raw renewal of {role}: not held here")));
        };
        let record = term_record(owner, Some(token), secs(BENCH_TTL));
        let txn = requests::renew_txn(&self.keys, role, owner, token, &record)?;
        let renewed = if self.keep_alive_first {
            self.client
                .lease_client()
                .keep_alive(lease)
                .await
                .map_err(err("raw keep-alive"))?;
            self.client
                .kv_client()
                .txn(txn)
                .await
                .map_err(err("raw renewal"))?
        } else {
            self.with_keep_alive(txn, lease, "raw renewal").await?
        };
        if !renewed.succeeded() {
            return Err(unexpected(format!("raw renewal of {role}: not held")));
        }
        Ok(())
    }

    async fn release(&mut self, role: &str, owner: &str, token: u64) -> Result<()> {
        let held = self.terms.remove(role);
        let Some((held_token, lease)) = held.filter(|(t, _)| u64::try_from(*t) == Ok(token)) else {
            return Err(unexpected(format!("raw release of {role}: not held here")));
        };
        let record = TermRecord {
            expires_at_ns: now_ns(),
            released: true,
            ..term_record(owner, Some(held_token), secs(BENCH_TTL))
        };
        let txn = requests::release_txn(&self.keys, role, owner, held_token, &record)?;
        self.commit(txn, "raw release", role).await?;
        self.client
            .lease_client()
            .revoke(lease)
            .await
            .map_err(err("raw lease revoke"))?;
        Ok(())
    }

    async fn heartbeat(&mut self, node: &str) -> Result<()> {
        let key = self.keys.node(node);
        let now = now_ns();
        // A remembered live membership: its transaction beside the keep-alive, no read.
        if let Some((revision, lease, mut record)) = self.nodes.remove(node) {
            record.last_heartbeat_ns = now;
            let txn = requests::node_txn(&key, revision, &record, lease)?;
            let response = self.with_keep_alive(txn, lease, "raw heartbeat").await?;
            if !response.succeeded() {
                return Err(unexpected(format!("raw heartbeat of {node}: raced")));
            }
            let revision = response.header().map_or(0, |h| h.revision());
            self.nodes
                .insert(node.to_owned(), (revision, lease, record));
            return Ok(());
        }
        // The first heartbeat: read, then a new membership on a new lease.
        let read = self
            .client
            .kv_client()
            .get(key.as_str(), None)
            .await
            .map_err(err("raw node read"))?;
        let (lease, _) = self.grant(REGISTRY_TTL).await?;
        let record = NodeRecord {
            first_seen_ns: now,
            last_heartbeat_ns: now,
            metadata: Default::default(),
            session: None,
        };
        let revision = read.kvs().first().map_or(0, |kv| kv.mod_revision());
        let txn = requests::node_txn(&key, revision, &record, lease)?;
        let response = self
            .client
            .kv_client()
            .txn(txn)
            .await
            .map_err(err("raw heartbeat"))?;
        if !response.succeeded() {
            return Err(unexpected(format!("raw heartbeat of {node}: refused")));
        }
        let revision = response.header().map_or(0, |h| h.revision());
        self.nodes
            .insert(node.to_owned(), (revision, lease, record));
        Ok(())
    }
}

#[async_trait]
impl Backend for Etcd {
    async fn stores(&self, _clients: usize, registry_ttl: Duration) -> Result<Handles> {
        let client = self.client().await?;
        let leases = self.store(client)?;
        // Made from the store, as `tenure` makes it: a member's keep-alive is its heartbeat.
        let registry = leases.registry(registry_ttl)?;
        Ok(Handles {
            leases: Arc::new(leases),
            registry: Arc::new(registry),
        })
    }

    async fn raw(&self, clients: usize) -> Result<Vec<Box<dyn BenchClient>>> {
        let client = self.client().await?;
        Ok((0..clients)
            .map(|_| {
                Box::new(RawClient {
                    client: client.clone(),
                    keys: Arc::clone(&self.keys),
                    terms: HashMap::new(),
                    nodes: HashMap::new(),
                    keep_alive_first: tenure_etcd::version::keep_alive_first(self.server_version),
                }) as Box<dyn BenchClient>
            })
            .collect())
    }

    fn raw_label(&self) -> &'static str {
        "the store's requests (tenure_etcd::requests) through etcd-client directly, in the \
         store's pattern (txn beside a keep-alive, or after it for renewals against an etcd \
         release whose keep-alive answers are unsafe; grant before acquire; revoke after \
         release), the clients sharing one Client as the store's do"
    }

    async fn pair(&self) -> Result<(Arc<dyn LeaseStore>, Arc<dyn LeaseStore>)> {
        Ok((
            Arc::new(self.store(self.client().await?)?),
            Arc::new(self.store(self.client().await?)?),
        ))
    }

    async fn requests(&self) -> Result<Counter> {
        if let Some(problem) = &self.no_counter {
            return Ok(Counter::NotMeasured(problem.clone()));
        }
        let scrape = |counts: std::result::Result<GrpcCounts, String>| {
            counts.map_err(|problem| {
                Error::store_msg(BACKEND, format!("cannot read etcd's counters: {problem}"))
            })
        };
        let mut counts = scrape(self.scrape().await)?;
        let mut reads = 1;
        while counts.in_flight() > self.idle_in_flight && reads < SETTLE_READS {
            tokio::time::sleep(SETTLE_PAUSE).await;
            counts = scrape(self.scrape().await)?;
            reads += 1;
        }
        let mut last = self.last_counts.lock();
        let added: Vec<String> = counts
            .handled
            .iter()
            .filter_map(|(method, &n)| {
                let delta = n.saturating_sub(last.get(method).copied().unwrap_or(0));
                (delta > 0).then(|| format!("{method} +{delta}"))
            })
            .collect();
        tracing::debug!(added = %added.join(", "), reads, "etcd gRPC calls since the last count");
        let total = counts.total();
        *last = counts.handled;
        Ok(Counter::Count(total))
    }

    fn requests_label(&self) -> &'static str {
        "gRPC calls etcd handled (grpc_server_handled_total, all methods, all members; a \
         renewal's txn and keep-alive go together, so 2 calls are 1 round trip)"
    }

    async fn release_floor(&self, trials: usize, _run_id: &str) -> Result<Floor> {
        let clients = [self.client().await?, self.client().await?];
        let mut leases = [0; 2];
        for (lease, client) in leases.iter_mut().zip(&clients) {
            *lease = client
                .lease_client()
                .grant(secs(BENCH_TTL), None)
                .await
                .map_err(err("granting a campaign's lease"))?
                .id();
        }
        let samples = self.election_trials(&clients, leases, trials).await;
        for (client, lease) in clients.iter().zip(leases) {
            // The campaign keys are on these leases and go with them.
            let _ = client.lease_client().revoke(lease).await;
        }
        Ok(Floor {
            label: "etcd election API: resign -> waiting campaign returns (settled)".to_owned(),
            latency: Some(summarize(&samples?)),
            bound_ms: None,
        })
    }

    fn release_goal_ms(&self) -> Option<f64> {
        Some(3.0)
    }

    /// etcd checks lease expiry every 500 ms, so a stalled term's key can outlive its
    /// TTL by that much before the delete wakes the successor.
    fn stall_goal(&self) -> Duration {
        Duration::from_millis(600)
    }

    async fn version(&self) -> Option<String> {
        let mut client = self.client().await.ok()?;
        let status = client.status().await.ok()?;
        let owned = if self.server.lock().is_some() {
            " (throwaway member)"
        } else {
            ""
        };
        Some(format!("etcd {}{owned}", status.version()))
    }

    async fn close(&self) {
        let server = self.server.lock().take();
        match server {
            // Killing the member removes its data with it.
            Some(server) => {
                let _ = tokio::task::spawn_blocking(move || drop(server)).await;
            }
            None => {
                if let Err(error) = self.remove_keys().await {
                    tracing::warn!(%error, "cannot remove the bench's keys from etcd");
                }
            }
        }
    }
}
