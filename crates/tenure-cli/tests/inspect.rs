//! `tenure status`, `tenure members` and `tenure fence` on SQLite, and the default store
//! created on first use.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use common::{output_within, scenarios, sqlite_url, tempdir, tenure};

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
    status_and_members,
    killed_leader_lease_expires,
    fence_admits_and_refuses,
);

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
    let output = output_within(&mut status, Duration::from_secs(60));
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
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
    let output = output_within(&mut run, Duration::from_secs(60));
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let db = home.join(".local/state/tenure/tenure.db");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        format!("sqlite:{}", db.display())
    );
    assert_eq!(mode(&db), 0o600);
}
