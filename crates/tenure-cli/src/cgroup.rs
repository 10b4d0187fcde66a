//! A cgroup (v2) for the commands of one `tenure run`, where tenure may create one.
//!
//! Signals reach only the processes tenure can find and may signal. A command that changes
//! user (a setuid program, `sudo`, `setpriv`) loses its parent-death signal and may refuse
//! a non-root tenure's signals; one that left the command's process group is out of the
//! guard's reach once tenure, its subreaper, is gone; `/proc` mounted `hidepid=2` hides
//! processes altogether. A cgroup holds all of them whatever they do: each command starts
//! in a cgroup of its own (`tenure-PID/cmd-N`, under tenure's own cgroup), a stop writes
//! `cgroup.kill` (the kernel SIGKILLs every member, no permission check on the members),
//! tenure releases only once `cgroup.events` says nothing is left, and the guard kills
//! `tenure-PID` as a whole at the deadline or when tenure is gone.
//!
//! Where no cgroup can be made (no cgroup2 mount, no write access to tenure's own cgroup,
//! a kernel before 5.14 without `cgroup.kill`), tenure works with signals alone, as the
//! README says.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

/// The cgroup holding this process's commands, once made; or why none could be.
static BASE: OnceLock<Result<PathBuf, String>> = OnceLock::new();

/// Numbers the commands' cgroups.
static NEXT: AtomicU64 = AtomicU64::new(1);

/// Makes `tenure-PID` under this process's own cgroup, if it can. Call once, before the
/// guard is forked (it inherits the path).
pub fn setup() {
    let _ = BASE.set(make_base());
}

/// The cgroup holding the commands, if one was made.
pub fn base() -> Option<&'static Path> {
    BASE.get()
        .and_then(|base| base.as_ref().ok())
        .map(PathBuf::as_path)
}

/// Why no cgroup is used, if none is (for a log line once logging is up).
pub fn unavailable() -> Option<&'static str> {
    BASE.get()
        .and_then(|base| base.as_ref().err())
        .map(String::as_str)
}

fn make_base() -> Result<PathBuf, String> {
    let mount = cgroup2_mount().ok_or("no cgroup2 file system is mounted")?;
    let own = std::fs::read_to_string("/proc/self/cgroup")
        .map_err(|error| format!("cannot read /proc/self/cgroup: {error}"))?
        .lines()
        .find_map(|line| line.strip_prefix("0::").map(str::to_owned))
        .ok_or("this process is in no cgroup2 cgroup")?;
    let parent = mount.join(own.trim_start_matches('/'));
    let base = parent.join(format!("tenure-{}", std::process::id()));
    std::fs::create_dir(&base)
        .map_err(|error| format!("cannot create {}: {error}", base.display()))?;
    // (The root cgroup has no cgroup.kill on any kernel: asked of the new one.)
    if !base.join("cgroup.kill").exists() {
        let _ = std::fs::remove_dir(&base);
        return Err(format!(
            "{} has no cgroup.kill (a kernel before 5.14)",
            base.display()
        ));
    }
    Ok(base)
}

/// Where the cgroup2 file system is mounted (`/sys/fs/cgroup`, or
/// `/sys/fs/cgroup/unified` on a hybrid host).
fn cgroup2_mount() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mounts.lines().find_map(|line| {
        // `ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS... - FSTYPE SOURCE SUPER`
        let (before, after) = line.split_once(" - ")?;
        let fstype = after.split_whitespace().next()?;
        let mountpoint = before.split_whitespace().nth(4)?;
        (fstype == "cgroup2").then(|| PathBuf::from(mountpoint))
    })
}

/// The cgroup of one command: it is cloned into it (or joins it between fork and exec),
/// and it is removed when this is dropped (once empty).
#[derive(Debug)]
pub struct CommandCgroup {
    path: PathBuf,
    /// The cgroup's directory, open: what `clone3(CLONE_INTO_CGROUP)` takes.
    dir: OwnedFd,
}

impl CommandCgroup {
    /// A new, empty cgroup for one command, and the open `cgroup.procs` a forked command
    /// writes `0` to (async-signal-safe) to join it; `None` where there is no base.
    pub fn create() -> std::io::Result<Option<(CommandCgroup, OwnedFd)>> {
        let Some(base) = base() else {
            return Ok(None);
        };
        let path = base.join(format!("cmd-{}", NEXT.fetch_add(1, Ordering::Relaxed)));
        std::fs::create_dir(&path)?;
        let dir = std::fs::File::open(&path)?.into();
        let procs = OpenOptions::new()
            .write(true)
            .open(path.join("cgroup.procs"))?;
        Ok(Some((CommandCgroup { path, dir }, procs.into())))
    }

    /// The cgroup's directory, open.
    pub fn dir(&self) -> BorrowedFd<'_> {
        self.dir.as_fd()
    }

    /// SIGKILLs every process in the cgroup.
    pub fn kill(&self) {
        kill(&self.path);
    }

    /// Whether no process is left in the cgroup (unreadable counts as empty, so a stop
    /// never waits on a cgroup that is gone).
    pub fn is_empty(&self) -> bool {
        std::fs::read_to_string(self.path.join("cgroup.events"))
            .map(|events| events.lines().any(|line| line == "populated 0"))
            .unwrap_or(true)
    }
}

impl Drop for CommandCgroup {
    fn drop(&mut self) {
        // EBUSY while anything is left; the guard removes what remains when tenure exits.
        let _ = std::fs::remove_dir(&self.path);
    }
}

/// Writes `cgroup.kill` of `cgroup`: the kernel SIGKILLs every process in it and in the
/// cgroups below it.
pub fn kill(cgroup: &Path) {
    if let Ok(mut file) = OpenOptions::new()
        .write(true)
        .open(cgroup.join("cgroup.kill"))
    {
        let _ = file.write_all(b"1");
    }
}

/// Kills and removes `base` and the commands' cgroups below it, waiting up to a second
/// for their processes to be gone (a cgroup with members cannot be removed).
pub fn remove(base: &Path) {
    for _ in 0..100 {
        kill(base);
        if let Ok(entries) = std::fs::read_dir(base) {
            // The type from the listing itself: a cgroup holds dozens of interface files,
            // and a `stat` of each cost more than the rest of the removal.
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                    let _ = std::fs::remove_dir(entry.path());
                }
            }
        }
        if std::fs::remove_dir(base).is_ok() || !base.exists() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
