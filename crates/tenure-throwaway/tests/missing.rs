//! A server whose programs are missing is an error naming the Debian package (or the
//! script that builds them), not a panic. One test in its own binary: it points the harness at empty directories
//! through the environment, which every thread of the process shares.

use tenure_throwaway::etcd::EtcdServer;
use tenure_throwaway::kube::KubeServer;
use tenure_throwaway::postgres::PgServer;
use tenure_throwaway::ThrowawayError;

/// Checks that `error` names `package` as the Debian package to install.
#[track_caller]
fn assert_not_installed(error: &ThrowawayError, package: &str) {
    assert!(
        matches!(error, ThrowawayError::NotInstalled { package: named, .. } if *named == package),
        "{error:?}"
    );
}

#[test]
fn missing_programs_name_the_package_to_install() {
    let empty = std::env::temp_dir().join(format!("throwaway-missing-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    // SAFETY: the only test in this binary; nothing else reads the environment meanwhile.
    unsafe {
        std::env::set_var("PG_BIN_DIR", &empty);
        std::env::set_var("ETCD_BIN", empty.join("etcd"));
        std::env::set_var("KUBE_APISERVER_BIN", empty.join("kube-apiserver"));
    }
    let pg = PgServer::start().expect_err("no initdb in an empty directory");
    assert_not_installed(&pg, "postgresql");
    assert!(
        pg.to_string()
            .contains("install the Debian package `postgresql`"),
        "{pg}"
    );
    let etcd = EtcdServer::start().expect_err("no etcd binary there");
    assert_not_installed(&etcd, "etcd-server");
    let kube = KubeServer::start().expect_err("no kube-apiserver there");
    assert!(
        matches!(
            kube,
            ThrowawayError::NotBuilt {
                program: "kube-apiserver",
                build: "scripts/build-servers",
                ..
            }
        ),
        "{kube:?}"
    );
    assert!(
        kube.to_string()
            .contains("build it with `scripts/build-servers`"),
        "{kube}"
    );
    let _ = std::fs::remove_dir_all(&empty);
}
