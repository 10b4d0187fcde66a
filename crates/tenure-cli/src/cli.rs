//! The command line: every subcommand and flag, as clap reads them and as `--help`,
//! `tenure man` and the shell completions show them.

use std::ffi::OsString;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::parse::parse_duration;
use crate::{bench, chaos, exporter, output, store, UsageError};

#[derive(Parser, Debug)]
#[command(
    name = "tenure",
    version,
    about = "Fenced leader election and membership: run a command as a cluster-wide singleton",
    after_help = "Exit codes: 0 ok, 1 failure, 2 usage, 3 fenced, 4 leadership lost, 75 busy \
                  (--no-wait), 124 wait timeout, 125 tenure failed, 126/127 command not \
                  executable/found; otherwise the command's own code (128+N if killed by signal N)."
)]
pub(crate) struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub(crate) log_format: LogFormat,
    /// More logs (-v: debug, -vv: trace). RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub(crate) verbose: u8,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub(crate) enum LogFormat {
    Text,
    Json,
}

/// `--store`, shared by every command that talks to a store.
#[derive(Args, Debug, Clone)]
pub(crate) struct StoreArg {
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
    pub(crate) fn member_ttl(&self) -> Duration {
        self.member_ttl.unwrap_or(DEFAULT_MEMBER_TTL)
    }

    /// The membership TTL of a shard group member whose session lasts `ttl`: `ttl`
    /// unless given. A membership that outlives the session keeps a killed member the
    /// target of its shards after they are free, so they would wait for the orphan
    /// rescue or the lapse (two to three TTLs); a longer one is refused.
    pub(crate) fn group_member_ttl(&self, ttl: Duration) -> Result<Duration, UsageError> {
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

    pub(crate) fn raw(&self) -> anyhow::Result<String> {
        match &self.url {
            Some(url) => Ok(url.clone()),
            None => store::default_url(),
        }
    }
}

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
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
    /// Move every shard away from one member of a shard group before it is stopped (a
    /// deploy, maintenance), and wait until they all run elsewhere: the member leaves the
    /// group and hands its shards over, a few at a time, each under a new token. It stays
    /// out of the group for --hold, so it can be stopped meanwhile; --cancel lets it join
    /// again at once. Exit 0 once drained (or cancelled), 1 when --cancel finds no drain,
    /// 75 when a drain of it is already in force, 124 when it still held shards at
    /// --timeout.
    Drain {
        /// The shard group.
        #[arg(long)]
        group: String,
        /// The member's node id (its --node-id).
        #[arg(long, value_name = "ID")]
        node: String,
        /// How long the member stays drained.
        #[arg(long, default_value = "10m", value_parser = parse_duration)]
        hold: Duration,
        /// How long to wait for its shards to run elsewhere.
        #[arg(long, default_value = "60s", value_parser = parse_duration)]
        timeout: Duration,
        /// End the drain in force instead: the member joins the group again.
        #[arg(long, conflicts_with_all = ["hold", "timeout"])]
        cancel: bool,
        /// One JSON object: {"group", "node", "outcome", "held", "left", "took_ms",
        /// "asked_by"}.
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
pub(crate) enum CompletionShell {
    Bash,
    Zsh,
    Fish,
}
