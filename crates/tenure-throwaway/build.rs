//! Builds the WAL disk shim (`wal-disk/shim.rs`) as a shared library of its own, which
//! `PgServer` embeds and preloads into its servers: a crate cannot depend on a `cdylib`
//! of the workspace, so the build script compiles the one file with the same `rustc`.

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=wal-disk/shim.rs");
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let library = out.join("libtenure_wal_disk.so");
    let status = Command::new(rustc)
        .args([
            "--crate-name",
            "tenure_wal_disk",
            "--crate-type",
            "cdylib",
            "--edition",
            "2021",
            "-C",
            "opt-level=2",
            "-C",
            "panic=abort",
            "-C",
            "strip=symbols",
            "-o",
        ])
        .arg(&library)
        .arg("wal-disk/shim.rs")
        .status()
        .expect("cannot run rustc for the WAL disk shim");
    assert!(status.success(), "rustc failed to build wal-disk/shim.rs");
}
