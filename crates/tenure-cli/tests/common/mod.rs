//! Shared helpers for the `tenure` binary's integration tests: spawning the real binary,
//! watching its output, bounded waits, and cleanup of every process a test starts.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;

pub mod scenarios;

/// The JSON report a command printed on stdout; the test fails, showing stderr, if
/// the command failed or printed something else.
pub fn json_report(output: &Output) -> serde_json::Value {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "exit {:?}: {stderr}",
        output.status
    );
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}",
            String::from_utf8_lossy(&output.stdout)
        )
    })
}

/// `tenure COMMAND --json --store STORE ARGS` (a command answering one JSON line) run
/// to completion within a minute: (exit code, the line, or null, stderr).
pub fn json_line(command: &str, store: &str, args: &[&str]) -> (i32, serde_json::Value, String) {
    let mut tenure = tenure();
    tenure
        .args([command, "--json", "--store", store])
        .args(args);
    let output = output_within(&mut tenure, Duration::from_secs(60));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = serde_json::from_str(stdout.trim()).unwrap_or(serde_json::Value::Null);
    (
        output.status.code().unwrap_or(-1),
        line,
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// `tenure bench ARGS` in `dir`: exit 2, `needle` (the flag) on stderr, nothing on
/// stdout, nothing created.
pub fn assert_bench_usage(dir: &Path, args: &[&str], needle: &str) {
    let mut command = tenure();
    command
        .arg("bench")
        .args(args)
        .current_dir(dir)
        .env("TMPDIR", dir);
    let output = assert_usage_error(&mut command, &args, needle, Duration::from_secs(60));
    assert!(output.stdout.is_empty(), "{args:?}");
    assert!(tree(dir).is_empty(), "{args:?} created {:?}", tree(dir));
}

/// Runs `command` to completion within `within` and checks that it was refused as a
/// usage error: exit 2, with `needle` (the flag at fault) on stderr. `case` names the
/// input in the failure messages; the output is returned for checks of the caller's own.
pub fn assert_usage_error(
    command: &mut Command,
    case: &dyn std::fmt::Debug,
    needle: &str,
    within: Duration,
) -> Output {
    let output = output_within(command, within);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{case:?}: {stderr}");
    assert!(
        stderr.contains(needle),
        "{case:?}: {needle:?} not in {stderr}"
    );
    output
}

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_tenure");

/// Lease settings short enough to keep tests quick and loose enough for a loaded
/// 2-core machine: a renewal every 300 ms, and leadership kept for 2.2 s after the last
/// renewal was sent (3 s less 1% drift allowance, 300 ms kill grace, 500 ms margin).
pub const FAST: [&str; 8] = [
    "--ttl",
    "3s",
    "--renew-every",
    "300ms",
    "--kill-after",
    "300ms",
    "--retry-every",
    "100ms",
];

/// The timings of the shard-group tests' members: a 2 s TTL, for leases and membership,
/// with a retry every 200 ms.
pub const GROUP_FAST: [&str; 6] = [
    "--ttl",
    "2s",
    "--retry-every",
    "200ms",
    "--member-ttl",
    "2s",
];

/// The kubeconfig every `tenure` a test starts is given (`$KUBECONFIG`), once a test of
/// the Kubernetes backend set it: set once, before the first such command, so the tests'
/// own environment is never changed.
pub static KUBECONFIG: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();

/// A `tenure` command with a clean environment for the store and logs; scripts run by
/// `tenure run` find the binary in `$TENURE_BIN`.
pub fn tenure() -> Command {
    let mut command = Command::new(BIN);
    if let Some(kubeconfig) = KUBECONFIG.get() {
        command.env("KUBECONFIG", kubeconfig);
    }
    tenure_env(&mut command);
    command
}

/// What every `tenure` a test starts gets, directly or through a wrapper such as
/// `unshare`: none of the caller's tenure variables or log filter, the binary's path in
/// `TENURE_BIN`, and no stdin.
pub fn tenure_env(command: &mut Command) -> &mut Command {
    command
        .env_remove("TENURE_STORE")
        .env_remove("TENURE_DEMO_STORE")
        .env_remove("TENURE_FENCING_TOKEN")
        .env_remove("TENURE_ROLE")
        .env_remove("TENURE_OWNER")
        .env_remove("RUST_LOG")
        .env("TENURE_BIN", BIN)
        .stdin(Stdio::null())
}

/// `tenure run --role ROLE --store STORE <FAST> EXTRA... -- sh -c SCRIPT`.
pub fn run_sh(store: &str, role: &str, extra: &[&str], script: &str) -> Command {
    let mut flags = FAST.to_vec();
    flags.extend_from_slice(extra);
    run_sh_with(store, role, &flags, script)
}

/// `tenure run --role ROLE --store STORE FLAGS... -- sh -c SCRIPT` (no default timings).
pub fn run_sh_with(store: &str, role: &str, flags: &[&str], script: &str) -> Command {
    let mut command = tenure();
    command
        .args(["run", "--role", role, "--store", store])
        .args(flags)
        .args(["--", "sh", "-c", script]);
    command
}

/// `tenure run --group GROUP --shards SHARDS --node-id NODE --store STORE FLAGS... -- sh -c
/// SCRIPT`: one member of a shard group (no default timings).
pub fn group_sh(
    store: &str,
    group: &str,
    shards: &str,
    node: &str,
    flags: &[&str],
    script: &str,
) -> Command {
    let mut command = tenure();
    command
        .args([
            "run",
            "--group",
            group,
            "--shards",
            shards,
            "--node-id",
            node,
        ])
        .args(["--store", store])
        .args(flags)
        .args(["--", "sh", "-c", script]);
    command
}

/// Runs a command to completion with a bound; panics if it takes longer.
pub fn output_within(command: &mut Command, within: Duration) -> Output {
    let proc = Proc::spawn(command);
    proc.finish(within)
}

/// A `sqlite:` URL for a database file in `dir`.
pub fn sqlite_url(dir: &Path) -> String {
    format!("sqlite:{}", dir.join("tenure.db").display())
}

/// Polls `cond` every 10 ms until it holds or `within` passes; true if it held.
pub fn wait_until(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// The lines of a text file (empty if it does not exist yet).
pub fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Reads a pid a script wrote with `echo $$ > FILE`, waiting for it.
pub fn read_pid(path: &Path, within: Duration) -> Pid {
    let mut pid = None;
    let found = wait_until(within, || {
        pid = std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok());
        pid.is_some()
    });
    assert!(found, "no pid in {} after {within:?}", path.display());
    Pid::from_raw(pid.unwrap())
}

/// Starts [`run_sh`] of a `script` that writes its own pid to `pid_file` once it runs, and
/// waits up to `within` for it ([`read_pid`]). Returns tenure and the command's pid, whose
/// process group is registered for cleanup.
pub fn start_run_sh(
    store: &str,
    role: &str,
    extra: &[&str],
    script: &str,
    pid_file: &Path,
    within: Duration,
) -> (Proc, Pid) {
    start_writing_pid(&mut run_sh(store, role, extra, script), pid_file, within)
}

/// Starts `run`, a `tenure run` whose command writes its own pid to `pid_file` once it
/// runs, and waits up to `within` for it ([`read_pid`]). Returns tenure and the command's
/// pid, whose process group is registered for cleanup.
pub fn start_writing_pid(run: &mut Command, pid_file: &Path, within: Duration) -> (Proc, Pid) {
    let mut run = Proc::spawn(run);
    let command = read_pid(pid_file, within);
    run.own_group(command);
    (run, command)
}

/// The guard `tenure run` (pid `tenure`) forked: its child that runs tenure's own program
/// (the command's processes run others). A test that means every enforcer of a `tenure
/// run` to be stopped at once, as a frozen VM would, stops this one too.
pub fn guard_of(tenure: Pid) -> Pid {
    let comm = |pid: Pid| std::fs::read_to_string(format!("/proc/{pid}/comm")).ok();
    let children = std::fs::read_to_string(format!("/proc/{tenure}/task/{tenure}/children"))
        .expect("tenure's children");
    children
        .split_whitespace()
        .filter_map(|pid| pid.parse().ok())
        .map(Pid::from_raw)
        .find(|child| comm(*child).is_some() && comm(*child) == comm(tenure))
        .expect("a guard among tenure's children")
}

/// Whether a process exists (a zombie counts as existing).
pub fn alive(pid: Pid) -> bool {
    !matches!(kill(pid, None), Err(Errno::ESRCH))
}

/// Whether a process is gone or a zombie (dead, whether or not reaped).
pub fn dead(pid: Pid) -> bool {
    if !alive(pid) {
        return true;
    }
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let rest = &stat[stat.rfind(')')? + 1..];
            rest.split_whitespace()
                .next()
                .map(|state| state == "Z" || state == "X")
        })
        .unwrap_or(true)
}

/// Whether `signal` is caught (has a handler) in process `pid`, from `/proc/PID/status`:
/// tells when a `tenure` has set up its signal handling, without reading its output.
pub fn catches(pid: Pid, signal: Signal) -> bool {
    signal_mask(pid, "SigCgt:") & (1 << (signal as u64 - 1)) != 0
}

/// A signal mask line (`SigCgt:`, `SigIgn:`) of `/proc/PID/status`; 0 if unreadable.
pub fn signal_mask(pid: Pid, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|l| l.starts_with(field))?;
            u64::from_str_radix(line[field.len()..].trim(), 16).ok()
        })
        .unwrap_or(0)
}

/// A spawned process whose stdout and stderr are collected in the background; on drop
/// it (and every process group registered with [`Proc::own_group`]) is resumed and
/// killed, so a failing test leaves nothing behind, not even a stopped process.
pub struct Proc {
    child: Child,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
    readers: Vec<thread::JoinHandle<()>>,
    groups: Vec<Pid>,
    status: Option<ExitStatus>,
}

impl Proc {
    /// Spawns `command` with piped output.
    pub fn spawn(command: &mut Command) -> Proc {
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn tenure");
        let stdout = Arc::new(Mutex::new(String::new()));
        let stderr = Arc::new(Mutex::new(String::new()));
        let readers = vec![
            collect(child.stdout.take().unwrap(), stdout.clone()),
            collect(child.stderr.take().unwrap(), stderr.clone()),
        ];
        Proc {
            child,
            stdout,
            stderr,
            readers,
            groups: Vec::new(),
            status: None,
        }
    }

    /// Spawns `command` as the leader of a new process group.
    pub fn spawn_in_own_group(command: &mut Command) -> Proc {
        command.process_group(0);
        let mut proc = Proc::spawn(command);
        let pid = proc.pid();
        proc.own_group(pid);
        proc
    }

    /// Kills this process group too when dropped.
    pub fn own_group(&mut self, pgid: Pid) {
        self.groups.push(pgid);
    }

    /// The process id.
    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }

    /// Sends a signal to the process.
    pub fn signal(&self, signal: Signal) {
        kill(self.pid(), signal).expect("signal tenure");
    }

    /// Stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Stdout so far.
    pub fn stdout(&self) -> String {
        self.stdout.lock().unwrap().clone()
    }

    /// Waits until stderr contains `needle`; true if it did within the bound.
    pub fn wait_stderr(&self, needle: &str, within: Duration) -> bool {
        wait_until(within, || self.stderr().contains(needle))
    }

    /// Whether the process has exited (reaping it if so). Once it has, its last output
    /// is collected before this returns (the pipes close at exit unless something it
    /// started still holds them; that is waited for only briefly).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().expect("try_wait");
            if self.status.is_some() {
                let readers = &self.readers;
                wait_until(Duration::from_secs(5), || {
                    readers.iter().all(|r| r.is_finished())
                });
            }
        }
        self.status
    }

    /// Waits for the exit, at most `within`; `None` if it is still running.
    pub fn wait_exit(&mut self, within: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.exited() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits for the exit and returns the whole output; panics (with the output so far)
    /// if the process runs longer than `within`.
    pub fn finish(mut self, within: Duration) -> Output {
        let status = self.wait_exit(within);
        let Some(status) = status else {
            panic!(
                "tenure still running after {within:?}; stderr:\n{}",
                self.stderr()
            );
        };
        Output {
            status,
            stdout: self.stdout().into_bytes(),
            stderr: self.stderr().into_bytes(),
        }
    }

    /// Waits for the exit code, panicking with stderr if there is none in time.
    pub fn code_within(&mut self, within: Duration) -> i32 {
        match self.wait_exit(within) {
            Some(status) => status.code().unwrap_or_else(|| {
                panic!("tenure was killed ({status:?}); stderr:\n{}", self.stderr())
            }),
            None => panic!(
                "tenure still running after {within:?}; stderr:\n{}",
                self.stderr()
            ),
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        for group in &self.groups {
            let _ = killpg(*group, Signal::SIGCONT);
            let _ = killpg(*group, Signal::SIGKILL);
        }
        if self.exited().is_none() {
            let _ = kill(self.pid(), Signal::SIGCONT);
            let _ = kill(self.pid(), Signal::SIGKILL);
            let _ = self.child.wait();
        }
    }
}

fn collect(stream: impl Read + Send + 'static, into: Arc<Mutex<String>>) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        while let Ok(n) = reader.read_line(&mut line) {
            if n == 0 {
                break;
            }
            into.lock().unwrap().push_str(&line);
            line.clear();
        }
    })
}

/// Checks a log of `start TOKEN` / `end TOKEN` lines: every start is followed by the end
/// of the same term before the next start (no overlap), and tokens strictly increase.
/// Returns the tokens in order.
pub fn check_no_overlap(log: &[String]) -> Vec<u64> {
    let mut tokens = Vec::new();
    let mut open: Option<u64> = None;
    for (i, line) in log.iter().enumerate() {
        let (what, token) = line
            .split_once(' ')
            .unwrap_or_else(|| panic!("bad line {i} {line:?} in {log:#?}"));
        let token: u64 = token
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("bad token on line {i} {line:?}"));
        match (what, open) {
            ("start", None) => {
                if let Some(&last) = tokens.last() {
                    assert!(
                        token > last,
                        "token {token} after {last} (line {i}): {log:#?}"
                    );
                }
                tokens.push(token);
                open = Some(token);
            }
            ("start", Some(running)) => {
                panic!("overlap: start {token} while {running} runs (line {i}): {log:#?}")
            }
            ("end", Some(running)) if running == token => open = None,
            ("end", _) => panic!("unexpected end {token} (line {i}): {log:#?}"),
            _ => panic!("bad line {i} {line:?}"),
        }
    }
    assert!(open.is_none(), "a term never ended: {log:#?}");
    tokens
}

/// Runs `workers` threads, each calling `tenure run` `rounds` times on `store` with a
/// script that appends `start TOKEN` / `end TOKEN` to `log` around a short sleep; all
/// must exit 0. Returns the tokens seen, checked for no overlap and strict increase.
pub fn overlap_scenario(store: &str, log: &Path, workers: usize, rounds: usize) -> Vec<u64> {
    let script = format!(
        "echo \"start $TENURE_FENCING_TOKEN\" >> '{log}'; sleep 0.15; \
         echo \"end $TENURE_FENCING_TOKEN\" >> '{log}'",
        log = log.display()
    );
    let handles: Vec<_> = (0..workers)
        .map(|worker| {
            let store = store.to_owned();
            let script = script.clone();
            thread::spawn(move || {
                for round in 0..rounds {
                    let output = output_within(
                        &mut run_sh(&store, "overlap", &["--wait-timeout", "90s"], &script),
                        Duration::from_secs(120),
                    );
                    assert_eq!(
                        output.status.code(),
                        Some(0),
                        "worker {worker} round {round}: {}",
                        String::from_utf8_lossy(&output.stderr)
                    );
                }
            })
        })
        .collect();
    for handle in handles {
        handle.join().expect("worker");
    }
    let log = lines(log);
    assert_eq!(log.len(), 2 * workers * rounds, "{log:#?}");
    check_no_overlap(&log)
}

/// One `#[test]` per named function of [`scenarios`], each in a fresh [`tempdir`] on the
/// store URL that `$store` makes from that directory and the test's name: every backend
/// runs the same scenarios the same way, and only how it makes a store differs.
// Every test crate compiles this module; only the backends' files expand these macros.
#[allow(unused_macros)]
macro_rules! store_scenarios {
    ($store:expr; $($name:ident),* $(,)?) => {$(
        #[test]
        fn $name() {
            let dir = $crate::common::tempdir();
            let url: String = ($store)(dir.path(), stringify!($name));
            $crate::common::scenarios::$name(&url, dir.path());
        }
    )*};
}
#[allow(unused_imports)]
pub(crate) use store_scenarios;

/// The [`store_scenarios`] every backend runs, on the URLs `$store` makes, then the
/// `$extra` ones that backend alone runs (or runs in its own way): one list per backend,
/// so the shared ones are named once and the store closure written once.
#[allow(unused_macros)]
macro_rules! every_backend_scenarios {
    ($store:expr; $($extra:ident),* $(,)?) => {
        $crate::common::store_scenarios!(
            $store;
            shard_group_shares_and_hands_over,
            executions_never_overlap,
            stopped_tenure_loses_leadership_and_kills_its_command,
            paused_group_is_fenced_out,
            sigterm_hands_over_at_once,
            busy_role,
            exit_codes_pass_through,
            env_overrides_inherited,
            same_owner_label_is_two_owners,
            every_ttl_alone_starts,
            $($extra,)*
        );
    };
}
#[allow(unused_imports)]
pub(crate) use every_backend_scenarios;

/// A fresh database on the shared throwaway PostgreSQL server (from the testkit), named
/// after `tag`, `name` and this process, so no two tests share leases; returns its URL
/// (password included).
pub fn fresh_database(tag: &str, name: &str) -> String {
    use tenure_testkit::postgres::{PgServer, SUPERUSER};
    let server = PgServer::shared().expect("shared PostgreSQL server");
    let database = format!("{tag}_{name}_{}", std::process::id());
    server
        .psql(&format!("CREATE DATABASE {database}"))
        .expect("psql");
    server.url_for(SUPERUSER, server.password(), &database)
}

/// A fresh temporary directory.
pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("tenure-cli-test-")
        .tempdir()
        .expect("tempdir")
}

/// Every entry under `dir`, recursively, as sorted relative paths.
pub fn tree(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(current) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&current) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            out.push(path.strip_prefix(dir).unwrap().to_owned());
            if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                stack.push(path);
            }
        }
    }
    out.sort();
    out
}
