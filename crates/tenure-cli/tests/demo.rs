//! `tenure demo` on the in-memory store: the story runs to the end, on virtual time.

use std::process::Command;
use std::time::{Duration, Instant};

/// The demo exits 0, tells every beat of the story, and takes well under 2 s of real time.
#[test]
fn demo_tells_the_stalled_leader_story() {
    let started = Instant::now();
    let output = Command::new(env!("CARGO_BIN_EXE_tenure"))
        .arg("demo")
        .env_remove("TENURE_DEMO_STORE")
        .output()
        .expect("run tenure demo");
    let took = started.elapsed();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "demo failed: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for beat in [
        "node-a   elected with fencing token 1",
        "node-a   writes batch 1 with token 1: admitted",
        "node-a   STALLS",
        "node-b   elected with fencing token 2",
        "live nodes: [node-b]",
        "with token 1: REJECTED by the fence (highest admitted is 2)",
        "live nodes: [node-a, node-b]",
        "node-a   elected with fencing token 3",
        "tokens 1 -> 2 -> 3",
    ] {
        assert!(stdout.contains(beat), "missing {beat:?} in:\n{stdout}");
    }
    let order = |needle: &str| stdout.find(needle).unwrap();
    assert!(
        order("fencing token 2") < order("REJECTED"),
        "takeover precedes the rejected write"
    );
    assert!(
        took < Duration::from_secs(10),
        "virtual time: took {took:?}"
    );
}

/// A bad store URL is a usage error (exit 2) naming the problem.
#[test]
fn demo_rejects_unknown_scheme() {
    let output = Command::new(env!("CARGO_BIN_EXE_tenure"))
        .args(["demo", "--store", "mysql://user:hunter2@db/x"])
        .output()
        .expect("run tenure demo");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("unknown store scheme \"mysql\""),
        "{stderr}"
    );
    assert!(!stderr.contains("hunter2"), "password echoed: {stderr}");
}
