//! Messages for the person running tenure (`tenure: ...` lines on stderr), written through
//! the logs' non-blocking writer rather than with `eprintln!`.
//!
//! `eprintln!` writes on the calling thread: on `tenure run`'s runtime thread a stderr pipe
//! nobody reads (a wedged log shipper, a terminal stopped with Ctrl-S) would block the
//! renewals and the stopping of the command, and a pipe whose reader has gone
//! (`tenure run ... 2>&1 | head -1`) would make it panic on EPIPE. Through the writer a
//! message is queued, or dropped when the queue is full, and a failed write is ignored.
//! (Rust starts tenure with SIGPIPE ignored, so EPIPE is an error, never a signal.)

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether messages go through the logs' writer (set once logging is set up).
static VIA_LOGS: AtomicBool = AtomicBool::new(false);

/// Sends later messages through the logs' writer ([`crate::logging::writer`]), so they keep
/// their order with the logs.
pub fn install() {
    VIA_LOGS.store(true, Ordering::Release);
}

/// Writes one line; never blocks once [`install`] was called, never panics. Use [`say!`].
pub fn line(message: std::fmt::Arguments<'_>) {
    let text = format!("{message}\n");
    if VIA_LOGS.load(Ordering::Acquire) {
        let _ = crate::logging::writer().write_all(text.as_bytes());
    } else {
        // Before logging is set up nothing renews yet, so a blocking write cannot cost a
        // term; it still must not panic.
        let _ = std::io::stderr().write_all(text.as_bytes());
    }
}

/// `eprintln!` that never blocks the runtime thread nor panics: see the module.
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::say::line(format_args!($($arg)*))
    };
}
pub(crate) use say;
