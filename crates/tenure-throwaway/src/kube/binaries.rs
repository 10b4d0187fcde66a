//! Which programs run: the API server, kubectl and the etcd under them, from an
//! environment variable, `scripts/build-servers`' output, or `PATH`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::process::on_path;

/// `$KUBE_APISERVER_BIN` when set (and only then), else `target/servers/kube-apiserver`,
/// else `PATH`.
pub fn apiserver_binary() -> Option<PathBuf> {
    server_program("KUBE_APISERVER_BIN", "kube-apiserver", |_| true)
}

/// `$KUBECTL_BIN` when set (and only then), else `target/servers/kubectl`, else `PATH`.
pub fn kubectl_binary() -> Option<PathBuf> {
    server_program("KUBECTL_BIN", "kubectl", |_| true)
}

/// The etcd the API server runs on: `$KUBE_ETCD_BIN` when set (and only then), else
/// `target/servers/etcd`, else an `etcd` on `PATH` whose `--version` is 3.5 or later
/// (Debian's 3.4 serves Kubernetes only up to 1.30).
pub fn etcd_binary() -> Option<PathBuf> {
    server_program("KUBE_ETCD_BIN", "etcd", |bin| {
        etcd_minor_version(bin).is_some_and(|version| version >= (3, 5))
    })
}

/// Where `scripts/build-servers` puts what it builds: `target/servers` of the repository
/// this crate was compiled in.
fn built_dir() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .ancestors()
        .nth(2)
        .unwrap_or(manifest)
        .join("target/servers")
}

fn server_program(var: &str, name: &str, usable: impl Fn(&Path) -> bool) -> Option<PathBuf> {
    if let Some(bin) = std::env::var_os(var) {
        let bin = PathBuf::from(bin);
        return bin.is_file().then_some(bin);
    }
    let built = built_dir().join(name);
    if built.is_file() {
        return Some(built);
    }
    on_path(name).filter(|bin| usable(bin))
}

/// `(major, minor)` from `etcd --version` (`etcd Version: 3.6.16`).
fn etcd_minor_version(bin: &Path) -> Option<(u32, u32)> {
    let output = Command::new(bin)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&output.stdout);
    let version = text.lines().find_map(|l| l.strip_prefix("etcd Version:"))?;
    let mut parts = version.trim().split('.');
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}
