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

use std::path::Path;

use common::{every_backend_scenarios, store_scenarios};
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

every_backend_scenarios!(|_dir: &Path, name: &str| fresh_namespace(&name.replace('_', "-")));

store_scenarios!(
    |_dir: &Path, name: &str| fresh_namespace(&name.replace('_', "-"));
    fence_admits_and_refuses,
    status_and_members,
    leader_and_advertise,
    killed_member_shards_move_within_the_ttl,
);
