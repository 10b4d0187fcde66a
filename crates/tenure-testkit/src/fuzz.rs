//! Inputs for the parsers' property tests: random text, mutations of valid inputs, and
//! store URLs carrying a distinctive password that no error message may repeat.
//!
//! Every parser a user feeds (store URLs, durations, names, tokens) is run on three kinds
//! of input: valid ones, valid ones mutated (bytes inserted, deleted, replaced or
//! repeated; percent-escapes, huge ports, IPv6 brackets, userinfo, unicode, NUL), and
//! random text. The case count comes from `PROPTEST_CASES`, proptest's own variable;
//! without it each property runs [`DEFAULT_CASES`] cases, the depth of the debug run in
//! `.ci/run`.

use std::fmt;

use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::{Config, TestCaseError};

/// Cases per property when `PROPTEST_CASES` is not set.
pub const DEFAULT_CASES: u32 = 2_000;

/// The proptest configuration of every parser property: `PROPTEST_CASES` cases, or
/// [`DEFAULT_CASES`]. A failing input is not written to a regression file: each one found
/// is kept as a named regression test beside the property instead.
pub fn config() -> Config {
    let mut config = Config::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = DEFAULT_CASES;
    }
    config.failure_persistence = None;
    config
}

/// Fragments that mean something to one of the parsers, and a few that break naive code
/// (multi-byte and case-changing characters, NUL, numbers past every integer type).
const TRICKY: &[&str] = &[
    ":",
    "/",
    "//",
    "\\",
    "@",
    "[",
    "]",
    "%",
    "?",
    "#",
    "&",
    "=",
    ",",
    ".",
    "-",
    "+",
    " ",
    "\t",
    "\n",
    "\r",
    "\0",
    "\u{7f}",
    "\u{85}",
    "é",
    "İ",
    "ß",
    "𝄞",
    "\u{202e}",
    "\u{feff}",
    "\u{ff10}",
    "%00",
    "%zz",
    "%4",
    "%ff",
    "%c3%a9",
    "%2F",
    "%40",
    "[::1]",
    "[fe80::1%25eth0]",
    ":0",
    ":65535",
    ":65536",
    ":99999999999999999999",
    "user:pw@",
    "?password=",
    "&password=",
    "?sslmode=disable",
    ":memory:",
    "throwaway",
    "memory:",
    "sqlite:",
    "sqlite://",
    "postgres://",
    "postgresql://",
    "etcd://",
    "ns",
    "us",
    "µs",
    "ms",
    "s",
    "m",
    "h",
    "d",
    "w",
    "y",
    "-1",
    "0",
    "18446744073709551615",
    "18446744073709551616",
    "9223372036854775807",
    "9223372036854775808",
    "1e9",
    "0x10",
];

/// One piece of generated text: a tricky fragment, a short word, any character, or a number.
fn piece() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => select(TRICKY).prop_map(str::to_owned),
        2 => "[a-zA-Z0-9]{1,6}",
        2 => any::<char>().prop_map(String::from),
        1 => any::<u64>().prop_map(|n| n.to_string()),
    ]
}

/// Random text: arbitrary characters, or a run of pieces that look like parser input.
pub fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        proptest::collection::vec(any::<char>(), 0..40).prop_map(String::from_iter),
        proptest::collection::vec(piece(), 0..12).prop_map(|pieces| pieces.concat()),
    ]
}

/// One edit of a valid input; positions are taken modulo the input's length.
#[derive(Clone, Debug)]
enum Edit {
    Insert(usize, String),
    Delete(usize, usize),
    Replace(usize, String),
    Truncate(usize),
    Repeat(usize, usize, usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        4 => (any::<usize>(), piece()).prop_map(|(at, p)| Edit::Insert(at, p)),
        3 => (any::<usize>(), 1usize..8).prop_map(|(at, n)| Edit::Delete(at, n)),
        3 => (any::<usize>(), piece()).prop_map(|(at, p)| Edit::Replace(at, p)),
        1 => any::<usize>().prop_map(Edit::Truncate),
        // Long inputs: past every length limit (255-byte names, 1 KiB prefixes).
        1 => (any::<usize>(), 1usize..8, 1usize..400).prop_map(|(at, n, k)| Edit::Repeat(at, n, k)),
    ]
}

fn apply(input: &str, edits: &[Edit]) -> String {
    let mut chars: Vec<char> = input.chars().collect();
    for edit in edits {
        let len = chars.len();
        let pos = |at: usize| at % (len + 1);
        match edit {
            Edit::Insert(at, piece) => {
                let at = pos(*at);
                chars.splice(at..at, piece.chars());
            }
            Edit::Delete(at, n) => {
                let at = pos(*at);
                chars.drain(at..(at + n).min(len));
            }
            Edit::Replace(at, piece) => {
                let at = pos(*at);
                chars.splice(at..(at + 1).min(len), piece.chars());
            }
            Edit::Truncate(at) => chars.truncate(pos(*at)),
            Edit::Repeat(at, n, times) => {
                let at = pos(*at);
                let run: Vec<char> = chars[at..(at + n).min(len)].to_vec();
                let copies: Vec<char> = std::iter::repeat_n(run, *times).flatten().collect();
                chars.splice(at..at, copies);
            }
        }
    }
    chars.into_iter().collect()
}

/// `valid` inputs with one to four edits applied.
pub fn mutated(valid: impl Strategy<Value = String>) -> impl Strategy<Value = String> {
    (valid, proptest::collection::vec(edit(), 1..5))
        .prop_map(|(input, edits)| apply(&input, &edits))
}

/// Valid inputs, mutated ones (most) and random text.
pub fn inputs(valid: impl Strategy<Value = String> + 'static) -> impl Strategy<Value = String> {
    let valid = valid.boxed();
    prop_oneof![
        1 => valid.clone(),
        3 => mutated(valid),
        1 => text(),
    ]
}

/// A password distinctive enough that any 8 consecutive characters of its alphanumeric
/// core found in a message are a leak. Its tail may hold characters a URL must escape,
/// so that raw, escaped and decoded forms all differ.
#[derive(Clone)]
pub struct Secret {
    core: String,
    raw: String,
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({:?})", self.raw)
    }
}

const ESCAPED: &[&str] = &[
    "@", ":", "/", "%", "?", "#", "&", "=", " ", "+", "é", "[", "]", ",",
];

/// A random [`Secret`].
pub fn secret() -> impl Strategy<Value = Secret> {
    (
        "[a-zA-Z0-9]{16}",
        proptest::collection::vec(select(ESCAPED), 0..4),
    )
        .prop_map(|(core, tail)| Secret {
            raw: format!("{core}{}", tail.concat()),
            core,
        })
}

impl Secret {
    /// The password itself.
    pub fn raw(&self) -> &str {
        &self.raw
    }

    /// The password as written into a URL: everything but letters and digits escaped.
    pub fn escaped(&self) -> String {
        utf8_percent_encode(&self.raw, NON_ALPHANUMERIC).to_string()
    }

    /// Fails the case if `message` holds the password in any form: raw, escaped, or
    /// decoded, which all keep the core's letters and digits, so any 8 of them in a row
    /// count (a message that printed a truncated or filtered copy is caught too).
    pub fn check_absent(&self, message: &str) -> Result<(), TestCaseError> {
        let core = self.core.as_bytes();
        for window in core.windows(8) {
            let window = String::from_utf8_lossy(window);
            prop_assert!(
                !message.contains(window.as_ref()),
                "the message holds {window:?} of the password {:?}: {message:?}",
                self.raw
            );
        }
        Ok(())
    }
}

/// Fails the case unless `error` is `InvalidArgument` naming one of `fields`, with a
/// message that holds no trace of `secret`.
pub fn check_refusal(
    input: &str,
    error: &tenure::Error,
    fields: &[&str],
    secret: &Secret,
) -> Result<(), TestCaseError> {
    match error {
        tenure::Error::InvalidArgument { field, .. } => {
            prop_assert!(fields.contains(field), "{input:?}: refused naming {field}");
            secret.check_absent(&error.to_string())
        }
        other => Err(TestCaseError::fail(format!(
            "{input:?}: not InvalidArgument: {other:?}"
        ))),
    }
}

/// A host as a user writes one: a name, IPv4, or bracketed IPv6.
pub fn host() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z][a-z0-9-]{0,10}(\\.[a-z]{2,5}){0,2}",
        (any::<u8>(), any::<u8>(), any::<u8>(), any::<u8>())
            .prop_map(|(a, b, c, d)| format!("{a}.{b}.{c}.{d}")),
        Just("localhost".to_owned()),
        Just("[::1]".to_owned()),
        "\\[(fe80|2001:db8)::[0-9a-f]{1,4}\\]",
    ]
}

fn port() -> impl Strategy<Value = String> {
    (1u16..=u16::MAX).prop_map(|p| p.to_string())
}

fn file_path() -> impl Strategy<Value = String> {
    prop_oneof![
        "(/[a-zA-Z0-9._-]{1,12}){1,4}",
        "[a-z]{1,8}(/[a-z]{1,8})?\\.db",
    ]
}

/// A valid `sqlite:` URL (`sqlite:PATH`, `sqlite://PATH`, `sqlite:throwaway`); some carry
/// the password as userinfo, which SQLite has no use for, so mutations can move it.
pub fn sqlite_url() -> impl Strategy<Value = (Secret, String)> {
    (
        secret(),
        prop_oneof![Just("sqlite:"), Just("sqlite://"), Just("sqlite://u:{pw}@")],
        prop_oneof![4 => file_path(), 1 => Just("throwaway".to_owned())],
    )
        .prop_map(|(secret, scheme, path)| {
            let url = format!("{}{path}", scheme.replace("{pw}", &secret.escaped()));
            (secret, url)
        })
}

/// A valid `postgres://` or `postgresql://` URL with the password as userinfo or as a
/// `password=` parameter, or `postgres:throwaway`.
pub fn postgres_url() -> impl Strategy<Value = (Secret, String)> {
    (
        secret(),
        prop_oneof![Just("postgres"), Just("postgresql")],
        "[a-z][a-z0-9_]{0,8}",
        host(),
        proptest::option::of(port()),
        "[a-z][a-z0-9_]{0,8}",
        0..4u8,
    )
        .prop_map(|(secret, scheme, user, host, port, db, shape)| {
            let port = port.map(|p| format!(":{p}")).unwrap_or_default();
            let pw = secret.escaped();
            let url = match shape {
                0 => format!("{scheme}://{user}:{pw}@{host}{port}/{db}"),
                1 => format!("{scheme}://{user}:{pw}@{host}{port}/{db}?sslmode=disable"),
                2 => format!("{scheme}://{host}{port}/{db}?user={user}&password={pw}"),
                _ => format!("{scheme}:throwaway"),
            };
            (secret, url)
        })
}

/// A valid `etcd://host:port[,host:port...][/prefix]` URL or `etcd:throwaway`; some carry
/// userinfo with the password, which the etcd parser refuses.
pub fn etcd_url() -> impl Strategy<Value = (Secret, String)> {
    (
        secret(),
        proptest::collection::vec((host(), port()), 1..4),
        proptest::option::of("(/[a-zA-Z0-9_.-]{1,10}){1,3}"),
        0..5u8,
    )
        .prop_map(|(secret, endpoints, prefix, shape)| {
            let hosts: Vec<String> = endpoints
                .into_iter()
                .map(|(host, port)| format!("{host}:{port}"))
                .collect();
            let hosts = hosts.join(",");
            let prefix = prefix.unwrap_or_default();
            let url = match shape {
                0 => format!("etcd://u:{}@{hosts}{prefix}", secret.escaped()),
                1 => "etcd:throwaway".to_owned(),
                _ => format!("etcd://{hosts}{prefix}"),
            };
            (secret, url)
        })
}

/// Any valid store URL of any scheme, `memory:` included.
pub fn store_url() -> impl Strategy<Value = (Secret, String)> {
    prop_oneof![
        (secret(), Just("memory:".to_owned())),
        sqlite_url(),
        postgres_url(),
        etcd_url(),
    ]
}

/// Store-URL inputs: `valid` ones, mutated ones (most) and random text, each with the
/// password its valid form carried (random text carries none).
pub fn url_inputs(
    valid: impl Strategy<Value = (Secret, String)> + 'static,
) -> impl Strategy<Value = (Secret, String)> {
    let valid = valid.boxed();
    prop_oneof![
        1 => valid.clone(),
        3 => (valid, proptest::collection::vec(edit(), 1..5))
            .prop_map(|((secret, url), edits)| (secret, apply(&url, &edits))),
        1 => (secret(), text()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edits_stay_in_bounds() {
        assert_eq!(apply("abc", &[Edit::Delete(2, 7)]), "ab");
        assert_eq!(apply("abc", &[Edit::Replace(3, "x".into())]), "abcx");
        assert_eq!(apply("", &[Edit::Repeat(5, 3, 4)]), "");
        assert_eq!(apply("ab", &[Edit::Repeat(1, 3, 2)]), "abbb");
        assert_eq!(apply("ab", &[Edit::Truncate(1)]), "a");
    }

    #[test]
    fn a_secret_is_found_in_any_form() {
        let secret = Secret {
            core: "Ab3dEf7hIj1kLm9n".to_owned(),
            raw: "Ab3dEf7hIj1kLm9n@é".to_owned(),
        };
        for leak in [
            secret.raw().to_owned(),
            secret.escaped(),
            "…dEf7hIj1…".to_owned(),
        ] {
            assert!(
                secret.check_absent(&format!("x {leak} y")).is_err(),
                "{leak}"
            );
        }
        assert!(secret.check_absent("invalid url: no password here").is_ok());
    }
}
