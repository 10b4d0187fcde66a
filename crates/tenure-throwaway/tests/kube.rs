//! The throwaway Kubernetes API server: it starts ready, its service account may use
//! Leases in a bound namespace and nothing else, and restarts of the API server and of
//! etcd keep the data and the port.

use std::time::{Duration, Instant};

use tenure_throwaway::kube::{KubeServer, CLUSTER_ROLE, SERVICE_ACCOUNT, SYSTEM_NAMESPACE};
use tenure_throwaway::{Result, ThrowawayError};

fn lease(name: &str, holder: &str) -> String {
    format!(
        "\
apiVersion: coordination.k8s.io/v1
kind: Lease
metadata:
  name: {name}
spec:
  holderIdentity: {holder}
  leaseDurationSeconds: 10
"
    )
}

/// Whether `result` is the API server's refusal for lack of permission to the service
/// account (kubectl words it `Error from server (Forbidden): leases.coordination.k8s.io is
/// forbidden: User "..." cannot ...`, or `error: failed to create configmap: ...`).
fn forbidden(result: Result<String>) -> bool {
    let refusal = format!(
        "is forbidden: User \"system:serviceaccount:{SYSTEM_NAMESPACE}:{SERVICE_ACCOUNT}\" cannot"
    );
    match result {
        Err(ThrowawayError::Failed { detail, .. }) => detail.contains(&refusal),
        _ => false,
    }
}

fn holder(server: &KubeServer, kubeconfig: &std::path::Path, name: &str) -> Result<String> {
    server.kubectl_with(
        kubeconfig,
        &[
            "get",
            "lease",
            name,
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ],
        None,
    )
}

#[test]
fn shared_server_is_ready_with_the_documented_rbac() {
    let started = Instant::now();
    let server = KubeServer::shared().expect("shared Kubernetes API server");
    eprintln!("shared KubeServer ready in {:?}", started.elapsed());

    assert!(
        server.url().starts_with("https://127.0.0.1:"),
        "{}",
        server.url()
    );
    assert_eq!(server.kubectl(&["get", "--raw", "/readyz"]).unwrap(), "ok");
    let version = server.kubectl(&["get", "--raw", "/version"]).unwrap();
    eprintln!("server version: {version}");
    assert!(version.contains("\"gitVersion\""), "{version}");
    assert!(server.ca_path().is_file());
    assert!(server.admin_kubeconfig().is_file());
    assert_eq!(server.token().split('.').count(), 3, "a JWT");

    let rules = server
        .kubectl(&[
            "get",
            "clusterrole",
            CLUSTER_ROLE,
            "-o",
            "jsonpath={.rules}",
        ])
        .unwrap();
    assert_eq!(
        rules,
        r#"[{"apiGroups":["coordination.k8s.io"],"resources":["leases"],"verbs":["get","list","watch","create","update","patch"]}]"#
    );
    let account = server
        .kubectl(&[
            "get",
            "serviceaccount",
            SERVICE_ACCOUNT,
            "-n",
            SYSTEM_NAMESPACE,
            "-o",
            "name",
        ])
        .unwrap();
    assert_eq!(account, format!("serviceaccount/{SERVICE_ACCOUNT}"));
}

#[test]
fn the_token_may_use_leases_in_a_bound_namespace_only() {
    let server = KubeServer::shared().expect("shared Kubernetes API server");
    let namespace = server.new_namespace("rbac").unwrap();
    assert!(namespace.starts_with("rbac-"), "{namespace}");
    let tenant = server.tenant_kubeconfig(&namespace).unwrap();
    assert_eq!(
        server.tenant_kubeconfig(&namespace).unwrap(),
        tenant,
        "cached"
    );
    let as_tenant = |args: &[&str], input: Option<&str>| server.kubectl_with(&tenant, args, input);

    // create, get, list, patch, update (replace) and watch a Lease in its namespace.
    as_tenant(&["create", "-f", "-"], Some(&lease("job", "a"))).unwrap();
    assert_eq!(holder(server, &tenant, "job").unwrap(), "a");
    as_tenant(
        &[
            "patch",
            "lease",
            "job",
            "--type=merge",
            "-p",
            r#"{"spec":{"holderIdentity":"b"}}"#,
        ],
        None,
    )
    .unwrap();
    assert_eq!(holder(server, &tenant, "job").unwrap(), "b");
    as_tenant(&["replace", "-f", "-"], Some(&lease("job", "c"))).unwrap();
    assert_eq!(holder(server, &tenant, "job").unwrap(), "c");
    let listed = as_tenant(&["get", "leases", "-o", "name"], None).unwrap();
    assert_eq!(listed, "lease.coordination.k8s.io/job");
    let watched = as_tenant(
        &[
            "get",
            "leases",
            "--watch-only",
            "--request-timeout=1s",
            "-o",
            "name",
        ],
        None,
    );
    assert!(
        !forbidden(watched),
        "a watch that times out is not a refusal"
    );
    for can in ["get", "list", "watch", "create", "update", "patch"] {
        let answer = as_tenant(&["auth", "can-i", can, "leases.coordination.k8s.io"], None);
        assert_eq!(answer.unwrap(), "yes", "{can}");
    }

    // Nothing else: not deleting leases, not other resources, not other namespaces.
    assert!(forbidden(as_tenant(&["delete", "lease", "job"], None)));
    assert!(forbidden(as_tenant(&["get", "configmaps"], None)));
    assert!(forbidden(as_tenant(
        &["create", "configmap", "c", "--from-literal=a=b"],
        None
    )));
    let unbound = format!("unbound-{}", std::process::id());
    server.kubectl(&["create", "namespace", &unbound]).unwrap();
    assert!(forbidden(as_tenant(
        &["get", "leases", "-n", &unbound],
        None
    )));
    assert!(forbidden(as_tenant(
        &["create", "-n", &unbound, "-f", "-"],
        Some(&lease("job", "a"))
    )));
    assert!(forbidden(as_tenant(
        &["get", "leases", "-n", SYSTEM_NAMESPACE],
        None
    )));
    assert!(forbidden(as_tenant(&["get", "leases", "-A"], None)));
}

#[test]
fn restarts_keep_the_data_and_the_port() {
    let started = Instant::now();
    let server = KubeServer::start().expect("Kubernetes API server");
    eprintln!("KubeServer ready in {:?}", started.elapsed());
    let namespace = server.new_namespace("restarts").unwrap();
    let tenant = server.tenant_kubeconfig(&namespace).unwrap();
    server
        .kubectl_with(&tenant, &["create", "-f", "-"], Some(&lease("job", "a")))
        .unwrap();
    let (port, etcd) = (server.port(), server.etcd().endpoint());
    let same = |what: &str| {
        assert_eq!(server.port(), port, "{what}");
        assert_eq!(server.etcd().endpoint(), etcd, "{what}");
        assert_eq!(holder(&server, &tenant, "job").unwrap(), "a", "{what}");
    };

    let restarted = Instant::now();
    server.kill_apiserver();
    assert!(server.kubectl(&["get", "--raw", "/readyz"]).is_err());
    server.restart_apiserver().unwrap();
    eprintln!(
        "API server killed and restarted in {:?}",
        restarted.elapsed()
    );
    same("after a kill and restart of the API server");

    server.stop_apiserver();
    server.restart_apiserver().unwrap();
    same("after a graceful stop and restart of the API server");

    server.pause_apiserver();
    let paused = server.kubectl(&["get", "--raw", "/readyz", "--request-timeout=1s"]);
    assert!(paused.is_err(), "a paused API server answered: {paused:?}");
    server.resume_apiserver();
    same("after a pause of the API server");

    server.etcd().kill();
    server.restart_etcd().unwrap();
    same("after a kill and restart of etcd");

    // A paused etcd makes the API server unready; it is ready again once etcd resumes.
    server.etcd().pause();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let readyz = server.kubectl(&["get", "--raw", "/readyz", "--request-timeout=3s"]);
        if readyz.is_err() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still ready 30 s after etcd paused"
        );
    }
    server.etcd().resume();
    server.wait_ready().unwrap();
    same("after a pause of etcd");
}
