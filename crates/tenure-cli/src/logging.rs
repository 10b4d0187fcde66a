//! tenure's logs and messages on stderr: formats, verbosity, colour, and the
//! non-blocking writer both go through.

use crate::cli::LogFormat;
use crate::say;

/// Log lines buffered for stderr before more are dropped.
const LOG_BUFFER_LINES: usize = 4096;

/// Logs to stderr through a buffer that a thread of its own drains, dropping lines when
/// it is full: a stderr nobody reads (a wedged log shipper, a stopped terminal) must
/// never block the runtime thread that renews the lease and stops the command in time.
/// `tenure: ...` messages ([`say`]) go through the same writer. The guard flushes what is
/// buffered when `main` returns.
pub(crate) fn init_logging(
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
