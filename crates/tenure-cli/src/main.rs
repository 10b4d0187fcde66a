//! `tenure`: fenced leader election from the shell.
//!
//! Exit codes are documented in [`exit`] and in the README.

mod demo;
mod store;

use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use crate::store::StoreUrl;

/// Exit codes shared by every subcommand.
pub mod exit {
    /// Success.
    pub const OK: u8 = 0;
    /// A runtime failure (store unreachable, I/O error, a broken invariant in the demo).
    pub const FAILURE: u8 = 1;
    /// Bad usage: unknown flag, malformed URL or duration, invalid option.
    pub const USAGE: u8 = 2;
}

#[derive(Parser, Debug)]
#[command(name = "tenure", version, about = "Fenced leader election and membership", long_about = None)]
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

#[derive(Subcommand, Debug)]
enum Command {
    /// Tell the stalled-leader story: a paused leader is fenced out.
    Demo {
        /// The store to run the demo on (default: in memory, on virtual time).
        #[arg(long, env = "TENURE_DEMO_STORE", default_value = "memory:")]
        store: String,
    },
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            let code = if error.use_stderr() { exit::USAGE } else { exit::OK };
            let _ = error.print();
            return ExitCode::from(code);
        }
    };
    // The demo narrates on stdout; its logs would only repeat the story.
    let quiet = matches!(cli.command, Command::Demo { .. });
    init_logging(cli.log_format, cli.verbose, quiet);
    match dispatch(cli.command) {
        Ok(code) => ExitCode::from(code),
        Err(error) => {
            eprintln!("tenure: {error:#}");
            let usage = error.chain().any(|cause| {
                matches!(
                    cause.downcast_ref::<tenure::Error>(),
                    Some(tenure::Error::InvalidArgument { .. })
                ) || cause.downcast_ref::<UsageError>().is_some()
            });
            ExitCode::from(if usage { exit::USAGE } else { exit::FAILURE })
        }
    }
}

/// A mistake on the command line, reported with exit code 2.
#[derive(Debug)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

fn usage(error: anyhow::Error) -> anyhow::Error {
    anyhow::Error::new(UsageError(format!("{error:#}")))
}

fn dispatch(command: Command) -> anyhow::Result<u8> {
    match command {
        Command::Demo { store } => {
            let url = StoreUrl::parse(&store).map_err(usage)?;
            match url {
                StoreUrl::Memory => {
                    // Virtual time: the story's seconds pass in milliseconds.
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .start_paused(true)
                        .build()?;
                    runtime.block_on(async {
                        let timing = demo::DemoTiming::fast();
                        let stores = store::memory(timing.ttl)?;
                        demo::run(
                            demo::DemoStores {
                                leases: stores.leases,
                                registry: stores.registry,
                                fence: stores.fence,
                            },
                            timing,
                            false,
                        )
                        .await
                    })?;
                }
            }
            Ok(exit::OK)
        }
    }
}

fn init_logging(format: LogFormat, verbose: u8, quiet: bool) {
    use tracing_subscriber::EnvFilter;
    let default = match verbose {
        0 if quiet => "error",
        0 => "warn",
        1 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}
