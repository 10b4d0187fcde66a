//! The guard: the second enforcer of `tenure run`'s deadline, outside tenure's process.
//!
//! tenure stops the command before its term's local deadline, but only while tenure
//! runs. Stopped (`kill -STOP`, a debugger, a frozen cgroup of one process) or wedged (its
//! one runtime thread blocked), it renews nothing and stops nothing, and the command would
//! run on while the lease passes to another instance. So `tenure run` forks a guard at
//! start, before any thread exists: a process of its own (its own process group, so a
//! terminal's signals and `kill -STOP -PGID` of tenure's group miss it) with no async
//! runtime and no store connection. It hears of each deadline over a pipe, and SIGKILLs
//! the command when that deadline passes without a newer one, or at once when tenure is
//! gone (the pipe closes): through the commands' cgroup where there is one
//! ([`crate::cgroup`]), and by process group and tree besides.
//!
//! The deadline it holds is the term's local deadline plus `--kill-after`: the instant
//! tenure itself would send SIGKILL, a margin before the lease can pass. A healthy tenure
//! has stopped the command by then; the guard acts only when tenure did not.
//!
//! Messages are fixed 16-byte records (atomic on a pipe): a deadline on
//! `CLOCK_MONOTONIC` (the clock of tokio's `Instant`), or a command's process group to
//! watch or forget. tenure writes without blocking; a record that does not fit (the guard
//! stopped and its pipe full) is dropped, which can only make the guard act early.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::Context;
use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{kill, killpg, sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
use nix::sys::time::TimeSpec;
use nix::time::{clock_gettime, ClockId};
use nix::unistd::{fork, getppid, ForkResult, Pid};
use tracing::warn;

use crate::run::{processes, tree_from};

/// A deadline on `CLOCK_MONOTONIC`, in nanoseconds.
const DEADLINE: u8 = 1;
/// A command's process group (its pid) to kill with the command.
const WATCH: u8 = 2;
/// A process group that is gone (its command stopped and reaped).
const FORGET: u8 = 3;

/// How often, after a kill, the guard looks again for processes of the command that
/// forked meanwhile, and how many times.
const KILL_ROUNDS: u32 = 3;
const KILL_ROUND_GAP: Duration = Duration::from_millis(5);

/// This process's guard, once started.
static GUARD: OnceLock<Guard> = OnceLock::new();

/// tenure's end of the pipe to its guard.
#[derive(Debug)]
pub struct Guard {
    pipe: OwnedFd,
    pid: Pid,
}

/// Starts this process's guard (see [`Guard::start`]); the functions below then talk to
/// it. Call only while the process has one thread.
pub fn start() -> anyhow::Result<()> {
    let guard = Guard::start()?;
    let _ = GUARD.set(guard);
    Ok(())
}

/// The guard's pid, if one was started: a child of tenure that is not the command's.
pub fn pid() -> Option<Pid> {
    GUARD.get().map(|guard| guard.pid)
}

/// Kill process group `group` (a command started as its group's leader) at `deadline`
/// (the term's, with tenure's own kill delay: sent first, so the guard never judges the
/// new command by an earlier term's deadline) or a later one, or when tenure is gone;
/// forgotten when the returned value is dropped (the command was stopped and reaped).
pub fn watch(group: Pid, deadline: Option<tokio::time::Instant>) -> Watched {
    if let Some(guard) = GUARD.get() {
        if let Some(at) = deadline {
            guard.deadline(at);
        }
        guard.send(WATCH, group.as_raw(), 0);
    }
    Watched(group)
}

/// A process group the guard watches until this is dropped.
pub struct Watched(Pid);

impl Drop for Watched {
    fn drop(&mut self) {
        if let Some(guard) = GUARD.get() {
            guard.send(FORGET, self.0.as_raw(), 0);
        }
    }
}

/// Tells the guard each deadline `deadlines` publishes, plus `grace` (how long after
/// leadership is cancelled tenure itself kills the command), until the sender is gone.
pub fn follow(
    mut deadlines: tokio::sync::watch::Receiver<Option<tokio::time::Instant>>,
    grace: Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let deadline = *deadlines.borrow_and_update();
            // None between terms: the last deadline stands until the command is gone.
            if let (Some(at), Some(guard)) = (deadline, GUARD.get()) {
                guard.deadline(at + grace);
            }
            if deadlines.changed().await.is_err() {
                return;
            }
        }
    })
}

impl Guard {
    /// Forks the guard. Call only while the process has one thread (before logging or a
    /// runtime starts threads): the child goes on running this program's code.
    fn start() -> anyhow::Result<Guard> {
        let (read, write) =
            nix::unistd::pipe2(OFlag::O_CLOEXEC).context("cannot create the guard's pipe")?;
        // SAFETY: the caller guarantees one thread, so the child inherits no lock held by
        // another thread; it only runs `serve`, which never returns.
        match unsafe { fork() }.context("cannot fork the guard")? {
            ForkResult::Child => {
                drop(write);
                serve(read)
            }
            ForkResult::Parent { child } => {
                drop(read);
                // Never block tenure on its guard: a full pipe drops the record.
                fcntl(&write, FcntlArg::F_SETFL(OFlag::O_NONBLOCK))
                    .context("cannot make the guard's pipe non-blocking")?;
                Ok(Guard {
                    pipe: write,
                    pid: child,
                })
            }
        }
    }

    /// The command must be dead by `at` unless a later deadline comes.
    fn deadline(&self, at: tokio::time::Instant) {
        let left = at.saturating_duration_since(tokio::time::Instant::now());
        let at = monotonic_now().saturating_add(left.as_nanos() as u64);
        self.send(DEADLINE, 0, at);
    }

    fn send(&self, kind: u8, pid: i32, value: u64) {
        let mut record = [0u8; 16];
        record[0] = kind;
        record[4..8].copy_from_slice(&pid.to_ne_bytes());
        record[8..16].copy_from_slice(&value.to_ne_bytes());
        match nix::unistd::write(&self.pipe, &record) {
            Ok(16) => {}
            Ok(_) | Err(_) => warn!("could not tell the guard; it may stop the command early"),
        }
    }
}

/// `CLOCK_MONOTONIC` now, in nanoseconds.
fn monotonic_now() -> u64 {
    let now = clock_gettime(ClockId::CLOCK_MONOTONIC).unwrap_or(TimeSpec::new(0, 0));
    (now.tv_sec() as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(now.tv_nsec() as u64)
}

/// The guard's loop: never returns.
fn serve(pipe: OwnedFd) -> ! {
    let tenure = getppid();
    let cgroup = crate::cgroup::base();
    detach(&pipe);
    let mut deadline: Option<u64> = None;
    let mut groups: Vec<Pid> = Vec::new();
    let mut buffer = [0u8; 16 * 64];
    loop {
        let armed = deadline.filter(|_| !groups.is_empty());
        // Rounded up to the millisecond, so the guard never wakes a hair early; zero once
        // passed, so a renewal already in the pipe is read before anything is killed.
        let timeout = match armed {
            Some(at) => {
                let left = at.saturating_sub(monotonic_now());
                let millis = left.div_ceil(1_000_000).min(i32::MAX as u64) as i32;
                PollTimeout::try_from(millis).unwrap_or(PollTimeout::MAX)
            }
            None => PollTimeout::NONE,
        };
        let mut fds = [PollFd::new(pipe.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, timeout) {
            Ok(0) => {
                if armed.is_some_and(|at| monotonic_now() >= at) {
                    // The pipe is open, so tenure (its only writer) lives: its pid is its.
                    kill_command(Some(tenure), &groups, cgroup);
                    deadline = None;
                }
                continue;
            }
            Err(Errno::EINTR) => continue,
            Ok(_) => {}
            Err(_) => break,
        }
        let read = match nix::unistd::read(&pipe, &mut buffer) {
            Ok(0) => break,
            Ok(read) => read,
            Err(Errno::EINTR | Errno::EAGAIN) => continue,
            Err(_) => break,
        };
        for record in buffer[..read].chunks_exact(16) {
            let pid = Pid::from_raw(i32::from_ne_bytes([
                record[4], record[5], record[6], record[7],
            ]));
            let mut value = [0u8; 8];
            value.copy_from_slice(&record[8..16]);
            match record[0] {
                DEADLINE => deadline = Some(u64::from_ne_bytes(value)),
                WATCH if !groups.contains(&pid) => groups.push(pid),
                FORGET => groups.retain(|group| *group != pid),
                _ => {}
            }
        }
    }
    // tenure is gone (or its pipe broke): so is the term, as far as anyone can vouch.
    // Its pid may be reused from now on, so only the command's groups are killed.
    kill_command(None, &groups, cgroup);
    if let Some(cgroup) = cgroup {
        crate::cgroup::remove(cgroup);
    }
    std::process::exit(0)
}

/// Leaves tenure's process group and terminal signals behind, and lets go of everything
/// it inherited but `pipe`: tenure's standard streams and any other descriptor (a pipe
/// reader must not wait on the guard), and the working directory (a mount must not stay
/// busy for it).
fn detach(pipe: &OwnedFd) {
    let _ = nix::unistd::setpgid(Pid::from_raw(0), Pid::from_raw(0));
    let ignore = SigAction::new(SigHandler::SigIgn, SaFlags::empty(), SigSet::empty());
    for signal in [
        Signal::SIGINT,
        Signal::SIGQUIT,
        Signal::SIGHUP,
        Signal::SIGTSTP,
        Signal::SIGTTIN,
        Signal::SIGTTOU,
        Signal::SIGPIPE,
        Signal::SIGUSR1,
        Signal::SIGUSR2,
        Signal::SIGALRM,
    ] {
        // SAFETY: ignoring a signal installs no handler code.
        let _ = unsafe { sigaction(signal, &ignore) };
    }
    if let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        for stream in 0..=2 {
            // SAFETY: replaces the standard streams, which nothing in the guard reads
            // or writes through a handle that could be invalidated.
            let _ = unsafe { nix::unistd::dup2_raw(&null, stream) };
        }
    }
    let keep = pipe.as_raw_fd();
    let inherited: Vec<i32> = std::fs::read_dir("/proc/self/fd")
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
                .filter(|&fd| fd > 2 && fd != keep)
                .collect()
        })
        .unwrap_or_default();
    for fd in inherited {
        // Inherited across the fork and used by nothing here; the listing's own
        // descriptor is among them, closed already, and closing it again fails harmlessly.
        let _ = nix::unistd::close(fd);
    }
    let _ = std::env::set_current_dir("/");
}

/// SIGKILLs the command: every process in tenure's commands' `cgroup` (if any), every
/// watched process group, every process in one of them or in a session one of them
/// leads, and, given tenure's pid (only while it surely lives), every other descendant of
/// tenure (what left the group is still tenure's, a subreaper's). A few rounds, for
/// processes that forked meanwhile.
fn kill_command(tenure: Option<Pid>, groups: &[Pid], cgroup: Option<&std::path::Path>) {
    if tenure.is_none() && groups.is_empty() {
        // Nothing a scan of `/proc` could match (every command was stopped and reaped;
        // tenure is gone): only the cgroup may hold a straggler, and one `cgroup.kill`
        // takes every member, forking ones included. This is every normal exit of
        // tenure, so it must not cost rounds of full `/proc` scans.
        if let Some(cgroup) = cgroup {
            crate::cgroup::kill(cgroup);
        }
        return;
    }
    let me = Pid::this();
    for round in 0..KILL_ROUNDS {
        if let Some(cgroup) = cgroup {
            crate::cgroup::kill(cgroup);
        }
        for &group in groups {
            let _ = killpg(group, Signal::SIGKILL);
        }
        let all = processes();
        let mut doomed: Vec<Pid> = all
            .iter()
            .filter(|p| groups.contains(&p.group) || groups.contains(&p.session))
            .map(|p| p.pid)
            .collect();
        if let Some(tenure) = tenure {
            doomed.extend(tree_from(all, tenure, Some(me)).iter().map(|p| p.pid));
        }
        for pid in doomed {
            let _ = kill(pid, Signal::SIGKILL);
        }
        if round + 1 < KILL_ROUNDS {
            std::thread::sleep(KILL_ROUND_GAP);
        }
    }
}
