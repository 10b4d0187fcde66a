//! The one error type of the harness.

use std::io;

/// Why a throwaway server could not be started, stopped or queried.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ThrowawayError {
    /// A program the server needs is not installed.
    #[error("{program} not found ({looked_in}); install the Debian package `{package}`")]
    NotInstalled {
        /// The missing program.
        program: &'static str,
        /// Where it was looked for.
        looked_in: &'static str,
        /// The Debian package that provides it.
        package: &'static str,
    },
    /// A server program that the repository builds from Go modules (no Debian package
    /// carries it) is missing.
    #[error("{program} not found ({looked_in}); build it with `{build}`")]
    NotBuilt {
        /// The missing program.
        program: &'static str,
        /// Where it was looked for.
        looked_in: &'static str,
        /// The command that builds it.
        build: &'static str,
    },
    /// An operating-system call failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The server, or a tool run against it, failed; `detail` holds its output or log.
    #[error("{what}:\n{detail}")]
    Failed {
        /// What failed.
        what: String,
        /// The tool's output or the server's log.
        detail: String,
    },
}

impl ThrowawayError {
    /// A mapper from an I/O error, for `map_err`.
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(io::Error) -> ThrowawayError {
        let what = what.into();
        move |source| ThrowawayError::Io { what, source }
    }

    pub(crate) fn failed(what: impl Into<String>, detail: impl Into<String>) -> ThrowawayError {
        ThrowawayError::Failed {
            what: what.into(),
            detail: detail.into(),
        }
    }
}

/// The harness's result type.
pub type Result<T> = std::result::Result<T, ThrowawayError>;
