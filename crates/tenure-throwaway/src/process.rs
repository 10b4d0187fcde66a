//! Process plumbing the servers share: spawning server processes that die with their
//! owner, running one again and again ([`ServerProcess`]), waiting for them to exit, free
//! loopback ports, finding programs, and the data directories (fresh ones, and sweeping
//! those that dead owners left behind).

use std::fs;
use std::io;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Mutex, MutexGuard, Once, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use crate::error::{Result, ThrowawayError};

/// Spawns `command` with `PR_SET_PDEATHSIG` (SIGKILL), from one thread that lives as long
/// as the process: the death signal fires when the spawning *thread* exits, and test
/// threads (and tokio's blocking threads) come and go.
pub(crate) fn spawn_from_keeper(command: Command) -> io::Result<Child> {
    type Request = (Command, mpsc::Sender<io::Result<Child>>);
    static KEEPER: OnceLock<Option<Mutex<mpsc::Sender<Request>>>> = OnceLock::new();
    let keeper = KEEPER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Request>();
        let spawner = thread::Builder::new()
            .name("throwaway-spawner".into())
            .spawn(move || {
                for (mut command, reply) in rx {
                    // SAFETY: only async-signal-safe calls (prctl, getppid, _exit) run
                    // between fork and exec.
                    let parent = unsafe { libc::getpid() };
                    unsafe {
                        command.pre_exec(move || {
                            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                                return Err(io::Error::last_os_error());
                            }
                            // The parent died before the signal was armed.
                            if libc::getppid() != parent {
                                libc::_exit(1);
                            }
                            Ok(())
                        });
                    }
                    let _ = reply.send(command.spawn());
                }
            });
        spawner.ok().map(|_| Mutex::new(tx))
    });
    let Some(keeper) = keeper else {
        return Err(io::Error::other("could not start the spawner thread"));
    };
    let (reply_tx, reply_rx) = mpsc::channel();
    keeper
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .send((command, reply_tx))
        .map_err(|_| io::Error::other("the spawner thread is gone"))?;
    reply_rx
        .recv()
        .map_err(|_| io::Error::other("the spawner thread is gone"))?
}

/// Polls `child` until it exits or `within` passes; whether it exited.
pub(crate) fn wait_exit(child: &mut Child, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return true;
        }
        thread::sleep(Duration::from_millis(20));
    }
    false
}

/// Sends `sig` to `child` and waits up to `grace` for it to exit; then SIGKILL, and waits
/// until it is gone. A server that ignores its shutdown signal must not outlive the
/// test that stops it.
pub(crate) fn end_within(child: &mut Child, sig: libc::c_int, grace: Duration) {
    signal(child, sig);
    if !wait_exit(child, grace) {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// `count` distinct free loopback ports (all held open at once while choosing), never
/// 5432, where a system PostgreSQL may appear later.
pub(crate) fn free_ports(count: usize) -> Result<Vec<u16>> {
    let mut ports = Vec::with_capacity(count);
    let mut listeners = Vec::with_capacity(count);
    while ports.len() < count {
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .map_err(ThrowawayError::io("binding a free loopback port"))?;
        let port = listener
            .local_addr()
            .map_err(ThrowawayError::io("reading a bound port"))?
            .port();
        if port != 5432 {
            ports.push(port);
            listeners.push(listener);
        }
    }
    Ok(ports)
}

/// Removes the directories `<base>/<prefix><pid>-...` whose test process no longer
/// exists.
pub(crate) fn sweep_stale_dirs(prefix: &str, bases: &[PathBuf]) {
    for base in bases {
        let Ok(entries) = fs::read_dir(base) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(prefix)) else {
                continue;
            };
            let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
                continue;
            };
            if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = fs::remove_dir_all(entry.path());
            }
        }
    }
}

/// A fresh, empty directory `<base>/<prefix><pid>-<n>` for one server's data, on
/// `/dev/shm` when it exists (fsync is cheap there on a loaded machine), else in the temp
/// directory; [`sweep_stale_dirs`] finds it once its owner is gone.
pub(crate) fn fresh_dir(prefix: &str) -> Result<PathBuf> {
    static SEQ: AtomicUsize = AtomicUsize::new(0);
    let root = shm_or_temp().join(format!(
        "{prefix}{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = fs::remove_dir_all(&root);
    fs::create_dir_all(&root)
        .map_err(ThrowawayError::io(format!("creating {}", root.display())))?;
    Ok(root)
}

/// Sweeps, once per process and prefix, the directories [`fresh_dir`] made for owners
/// that are gone.
pub(crate) fn sweep_once(prefix: &'static str, swept: &OnceLock<()>) {
    swept.get_or_init(|| {
        sweep_stale_dirs(prefix, &[PathBuf::from("/dev/shm"), std::env::temp_dir()])
    });
}

fn shm_or_temp() -> PathBuf {
    if Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    }
}

/// The first file called `name` in a directory of `PATH`.
pub(crate) fn on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// One server process, started again and again with the same program, arguments and log
/// (stdout and stderr of every run, appended): spawned from the keeper, stopped, killed,
/// paused and resumed.
#[derive(Debug)]
pub(crate) struct ServerProcess {
    name: String,
    bin: PathBuf,
    args: Vec<String>,
    /// Environment variables set for the program, beside the inherited ones.
    env: Vec<(String, String)>,
    log_path: PathBuf,
    child: Mutex<Option<Child>>,
}

impl ServerProcess {
    /// A process called `name` in messages; nothing runs until [`spawn`](Self::spawn).
    pub(crate) fn new(name: String, bin: PathBuf, args: Vec<String>, log_path: PathBuf) -> Self {
        ServerProcess {
            name,
            bin,
            args,
            env: Vec::new(),
            log_path,
            child: Mutex::new(None),
        }
    }

    /// The same, with `key` set to `value` in the program's environment.
    pub(crate) fn with_env(mut self, key: &str, value: String) -> Self {
        self.env.push((key.to_owned(), value));
        self
    }

    /// Starts the program (the caller has stopped any earlier run).
    pub(crate) fn spawn(&self) -> Result<()> {
        let opening = || ThrowawayError::io(format!("opening the {} log", self.name));
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .map_err(opening())?;
        let log_err = log.try_clone().map_err(opening())?;
        let mut command = Command::new(&self.bin);
        command
            .args(&self.args)
            .envs(self.env.iter().map(|(key, value)| (key, value)))
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_err));
        let child = spawn_from_keeper(command).map_err(ThrowawayError::io(format!(
            "starting {}",
            self.bin.display()
        )))?;
        *lock(&self.child) = Some(child);
        Ok(())
    }

    /// The process id while it runs.
    pub(crate) fn pid(&self) -> Option<libc::pid_t> {
        lock(&self.child)
            .as_ref()
            .and_then(|c| libc::pid_t::try_from(c.id()).ok())
    }

    /// Whether the process is running (or paused).
    pub(crate) fn is_running(&self) -> bool {
        match lock(&self.child).as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Every run's output so far.
    pub(crate) fn log(&self) -> String {
        fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// The log's last 300 lines, for error messages (a chatty server's whole log would
    /// bury the cause).
    fn log_tail(&self) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        let skipped = lines.len().saturating_sub(300);
        let tail = lines[skipped..].join("\n");
        if skipped == 0 {
            tail
        } else {
            format!(
                "[{skipped} earlier lines in {}]\n{tail}",
                self.log_path.display()
            )
        }
    }

    /// SIGTERM (after a SIGCONT, in case it is paused), then SIGKILL once `grace` passes.
    pub(crate) fn stop(&self, grace: Duration) {
        if let Some(mut c) = lock(&self.child).take() {
            signal(&c, libc::SIGCONT);
            end_within(&mut c, libc::SIGTERM, grace);
        }
    }

    /// SIGKILL, as a crash would; waits until the process is gone.
    pub(crate) fn kill(&self) {
        if let Some(mut c) = lock(&self.child).take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGSTOP: its sockets stay open but it answers nothing. Returns once every thread
    /// of it is stopped, so a test's next request cannot be served in the meantime.
    pub(crate) fn pause(&self) {
        if let Some(c) = lock(&self.child).as_ref() {
            signal(c, libc::SIGSTOP);
            if let Ok(pid) = libc::pid_t::try_from(c.id()) {
                wait_stopped(pid, Duration::from_secs(2));
            }
        }
    }

    /// SIGCONT.
    pub(crate) fn resume(&self) {
        if let Some(c) = lock(&self.child).as_ref() {
            signal(c, libc::SIGCONT);
        }
    }

    /// Polls `reached` until it holds; an error with the log when the process exits
    /// first or `within` passes. `goal` completes "<name> not <goal> within ...".
    pub(crate) fn wait_until(
        &self,
        goal: &str,
        within: Duration,
        poll: Duration,
        mut reached: impl FnMut() -> bool,
    ) -> Result<()> {
        let deadline = Instant::now() + within;
        loop {
            if !self.is_running() {
                return Err(ThrowawayError::failed(
                    format!("{} exited before it was {goal}; its log", self.name),
                    self.log_tail(),
                ));
            }
            if reached() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(ThrowawayError::failed(
                    format!("{} not {goal} within {within:?}; its log", self.name),
                    self.log_tail(),
                ));
            }
            thread::sleep(poll);
        }
    }
}

/// Locks `mutex`, also after a panic elsewhere poisoned it.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Waits until every thread of process `pid` is stopped (state `T` in
/// `/proc/PID/task/TID/stat`), or it is gone, or `within` passes. `kill` only queues a
/// stop: each thread stops when it next enters the kernel, which on a loaded machine can
/// come after the caller's next request was read and answered.
pub(crate) fn wait_stopped(pid: libc::pid_t, within: Duration) {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
            return;
        };
        let all_stopped = tasks.flatten().all(|task| {
            fs::read_to_string(task.path().join("stat")).map_or(true, |stat| {
                // The state follows the command name, which is in parentheses and may
                // itself hold ") ".
                stat.rsplit_once(") ")
                    .and_then(|(_, rest)| rest.chars().next())
                    .is_none_or(|state| matches!(state, 'T' | 't' | 'Z' | 'X'))
            })
        });
        if all_stopped {
            return;
        }
        thread::sleep(Duration::from_millis(1));
    }
}

fn signal(child: &Child, sig: libc::c_int) {
    if let Ok(pid) = libc::pid_t::try_from(child.id()) {
        // SAFETY: kill(2) on our own child's pid; the child is not reaped yet (we hold it).
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

/// A process-wide server in `cell`: started by `start` on first use, `clean` run on it
/// when the process exits (it kills the server: statics are never dropped); a failed
/// start is remembered and returned to every caller.
pub(crate) fn shared_server<T: Send + Sync>(
    cell: &'static OnceLock<Result<T>>,
    start: fn() -> Result<T>,
    clean: fn(&T),
) -> std::result::Result<&'static T, &'static ThrowawayError> {
    cell.get_or_init(|| {
        let server = start()?;
        at_exit(Box::new(move || {
            if let Some(Ok(server)) = cell.get() {
                clean(server);
            }
        }));
        Ok(server)
    })
    .as_ref()
}

/// What runs when the process exits, in the order `atexit` would run it (last
/// registered first): one extern "C" function registered once runs them all, so a
/// shared server's cleanup can be a closure over its cell.
static AT_EXIT: Mutex<Vec<Box<dyn Fn() + Send>>> = Mutex::new(Vec::new());

/// Has `hook` run when the process exits.
fn at_exit(hook: Box<dyn Fn() + Send>) {
    static REGISTERED: Once = Once::new();
    extern "C" fn run_hooks() {
        let hooks = std::mem::take(&mut *lock(&AT_EXIT));
        for hook in hooks.iter().rev() {
            hook();
        }
    }
    lock(&AT_EXIT).push(hook);
    REGISTERED.call_once(|| {
        // SAFETY: registers a plain extern "C" function to run at exit.
        unsafe {
            libc::atexit(run_hooks);
        }
    });
}
