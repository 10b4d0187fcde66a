//! Bad input to the elector: every rule of `LeaseLeaderOptions::validate`, the store's
//! minimum TTL checked by `LeaseLeaderElector::new`, and a bad role given to `run`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use tenure::intercept::{Call, InterceptStore, Interceptor, Next, Reply};
use tenure::{
    Error, InMemoryLeaseStore, LeaseLeaderElector, LeaseLeaderOptions, Result, TokioClock,
};
use tokio_util::sync::CancellationToken;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn valid() -> LeaseLeaderOptions {
    LeaseLeaderOptions {
        owner_id: "node-a".to_owned(),
        lease_ttl: ms(10_000),
        renew_interval: ms(3_000),
        retry_interval: ms(1_000),
        ..Default::default()
    }
}

fn memory() -> Arc<InMemoryLeaseStore> {
    Arc::new(InMemoryLeaseStore::with_clock(TokioClock::starting_at(
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000),
    )))
}

/// Asserts `result` is `InvalidArgument` for `field` and that its message contains
/// every one of `mentions`; returns the message.
fn expect_invalid<T: std::fmt::Debug>(result: Result<T>, field: &str, mentions: &[&str]) -> String {
    match result {
        Err(error @ Error::InvalidArgument { .. }) => {
            let Error::InvalidArgument { field: got, .. } = &error else {
                unreachable!()
            };
            assert_eq!(*got, field, "wrong field in {error}");
            let message = error.to_string();
            assert!(
                message.contains(field),
                "message {message:?} names the field"
            );
            for mention in mentions {
                assert!(
                    message.contains(mention),
                    "message {message:?} should mention {mention:?}"
                );
            }
            message
        }
        other => panic!("expected InvalidArgument({field}), got {other:?}"),
    }
}

/// Checks `options` both through `validate` and through `LeaseLeaderElector::new`.
fn rejects(options: LeaseLeaderOptions, field: &str, mentions: &[&str]) {
    let message = expect_invalid(options.validate(), field, mentions);
    let from_new = expect_invalid(
        LeaseLeaderElector::new(memory(), options).map(|_| ()),
        field,
        mentions,
    );
    assert_eq!(message, from_new);
}

/// Setup: none. The defaults (30 s / 10 s / 2 s, jitter 0.2, drift 1 %, generated
/// owner id) and the options used in tests are valid; boundary values are accepted.
#[test]
fn defaults_and_boundaries_are_valid() {
    let defaults = LeaseLeaderOptions::default();
    defaults.validate().unwrap();
    assert_eq!(defaults.lease_ttl, Duration::from_secs(30));
    assert_eq!(defaults.renew_interval, Duration::from_secs(10));
    assert_eq!(defaults.retry_interval, Duration::from_secs(2));
    assert_ne!(
        defaults.owner_id,
        LeaseLeaderOptions::default().owner_id,
        "each default owner id is unique"
    );
    valid().validate().unwrap();
    for ok in [
        LeaseLeaderOptions {
            max_clock_drift: 0.0,
            retry_jitter: 0.0,
            ..valid()
        },
        LeaseLeaderOptions {
            max_clock_drift: 0.49,
            renew_interval: ms(5_000),
            retry_jitter: 1.0,
            ..valid()
        },
        // Just below the local window of 9.9 s.
        LeaseLeaderOptions {
            renew_interval: ms(9_899),
            ..valid()
        },
        LeaseLeaderOptions {
            owner_id: "x".repeat(255),
            ..valid()
        },
    ] {
        ok.validate().unwrap();
    }
}

/// Setup: none. Each zero duration is rejected, naming the option.
#[test]
fn zero_durations_are_rejected() {
    rejects(
        LeaseLeaderOptions {
            lease_ttl: Duration::ZERO,
            ..valid()
        },
        "lease_ttl",
        &["greater than zero"],
    );
    rejects(
        LeaseLeaderOptions {
            renew_interval: Duration::ZERO,
            ..valid()
        },
        "renew_interval",
        &["greater than zero"],
    );
    rejects(
        LeaseLeaderOptions {
            retry_interval: Duration::ZERO,
            ..valid()
        },
        "retry_interval",
        &["greater than zero"],
    );
}

/// Setup: none. `renew_interval >= lease_ttl` is rejected with both values in the
/// message; so is a renew interval inside `[ttl * (1 - drift), ttl)`.
#[test]
fn renew_interval_must_fit_the_local_window() {
    rejects(
        LeaseLeaderOptions {
            renew_interval: ms(10_000),
            ..valid()
        },
        "renew_interval",
        &["10s", "lease_ttl"],
    );
    rejects(
        LeaseLeaderOptions {
            renew_interval: ms(12_000),
            ..valid()
        },
        "renew_interval",
        &["12s", "10s"],
    );
    // ttl 10 s with 10 % drift leaves a 9 s window; 9.5 s renewals do not fit it.
    rejects(
        LeaseLeaderOptions {
            renew_interval: ms(9_500),
            max_clock_drift: 0.1,
            ..valid()
        },
        "renew_interval",
        &["9.5s", "9s", "max_clock_drift"],
    );
    // Exactly at the window is too late as well.
    rejects(
        LeaseLeaderOptions {
            renew_interval: ms(9_900),
            ..valid()
        },
        "renew_interval",
        &["9.9s"],
    );
}

/// Setup: none. `max_clock_drift` outside [0, 0.5) and `retry_jitter` outside [0, 1]
/// (including NaN) are rejected, with the value in the message.
#[test]
fn drift_and_jitter_out_of_range_are_rejected() {
    for (drift, shown) in [
        (-0.01, "-0.01"),
        (0.5, "0.5"),
        (2.0, "2"),
        (f64::NAN, "NaN"),
    ] {
        rejects(
            LeaseLeaderOptions {
                max_clock_drift: drift,
                ..valid()
            },
            "max_clock_drift",
            &[shown],
        );
    }
    for (jitter, shown) in [(-0.1, "-0.1"), (1.5, "1.5"), (f64::NAN, "NaN")] {
        rejects(
            LeaseLeaderOptions {
                retry_jitter: jitter,
                ..valid()
            },
            "retry_jitter",
            &[shown],
        );
    }
}

/// Setup: none. An owner id that is empty, too long, or holds a NUL or control
/// character is rejected as `owner_id`.
#[test]
fn bad_owner_ids_are_rejected() {
    for (owner, mention) in [
        (String::new(), "empty"),
        ("x".repeat(256), "256"),
        ("node\0a".to_owned(), "NUL"),
        ("node\na".to_owned(), "control"),
    ] {
        rejects(
            LeaseLeaderOptions {
                owner_id: owner,
                ..valid()
            },
            "owner_id",
            &[mention],
        );
    }
}

/// Setup: none. An advertised value over 1024 bytes or with a NUL byte is rejected as
/// `advertise`; the longest allowed is accepted.
#[test]
fn bad_advertised_values_are_rejected() {
    for (value, mention) in [("v".repeat(1025), "1025"), ("a\0b".to_owned(), "NUL")] {
        rejects(
            LeaseLeaderOptions {
                advertise: Some(value),
                ..valid()
            },
            "advertise",
            &[mention],
        );
    }
    let longest = LeaseLeaderOptions {
        advertise: Some("v".repeat(1024)),
        ..valid()
    };
    assert!(longest.validate().is_ok());
}

/// A one-second minimum TTL, like etcd's, and a count of the calls that reach the store.
#[derive(Default)]
struct WholeSeconds {
    calls: AtomicUsize,
}

#[async_trait]
impl Interceptor for WholeSeconds {
    async fn intercept(&self, call: Call, next: Next) -> Reply {
        self.calls.fetch_add(1, Ordering::SeqCst);
        next.run(call).await
    }
    fn min_ttl(&self, _below: Duration) -> Duration {
        Duration::from_secs(1)
    }
}

/// The in-memory store through [`WholeSeconds`].
fn whole_seconds() -> (Arc<WholeSeconds>, Arc<InterceptStore>) {
    let counter = Arc::new(WholeSeconds::default());
    let store = InterceptStore::new(memory()).with(counter.clone());
    (counter, Arc::new(store))
}

/// Setup: a store whose `min_ttl` is 1 s. A 500 ms lease_ttl is rejected by `new` with
/// both values in the message; exactly 1 s is accepted.
#[test]
fn ttl_below_the_store_minimum_is_rejected() {
    let (counter, store) = whole_seconds();
    let short = LeaseLeaderOptions {
        lease_ttl: ms(500),
        renew_interval: ms(100),
        ..valid()
    };
    short.validate().unwrap();
    expect_invalid(
        LeaseLeaderElector::new(store.clone(), short).map(|_| ()),
        "lease_ttl",
        &["500ms", "1s", "minimum"],
    );
    let exact = LeaseLeaderOptions {
        lease_ttl: ms(1_000),
        renew_interval: ms(300),
        ..valid()
    };
    LeaseLeaderElector::new(store.clone(), exact).unwrap();
    assert_eq!(
        counter.calls.load(Ordering::SeqCst),
        0,
        "new makes no calls"
    );
}

/// Setup: a valid elector on the in-memory store. `run` with an empty, NUL-holding or
/// over-long role returns `InvalidArgument(role)` at once without calling work or the
/// store.
#[tokio::test(start_paused = true)]
async fn bad_role_makes_run_return_invalid_argument() {
    let (counter, store) = whole_seconds();
    let elector = LeaseLeaderElector::new(store.clone(), valid()).unwrap();
    let called = Arc::new(AtomicUsize::new(0));
    for (role, mention) in [
        (String::new(), "empty"),
        ("re\0ports".to_owned(), "NUL"),
        ("r".repeat(256), "256"),
    ] {
        let called = called.clone();
        let outcome = elector
            .run(
                &role,
                move |_token, _leadership| {
                    called.fetch_add(1, Ordering::SeqCst);
                    async {}
                },
                CancellationToken::new(),
            )
            .await;
        expect_invalid(outcome, "role", &[mention]);
    }
    assert_eq!(called.load(Ordering::SeqCst), 0);
    assert_eq!(counter.calls.load(Ordering::SeqCst), 0);
}

/// Setup: none. `work_grace` must leave room: below the local window, and with a grace
/// set, the renew interval must fit in what is left of the window.
#[test]
fn work_grace_must_leave_time_to_renew() {
    let ok = LeaseLeaderOptions {
        work_grace: ms(5_000),
        ..valid()
    };
    assert!(ok.validate().is_ok(), "3 s renew fits in 9.9 s - 5 s");
    assert_eq!(ok.leadership_window(), ms(4_900));
    rejects(
        LeaseLeaderOptions {
            work_grace: ms(9_900),
            ..valid()
        },
        "work_grace",
        &["9.9s"],
    );
    rejects(
        LeaseLeaderOptions {
            work_grace: ms(7_000),
            ..valid()
        },
        "renew_interval",
        &["3s", "2.9s"],
    );
}

/// Setup: none. Each message names the option once (in the error's prefix) and then
/// shows the value and the bound it breaks, with the bound's inputs.
#[test]
fn messages_show_the_value_and_the_bound_once() {
    let renew = LeaseLeaderOptions {
        renew_interval: ms(5_000),
        work_grace: ms(5_000),
        ..valid()
    };
    assert_eq!(
        renew.validate().unwrap_err().to_string(),
        "invalid renew_interval: 5s must be greater than zero and less than \
         lease_ttl * (1 - max_clock_drift) - work_grace = 10s * (1 - 0.01) - 5s = 4.9s"
    );
    let grace = LeaseLeaderOptions {
        work_grace: ms(9_900),
        ..valid()
    };
    assert_eq!(
        grace.validate().unwrap_err().to_string(),
        "invalid work_grace: 9.9s must be less than lease_ttl * (1 - max_clock_drift) \
         = 10s * (1 - 0.01) = 9.9s"
    );
    let zero = LeaseLeaderOptions {
        retry_interval: Duration::ZERO,
        ..valid()
    };
    assert_eq!(
        zero.validate().unwrap_err().to_string(),
        "invalid retry_interval: must be greater than zero"
    );
}
