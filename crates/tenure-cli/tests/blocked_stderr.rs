//! A `tenure run` whose stderr nobody reads (a pipe to a wedged log shipper, a
//! terminal stopped with Ctrl-S) must still renew, or stop its command in time: a
//! leader blocked in a log write would keep its command running while another instance
//! takes the role.

mod common;

use std::os::fd::AsFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{
    check_no_overlap, lines, run_sh, sqlite_url, tempdir, tenure, wait_until, Proc, FAST,
};
use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::{pipe, Pid};

/// Kills a leader's process group when dropped and reaps it, so a wedged leader never
/// outlives the test.
struct Group(std::process::Child);

impl Drop for Group {
    fn drop(&mut self) {
        let _ = killpg(Pid::from_raw(self.0.id() as i32), Signal::SIGKILL);
        let _ = self.0.wait();
    }
}

#[test]
fn a_leader_whose_stderr_nobody_reads_never_overlaps_the_next() {
    let dir = tempdir();
    let store = sqlite_url(dir.path());
    let log = dir.path().join("log");
    let log_path = log.display().to_string();
    // A small pipe, never read: -v logs about 7 KB before the command starts and
    // fills the rest within seconds (a renewal every 300 ms).
    let (unread, stderr) = pipe().expect("pipe");
    fcntl(stderr.as_fd(), FcntlArg::F_SETPIPE_SZ(16384)).expect("shrink the pipe");
    let first = format!(
        "echo \"start $TENURE_FENCING_TOKEN\" >> '{log_path}'; sleep 12; \
         echo \"end $TENURE_FENCING_TOKEN\" >> '{log_path}'"
    );
    let mut leader: Command = tenure();
    leader
        .arg("-v")
        .args(["run", "--role", "reports", "--store", &store])
        .args(FAST)
        .args(["--", "sh", "-c", &first])
        .stdout(Stdio::null())
        .stderr(Stdio::from(stderr))
        .process_group(0);
    let _leader = Group(leader.spawn().expect("spawn the leader"));
    assert!(
        wait_until(Duration::from_secs(20), || lines(&log).len() == 1),
        "the first leader never started its command"
    );

    let second = format!(
        "echo \"start $TENURE_FENCING_TOKEN\" >> '{log_path}'; \
         echo \"end $TENURE_FENCING_TOKEN\" >> '{log_path}'"
    );
    let mut next = Proc::spawn(&mut run_sh(&store, "reports", &[], &second));
    // Blocked in a log write inside a store transaction, a leader would also hold the
    // SQLite file's write lock for good: the next instance would never run.
    let status = next.wait_exit(Duration::from_secs(60));
    assert!(
        status.is_some_and(|s| s.success()),
        "the next instance did not run and exit 0 within 60 s ({status:?}): {}",
        next.stderr()
    );
    let tokens = check_no_overlap(&lines(&log));
    assert_eq!(tokens.len(), 2, "{:?}", lines(&log));
    drop(unread);
}

/// Waits for `child` to exit, at most `within`.
fn exit_within(
    child: &mut std::process::Child,
    within: Duration,
) -> Option<std::process::ExitStatus> {
    let mut status = None;
    wait_until(within, || {
        status = child.try_wait().expect("try_wait");
        status.is_some()
    });
    status
}

/// The write end of a pipe whose read end is already closed (`tenure ... 2>&1 | head -1`
/// once head has exited): every write to it fails with EPIPE.
fn closed_pipe() -> Stdio {
    let (reader, writer) = pipe().expect("pipe");
    drop(reader);
    Stdio::from(writer)
}

/// `tenure run` with stdout and stderr both pipes nobody will ever read again: none of
/// its messages (the role is held, not waiting; a signal while waiting; the metrics
/// address) panics it or kills it with SIGPIPE. Each exits with its documented code.
#[test]
fn closed_output_pipes_never_kill_tenure() {
    let dir = tempdir();
    let store = sqlite_url(dir.path());
    let (_holder, _) = common::scenarios::hold(&store, "held", "holder", dir.path());
    let ran = dir.path().join("ran");
    let touch = format!("touch '{}'", ran.display());
    let spawn = |command: &mut Command| {
        command
            .stdout(closed_pipe())
            .stderr(closed_pipe())
            .process_group(0);
        Group(command.spawn().expect("spawn tenure"))
    };

    // "role is held by ...; not waiting (--no-wait)": 75.
    let mut busy = spawn(&mut run_sh(&store, "held", &["--no-wait"], &touch));
    let status = exit_within(&mut busy.0, Duration::from_secs(30));
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(75),
        "--no-wait: {status:?}"
    );

    // "is held by ...; waiting", then "SIGTERM while waiting ...; giving up": 143.
    let mut waiter = spawn(&mut run_sh(&store, "held", &[], &touch));
    let pid = Pid::from_raw(waiter.0.id() as i32);
    let listening = wait_until(Duration::from_secs(30), || {
        common::catches(pid, Signal::SIGTERM) || common::dead(pid)
    });
    assert!(listening, "tenure never listened for SIGTERM");
    let _ = nix::sys::signal::kill(pid, Signal::SIGTERM);
    let status = exit_within(&mut waiter.0, Duration::from_secs(30));
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(128 + 15),
        "waiting: {status:?}"
    );
    assert!(!ran.exists(), "a command ran while the role was held");

    // "metrics on http://...", then the command runs: its exit code, 0.
    let mut free = spawn(&mut run_sh(
        &store,
        "free",
        &["--metrics-addr", "127.0.0.1:0"],
        &touch,
    ));
    let status = exit_within(&mut free.0, Duration::from_secs(30));
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "--metrics-addr: {status:?}"
    );
    assert!(ran.exists(), "the command did not run");
}

/// A `tenure run` waiting for a held role, with a stderr pipe that is full and never
/// read (a wedged log shipper, a terminal stopped with Ctrl-S): its messages must not
/// block it, so SIGTERM still ends it promptly, with 128+15.
#[test]
fn a_waiter_whose_stderr_is_full_still_acts_on_sigterm() {
    let dir = tempdir();
    let store = sqlite_url(dir.path());
    let (_holder, _) = common::scenarios::hold(&store, "held", "holder", dir.path());
    let (unread, stderr) = pipe().expect("pipe");
    fcntl(stderr.as_fd(), FcntlArg::F_SETPIPE_SZ(4096)).expect("shrink the pipe");
    // Filled before tenure starts: its first write blocks (O_NONBLOCK is shared with
    // tenure through the open file, so it is cleared again before the spawn).
    fcntl(stderr.as_fd(), FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).expect("O_NONBLOCK");
    let block = [0u8; 4096];
    while nix::unistd::write(&stderr, &block).is_ok() {}
    fcntl(stderr.as_fd(), FcntlArg::F_SETFL(OFlag::empty())).expect("clear O_NONBLOCK");

    let mut waiter = run_sh(&store, "held", &[], "true");
    waiter
        .stdout(Stdio::null())
        .stderr(Stdio::from(stderr))
        .process_group(0);
    let mut waiter = Group(waiter.spawn().expect("spawn tenure"));
    let pid = Pid::from_raw(waiter.0.id() as i32);
    assert!(
        wait_until(Duration::from_secs(30), || common::catches(
            pid,
            Signal::SIGTERM
        )),
        "tenure never listened for SIGTERM"
    );
    nix::sys::signal::kill(pid, Signal::SIGTERM).expect("SIGTERM");
    let status = exit_within(&mut waiter.0, Duration::from_secs(5));
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(128 + 15),
        "{status:?}, wchan {:?}",
        std::fs::read_to_string(format!("/proc/{pid}/wchan")).unwrap_or_default()
    );
    drop(unread);
}
