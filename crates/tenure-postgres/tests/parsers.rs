//! Property tests of `postgres://` URL parsing: random, mutated and valid URLs never
//! panic, every rejection is `InvalidArgument` naming `url`, and a URL's password never
//! appears in the message nor in any log line written while parsing.
//!
//! `PROPTEST_CASES` sets the depth (default 2,000 cases per property; the release run
//! in the README uses 100,000).

mod common;

use proptest::prelude::*;
use tenure::Error;
use tenure_postgres::connect_options;
use tenure_testkit::fuzz;

/// Runs `parse` with every log line (all levels) captured; returns its result and the lines.
fn logged<T>(parse: impl FnOnce() -> T) -> (T, String) {
    let logs = common::Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .finish();
    let result = tracing::subscriber::with_default(subscriber, parse);
    (result, logs.text())
}

proptest! {
    #![proptest_config(fuzz::config())]

    #[test]
    fn postgres_urls_never_panic_nor_leak((secret, url) in fuzz::url_inputs(prop_oneof![
        3 => fuzz::postgres_url(),
        1 => fuzz::store_url(),
    ])) {
        let (result, logs) = logged(|| connect_options(&url));
        secret.check_absent(&logs)?;
        if let Err(error) = result {
            fuzz::check_refusal(&url, &error, &["url"], &secret)?;
        }
    }
}

/// Found by the property above: sqlx logs a query parameter it does not know with its
/// value (`WARN ignoring unrecognized connect parameter key=ssword value=<password>`),
/// so a misspelt `password=` put the password in the logs; and sqlx parsed a URL of any
/// scheme as PostgreSQL.
#[test]
fn unknown_parameters_and_schemes_are_refused_silently() {
    for url in [
        "postgres://localhost/a0____0a?user=aa0_a0a00&:assword=Aaa0aAAa0AAAAa0A%40%40%40",
        "postgres://db/x?pasword=Aaa0aAAa0AAAAa0A",
        "postgres://db/x?options[x=Aaa0aAAa0AAAAa0A",
        "spostgres://localhost/db?password=Aaa0aAAa0AAAAa0A",
        "etcd://u:Aaa0aAAa0AAAAa0A@h:1",
    ] {
        let (result, logs) = logged(|| connect_options(url));
        match result {
            Err(Error::InvalidArgument {
                field: "url",
                reason,
            }) => {
                assert!(!reason.contains("Aaa0aAAa0AAAAa0A"), "{reason}");
            }
            other => panic!("{url:?}: {other:?}"),
        }
        assert!(!logs.contains("Aaa0aAAa0AAAAa0A"), "{logs}");
    }
    for url in [
        "postgres://bob:pw@db:5432/x?sslmode=disable&application_name=a&options[search_path]=s",
        "POSTGRESQL://db/x?user=bob&password=pw&port=5433&hostaddr=127.0.0.1",
    ] {
        assert!(connect_options(url).is_ok(), "{url:?}");
    }
}
