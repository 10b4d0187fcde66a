//! Turning sqlx failures into tenure's [`Error::Store`], without leaking secrets.

use tenure::{BoxError, Error};

/// The backend name carried by every [`Error::Store`] from this crate.
pub(crate) const BACKEND: &str = "postgres";

/// `Error::Store` with the sqlx error attached as the cause.
pub(crate) fn pg_error(message: impl Into<String>, error: sqlx::Error) -> Error {
    let message = message.into();
    let message = match sqlstate(&error).as_deref() {
        Some("42501") => format!(
            "{message}: permission denied (see the crate docs for the privileges tenure needs)"
        ),
        Some("25001") | Some("25P02") => {
            format!("{message}: not allowed in this transaction state")
        }
        _ => message,
    };
    Error::store(BACKEND, message, error)
}

/// The SQLSTATE of a database error, if it is one.
pub(crate) fn sqlstate(error: &sqlx::Error) -> Option<String> {
    match error {
        sqlx::Error::Database(db) => db.code().map(|c| c.into_owned()),
        _ => None,
    }
}

/// Like [`pg_error`], but if any part of the cause chain mentions one of `secrets`
/// (a password from the connection URL), the cause is replaced by a redacted copy.
pub(crate) fn pg_error_scrubbed(message: &str, error: sqlx::Error, secrets: &[String]) -> Error {
    let mut chain = error.to_string();
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        chain.push_str(": ");
        chain.push_str(&cause.to_string());
        source = cause.source();
    }
    let leaks = secrets
        .iter()
        .any(|secret| !secret.is_empty() && chain.contains(secret.as_str()));
    if !leaks {
        return pg_error(message, error);
    }
    let mut redacted = chain;
    for secret in secrets.iter().filter(|s| !s.is_empty()) {
        redacted = redacted.replace(secret.as_str(), "***");
    }
    let cause: BoxError = redacted.into();
    Error::store(BACKEND, message, cause)
}
