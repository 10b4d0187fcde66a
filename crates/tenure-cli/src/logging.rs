//! tenure's logs and messages on stderr: formats, verbosity, colour, and the
//! non-blocking writer both go through.

use std::sync::OnceLock;

use parking_lot::Mutex;
use tracing_appender::non_blocking::{NonBlocking, NonBlockingBuilder, WorkerGuard};

use crate::cli::LogFormat;
use crate::say;

/// Log lines buffered for stderr before more are dropped.
const LOG_BUFFER_LINES: usize = 4096;

/// The logs' writer, made at the first line written (see [`writer`]).
static WRITER: OnceLock<NonBlocking> = OnceLock::new();

/// The writer's thread, flushed and joined when [`FlushOnExit`] is dropped.
static WORKER: Mutex<Option<WorkerGuard>> = Mutex::new(None);

/// Logs to stderr through a buffer that a thread of its own drains, dropping lines when
/// it is full: a stderr nobody reads (a wedged log shipper, a stopped terminal) must
/// never block the runtime thread that renews the lease and stops the command in time.
/// `tenure: ...` messages ([`say`]) go through the same writer. The returned value flushes
/// what is buffered when `main` drops it.
///
/// The writer and its thread are made when the first line is written, not here: a `tenure
/// run` that has nothing to say (the usual quiet run) starts no thread for it.
pub(crate) fn init_logging(format: LogFormat, verbose: u8, quiet: bool) -> FlushOnExit {
    use tracing_subscriber::EnvFilter;
    say::install();
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
        .with_writer(writer);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    FlushOnExit
}

/// The non-blocking writer of logs and messages to stderr, made (with its thread) on first
/// use.
pub(crate) fn writer() -> NonBlocking {
    WRITER
        .get_or_init(|| {
            let (stderr, worker) = NonBlockingBuilder::default()
                // The default buffer (128,000 lines) is a channel allocated and written in
                // full up front: about 4 MB of page faults, the largest single cost of a
                // short `tenure run` (a profile of `run -- true`). tenure logs a few lines
                // per term.
                .buffered_lines_limit(LOG_BUFFER_LINES)
                .lossy(true)
                .thread_name("tenure-logs")
                .finish(std::io::stderr());
            *WORKER.lock() = Some(worker);
            stderr
        })
        .clone()
}

/// Flushes the logs when dropped (at the end of `main`), if any line was written.
pub(crate) struct FlushOnExit;

impl Drop for FlushOnExit {
    fn drop(&mut self) {
        drop(WORKER.lock().take());
    }
}

/// Colour only for a person at a terminal: not into a file or pipe, and not when
/// `NO_COLOR` is set to anything non-empty (the NO_COLOR convention).
fn colour_on_stderr() -> bool {
    use std::io::IsTerminal;
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|value| !value.is_empty());
    !no_color && std::io::stderr().is_terminal()
}
