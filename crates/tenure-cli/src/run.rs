//! `tenure run`: run a command as the cluster-wide singleton of a role.
//!
//! The command starts once this process holds the role's lease, with the term's fencing
//! token in `TENURE_FENCING_TOKEN`. If leadership is lost, its processes get SIGTERM,
//! then SIGKILL after `--kill-after`; the elector is told to cancel leadership that long
//! (plus a margin) before its local deadline, so the command is dead before the lease can
//! pass to anyone else. SIGINT, SIGTERM and SIGQUIT are forwarded to the command's process
//! group (and it is killed if still there `--kill-after` later); SIGHUP, SIGUSR1, SIGUSR2
//! and SIGALRM are forwarded too, with no deadline, since they ask the command to do
//! something (reload its configuration, reopen its logs) rather than to stop. The lease
//! is released when it exits, and tenure exits with its code. While waiting for the role,
//! SIGINT, SIGTERM, SIGHUP and SIGQUIT give up (exit 128+N); SIGUSR1, SIGUSR2 and SIGALRM
//! are logged and ignored, as there is no command yet.
//!
//! No signal kills tenure by its default action while the command runs, which would leave
//! the lease held until the TTL: SIGTTOU and SIGTTIN (a background tenure writing to a
//! terminal with `stty tostop`) are ignored, and given back their default in the command.
//!
//! "Its processes" are every descendant of tenure, not only the command's process group:
//! tenure is a child subreaper (`PR_SET_CHILD_SUBREAPER`), so a process the command starts
//! stays a descendant of tenure however it detaches (a background job, `setsid`, a double
//! fork, `daemon(3)`). When the command exits, whatever it left running is stopped the same
//! way before the lease is released.
//!
//! Ctrl-Z (SIGTSTP to tenure) stops every descendant (SIGSTOP, looking again until nothing
//! new runs, for a command that forks meanwhile) and then tenure itself; SIGCONT to tenure
//! resumes them, unless the term was lost while they were stopped, in which case they are
//! stopped for good. SIGSTOP to tenure alone cannot be seen by tenure: its guard
//! ([`crate::guard`]), a process of its own holding the same deadline, SIGKILLs the command
//! when the term's deadline passes; with the guard stopped too, only a fence stops its
//! writes.

use std::ffi::OsString;
use std::io::ErrorKind;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use nix::sys::signal::Signal;
use parking_lot::Mutex;
use tenure::{
    ElectionState, FencingToken, LeaseLeaderElector, LeaseLeaderOptions, LeaseStore, Metadata,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::exit;
use crate::exporter::{Exporter, Subject};
use crate::output::human;
use crate::say::say;
use crate::store::Stores;

mod child;
mod signals;
mod spawn;
mod stop;
mod tree;

pub(crate) use child::{ChildSpec, ScopeKind};
pub use signals::ignore_tty_stops;
pub(crate) use signals::{asks_to_stop, Signals};
use stop::suspend;
pub(crate) use tree::{processes, tree_from};

/// Time allowed, beyond `--kill-after`, for SIGKILL to take effect and the command's
/// processes to be reaped before the local deadline; a tenth of the TTL when that is
/// less, so that short TTLs still leave room to renew.
const KILL_MARGIN: Duration = Duration::from_millis(500);

/// The longest `--kill-after` derived from `--ttl` (a quarter of it, at most this).
const DEFAULT_KILL_AFTER_MAX: Duration = Duration::from_secs(5);

/// How often a waiting `tenure run` says who holds the role.
const STATUS_EVERY: Duration = Duration::from_secs(5);

/// The settings of one `tenure run`.
#[derive(Debug)]
pub struct RunArgs {
    /// The role to lead.
    pub role: String,
    /// Lease TTL.
    pub ttl: Duration,
    /// Renew interval; `None`: derived from the TTL ([`RunArgs::renew_every`]).
    pub renew_every: Option<Duration>,
    /// Retry interval while waiting.
    pub retry_every: Duration,
    /// Owner label (made unique per process with [`tenure::owner_id_with_label`]);
    /// default: the host name.
    pub owner: Option<String>,
    /// Exit at once with [`exit::BUSY`] when someone else leads.
    pub no_wait: bool,
    /// Give up waiting after this long with [`exit::TIMEOUT`].
    pub wait_timeout: Option<Duration>,
    /// SIGTERM -> SIGKILL delay when leadership is lost; `None`: derived from the TTL
    /// ([`RunArgs::kill_after`]).
    pub kill_after: Option<Duration>,
    /// Heartbeat membership as this node while running.
    pub node_id: Option<String>,
    /// The value each term advertises (`--advertise`).
    pub advertise: Option<String>,
    /// The store URL, passed on to the command as `TENURE_STORE`.
    pub store_url: String,
    /// The command and its arguments.
    pub command: Vec<OsString>,
}

impl RunArgs {
    /// The SIGTERM -> SIGKILL delay in effect: `--kill-after`, or a quarter of the TTL,
    /// at most 5 s.
    pub fn kill_after(&self) -> Duration {
        self.kill_after
            .unwrap_or_else(|| (self.ttl / 4).min(DEFAULT_KILL_AFTER_MAX))
    }

    /// The time between cancelling leadership and the local deadline: the kill delay
    /// and a margin for SIGKILL to take effect.
    pub fn work_grace(&self) -> Duration {
        self.kill_after() + KILL_MARGIN.min(self.ttl / 10)
    }

    /// The renew interval in effect: `--renew-every`, or a third of the TTL, less if
    /// needed to leave half of the time leadership is kept after a renewal for the next
    /// one to arrive.
    pub fn renew_every(&self) -> Duration {
        self.renew_every.unwrap_or_else(|| {
            let options = self.options_with(Duration::ZERO);
            (self.ttl / 3).min(options.leadership_window() / 2)
        })
    }

    /// The elector options these arguments stand for; the owner id is not set (it is
    /// made from the label by [`RunArgs::owner_id`]).
    pub fn options(&self) -> LeaseLeaderOptions {
        self.options_with(self.renew_every())
    }

    fn options_with(&self, renew_interval: Duration) -> LeaseLeaderOptions {
        LeaseLeaderOptions {
            lease_ttl: self.ttl,
            renew_interval,
            retry_interval: self.retry_every,
            work_grace: self.work_grace(),
            advertise: self.advertise.clone(),
            // `tenure handoff` asks through the store.
            accept_handoff_requests: true,
            ..Default::default()
        }
    }

    /// How recently a store call must have succeeded for `/healthz` to say healthy: the
    /// TTL, or two retry intervals if longer (a waiting instance calls the store about
    /// once per retry interval).
    pub fn health_window(&self) -> Duration {
        self.ttl.max(self.retry_every * 2)
    }

    /// A fresh owner id for this process: the `--owner` label (or the host name) with a
    /// per-process suffix.
    pub fn owner_id(&self) -> tenure::Result<String> {
        match &self.owner {
            Some(label) => tenure::owner_id_with_label(label),
            None => Ok(tenure::default_owner_id()),
        }
    }
}

/// How the command's run ended.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// The command exited on its own (or after a forwarded signal).
    Exited(ExitStatus),
    /// Leadership was lost and the command was stopped.
    Lost(ExitStatus),
    /// The command could not be started.
    SpawnFailed(std::io::Error),
    /// Leadership was already over when the term's work began: nothing was started, and
    /// the next term starts the command.
    NotStarted,
}

/// Runs the command under the role's lease, serving `exporter` if given; returns
/// tenure's exit code.
pub async fn run(
    mut stores: Stores,
    args: RunArgs,
    exporter: Option<Exporter>,
) -> anyhow::Result<u8> {
    let exporter = exporter.map(|e| e.watch_store(&mut stores, args.health_window()));
    let mut options = args.options();
    options.owner_id = args.owner_id()?;
    let owner = options.owner_id.clone();
    info!(
        ttl = %human(args.ttl),
        renew_every = %human(options.renew_interval),
        kill_after = %human(args.kill_after()),
        retry_every = %human(args.retry_every),
        owner = %owner,
        "timings in effect"
    );
    // Orphans of the command re-parent to tenure rather than to init, so none escapes
    // being stopped before the lease is released.
    nix::sys::prctl::set_child_subreaper(true)
        .context("cannot become a child subreaper (PR_SET_CHILD_SUBREAPER)")?;
    let elector = Arc::new(LeaseLeaderElector::new(stores.leases.clone(), options)?);
    let _guard_follows = crate::guard::follow(elector.deadline(), args.kill_after());
    if let Some(exporter) = exporter {
        exporter.serve(Subject::Role {
            role: args.role.clone(),
            state: elector.watch(),
            leases: stores.leases.clone(),
        })?;
    }
    let shutdown = CancellationToken::new();
    let outcome: Arc<Mutex<Option<Outcome>>> = Arc::default();
    let (forward_tx, forward_rx) = mpsc::unbounded_channel::<Signal>();
    let forward_rx = Arc::new(tokio::sync::Mutex::new(forward_rx));
    let suspended = Arc::new(AtomicBool::new(false));
    let gate = Arc::new(StartGate::default());

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
        let kill_after = args.kill_after();
        let suspended = suspended.clone();
        let stop = shutdown.clone();
        let deadline = elector.deadline();
        let gate = gate.clone();
        let leases = stores.leases.clone();
        let ttl = args.ttl;
        let advertised: Vec<(&'static str, String)> = args
            .advertise
            .iter()
            .map(|value| ("TENURE_LEADER_VALUE", value.clone()))
            .collect();
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
                            suspended: suspended.clone(),
                            extra_env: advertised.clone(),
                            scope: ScopeKind::Descendants,
                            deadline: deadline.clone(),
                        };
                        let outcome = outcome.clone();
                        let shutdown = stop.clone();
                        let forward = forward_rx.clone();
                        let gate = gate.clone();
                        let leases = leases.clone();
                        let role = role.clone();
                        let owner = owner.clone();
                        async move {
                            // One run per `tenure run`: a term that starts after the
                            // command already ran (or failed to start) does nothing, and
                            // neither does one that begins as the wait limit gives up.
                            if outcome.lock().is_some() || shutdown.is_cancelled() || !gate.start()
                            {
                                return;
                            }
                            let mut forward = forward.lock().await;
                            let result = child.run(&leadership, &mut forward).await;
                            if matches!(result, Outcome::NotStarted) {
                                return;
                            }
                            // The command finished on its own as the term ended: the
                            // elector, seeing a lost term, neither releases it nor stops
                            // contending, so this run does both.
                            let finished_as_term_ended =
                                matches!(result, Outcome::Exited(_)) && leadership.is_cancelled();
                            if finished_as_term_ended
                                || matches!(result, Outcome::Lost(_) | Outcome::SpawnFailed(_))
                            {
                                shutdown.cancel();
                            }
                            *outcome.lock() = Some(result);
                            if finished_as_term_ended {
                                release(leases.as_ref(), &role, &owner, token, ttl).await;
                            }
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
                if signal == Signal::SIGTSTP {
                    suspend(&suspended);
                } else if signal == Signal::SIGCONT {
                    if led {
                        let _ = forward_tx.send(signal);
                    }
                } else if led {
                    info!(role = %args.role, ?signal, "forwarding signal to the command");
                    let _ = forward_tx.send(signal);
                } else if !asks_to_stop(signal) {
                    // Meant for the command (`pkill -USR1 -f job.sh` matches tenure too),
                    // which does not run yet.
                    warn!(role = %args.role, ?signal,
                        "signal while waiting for the role: no command to forward it to; ignored");
                } else if !gate.give_up() {
                    // The command started an instant ago: the signal is its.
                    led = true;
                    info!(role = %args.role, ?signal, "forwarding signal to the command");
                    let _ = forward_tx.send(signal);
                } else {
                    say!("tenure: {signal:?} while waiting for role {:?}; giving up", args.role);
                    early_exit.get_or_insert(128 + signal as u8);
                    shutdown.cancel();
                }
            }
            changed = state.changed(), if !led => {
                if changed.is_err() { continue; }
                let current = state.borrow_and_update().clone();
                match current {
                    ElectionState::Leader { .. } => led = true,
                    ElectionState::Follower { holder: Some((holder, token)) }
                        if args.no_wait && gate.give_up() =>
                    {
                        say!("tenure: role {:?} is held by {holder} (token {token}); not waiting (--no-wait)", args.role);
                        early_exit.get_or_insert(exit::BUSY);
                        shutdown.cancel();
                    }
                    ElectionState::Follower { holder: Some((holder, token)) } if !announced => {
                        announced = true;
                        say!("tenure: role {:?} is held by {holder} (token {token}); waiting", args.role);
                    }
                    _ => {}
                }
            }
            _ = status_tick.tick(), if !led && !shutdown.is_cancelled() => {
                print_waiting(stores.leases.as_ref(), &args.role, waiting_since.elapsed()).await;
            }
            _ = &mut give_up, if !led && !shutdown.is_cancelled() => {
                // Leadership may have begun and the command started before this loop
                // saw it: the limit is for waiting, and the wait is over.
                if !gate.give_up() {
                    led = true;
                    continue;
                }
                if args.no_wait {
                    say!("tenure: no answer from the store within {} (--no-wait)", human(args.ttl));
                    early_exit.get_or_insert(exit::RUN_FAILED);
                } else {
                    say!("tenure: not leader of role {:?} within --wait-timeout {}", args.role,
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
            say!(
                "tenure: leadership of role {:?} was lost; the command was stopped ({})",
                args.role,
                describe(status)
            );
            exit::LOST
        }
        Some(Outcome::NotStarted) => early_exit.unwrap_or(exit::RUN_FAILED),
        Some(Outcome::SpawnFailed(error)) => {
            let program = args
                .command
                .first()
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default();
            say!("tenure: cannot run {program:?}: {error}");
            match error.kind() {
                ErrorKind::NotFound => exit::NOT_FOUND,
                _ => exit::NOT_EXECUTABLE,
            }
        }
        None => early_exit.unwrap_or(exit::RUN_FAILED),
    })
}

/// Whether this run's command may start, decided once: the wait limit (`--wait-timeout`,
/// `--no-wait`, a signal while waiting) and the start of the command race for it, and
/// whichever comes first wins. Leadership that begins as the limit fires thus either never
/// starts the command, or keeps it from being killed by the limit.
#[derive(Debug, Default)]
struct StartGate(Mutex<Option<bool>>);

impl StartGate {
    /// Whether the command may start (the run did not give up first); it then has.
    fn start(&self) -> bool {
        *self.0.lock().get_or_insert(true)
    }

    /// Whether the run gives up (the command did not start first); it then has.
    fn give_up(&self) -> bool {
        !*self.0.lock().get_or_insert(false)
    }
}

/// Releases a term the elector considers lost but the store may still hold for us
/// (the command finished on its own as it ended), so the next holder need not wait for
/// the TTL. Conditional on owner and token: a lease another owner took is left alone.
async fn release(
    leases: &dyn LeaseStore,
    role: &str,
    owner: &str,
    token: FencingToken,
    within: Duration,
) {
    match tokio::time::timeout(within, leases.release(role, owner, token)).await {
        Ok(Ok(true)) => info!(role, owner, token = %token, "released"),
        Ok(Ok(false)) => {}
        Ok(Err(error)) => warn!(role, token = %token, %error, "cannot release the role"),
        Err(_) => warn!(role, token = %token, "no answer to the release"),
    }
}

async fn print_waiting(store: &dyn LeaseStore, role: &str, waited: Duration) {
    match store.get(role).await {
        Ok(Some(lease)) => match lease.live_holder() {
            Some(holder) => say!(
                "tenure: waiting {} for role {role:?}: held by {holder} (token {}), expires in {}",
                human(waited),
                lease.fencing_token,
                human(lease.remaining())
            ),
            None => say!(
                "tenure: waiting {} for role {role:?}: free, acquiring",
                human(waited)
            ),
        },
        Ok(None) => say!(
            "tenure: waiting {} for role {role:?}: no lease yet, acquiring",
            human(waited)
        ),
        Err(error) => say!(
            "tenure: waiting {} for role {role:?}: store error: {error}",
            human(waited)
        ),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ttl_alone(ttl: Duration) -> RunArgs {
        RunArgs {
            role: "r".to_owned(),
            ttl,
            renew_every: None,
            retry_every: Duration::from_secs(2),
            owner: None,
            no_wait: false,
            wait_timeout: None,
            kill_after: None,
            node_id: None,
            advertise: None,
            store_url: "sqlite:unused".to_owned(),
            command: vec!["true".into()],
        }
    }

    /// Every TTL from 1 s to 1 h (each 1 ms up to 2 s, then in steps of 997 ms) with no
    /// other timing gives options the elector accepts, with a renewal that has at least
    /// half of the leadership window to arrive.
    #[test]
    fn timings_derived_from_any_ttl_fit() {
        let small = 1_000..2_000;
        let large = (2_000..=3_600_000).step_by(997).chain([3_600_000]);
        for ms in small.chain(large) {
            let args = ttl_alone(Duration::from_millis(ms));
            let options = args.options();
            assert!(options.validate().is_ok(), "--ttl {ms}ms: {options:?}");
            assert!(
                options.renew_interval <= options.leadership_window() / 2,
                "--ttl {ms}ms: {options:?}"
            );
            assert!(args.kill_after() <= DEFAULT_KILL_AFTER_MAX);
        }
        let default = ttl_alone(Duration::from_secs(15));
        assert_eq!(default.renew_every(), Duration::from_secs(5));
        assert_eq!(default.kill_after(), Duration::from_millis(3_750));
    }

    /// A term whose leadership is already cancelled when its work starts (it began with
    /// almost no window left) starts no command.
    #[tokio::test]
    async fn no_command_starts_once_leadership_is_cancelled() {
        let dir = tempfile::tempdir().expect("tempdir");
        let marker = dir.path().join("ran");
        let spec = ChildSpec {
            command: vec![
                "sh".into(),
                "-c".into(),
                format!("touch '{}'", marker.display()).into(),
            ],
            token: FencingToken::from(1),
            role: "r".to_owned(),
            owner: "o".to_owned(),
            store_url: "sqlite:unused".to_owned(),
            kill_after: Duration::from_millis(100),
            suspended: Arc::default(),
            extra_env: Vec::new(),
            scope: ScopeKind::Descendants,
            deadline: tokio::sync::watch::channel(None).1,
        };
        let leadership = CancellationToken::new();
        leadership.cancel();
        let (_forward_tx, mut forward) = mpsc::unbounded_channel();
        let outcome = spec.run(&leadership, &mut forward).await;
        assert!(
            matches!(outcome, Outcome::NotStarted),
            "the command was started: {outcome:?}"
        );
        assert!(!marker.exists(), "the command ran");
    }
}
