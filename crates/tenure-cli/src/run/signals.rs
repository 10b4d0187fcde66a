//! The signals tenure listens for and what each asks: give up waiting, stop the command,
//! or only be forwarded to it.

use anyhow::Context;
use nix::sys::signal::{SigHandler, Signal};
use tokio::signal::unix::{signal, SignalKind};

/// Whether a signal, while waiting for the role, asks tenure to give up (and a shard-group
/// member to stop); see [`starts_kill_clock`] for the signals forwarded to a command.
pub(crate) fn asks_to_stop(signal: Signal) -> bool {
    matches!(
        signal,
        Signal::SIGINT | Signal::SIGTERM | Signal::SIGHUP | Signal::SIGQUIT
    )
}

/// Whether a forwarded signal asks the command to end, so that it is killed if it is still
/// there `--kill-after` later. Not SIGHUP: to a running service it means "reload your
/// configuration" far more often than "your terminal is gone", and a reload must not be
/// turned into a kill.
pub(super) fn starts_kill_clock(signal: Signal) -> bool {
    matches!(signal, Signal::SIGINT | Signal::SIGTERM | Signal::SIGQUIT)
}

/// Stop signals of terminal I/O from a background process group, ignored by tenure.
pub(super) const TTY_STOPS: [Signal; 2] = [Signal::SIGTTOU, Signal::SIGTTIN];

/// The signals tenure listens for, as one stream: every one whose default action would end
/// tenure (or, for SIGTSTP, stop it) without stopping the command and releasing the lease.
const LISTENED: [Signal; 9] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
    Signal::SIGALRM,
    Signal::SIGTSTP,
    Signal::SIGCONT,
];

/// Ignores SIGTTOU and SIGTTIN, so that a background tenure writing to a terminal with
/// `stty tostop` is not stopped: a stopped tenure cannot renew, nor stop its command when
/// the term ends. Called before anything is written; the command gets the defaults back.
pub fn ignore_tty_stops() -> anyhow::Result<()> {
    for stop in TTY_STOPS {
        // SAFETY: SIG_IGN installs no handler, so nothing runs in signal context.
        unsafe { nix::sys::signal::signal(stop, SigHandler::SigIgn) }
            .with_context(|| format!("cannot ignore {stop}"))?;
    }
    Ok(())
}

/// The signals of [`LISTENED`], as one stream.
pub(crate) struct Signals {
    streams: Vec<(Signal, tokio::signal::unix::Signal)>,
}

impl Signals {
    /// Listens for the signals of [`LISTENED`].
    pub(crate) fn new() -> anyhow::Result<Self> {
        let streams = LISTENED
            .iter()
            .map(|&which| {
                signal(SignalKind::from_raw(which as i32))
                    .map(|stream| (which, stream))
                    .with_context(|| format!("cannot listen for {which}"))
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(Signals { streams })
    }

    /// The next signal.
    pub(crate) async fn recv(&mut self) -> Option<Signal> {
        std::future::poll_fn(|cx| {
            // Of two pending signals the first listed wins; each is seen in turn.
            for (which, stream) in &mut self.streams {
                if let std::task::Poll::Ready(received) = stream.poll_recv(cx) {
                    return std::task::Poll::Ready(received.map(|()| *which));
                }
            }
            std::task::Poll::Pending
        })
        .await
    }
}
