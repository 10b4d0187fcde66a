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
use nix::fcntl::{fcntl, FcntlArg};
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
