//! The command line's value parsers that are not a store URL (that one is
//! [`StoreUrl::parse`](crate::store::StoreUrl::parse)): durations.
//!
//! The tests below run every parser a user feeds (durations, store URLs of every
//! scheme, `--token`, `tenure bench`'s and `tenure chaos`'s `--store`, `--clients` and
//! `--faults`) on random, mutated and valid input: no panic, every rejection a usage
//! error naming the flag, and no URL password in any message. `PROPTEST_CASES` sets the
//! depth (default 2,000 per property; the README gives the 100,000-case release run).

use std::time::Duration;

/// The longest duration any flag takes: ten years. Longer ones are refused, not clamped:
/// the CLI adds durations to each other and to clocks (`--kill-after` plus a margin, a
/// deadline from `--ttl`), and near `u64::MAX` seconds those sums overflow and panic.
pub const MAX_DURATION: Duration = Duration::from_secs(10 * 365 * 86_400);

/// Parses a duration flag: a number with a unit (`500ms`, `15s`, `2m`, `1h 30m`), at
/// most [`MAX_DURATION`]. clap names the flag in front of the message.
pub fn parse_duration(raw: &str) -> Result<Duration, String> {
    let duration = humantime::parse_duration(raw.trim())
        .map_err(|error| format!("{error}: expected a number with a unit, e.g. 500ms, 15s, 2m"))?;
    if duration > MAX_DURATION {
        return Err(format!(
            "is longer than {} days, the most tenure takes",
            MAX_DURATION.as_secs() / 86_400
        ));
    }
    Ok(duration)
}

#[cfg(test)]
mod tests {
    use std::time::{Instant, SystemTime};

    use clap::Parser;
    use proptest::prelude::*;
    use tenure_testkit::fuzz::{self, Secret};

    use super::*;
    use crate::store::StoreUrl;
    use crate::{inspect, Cli, UsageError};

    /// Durations as users write them, some past every limit.
    fn valid_duration() -> impl Strategy<Value = String> {
        let unit = proptest::sample::select(
            &[
                "ns", "us", "ms", "s", "sec", "m", "min", "h", "d", "w", "M", "y", "years",
            ][..],
        );
        proptest::collection::vec((0u64..=u64::MAX / 2, unit), 1..3).prop_map(|parts| {
            let parts: Vec<String> = parts
                .into_iter()
                .map(|(n, unit)| format!("{}{unit}", n % 100_000))
                .collect();
            parts.join(" ")
        })
    }

    /// A duration that was accepted survives the arithmetic the CLI does with it
    /// (`--kill-after` plus a margin, deadlines on the monotonic clock, expiry on the
    /// wall clock), and is within [`MAX_DURATION`].
    fn check_usable(duration: Duration) -> Result<(), TestCaseError> {
        let sum = duration.checked_add(Duration::from_secs(1));
        prop_assert!(sum.is_some(), "{duration:?} + 1s overflows");
        prop_assert!(Instant::now().checked_add(duration).is_some());
        prop_assert!(SystemTime::now().checked_add(duration).is_some());
        prop_assert!(duration <= MAX_DURATION);
        Ok(())
    }

    /// `store`'s message names the flag and holds no trace of the password.
    fn check_store_message(
        message: &str,
        flag: &str,
        secret: &Secret,
    ) -> Result<(), TestCaseError> {
        prop_assert!(message.contains(flag), "{message:?} does not name {flag}");
        secret.check_absent(message)
    }

    proptest! {
        #![proptest_config(fuzz::config())]

        /// Each duration flag, through clap as the user reaches it: accepted values are
        /// usable, refused ones are an error naming the flag.
        #[test]
        fn durations_never_panic(
            raw in fuzz::inputs(valid_duration()),
            flag in proptest::sample::select(&["--ttl", "--renew-every", "--retry-every", "--wait-timeout", "--kill-after", "--member-ttl"][..]),
        ) {
            match parse_duration(&raw) {
                Ok(duration) => check_usable(duration)?,
                Err(message) => prop_assert!(!message.is_empty()),
            }
            let value = format!("{flag}={raw}");
            let args = ["tenure", "run", "--role", "r", &value, "--", "true"];
            match Cli::try_parse_from(args) {
                Ok(_) => prop_assert!(parse_duration(&raw).is_ok()),
                Err(error) => {
                    let message = error.to_string();
                    prop_assert!(message.contains(flag), "{message:?} does not name {flag}");
                }
            }
        }

        /// `--store` of every scheme: a usage error naming `--store`, never the password.
        #[test]
        fn store_urls_never_panic_nor_leak((secret, url) in fuzz::url_inputs(fuzz::store_url())) {
            if let Err(UsageError(message)) = StoreUrl::parse(&url) {
                check_store_message(&message, "--store", &secret)?;
            }
        }

        /// `tenure bench --store`, with its `:throwaway` forms.
        #[test]
        fn bench_stores_never_panic_nor_leak((secret, url) in fuzz::url_inputs(fuzz::store_url())) {
            match tenure_bench::StoreSpec::parse(&url) {
                Ok(_) => {}
                Err(tenure_bench::BenchError::Usage(message)) => {
                    check_store_message(&message, "--store", &secret)?;
                }
                Err(other) => prop_assert!(false, "{url:?}: not a usage error: {other:?}"),
            }
        }

        /// `tenure chaos --store`, with its `:throwaway` forms.
        #[test]
        fn chaos_stores_never_panic_nor_leak((secret, url) in fuzz::url_inputs(fuzz::store_url())) {
            match tenure_chaos::StoreSpec::parse(&url) {
                Ok(_) => {}
                Err(tenure_chaos::ChaosError::Usage(message)) => {
                    check_store_message(&message, "--store", &secret)?;
                }
                Err(other) => prop_assert!(false, "{url:?}: not a usage error: {other:?}"),
            }
        }

        /// `tenure fence --token`: a whole number from 0 to i64::MAX, or a usage error
        /// naming `--token`.
        #[test]
        fn tokens_never_panic(raw in fuzz::inputs("[0-9]{1,20}")) {
            match inspect::parse_token(&raw) {
                Ok(token) => {
                    prop_assert!(i64::try_from(token).is_ok());
                    prop_assert_eq!(Some(token), raw.trim().parse::<u64>().ok());
                }
                Err(UsageError(message)) => prop_assert!(message.contains("--token"), "{message:?}"),
            }
        }

        /// `tenure bench --clients` and `tenure chaos --faults`: lists, refused with a
        /// usage error naming the flag.
        #[test]
        fn lists_never_panic(
            clients in fuzz::inputs("[0-9]{1,4}(,[0-9]{1,4}){0,3}"),
            faults in fuzz::inputs("(pause|kill|restart|cut)(,(pause|kill|restart|cut)){0,3}"),
        ) {
            match tenure_bench::parse_clients(&clients) {
                Ok(counts) => prop_assert!(counts.iter().all(|&n| (1..=tenure_bench::config::MAX_CLIENTS).contains(&n))),
                Err(tenure_bench::BenchError::Usage(message)) => prop_assert!(message.contains("--clients"), "{message:?}"),
                Err(other) => prop_assert!(false, "not a usage error: {other:?}"),
            }
            match tenure_chaos::parse_faults(&faults) {
                Ok(kinds) => prop_assert!(!kinds.is_empty()),
                Err(tenure_chaos::ChaosError::Usage(message)) => prop_assert!(message.contains("--faults"), "{message:?}"),
                Err(other) => prop_assert!(false, "not a usage error: {other:?}"),
            }
        }
    }

    /// Found by `durations_never_panic`: durations no clock or sum can hold were
    /// accepted; `tenure run --kill-after "18446744073709551615s 900ms"` panicked with
    /// "overflow when adding durations" (exit 101) while adding the kill margin.
    #[test]
    fn durations_past_the_limit_are_refused() {
        for raw in [
            "79820m9223372035053874927s",
            "18446744073709551615s 900ms",
            "18446744073709551615s",
            "11y",
        ] {
            let message = parse_duration(raw).expect_err(raw);
            assert!(message.contains("3650 days"), "{raw}: {message}");
            let value = format!("--kill-after={raw}");
            let error = Cli::try_parse_from(["tenure", "run", "--role", "r", &value, "--", "true"])
                .expect_err(raw);
            assert!(error.to_string().contains("--kill-after"), "{error}");
        }
        assert_eq!(parse_duration("3650d"), Ok(MAX_DURATION));
        assert_eq!(parse_duration(" 1h 30m "), Ok(Duration::from_secs(5400)));
    }

    /// Found by `bench_stores_never_panic_nor_leak`: `tenure bench` echoed 20 filtered
    /// characters of whatever came before the first colon, and in a mangled URL that
    /// can be the password; `--store` showed any text of a scheme's shape there, which
    /// the 100,000-case run found to leak too (`etcAAaaaAAa:...`).
    #[test]
    fn a_mangled_url_does_not_show_its_password() {
        let url = "etAaAaaaA0a0aa0A0A%40@100.100.10.100:1000,10.100.10.100:10000/a/A0";
        let Err(tenure_bench::BenchError::Usage(message)) = tenure_bench::StoreSpec::parse(url)
        else {
            panic!("accepted {url:?}");
        };
        assert!(!message.contains("AaAaaaA0"), "{message}");
        let Err(UsageError(message)) = StoreUrl::parse(url) else {
            panic!("accepted {url:?}");
        };
        assert!(!message.contains("AaAaaaA0"), "{message}");
        assert!(
            message.contains("does not start with a scheme tenure knows"),
            "{message}"
        );
        let url = "etcAAaaaAAa:0A0aAaaaA%40@[::1]:100,[::1]:10000";
        let Err(UsageError(message)) = StoreUrl::parse(url) else {
            panic!("accepted {url:?}");
        };
        assert!(!message.contains("AAaaaAAa"), "{message}");
        let Err(UsageError(message)) = StoreUrl::parse("mysql://root:hunter2@db/x") else {
            panic!("accepted mysql");
        };
        assert!(
            message.contains("unknown store scheme \"mysql\""),
            "{message}"
        );
    }

    /// Found by `chaos_stores_never_panic_nor_leak`: `tenure chaos` refused a store
    /// without naming the flag.
    #[test]
    fn chaos_names_the_store_flag() {
        for url in ["memory:", "mysql://x", "etcd://a"] {
            let Err(tenure_chaos::ChaosError::Usage(message)) = tenure_chaos::StoreSpec::parse(url)
            else {
                panic!("accepted {url:?}");
            };
            assert!(message.starts_with("--store"), "{url}: {message}");
        }
    }
}
