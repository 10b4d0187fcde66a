//! `tenure run` against a throwaway etcd (from the testkit): the same scenarios as on
//! SQLite and PostgreSQL, each under its own key prefix. Built with `--features etcd`.
#![cfg(feature = "etcd")]

mod common;

use std::path::Path;

use common::{every_backend_scenarios, scenarios, tempdir};
use tenure_testkit::etcd::EtcdServer;

/// A key prefix no other test uses, on the shared server.
fn fresh_prefix(name: &str) -> String {
    let server = EtcdServer::shared().expect("shared etcd server");
    format!(
        "etcd://{}/cli-{name}-{}",
        server.host_port(),
        std::process::id()
    )
}

every_backend_scenarios!(
    |_dir: &Path, name: &str| fresh_prefix(name);
    fence_admits_and_refuses,
    status_and_members,
    leader_and_advertise,
    killed_leader_lease_expires,
    killed_member_shards_move_within_the_ttl_and_etcds_revocation,
);

/// 20 SIGKILLs of one of two `tenure run --group` members on etcd; prints the p50/p99 of
/// the time until the survivor runs every shard of the dead member. Slow (about a minute):
/// `cargo test -p tenure-cli --features etcd --test run_etcd -- --ignored measure_failover
/// --nocapture`.
#[test]
#[ignore]
fn measure_failover() {
    let dir = tempdir();
    scenarios::measure_failover(&fresh_prefix("measure_failover"), dir.path());
}
