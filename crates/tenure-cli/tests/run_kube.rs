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

use common::every_backend_scenarios;
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

every_backend_scenarios!(
    |_dir: &Path, name: &str| fresh_namespace(&name.replace('_', "-"));
    fence_admits_and_refuses,
    status_and_members,
    leader_and_advertise,
    killed_member_shards_move_within_the_ttl,
);

/// In a pod there is no kubeconfig: the API server comes from `KUBERNETES_SERVICE_HOST`
/// and `KUBERNETES_SERVICE_PORT`, and the service account's token, CA and namespace from
/// files under `/var/run/secrets/kubernetes.io/serviceaccount`. `tenure` gets that view
/// here in a mount namespace of its own (a tmpfs over `/var/run`, the files bound in), so
/// nothing of the host changes. `--store kube:` then runs the command in the service
/// account's namespace, and a namespace the account may not use is refused by name.
#[test]
fn in_cluster_config_comes_from_the_service_account() {
    let server = KubeServer::shared().expect("shared kube-apiserver");
    let namespace = server
        .new_namespace("cli-in-cluster")
        .expect("new namespace");
    let dir = common::tempdir();
    let pod = |namespace: &str, args: &[&str]| {
        let account = dir.path().join(format!("serviceaccount-{namespace}"));
        std::fs::create_dir_all(&account).unwrap();
        std::fs::write(account.join("token"), server.token()).unwrap();
        std::fs::copy(server.ca_path(), account.join("ca.crt")).unwrap();
        std::fs::write(account.join("namespace"), namespace).unwrap();
        let mount = "mount -t tmpfs tmpfs /var/run && \
                     mkdir -p /var/run/secrets/kubernetes.io/serviceaccount && \
                     mount --bind \"$ACCOUNT\" /var/run/secrets/kubernetes.io/serviceaccount && \
                     exec \"$TENURE_BIN\" \"$@\"";
        let mut command = std::process::Command::new("unshare");
        common::tenure_env(&mut command)
            .args([
                "--user",
                "--map-root-user",
                "--mount",
                "sh",
                "-c",
                mount,
                "sh",
            ])
            .args(args)
            .env_remove("KUBECONFIG")
            .env("HOME", dir.path())
            .env("ACCOUNT", &account)
            .env("KUBERNETES_SERVICE_HOST", "127.0.0.1")
            .env("KUBERNETES_SERVICE_PORT", server.port().to_string());
        common::output_within(&mut command, std::time::Duration::from_secs(60))
    };

    let run = pod(
        &namespace,
        &[
            "run",
            "--store",
            "kube:",
            "--role",
            "in-cluster",
            "--",
            "sh",
            "-c",
            "echo \"token $TENURE_FENCING_TOKEN\"",
        ],
    );
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(0), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&run.stdout).trim(), "token 1");
    // The term is in the service account's namespace, as a kubeconfig user sees it.
    let kubeconfig = server.tenant_kubeconfig(&namespace).expect("kubeconfig");
    let status = common::output_within(
        common::tenure().env("KUBECONFIG", kubeconfig).args([
            "status",
            "--json",
            "--store",
            &format!("kube:{namespace}"),
        ]),
        std::time::Duration::from_secs(60),
    );
    let status = String::from_utf8_lossy(&status.stdout);
    assert!(status.contains("\"role\":\"in-cluster\""), "{status}");

    let elsewhere = pod("default", &["status", "--store", "kube:"]);
    let stderr = String::from_utf8_lossy(&elsewhere.stderr);
    assert_ne!(elsewhere.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("refused to get leases (coordination.k8s.io) in namespace default"),
        "the refusal names the verb, the resource and the namespace: {stderr}"
    );
}
