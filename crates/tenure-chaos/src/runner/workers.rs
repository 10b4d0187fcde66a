//! The worker processes: one slot per worker, and how each incarnation is started (its own
//! process group, its history file and log, dying with the orchestrator).

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::time::Instant;
use tracing::debug;

use crate::config::ChaosConfig;
use crate::faketime::FakeTime;
use crate::worker::WorkerArgs;
use crate::ChaosError;

/// One worker slot and its current incarnation.
pub(super) struct Slot {
    pub(super) index: usize,
    pub(super) incarnation: u32,
    pub(super) name: String,
    pub(super) child: Child,
    pub(super) pgid: Pid,
    /// When a pause of this slot ends, and which fault record it is.
    pub(super) paused: Option<(Instant, usize)>,
}

/// Everything needed to start a worker incarnation.
pub(super) struct Spawner {
    pub(super) config: ChaosConfig,
    pub(super) url: String,
    /// The role, or in shard mode the group.
    pub(super) role: String,
    pub(super) app_name: String,
    pub(super) dir: PathBuf,
    /// The proxies each worker slot connects through (none: straight to the store).
    pub(super) via: Vec<Vec<SocketAddr>>,
    /// The workers' wall clock, when the run steps it.
    pub(super) fake_time: Option<FakeTime>,
    /// More of the workers' environment (`KUBECONFIG` for a throwaway API server).
    pub(super) env: Vec<(&'static str, OsString)>,
}

impl Spawner {
    /// Whether slot `index` heartbeats around its proxies ([`WorkerArgs::registry_direct`]):
    /// the odd slots of a shard group whose workers connect through proxies, so half the
    /// wedges stall a member's store calls alone and half its heartbeats too.
    pub(super) fn registry_direct(&self, index: usize) -> bool {
        self.config.shards.is_some()
            && index % 2 == 1
            && self.via.get(index).is_some_and(|via| !via.is_empty())
    }

    pub(super) fn spawn(&self, index: usize, incarnation: u32) -> Result<Slot, ChaosError> {
        let name = format!("w{index}.{incarnation}");
        let args = WorkerArgs {
            store_url: self.url.clone(),
            role: self.role.clone(),
            shards: self.config.shards,
            name: name.clone(),
            history: self.dir.join(format!("{name}.jsonl")),
            ttl: self.config.ttl,
            write_every: self.config.write_every,
            app_name: self.app_name.clone(),
            unsafe_skip_fence: self.config.unsafe_skip_fence,
            sqlite_busy: self.config.sqlite_busy(),
            via: self.via.get(index).cloned().unwrap_or_default(),
            registry_direct: self.registry_direct(index),
        };
        let log =
            std::fs::File::create(self.dir.join(format!("{name}.log"))).map_err(|source| {
                ChaosError::Io {
                    what: "cannot create a worker log",
                    source,
                }
            })?;
        let (program, prefix) = &self.config.worker_command;
        let mut command = Command::new(program);
        command
            .args(prefix)
            .args(args.to_flags())
            // The URL may hold a password: the environment, not the command line.
            .env("TENURE_STORE", &self.url)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .envs(self.fake_time.iter().flat_map(FakeTime::env))
            .envs(self.env.iter().cloned())
            // Its own group, so a pause or kill takes everything it runs.
            .process_group(0)
            .kill_on_drop(true);
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            command.pre_exec(|| {
                // Workers never outlive the orchestrator, however it ends.
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)
            });
        }
        let child = command.spawn().map_err(|source| ChaosError::Io {
            what: "cannot start a worker process",
            source,
        })?;
        let pid = child.id().ok_or_else(|| ChaosError::Io {
            what: "a worker exited before it could be tracked",
            source: std::io::Error::other("no pid"),
        })?;
        debug!(%name, pid, "worker started");
        Ok(Slot {
            index,
            incarnation,
            name,
            child,
            pgid: Pid::from_raw(pid as i32),
            paused: None,
        })
    }
}
