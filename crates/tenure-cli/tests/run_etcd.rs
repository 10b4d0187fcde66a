//! `tenure run` against a throwaway etcd (from the testkit): the same scenarios as on
//! SQLite and PostgreSQL, each under its own key prefix. Built with `--features etcd`.
#![cfg(feature = "etcd")]

mod common;

use common::{scenarios, tempdir};
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

macro_rules! etcd_scenarios {
    ($($name:ident),* $(,)?) => {$(
        #[test]
        fn $name() {
            let dir = tempdir();
            let url = fresh_prefix(stringify!($name));
            scenarios::$name(&url, dir.path());
        }
    )*};
}

etcd_scenarios!(
    shard_group_shares_and_hands_over,
    executions_never_overlap,
    stopped_tenure_loses_leadership_and_kills_its_command,
    paused_group_is_fenced_out,
    sigterm_hands_over_at_once,
    busy_role,
    exit_codes_pass_through,
    env_overrides_inherited,
    fence_admits_and_refuses,
    status_and_members,
    leader_and_advertise,
    killed_leader_lease_expires,
    same_owner_label_is_two_owners,
    every_ttl_alone_starts,
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
