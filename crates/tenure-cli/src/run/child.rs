//! One term's command: how it is started (its own group or session, cgroup, environment)
//! and the loop that waits on it, forwarding signals, until it exits or the term ends.

use std::ffi::OsString;
use std::io::ErrorKind;
use std::os::unix::process::ExitStatusExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tenure::FencingToken;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::signals::starts_kill_clock;
use super::spawn::Launch;
use super::stop::{signal_all, stop_descendants};
use super::tree::{reap_orphans, tree_since, ProcessEntry, RunningCommand};
use super::Outcome;
use crate::cgroup::CommandCgroup;

/// How long a SIGCONT to tenure waits before resuming the command: a term whose deadline
/// passed while everything was stopped is seen as lost first, so the command is not
/// resumed into a term that is over.
const RESUME_DELAY: Duration = Duration::from_millis(20);

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
pub(super) enum Scope {
    Descendants,
    Session(Pid),
}

impl Scope {
    /// The command's live processes, from a scan of tenure's tree begun at or after
    /// `since` (shared with every other command being stopped meanwhile).
    pub(super) async fn members_since(self, since: tokio::time::Instant) -> Vec<Pid> {
        self.members_in(&tree_since(since).await)
    }

    /// The command's live processes, as of a scan begun now or later.
    pub(super) async fn members(self) -> Vec<Pid> {
        self.members_since(tokio::time::Instant::now()).await
    }

    /// The command's live processes among `tree` (tenure's descendants).
    pub(super) fn members_in(self, tree: &[ProcessEntry]) -> Vec<Pid> {
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
        let own_session = self.scope == ScopeKind::OwnSession;
        let mut env: Vec<(OsString, OsString)> = vec![
            ("TENURE_FENCING_TOKEN".into(), self.token.to_string().into()),
            ("TENURE_ROLE".into(), self.role.clone().into()),
            ("TENURE_OWNER".into(), self.owner.clone().into()),
            ("TENURE_STORE".into(), self.store_url.clone().into()),
        ];
        env.extend(self.extra_env.iter().map(|(k, v)| (k.into(), v.into())));
        let launch = Launch {
            program,
            args: rest,
            env,
            own_session,
        };
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
        let mut children = match signal(SignalKind::child()) {
            Ok(children) => children,
            Err(error) => return Outcome::SpawnFailed(error),
        };
        let spawned = launch.start(cgroup.as_ref(), join);
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

async fn sleep_until_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
