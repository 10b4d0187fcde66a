//! `tenure`: fenced leader election from the shell.
//!
//! Every command picks its store with `--store URL` or `TENURE_STORE`; the default is a
//! SQLite file under the user's state directory. Exit codes are in [`exit`] and the README.

mod bench;
mod cgroup;
mod chaos;
mod checks;
mod cli;
mod demo;
mod drain;
mod exporter;
mod guard;
mod handoff;
mod inspect;
mod logging;
mod output;
mod parse;
mod report_dir;
mod run;
mod run_shards;
mod say;
mod store;

use std::future::Future;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use crate::checks::{check_group_flags, check_run_flags};
use crate::cli::{Cli, Command, CompletionShell, StoreArg};
use crate::logging::init_logging;
use crate::store::{StoreUrl, Stores};

/// Exit codes. A command run by `tenure run` passes its own code through, so a child
/// exiting with one of these is indistinguishable from tenure saying it (as with
/// `timeout(1)`); stderr tells which.
pub mod exit {
    /// Success (for `run`: the command exited 0).
    pub const OK: u8 = 0;
    /// A runtime failure: store unreachable, I/O error, the demo's story did not hold.
    pub const FAILURE: u8 = 1;
    /// Bad usage: unknown flag, malformed URL or duration, invalid option, bad database file.
    pub const USAGE: u8 = 2;
    /// `tenure fence`: the token is older than one the fence already admitted.
    pub const FENCED: u8 = 3;
    /// `tenure run`: leadership was lost while the command ran; it was stopped.
    pub const LOST: u8 = 4;
    /// `tenure run --no-wait`: another owner holds the role (as `flock -n`).
    pub const BUSY: u8 = 75;
    /// `tenure run --wait-timeout`: not leader in time.
    pub const TIMEOUT: u8 = 124;
    /// `tenure run`: tenure itself failed before or while running the command.
    pub const RUN_FAILED: u8 = 125;
    /// `tenure run`: the command was found but could not be executed.
    pub const NOT_EXECUTABLE: u8 = 126;
    /// `tenure run`: the command was not found.
    pub const NOT_FOUND: u8 = 127;
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            let code = if error.use_stderr() {
                exit::USAGE
            } else {
                exit::OK
            };
            let _ = error.print();
            return ExitCode::from(code);
        }
    };
    // The guard is forked first, while this process has one thread (logging may start one).
    let running = matches!(cli.command, Command::Run { .. });
    if running {
        cgroup::setup();
        if let Err(error) = guard::start() {
            if let Some(base) = cgroup::base() {
                cgroup::remove(base);
            }
            say::say!("tenure: {error:#}");
            return ExitCode::from(exit::FAILURE);
        }
    }
    // The demo narrates on stdout; its logs would only repeat the story.
    let quiet = matches!(cli.command, Command::Demo { .. });
    let _flush_logs_on_exit = init_logging(cli.log_format, cli.verbose, quiet);
    if let Some(why) = cgroup::unavailable() {
        tracing::info!(%why, "no cgroup for the command: it is stopped with signals alone");
    }
    let code = match dispatch(cli.command) {
        Ok(code) => ExitCode::from(code),
        Err(error) => {
            say::say!("tenure: {error:#}");
            ExitCode::from(if is_usage(&error) {
                exit::USAGE
            } else {
                exit::FAILURE
            })
        }
    };
    // Every command is stopped by now; the guard would remove it too, a moment later.
    if let Some(base) = cgroup::base().filter(|_| running) {
        cgroup::remove(base);
    }
    code
}

fn is_usage(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        matches!(
            cause.downcast_ref::<tenure::Error>(),
            Some(tenure::Error::InvalidArgument { .. })
        ) || cause.downcast_ref::<UsageError>().is_some()
    })
}

/// A mistake on the command line, reported with [`exit::USAGE`].
#[derive(Debug)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    // One thread: the command is spawned from it, and its parent-death signal is tied
    // to the spawning thread staying alive.
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

/// The store `arg` names, which `command` needs shared between processes (not `memory:`).
fn shared_store(arg: &StoreArg, command: &str) -> anyhow::Result<StoreUrl> {
    let url = StoreUrl::parse(&arg.raw()?)?;
    url.require_shared(command)?;
    Ok(url)
}

/// Opens the store at `url` on a runtime of its own and runs `work` on it.
fn on_store<F, Fut>(url: &StoreUrl, member_ttl: Duration, work: F) -> anyhow::Result<u8>
where
    F: FnOnce(Stores) -> Fut,
    Fut: Future<Output = anyhow::Result<u8>>,
{
    runtime()?.block_on(store::with_store(url, member_ttl, work))
}

fn dispatch(command: Command) -> anyhow::Result<u8> {
    match command {
        Command::Run {
            role,
            group,
            shards,
            ttl,
            renew_every,
            retry_every,
            owner,
            no_wait,
            wait_timeout,
            kill_after,
            node_id,
            advertise,
            metrics_addr,
            store,
            command,
        } => {
            run::ignore_tty_stops()?;
            let raw = store.raw()?;
            let url = StoreUrl::parse(&raw)?;
            url.require_shared("run")?;
            let args = run::RunArgs {
                role: role.or_else(|| group.clone()).unwrap_or_default(),
                ttl,
                renew_every,
                retry_every,
                owner,
                no_wait,
                wait_timeout,
                kill_after,
                node_id,
                advertise,
                store_url: raw,
                command,
            };
            let member_ttl = match (&group, shards) {
                (Some(group), Some(shards)) => {
                    check_group_flags(&args, group, shards)?;
                    store.group_member_ttl(ttl)?
                }
                _ => store.member_ttl(),
            };
            check_run_flags(&args)?;
            // Bound before the store is opened: an address that cannot be used stops
            // tenure before it contends.
            let exporter = metrics_addr.map(exporter::Exporter::bind).transpose()?;
            if let (Some(group), Some(shards)) = (group, shards) {
                return on_store(&url, member_ttl, |stores| {
                    run_shards::run(stores, args, group, shards, exporter)
                });
            }
            on_store(&url, member_ttl, |stores| run::run(stores, args, exporter))
        }
        Command::Status {
            role,
            group,
            json,
            watch,
            store,
        } => {
            if let Some(group) = &group {
                tenure::lease::validate_name("group", group)
                    .map_err(|e| UsageError(format!("--group: {e}")))?;
            }
            let url = shared_store(&store, "status")?;
            on_store(&url, store.member_ttl(), |stores| async move {
                match &group {
                    Some(group) => inspect::group_status(&stores, group, json, watch).await,
                    None => inspect::status(&stores, role.as_deref(), json, watch).await,
                }
            })
        }
        Command::Leader {
            role,
            watch,
            json,
            store,
        } => {
            tenure::lease::validate_name("role", &role)
                .map_err(|e| UsageError(format!("--role: {e}")))?;
            let url = shared_store(&store, "leader")?;
            on_store(&url, store.member_ttl(), |stores| async move {
                inspect::leader(&stores, &role, json, watch).await
            })
        }
        Command::Handoff {
            role,
            to,
            timeout,
            json,
            store,
        } => {
            tenure::handoff::request_role(&role).map_err(|e| UsageError(format!("--role: {e}")))?;
            if let Some(to) = &to {
                tenure::lease::validate_name("owner", to)
                    .map_err(|e| UsageError(format!("--to: {e}")))?;
            }
            if timeout.is_zero() {
                return Err(UsageError("--timeout: must be greater than zero".to_owned()).into());
            }
            let url = shared_store(&store, "handoff")?;
            on_store(&url, store.member_ttl(), |stores| async move {
                handoff::handoff(&stores, &role, to.as_deref(), timeout, json).await
            })
        }
        Command::Drain {
            group,
            node,
            hold,
            timeout,
            cancel,
            json,
            store,
        } => {
            tenure::shard::drain_role(&group, &node).map_err(|e| match &e {
                tenure::Error::InvalidArgument { field, .. } => {
                    UsageError(format!("--{field}: {e}"))
                }
                _ => UsageError(e.to_string()),
            })?;
            if timeout.is_zero() {
                return Err(UsageError("--timeout: must be greater than zero".to_owned()).into());
            }
            if hold < timeout {
                return Err(UsageError(format!(
                    "--hold: {} is shorter than --timeout ({}): the member would join again while still being drained",
                    output::human(hold),
                    output::human(timeout)
                ))
                .into());
            }
            let url = shared_store(&store, "drain")?;
            on_store(&url, store.member_ttl(), |stores| async move {
                if cancel {
                    drain::cancel(&stores, &group, &node, json).await
                } else {
                    drain::drain(&stores, &group, &node, hold, timeout, json).await
                }
            })
        }
        Command::Members { json, store } => {
            let url = shared_store(&store, "members")?;
            on_store(&url, store.member_ttl(), |stores| async move {
                inspect::members(&stores, json).await
            })
        }
        Command::Fence {
            resource,
            token,
            store,
        } => {
            let url = shared_store(&store, "fence")?;
            let token = inspect::parse_token(&token)?;
            on_store(&url, store.member_ttl(), |stores| async move {
                inspect::fence(&stores, &resource, token).await
            })
        }
        Command::Demo { store: raw } => {
            let url = StoreUrl::parse(&raw)?;
            demo::run_cli(&url)?;
            Ok(exit::OK)
        }
        Command::Bench(args) => bench::run(args),
        Command::Chaos(args) => chaos::run(args),
        Command::ChaosWorker(flags) => chaos::worker(flags),
        Command::Completions { shell } => {
            let shell = match shell {
                CompletionShell::Bash => clap_complete::Shell::Bash,
                CompletionShell::Zsh => clap_complete::Shell::Zsh,
                CompletionShell::Fish => clap_complete::Shell::Fish,
            };
            let mut command = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut command, "tenure", &mut std::io::stdout());
            Ok(exit::OK)
        }
        Command::Man => {
            let page = clap_mangen::Man::new(<Cli as clap::CommandFactory>::command());
            page.render(&mut std::io::stdout())?;
            Ok(exit::OK)
        }
    }
}
