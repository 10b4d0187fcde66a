//! `postgres://` URLs: parsed before anything connects, and searched for the password
//! in every form an error message could repeat it.

use std::str::FromStr;

use percent_encoding::{percent_decode_str, utf8_percent_encode, NON_ALPHANUMERIC};
use sqlx::postgres::PgConnectOptions;
use tenure::{Error, Result};

const SHAPE: &str = "expected postgres://USER:PASSWORD@HOST:PORT/DATABASE";

/// The query parameters sqlx understands (besides `options[NAME]`). sqlx logs any other
/// one with its value at warn level, and that value may be a password under a misspelt
/// name (`pasword=...`), so such a URL is refused before sqlx sees it.
const PARAMETERS: &[&str] = &[
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
    "options",
];

/// Parses a `postgres://` or `postgresql://` URL into sqlx's options (with
/// `application_name` tenure), without connecting. A malformed URL, another scheme or
/// a query parameter sqlx does not know is `InvalidArgument` naming `url`, and the
/// message never repeats any part of the URL.
pub fn connect_options(url: &str) -> Result<PgConnectOptions> {
    let url_bytes = cleaned(url).into_bytes();
    let has_scheme = |scheme: &str| {
        url_bytes
            .get(..scheme.len())
            .is_some_and(|start| start.eq_ignore_ascii_case(scheme.as_bytes()))
    };
    if !(has_scheme("postgres://") || has_scheme("postgresql://")) {
        return Err(Error::invalid(
            "url",
            format!("must start with postgres:// or postgresql://; {SHAPE}"),
        ));
    }
    for (index, (key, _)) in query_pairs(url).into_iter().enumerate() {
        let known = PARAMETERS.contains(&key.as_str())
            || (key.starts_with("options[") && key.ends_with(']'));
        if !known {
            // Neither the name nor the value is shown: either may be a misplaced password.
            return Err(Error::invalid(
                "url",
                format!(
                    "query parameter {} is not one tenure knows; known: {}, options[NAME]",
                    index + 1,
                    PARAMETERS.join(", ")
                ),
            ));
        }
    }
    let options = PgConnectOptions::from_str(url).map_err(|_| {
        // The parser's message may quote the URL; say what is expected instead.
        Error::invalid("url", format!("is not a valid PostgreSQL URL; {SHAPE}"))
    })?;
    Ok(options.application_name("tenure"))
}

/// The URL as the WHATWG parser sqlx uses reads it: tabs and newlines anywhere are
/// dropped, leading and trailing controls and spaces trimmed.
fn cleaned(url: &str) -> String {
    url.trim_matches(|c: char| c <= ' ')
        .chars()
        .filter(|c| !matches!(c, '\t' | '\n' | '\r'))
        .collect()
}

/// The query's name/value pairs, decoded as sqlx decodes them (`+` is a space, then
/// percent-escapes): the query runs from the first `?` to the fragment's `#`.
fn query_pairs(url: &str) -> Vec<(String, String)> {
    let url = cleaned(url);
    let before_fragment = url.split('#').next().unwrap_or("");
    let Some((_, query)) = before_fragment.split_once('?') else {
        return Vec::new();
    };
    let decode = |s: &str| {
        percent_decode_str(&s.replace('+', " "))
            .decode_utf8_lossy()
            .into_owned()
    };
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(key), decode(value))
        })
        .collect()
}

/// Every form of the URL's password an error message might repeat (as written,
/// decoded, and escaped again), longest first so that scrubbing one form never leaves
/// the tail of a longer one.
pub(crate) fn url_secrets(url: &str) -> Vec<String> {
    let mut passwords = Vec::new();
    let cleaned = cleaned(url);
    let after_scheme = cleaned
        .split_once("://")
        .map_or(cleaned.as_str(), |(_, rest)| rest);
    let authority = after_scheme.split(['/', '?', '#']).next().unwrap_or("");
    if let Some((userinfo, _)) = authority.rsplit_once('@') {
        if let Some((_, password)) = userinfo.split_once(':') {
            passwords.push(password.to_owned());
            passwords.push(
                percent_decode_str(password)
                    .decode_utf8_lossy()
                    .into_owned(),
            );
        }
    }
    for (key, value) in query_pairs(url) {
        if key == "password" {
            passwords.push(value);
        }
    }
    let mut secrets: Vec<String> = passwords
        .iter()
        .map(|p| utf8_percent_encode(p, NON_ALPHANUMERIC).to_string())
        .chain(passwords.iter().cloned())
        .filter(|s| !s.is_empty())
        .collect();
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    secrets.dedup();
    secrets
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_found_raw_and_decoded() {
        let secrets = url_secrets("postgres://bob:p%40ss@db:5432/x?sslmode=disable");
        assert!(secrets.contains(&"p%40ss".to_owned()));
        assert!(secrets.contains(&"p@ss".to_owned()));
        let secrets = url_secrets("postgres://db/x?user=bob&password=hunter2");
        assert!(secrets.contains(&"hunter2".to_owned()));
        assert!(url_secrets("postgres://bob@db/x").is_empty());
    }

    /// The query is decoded as sqlx decodes it: `+` is a space, and a parameter's name
    /// may be escaped too.
    #[test]
    fn query_passwords_are_found_as_sqlx_reads_them() {
        let secrets = url_secrets("postgres://db/x?passw%6Frd=a+b%2Bc");
        assert!(secrets.contains(&"a b+c".to_owned()), "{secrets:?}");
        let secrets = url_secrets("postgres://db/x?pass\tword=hunter2#x");
        assert!(secrets.contains(&"hunter2".to_owned()), "{secrets:?}");
        assert!(url_secrets("postgres://db/x#?password=no").is_empty());
    }

    proptest::proptest! {
        #![proptest_config(tenure_testkit::fuzz::config())]

        /// Whatever the password holds and wherever it sits, it is among the secrets.
        #[test]
        fn every_password_is_found((secret, url) in tenure_testkit::fuzz::postgres_url()) {
            if url.ends_with(":throwaway") {
                // No password to find (and too many cases to reject).
                return Ok(());
            }
            let secrets = url_secrets(&url);
            proptest::prop_assert!(secrets.iter().any(|s| s == secret.raw()), "{url:?}: {secrets:?}");
        }
    }
}
