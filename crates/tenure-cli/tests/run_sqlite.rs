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
    shard_group_shares_and_hands_over,
    killed_member_shards_move_within_the_ttl,
    executions_never_overlap,
    stopped_tenure_loses_leadership_and_kills_its_command,
    paused_group_is_fenced_out,
    sigterm_hands_over_at_once,
    busy_role,
    exit_codes_pass_through,
    env_overrides_inherited,
    sigint_is_forwarded,
    leftovers_are_stopped_before_release,
    same_owner_label_is_two_owners,
    every_ttl_alone_starts,
    ctrl_z_suspends_the_command_too,
    lost_while_suspended_is_killed_not_resumed,
    lost_term_stops_escaped_processes,
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

/// `tenure -v run` with `--ttl` alone: the timings in effect (derived from the TTL) are in
/// one log line, and logs written to a pipe carry no ANSI colour escapes.
#[test]
fn verbose_logs_to_a_pipe_show_timings_without_colour() {
    let dir = tempdir();
    let mut run = common::tenure();
    run.args(["-v", "run", "--role", "plain", "--store"])
        .arg(sqlite_url(dir.path()))
        .args(["--ttl", "12s", "--", "true"]);
    let output = common::output_within(&mut run, std::time::Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("elected"), "no log lines: {stderr}");
    assert!(
        stderr.contains("ttl=12.0s renew_every=4.0s kill_after=3.0s"),
        "no timings line: {stderr}"
    );
    assert!(
        !stderr.contains("\x1b["),
        "colour escapes in a pipe: {stderr:?}"
    );
}

/// On a terminal (a pty from `script`) logs are coloured, unless `NO_COLOR` is set to a
/// non-empty value.
#[test]
fn logs_are_coloured_on_a_terminal_unless_no_color() {
    let dir = tempdir();
    let line = format!(
        "'{}' -v run --role tty --store '{}' --ttl 3s -- true",
        common::BIN,
        sqlite_url(dir.path())
    );
    for (no_color, coloured) in [(None, true), (Some(""), true), (Some("1"), false)] {
        let mut script = std::process::Command::new("script");
        script
            .args(["-qec", &line, "/dev/null"])
            .env_remove("RUST_LOG")
            .env_remove("TENURE_STORE")
            .stdin(std::process::Stdio::null());
        match no_color {
            Some(value) => script.env("NO_COLOR", value),
            None => script.env_remove("NO_COLOR"),
        };
        let output = common::output_within(&mut script, std::time::Duration::from_secs(60));
        let tty = String::from_utf8_lossy(&output.stdout);
        assert_eq!(
            output.status.code(),
            Some(0),
            "NO_COLOR={no_color:?}: {tty}"
        );
        assert!(
            tty.contains("elected"),
            "NO_COLOR={no_color:?}: no logs: {tty}"
        );
        assert_eq!(
            tty.contains("\x1b["),
            coloured,
            "NO_COLOR={no_color:?}: {tty:?}"
        );
    }
}

/// 20 SIGKILLs of one of two `tenure run --group` members; prints the p50/p99 of the time
/// until the survivor runs every shard of the dead member. Slow (about a minute):
/// `cargo test -p tenure-cli --test run_sqlite -- --ignored measure_failover --nocapture`.
#[test]
#[ignore]
fn measure_failover() {
    let dir = tempdir();
    scenarios::measure_failover(&sqlite_url(dir.path()), dir.path());
}
