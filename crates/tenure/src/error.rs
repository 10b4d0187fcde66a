//! The one error type of tenure: what went wrong, in a form a caller can match on.

use crate::FencingToken;

/// A boxed cause from a backend or from user work.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Result alias used across tenure.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything a tenure call can fail with.
///
/// Messages are lower case, carry no URL or password, and keep the backend's cause
/// reachable through [`std::error::Error::source`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The caller passed a value the contract does not allow; `field` names it.
    #[error("invalid {field}: {reason}")]
    InvalidArgument {
        /// The argument or option that is wrong (`role`, `ttl`, `renew_interval`, ...).
        field: &'static str,
        /// What is wrong with it and what is expected.
        reason: String,
    },
    /// The store failed or could not be reached; `source` is the backend's own error.
    #[error("{backend} store: {message}")]
    Store {
        /// Which backend failed (`memory`, `sqlite`, `postgres`, `etcd`).
        backend: &'static str,
        /// What tenure was doing when it failed.
        message: String,
        /// The backend's cause.
        #[source]
        source: Option<BoxError>,
    },
    /// A fence refused a token lower than one it already admitted.
    #[error("fenced: token {presented} is older than the highest admitted token {highest}")]
    Fenced {
        /// The token the writer presented.
        presented: FencingToken,
        /// The highest token the fence has admitted.
        highest: FencingToken,
    },
    /// The leader's work returned an error; the lease was released.
    #[error("leader work failed")]
    Work(#[source] BoxError),
    /// The leader's work panicked; the panic was contained and the lease released.
    #[error("leader work panicked: {0}")]
    WorkPanicked(String),
    /// The session has ended (expired or closed); sessions are never revived.
    #[error("session {0} has ended")]
    SessionEnded(crate::session::SessionId),
}

impl Error {
    /// Builds an [`Error::InvalidArgument`].
    pub fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidArgument {
            field,
            reason: reason.into(),
        }
    }

    /// Builds an [`Error::Store`] with a cause.
    pub fn store(
        backend: &'static str,
        message: impl Into<String>,
        source: impl Into<BoxError>,
    ) -> Self {
        Error::Store {
            backend,
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// Builds an [`Error::Store`] without an underlying cause.
    pub fn store_msg(backend: &'static str, message: impl Into<String>) -> Self {
        Error::Store {
            backend,
            message: message.into(),
            source: None,
        }
    }

    /// True for errors worth retrying (store failures); false for caller mistakes and
    /// fencing rejections, which retrying cannot fix.
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::Store { .. })
    }
}
