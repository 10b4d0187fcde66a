//! Bad input to `tenure`: each case is a clear message on stderr, a documented exit code
//! (2 for usage), and nothing created or changed on disk.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Output;
use std::time::Duration;

use common::{output_within, tempdir, tenure, tree};

const USAGE: i32 = 2;

/// Runs `tenure ARGS` with its state directory, home and working directory inside `dir`
/// (so a default store would be created there, where the test can see it).
fn tenure_in(dir: &Path, args: &[&str]) -> Output {
    let mut command = tenure();
    command
        .args(args)
        .current_dir(dir)
        .env("HOME", dir)
        .env("XDG_STATE_HOME", dir.join("state"));
    output_within(&mut command, Duration::from_secs(60))
}

/// Asserts exit 2, a one-line `tenure:`/`error:` message containing every `needle`, and
/// an empty stdout.
fn assert_usage(output: &Output, needles: &[&str]) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(USAGE), "stderr: {stderr}");
    for needle in needles {
        assert!(
            stderr.contains(needle),
            "missing {needle:?} in stderr: {stderr}"
        );
    }
    assert!(
        output.stdout.is_empty(),
        "stdout: {}",
        String::from_utf8_lossy(&output.stdout)
    );
    stderr
}

/// `tenure run` on `store` of a command that leaves a file `ran` in the working
/// directory: the run each bad store must refuse before anything starts.
fn run_touching(store: &str) -> Vec<&str> {
    vec![
        "run",
        "--role",
        "r",
        "--store",
        store,
        "--",
        "sh",
        "-c",
        "touch ran",
    ]
}

/// Every command that opens a store, by name, each on `store`: `run` as
/// [`run_touching`], `status`, `members` and `fence`.
fn store_commands(store: &str) -> [(&'static str, Vec<&str>); 4] {
    [
        ("run", run_touching(store)),
        ("status", vec!["status", "--store", store]),
        ("members", vec!["members", "--store", store]),
        (
            "fence",
            vec!["fence", "--resource", "x", "--token", "1", "--store", store],
        ),
    ]
}

/// Asserts `dir` holds exactly `expected` (relative paths).
fn assert_tree(dir: &Path, expected: &[&str]) {
    let found: Vec<String> = tree(dir).iter().map(|p| p.display().to_string()).collect();
    assert_eq!(found, expected, "unexpected files in {}", dir.display());
}

/// Store URLs with an unknown scheme, no scheme, or a malformed body are usage errors
/// naming what was expected; nothing is created, and no password is echoed.
#[test]
fn malformed_store_urls() {
    let dir = tempdir();
    let db = dir.path().join("x.db");
    let cases: Vec<(String, Vec<&str>)> = vec![
        (
            "foo:bar".into(),
            vec!["does not start with a scheme tenure knows", "sqlite:PATH"],
        ),
        (
            "mysql://root:hunter2@db/x".into(),
            vec!["unknown store scheme \"mysql\""],
        ),
        (
            "just-a-path.db".into(),
            vec!["the store URL has no scheme", "sqlite:PATH"],
        ),
        ("".into(), vec!["the store URL is empty"]),
        ("sqlite:".into(), vec!["no file path"]),
        (
            format!("sqlite:{}?mode=ro", db.display()),
            vec!["query parameters are not supported"],
        ),
        (
            "sqlite::memory:".into(),
            vec!["in-memory sqlite database is not supported"],
        ),
        (
            "postgres://bob:hunter2@db:notaport/x".into(),
            vec!["not a valid PostgreSQL URL"],
        ),
        (
            "postgresql://bob:hunter2@[::1/x".into(),
            vec!["not a valid PostgreSQL URL"],
        ),
    ];
    for (url, needles) in cases {
        for command in [
            vec!["run", "--role", "r", "--store", &url, "--", "true"],
            vec!["status", "--store", &url],
        ] {
            let output = tenure_in(dir.path(), &command);
            let stderr = assert_usage(&output, &needles);
            assert!(
                !stderr.contains("hunter2"),
                "password echoed for {url:?}: {stderr}"
            );
            assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
        }
    }
    assert_tree(dir.path(), &[]);
}

/// A well-formed PostgreSQL URL for a server that is not there: a runtime failure
/// (exit 1) that does not echo the password.
#[test]
fn unreachable_postgres_does_not_echo_the_password() {
    let dir = tempdir();
    let output = tenure_in(
        dir.path(),
        &["status", "--store", "postgres://bob:hunter2@127.0.0.1:1/x"],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "stderr: {stderr}");
    assert!(stderr.contains("could not connect"), "{stderr}");
    assert!(
        !stderr.contains("hunter2") && !stderr.contains("bob"),
        "{stderr}"
    );
}

/// The password is not echoed when the URL comes from `TENURE_STORE` either.
#[test]
fn password_in_env_url_is_not_echoed() {
    let dir = tempdir();
    let mut command = tenure();
    command
        .args(["run", "--role", "r", "--", "true"])
        .current_dir(dir.path())
        .env("TENURE_STORE", "postgres://bob:hunter2@db:notaport/x");
    let output = output_within(&mut command, Duration::from_secs(60));
    let stderr = assert_usage(&output, &["not a valid PostgreSQL URL"]);
    assert!(!stderr.contains("hunter2"), "{stderr}");
    assert_tree(dir.path(), &[]);
}

/// Durations that cannot work: a zero TTL, a renewal no shorter than the TTL, zero
/// intervals, an explicit kill grace or renewal that does not fit in the TTL beside the
/// other (given or derived) timings, and a non-duration. The message names the flags;
/// the database file is never created.
#[test]
fn bad_run_timings() {
    let dir = tempdir();
    let url = format!("sqlite:{}", dir.path().join("t.db").display());
    let cases: &[(&[&str], &[&str])] = &[
        (&["--ttl", "0s"], &["--ttl must be greater than 0s"]),
        (
            &["--ttl", "2s", "--renew-every", "2s"],
            &["--renew-every (2.0s) must be less than --ttl (2.0s)"],
        ),
        (
            &["--ttl", "2s", "--renew-every", "3s"],
            &["--renew-every (3.0s) must be less than --ttl (2.0s)"],
        ),
        (
            &["--renew-every", "0s"],
            &["--renew-every and --retry-every must be greater than 0s"],
        ),
        (
            &["--retry-every", "0ms"],
            &["--renew-every and --retry-every must be greater than 0s"],
        ),
        (
            &["--ttl", "2s", "--renew-every", "1s", "--kill-after", "5s"],
            &["--kill-after"],
        ),
        (&["--ttl", "2s", "--kill-after", "2s"], &["--kill-after"]),
        (
            &["--ttl", "2s", "--renew-every", "1500ms"],
            &["--renew-every"],
        ),
        (
            &["--ttl", "5x"],
            &["invalid value '5x' for '--ttl", "e.g. 500ms"],
        ),
        (&["--wait-timeout", "soon"], &["invalid value 'soon'"]),
        (
            &["--no-wait", "--wait-timeout", "1s"],
            &["cannot be used with"],
        ),
    ];
    for (flags, needles) in cases {
        let mut args = vec!["run", "--role", "r", "--store", &url];
        args.extend_from_slice(flags);
        args.extend_from_slice(&["--", "true"]);
        assert_usage(&tenure_in(dir.path(), &args), needles);
    }
    assert_tree(dir.path(), &[]);
}

/// With `--group`, a `--member-ttl` longer than `--ttl` is refused (a killed member
/// would stay the target of its shards after its session ended); nothing is created.
#[test]
fn member_ttl_longer_than_the_group_ttl() {
    let dir = tempdir();
    let url = format!("sqlite:{}", dir.path().join("t.db").display());
    let args = [
        "run",
        "--group",
        "g",
        "--shards",
        "4",
        "--store",
        &url,
        "--ttl",
        "2s",
        "--member-ttl",
        "15s",
        "--",
        "true",
    ];
    assert_usage(
        &tenure_in(dir.path(), &args),
        &["--member-ttl (15.0s)", "--ttl (2.0s)"],
    );
    assert_tree(dir.path(), &[]);
}

/// Nothing after `--`, no `--` at all, or an empty program: usage errors, nothing
/// created, nothing run.
#[test]
fn missing_or_empty_command() {
    let dir = tempdir();
    let url = format!("sqlite:{}", dir.path().join("t.db").display());
    let base = ["run", "--role", "r", "--store", url.as_str()];
    let with = |extra: &[&str]| {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        tenure_in(dir.path(), &args)
    };
    assert_usage(
        &with(&["--"]),
        &["required arguments were not provided", "<CMD>"],
    );
    assert_usage(
        &with(&[]),
        &["required arguments were not provided", "<CMD>"],
    );
    assert_usage(&with(&["--", ""]), &["the command after -- is empty"]);
    assert_tree(dir.path(), &[]);
}

/// Invalid names for the role, owner and node id are usage errors reported before the
/// store is opened (so no database file appears), naming the flag. `--owner` is a label
/// that tenure extends with a per-process suffix, so it must leave room for that.
#[test]
fn bad_names_create_nothing() {
    let long_label = "o".repeat(250);
    let dir = tempdir();
    let url = format!("sqlite:{}", dir.path().join("t.db").display());
    let cases: &[(&[&str], &str)] = &[
        (&["--role", ""], "--role \"\" must not be empty"),
        (
            &["--role", "a\tb"],
            "--role \"a\\tb\" must not contain control characters",
        ),
        (
            &["--role", "r", "--owner", ""],
            "--owner \"\" must not be empty",
        ),
        (
            &["--role", "r", "--node-id", ""],
            "--node-id \"\" must not be empty",
        ),
        (
            &["--role", "r", "--owner", long_label.as_str()],
            "--owner is 250 bytes long, at most 227 allowed (a per-process suffix is appended)",
        ),
    ];
    for (flags, needle) in cases {
        let mut args = vec!["run", "--store", &url];
        args.extend_from_slice(flags);
        args.extend_from_slice(&["--", "sh", "-c", "touch ran"]);
        assert_usage(&tenure_in(dir.path(), &args), &[needle]);
    }
    assert_tree(dir.path(), &[]);
}

/// `memory:` lives in one process: `run`, `status`, `members` and `fence` refuse it.
#[test]
fn memory_store_is_refused_where_it_must_be_shared() {
    let dir = tempdir();
    for (command, args) in store_commands("memory:") {
        let needle = format!("`tenure {command}` needs a store shared between processes");
        assert_usage(&tenure_in(dir.path(), &args), &[&needle, "sqlite:PATH"]);
    }
    let mut command = tenure();
    command
        .args(["run", "--role", "r", "--", "true"])
        .current_dir(dir.path())
        .env("HOME", dir.path())
        .env("TENURE_STORE", "memory:");
    assert_usage(
        &output_within(&mut command, Duration::from_secs(60)),
        &["needs a store shared"],
    );
    assert_tree(dir.path(), &[]);
}

/// A database in a directory that does not exist: a usage error naming the directory;
/// the directory is not created.
#[test]
fn missing_directory_is_not_created() {
    let dir = tempdir();
    let url = format!("sqlite:{}", dir.path().join("nope/deeper/t.db").display());
    for args in [
        run_touching(url.as_str()),
        vec!["status", "--store", url.as_str()],
    ] {
        let stderr = assert_usage(
            &tenure_in(dir.path(), &args),
            &["does not exist", "create it first"],
        );
        assert!(
            stderr.contains(&format!("directory {}/nope/deeper", dir.path().display())),
            "{stderr}"
        );
    }
    assert_tree(dir.path(), &[]);
}

/// A directory or a device where the database file should be: a usage error, and the
/// directory is left empty.
#[test]
fn not_a_regular_file() {
    let dir = tempdir();
    std::fs::create_dir(dir.path().join("db-dir")).unwrap();
    let url = format!("sqlite:{}", dir.path().join("db-dir").display());
    let args = run_touching(url.as_str());
    assert_usage(
        &tenure_in(dir.path(), &args),
        &["is a directory, expected a database file"],
    );
    assert_usage(
        &tenure_in(dir.path(), &["status", "--store", "sqlite:/dev/null"]),
        &["/dev/null is not a regular file"],
    );
    assert_tree(dir.path(), &["db-dir"]);
}

/// A dangling symlink into a missing directory cannot be opened: a runtime failure
/// (exit 1) naming the path and the cause; nothing is created on either end.
#[test]
fn dangling_symlink_into_missing_directory() {
    let dir = tempdir();
    let link = dir.path().join("link.db");
    std::os::unix::fs::symlink(dir.path().join("missing/target.db"), &link).unwrap();
    let url = format!("sqlite:{}", link.display());
    let output = tenure_in(dir.path(), &run_touching(&url));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&link.display().to_string()), "{stderr}");
    assert!(stderr.contains("No such file or directory"), "{stderr}");
    assert_tree(dir.path(), &["link.db"]);
}

/// A file with other content is not a SQLite database: refused with exit 2, its bytes
/// unchanged, no journal files beside it.
#[test]
fn not_a_sqlite_database_is_untouched() {
    let dir = tempdir();
    let path = dir.path().join("notes.txt");
    let content = b"precious notes, not a database\n\x00\x01\x02".to_vec();
    std::fs::write(&path, &content).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
    let url = format!("sqlite:{}", path.display());
    for (_, args) in store_commands(url.as_str()) {
        assert_usage(
            &tenure_in(dir.path(), &args),
            &["is not a SQLite database", "refusing to touch it"],
        );
    }
    assert_eq!(std::fs::read(&path).unwrap(), content);
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o640);
    assert_tree(dir.path(), &["notes.txt"]);
}

/// A hard-linked database file (each name would get its own WAL and lock: two stores
/// on one file) is refused by `run` with exit 2 and a message naming the problem; the
/// command does not run.
#[test]
fn hard_linked_database_is_refused() {
    let dir = tempdir();
    let path = dir.path().join("t.db");
    let url = format!("sqlite:{}", path.display());
    let made = tenure_in(dir.path(), &["status", "--store", url.as_str()]);
    assert!(made.status.success(), "{made:?}");
    std::fs::hard_link(&path, dir.path().join("other.db")).unwrap();
    let args = run_touching(&url);
    assert_usage(
        &tenure_in(dir.path(), &args),
        &["has 2 names (hard links)", "t.db"],
    );
    assert!(!dir.path().join("ran").exists(), "the command ran");
}

/// A read-only database file is refused up front (exit 2, saying how to fix it), and
/// neither it nor its WAL files change.
#[test]
fn read_only_database_is_untouched() {
    let dir = tempdir();
    let path = dir.path().join("ro.db");
    let url = format!("sqlite:{}", path.display());
    // A real tenure database with a lease in it.
    let made = tenure_in(
        dir.path(),
        &["run", "--role", "r", "--store", &url, "--", "true"],
    );
    assert_eq!(
        made.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let files = tree(dir.path());
    let snapshot: Vec<(std::path::PathBuf, Vec<u8>)> = files
        .iter()
        .map(|f| (f.clone(), std::fs::read(dir.path().join(f)).unwrap()))
        .collect();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o444)).unwrap();
    for args in [
        run_touching(url.as_str()),
        vec!["status", "--store", url.as_str()],
    ] {
        assert_usage(
            &tenure_in(dir.path(), &args),
            &["is read-only", "chmod u+w"],
        );
    }
    assert_eq!(tree(dir.path()), files, "files appeared or vanished");
    for (file, bytes) in snapshot {
        assert_eq!(
            std::fs::read(dir.path().join(&file)).unwrap(),
            bytes,
            "{} changed",
            file.display()
        );
    }
}

/// `tenure fence` with a token that is not a number: a usage error, nothing admitted.
#[test]
fn fence_rejects_a_non_numeric_token() {
    let dir = tempdir();
    let url = format!("sqlite:{}", dir.path().join("t.db").display());
    for token in [
        "abc",
        "-1",
        "",
        "1.5",
        "9223372036854775808",
        "99999999999999999999",
    ] {
        let flag = format!("--token={token}");
        let output = tenure_in(
            dir.path(),
            &["fence", "--resource", "x", &flag, "--store", &url],
        );
        assert_usage(&output, &["is not a fencing token"]);
    }
    assert_tree(dir.path(), &[]);
}

/// Unknown flags and subcommands: clap's message, exit 2.
#[test]
fn unknown_flags() {
    let dir = tempdir();
    assert_usage(
        &tenure_in(dir.path(), &["run", "--rol", "r", "--", "true"]),
        &["unexpected argument '--rol'"],
    );
    assert_usage(
        &tenure_in(dir.path(), &["frobnicate"]),
        &["unrecognized subcommand 'frobnicate'"],
    );
    assert_usage(
        &tenure_in(dir.path(), &["run", "--", "true"]),
        &["--role <ROLE>"],
    );
    assert_tree(dir.path(), &[]);
}
