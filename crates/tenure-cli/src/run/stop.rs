//! Stopping a command's processes: SIGTERM, then SIGKILL after `--kill-after`, until none is
//! left; and suspending them all (Ctrl-Z) before tenure stops itself.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use tracing::warn;

use super::child::{ChildSpec, Scope};
use super::spawn::Process;
use super::tree::{reap_orphans, tree, tree_since};
use crate::cgroup::CommandCgroup;
use crate::output::human;

/// How often the processes being stopped are checked for.
const STOP_POLL: Duration = Duration::from_millis(10);

/// How often a stop that is taking long (a process tenure may not signal, or one stuck in
/// the kernel) is reported.
const STOP_REPORT_EVERY: Duration = Duration::from_secs(5);

/// At most how many passes Ctrl-Z makes over tenure's tree to stop what forked meanwhile,
/// and how long it lets a signalled process act on its SIGSTOP before looking again.
const SUSPEND_ROUNDS: usize = 100;
const SUSPEND_SETTLE: Duration = Duration::from_millis(1);

impl ChildSpec {
    /// Stops what the command, which exited, left running (with `grace` between SIGTERM
    /// and SIGKILL), before its term is released.
    pub(super) async fn stop_leftovers(
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
pub(super) async fn stop_descendants(
    mut child: Option<&mut Process>,
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
pub(super) fn signal_all(pids: &[Pid], group: Option<Pid>, signal: Signal) {
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
pub(super) fn suspend(suspended: &AtomicBool) {
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
