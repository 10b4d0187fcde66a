//! `tenure run` against a throwaway PostgreSQL server (from the testkit): the same
//! scenarios as on SQLite, each on its own fresh database so no two tests share leases.

mod common;

use common::{every_backend_scenarios, output_within, scenarios, tempdir, tenure};
use std::path::Path;
use std::time::Duration;
use tenure_testkit::postgres::{PgServer, SUPERUSER};

/// A fresh database on the shared server ([`common::fresh_database`]); returns its URL
/// (password included).
fn fresh_database(name: &str) -> String {
    common::fresh_database("cli", name)
}

every_backend_scenarios!(
    |_dir: &Path, name: &str| fresh_database(name);
    fence_admits_and_refuses,
    status_and_members,
    leader_and_advertise,
    killed_member_shards_move_within_the_ttl,
    killed_leader_lease_expires,
);

/// A wrong password is a runtime failure (exit 1) that names the server it tried
/// (host:port) but never the password.
#[test]
fn wrong_password_is_not_echoed() {
    let server = PgServer::shared().expect("shared PostgreSQL server");
    let url = server.url_for(SUPERUSER, "not-the-password-42", "postgres");
    let mut status = tenure();
    status.args(["status", "--store", &url]);
    let output = output_within(&mut status, Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("could not connect"), "{stderr}");
    assert!(!stderr.contains("not-the-password-42"), "{stderr}");
    assert!(
        stderr.contains(&format!("127.0.0.1:{}", server.port())),
        "{stderr}"
    );
    assert!(
        stderr.contains("password authentication failed"),
        "{stderr}"
    );
}

/// 20 SIGKILLs of one of two `tenure run --group` members; prints the p50/p99 of the time
/// until the survivor runs every shard of the dead member. Slow (about a minute):
/// `cargo test -p tenure-cli --test run_postgres -- --ignored measure_failover --nocapture`.
#[test]
#[ignore]
fn measure_failover() {
    let dir = tempdir();
    scenarios::measure_failover(&fresh_database("measure_failover"), dir.path());
}
