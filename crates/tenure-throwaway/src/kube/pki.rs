//! The server's certificates, made with the `openssl` command: a self-signed CA, a serving
//! and an admin client certificate, and the service-account signing key.

use std::fs;
use std::io;
use std::path::Path;
use std::process::{Command, Stdio};

use super::ADMIN_USER;
use crate::error::{Result, ThrowawayError};

/// Ten years: no certificate or key expires during any run.
const CERT_DAYS: &str = "3650";

/// The CA, the serving and admin certificates and the service-account key, in `dir`.
pub(super) fn make_pki(dir: &Path) -> Result<()> {
    fs::create_dir_all(dir).map_err(ThrowawayError::io("creating the pki directory"))?;
    const EC: &str = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    openssl(
        dir,
        &format!(
            "req -x509 -new {EC} -keyout ca.key -out ca.crt -subj /CN=tenure-throwaway-ca \
             -days {CERT_DAYS} -addext basicConstraints=critical,CA:TRUE \
             -addext keyUsage=critical,keyCertSign,cRLSign"
        ),
    )?;
    let leaves = [
        (
            "serving",
            "/CN=kube-apiserver".to_owned(),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth",
        ),
        (
            "admin",
            format!("/O=system:masters/CN={ADMIN_USER}"),
            "extendedKeyUsage=clientAuth",
        ),
    ];
    for (serial, (name, subject, extensions)) in (2..).zip(leaves) {
        fs::write(
            dir.join(format!("{name}.ext")),
            format!("{extensions}\nkeyUsage=critical,digitalSignature\n"),
        )
        .map_err(ThrowawayError::io("writing a certificate's extensions"))?;
        openssl(
            dir,
            &format!("req -new {EC} -keyout {name}.key -out {name}.csr -subj {subject}"),
        )?;
        openssl(
            dir,
            &format!(
                "x509 -req -in {name}.csr -CA ca.crt -CAkey ca.key -set_serial {serial} \
                 -days {CERT_DAYS} -extfile {name}.ext -out {name}.crt"
            ),
        )?;
    }
    openssl(
        dir,
        "genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out sa.key",
    )?;
    openssl(dir, "pkey -in sa.key -pubout -out sa.pub")
}

/// Runs `openssl` in `dir` with `args` (split at whitespace: no argument holds a space).
fn openssl(dir: &Path, args: &str) -> Result<()> {
    let output = Command::new("openssl")
        .args(args.split_whitespace())
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .map_err(|err| match err.kind() {
            io::ErrorKind::NotFound => ThrowawayError::NotInstalled {
                program: "openssl",
                looked_in: "PATH",
                package: "openssl",
            },
            _ => ThrowawayError::Io {
                what: "running openssl".to_owned(),
                source: err,
            },
        })?;
    if !output.status.success() {
        return Err(ThrowawayError::failed(
            format!("openssl {args} failed"),
            String::from_utf8_lossy(&output.stderr),
        ));
    }
    Ok(())
}
