//! `sqlite:` URLs: the file they name, and opening it.

use std::path::PathBuf;

use tenure::{Error, Result};

use crate::database::{SqliteDatabase, SqliteOptions};

/// Parses `sqlite:PATH` or `sqlite://PATH` into the file path.
///
/// The error never repeats the URL; it says what shape was expected.
pub fn path_from_url(url: &str) -> Result<PathBuf> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
        .ok_or_else(|| {
            Error::invalid(
                "url",
                "a sqlite url must start with sqlite: or sqlite:// (e.g. sqlite:/var/lib/tenure.db)",
            )
        })?;
    if rest.is_empty() {
        return Err(Error::invalid(
            "url",
            "the sqlite url has no file path (e.g. sqlite:/var/lib/tenure.db)",
        ));
    }
    if rest == ":memory:" || rest.starts_with(":memory:") {
        return Err(Error::invalid(
            "url",
            "an in-memory sqlite database is not supported: leases must be shared and durable; \
             use a file path",
        ));
    }
    if rest.contains('?') {
        return Err(Error::invalid(
            "url",
            "sqlite url query parameters are not supported: give only the file path",
        ));
    }
    // Caught here, or the file system refuses it later as a store failure, not bad usage.
    if rest.contains('\0') {
        return Err(Error::invalid(
            "url",
            "the sqlite url's path holds a NUL byte, which no file name can",
        ));
    }
    Ok(PathBuf::from(rest))
}

/// Opens the database named by a `sqlite:PATH` or `sqlite://PATH` url
/// (`sqlite:///abs/path` and `sqlite:/abs/path` are the same file).
pub async fn connect(url: &str) -> Result<SqliteDatabase> {
    connect_with(url, SqliteOptions::default()).await
}

/// [`connect`] with options.
pub async fn connect_with(url: &str, options: SqliteOptions) -> Result<SqliteDatabase> {
    let path = path_from_url(url)?;
    SqliteDatabase::open_with(path, options).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn urls() {
        assert_eq!(
            path_from_url("sqlite:/a/b.db").unwrap(),
            Path::new("/a/b.db")
        );
        assert_eq!(
            path_from_url("sqlite:///a/b.db").unwrap(),
            Path::new("/a/b.db")
        );
        assert_eq!(
            path_from_url("sqlite://rel.db").unwrap(),
            Path::new("rel.db")
        );
        assert_eq!(path_from_url("sqlite:rel.db").unwrap(), Path::new("rel.db"));
        for bad in [
            "",
            "postgres://u:secret@h/db",
            "sqlite:",
            "sqlite://",
            "sqlite::memory:",
            "sqlite:/a.db?mode=ro",
        ] {
            match path_from_url(bad) {
                Err(Error::InvalidArgument {
                    field: "url",
                    reason,
                }) => {
                    assert!(!reason.contains("secret"), "{reason}");
                }
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }
}
