//! `tenure`: fenced leader election from the shell.
//!
//! Every command picks its store with `--store URL` or `TENURE_STORE`; the default is a
//! SQLite file under the user's state directory. Exit codes are in [`exit`] and the README.

mod bench;
mod cgroup;
mod chaos;
mod demo;
mod exporter;
mod guard;
mod handoff;
mod inspect;
mod output;
mod parse;
mod report_dir;
mod run;
mod run_shards;
mod say;
mod store;

use std::ffi::OsString;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::parse::parse_duration;
use crate::store::StoreUrl;

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

#[derive(Parser, Debug)]
#[command(
    name = "tenure",
    version,
    about = "Fenced leader election and membership: run a command as a cluster-wide singleton",
    after_help = "Exit codes: 0 ok, 1 failure, 2 usage, 3 fenced, 4 leadership lost, 75 busy \
                  (--no-wait), 124 wait timeout, 125 tenure failed, 126/127 command not \
                  executable/found; otherwise the command's own code (128+N if killed by signal N)."
)]
struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// More logs (-v: debug, -vv: trace). RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// `--store`, shared by every command that talks to a store.
#[derive(Args, Debug, Clone)]
struct StoreArg {
    // The help text is an attribute, not a doc comment: rustdoc would read the usage
    // notation `kube:[NAMESPACE]` as a link. clap drops a one-paragraph help's final period.
    #[arg(
        long = "store",
        env = "TENURE_STORE",
        hide_env_values = true,
        help = concat!(
            "Store URL: sqlite:PATH, postgres://USER@HOST/DB, etcd://HOST:PORT[/PREFIX], ",
            "kube:[NAMESPACE], memory:. ",
            "Default: sqlite under $XDG_STATE_HOME (or ~/.local/state)/tenure/tenure.db"
        )
    )]
    url: Option<String>,
    /// Membership liveness TTL: a node is live this long after its last heartbeat.
    /// Default: 15s; with `run --group`, --ttl (a longer one is refused: a killed member
    /// would stay the target of its shards after its session ended).
    #[arg(long, value_parser = parse_duration)]
    member_ttl: Option<Duration>,
}

/// `--member-ttl` when not given and not derived from `--ttl`.
const DEFAULT_MEMBER_TTL: Duration = Duration::from_secs(15);

impl StoreArg {
    /// The membership TTL of every command but `run --group`.
    fn member_ttl(&self) -> Duration {
        self.member_ttl.unwrap_or(DEFAULT_MEMBER_TTL)
    }

    /// The membership TTL of a shard group member whose session lasts `ttl`: `ttl`
    /// unless given. A membership that outlives the session keeps a killed member the
    /// target of its shards after they are free, so they would wait for the orphan
    /// rescue or the lapse (two to three TTLs); a longer one is refused.
    fn group_member_ttl(&self, ttl: Duration) -> Result<Duration, UsageError> {
        match self.member_ttl {
            Some(given) if given > ttl => Err(UsageError(format!(
                "--member-ttl ({}) must not exceed --ttl ({}) with --group: a killed member \
                 would stay the target of its shards after its session ended; leave \
                 --member-ttl out to use --ttl",
                output::human(given),
                output::human(ttl)
            ))),
            Some(given) => Ok(given),
            None => Ok(ttl),
        }
    }

    fn raw(&self) -> anyhow::Result<String> {
        match &self.url {
            Some(url) => Ok(url.clone()),
            None => store::default_url(),
        }
    }
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a command as the cluster-wide singleton of a role.
    ///
    /// The command runs in its own process group. When it exits, or leadership is lost,
    /// everything it started is stopped (SIGTERM, then SIGKILL after --kill-after) before
    /// the lease can pass on: tenure is a child subreaper, so this includes processes that
    /// left the group or session (setsid, double fork, daemons). Not covered: processes
    /// started for it by something outside its tree (systemd-run, at, a container
    /// runtime, ssh), and, if tenure itself is killed with SIGKILL, processes that left
    /// the command's process group (the group gets SIGKILL from the guard).
    ///
    /// SIGINT, SIGTERM, SIGHUP and SIGQUIT are forwarded to the command's process group
    /// (waiting for the role: tenure gives up, 128+N); SIGUSR1, SIGUSR2 and SIGALRM are
    /// forwarded too (waiting: ignored). SIGTTOU and SIGTTIN do not stop tenure.
    ///
    /// Ctrl-Z (SIGTSTP) stops the command's processes and then tenure; SIGCONT resumes
    /// them, or stops them for good if the lease was lost meanwhile. If tenure alone is
    /// stopped (SIGSTOP) or wedged, its guard, a process of its own holding the same
    /// deadline, SIGKILLs the command before the lease can pass on; only with the guard
    /// stopped too (or the whole host frozen) does a fence (`tenure fence`) have to keep
    /// the command's writes out.
    Run {
        /// The role to lead (one singleton job or resource).
        #[arg(long, required_unless_present = "group", conflicts_with = "group")]
        role: Option<String>,
        /// Join shard group GROUP instead: run the command once per shard this member
        /// owns (TENURE_SHARD, TENURE_SHARDS, TENURE_ROLE=GROUP/k and that shard's
        /// TENURE_FENCING_TOKEN), stopping it when the shard moves or is lost. Needs
        /// --shards; --node-id names the member (default: unique per process).
        #[arg(long, requires = "shards", conflicts_with_all = ["no_wait", "wait_timeout"])]
        group: Option<String>,
        /// How many shards the group has (1 to 100000); with --group.
        #[arg(long, requires = "group")]
        shards: Option<u32>,
        /// How long a term lasts without renewal. The other timings default to fractions
        /// of it, so --ttl alone always works.
        #[arg(long, default_value = "15s", value_parser = parse_duration)]
        ttl: Duration,
        /// How often the leader renews. Default: --ttl / 3 (5s with the default --ttl),
        /// less if --kill-after leaves less room. `-v` logs the values in effect.
        #[arg(long, value_parser = parse_duration)]
        renew_every: Option<Duration>,
        /// How often a waiting instance retries when not woken sooner.
        #[arg(long, default_value = "2s", value_parser = parse_duration)]
        retry_every: Duration,
        /// Owner label (default: the host name). It is a label, not the owner id: tenure
        /// appends its process id and a random suffix, so two processes given the same
        /// label are two owners and never lead at once ($TENURE_OWNER has the full id).
        #[arg(long)]
        owner: Option<String>,
        /// Exit at once (code 75) if another owner leads.
        #[arg(long, conflicts_with = "wait_timeout")]
        no_wait: bool,
        /// Give up (code 124) if not leader within this long.
        #[arg(long, value_parser = parse_duration)]
        wait_timeout: Option<Duration>,
        /// Stopping the command: SIGTERM, then SIGKILL after this long. Default: --ttl / 4,
        /// at most 5s (3.75s with the default --ttl). Leadership ends this long, plus
        /// 500ms (or --ttl / 10 if less), before the lease could expire.
        #[arg(long, value_parser = parse_duration)]
        kill_after: Option<Duration>,
        /// Also heartbeat membership as this node while running.
        #[arg(long)]
        node_id: Option<String>,
        /// A value each of this instance's terms advertises, where followers reach the
        /// leader (a URL, host:port; at most 1024 bytes): `tenure leader` and /leader
        /// show it, and the command gets it as TENURE_LEADER_VALUE.
        #[arg(long, value_name = "VALUE", conflicts_with = "group")]
        advertise: Option<String>,
        // An attribute, not a doc comment: rustdoc would read `[IPV6]:PORT` as a link.
        #[arg(
            long,
            value_name = "ADDR",
            value_parser = exporter::parse_addr,
            help = concat!(
                "Serve Prometheus /metrics, /healthz and /leader on this address: IP:PORT, ",
                "[IPV6]:PORT, localhost:PORT, or :PORT / PORT for 127.0.0.1:PORT. Port 0 picks ",
                "a free port; the address is printed on stderr (\"tenure: metrics on http://...\")"
            )
        )]
        metrics_addr: Option<std::net::SocketAddr>,
        #[command(flatten)]
        store: StoreArg,
        /// The command to run, after `--`.
        #[arg(last = true, required = true, value_name = "CMD")]
        command: Vec<OsString>,
    },
    /// Show leases: role, holder, token, time to expiry.
    Status {
        /// Only this role.
        #[arg(long, conflicts_with = "group")]
        role: Option<String>,
        /// A shard group's shards (roles GROUP/0, GROUP/1, ...): shard, owner, token, and
        /// shards per member.
        #[arg(long)]
        group: Option<String>,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
        /// Refresh every second until interrupted.
        #[arg(long)]
        watch: bool,
        #[command(flatten)]
        store: StoreArg,
    },
    /// Show who leads a role and the value its term advertised (`run --advertise`),
    /// without contending: `ROLE: OWNER (token T) at VALUE`, or `ROLE: no leader`.
    Leader {
        /// The role.
        #[arg(long)]
        role: String,
        /// Then print each change of leader as it happens, until interrupted.
        #[arg(long)]
        watch: bool,
        /// One JSON object per line: {"role", "leader": {"owner", "fencing_token",
        /// "value"} or null}.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        store: StoreArg,
    },
    /// Ask the leader of a role to hand its term to a waiting contender (a deploy, a
    /// drain), and wait until it has: the leader stops its command, then passes the term
    /// in one store write (the fencing token grows by one). Exit 0 once handed over, 1
    /// when nobody leads, 75 when another handoff is being asked, 124 on timeout.
    Handoff {
        /// The role.
        #[arg(long)]
        role: String,
        /// The owner id of the contender to hand to (it must be waiting for the role);
        /// default: the one that has waited longest.
        #[arg(long, value_name = "OWNER")]
        to: Option<String>,
        /// How long to wait for the leader to hand over.
        #[arg(long, default_value = "30s", value_parser = parse_duration)]
        timeout: Duration,
        /// One JSON object: {"role", "outcome", "from", "to", "asked_by"}.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        store: StoreArg,
    },
    /// Show live members: last heartbeat, membership age, metadata.
    Members {
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        store: StoreArg,
    },
    /// Admit a fencing token for a resource (exit 0) or refuse a stale one (exit 3).
    Fence {
        /// The resource the token guards.
        #[arg(long)]
        resource: String,
        /// The token, usually "$TENURE_FENCING_TOKEN".
        #[arg(long)]
        token: String,
        #[command(flatten)]
        store: StoreArg,
    },
    /// Tell the stalled-leader story: a paused leader is fenced out.
    Demo {
        /// The store to run the demo on (default: in memory, on virtual time).
        #[arg(
            long,
            env = "TENURE_DEMO_STORE",
            default_value = "memory:",
            hide_env_values = true
        )]
        store: String,
    },
    /// Measure a store: cost per operation and failover, each beside the raw store.
    Bench(bench::BenchArgs),
    /// Inject faults into worker processes on a store and check the lease invariants.
    Chaos(chaos::ChaosArgs),
    /// One `tenure chaos` worker process (started by `tenure chaos`).
    #[command(hide = true)]
    ChaosWorker(chaos::WorkerFlags),
    /// Print a shell's completion script: `tenure completions bash > /etc/bash_completion.d/tenure`.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: CompletionShell,
    },
    /// Print the manual page (roff): `tenure man > tenure.1; man -l tenure.1`.
    Man,
}

/// The shells `tenure completions` writes for.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum CompletionShell {
    Bash,
    Zsh,
    Fish,
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
    // The guard is forked first, while this process has one thread (logging starts one).
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
                return runtime()?.block_on(async {
                    let stores = store::open(&url, member_ttl).await?;
                    run_shards::run(stores, args, group, shards, exporter).await
                });
            }
            runtime()?.block_on(async {
                let stores = store::open(&url, member_ttl).await?;
                run::run(stores, args, exporter).await
            })
        }
        Command::Status {
            role,
            group,
            json,
            watch,
            store: arg,
        } => {
            if let Some(group) = &group {
                tenure::lease::validate_name("group", group)
                    .map_err(|e| UsageError(format!("--group: {e}")))?;
            }
            let url = StoreUrl::parse(&arg.raw()?)?;
            url.require_shared("status")?;
            runtime()?.block_on(async {
                let stores = store::open(&url, arg.member_ttl()).await?;
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
            store: arg,
        } => {
            tenure::lease::validate_name("role", &role)
                .map_err(|e| UsageError(format!("--role: {e}")))?;
            let url = StoreUrl::parse(&arg.raw()?)?;
            url.require_shared("leader")?;
            runtime()?.block_on(async {
                let stores = store::open(&url, arg.member_ttl()).await?;
                inspect::leader(&stores, &role, json, watch).await
            })
        }
        Command::Handoff {
            role,
            to,
            timeout,
            json,
            store: arg,
        } => {
            tenure::handoff::request_role(&role).map_err(|e| UsageError(format!("--role: {e}")))?;
            if let Some(to) = &to {
                tenure::lease::validate_name("owner", to)
                    .map_err(|e| UsageError(format!("--to: {e}")))?;
            }
            if timeout.is_zero() {
                return Err(UsageError("--timeout: must be greater than zero".to_owned()).into());
            }
            let url = StoreUrl::parse(&arg.raw()?)?;
            url.require_shared("handoff")?;
            runtime()?.block_on(async {
                let stores = store::open(&url, arg.member_ttl()).await?;
                handoff::handoff(&stores, &role, to.as_deref(), timeout, json).await
            })
        }
        Command::Members { json, store: arg } => {
            let url = StoreUrl::parse(&arg.raw()?)?;
            url.require_shared("members")?;
            runtime()?.block_on(async {
                let stores = store::open(&url, arg.member_ttl()).await?;
                inspect::members(&stores, json).await
            })
        }
        Command::Fence {
            resource,
            token,
            store: arg,
        } => {
            let url = StoreUrl::parse(&arg.raw()?)?;
            url.require_shared("fence")?;
            let token = inspect::parse_token(&token)?;
            runtime()?.block_on(async {
                let stores = store::open(&url, arg.member_ttl()).await?;
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

/// Flag-level checks, so messages name the flags rather than the library's options.
/// The shard-group flags, checked before the store is opened.
fn check_group_flags(args: &run::RunArgs, group: &str, shards: u32) -> Result<(), UsageError> {
    let node_id = args.node_id.clone().unwrap_or_else(|| "node".to_owned());
    let options = run_shards::options(args, group, shards, node_id);
    match options.validate() {
        Ok(()) => Ok(()),
        Err(tenure::Error::InvalidArgument { field, reason }) => {
            let flag = match field {
                "group" => "--group",
                "shards" => "--shards",
                "renew_interval" => "--renew-every",
                "retry_interval" => "--retry-every",
                "work_grace" => "--kill-after",
                other => other,
            };
            Err(UsageError(format!("{flag}: {reason}")))
        }
        Err(other) => Err(UsageError(other.to_string())),
    }
}

fn check_run_flags(args: &run::RunArgs) -> Result<(), UsageError> {
    let show = |d: Duration| output::human(d);
    // Names are checked here, before the store is opened, so a bad one creates nothing.
    let names = [
        ("--role", "role", Some(&args.role)),
        ("--owner", "owner", args.owner.as_ref()),
        ("--node-id", "node_id", args.node_id.as_ref()),
    ];
    for (flag, field, value) in names {
        let Some(value) = value else { continue };
        if let Err(tenure::Error::InvalidArgument { reason, .. }) =
            tenure::lease::validate_name(field, value)
        {
            return Err(UsageError(format!("{flag} {value:?} {reason}")));
        }
    }
    if let Err(tenure::Error::InvalidArgument { reason, .. }) =
        tenure::lease::validate_value("advertise", args.advertise.as_deref())
    {
        return Err(UsageError(format!("--advertise {reason}")));
    }
    if args.ttl.is_zero() {
        return Err(UsageError("--ttl must be greater than 0s".to_owned()));
    }
    if args.renew_every.is_some_and(|d| d.is_zero()) || args.retry_every.is_zero() {
        return Err(UsageError(
            "--renew-every and --retry-every must be greater than 0s".to_owned(),
        ));
    }
    if let Some(renew_every) = args.renew_every.filter(|d| *d >= args.ttl) {
        return Err(UsageError(format!(
            "--renew-every ({}) must be less than --ttl ({})",
            show(renew_every),
            show(args.ttl)
        )));
    }
    if let Some(label) = &args.owner {
        if let Err(tenure::Error::InvalidArgument { reason, .. }) =
            tenure::owner_id_with_label(label)
        {
            return Err(UsageError(format!("--owner {reason}")));
        }
    }
    // A derived --kill-after always fits; an explicit one must leave time to lead.
    let window = args.options().local_window();
    if let Some(kill_after) = args.kill_after.filter(|_| args.work_grace() >= window) {
        return Err(UsageError(format!(
            "--kill-after ({}) plus the kill margin ({}) must be less than --ttl less its \
             clock-drift allowance ({}): the command must be dead before the lease can expire",
            show(kill_after),
            show(args.work_grace() - kill_after),
            show(window)
        )));
    }
    // Defaults derived from --ttl always fit; explicit values may not.
    if let Err(tenure::Error::InvalidArgument { reason, .. }) = args.options().validate() {
        let given = |value: Option<Duration>, shown: Duration| match value {
            Some(_) => show(shown),
            None => format!("{} (derived from --ttl)", show(shown)),
        };
        return Err(UsageError(format!(
            "--ttl {}, --renew-every {} and --kill-after {} do not fit: {reason}; \
             the command must be stopped (--kill-after) before the lease can expire, \
             with time to renew before that",
            show(args.ttl),
            given(args.renew_every, args.renew_every()),
            given(args.kill_after, args.kill_after())
        )));
    }
    if args
        .command
        .first()
        .is_some_and(|program| program.is_empty())
    {
        return Err(UsageError("the command after -- is empty".to_owned()));
    }
    Ok(())
}

/// Log lines buffered for stderr before more are dropped.
const LOG_BUFFER_LINES: usize = 4096;

/// Logs to stderr through a buffer that a thread of its own drains, dropping lines when
/// it is full: a stderr nobody reads (a wedged log shipper, a stopped terminal) must
/// never block the runtime thread that renews the lease and stops the command in time.
/// `tenure: ...` messages ([`say`]) go through the same writer. The guard flushes what is
/// buffered when `main` returns.
fn init_logging(
    format: LogFormat,
    verbose: u8,
    quiet: bool,
) -> tracing_appender::non_blocking::WorkerGuard {
    use tracing_subscriber::EnvFilter;
    let (stderr, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        // The default buffer (128,000 lines) is a channel allocated and written in full
        // up front: about 4 MB of page faults, the largest single cost of a short `tenure
        // run` (a profile of `run -- true`). tenure logs a few lines per term.
        .buffered_lines_limit(LOG_BUFFER_LINES)
        .lossy(true)
        .thread_name("tenure-logs")
        .finish(std::io::stderr());
    say::install(stderr.clone());
    let default = match verbose {
        0 if quiet => "error",
        // kube's client logs an error for every failed request, which tenure reports
        // (and retries) itself, with the cause: shown from -v on.
        0 => "warn,kube_client=off",
        1 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour_on_stderr())
        .with_writer(stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    guard
}

/// Colour only for a person at a terminal: not into a file or pipe, and not when
/// `NO_COLOR` is set to anything non-empty (the NO_COLOR convention).
fn colour_on_stderr() -> bool {
    use std::io::IsTerminal;
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|value| !value.is_empty());
    !no_color && std::io::stderr().is_terminal()
}
