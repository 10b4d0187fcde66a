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
use std::os::fd::AsRawFd;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use nix::errno::Errno;
use nix::sys::signal::{kill, killpg, SigHandler, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag};
use nix::unistd::Pid;
use parking_lot::Mutex;
use tenure::{
    ElectionState, FencingToken, LeaseLeaderElector, LeaseLeaderOptions, LeaseStore, Metadata,
};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::cgroup::CommandCgroup;
use crate::exit;
use crate::exporter::{Exporter, Subject};
use crate::output::human;
use crate::say::say;
use crate::store::Stores;

/// Time allowed, beyond `--kill-after`, for SIGKILL to take effect and the command's
/// processes to be reaped before the local deadline; a tenth of the TTL when that is
/// less, so that short TTLs still leave room to renew.
const KILL_MARGIN: Duration = Duration::from_millis(500);

/// The longest `--kill-after` derived from `--ttl` (a quarter of it, at most this).
const DEFAULT_KILL_AFTER_MAX: Duration = Duration::from_secs(5);

/// How often the processes being stopped are checked for.
const STOP_POLL: Duration = Duration::from_millis(10);

/// How often a stop that is taking long (a process tenure may not signal, or one stuck in
/// the kernel) is reported.
const STOP_REPORT_EVERY: Duration = Duration::from_secs(5);

/// How long a SIGCONT to tenure waits before resuming the command: a term whose deadline
/// passed while everything was stopped is seen as lost first, so the command is not
/// resumed into a term that is over.
const RESUME_DELAY: Duration = Duration::from_millis(20);

/// At most how many passes Ctrl-Z makes over tenure's tree to stop what forked meanwhile,
/// and how long it lets a signalled process act on its SIGSTOP before looking again.
const SUSPEND_ROUNDS: usize = 100;
const SUSPEND_SETTLE: Duration = Duration::from_millis(1);

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

/// Everything needed to start the command for one term.
pub(crate) struct ChildSpec {
    pub(crate) command: Vec<OsString>,
    pub(crate) token: FencingToken,
    pub(crate) role: String,
    pub(crate) owner: String,
    pub(crate) store_url: String,
    pub(crate) kill_after: Duration,
    /// Set while the command is stopped by a Ctrl-Z (SIGTSTP) of tenure.
    pub(crate) suspended: Arc<AtomicBool>,
    /// More environment for the command (a shard's number, the shard count).
    pub(crate) extra_env: Vec<(&'static str, String)>,
    /// Which processes are the command's: every descendant of tenure (one command per
    /// tenure), or only the command's own session (one command per shard).
    pub(crate) scope: ScopeKind,
    /// The term's local deadline as the elector publishes it: the guard is told it with
    /// the command, so it never holds an earlier term's deadline for this one.
    pub(crate) deadline: tokio::sync::watch::Receiver<Option<tokio::time::Instant>>,
}

/// How a command's processes are told apart from the rest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ScopeKind {
    /// Every descendant of tenure, which is a child subreaper: covers processes that
    /// leave the command's group or session. One command per tenure.
    Descendants,
    /// The command's own session (it is started as a session leader): covers whatever it
    /// starts unless that calls `setsid` itself. Several commands per tenure.
    OwnSession,
}

/// The processes of one running command.
#[derive(Clone, Copy, Debug)]
enum Scope {
    Descendants,
    Session(Pid),
}

impl Scope {
    /// The command's live processes, from a scan of tenure's tree begun at or after
    /// `since` (shared with every other command being stopped meanwhile).
    async fn members_since(self, since: tokio::time::Instant) -> Vec<Pid> {
        self.members_in(&tree_since(since).await)
    }

    /// The command's live processes, as of a scan begun now or later.
    async fn members(self) -> Vec<Pid> {
        self.members_since(tokio::time::Instant::now()).await
    }

    /// The command's live processes among `tree` (tenure's descendants).
    fn members_in(self, tree: &[ProcessEntry]) -> Vec<Pid> {
        tree.iter()
            .filter(|p| !p.zombie)
            .filter(|p| match self {
                Scope::Descendants => true,
                Scope::Session(session) => p.session == session,
            })
            .map(|p| p.pid)
            .collect()
    }
}

impl ChildSpec {
    /// Runs the command until it exits or `leadership` ends (then stops it), forwarding
    /// the signals that arrive on `forward`.
    pub(crate) async fn run(
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
        // A term can begin with almost no window left; its leadership is then over
        // before the work runs, and the command must not start at all.
        if leadership.is_cancelled() {
            return Outcome::NotStarted;
        }
        let mut command = tokio::process::Command::new(program);
        command
            .args(rest)
            .env("TENURE_FENCING_TOKEN", self.token.to_string())
            .env("TENURE_ROLE", &self.role)
            .env("TENURE_OWNER", &self.owner)
            .env("TENURE_STORE", &self.store_url)
            .envs(self.extra_env.iter().map(|(k, v)| (k, v)))
            .kill_on_drop(true);
        let own_session = self.scope == ScopeKind::OwnSession;
        // Where tenure may make one, the command starts in a cgroup of its own: a stop then
        // reaches every process it started, whatever user it became or group it left.
        let (cgroup, join) = match CommandCgroup::create() {
            Ok(Some((cgroup, procs))) => (Some(cgroup), Some(procs)),
            Ok(None) => (None, None),
            Err(error) => {
                warn!(role = %self.role, %error, "cannot make the command's cgroup; signals only");
                (None, None)
            }
        };
        let join_fd = join.as_ref().map(|procs| procs.as_raw_fd());
        if !own_session {
            // Its own process group, so forwarded signals reach everything it started
            // in it, as a terminal's would.
            command.process_group(0);
        }
        // SAFETY: prctl, setsid and sigaction are async-signal-safe; nothing else runs
        // between fork and exec.
        unsafe {
            command.pre_exec(move || {
                if let Some(procs) = join_fd {
                    // `0` moves the writer: this child, before it runs the command. Should
                    // the kernel refuse, the command runs outside it, stopped by signals
                    // as where there is no cgroup, rather than not at all.
                    let procs = std::os::fd::BorrowedFd::borrow_raw(procs);
                    let _ = nix::unistd::write(procs, b"0");
                }
                if own_session {
                    // A new session (and process group) the command's processes share.
                    nix::unistd::setsid().map_err(std::io::Error::from)?;
                }
                // Ignored dispositions survive exec: without this the command could not
                // be stopped by its own background terminal I/O, as a shell job would be.
                for stop in TTY_STOPS {
                    nix::sys::signal::signal(stop, SigHandler::SigDfl)
                        .map_err(std::io::Error::from)?;
                }
                // If tenure dies (SIGKILL, OOM), the command must not outlive its lease.
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)
            });
        }
        let mut children = match signal(SignalKind::child()) {
            Ok(children) => children,
            Err(error) => return Outcome::SpawnFailed(error),
        };
        let spawned = command.spawn();
        drop(join);
        let mut child = match spawned {
            Ok(child) => child,
            Err(error) => return Outcome::SpawnFailed(error),
        };
        let cgroup = cgroup.as_ref();
        let Some(pgid) = child.id().map(|pid| Pid::from_raw(pid as i32)) else {
            return Outcome::SpawnFailed(std::io::Error::other(
                "the command exited before it could be tracked",
            ));
        };
        let scope = match self.scope {
            ScopeKind::Descendants => Scope::Descendants,
            ScopeKind::OwnSession => Scope::Session(pgid),
        };
        // Registered before anything else runs on this thread, so that no orphan reaping
        // takes the command's status from tokio.
        let _command = RunningCommand::register(pgid);
        // The guard kills this group if tenure cannot (stopped, wedged, gone) by the
        // deadline; it forgets it when this returns, the command stopped and reaped.
        let deadline = *self.deadline.borrow();
        let _guarded = crate::guard::watch(pgid, deadline.map(|at| at + self.kill_after));
        info!(role = %self.role, token = %self.token, pid = pgid.as_raw(), "command started");
        let mut kill_at: Option<tokio::time::Instant> = None;
        let mut resume_at: Option<tokio::time::Instant> = None;
        loop {
            tokio::select! {
                biased;
                _ = leadership.cancelled() => {
                    // The command may have exited in the same instant (or while tenure was
                    // stopped): its own end, not a loss, and a retry wrapper must not run
                    // a finished job again. Not so a SIGKILL: the guard's, at the deadline
                    // tenure slept through (or the OOM killer's), not the command's doing.
                    let finished = child
                        .try_wait()
                        .ok()
                        .flatten()
                        .filter(|status| status.signal() != Some(Signal::SIGKILL as i32));
                    if let Some(status) = finished {
                        let grace = if self.suspended.load(Ordering::SeqCst) {
                            Duration::ZERO
                        } else {
                            self.kill_after
                        };
                        self.stop_leftovers(pgid, grace, scope, cgroup).await;
                        return Outcome::Exited(status);
                    }
                    // Lost while suspended: the deadline passed while nothing ran, so the
                    // lease may be another's already; no grace to act on a SIGTERM.
                    let grace = if self.suspended.load(Ordering::SeqCst) {
                        warn!(role = %self.role, token = %self.token,
                            "leadership lost while suspended; killing the command");
                        Duration::ZERO
                    } else {
                        warn!(role = %self.role, token = %self.token,
                            "leadership lost; stopping the command");
                        self.kill_after
                    };
                    let status =
                        stop_descendants(Some(&mut child), pgid, grace, &self.role, scope, cgroup).await;
                    return Outcome::Lost(status);
                }
                status = child.wait() => {
                    let status = match status {
                        Ok(status) => status,
                        Err(error) => return Outcome::SpawnFailed(error),
                    };
                    // A SIGKILL may be the guard's, at a deadline tenure slept through
                    // (stopped, suspended): the term's deadline has passed, or the
                    // elector, resumed too, says so within moments; the term was then
                    // lost rather than finished.
                    let killed = status.signal() == Some(Signal::SIGKILL as i32);
                    let now = tokio::time::Instant::now();
                    let term_over = self.deadline.borrow().is_none_or(|at| now >= at);
                    if killed
                        && (term_over
                            || tokio::time::timeout(RESUME_DELAY, leadership.cancelled())
                                .await
                                .is_ok())
                    {
                        if self.suspended.load(Ordering::SeqCst) {
                            warn!(role = %self.role, token = %self.token,
                                "leadership lost while suspended; the command was killed \
                                 at the deadline");
                        } else {
                            warn!(role = %self.role, token = %self.token,
                                "leadership lost; the command was killed at the deadline");
                        }
                        let status =
                            stop_descendants(Some(&mut child), pgid, Duration::ZERO, &self.role, scope, cgroup)
                                .await;
                        return Outcome::Lost(status);
                    }
                    self.stop_leftovers(pgid, self.kill_after, scope, cgroup).await;
                    return Outcome::Exited(status);
                }
                Some(signal) = forward.recv() => {
                    if signal == Signal::SIGCONT {
                        resume_at = Some(tokio::time::Instant::now() + RESUME_DELAY);
                    } else {
                        let _ = killpg(pgid, signal);
                        // SIGHUP, SIGUSR1 and the like ask for something else (reload,
                        // reopen logs, dump state): the command is not expected to exit, so
                        // no deadline.
                        if starts_kill_clock(signal) {
                            kill_at.get_or_insert(tokio::time::Instant::now() + self.kill_after);
                        }
                    }
                }
                _ = sleep_until_opt(resume_at) => {
                    resume_at = None;
                    // Lost while stopped: the branch above stops everything instead.
                    if !leadership.is_cancelled() {
                        self.suspended.store(false, Ordering::SeqCst);
                        signal_all(&scope.members().await, Some(pgid), Signal::SIGCONT);
                    }
                }
                _ = sleep_until_opt(kill_at) => {
                    warn!(role = %self.role, "the command ignored the forwarded signal; killing it");
                    let _ = killpg(pgid, Signal::SIGKILL);
                    kill_at = None;
                }
                Some(()) = children.recv() => {
                    reap_orphans(&tree_since(tokio::time::Instant::now()).await);
                }
            }
        }
    }
}

impl ChildSpec {
    /// Stops what the command, which exited, left running (with `grace` between SIGTERM
    /// and SIGKILL), before its term is released.
    async fn stop_leftovers(
        &self,
        pgid: Pid,
        grace: Duration,
        scope: Scope,
        cgroup: Option<&CommandCgroup>,
    ) {
        let left = scope.members().await;
        let in_cgroup = cgroup.is_some_and(|cgroup| !cgroup.is_empty());
        if !left.is_empty() || !group_gone(pgid) || in_cgroup {
            warn!(role = %self.role, token = %self.token, left = left.len(),
                "the command exited and left processes running; \
                 stopping them before releasing");
            stop_descendants(None, pgid, grace, &self.role, scope, cgroup).await;
        }
    }
}

async fn sleep_until_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Stops every descendant of tenure (the command, if `child` is given, and whatever it
/// started), and the command's process `group` (the classic mechanism, and the one left
/// should `/proc` be unreadable): SIGTERM (with SIGCONT, so a stopped one acts on it),
/// then SIGKILL after `kill_after` to whatever is left, until nothing is left. Tenure's
/// own orphaned children are reaped on the way; the command itself is reaped through
/// `child`, and its status returned (SIGKILL's if it could not be had).
///
/// With the command's `cgroup`, SIGKILL also goes through `cgroup.kill` (every member,
/// whatever its user, seen in `/proc` or not), and the stop waits until the cgroup is
/// empty. A process tenure may not signal (one that changed its user, e.g. through sudo,
/// with no cgroup) or one that does not die of SIGKILL (stuck in the kernel) is waited
/// for, and reported every few seconds: the lease is not released while anything the
/// command started still runs.
async fn stop_descendants(
    mut child: Option<&mut tokio::process::Child>,
    group: Pid,
    kill_after: Duration,
    role: &str,
    scope: Scope,
    cgroup: Option<&CommandCgroup>,
) -> ExitStatus {
    let mut status = None;
    let started = tokio::time::Instant::now();
    let kill_at = started + kill_after;
    let mut report_at = started + STOP_REPORT_EVERY;
    // Once the group is seen gone its id may be reused by an unrelated group (the command,
    // its leader, may be reaped already): never signalled again.
    let mut group = Some(group).filter(|&group| !group_gone(group));
    // With no grace, not even a SIGCONT: a stopped process is killed where it stands.
    if !kill_after.is_zero() {
        let left = scope.members_since(started).await;
        signal_all(&left, group, Signal::SIGTERM);
        signal_all(&left, group, Signal::SIGCONT);
    }
    let mut killing = false;
    // Any scan begun since this loop last looked is as good as its own: with many
    // commands stopping at once, one scan per tick serves them all.
    let mut looked = started;
    loop {
        if let Some(command) = child.as_deref_mut() {
            if let Ok(Some(exited)) = command.try_wait() {
                status = Some(exited);
                child = None;
            }
        }
        group = group.filter(|&group| !group_gone(group));
        if !killing && tokio::time::Instant::now() >= kill_at {
            // Before a scan that may take a while on a crowded host: the group at once.
            signal_all(&[], group, Signal::SIGKILL);
            if let Some(cgroup) = cgroup {
                cgroup.kill();
            }
        }
        let tree = tree_since(looked).await;
        looked = tokio::time::Instant::now();
        // The command is reaped by tokio (through `child`); its orphans here.
        reap_orphans(&tree);
        let left = scope.members_in(&tree);
        group = group.filter(|&group| !group_gone(group));
        if left.is_empty()
            && child.is_none()
            && group.is_none()
            && cgroup.is_none_or(CommandCgroup::is_empty)
        {
            break;
        }
        let now = tokio::time::Instant::now();
        if now >= kill_at {
            if !killing && !kill_after.is_zero() {
                warn!(
                    role,
                    left = left.len(),
                    "processes still running after --kill-after; killing them"
                );
            }
            killing = true;
            // Every round: a process may have forked since the last one.
            signal_all(&left, group, Signal::SIGKILL);
            if let Some(cgroup) = cgroup {
                cgroup.kill();
            }
        }
        if now >= report_at {
            report_at = now + STOP_REPORT_EVERY;
            let pids: Vec<i32> = left.iter().map(|pid| pid.as_raw()).collect();
            warn!(role, ?pids, waited = %human(now - started),
                "processes of the command are still running; waiting for them before releasing");
        }
        // Until SIGKILL is due, sleep to it rather than past it.
        let wake = if killing {
            now + STOP_POLL
        } else {
            (now + STOP_POLL).min(kill_at)
        };
        tokio::time::sleep_until(wake).await;
    }
    status.unwrap_or_else(|| ExitStatus::from_raw(Signal::SIGKILL as i32))
}

/// Sends `signal` to each process and to the process group, ignoring those that are
/// gone already.
fn signal_all(pids: &[Pid], group: Option<Pid>, signal: Signal) {
    if let Some(group) = group {
        let _ = killpg(group, signal);
    }
    for &pid in pids {
        let _ = kill(pid, signal);
    }
}

/// Whether no process is left in the group (it is not reused while one is).
fn group_gone(group: Pid) -> bool {
    matches!(killpg(group, None), Err(Errno::ESRCH))
}

/// Suspends (Ctrl-Z) the command's processes, then tenure itself, as a shell would a job:
/// the command must not run on while tenure, stopped, cannot renew. SIGSTOP rather than
/// SIGTSTP, which a command may catch or ignore.
fn suspend(suspended: &AtomicBool) {
    // One pass is not enough: a process forks between the scan and its own SIGSTOP, and
    // its child runs on. So again, until a pass finds nothing new and everything signalled
    // has stopped (or died), within a bound: a stopped parent forks no more.
    let mut signalled: Vec<Pid> = Vec::new();
    for _ in 0..SUSPEND_ROUNDS {
        let tree = tree();
        let new: Vec<Pid> = tree
            .iter()
            .filter(|p| !p.zombie && !signalled.contains(&p.pid))
            .map(|p| p.pid)
            .collect();
        let stopping = tree
            .iter()
            .any(|p| !p.zombie && !p.stopped && signalled.contains(&p.pid));
        if new.is_empty() && !stopping {
            break;
        }
        for pid in new {
            let _ = kill(pid, Signal::SIGSTOP);
            signalled.push(pid);
        }
        if stopping {
            // SIGSTOP is acted on as the process next runs: give it the chance.
            std::thread::sleep(SUSPEND_SETTLE);
        }
    }
    if !signalled.is_empty() {
        suspended.store(true, Ordering::SeqCst);
    }
    let _ = kill(Pid::this(), Signal::SIGSTOP);
}

/// One entry of `/proc`.
pub(crate) struct ProcessEntry {
    pub(crate) pid: Pid,
    pub(crate) parent: Pid,
    pub(crate) group: Pid,
    pub(crate) session: Pid,
    pub(crate) zombie: bool,
    /// Stopped by a signal (state `T`) or a tracer (`t`).
    pub(crate) stopped: bool,
}

impl ProcessEntry {
    /// Reads `/proc/PID/stat`; `None` if the process is gone (or the file unreadable).
    fn read(pid: Pid) -> Option<ProcessEntry> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // `pid (comm) state ppid ...`; comm may itself contain spaces and parentheses.
        let mut fields = stat.get(stat.rfind(')')? + 1..)?.split_whitespace();
        let state = fields.next()?;
        let parent: i32 = fields.next()?.parse().ok()?;
        let group: i32 = fields.next()?.parse().ok()?;
        let session: i32 = fields.next()?.parse().ok()?;
        // tty_nr ... nice, then num_threads.
        let threads: u32 = fields.nth(13)?.parse().ok()?;
        Some(ProcessEntry {
            pid,
            parent: Pid::from_raw(parent),
            group: Pid::from_raw(group),
            session: Pid::from_raw(session),
            // A main thread that exited while others run shows the whole process as `Z`;
            // it is dead only once no other thread is left (one: the leader, reaped
            // last).
            zombie: (state == "Z" || state == "X") && threads <= 1,
            stopped: state == "T" || state == "t",
        })
    }
}

/// Every process in `/proc` (one that exits while being read is skipped).
pub(crate) fn processes() -> Vec<ProcessEntry> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            ProcessEntry::read(Pid::from_raw(pid))
        })
        .collect()
}

/// The children of `pid`, from `/proc/PID/task/*/children` (one file per thread: an
/// orphan adopted by tenure may be any thread's child). `None` where the kernel has no
/// such files (built without `CONFIG_PROC_CHILDREN`).
fn children(pid: Pid) -> Option<Vec<Pid>> {
    let tasks = match std::fs::read_dir(format!("/proc/{pid}/task")) {
        Ok(tasks) => tasks,
        // Gone meanwhile: no children to find.
        Err(error) if error.kind() == ErrorKind::NotFound => return Some(Vec::new()),
        Err(_) => return None,
    };
    let mut found = Vec::new();
    for task in tasks.flatten() {
        match std::fs::read_to_string(task.path().join("children")) {
            Ok(list) => found.extend(
                list.split_whitespace()
                    .filter_map(|pid| pid.parse().ok())
                    .map(Pid::from_raw),
            ),
            // The thread exited between the listing and the read.
            Err(_) if !task.path().exists() => {}
            Err(_) => return None,
        }
    }
    Some(found)
}

/// Tenure's descendants, zombies included, but for its guard: everything the commands
/// started, since tenure starts no other processes and, as a subreaper, inherits every
/// orphan among them. Read from the `children` files down from tenure, so the cost is
/// that of tenure's tree, not of every process on the host; one pass over all of `/proc`
/// where the kernel has no `children` files. Blocking: many small reads.
fn tree() -> Vec<ProcessEntry> {
    let me = Pid::this();
    let guard = crate::guard::pid();
    let Some(mut pending) = children(me) else {
        return tree_from(processes(), me, guard);
    };
    let mut found = Vec::new();
    while let Some(pid) = pending.pop() {
        if Some(pid) == guard {
            continue;
        }
        // Gone since its parent's list was read: nothing left to stop or reap.
        let Some(entry) = ProcessEntry::read(pid) else {
            continue;
        };
        match children(pid) {
            Some(more) => pending.extend(more),
            None => return tree_from(processes(), me, guard),
        }
        found.push(entry);
    }
    found
}

/// The descendants of `root` among `all`, but for `guard` (and what descends from it).
pub(crate) fn tree_from(
    all: Vec<ProcessEntry>,
    root: Pid,
    guard: Option<Pid>,
) -> Vec<ProcessEntry> {
    let mut found = Vec::new();
    let mut parents = vec![root];
    let mut rest = all;
    while let Some(parent) = parents.pop() {
        let (mine, others): (Vec<_>, Vec<_>) = rest
            .into_iter()
            .partition(|p| p.parent == parent && Some(p.pid) != guard);
        rest = others;
        parents.extend(mine.iter().map(|p| p.pid));
        found.extend(mine);
    }
    found
}

/// One scan of tenure's tree, and when it began.
struct Snapshot {
    began: tokio::time::Instant,
    tree: Arc<Vec<ProcessEntry>>,
}

/// The latest scan, shared: a member stopping 64 shards' commands at once scans once per
/// tick, not 64 times.
static SNAPSHOT: tokio::sync::Mutex<Option<Snapshot>> = tokio::sync::Mutex::const_new(None);

/// Tenure's tree ([`tree`]) as of a scan begun at or after `since`: the latest one if it
/// qualifies, or a new one. Scans run on a blocking thread, never on the runtime's only
/// thread, which must go on renewing every other term meanwhile.
async fn tree_since(since: tokio::time::Instant) -> Arc<Vec<ProcessEntry>> {
    let mut latest = SNAPSHOT.lock().await;
    if let Some(snapshot) = latest.as_ref().filter(|s| s.began >= since) {
        return snapshot.tree.clone();
    }
    let began = tokio::time::Instant::now();
    let tree = match tokio::task::spawn_blocking(tree).await {
        Ok(tree) => tree,
        // No blocking thread to be had (the runtime shutting down): scan here.
        Err(_) => tree(),
    };
    let tree = Arc::new(tree);
    *latest = Some(Snapshot {
        began,
        tree: tree.clone(),
    });
    tree
}

/// The commands tokio runs (and reaps): not orphans, whatever state they are in.
static COMMANDS: Mutex<Vec<Pid>> = Mutex::new(Vec::new());

/// A running command, registered so that orphan reaping leaves it to tokio; deregistered
/// when dropped.
struct RunningCommand(Pid);

impl RunningCommand {
    fn register(pid: Pid) -> RunningCommand {
        COMMANDS.lock().push(pid);
        RunningCommand(pid)
    }
}

impl Drop for RunningCommand {
    fn drop(&mut self) {
        COMMANDS.lock().retain(|pid| *pid != self.0);
    }
}

/// Reaps tenure's dead children in `tree` that are not commands (which tokio reaps): the
/// orphans of the commands, re-parented to tenure, a subreaper.
fn reap_orphans(tree: &[ProcessEntry]) {
    let me = Pid::this();
    let commands = COMMANDS.lock().clone();
    for process in tree {
        if process.parent == me && process.zombie && !commands.contains(&process.pid) {
            match waitpid(process.pid, Some(WaitPidFlag::WNOHANG)) {
                Ok(_) | Err(Errno::ECHILD) => {}
                Err(error) => warn!(pid = process.pid.as_raw(), %error, "cannot reap a child"),
            }
        }
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

/// Whether a signal, while waiting for the role, asks tenure to give up (and a shard-group
/// member to stop); see [`starts_kill_clock`] for the signals forwarded to a command.
pub(crate) fn asks_to_stop(signal: Signal) -> bool {
    matches!(
        signal,
        Signal::SIGINT | Signal::SIGTERM | Signal::SIGHUP | Signal::SIGQUIT
    )
}

/// Whether a forwarded signal asks the command to end, so that it is killed if it is still
/// there `--kill-after` later. Not SIGHUP: to a running service it means "reload your
/// configuration" far more often than "your terminal is gone", and a reload must not be
/// turned into a kill.
fn starts_kill_clock(signal: Signal) -> bool {
    matches!(signal, Signal::SIGINT | Signal::SIGTERM | Signal::SIGQUIT)
}

/// Stop signals of terminal I/O from a background process group, ignored by tenure.
const TTY_STOPS: [Signal; 2] = [Signal::SIGTTOU, Signal::SIGTTIN];

/// The signals tenure listens for, as one stream: every one whose default action would end
/// tenure (or, for SIGTSTP, stop it) without stopping the command and releasing the lease.
const LISTENED: [Signal; 9] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
    Signal::SIGALRM,
    Signal::SIGTSTP,
    Signal::SIGCONT,
];

/// Ignores SIGTTOU and SIGTTIN, so that a background tenure writing to a terminal with
/// `stty tostop` is not stopped: a stopped tenure cannot renew, nor stop its command when
/// the term ends. Called before anything is written; the command gets the defaults back.
pub fn ignore_tty_stops() -> anyhow::Result<()> {
    for stop in TTY_STOPS {
        // SAFETY: SIG_IGN installs no handler, so nothing runs in signal context.
        unsafe { nix::sys::signal::signal(stop, SigHandler::SigIgn) }
            .with_context(|| format!("cannot ignore {stop}"))?;
    }
    Ok(())
}

/// The signals of [`LISTENED`], as one stream.
pub(crate) struct Signals {
    streams: Vec<(Signal, tokio::signal::unix::Signal)>,
}

impl Signals {
    /// Listens for the signals of [`LISTENED`].
    pub(crate) fn new() -> anyhow::Result<Self> {
        let streams = LISTENED
            .iter()
            .map(|&which| {
                signal(SignalKind::from_raw(which as i32))
                    .map(|stream| (which, stream))
                    .with_context(|| format!("cannot listen for {which}"))
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(Signals { streams })
    }

    /// The next signal.
    pub(crate) async fn recv(&mut self) -> Option<Signal> {
        std::future::poll_fn(|cx| {
            // Of two pending signals the first listed wins; each is seen in turn.
            for (which, stream) in &mut self.streams {
                if let std::task::Poll::Ready(received) = stream.poll_recv(cx) {
                    return std::task::Poll::Ready(received.map(|()| *which));
                }
            }
            std::task::Poll::Pending
        })
        .await
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
