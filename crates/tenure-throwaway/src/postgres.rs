//! A throwaway PostgreSQL server: its own data directory, port and socket.
//!
//! [`PgServer::start`] runs `initdb` and `postgres` from `$PG_BIN_DIR`, `PATH` or
//! `/usr/lib/postgresql/*/bin` in a fresh temporary directory, on a free loopback port
//! (never 5432, never the system cluster). When run as root the server runs as the
//! `postgres` user, since PostgreSQL refuses root. Its owner can stop, kill (-9), restart
//! (same data, same port), pause (SIGSTOP) and resume it, and stall its WAL disk
//! ([`PgServer::stall_wal`]: commits hang, reads answer, as on a disk that stopped
//! answering), through a small library of this crate preloaded into the server
//! (`wal-disk/shim.rs`).
//!
//! No server outlives its owner: `Drop` stops it, the shared server is stopped at process
//! exit, and every postmaster is started with `PR_SET_PDEATHSIG` from one long-lived
//! spawner thread, so it is killed even when the owner dies abruptly.
//!
//! The harness works at the process level (no database driver); it runs admin SQL
//! with `psql` over the Unix socket.

use std::ffi::CString;
use std::fs;
use std::io;
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use crate::error::{Result, ThrowawayError};
use crate::process::{end_within, free_ports, shared_server, spawn_from_keeper, sweep_stale_dirs};

/// How long a start (or restart) may take before it is reported as failed.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The superuser the harness creates; [`PgServer::url`] logs in as it with a password.
pub const SUPERUSER: &str = "postgres";

const DIR_PREFIX: &str = "tenure-pg-";

/// The WAL disk shim (`wal-disk/shim.rs`, built by `build.rs`), written into each
/// server's directory and preloaded into its processes.
const WAL_DISK_SHIM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libtenure_wal_disk.so"));
const WAL_DISK_SHIM_FILE: &str = "libtenure_wal_disk.so";
/// While this file of the server's directory exists, its WAL writes wait.
const WAL_STALLED_FILE: &str = "wal-disk-stalled";

/// A running (or stopped, or paused) throwaway PostgreSQL server.
#[derive(Debug)]
pub struct PgServer {
    root: PathBuf,
    bin: PathBuf,
    port: u16,
    password: String,
    owner: Option<(u32, u32)>,
    child: Mutex<Option<Child>>,
}

impl PgServer {
    /// Creates a cluster in a fresh temporary directory and starts it; the error says
    /// what is missing, or carries initdb's output or the server log.
    pub fn start() -> Result<PgServer> {
        sweep_stale_dirs(DIR_PREFIX, &[std::env::temp_dir()]);
        let bin = find_bin_dir().ok_or(ThrowawayError::NotInstalled {
            program: "initdb and postgres",
            looked_in: "$PG_BIN_DIR, PATH, /usr/lib/postgresql/*/bin",
            package: "postgresql",
        })?;
        static SEQ: AtomicUsize = AtomicUsize::new(0);
        let root = std::env::temp_dir().join(format!(
            "{DIR_PREFIX}{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(&root).map_err(ThrowawayError::io("creating the server directory"))?;
        fs::set_permissions(&root, fs::Permissions::from_mode(0o755))
            .map_err(ThrowawayError::io("making the server directory readable"))?;
        let shim = root.join(WAL_DISK_SHIM_FILE);
        fs::write(&shim, WAL_DISK_SHIM)
            .and_then(|()| fs::set_permissions(&shim, fs::Permissions::from_mode(0o755)))
            .map_err(ThrowawayError::io("writing the WAL disk shim"))?;
        // SAFETY: geteuid has no preconditions.
        let owner = if unsafe { libc::geteuid() } == 0 {
            Some(postgres_user().ok_or(ThrowawayError::NotInstalled {
                program: "a `postgres` user (PostgreSQL refuses to run as root)",
                looked_in: "the user database",
                package: "postgresql",
            })?)
        } else {
            None
        };
        let password = random_password();
        let server = PgServer {
            root,
            bin,
            port: free_ports(1)?[0],
            password,
            owner,
            child: Mutex::new(None),
        };
        server.init()?;
        server.spawn_and_wait()?;
        Ok(server)
    }

    /// One server shared by every caller in this process, started on first use and
    /// stopped when the process exits; a failed start is remembered and returned to every
    /// caller. Callers that stop or pause a server start their own.
    pub fn shared() -> std::result::Result<&'static PgServer, &'static ThrowawayError> {
        static SHARED: OnceLock<Result<PgServer>> = OnceLock::new();
        shared_server(&SHARED, PgServer::start, PgServer::shutdown_and_clean)
    }

    /// The TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The directory holding the server's Unix socket.
    pub fn socket_dir(&self) -> PathBuf {
        self.root.join("sock")
    }

    /// The superuser's password (scram-authenticated over TCP).
    pub fn password(&self) -> &str {
        &self.password
    }

    /// `postgres://postgres:PASSWORD@127.0.0.1:PORT/postgres`: password-authenticated.
    pub fn url(&self) -> String {
        self.url_for(SUPERUSER, &self.password, "postgres")
    }

    /// A URL for another role and database on this server.
    pub fn url_for(&self, user: &str, password: &str, database: &str) -> String {
        format!(
            "postgres://{user}:{password}@127.0.0.1:{}/{database}",
            self.port
        )
    }

    /// The server's log so far (for assertion messages).
    pub fn log(&self) -> String {
        fs::read_to_string(self.root.join("server.log")).unwrap_or_default()
    }

    /// Runs admin SQL as the superuser with `psql` over the socket; returns its output
    /// (unaligned, tuples only), or psql's error.
    pub fn psql(&self, sql: &str) -> Result<String> {
        let psql = self.bin.join("psql");
        let psql = if psql.is_file() {
            psql
        } else {
            PathBuf::from("psql")
        };
        let output = Command::new(psql)
            .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h"])
            .arg(self.socket_dir())
            .args([
                "-p",
                &self.port.to_string(),
                "-U",
                SUPERUSER,
                "-d",
                "postgres",
                "-c",
                sql,
            ])
            .stdin(Stdio::null())
            .output()
            .map_err(ThrowawayError::io("running psql"))?;
        if !output.status.success() {
            return Err(ThrowawayError::failed(
                "psql failed",
                String::from_utf8_lossy(&output.stderr),
            ));
        }
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    }

    /// Makes the server's commits asynchronous, as a server tuned for speed has them
    /// (`synchronous_commit = off` for every role and database, set with `ALTER SYSTEM`
    /// and kept across restarts): a commit is answered before its WAL record is
    /// written, and the WAL writer writes it up to 10 s later (`wal_writer_delay`), so a
    /// [`kill`](PgServer::kill) in between loses it. A client that names
    /// `synchronous_commit` on its connection is not affected.
    pub fn commit_asynchronously(&self) -> Result<()> {
        // `ALTER SYSTEM` refuses to run in a transaction, which one psql -c is.
        for sql in [
            "ALTER SYSTEM SET synchronous_commit = off",
            "ALTER SYSTEM SET wal_writer_delay = '10s'",
            "SELECT pg_reload_conf()",
        ] {
            self.psql(sql)?;
        }
        Ok(())
    }

    /// Fast shutdown (SIGINT), waiting for the server to exit; heals a stalled WAL disk
    /// first, as a process waiting on it cannot exit.
    pub fn stop(&self) {
        self.heal_wal();
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(mut running) = child.take() {
            let pid = running.id() as libc::pid_t;
            signal_tree(pid, libc::SIGCONT);
            end_within(&mut running, libc::SIGINT, Duration::from_secs(20));
            wait_children_gone(pid, Duration::from_secs(10));
        }
    }

    /// Kills the postmaster with SIGKILL (its backends exit on their own) and waits
    /// until every server process is gone.
    pub fn kill(&self) {
        self.heal_wal();
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(mut running) = child.take() {
            let pid = running.id() as libc::pid_t;
            signal_tree(pid, libc::SIGCONT);
            unsafe { libc::kill(pid, libc::SIGKILL) };
            let _ = running.wait();
            wait_children_gone(pid, Duration::from_secs(10));
        }
    }

    /// Starts the server again on the same data directory and port (after `stop` or
    /// `kill`; stops it first when it is running).
    pub fn restart(&self) -> Result<()> {
        self.stop();
        self.spawn_and_wait()
    }

    /// Starts the server again after `stop` or `kill` (same data, same port); does
    /// nothing while it runs.
    pub fn start_again(&self) -> Result<()> {
        if self
            .child
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
        {
            return Ok(());
        }
        self.spawn_and_wait()
    }

    /// Freezes every server process (SIGSTOP): connections stay open, nothing answers.
    /// Returns once each of them is stopped.
    pub fn pause(&self) {
        if let Some(pid) = self.pid() {
            signal_tree(pid, libc::SIGSTOP);
            for process in std::iter::once(pid).chain(children_of(pid)) {
                crate::process::wait_stopped(process, Duration::from_secs(2));
            }
        }
    }

    /// Thaws the server after [`pause`](PgServer::pause).
    pub fn resume(&self) {
        if let Some(pid) = self.pid() {
            signal_tree(pid, libc::SIGCONT);
        }
    }

    /// Stalls the server's WAL disk until [`heal_wal`](PgServer::heal_wal): each write
    /// of the write-ahead log waits, so every commit hangs while it holds the WAL's
    /// write lock, and reads still answer. When healed, each waiting commit lands,
    /// whether or not its client still waits for it.
    pub fn stall_wal(&self) -> Result<()> {
        fs::write(self.root.join(WAL_STALLED_FILE), b"")
            .map_err(ThrowawayError::io("stalling the WAL disk"))
    }

    /// Lets the WAL disk answer again after [`stall_wal`](PgServer::stall_wal); nothing
    /// when it is not stalled.
    pub fn heal_wal(&self) {
        let _ = fs::remove_file(self.root.join(WAL_STALLED_FILE));
    }

    /// The postmaster's process id while it runs.
    pub fn pid(&self) -> Option<libc::pid_t> {
        self.child
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|c| c.id() as libc::pid_t)
    }

    fn data_dir(&self) -> PathBuf {
        self.root.join("data")
    }

    fn as_owner(&self, command: &mut Command) {
        if let Some((uid, gid)) = self.owner {
            command.uid(uid).gid(gid);
        }
    }

    fn chown(&self, path: &Path) -> Result<()> {
        let Some((uid, gid)) = self.owner else {
            return Ok(());
        };
        let what = || format!("handing {} to the postgres user", path.display());
        let c = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| ThrowawayError::failed(what(), "the path holds a NUL byte"))?;
        // SAFETY: chown on a NUL-terminated path we own.
        if unsafe { libc::chown(c.as_ptr(), uid, gid) } != 0 {
            return Err(ThrowawayError::io(what())(io::Error::last_os_error()));
        }
        Ok(())
    }

    fn init(&self) -> Result<()> {
        let data = self.data_dir();
        let sock = self.socket_dir();
        for dir in [&data, &sock] {
            fs::create_dir_all(dir).map_err(ThrowawayError::io("creating the data directory"))?;
            self.chown(dir)?;
        }
        fs::set_permissions(&data, fs::Permissions::from_mode(0o700))
            .map_err(ThrowawayError::io("restricting the data directory"))?;
        let pwfile = self.root.join("pwfile");
        fs::write(&pwfile, format!("{}\n", self.password))
            .map_err(ThrowawayError::io("writing the password file"))?;
        self.chown(&pwfile)?;
        let mut initdb = Command::new(self.bin.join("initdb"));
        initdb
            .arg("-D")
            .arg(&data)
            .args([
                "-U",
                SUPERUSER,
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            ])
            .arg(format!("--pwfile={}", pwfile.display()))
            .current_dir(&self.root)
            .stdin(Stdio::null());
        self.as_owner(&mut initdb);
        let output = initdb
            .output()
            .map_err(ThrowawayError::io("running initdb"));
        let _ = fs::remove_file(&pwfile);
        let output = output?;
        if !output.status.success() {
            return Err(ThrowawayError::failed(
                "initdb failed",
                format!(
                    "{}{}",
                    String::from_utf8_lossy(&output.stdout),
                    String::from_utf8_lossy(&output.stderr)
                ),
            ));
        }
        Ok(())
    }

    fn spawn_and_wait(&self) -> Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let log = fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(self.root.join("server.log"))
                .map_err(ThrowawayError::io("opening the server log"))?;
            let log_err = log
                .try_clone()
                .map_err(ThrowawayError::io("opening the server log"))?;
            let mut command = Command::new(self.bin.join("postgres"));
            command
                .arg("-D")
                .arg(self.data_dir())
                .args(["-p", &self.port.to_string(), "-k"])
                .arg(self.socket_dir())
                .args([
                    "-c",
                    "listen_addresses=127.0.0.1",
                    "-c",
                    "fsync=off",
                    "-c",
                    "full_page_writes=off",
                    "-c",
                    "max_connections=300",
                    "-c",
                    "shared_buffers=32MB",
                    "-c",
                    "logging_collector=off",
                    "-c",
                    "log_min_messages=warning",
                ])
                .env("LD_PRELOAD", self.root.join(WAL_DISK_SHIM_FILE))
                .env("TENURE_WAL_DISK", self.root.join(WAL_STALLED_FILE))
                .current_dir(&self.root)
                .stdin(Stdio::null())
                .stdout(log)
                .stderr(log_err);
            self.as_owner(&mut command);
            // The postmaster dies with its owner, however that ends.
            let mut child =
                spawn_from_keeper(command).map_err(ThrowawayError::io("starting postgres"))?;
            match self.wait_ready(&mut child, deadline) {
                Ok(()) => {
                    *self.child.lock().unwrap_or_else(|e| e.into_inner()) = Some(child);
                    return Ok(());
                }
                Err(exited) => {
                    if exited && Instant::now() < deadline {
                        // A killed predecessor's shared memory may still be detaching.
                        thread::sleep(Duration::from_millis(200));
                        continue;
                    }
                    // SAFETY: kill(2) on our own, not yet reaped, child.
                    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGKILL) };
                    let _ = child.wait();
                    return Err(ThrowawayError::failed(
                        format!("postgres did not become ready within {START_TIMEOUT:?}; its log"),
                        self.log(),
                    ));
                }
            }
        }
    }

    /// Ok when the server accepts connections; Err(true) when it exited early.
    fn wait_ready(&self, child: &mut Child, deadline: Instant) -> std::result::Result<(), bool> {
        let pidfile = self.data_dir().join("postmaster.pid");
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return Err(true);
            }
            let ready = fs::read_to_string(&pidfile)
                .map(|s| s.lines().nth(7).is_some_and(|l| l.trim() == "ready"))
                .unwrap_or(false);
            if ready && TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Ok(());
            }
            thread::sleep(Duration::from_millis(20));
        }
        Err(false)
    }

    fn shutdown_and_clean(&self) {
        self.heal_wal();
        {
            let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(mut running) = child.take() {
                let pid = running.id() as libc::pid_t;
                signal_tree(pid, libc::SIGCONT);
                // Immediate shutdown: quick, and it still removes shared memory.
                end_within(&mut running, libc::SIGQUIT, Duration::from_secs(5));
            }
        }
        let _ = fs::remove_dir_all(&self.root);
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        self.shutdown_and_clean();
    }
}

/// The direct children of `pid` (PostgreSQL backends are all children of the postmaster).
fn children_of(pid: libc::pid_t) -> Vec<libc::pid_t> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<libc::pid_t>().ok())
        .filter(|child| {
            fs::read_to_string(format!("/proc/{child}/stat"))
                .ok()
                .and_then(|stat| {
                    // The command name may hold spaces; fields resume after the last ')'.
                    let rest = &stat[stat.rfind(')')? + 1..];
                    rest.split_whitespace().nth(1)?.parse::<libc::pid_t>().ok()
                })
                == Some(pid)
        })
        .collect()
}

fn signal_tree(pid: libc::pid_t, signal: libc::c_int) {
    unsafe { libc::kill(pid, signal) };
    for child in children_of(pid) {
        unsafe { libc::kill(child, signal) };
    }
}

fn wait_children_gone(pid: libc::pid_t, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let children = children_of(pid);
        if children.is_empty() || Instant::now() >= deadline {
            for child in children {
                unsafe { libc::kill(child, libc::SIGKILL) };
            }
            return;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// `$PG_BIN_DIR` when set (and only then), else `PATH`, else the newest
/// `/usr/lib/postgresql/*/bin`: the first directory holding both `initdb` and `postgres`.
fn find_bin_dir() -> Option<PathBuf> {
    let has_both = |dir: &Path| dir.join("initdb").is_file() && dir.join("postgres").is_file();
    if let Some(dir) = std::env::var_os("PG_BIN_DIR") {
        let dir = PathBuf::from(dir);
        return has_both(&dir).then_some(dir);
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            if has_both(&dir) {
                // Follow symlinks (/usr/local/bin/initdb -> /usr/lib/postgresql/15/bin)
                // so psql and friends are found beside the real binaries.
                return fs::canonicalize(dir.join("postgres"))
                    .ok()
                    .and_then(|real| real.parent().map(Path::to_path_buf))
                    .filter(|real| has_both(real))
                    .or(Some(dir));
            }
        }
    }
    let mut candidates: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse::<u32>().ok()?;
            Some((version, e.path().join("bin")))
        })
        .filter(|(_, dir)| has_both(dir))
        .collect();
    candidates.sort();
    candidates.pop().map(|(_, dir)| dir)
}

fn postgres_user() -> Option<(u32, u32)> {
    let name = CString::new("postgres").ok()?;
    let entry = unsafe { libc::getpwnam(name.as_ptr()) };
    if entry.is_null() {
        return None;
    }
    let entry = unsafe { &*entry };
    Some((entry.pw_uid, entry.pw_gid))
}

fn random_password() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut out = String::from("pw");
    for _ in 0..3 {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u128(Instant::now().elapsed().as_nanos());
        out.push_str(&format!("{:016x}", hasher.finish()));
    }
    out
}
