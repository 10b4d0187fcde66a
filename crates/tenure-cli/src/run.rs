//! `tenure run`: run a command as the cluster-wide singleton of a role.
//!
//! The command starts once this process holds the role's lease, with the term's fencing
//! token in `TENURE_FENCING_TOKEN`. If leadership is lost, its process group gets SIGTERM,
//! then SIGKILL after `--kill-after`; the elector is told to cancel leadership that long
//! (plus a margin) before its local deadline, so the command is dead before the lease can
//! pass to anyone else. SIGINT, SIGTERM and SIGHUP are forwarded to the command; the
//! lease is released when it exits, and tenure exits with its code.

use std::ffi::OsString;
use std::io::ErrorKind;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use parking_lot::Mutex;
use tenure::{
    ElectionState, FencingToken, LeaseLeaderElector, LeaseLeaderOptions, LeaseStore, Metadata,
};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::exit;
use crate::output::human;
use crate::store::Stores;

/// Time allowed, beyond `--kill-after`, for SIGKILL to take effect and the child to be
/// reaped before the local deadline.
const KILL_MARGIN: Duration = Duration::from_millis(500);

/// How often a waiting `tenure run` says who holds the role.
const STATUS_EVERY: Duration = Duration::from_secs(5);

/// The settings of one `tenure run`.
#[derive(Debug)]
pub struct RunArgs {
    /// The role to lead.
    pub role: String,
    /// Lease TTL.
    pub ttl: Duration,
    /// Renew interval.
    pub renew_every: Duration,
    /// Retry interval while waiting.
    pub retry_every: Duration,
    /// Owner id; default host-pid-random.
    pub owner: Option<String>,
    /// Exit at once with [`exit::BUSY`] when someone else leads.
    pub no_wait: bool,
    /// Give up waiting after this long with [`exit::TIMEOUT`].
    pub wait_timeout: Option<Duration>,
    /// SIGTERM -> SIGKILL delay when leadership is lost.
    pub kill_after: Duration,
    /// Heartbeat membership as this node while running.
    pub node_id: Option<String>,
    /// The store URL, passed on to the command as `TENURE_STORE`.
    pub store_url: String,
    /// The command and its arguments.
    pub command: Vec<OsString>,
}

impl RunArgs {
    /// The elector options these arguments stand for.
    pub fn options(&self) -> LeaseLeaderOptions {
        let mut options = LeaseLeaderOptions {
            lease_ttl: self.ttl,
            renew_interval: self.renew_every,
            retry_interval: self.retry_every,
            work_grace: self.kill_after + KILL_MARGIN,
            ..Default::default()
        };
        if let Some(owner) = &self.owner {
            options.owner_id = owner.clone();
        }
        options
    }
}

/// How the command's run ended.
#[derive(Debug)]
enum Outcome {
    /// The command exited on its own (or after a forwarded signal).
    Exited(ExitStatus),
    /// Leadership was lost and the command was stopped.
    Lost(ExitStatus),
    /// The command could not be started.
    SpawnFailed(std::io::Error),
}

/// Runs the command under the role's lease; returns tenure's exit code.
pub async fn run(stores: Stores, args: RunArgs) -> anyhow::Result<u8> {
    let options = args.options();
    let owner = options.owner_id.clone();
    let elector = Arc::new(LeaseLeaderElector::new(stores.leases.clone(), options)?);
    let shutdown = CancellationToken::new();
    let outcome: Arc<Mutex<Option<Outcome>>> = Arc::default();
    let (forward_tx, forward_rx) = mpsc::unbounded_channel::<Signal>();
    let forward_rx = Arc::new(tokio::sync::Mutex::new(forward_rx));

    let membership = args.node_id.as_ref().map(|node_id| {
        let mut metadata = Metadata::new();
        metadata.insert("role".to_owned(), args.role.clone());
        metadata.insert("owner".to_owned(), owner.clone());
        metadata.insert("pid".to_owned(), std::process::id().to_string());
        let cancel = CancellationToken::new();
        let every = (stores.registry.ttl() / 3).max(Duration::from_millis(10));
        let handle = tenure::spawn_heartbeat(
            stores.registry.clone(),
            node_id.clone(),
            metadata,
            every,
            cancel.clone(),
        );
        (cancel, handle)
    });

    let elected = {
        let elector = elector.clone();
        let shutdown = shutdown.clone();
        let outcome = outcome.clone();
        let role = args.role.clone();
        let command = args.command.clone();
        let store_url = args.store_url.clone();
        let owner = owner.clone();
        let kill_after = args.kill_after;
        let stop = shutdown.clone();
        tokio::spawn(async move {
            let role_name = role.clone();
            elector
                .run(
                    &role_name,
                    move |token, leadership| {
                        let child = ChildSpec {
                            command: command.clone(),
                            token,
                            role: role.clone(),
                            owner: owner.clone(),
                            store_url: store_url.clone(),
                            kill_after,
                        };
                        let outcome = outcome.clone();
                        let shutdown = stop.clone();
                        let forward = forward_rx.clone();
                        async move {
                            // One run per `tenure run`: a term that starts after the
                            // command already ran (or failed to start) does nothing.
                            if outcome.lock().is_some() || shutdown.is_cancelled() {
                                return;
                            }
                            let mut forward = forward.lock().await;
                            let result = child.run(&leadership, &mut forward).await;
                            if matches!(result, Outcome::Lost(_) | Outcome::SpawnFailed(_)) {
                                shutdown.cancel();
                            }
                            *outcome.lock() = Some(result);
                        }
                    },
                    shutdown,
                )
                .await
        })
    };

    let mut signals = Signals::new()?;
    let mut state = elector.watch();
    let mut led = false;
    let mut announced = false;
    let waiting_since = tokio::time::Instant::now();
    let mut status_tick = tokio::time::interval_at(waiting_since + STATUS_EVERY, STATUS_EVERY);
    status_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let wait_limit = args
        .wait_timeout
        .or(if args.no_wait { Some(args.ttl) } else { None });
    let give_up = async {
        match wait_limit {
            Some(limit) => tokio::time::sleep(limit).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(give_up, elected);
    let mut early_exit: Option<u8> = None;

    let joined = loop {
        tokio::select! {
            joined = &mut elected => break joined,
            Some(signal) = signals.recv() => {
                // Leadership may have begun an instant ago, before this loop saw it.
                led = led || state.borrow().is_leader();
                if led {
                    info!(role = %args.role, ?signal, "forwarding signal to the command");
                    let _ = forward_tx.send(signal);
                } else {
                    eprintln!("tenure: {signal:?} while waiting for role {:?}; giving up", args.role);
                    early_exit.get_or_insert(128 + signal as u8);
                    shutdown.cancel();
                }
            }
            changed = state.changed(), if !led => {
                if changed.is_err() { continue; }
                let current = state.borrow_and_update().clone();
                match current {
                    ElectionState::Leader { .. } => led = true,
                    ElectionState::Follower { holder: Some((holder, token)) } if args.no_wait => {
                        eprintln!("tenure: role {:?} is held by {holder} (token {token}); not waiting (--no-wait)", args.role);
                        early_exit.get_or_insert(exit::BUSY);
                        shutdown.cancel();
                    }
                    ElectionState::Follower { holder: Some((holder, token)) } if !announced => {
                        announced = true;
                        eprintln!("tenure: role {:?} is held by {holder} (token {token}); waiting", args.role);
                    }
                    _ => {}
                }
            }
            _ = status_tick.tick(), if !led && !shutdown.is_cancelled() => {
                print_waiting(stores.leases.as_ref(), &args.role, waiting_since.elapsed()).await;
            }
            _ = &mut give_up, if !led && !shutdown.is_cancelled() => {
                if args.no_wait {
                    eprintln!("tenure: no answer from the store within {} (--no-wait)", human(args.ttl));
                    early_exit.get_or_insert(exit::RUN_FAILED);
                } else {
                    eprintln!("tenure: not leader of role {:?} within --wait-timeout {}", args.role,
                        human(args.wait_timeout.unwrap_or_default()));
                    early_exit.get_or_insert(exit::TIMEOUT);
                }
                shutdown.cancel();
            }
        }
    };

    if let Some((cancel, handle)) = membership {
        cancel.cancel();
        let _ = handle.await;
    }
    joined.context("elector task")??;
    if let Some(code) = early_exit {
        if outcome.lock().is_none() {
            return Ok(code);
        }
    }
    let outcome = outcome.lock().take();
    Ok(match outcome {
        Some(Outcome::Exited(status)) => exit_code(status),
        Some(Outcome::Lost(status)) => {
            eprintln!(
                "tenure: leadership of role {:?} was lost; the command was stopped ({})",
                args.role,
                describe(status)
            );
            exit::LOST
        }
        Some(Outcome::SpawnFailed(error)) => {
            let program = args
                .command
                .first()
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default();
            eprintln!("tenure: cannot run {program:?}: {error}");
            match error.kind() {
                ErrorKind::NotFound => exit::NOT_FOUND,
                _ => exit::NOT_EXECUTABLE,
            }
        }
        None => early_exit.unwrap_or(exit::RUN_FAILED),
    })
}

async fn print_waiting(store: &dyn LeaseStore, role: &str, waited: Duration) {
    match store.get(role).await {
        Ok(Some(lease)) => match lease.live_holder() {
            Some(holder) => eprintln!(
                "tenure: waiting {} for role {role:?}: held by {holder} (token {}), expires in {}",
                human(waited),
                lease.fencing_token,
                human(lease.remaining())
            ),
            None => eprintln!(
                "tenure: waiting {} for role {role:?}: free, acquiring",
                human(waited)
            ),
        },
        Ok(None) => eprintln!(
            "tenure: waiting {} for role {role:?}: no lease yet, acquiring",
            human(waited)
        ),
        Err(error) => eprintln!(
            "tenure: waiting {} for role {role:?}: store error: {error}",
            human(waited)
        ),
    }
}

/// Everything needed to start the command for one term.
struct ChildSpec {
    command: Vec<OsString>,
    token: FencingToken,
    role: String,
    owner: String,
    store_url: String,
    kill_after: Duration,
}

impl ChildSpec {
    async fn run(
        self,
        leadership: &CancellationToken,
        forward: &mut mpsc::UnboundedReceiver<Signal>,
    ) -> Outcome {
        let Some((program, rest)) = self.command.split_first() else {
            return Outcome::SpawnFailed(std::io::Error::new(
                ErrorKind::InvalidInput,
                "no command",
            ));
        };
        let mut command = tokio::process::Command::new(program);
        command
            .args(rest)
            .env("TENURE_FENCING_TOKEN", self.token.to_string())
            .env("TENURE_ROLE", &self.role)
            .env("TENURE_OWNER", &self.owner)
            .env("TENURE_STORE", &self.store_url)
            // Its own process group, so a lost term stops everything it started.
            .process_group(0)
            .kill_on_drop(true);
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            command.pre_exec(|| {
                // If tenure dies (SIGKILL, OOM), the command must not outlive its lease.
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)
            });
        }
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(error) => return Outcome::SpawnFailed(error),
        };
        let Some(pgid) = child.id().map(|pid| Pid::from_raw(pid as i32)) else {
            return Outcome::SpawnFailed(std::io::Error::other(
                "the command exited before it could be tracked",
            ));
        };
        info!(role = %self.role, token = %self.token, pid = pgid.as_raw(), "command started");
        let mut kill_at: Option<tokio::time::Instant> = None;
        loop {
            tokio::select! {
                status = child.wait() => {
                    return match status {
                        Ok(status) => Outcome::Exited(status),
                        Err(error) => Outcome::SpawnFailed(error),
                    };
                }
                _ = leadership.cancelled() => {
                    warn!(role = %self.role, token = %self.token, "leadership lost; stopping the command");
                    let status = terminate(&mut child, pgid, self.kill_after).await;
                    return Outcome::Lost(status);
                }
                Some(signal) = forward.recv() => {
                    let _ = killpg(pgid, signal);
                    kill_at.get_or_insert(tokio::time::Instant::now() + self.kill_after);
                }
                _ = sleep_until_opt(kill_at) => {
                    warn!(role = %self.role, "the command ignored the forwarded signal; killing it");
                    let _ = killpg(pgid, Signal::SIGKILL);
                    kill_at = None;
                }
            }
        }
    }
}

async fn sleep_until_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// SIGTERM to the group, SIGKILL after `kill_after`, then SIGKILL to any stragglers.
async fn terminate(
    child: &mut tokio::process::Child,
    pgid: Pid,
    kill_after: Duration,
) -> ExitStatus {
    let _ = killpg(pgid, Signal::SIGTERM);
    let status = match tokio::time::timeout(kill_after, child.wait()).await {
        Ok(Ok(status)) => Some(status),
        _ => None,
    };
    // Whatever else the command started must not outlive the term either.
    let _ = killpg(pgid, Signal::SIGKILL);
    match status {
        Some(status) => status,
        None => child
            .wait()
            .await
            .unwrap_or_else(|_| ExitStatus::from_raw(Signal::SIGKILL as i32)),
    }
}

/// The shell's convention: the exit code, or 128 + the signal that killed it.
fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(signal)) => 128u8.saturating_add(signal as u8),
        (None, None) => exit::RUN_FAILED,
    }
}

fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("it exited with {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        (None, None) => "unknown status".to_owned(),
    }
}

/// SIGINT, SIGTERM and SIGHUP, as one stream.
struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> anyhow::Result<Self> {
        Ok(Signals {
            interrupt: signal(SignalKind::interrupt()).context("cannot listen for SIGINT")?,
            terminate: signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?,
            hangup: signal(SignalKind::hangup()).context("cannot listen for SIGHUP")?,
        })
    }

    async fn recv(&mut self) -> Option<Signal> {
        tokio::select! {
            s = self.interrupt.recv() => s.map(|_| Signal::SIGINT),
            s = self.terminate.recv() => s.map(|_| Signal::SIGTERM),
            s = self.hangup.recv() => s.map(|_| Signal::SIGHUP),
        }
    }
}
