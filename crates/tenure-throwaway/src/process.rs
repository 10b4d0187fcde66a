//! Process plumbing both servers share: spawning server processes that die with their
//! owner, waiting for them to exit, free loopback ports, and sweeping data directories
//! that dead owners left behind.

use std::fs;
use std::io;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::{mpsc, Mutex, OnceLock};
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
