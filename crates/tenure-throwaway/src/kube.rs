//! A throwaway Kubernetes API server: kube-apiserver on an etcd of its own, on loopback.
//!
//! [`KubeServer::start`] starts an etcd member (3.5 or later: `$KUBE_ETCD_BIN`, else the
//! `target/servers/etcd` that `scripts/build-servers` builds, else an `etcd` on `PATH`
//! that reports 3.5 or later) and `kube-apiserver` (`$KUBE_APISERVER_BIN`, else
//! `target/servers/kube-apiserver`, else `PATH`) on free loopback ports, in a fresh
//! directory (on `/dev/shm` when it exists) holding everything it writes:
//!
//! - a self-signed CA, a serving certificate for `127.0.0.1` and `localhost`, an admin
//!   client certificate ([`ADMIN_USER`] in the group `system:masters`) and the
//!   service-account signing key (and its public half), all made with the `openssl` command;
//! - an admin kubeconfig ([`KubeServer::admin_kubeconfig`]) with that client certificate;
//! - per tenant namespace, a kubeconfig holding the service account's token
//!   ([`KubeServer::tenant_kubeconfig`]).
//!
//! Once `/readyz` answers `ok` it creates, with `kubectl` (`$KUBECTL_BIN`, else
//! `target/servers/kubectl`, else `PATH`), the namespace [`SYSTEM_NAMESPACE`], the
//! service account [`SERVICE_ACCOUNT`] in it and the ClusterRole [`CLUSTER_ROLE`], which
//! grants exactly `get, list, watch, create, update, patch` on
//! `leases.coordination.k8s.io` (the RBAC the README documents, so the tests run with
//! it), and mints a 48-hour token for the service account ([`KubeServer::token`]).
//! [`KubeServer::new_namespace`] makes a namespace whose RoleBinding grants that
//! ClusterRole to the service account: the token can use Leases there and nothing else.
//!
//! Only the API server and etcd run: no controller-manager, scheduler or kubelet. So a
//! deleted namespace stays `Terminating` (no namespace controller empties it), owner
//! references are not garbage-collected, and no pod ever runs (a server-side dry run of
//! a Deployment still works).
//!
//! Fault control: the API server can be stopped, killed, restarted (same port, same
//! certificates, same data) and paused; [`KubeServer::etcd`] gives the etcd member's own
//! controls, and [`KubeServer::restart_etcd`] restarts it and waits until the API server
//! is ready again. Nothing outlives the owner: `Drop` kills both servers and removes the
//! directory, both run with `PR_SET_PDEATHSIG`, and directories of dead owners are swept
//! on the next start. The harness speaks no HTTP itself; it asks `kubectl`.

use std::collections::HashMap;
use std::fs;
use std::io::{self, Write};
use std::net::TcpStream;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use crate::error::{Result, ThrowawayError};
use crate::etcd::EtcdServer;
use crate::process::{free_ports, fresh_dir, lock, shared_server, sweep_once, ServerProcess};

mod binaries;
mod pki;

pub use binaries::{apiserver_binary, etcd_binary, kubectl_binary};
use pki::make_pki;

/// The namespace holding the tests' service account.
pub const SYSTEM_NAMESPACE: &str = "tenure-system";
/// The service account whose token [`KubeServer::token`] holds.
pub const SERVICE_ACCOUNT: &str = "tenure-test";
/// The ClusterRole [`KubeServer::new_namespace`] binds: leases only.
pub const CLUSTER_ROLE: &str = "tenure-leases";
/// The admin client certificate's user (its group is `system:masters`).
pub const ADMIN_USER: &str = "tenure-admin";

const DIR_PREFIX: &str = "tenure-kube-";
/// How long the API server may take to become ready (start, restart, or after etcd's).
const START_TIMEOUT: Duration = Duration::from_secs(60);
const BUILD: &str = "scripts/build-servers";

/// A running throwaway Kubernetes API server and its etcd.
#[derive(Debug)]
pub struct KubeServer {
    root: PathBuf,
    etcd: EtcdServer,
    apiserver: ServerProcess,
    kubectl: PathBuf,
    port: u16,
    admin_kubeconfig: PathBuf,
    ca_path: PathBuf,
    token: String,
    tenants: Mutex<HashMap<String, PathBuf>>,
}

impl KubeServer {
    /// Starts etcd and kube-apiserver, waits until `/readyz` answers `ok` (at most a
    /// minute; the error carries the log), and creates the service account, the
    /// ClusterRole and the token (see the module docs). A missing program is
    /// [`ThrowawayError::NotBuilt`] (or `NotInstalled` for `openssl`).
    pub fn start() -> Result<KubeServer> {
        static SWEPT: OnceLock<()> = OnceLock::new();
        sweep_once(DIR_PREFIX, &SWEPT);
        let not_built = |program, looked_in| ThrowawayError::NotBuilt {
            program,
            looked_in,
            build: BUILD,
        };
        let apiserver = apiserver_binary().ok_or(not_built(
            "kube-apiserver",
            "$KUBE_APISERVER_BIN, target/servers, PATH",
        ))?;
        let kubectl =
            kubectl_binary().ok_or(not_built("kubectl", "$KUBECTL_BIN, target/servers, PATH"))?;
        let etcd = etcd_binary().ok_or(not_built(
            "etcd 3.5 or later",
            "$KUBE_ETCD_BIN, target/servers, PATH",
        ))?;
        let root = fresh_dir(DIR_PREFIX)?;
        Self::start_in(root.clone(), &apiserver, kubectl, &etcd).inspect_err(|_| {
            let _ = fs::remove_dir_all(&root);
        })
    }

    fn start_in(root: PathBuf, apiserver: &Path, kubectl: PathBuf, etcd: &Path) -> Result<Self> {
        make_pki(&root.join("pki"))?;
        let etcd = EtcdServer::start_with(etcd)?;
        let port = free_ports(1)?[0];
        let mut server = KubeServer {
            apiserver: apiserver_process(&root, apiserver, &etcd.endpoint(), port),
            admin_kubeconfig: root.join("admin.kubeconfig"),
            ca_path: root.join("pki/ca.crt"),
            root,
            etcd,
            kubectl,
            port,
            token: String::new(),
            tenants: Mutex::new(HashMap::new()),
        };
        // Another process may take the port between probe and bind: three tries.
        for attempt in 1.. {
            server.write_admin_kubeconfig()?;
            server.apiserver.spawn()?;
            match server.wait_ready() {
                Ok(()) => break,
                Err(_)
                    if attempt < 3
                        && !server.apiserver.is_running()
                        && server.apiserver.log().contains("address already in use") =>
                {
                    server.apiserver.kill();
                    let _ = fs::remove_file(server.root.join("apiserver.log"));
                    server.port = free_ports(1)?[0];
                    server.apiserver = apiserver_process(
                        &server.root,
                        apiserver,
                        &server.etcd.endpoint(),
                        server.port,
                    );
                }
                Err(failure) => return Err(failure),
            }
        }
        let bootstrap = format!(
            "\
apiVersion: v1
kind: Namespace
metadata:
  name: {SYSTEM_NAMESPACE}
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {SERVICE_ACCOUNT}
  namespace: {SYSTEM_NAMESPACE}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: {CLUSTER_ROLE}
rules:
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [get, list, watch, create, update, patch]
"
        );
        let admin = &server.admin_kubeconfig;
        server.kubectl_with(admin, &["create", "-f", "-"], Some(&bootstrap))?;
        server.token = server.kubectl(&[
            "create",
            "token",
            SERVICE_ACCOUNT,
            "-n",
            SYSTEM_NAMESPACE,
            "--duration=48h",
        ])?;
        Ok(server)
    }

    /// One server shared by every caller in this process (tests isolate themselves by
    /// namespace, [`new_namespace`](KubeServer::new_namespace)), started on first use and
    /// killed at process exit; a failed start is remembered and returned to every caller.
    /// Callers that stop, kill or pause a server start their own instead.
    pub fn shared() -> std::result::Result<&'static KubeServer, &'static ThrowawayError> {
        static SHARED: OnceLock<Result<KubeServer>> = OnceLock::new();
        shared_server(&SHARED, KubeServer::start, KubeServer::kill_and_clean)
    }

    /// `https://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// The API server's port on 127.0.0.1 (the same across restarts).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The CA certificate (PEM) that signed the serving certificate.
    pub fn ca_path(&self) -> &Path {
        &self.ca_path
    }

    /// A kubeconfig that authenticates with the admin client certificate
    /// ([`ADMIN_USER`], group `system:masters`); its context's namespace is `default`.
    pub fn admin_kubeconfig(&self) -> &Path {
        &self.admin_kubeconfig
    }

    /// The token of the service account [`SERVICE_ACCOUNT`] in [`SYSTEM_NAMESPACE`]
    /// (48 hours, signed by this server's key: it survives restarts).
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The `kubectl` the harness runs.
    pub fn kubectl_path(&self) -> &Path {
        &self.kubectl
    }

    /// The API server's log (every run's, appended).
    pub fn log(&self) -> String {
        self.apiserver.log()
    }

    /// The API server's process id while it runs.
    pub fn apiserver_pid(&self) -> Option<libc::pid_t> {
        self.apiserver.pid()
    }

    /// Runs `kubectl ARGS` as the admin; its trimmed stdout, or an error with its
    /// output. Requests time out after 30 s unless `ARGS` holds another
    /// `--request-timeout`.
    pub fn kubectl(&self, args: &[&str]) -> Result<String> {
        self.kubectl_with(&self.admin_kubeconfig, args, None)
    }

    /// Runs `kubectl --kubeconfig=KUBECONFIG ARGS` (with `input` on its stdin, for `-f -`)
    /// with a cache directory of this server's and no user preferences (`KUBERC=off`);
    /// its trimmed stdout, or an error with its output (`Error from server (Forbidden)`
    /// and the like are in the error's detail).
    pub fn kubectl_with(
        &self,
        kubeconfig: &Path,
        args: &[&str],
        input: Option<&str>,
    ) -> Result<String> {
        let what = || format!("kubectl {}", args.join(" "));
        let mut command = Command::new(&self.kubectl);
        command
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg("--request-timeout=30s")
            .args(args)
            .env("KUBECACHEDIR", self.root.join("kubectl-cache"))
            .env("KUBERC", "off")
            .stdin(if input.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command
            .spawn()
            .map_err(ThrowawayError::io(format!("running {}", what())))?;
        if let (Some(input), Some(mut stdin)) = (input, child.stdin.take()) {
            // A kubectl that fails before reading its input says why in its output.
            match stdin.write_all(input.as_bytes()) {
                Err(err) if err.kind() != io::ErrorKind::BrokenPipe => {
                    return Err(ThrowawayError::io(format!("writing to {}", what()))(err));
                }
                _ => {}
            }
        }
        let output = child
            .wait_with_output()
            .map_err(ThrowawayError::io(format!("running {}", what())))?;
        if !output.status.success() {
            return Err(ThrowawayError::failed(
                format!("{} failed ({})", what(), output.status),
                format!(
                    "{}{}",
                    String::from_utf8_lossy(&output.stderr),
                    String::from_utf8_lossy(&output.stdout)
                ),
            ));
        }
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    }

    /// Creates a fresh namespace `PREFIX-N-PID` (the prefix lowercased, other characters
    /// than letters, digits and `-` turned into `-`, shortened to fit 63 characters) and
    /// a RoleBinding in it granting [`CLUSTER_ROLE`] to the service account, and waits
    /// until the service account's token may update leases there. Its name.
    pub fn new_namespace(&self, prefix: &str) -> Result<String> {
        static SEQ: AtomicUsize = AtomicUsize::new(0);
        let namespace = namespace_name(prefix, SEQ.fetch_add(1, Ordering::Relaxed));
        let manifest = format!(
            "\
apiVersion: v1
kind: Namespace
metadata:
  name: {namespace}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: {CLUSTER_ROLE}
  namespace: {namespace}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: {CLUSTER_ROLE}
subjects:
- kind: ServiceAccount
  name: {SERVICE_ACCOUNT}
  namespace: {SYSTEM_NAMESPACE}
"
        );
        self.kubectl_with(
            &self.admin_kubeconfig,
            &["create", "-f", "-"],
            Some(&manifest),
        )?;
        // The authorizer learns of the binding from a watch: wait until it has.
        let tenant = self.tenant_kubeconfig(&namespace)?;
        let mut last = String::new();
        self.apiserver
            .wait_until(
                "granting the new RoleBinding",
                START_TIMEOUT,
                Duration::from_millis(50),
                || {
                    let can = ["auth", "can-i", "update", "leases.coordination.k8s.io"];
                    match self.kubectl_with(&tenant, &can, None) {
                        Ok(answer) => answer == "yes",
                        Err(refused) => {
                            last = refused.to_string();
                            false
                        }
                    }
                },
            )
            .map_err(|failure| with_last_answer(failure, &last))?;
        Ok(namespace)
    }

    /// A kubeconfig that authenticates with the service account's [`token`] and whose
    /// context's namespace is `namespace` (written once per namespace, mode 0600).
    ///
    /// [`token`]: KubeServer::token
    pub fn tenant_kubeconfig(&self, namespace: &str) -> Result<PathBuf> {
        let mut tenants = lock(&self.tenants);
        if let Some(path) = tenants.get(namespace) {
            return Ok(path.clone());
        }
        let path = self.root.join(format!("tenant-{namespace}.kubeconfig"));
        let user = format!("    token: {}\n", quoted(&self.token));
        write_private(&path, &self.kubeconfig(SERVICE_ACCOUNT, &user, namespace))?;
        tenants.insert(namespace.to_owned(), path.clone());
        Ok(path)
    }

    /// The etcd member the API server stores its data in, for its own controls (stop,
    /// kill, pause, resume, restart). After one of them, [`wait_ready`] waits until the
    /// API server serves again; [`restart_etcd`] does both.
    ///
    /// [`wait_ready`]: KubeServer::wait_ready
    /// [`restart_etcd`]: KubeServer::restart_etcd
    pub fn etcd(&self) -> &EtcdServer {
        &self.etcd
    }

    /// Restarts etcd (same port, same data; stopping it first when it runs), waits until
    /// it is healthy and, when the API server runs, until the API server is ready again
    /// (a paused API server is running: resume it first, or this fails after a minute).
    pub fn restart_etcd(&self) -> Result<()> {
        self.etcd.restart()?;
        if self.apiserver.is_running() {
            self.wait_ready()?;
        }
        Ok(())
    }

    /// Stops the API server gracefully (SIGTERM, then SIGKILL after 15 s).
    pub fn stop_apiserver(&self) {
        self.apiserver.stop(Duration::from_secs(15));
    }

    /// Kills the API server (SIGKILL), as a crash would.
    pub fn kill_apiserver(&self) {
        self.apiserver.kill();
    }

    /// Freezes the API server (SIGSTOP): connections stay open, nothing answers.
    pub fn pause_apiserver(&self) {
        self.apiserver.pause();
    }

    /// Thaws the API server (SIGCONT).
    pub fn resume_apiserver(&self) {
        self.apiserver.resume();
    }

    /// Starts the API server again (stopping it first when it runs) on the same port with
    /// the same certificates and etcd, and waits until it is ready.
    pub fn restart_apiserver(&self) -> Result<()> {
        self.stop_apiserver();
        self.apiserver.spawn()?;
        self.wait_ready()
    }

    /// Waits until `/readyz` answers `ok` (at most a minute); the error carries the last
    /// answer and the log. Fails at once when the API server is not running.
    pub fn wait_ready(&self) -> Result<()> {
        let addr = ([127, 0, 0, 1], self.port).into();
        let mut last = String::new();
        self.apiserver
            .wait_until("ready", START_TIMEOUT, Duration::from_millis(200), || {
                if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
                    "not listening yet".clone_into(&mut last);
                    return false;
                }
                let readyz = ["get", "--raw", "/readyz", "--request-timeout=5s"];
                match self.kubectl(&readyz) {
                    Ok(answer) if answer == "ok" => true,
                    Ok(answer) => {
                        last = answer;
                        false
                    }
                    Err(failure) => {
                        last = failure.to_string();
                        false
                    }
                }
            })
            .map_err(|failure| with_last_answer(failure, &last))
    }

    fn write_admin_kubeconfig(&self) -> Result<()> {
        let pki = self.root.join("pki");
        let user = format!(
            "    client-certificate: {}\n    client-key: {}\n",
            quoted(&pki.join("admin.crt").display().to_string()),
            quoted(&pki.join("admin.key").display().to_string()),
        );
        let text = self.kubeconfig(ADMIN_USER, &user, "default");
        write_private(&self.admin_kubeconfig, &text)
    }

    fn kubeconfig(&self, user: &str, credentials: &str, namespace: &str) -> String {
        format!(
            "\
apiVersion: v1
kind: Config
clusters:
- name: throwaway
  cluster:
    server: {server}
    certificate-authority: {ca}
users:
- name: {user}
  user:
{credentials}contexts:
- name: {user}
  context:
    cluster: throwaway
    user: {user}
    namespace: {namespace}
current-context: {user}
",
            server = self.url(),
            ca = quoted(&self.ca_path().display().to_string()),
        )
    }

    fn kill_and_clean(&self) {
        self.apiserver.kill();
        self.etcd.kill_and_clean();
        let _ = fs::remove_dir_all(&self.root);
    }
}

impl Drop for KubeServer {
    fn drop(&mut self) {
        self.kill_and_clean();
    }
}

fn apiserver_process(root: &Path, bin: &Path, etcd: &str, port: u16) -> ServerProcess {
    let pki = |file: &str| root.join("pki").join(file).display().to_string();
    let args = vec![
        format!("--etcd-servers={etcd}"),
        "--bind-address=127.0.0.1".to_owned(),
        "--advertise-address=127.0.0.1".to_owned(),
        format!("--secure-port={port}"),
        format!("--cert-dir={}", pki("")),
        format!("--tls-cert-file={}", pki("serving.crt")),
        format!("--tls-private-key-file={}", pki("serving.key")),
        format!("--client-ca-file={}", pki("ca.crt")),
        "--authorization-mode=Node,RBAC".to_owned(),
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local".to_owned(),
        format!("--service-account-key-file={}", pki("sa.pub")),
        format!("--service-account-signing-key-file={}", pki("sa.key")),
        "--service-cluster-ip-range=10.96.0.0/16".to_owned(),
        // The `kubernetes` Service's endpoints would be 127.0.0.1, which the API refuses.
        "--endpoint-reconciler-type=none".to_owned(),
        "--profiling=false".to_owned(),
    ];
    ServerProcess::new(
        "kube-apiserver".to_owned(),
        bin.to_path_buf(),
        args,
        root.join("apiserver.log"),
    )
}

/// A DNS label `PREFIX-N-PID` of at most 63 characters (see
/// [`KubeServer::new_namespace`]).
fn namespace_name(prefix: &str, n: usize) -> String {
    let suffix = format!("-{n}-{}", std::process::id());
    let mut name: String = prefix
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9') => c,
            _ => '-',
        })
        .skip_while(|&c| c == '-')
        .take(63 - suffix.len())
        .collect();
    if name.is_empty() {
        name.push_str("ns");
    }
    name + &suffix
}

/// A YAML double-quoted scalar.
fn quoted(text: &str) -> String {
    format!("\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\""))
}

/// Writes `text` to a new file readable by its owner only (kubeconfigs hold credentials).
fn write_private(path: &Path, text: &str) -> Result<()> {
    let what = || format!("writing {}", path.display());
    let _ = fs::remove_file(path);
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut file| file.write_all(text.as_bytes()))
        .map_err(ThrowawayError::io(what()))
}

/// Adds the last answer a wait saw to its failure.
fn with_last_answer(failure: ThrowawayError, last: &str) -> ThrowawayError {
    match failure {
        ThrowawayError::Failed { what, detail } => ThrowawayError::Failed {
            what,
            detail: format!("{detail}\n--- the last answer:\n{last}"),
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_names_are_dns_labels() {
        let pid = std::process::id();
        assert_eq!(namespace_name("conf", 3), format!("conf-3-{pid}"));
        assert_eq!(
            namespace_name("_Scenario_Acquire", 0),
            format!("scenario-acquire-0-{pid}")
        );
        assert_eq!(namespace_name("", 1), format!("ns-1-{pid}"));
        let long = namespace_name(&"x".repeat(100), 12345);
        assert_eq!(long.len(), 63, "{long}");
        assert!(long.ends_with(&format!("-12345-{pid}")));
    }

    #[test]
    fn kubeconfig_strings_are_quoted() {
        assert_eq!(quoted(r#"/a "b"\c"#), r#""/a \"b\"\\c""#);
    }
}
