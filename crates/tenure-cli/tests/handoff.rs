//! `tenure handoff`: a leading `tenure run` asked from another process hands its role to
//! the contender waiting in line; its command is stopped before the successor's starts,
//! and the token grows by one. Nobody to hand to, nobody leading and bad input each get
//! their own answer.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{lines, run_sh, sqlite_url, tempdir, tenure, wait_until, Proc};
use serde_json::Value;

const LONG: Duration = Duration::from_secs(30);

/// `tenure handoff ARGS --store STORE --json`: (exit code, the JSON line, stderr).
fn handoff(store: &str, args: &[&str]) -> (i32, Value, String) {
    common::json_line("handoff", store, args)
}

/// A `tenure run` whose command logs `start NAME` and `stop NAME` (on SIGTERM) to `log`.
fn contender(store: &str, name: &str, log: &Path) -> Proc {
    let script = format!(
        "trap 'echo stop {name} >> {log}; exit 0' TERM; echo start {name} >> {log}; \
         while :; do sleep 0.05; done",
        log = log.display()
    );
    Proc::spawn(&mut run_sh(store, "web", &["--owner", name], &script))
}

fn handoff_moves_the_role_to_the_waiting_contender(store: &str, dir: &Path) {
    let log = dir.join("log");
    let (code, line, stderr) = handoff(store, &["--role", "web", "--timeout", "2s"]);
    assert_eq!(
        (code, &line["outcome"]),
        (1, &Value::from("no_leader")),
        "{stderr}"
    );

    let mut a = contender(store, "a", &log);
    assert!(
        wait_until(LONG, || lines(&log) == ["start a"]),
        "{:?}",
        lines(&log)
    );
    let mut b = contender(store, "b", &log);
    assert!(
        b.wait_stderr("waiting", LONG),
        "b does not wait: {}",
        b.stderr()
    );

    let (code, line, stderr) = handoff(store, &["--role", "web"]);
    assert_eq!(code, 0, "{line} {stderr}");
    assert_eq!(line["outcome"], "handed_over", "{line}");
    let from = line["from"]["fencing_token"].as_u64().expect("from token");
    assert_eq!(
        line["to"]["fencing_token"].as_u64(),
        Some(from + 1),
        "{line}"
    );
    assert!(
        line["to"]["owner"]
            .as_str()
            .is_some_and(|o| o.starts_with("b")),
        "{line}"
    );
    assert!(
        wait_until(LONG, || lines(&log).len() == 3),
        "{:?}",
        lines(&log)
    );
    assert_eq!(
        lines(&log),
        ["start a", "stop a", "start b"],
        "a's command stopped before b's started"
    );
    assert_eq!(a.code_within(LONG), 4, "{}", a.stderr());

    // Nobody waits under that name: the leader leads on, the asker times out.
    let (code, line, stderr) = handoff(
        store,
        &["--role", "web", "--to", "nobody", "--timeout", "2s"],
    );
    assert_eq!(code, 124, "{line} {stderr}");
    assert_eq!(line["outcome"], "not_handed_over", "{line}");
    assert!(b.exited().is_none(), "b leads on: {}", b.stderr());
    assert_eq!(
        lines(&log).last().map(String::as_str),
        Some("start b"),
        "b's command runs on: {}",
        b.stderr()
    );
    b.signal(nix::sys::signal::Signal::SIGTERM);
    b.code_within(LONG);
}

#[test]
fn handoff_on_sqlite() {
    let dir = tempdir();
    handoff_moves_the_role_to_the_waiting_contender(&sqlite_url(dir.path()), dir.path());
}

#[test]
fn bad_handoff_input_is_a_usage_error() {
    let dir = tempdir();
    let store = sqlite_url(dir.path());
    let long_role = "r".repeat(250);
    for (args, needle) in [
        (vec!["--role", ""], "--role"),
        (vec!["--role", long_role.as_str()], "--role"),
        (vec!["--role", "web", "--to", ""], "--to"),
        (vec!["--role", "web", "--timeout", "0s"], "--timeout"),
        (vec!["--role", "web", "--timeout", "soon"], "--timeout"),
    ] {
        let mut command = tenure();
        command.args(["handoff", "--store", &store]).args(&args);
        common::assert_usage_error(&mut command, &args, needle, LONG);
    }
}
