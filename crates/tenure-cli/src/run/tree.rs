//! Tenure's process tree read from `/proc`, shared between commands being stopped, and the
//! reaping of the orphans that re-parent to tenure as a subreaper.

use std::io::ErrorKind;
use std::sync::Arc;

use nix::errno::Errno;
use nix::sys::wait::{waitpid, WaitPidFlag};
use nix::unistd::Pid;
use parking_lot::Mutex;
use tracing::warn;

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

/// The children of `pid`, from each of its threads' `children` file (one file per thread:
/// an orphan adopted by tenure may be any thread's child). `None` where the kernel has no
/// such files (built without `CONFIG_PROC_CHILDREN`).
///
/// A thread's file is read as `/proc/TID/task/TID/children`, not under `/proc/PID/task`:
/// the same file, but an entry of another thread under `/proc/PID` (once looked up) makes
/// the reaping of the process, when it exits, spin in the kernel while that thread's exit
/// drops the entry: 5 to 15 ms in a fifth to a third of runs (Linux 6.18), charged to
/// whoever waits for tenure.
fn children(pid: Pid) -> Option<Vec<Pid>> {
    let tasks = match std::fs::read_dir(format!("/proc/{pid}/task")) {
        Ok(tasks) => tasks,
        // Gone meanwhile: no children to find.
        Err(error) if error.kind() == ErrorKind::NotFound => return Some(Vec::new()),
        Err(_) => return None,
    };
    let mut found = Vec::new();
    for task in tasks.flatten() {
        let tid = task.file_name();
        let tid = tid.to_string_lossy();
        let task = std::path::PathBuf::from(format!("/proc/{tid}/task/{tid}"));
        match std::fs::read_to_string(task.join("children")) {
            Ok(list) => found.extend(
                list.split_whitespace()
                    .filter_map(|pid| pid.parse().ok())
                    .map(Pid::from_raw),
            ),
            // The thread exited between the listing and the read.
            Err(_) if !task.exists() => {}
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
pub(super) fn tree() -> Vec<ProcessEntry> {
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

/// Whether tenure has no child but its guard, as its threads' `children` files say: the
/// usual state once a command exited and was reaped, told by a few reads (one per thread of
/// tenure's), on the runtime thread, where [`tree`] would need a thread of its own.
fn childless() -> bool {
    let guard = crate::guard::pid();
    children(Pid::this()).is_some_and(|children| children.iter().all(|&pid| Some(pid) == guard))
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
pub(super) async fn tree_since(since: tokio::time::Instant) -> Arc<Vec<ProcessEntry>> {
    let mut latest = SNAPSHOT.lock().await;
    if let Some(snapshot) = latest.as_ref().filter(|s| s.began >= since) {
        return snapshot.tree.clone();
    }
    let began = tokio::time::Instant::now();
    let tree = if childless() {
        Vec::new()
    } else {
        match tokio::task::spawn_blocking(tree).await {
            Ok(tree) => tree,
            // No blocking thread to be had (the runtime shutting down): scan here.
            Err(_) => tree(),
        }
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
pub(super) struct RunningCommand(Pid);

impl RunningCommand {
    pub(super) fn register(pid: Pid) -> RunningCommand {
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
pub(super) fn reap_orphans(tree: &[ProcessEntry]) {
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
