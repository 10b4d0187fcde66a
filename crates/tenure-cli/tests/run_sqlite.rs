//! `tenure run` on a SQLite file shared by several real `tenure` processes: the common
//! scenarios (see `common/scenarios.rs`), each on a fresh database.

mod common;

use common::{scenarios, sqlite_url, tempdir};

macro_rules! sqlite_scenarios {
    ($($name:ident),* $(,)?) => {$(
        #[test]
        fn $name() {
            let dir = tempdir();
            scenarios::$name(&sqlite_url(dir.path()), dir.path());
        }
    )*};
}

sqlite_scenarios!(
    executions_never_overlap,
    stopped_tenure_loses_leadership_and_kills_its_command,
    paused_group_is_fenced_out,
    sigterm_hands_over_at_once,
    busy_role,
    exit_codes_pass_through,
    env_overrides_inherited,
    sigint_is_forwarded,
);

/// The overlap check itself: it catches a start inside another term, a token that does
/// not increase, and a term that never ends (so the scenario above can fail).
#[test]
fn overlap_check_catches_bad_logs() {
    let log = |lines: &[&str]| lines.iter().map(|l| l.to_string()).collect::<Vec<_>>();
    let good = log(&["start 1", "end 1", "start 4", "end 4"]);
    assert_eq!(common::check_no_overlap(&good), [1, 4]);
    for bad in [
        log(&["start 1", "start 2", "end 1", "end 2"]),
        log(&["start 2", "end 2", "start 2", "end 2"]),
        log(&["start 3", "end 3", "start 1", "end 1"]),
        log(&["start 1", "end 1", "start 2"]),
        log(&["start 1", "end 2"]),
    ] {
        let caught = std::panic::catch_unwind(|| common::check_no_overlap(&bad)).is_err();
        assert!(caught, "accepted {bad:?}");
    }
}
