//! `tenure run --metrics-addr`: Prometheus metrics and two probes over HTTP.
//!
//! `/metrics` is the text exposition of every metric the library and the command record
//! (rendered by `metrics-exporter-prometheus`), `/healthz` says whether the store answered
//! lately, and `/leader` whether this process leads (a load balancer or readiness probe
//! routes to the leader with it). The listener is bound before the store is opened, so
//! an address that cannot be used stops `tenure run` before it contends; the server runs
//! on the command's own single-threaded runtime.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use parking_lot::Mutex;
use serde::Serialize;
use tenure::intercept::{Call, InterceptStore, Interceptor, Next, Reply};
use tenure::{ElectionState, ShardState};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{info, warn};

use crate::say::say;
use crate::store::Stores;
use crate::UsageError;

/// Renew latency buckets, in seconds: from a local SQLite file (sub-millisecond) to a
/// store on the edge of losing the term.
const LATENCY_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// How often histogram samples recorded since the last scrape are folded in, so memory
/// stays bounded when nobody scrapes.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// Parses `--metrics-addr`: `IP:PORT` (`[IPV6]:PORT` for IPv6), `localhost:PORT`, or a
/// bare `:PORT` / `PORT`, which mean `127.0.0.1:PORT`. Port 0 picks a free port.
pub fn parse_addr(value: &str) -> Result<SocketAddr, String> {
    let loopback = |port: &str| {
        port.parse::<u16>()
            .map(|port| SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port))
            .map_err(|_| format!("{port:?} is not a port (0 to 65535)"))
    };
    if let Some(port) = value.strip_prefix("localhost:") {
        return loopback(port);
    }
    if let Some(port) = value.strip_prefix(':') {
        return loopback(port);
    }
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        return loopback(value);
    }
    value.parse::<SocketAddr>().map_err(|_| {
        "expected IP:PORT, [IPV6]:PORT, localhost:PORT, :PORT or PORT (e.g. 127.0.0.1:9464)"
            .to_owned()
    })
}

/// A bound `--metrics-addr` listener with the Prometheus recorder installed, ready to
/// serve once the runtime runs.
pub struct Exporter {
    listener: TcpListener,
    handle: PrometheusHandle,
}

impl Exporter {
    /// Binds `addr` and installs the process-wide metrics recorder. An address in use (or
    /// not ours to bind) is a [`UsageError`] naming `--metrics-addr`.
    pub fn bind(addr: SocketAddr) -> anyhow::Result<Exporter> {
        let listener = TcpListener::bind(addr)
            .and_then(|listener| listener.set_nonblocking(true).map(|()| listener))
            .map_err(|error| {
                UsageError(format!("--metrics-addr {addr}: cannot listen: {error}"))
            })?;
        let handle = PrometheusBuilder::new()
            .set_buckets_for_metric(
                Matcher::Full("tenure_renew_latency_seconds".to_owned()),
                &LATENCY_BUCKETS,
            )?
            .install_recorder()?;
        describe();
        Ok(Exporter { listener, handle })
    }

    /// The address bound (the port chosen, for port 0).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Routes the calls to `stores`' lease store through the `/healthz` hook: it is
    /// healthy while one succeeded within `window`. Call before anything uses the store.
    pub fn watch_store(self, stores: &mut Stores, window: Duration) -> Watching {
        let health = Arc::new(StoreHealth {
            last_success: Mutex::new(Instant::now()),
            window,
        });
        let watched = InterceptStore::new(stores.leases.clone()).with(health.clone());
        stores.leases = Arc::new(watched);
        Watching {
            exporter: self,
            health,
        }
    }
}

/// An [`Exporter`] whose store is watched, ready to serve.
pub struct Watching {
    exporter: Exporter,
    health: Arc<StoreHealth>,
}

impl Watching {
    /// Starts serving on the current runtime, for `subject`. Announces the address on
    /// stderr in one line, `tenure: metrics on http://ADDR (/metrics, /healthz, /leader)`.
    pub fn serve(self, subject: Subject) -> anyhow::Result<()> {
        let Watching { exporter, health } = self;
        let addr = exporter.local_addr()?;
        let listener = tokio::net::TcpListener::from_std(exporter.listener)?;
        let upkeep = exporter.handle.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(UPKEEP_EVERY);
            loop {
                every.tick().await;
                upkeep.run_upkeep();
            }
        });
        let app = Router::new()
            .route("/metrics", get(scrape))
            .route("/healthz", get(healthz))
            .route("/leader", get(leader))
            .with_state(Arc::new(Shared {
                handle: exporter.handle,
                subject,
                health,
            }));
        tokio::spawn(async move {
            if let Err(error) = axum::serve(listener, app).await {
                warn!(%error, "the metrics server stopped");
            }
        });
        info!(%addr, "serving /metrics, /healthz and /leader");
        say!("tenure: metrics on http://{addr} (/metrics, /healthz, /leader)");
        Ok(())
    }
}

/// HELP lines for every metric `tenure run` can expose.
fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_gauge!(
        "tenure_is_leader",
        "1 while this process leads the role (a shard's role G/k for groups), else 0"
    );
    describe_gauge!(
        "tenure_fencing_token",
        "Fencing token of this process's current or last term of the role"
    );
    describe_counter!(
        "tenure_terms_started_total",
        "Terms this process began as leader of the role"
    );
    describe_counter!(
        "tenure_renewals_total",
        "Lease renewals of the role by outcome (ok, lost, failed)"
    );
    describe_histogram!(
        "tenure_renew_latency_seconds",
        Unit::Seconds,
        "Time from sending a renewal of the role to its answer"
    );
    describe_counter!(
        "tenure_store_errors_total",
        "Store calls that failed, by operation"
    );
    describe_counter!(
        "tenure_heartbeats_total",
        "Membership heartbeats by outcome (ok, failed)"
    );
    describe_gauge!(
        "tenure_shards_owned",
        "Shards of the group this member runs work for"
    );
}

/// What `/leader` reports on.
pub enum Subject {
    /// `--role R`: leading is holding the role.
    Role {
        /// The role.
        role: String,
        /// The elector's state.
        state: watch::Receiver<ElectionState>,
        /// The store, to say who leads when this process does not.
        leases: Arc<dyn tenure::LeaseStore>,
    },
    /// `--group G`: leading is owning at least one shard.
    Group {
        /// The group.
        group: String,
        /// The member's state.
        state: watch::Receiver<ShardState>,
    },
}

struct Shared {
    handle: PrometheusHandle,
    subject: Subject,
    health: Arc<StoreHealth>,
}

async fn scrape(State(shared): State<Arc<Shared>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        shared.handle.render(),
    )
        .into_response()
}

/// `/healthz`'s body.
#[derive(Serialize)]
struct Health {
    healthy: bool,
    /// Seconds since the last store call that succeeded.
    last_success_seconds_ago: f64,
    /// How recent that must be.
    window_seconds: f64,
}

async fn healthz(State(shared): State<Arc<Shared>>) -> Response {
    let ago = shared.health.since_success();
    let window = shared.health.window;
    let body = Health {
        healthy: ago <= window,
        last_success_seconds_ago: ago.as_secs_f64(),
        window_seconds: window.as_secs_f64(),
    };
    json(body.healthy, &body)
}

/// `/leader`'s body for `--role`.
#[derive(Serialize)]
struct RoleLeader<'a> {
    role: &'a str,
    leader: bool,
    /// The term's token while leading.
    fencing_token: Option<u64>,
    /// Who leads the role and what its term advertised, read from the store; `null`
    /// when nobody does, absent when the store could not be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    current: Option<Option<tenure::Leader>>,
}

/// `/leader`'s body for `--group`.
#[derive(Serialize)]
struct GroupLeader<'a> {
    group: &'a str,
    leader: bool,
    /// Shard number to its term's token, for the shards this member runs.
    shards: std::collections::BTreeMap<u32, u64>,
}

async fn leader(State(shared): State<Arc<Shared>>) -> Response {
    match &shared.subject {
        Subject::Role {
            role,
            state,
            leases,
        } => {
            let fencing_token = match &*state.borrow() {
                ElectionState::Leader { fencing_token } => Some(fencing_token.get()),
                _ => None,
            };
            let current = match leases.get(role).await {
                Ok(info) => Some(info.as_ref().and_then(tenure::Leader::of)),
                Err(error) => {
                    warn!(%error, "/leader could not read the role's lease");
                    None
                }
            };
            let body = RoleLeader {
                role,
                leader: fencing_token.is_some(),
                fencing_token,
                current,
            };
            json(body.leader, &body)
        }
        Subject::Group { group, state } => {
            let shards: std::collections::BTreeMap<u32, u64> = state
                .borrow()
                .owned
                .iter()
                .map(|(shard, token)| (*shard, token.get()))
                .collect();
            let body = GroupLeader {
                group,
                leader: !shards.is_empty(),
                shards,
            };
            json(body.leader, &body)
        }
    }
}

/// A one-line JSON response: 200 if `ok`, else 503.
fn json(ok: bool, body: &impl Serialize) -> Response {
    let status = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let mut text = serde_json::to_string(body).unwrap_or_else(|_| "{}".to_owned());
    text.push('\n');
    (status, [(header::CONTENT_TYPE, "application/json")], text).into_response()
}

/// Watches every call to the lease store: when one last succeeded (for `/healthz`;
/// opening the store counts as the first), and `tenure_store_errors_total{operation}`
/// for those that failed.
struct StoreHealth {
    last_success: Mutex<Instant>,
    window: Duration,
}

impl StoreHealth {
    fn since_success(&self) -> Duration {
        self.last_success.lock().elapsed()
    }
}

#[async_trait]
impl Interceptor for StoreHealth {
    async fn intercept(&self, call: Call, next: Next) -> Reply {
        let operation = call.method();
        let reply = next.run(call).await;
        let failed = match &reply {
            Reply::Lease(result) => result.is_err(),
            Reply::Released(result) => result.is_err(),
            Reply::Session(result) => result.is_err(),
            Reply::KeptAlive(result) => result.is_err(),
            Reply::Info(result) => result.is_err(),
            Reply::List(result) => result.is_err(),
            Reply::Changes(result) => result.is_err(),
            // A wait ends whether or not the store is there: it tells nothing.
            _ => return reply,
        };
        if failed {
            metrics::counter!("tenure_store_errors_total", "operation" => operation).increment(1);
        } else {
            *self.last_success.lock() = Instant::now();
        }
        reply
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_accepted_and_refused() {
        let loopback = |port| SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port);
        assert_eq!(parse_addr("9464"), Ok(loopback(9464)));
        assert_eq!(parse_addr(":9464"), Ok(loopback(9464)));
        assert_eq!(parse_addr("localhost:0"), Ok(loopback(0)));
        assert_eq!(
            parse_addr("0.0.0.0:80"),
            Ok("0.0.0.0:80".parse::<SocketAddr>().unwrap())
        );
        assert_eq!(
            parse_addr("[::1]:9464"),
            Ok("[::1]:9464".parse::<SocketAddr>().unwrap())
        );
        for bad in [
            "", ":", "70000", ":x", "host:1", "1.2.3.4", "1.2.3.4:", "::1:9",
        ] {
            assert!(parse_addr(bad).is_err(), "{bad:?} was accepted");
        }
    }
}
