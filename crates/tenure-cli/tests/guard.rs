//! `tenure run` when tenure itself cannot act: stopped (`kill -STOP` of its pid alone: a
//! debugger, a cgroup freeze of one process, a wedged runtime) or killed. Its command
//! must not run on past the term, nor outlive tenure, whatever tenure's own state: the
//! guard, a second process outside tenure, holds the deadline too.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{lines, read_pid, run_sh, sqlite_url, tempdir, tenure, wait_until, Proc, FAST};
use nix::sys::signal::Signal;

/// A command that appends `TAG TOKEN NANOS` to `log` every 20 ms while it runs.
fn ticking(log: &Path, tag: &str) -> String {
    format!(
        "while :; do echo \"{tag} $TENURE_FENCING_TOKEN $(date +%s%N)\" >> '{}'; sleep 0.02; done",
        log.display()
    )
}

/// `(tag, token, nanos)` of each line of a ticking log.
fn ticks(log: &Path) -> Vec<(String, u64, u128)> {
    lines(log)
        .iter()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let tag = fields.next()?.to_owned();
            let token = fields.next()?.parse().ok()?;
            let nanos = fields.next()?.parse().ok()?;
            Some((tag, token, nanos))
        })
        .collect()
}

/// How long the first instance's command ran on after the second's started, in ms (zero
/// when it did not), for the ticks of `log` tagged `first` and `second`.
fn overlap_ms(log: &Path, first: &str, second: &str) -> i128 {
    let ticks = ticks(log);
    let last_first = ticks.iter().filter(|t| t.0 == first).map(|t| t.2).max();
    let first_second = ticks.iter().filter(|t| t.0 == second).map(|t| t.2).min();
    match (last_first, first_second) {
        (Some(last), Some(start)) => (last as i128 - start as i128).max(0) / 1_000_000,
        _ => panic!("no ticks of {first} or {second}: {:?}", lines(log)),
    }
}

/// Setup: two `tenure run --role job` on one SQLite file (ttl 3 s, renew 300 ms,
/// kill-after 300 ms). While the first leads, SIGSTOP reaches its tenure process only;
/// its command keeps running. The second leads once the lease expires. The first's
/// command must have stopped before the second's started.
#[test]
fn a_stopped_tenure_never_overlaps_the_next_leader() {
    let dir = tempdir();
    let store = sqlite_url(dir.path());
    let log = dir.path().join("ticks");
    let mut first = Proc::spawn(&mut run_sh(&store, "job", &[], &ticking(&log, "first")));
    assert!(
        wait_until(Duration::from_secs(20), || ticks(&log).len() >= 3),
        "the first never started its command: {}",
        first.stderr()
    );
    first.signal(Signal::SIGSTOP);
    let _second = Proc::spawn(&mut run_sh(&store, "job", &[], &ticking(&log, "second")));
    assert!(
        wait_until(Duration::from_secs(20), || ticks(&log)
            .iter()
            .any(|t| t.0 == "second")),
        "the second never led"
    );
    // Long enough for a command that outlived its term to show it.
    std::thread::sleep(Duration::from_secs(1));
    let overlap = overlap_ms(&log, "first", "second");
    assert_eq!(
        overlap, 0,
        "the stopped leader's command ran {overlap} ms into the next term"
    );
    first.signal(Signal::SIGCONT);
    // Resumed, it finds its term lost and its command gone.
    assert!(first.wait_exit(Duration::from_secs(20)).is_some());
}

/// Setup: two members of a group of 2 shards on one SQLite file (ttl 3 s, member-ttl 3 s);
/// the first owns both shards alone, then SIGSTOP reaches its tenure process only. The
/// second takes both shards once the first's session and membership lapse. No shard's
/// command of the first may run after the second's started on that shard.
#[test]
fn a_stopped_group_member_never_overlaps_the_next_owner() {
    let dir = tempdir();
    let store = sqlite_url(dir.path());
    let log = dir.path().join("ticks");
    let member = |node: &str| {
        let mut command = tenure();
        command
            .args(["run", "--group", "g", "--shards", "2", "--node-id", node])
            .args(["--store", &store, "--member-ttl", "3s"])
            .args(FAST)
            .args([
                "--",
                "sh",
                "-c",
                &ticking(&log, &format!("{node}-$TENURE_SHARD")),
            ]);
        command
    };
    let first = Proc::spawn(&mut member("m1"));
    let started = |tag: &str| ticks(&log).iter().any(|t| t.0 == tag);
    assert!(
        wait_until(Duration::from_secs(20), || started("m1-0")
            && started("m1-1")),
        "the first member never started both shards: {}",
        first.stderr()
    );
    first.signal(Signal::SIGSTOP);
    let _second = Proc::spawn(&mut member("m2"));
    assert!(
        wait_until(Duration::from_secs(30), || started("m2-0")
            && started("m2-1")),
        "the second member never took both shards"
    );
    std::thread::sleep(Duration::from_secs(1));
    for shard in ["0", "1"] {
        let overlap = overlap_ms(&log, &format!("m1-{shard}"), &format!("m2-{shard}"));
        assert_eq!(
            overlap, 0,
            "shard {shard}: the stopped member's command ran {overlap} ms into the next term"
        );
    }
    first.signal(Signal::SIGCONT);
}

/// Setup: `tenure run` leads, its command starts a background `sleep` in its process
/// group and waits; then tenure is killed with SIGKILL. The command dies of its
/// parent-death signal; the background process, which has none, must die too, at once.
#[test]
fn a_killed_tenure_leaves_nothing_of_its_command_running() {
    let (_dir, first, background) =
        start_job(|pid_file| format!("sleep 300 & echo $! > '{}'; wait", pid_file.display()));
    assert!(
        dies_with_tenure(&first, background),
        "the command's background process outlived a killed tenure"
    );
}

/// Setup (as root, as `scripts/test` runs): `tenure run` leads with a command that drops
/// to another user (`setpriv --reuid 65534`, as a container entrypoint does with gosu or
/// su-exec), which clears its parent-death signal; then tenure is killed with SIGKILL.
/// The command must die at once all the same: the guard, root too, kills its group.
#[test]
fn a_killed_tenure_stops_a_command_that_changed_user() {
    let root = std::fs::read_to_string("/proc/self/status").is_ok_and(|status| {
        status
            .lines()
            .any(|line| line.starts_with("Uid:") && line.split_whitespace().nth(2) == Some("0"))
    });
    assert!(
        root,
        "this test runs a command as another user and needs root, as scripts/test runs"
    );
    let (_dir, first, command) = start_job(|pid_file| {
        format!(
            "echo $$ > '{}'; exec setpriv --reuid=65534 --regid=65534 --clear-groups sleep 300",
            pid_file.display()
        )
    });
    assert!(
        wait_until(Duration::from_secs(10), || {
            std::fs::read_to_string(format!("/proc/{command}/status"))
                .is_ok_and(|status| status.contains("Uid:\t65534"))
        }),
        "the command never changed user"
    );
    assert!(
        dies_with_tenure(&first, command),
        "the command that changed user outlived a killed tenure"
    );
}

/// Setup: `tenure run` leads, its command starts `setsid sleep` (out of the command's
/// process group and session) and waits; then tenure is killed with SIGKILL. The escaped
/// process, no longer in any group the guard knows and no longer tenure's once tenure is
/// gone, must die at once all the same (where tenure may make a cgroup, as root here), and
/// the cgroup is removed.
#[test]
fn a_killed_tenure_leaves_nothing_even_what_left_its_group() {
    let (_dir, first, escaped) = start_job(|pid_file| {
        format!(
            "setsid sleep 300 & echo $! > '{}'; wait",
            pid_file.display()
        )
    });
    let cgroup = cgroup_of(first.pid());
    assert!(
        dies_with_tenure(&first, escaped),
        "a process that left the command's group outlived a killed tenure"
    );
    assert!(
        wait_until(Duration::from_secs(2), || !cgroup.exists()),
        "{} was left behind",
        cgroup.display()
    );
}

/// Starts `tenure run --role job` on a fresh SQLite store with the command `script`
/// makes, which writes the pid of the process a test watches to the file it is given,
/// and waits for that pid (20 s at most). Returns the scratch directory (gone when
/// dropped), tenure and that pid.
fn start_job(script: impl FnOnce(&Path) -> String) -> (tempfile::TempDir, Proc, nix::unistd::Pid) {
    let dir = tempdir();
    let store = sqlite_url(dir.path());
    let pid_file = dir.path().join("watched.pid");
    let first = Proc::spawn(&mut run_sh(&store, "job", &[], &script(&pid_file)));
    let watched = read_pid(&pid_file, Duration::from_secs(20));
    (dir, first, watched)
}

/// Kills `tenure` (SIGKILL) and tells whether `pid` dies at once with it (within 2 s).
/// One that does not is killed then, so a failing test leaves nothing running.
fn dies_with_tenure(tenure: &Proc, pid: nix::unistd::Pid) -> bool {
    tenure.signal(Signal::SIGKILL);
    let gone = wait_until(Duration::from_secs(2), || common::dead(pid));
    if !gone {
        let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
    }
    gone
}

/// The cgroup `tenure run` (pid `tenure`) made for its commands, under its own cgroup.
fn cgroup_of(tenure: nix::unistd::Pid) -> std::path::PathBuf {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let mount = mounts
        .lines()
        .find_map(|line| {
            let (before, after) = line.split_once(" - ")?;
            (after.split_whitespace().next()? == "cgroup2")
                .then(|| before.split_whitespace().nth(4).map(str::to_owned))?
        })
        .expect("a cgroup2 mount");
    let own = std::fs::read_to_string(format!("/proc/{tenure}/cgroup")).expect("its cgroup");
    let own = own
        .lines()
        .find_map(|line| line.strip_prefix("0::"))
        .expect("a cgroup2 cgroup");
    let path = Path::new(&mount)
        .join(own.trim_start_matches('/'))
        .join(format!("tenure-{tenure}"));
    assert!(path.is_dir(), "tenure made no cgroup at {}", path.display());
    path
}
