//! The manifests the README documents, checked against the real API server: a
//! server-side dry run of `deploy/kubernetes/*.yaml` (admission and validation as for a
//! real apply, nothing written), and the Role's rules must be exactly those the tests
//! run with (the ClusterRole the throwaway server binds the tenant to), and those the
//! README shows.

mod common;

use std::path::PathBuf;

use tenure_testkit::kube::CLUSTER_ROLE;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn manifest(name: &str) -> String {
    repo()
        .join("deploy/kubernetes")
        .join(name)
        .display()
        .to_string()
}

#[test]
fn deploy_manifests_pass_a_server_side_dry_run() {
    let server = common::server();
    // A bare namespace: the test namespaces already bind the tests' role under this name.
    let namespace = format!("manifests-{}", std::process::id());
    server
        .kubectl(&["create", "namespace", &namespace])
        .expect("namespace");
    for name in ["rbac.yaml", "deployment.yaml"] {
        let out = server
            .kubectl(&[
                "apply",
                "--dry-run=server",
                "-n",
                &namespace,
                "-f",
                &manifest(name),
            ])
            .unwrap_or_else(|error| panic!("{name}: {error}"));
        assert!(out.contains("(server dry run)"), "{name}: {out}");
    }
}

/// The rules as `kubectl` prints them: `{apiGroups, resources, verbs}` per rule, sorted.
fn rules(json: &str) -> serde_json::Value {
    let role = serde_json::Deserializer::from_str(json)
        .into_iter::<serde_json::Value>()
        .map(|item| item.expect("json"))
        .find(|item| item["kind"] == "Role" || item["kind"] == "ClusterRole")
        .expect("a role");
    role["rules"].clone()
}

#[test]
fn the_documented_role_is_the_one_the_tests_run_with() {
    let server = common::server();
    let documented = server
        .kubectl(&[
            "create",
            "--dry-run=client",
            "-o",
            "json",
            "-f",
            &manifest("rbac.yaml"),
        ])
        .expect("read rbac.yaml");
    let tested = server
        .kubectl(&["get", "clusterrole", CLUSTER_ROLE, "-o", "json"])
        .expect("the tests' ClusterRole");
    assert_eq!(rules(&documented), rules(&tested));

    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let rbac = std::fs::read_to_string(manifest("rbac.yaml")).unwrap();
    let block = |text: &str| -> Vec<String> {
        let start = text.find("rules:").expect("rules");
        text[start..]
            .lines()
            .take(4)
            .map(|line| line.trim().to_owned())
            .collect()
    };
    assert_eq!(
        block(&readme),
        block(&rbac),
        "README and rbac.yaml disagree"
    );
}
