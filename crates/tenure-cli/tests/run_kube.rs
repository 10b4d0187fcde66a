//! `tenure run` against a throwaway kube-apiserver (from the testkit): the scenarios of
//! the other backends, each in a fresh namespace (`--store kube:NAMESPACE`), as the
//! tenant service account that has only the documented Role on leases.
//!
//! Not here: `killed_leader_lease_expires`, whose `tenure status` is a new process each
//! time. On Kubernetes a new process counts a dead holder's time from its own first read
//! (the API server keeps no timers), so a one-shot `status` shows it live; a contender
//! that keeps reading takes over, which the other scenarios check.
#![cfg(feature = "kube")]

mod common;

use common::{scenarios, tempdir};
use tenure_testkit::kube::KubeServer;

/// A fresh namespace on the shared server, and `KUBECONFIG` for every `tenure` started.
fn fresh_namespace(name: &str) -> String {
    let server = KubeServer::shared().expect("shared kube-apiserver");
    let namespace = server
        .new_namespace(&format!("cli-{name}"))
        .expect("new namespace");
    let kubeconfig = server
        .tenant_kubeconfig(&namespace)
        .expect("tenant kubeconfig");
    // Every namespace is bound to the same service account, so one kubeconfig serves all
    // (the URL names the namespace).
    let _ = common::KUBECONFIG.set(kubeconfig);
    format!("kube:{namespace}")
}

macro_rules! kube_scenarios {
    ($($name:ident),* $(,)?) => {$(
        #[test]
        fn $name() {
            let dir = tempdir();
            let url = fresh_namespace(&stringify!($name).replace('_', "-"));
            scenarios::$name(&url, dir.path());
        }
    )*};
}

kube_scenarios!(
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
    same_owner_label_is_two_owners,
    every_ttl_alone_starts,
    killed_member_shards_move_within_the_ttl,
);
