//! `tenure status`, `tenure members` and `tenure fence` on SQLite, and the default store
//! created on first use.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use common::{output_within, sqlite_url, store_scenarios, tempdir, tenure};
use tenure_testkit::MustAnswer;

store_scenarios!(
    |dir: &Path, _name: &str| sqlite_url(dir);
    status_and_members,
    leader_and_advertise,
    killed_leader_lease_expires,
    fence_admits_and_refuses,
);

/// Runs `command` (a minute at most) and checks that it exits 0; returns its output.
#[track_caller]
fn succeeds(command: &mut std::process::Command) -> std::process::Output {
    let output = output_within(command, Duration::from_secs(60));
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// With no `--store` and no `TENURE_STORE`, the store is a SQLite file under
/// `$XDG_STATE_HOME/tenure` (else `$HOME/.local/state/tenure`), created on first use:
/// the directory private to the user (0700), the file too (0600).
#[test]
fn default_store_is_created_private() {
    let dir = tempdir();
    let state = dir.path().join("state");
    let mut status = tenure();
    status
        .args(["status"])
        .env("XDG_STATE_HOME", &state)
        .env("HOME", dir.path().join("home"));
    succeeds(&mut status);
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&state.join("tenure")), 0o700);
    assert_eq!(mode(&state.join("tenure/tenure.db")), 0o600);
    assert!(!dir.path().join("home").exists());

    // HOME is the fallback, and `run` uses the same default.
    let home = dir.path().join("home2");
    std::fs::create_dir(&home).unwrap();
    let mut run = tenure();
    run.args([
        "run",
        "--role",
        "r",
        "--",
        "sh",
        "-c",
        "echo \"$TENURE_STORE\"",
    ])
    .env_remove("XDG_STATE_HOME")
    .env("HOME", &home);
    let output = succeeds(&mut run);
    let db = home.join(".local/state/tenure/tenure.db");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        format!("sqlite:{}", db.display())
    );
    assert_eq!(mode(&db), 0o600);
}

/// `tenure status --group G` lists only G's shards (roles `G/k`, sorted by number) with
/// their owners and tokens, and counts shards per member; `--json` gives the same, and
/// bad input is a usage error.
#[test]
fn status_of_a_shard_group() {
    let dir = tempdir();
    let url = sqlite_url(dir.path());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let store = tenure_sqlite::SqliteLeaseStore::open(dir.path().join("tenure.db"))
            .await
            .unwrap();
        let ttl = Duration::from_secs(60);
        for (role, owner) in [
            ("jobs/10", "node-a"),
            ("jobs/0", "node-a"),
            ("jobs/1", "node-b"),
            ("jobs/x", "node-b"),
            ("other/0", "node-c"),
        ] {
            assert!(store.try_acquire(role, owner, ttl).await.acquired);
        }
    });

    let output = output_within(
        tenure().args(["status", "--group", "jobs", "--json", "--store", &url]),
        Duration::from_secs(30),
    );
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let shards: Vec<u64> = report["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["shard"].as_u64().unwrap())
        .collect();
    assert_eq!(shards, [0, 1, 10]);
    assert_eq!(report["shards"][2]["owner"], "node-a");
    assert_eq!(report["per_member"]["node-a"], 2);
    assert_eq!(report["per_member"]["node-b"], 1);
    assert_eq!(report["unowned"], 0);

    let output = output_within(
        tenure().args(["status", "--group", "jobs", "--store", &url]),
        Duration::from_secs(30),
    );
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("SHARD") && text.contains("MEMBER"), "{text}");
    assert!(
        !text.contains("other/0") && !text.contains("jobs/x"),
        "{text}"
    );

    for bad in [
        vec!["status", "--group", ""],
        vec!["status", "--group", "jobs", "--role", "jobs/0"],
    ] {
        let output = output_within(
            tenure().args(&bad).args(["--store", &url]),
            Duration::from_secs(30),
        );
        assert_eq!(output.status.code(), Some(2), "{bad:?}: {output:?}");
    }
}
