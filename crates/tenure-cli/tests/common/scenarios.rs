//! `tenure run` scenarios written once and run against every store URL (SQLite,
//! PostgreSQL): each takes a fresh store and a scratch directory for the scripts' files.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;

use super::*;

/// Generous bound for anything that is not itself the point of a test.
const LONG: Duration = Duration::from_secs(30);

/// The state letter of a process (`R`, `S`, `T`, `Z`, ...), if it exists.
pub fn state(pid: Pid) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..]
        .split_whitespace()
        .next()?
        .chars()
        .next()
}

/// The token on the first log line that starts with `prefix ` (the line's last word).
fn token_of(log: &Path, prefix: &str) -> Option<u64> {
    lines(log)
        .iter()
        .find(|line| line.starts_with(&format!("{prefix} ")))
        .and_then(|line| line.split_whitespace().last()?.parse().ok())
}

/// The number a log line ends with (a token); panics if it ends with none.
fn last_number(line: &str) -> u64 {
    line.split_whitespace().last().unwrap().parse().unwrap()
}

/// A command that appends `NAME TOKEN` (its fencing token) to `log`, as [`token_of`]
/// reads it.
fn logs_its_token(name: &str, log: &Path) -> String {
    format!(
        "echo \"{name} $TENURE_FENCING_TOKEN\" >> '{}'",
        log.display()
    )
}

/// Waits for a log line starting with `prefix `; panics with `context` otherwise.
fn await_line(log: &Path, prefix: &str, within: Duration, context: impl Fn() -> String) -> String {
    let mut found = None;
    let ok = wait_until(within, || {
        found = lines(log)
            .into_iter()
            .find(|l| l.starts_with(&format!("{prefix} ")));
        found.is_some()
    });
    assert!(
        ok,
        "no {prefix:?} line in {:?} after {within:?}; {}",
        lines(log),
        context()
    );
    found.unwrap()
}

/// Starts a leader on `role` whose command records `start TOKEN` in `log`, writes its
/// pid to `pid_file` and sleeps; returns once the command runs.
pub fn hold(store: &str, role: &str, owner: &str, dir: &Path) -> (Proc, Pid) {
    let pid_file = dir.join(format!("{owner}.pid"));
    let script = format!(
        "echo \"{owner} $TENURE_FENCING_TOKEN\" >> '{log}'; echo $$ > '{pid}'; exec sleep 60",
        log = dir.join("log").display(),
        pid = pid_file.display()
    );
    let mut leader = Proc::spawn(&mut run_sh(store, role, &["--owner", owner], &script));
    let mut child = None;
    let started = wait_until(LONG, || {
        child = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok());
        child.is_some() || leader.exited().is_some()
    });
    let child = match child {
        Some(pid) if started => Pid::from_raw(pid),
        _ => panic!(
            "leader {owner} did not start its command; stderr:\n{}",
            leader.stderr()
        ),
    };
    leader.own_group(child);
    (leader, child)
}

/// Three `tenure run` processes, three rounds each, on one store: the commands never
/// overlap and their fencing tokens strictly increase.
pub fn executions_never_overlap(store: &str, dir: &Path) {
    let tokens = overlap_scenario(store, &dir.join("overlap.log"), 3, 3);
    assert_eq!(tokens.len(), 9);
}

/// The leading `tenure` alone is stopped (SIGSTOP) past the TTL while a second one
/// waits: its guard kills its command at the term's deadline, before the second runs
/// its command with a higher token. On SIGCONT the first finds its leadership lost and
/// exits 4.
pub fn stopped_tenure_loses_leadership_and_kills_its_command(store: &str, dir: &Path) {
    let log = dir.join("log");
    let (mut first, first_child) = hold(store, "r", "first", dir);
    let second_script = logs_its_token("second", &log);
    let mut second = Proc::spawn(&mut run_sh(
        store,
        "r",
        &["--owner", "second"],
        &second_script,
    ));
    assert!(
        second.wait_stderr("is held by first", LONG),
        "second never saw first leading: {}",
        second.stderr()
    );
    assert!(
        token_of(&log, "second").is_none(),
        "second ran while first led"
    );

    first.signal(Signal::SIGSTOP);
    assert!(
        wait_until(LONG, || state(first.pid()) == Some('T')),
        "first not stopped"
    );
    let second_line = await_line(&log, "second", LONG, || second.stderr());
    // The guard stopped the command while its tenure was frozen, before the term passed.
    assert!(
        dead(first_child),
        "the stopped tenure's command outlived its term"
    );
    assert_eq!(second.code_within(LONG), 0, "{}", second.stderr());

    first.signal(Signal::SIGCONT);
    let code = first.code_within(LONG);
    assert_eq!(
        code,
        4,
        "first should report lost leadership; stderr:\n{}",
        first.stderr()
    );
    assert!(
        first
            .stderr()
            .contains("leadership of role \"r\" was lost; the command was stopped"),
        "{}",
        first.stderr()
    );
    assert!(
        dead(first_child),
        "the first command survived lost leadership"
    );
    let first_token = token_of(&log, "first").unwrap();
    let second_token = last_number(&second_line);
    assert!(
        second_token > first_token,
        "{second_token} <= {first_token}"
    );
}

/// The first `tenure`, its guard and its command are all frozen past the TTL (what a
/// frozen VM does: no enforcer runs): a successor runs and admits a higher token on the
/// fence. Thawed, the old command's fenced write (with its stale
/// `$TENURE_FENCING_TOKEN`) is refused with exit 3 and the highest token on stderr; then
/// it is killed and its tenure exits 4.
pub fn paused_group_is_fenced_out(store: &str, dir: &Path) {
    let log = dir.join("log");
    let pid_file = dir.join("a.pid");
    let go = dir.join("go");
    let a_err = dir.join("a.err");
    let script = format!(
        "\"$TENURE_BIN\" fence --resource res --token \"$TENURE_FENCING_TOKEN\"; \
         echo \"a-first $? $TENURE_FENCING_TOKEN\" >> '{log}'; \
         echo $$ > '{pid}'; \
         while [ ! -e '{go}' ]; do sleep 0.02; done; \
         \"$TENURE_BIN\" fence --resource res --token \"$TENURE_FENCING_TOKEN\" 2> '{err}'; \
         echo \"a-second $?\" >> '{log}'; \
         exec sleep 60",
        log = log.display(),
        pid = pid_file.display(),
        go = go.display(),
        err = a_err.display(),
    );
    let mut first =
        Proc::spawn_in_own_group(&mut run_sh(store, "r", &["--owner", "first"], &script));
    let child = read_pid(&pid_file, LONG);
    first.own_group(child);
    let first_line = await_line(&log, "a-first", LONG, || first.stderr());
    let first_token = last_number(&first_line);
    assert!(
        first_line.starts_with("a-first 0 "),
        "first fenced write refused: {first_line}"
    );

    // Freeze everything: tenure's group, its guard (a group of its own) and the
    // command's own group.
    let guard = guard_of(first.pid());
    killpg(first.pid(), Signal::SIGSTOP).unwrap();
    kill(guard, Signal::SIGSTOP).unwrap();
    killpg(child, Signal::SIGSTOP).unwrap();
    // A shell frozen mid-vfork shows `D` (waiting on its stopped child): frozen too.
    let frozen = |pid| matches!(state(pid), Some('T' | 'D'));
    assert!(
        wait_until(LONG, || frozen(first.pid()) && frozen(child)),
        "not stopped: tenure {:?}, command {:?}; stderr:\n{}",
        state(first.pid()),
        state(child),
        first.stderr()
    );

    let second_script = format!(
        "\"$TENURE_BIN\" fence --resource res --token \"$TENURE_FENCING_TOKEN\"; \
         echo \"b $? $TENURE_FENCING_TOKEN\" >> '{}'",
        log.display()
    );
    let second = Proc::spawn(&mut run_sh(
        store,
        "r",
        &["--owner", "second"],
        &second_script,
    ));
    let output = second.finish(LONG);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let b_line = await_line(&log, "b", LONG, String::new);
    let second_token = last_number(&b_line);
    assert!(
        b_line.starts_with("b 0 "),
        "successor's fenced write refused: {b_line}"
    );
    assert!(second_token > first_token);

    // Thaw the old command first: it does its fenced write with the stale token.
    std::fs::write(&go, b"").unwrap();
    killpg(child, Signal::SIGCONT).unwrap();
    let a_second = await_line(&log, "a-second", LONG, || first.stderr());
    assert_eq!(a_second, "a-second 3", "stale write not fenced");
    let err = std::fs::read_to_string(&a_err).unwrap();
    assert!(err.contains(&format!("highest={second_token}")), "{err}");
    assert!(
        err.contains(&format!("token {first_token} is older")),
        "{err}"
    );

    killpg(first.pid(), Signal::SIGCONT).unwrap();
    kill(guard, Signal::SIGCONT).unwrap();
    assert_eq!(first.code_within(LONG), 4, "{}", first.stderr());
    assert!(dead(child), "the old command survived");
}

/// SIGTERM to the leading `tenure` is forwarded to its command, which dies; the lease
/// is released at once, so a waiting `tenure` that would otherwise retry only every
/// 60 s starts its command within a second.
pub fn sigterm_hands_over_at_once(store: &str, dir: &Path) {
    let log = dir.join("log");
    let (mut first, first_child) = hold(store, "r", "first", dir);
    let second_script = logs_its_token("second", &log);
    let flags = [
        "--ttl",
        "20s",
        "--renew-every",
        "2s",
        "--kill-after",
        "1s",
        "--retry-every",
        "60s",
        "--owner",
        "second",
    ];
    let mut second = Proc::spawn(&mut run_sh_with(store, "r", &flags, &second_script));
    assert!(
        second.wait_stderr("is held by first", LONG),
        "{}",
        second.stderr()
    );
    // Let the waiter settle into its wait for a change.
    std::thread::sleep(Duration::from_millis(200));

    let sent = Instant::now();
    first.signal(Signal::SIGTERM);
    let (mut child_died, mut first_exited, mut started) = (None, None, None);
    assert!(
        wait_until(LONG, || {
            if child_died.is_none() && dead(first_child) {
                child_died = Some(sent.elapsed());
            }
            if first_exited.is_none() && first.exited().is_some() {
                first_exited = Some(sent.elapsed());
            }
            if started.is_none() && token_of(&log, "second").is_some() {
                started = Some(sent.elapsed());
            }
            started.is_some()
        }),
        "second never started: {}",
        second.stderr()
    );
    let took = started.unwrap();
    let timeline = format!(
        "command died after {child_died:?}, first tenure exited after {first_exited:?}, \
         second command started after {took:?}"
    );
    eprintln!("SIGTERM handover: {timeline}");
    assert!(took < Duration::from_secs(1), "too slow: {timeline}");
    assert_eq!(first.code_within(LONG), 128 + 15, "{}", first.stderr());
    assert!(dead(first_child));
    assert_eq!(second.code_within(LONG), 0, "{}", second.stderr());
}

/// While another owner leads: `--no-wait` exits 75 at once, `--wait-timeout 1s` exits
/// 124 after about a second, and SIGTERM to a waiting `tenure` exits 143; none of them
/// runs its command.
pub fn busy_role(store: &str, dir: &Path) {
    let (_leader, _) = hold(store, "busy", "holder", dir);
    let ran = dir.join("ran");
    let script = format!("touch '{}'", ran.display());

    let started = Instant::now();
    let output = output_within(&mut run_sh(store, "busy", &["--no-wait"], &script), LONG);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(75), "{stderr}");
    assert!(stderr.contains("is held by holder-"), "{stderr}");
    assert!(stderr.contains("not waiting (--no-wait)"), "{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "--no-wait waited {:?}",
        started.elapsed()
    );

    let started = Instant::now();
    let output = output_within(
        &mut run_sh(store, "busy", &["--wait-timeout", "1s"], &script),
        LONG,
    );
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(124), "{stderr}");
    assert!(
        stderr.contains("not leader of role \"busy\" within --wait-timeout 1.0s"),
        "{stderr}"
    );
    assert!(took >= Duration::from_secs(1), "gave up early: {took:?}");
    assert!(took < Duration::from_secs(15), "gave up late: {took:?}");

    let mut waiter = Proc::spawn(&mut run_sh(store, "busy", &[], &script));
    assert!(waiter.wait_stderr("; waiting", LONG), "{}", waiter.stderr());
    waiter.signal(Signal::SIGTERM);
    assert_eq!(waiter.code_within(LONG), 128 + 15, "{}", waiter.stderr());
    assert!(
        waiter
            .stderr()
            .contains("while waiting for role \"busy\"; giving up"),
        "{}",
        waiter.stderr()
    );

    assert!(!ran.exists(), "a command ran while the role was held");
}

/// The command's exit code passes through (7; 128+9 when killed by SIGKILL); a missing
/// program is 127 and a non-executable one 126, with a message. Each run releases the
/// lease, so the next `--no-wait` run gets it.
pub fn exit_codes_pass_through(store: &str, dir: &Path) {
    let not_exec = dir.join("not-executable.sh");
    std::fs::write(&not_exec, "#!/bin/sh\nexit 0\n").unwrap();
    let missing = dir.join("no-such-program");
    let not_exec = not_exec.display().to_string();
    let missing = missing.display().to_string();
    let cases: Vec<(Vec<&str>, i32, &str)> = vec![
        (vec!["sh", "-c", "exit 7"], 7, ""),
        (vec!["sh", "-c", "kill -KILL $$"], 128 + 9, ""),
        (vec![&missing], 127, "cannot run"),
        (vec![&not_exec], 126, "cannot run"),
        (vec!["true"], 0, ""),
        (vec!["sh", "-c", "exit 255"], 255, ""),
    ];
    for (command, code, message) in cases {
        let mut run = tenure();
        run.args(["run", "--role", "codes", "--store", store, "--no-wait"])
            .args(FAST)
            .arg("--")
            .args(&command);
        let output = output_within(&mut run, LONG);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(code), "{command:?}: {stderr}");
        assert!(stderr.contains(message), "{command:?}: {stderr}");
    }
}

/// `TENURE_FENCING_TOKEN`, `TENURE_ROLE`, `TENURE_OWNER` and `TENURE_STORE` are set by
/// tenure, overriding values inherited from its own environment; other variables pass
/// through. The token is the one the store records.
pub fn env_overrides_inherited(store: &str, dir: &Path) {
    let out = dir.join("env.txt");
    let script = format!(
        "printf '%s\\n' \"$TENURE_FENCING_TOKEN\" \"$TENURE_ROLE\" \"$TENURE_OWNER\" \
         \"$TENURE_STORE\" \"$UNRELATED\" > '{}'",
        out.display()
    );
    let mut run = run_sh(store, "env-role", &["--owner", "env-owner"], &script);
    run.env("TENURE_FENCING_TOKEN", "bogus")
        .env("TENURE_ROLE", "bogus")
        .env("TENURE_OWNER", "bogus")
        .env("TENURE_STORE", "sqlite:/bogus/elsewhere.db")
        .env("UNRELATED", "kept");
    let output = output_within(&mut run, LONG);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let env = lines(&out);
    assert_eq!(env.len(), 5, "{env:?}");
    let token: u64 = env[0]
        .parse()
        .unwrap_or_else(|_| panic!("token {:?}", env[0]));
    assert!(token >= 1);
    assert_eq!(env[1], "env-role");
    assert!(
        env[2].starts_with("env-owner-"),
        "a label with a suffix: {env:?}"
    );
    assert_eq!(&env[3..], [store, "kept"]);

    let mut status = tenure();
    status.args(["status", "--role", "env-role", "--json", "--store", store]);
    let output = output_within(&mut status, LONG);
    let rows: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(rows[0]["fencing_token"], token, "{rows}");
    assert_eq!(rows[0]["live"], false, "released on exit: {rows}");
}

/// SIGINT is forwarded: a command that traps it exits with its own code, which tenure
/// passes through.
pub fn sigint_is_forwarded(store: &str, dir: &Path) {
    let log = dir.join("log");
    let pid_file = dir.join("trap.pid");
    let script = format!(
        "trap 'echo got-int >> \"{log}\"; exit 42' INT; echo $$ > '{pid}'; \
         while :; do sleep 0.05; done",
        log = log.display(),
        pid = pid_file.display()
    );
    let (mut run, _) = start_run_sh(store, "int", &[], &script, &pid_file, LONG);
    // Leadership is observed before the command starts; give the loop a moment anyway.
    std::thread::sleep(Duration::from_millis(100));
    run.signal(Signal::SIGINT);
    assert_eq!(run.code_within(LONG), 42, "{}", run.stderr());
    assert_eq!(lines(&log), ["got-int"]);
}

/// Runs `tenure ARGS --store STORE` to completion; returns (exit code, stdout, stderr).
pub fn tenure_on(store: &str, args: &[&str]) -> (i32, String, String) {
    let mut command = tenure();
    command.args(args).args(["--store", store]);
    let output = output_within(&mut command, LONG);
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// `status --json` parsed, asserting exit 0.
fn status_json(store: &str, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["status", "--json"];
    args.extend_from_slice(extra);
    let (code, stdout, stderr) = tenure_on(store, &args);
    assert_eq!(code, 0, "{stderr}");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout:?}"))
}

/// Starts `tenure run --role ROLE EXTRA` whose command writes what `print` prints to
/// `out` and then sleeps a minute, and waits until the command runs (it writes its pid
/// to `out` with `.pid` added).
fn start_printing(store: &str, role: &str, extra: &[&str], print: &str, out: &Path) -> Proc {
    let pid_file = out.with_extension("pid");
    let script = format!(
        "{print} > '{}'; echo $$ > '{}'; exec sleep 60",
        out.display(),
        pid_file.display()
    );
    start_run_sh(store, role, extra, &script, &pid_file, LONG).0
}

/// `status` (table and `--json`) and `members` (table and `--json`) while a
/// `tenure run --node-id` leads, and after it exits: the holder, token and expiry; the
/// node with its metadata, gone once it left.
pub fn status_and_members(store: &str, dir: &Path) {
    assert_eq!(status_json(store, &[]), serde_json::json!([]));
    let (code, stdout, _) = tenure_on(store, &["status"]);
    assert_eq!((code, stdout.as_str()), (0, "no leases\n"));
    let (code, stdout, _) = tenure_on(store, &["members"]);
    assert_eq!((code, stdout.as_str()), (0, "no live members\n"));

    let owner_file = dir.join("owner");
    let mut leader = start_printing(
        store,
        "reports",
        &["--owner", "owner-1", "--node-id", "node-1"],
        "echo \"$TENURE_OWNER\"",
        &owner_file,
    );
    // `--owner` is a label; the owner id adds a per-process suffix.
    let owner = lines(&owner_file).concat();
    assert!(owner.starts_with("owner-1-"), "{owner:?}");
    let owner = owner.as_str();

    let rows = status_json(store, &[]);
    let lease = &rows[0];
    assert_eq!(rows.as_array().unwrap().len(), 1, "{rows}");
    assert_eq!(lease["role"], "reports");
    assert_eq!(lease["holder"], owner);
    assert_eq!(lease["live"], true);
    let token = lease["fencing_token"].as_u64().expect("token");
    assert!(token >= 1);
    let expires = lease["expires_in_ms"].as_u64().expect("expiry");
    assert!(
        expires > 0 && expires <= 3_000,
        "expires in {expires} ms with a 3 s ttl"
    );
    let one = status_json(store, &["--role", "reports"]);
    assert_eq!(one.as_array().unwrap().len(), 1, "{one}");
    for field in ["role", "holder", "live", "fencing_token"] {
        assert_eq!(one[0][field], lease[field], "{one}");
    }
    assert_eq!(
        status_json(store, &["--role", "other"]),
        serde_json::json!([])
    );

    let (code, stdout, _) = tenure_on(store, &["status"]);
    assert_eq!(code, 0);
    let table: Vec<&str> = stdout.lines().collect();
    assert_eq!(table.len(), 2, "{stdout}");
    let header: Vec<&str> = table[0].split_whitespace().collect();
    assert_eq!(header, ["ROLE", "HOLDER", "TOKEN", "EXPIRES"]);
    let row: Vec<&str> = table[1].split_whitespace().collect();
    assert_eq!(
        row[..3],
        ["reports", owner, token.to_string().as_str()],
        "{stdout}"
    );
    assert_eq!(row[3], "in", "{stdout}");
    // Columns line up: each cell starts where its header does.
    assert_eq!(table[1].find(owner), table[0].find("HOLDER"), "{stdout}");

    let (code, stdout, stderr) = tenure_on(store, &["members", "--json"]);
    assert_eq!(code, 0, "{stderr}");
    let members: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(members.as_array().unwrap().len(), 1, "{members}");
    let node = &members[0];
    assert_eq!(node["node_id"], "node-1");
    assert_eq!(node["metadata"]["role"], "reports");
    assert_eq!(node["metadata"]["owner"], owner);
    assert_eq!(node["metadata"]["pid"], leader.pid().as_raw().to_string());
    let age = node["last_heartbeat_age_ms"].as_u64().expect("age");
    assert!(
        age < 15_000,
        "heartbeat {age} ms old with a 15 s member ttl"
    );
    assert!(node["member_for_ms"].as_u64().is_some(), "{node}");

    let (code, stdout, _) = tenure_on(store, &["members"]);
    assert_eq!(code, 0);
    let table: Vec<&str> = stdout.lines().collect();
    assert_eq!(table.len(), 2, "{stdout}");
    assert!(table[0].starts_with("NODE"), "{stdout}");
    assert!(
        table[0].contains("LAST HEARTBEAT") && table[0].contains("METADATA"),
        "{stdout}"
    );
    assert!(table[1].starts_with("node-1 "), "{stdout}");
    assert!(table[1].contains(" ago"), "{stdout}");
    assert!(
        table[1].contains(&format!("owner={owner}")) && table[1].contains("role=reports"),
        "{stdout}"
    );

    leader.signal(Signal::SIGTERM);
    assert_eq!(leader.code_within(LONG), 128 + 15, "{}", leader.stderr());
    let rows = status_json(store, &[]);
    assert_eq!(rows[0]["role"], "reports");
    assert_eq!(rows[0]["live"], false, "released: {rows}");
    assert_eq!(rows[0]["holder"], serde_json::Value::Null);
    assert_eq!(
        rows[0]["fencing_token"], token,
        "the token survives release"
    );
    assert_eq!(rows[0]["expires_in_ms"], serde_json::Value::Null);
    let (_, stdout, _) = tenure_on(store, &["status"]);
    assert!(
        stdout.lines().nth(1).unwrap().ends_with("released"),
        "{stdout}"
    );
    let (code, stdout, _) = tenure_on(store, &["members", "--json"]);
    assert_eq!((code, stdout.trim()), (0, "[]"), "the node left on exit");
}

/// `tenure run --advertise` publishes a value with each term: the command gets it as
/// TENURE_LEADER_VALUE, `status --json` and `tenure leader` show it, and `tenure leader
/// --watch --json` prints the new leader and then `null` when it exits. Bad values and
/// roles are usage errors.
pub fn leader_and_advertise(store: &str, dir: &Path) {
    let (code, stdout, stderr) = tenure_on(store, &["leader", "--role", "web"]);
    assert_eq!((code, stdout.as_str()), (0, "web: no leader\n"), "{stderr}");
    let (code, stdout, _) = tenure_on(store, &["leader", "--role", "web", "--json"]);
    let line: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        (code, line),
        (0, serde_json::json!({"role": "web", "leader": null}))
    );

    let mut watcher = tenure();
    watcher.args([
        "leader", "--role", "web", "--watch", "--json", "--store", store,
    ]);
    let mut watcher = Proc::spawn(&mut watcher);
    let watched = |n: usize| {
        wait_until(LONG, || watcher.stdout().lines().count() >= n);
        let stdout = watcher.stdout();
        let lines: Vec<serde_json::Value> = stdout
            .lines()
            .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line:?}")))
            .collect();
        assert!(lines.len() >= n, "{stdout}\n{}", watcher.stderr());
        lines
    };
    assert_eq!(watched(1)[0]["leader"], serde_json::Value::Null);

    let url = "http://10.1.2.3:8080/a b";
    let value_file = dir.join("value");
    let mut leader = start_printing(
        store,
        "web",
        &["--advertise", url, "--owner", "web-1"],
        "printf %s \"$TENURE_LEADER_VALUE\"",
        &value_file,
    );
    assert!(wait_until(LONG, || std::fs::read_to_string(&value_file)
        .is_ok_and(|v| v == url)));

    let rows = status_json(store, &["--role", "web"]);
    assert_eq!(rows[0]["value"], url, "{rows}");
    let token = rows[0]["fencing_token"].as_u64().expect("token");
    let owner = rows[0]["holder"].as_str().expect("holder").to_owned();
    let (code, stdout, _) = tenure_on(store, &["leader", "--role", "web"]);
    assert_eq!(
        (code, stdout),
        (0, format!("web: {owner} (token {token}) at {url}\n"))
    );
    let seen = watched(2);
    assert_eq!(
        seen[1],
        serde_json::json!({"role": "web", "leader":
            {"owner": owner, "fencing_token": token, "value": url}}),
    );

    leader.signal(Signal::SIGTERM);
    assert_eq!(leader.code_within(LONG), 128 + 15, "{}", leader.stderr());
    let seen = watched(3);
    assert_eq!(seen[2]["leader"], serde_json::Value::Null, "released");
    watcher.signal(Signal::SIGINT);
    assert_eq!(watcher.code_within(LONG), 0, "{}", watcher.stderr());
    let rows = status_json(store, &["--role", "web"]);
    assert_eq!(rows[0]["value"], serde_json::Value::Null, "{rows}");

    let long = "v".repeat(1025);
    let (code, _, stderr) = tenure_on(
        store,
        &["run", "--role", "web", "--advertise", &long, "--", "true"],
    );
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("--advertise is 1025 bytes long, at most 1024"),
        "{stderr}"
    );
    let (code, _, stderr) = tenure_on(store, &["leader", "--role", ""]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("--role"), "{stderr}");
    let (code, _, stderr) = tenure_on(store, &["leader"]);
    assert_eq!(code, 2, "{stderr}");
}

/// A leader killed with SIGKILL cannot release: its lease shows as expired (holder in
/// parentheses) once the TTL passes, and its command died with it.
pub fn killed_leader_lease_expires(store: &str, dir: &Path) {
    let (leader, child) = hold(store, "crashy", "doomed", dir);
    leader.signal(Signal::SIGKILL);
    // The command's parent-death signal takes it down with tenure.
    assert!(
        wait_until(LONG, || dead(child)),
        "the command outlived tenure"
    );
    let rows = status_json(store, &["--role", "crashy"]);
    assert_eq!(
        rows[0]["live"], true,
        "still held until the ttl passes: {rows}"
    );
    assert!(
        wait_until(LONG, || status_json(store, &["--role", "crashy"])[0]
            ["live"]
            == false),
        "never expired"
    );
    let (code, stdout, _) = tenure_on(store, &["status", "--role", "crashy"]);
    assert_eq!(code, 0);
    let row: Vec<&str> = stdout.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(row[0], "crashy");
    assert!(
        row[1].starts_with("(doomed-") && row[1].ends_with(')'),
        "the label with its suffix: {stdout}"
    );
    assert_eq!(row[3], "expired", "{stdout}");
}

/// `tenure fence`: tokens at or above the highest are admitted (exit 0); an older one is
/// refused with exit 3 and `highest=N` on stderr; resources are independent.
pub fn fence_admits_and_refuses(store: &str, _dir: &Path) {
    let fence = |resource: &str, token: &str| {
        tenure_on(store, &["fence", "--resource", resource, "--token", token])
    };
    assert_eq!(fence("db", "5").0, 0);
    assert_eq!(fence("db", "5").0, 0, "an equal token is admitted");
    let (code, stdout, stderr) = fence("db", "3");
    assert_eq!(code, 3, "{stderr}");
    assert!(stdout.is_empty());
    assert!(
        stderr.contains("token 3 is older than the highest admitted token for \"db\""),
        "{stderr}"
    );
    assert!(stderr.lines().any(|l| l == "highest=5"), "{stderr}");
    assert_eq!(fence("other", "1").0, 0, "resources are independent");
    assert_eq!(fence("db", "8").0, 0);
    let (code, _, stderr) = fence("db", "7");
    assert_eq!(code, 3);
    assert!(stderr.lines().any(|l| l == "highest=8"), "{stderr}");
}

/// A command that exits 0 but leaves processes behind: a background job, one that left
/// the session and process group (`setsid`), and a double-forked orphan that ignores
/// SIGTERM. Every one of them is gone by the time a waiting `tenure` takes the role over
/// (so before the lease was released), and the first `tenure` still exits 0.
pub fn leftovers_are_stopped_before_release(store: &str, dir: &Path) {
    let pid = |name: &str| dir.join(format!("{name}.pid"));
    let go = dir.join("go");
    let script = format!(
        "sleep 30 & echo $! > '{bg}'; \
         setsid sh -c 'echo $$ > \"{setsid}\"; exec sleep 30' & \
         ( sh -c 'trap \"\" TERM; echo $$ > \"{orphan}\"; exec sleep 30' & ); \
         while [ ! -e '{go}' ]; do sleep 0.02; done; exit 0",
        bg = pid("bg").display(),
        setsid = pid("setsid").display(),
        orphan = pid("orphan").display(),
        go = go.display(),
    );
    let mut first = Proc::spawn(&mut run_sh(store, "leftovers", &[], &script));
    let leftovers: Vec<(&str, Pid)> = ["bg", "setsid", "orphan"]
        .into_iter()
        .map(|name| (name, read_pid(&pid(name), LONG)))
        .collect();
    // Whatever happens, the test leaves none of them running.
    for (_, leftover) in &leftovers {
        first.own_group(*leftover);
    }

    let report = dir.join("report");
    let check = leftovers
        .iter()
        .map(|(name, pid)| {
            format!(
                "if kill -0 {pid} 2>/dev/null; then echo '{name} alive'; else echo '{name} gone'; fi"
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    let check = format!("{{ {check}; }} > '{}'", report.display());
    let mut second = Proc::spawn(&mut run_sh(store, "leftovers", &[], &check));
    assert!(second.wait_stderr("; waiting", LONG), "{}", second.stderr());

    std::fs::write(&go, "").unwrap();
    assert_eq!(first.code_within(LONG), 0, "{}", first.stderr());
    for (name, leftover) in &leftovers {
        assert!(dead(*leftover), "{name} ({leftover}) outlived tenure");
    }
    assert_eq!(second.code_within(LONG), 0, "{}", second.stderr());
    assert_eq!(
        lines(&report),
        ["bg gone", "setsid gone", "orphan gone"],
        "the successor's command saw the old term's processes"
    );
}

/// `--owner` is a label: two `tenure` processes given the same one are two owners. While
/// the first leads, the second (`--no-wait`) finds the role busy (75) and runs nothing,
/// and the holder it names is the label with a per-process suffix.
pub fn same_owner_label_is_two_owners(store: &str, dir: &Path) {
    let (_leader, _) = hold(store, "label", "cronhost", dir);
    let ran = dir.join("ran");
    let output = output_within(
        &mut run_sh(
            store,
            "label",
            &["--owner", "cronhost", "--no-wait"],
            &format!("touch '{}'", ran.display()),
        ),
        LONG,
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !ran.exists(),
        "a second command ran under the same label: {stderr}"
    );
    assert_eq!(output.status.code(), Some(75), "{stderr}");
    assert!(stderr.contains("is held by cronhost-"), "{stderr}");
    let log = lines(&dir.join("log"));
    assert!(
        log.len() == 1 && log[0].starts_with("cronhost "),
        "one term only: {log:?}"
    );
}

/// `--ttl` alone, for every TTL in `ttls`, gives a configuration that starts the command
/// (the other timings are derived from it).
pub fn ttl_alone_starts(store: &str, dir: &Path, ttls: &[&str]) {
    let ran = dir.join("ran");
    for ttl in ttls {
        let mut run = tenure();
        run.args(["run", "--role", "ttl-alone", "--store", store, "--ttl", ttl])
            .args(["--", "sh", "-c"])
            .arg(format!("echo {ttl} >> '{}'", ran.display()));
        let output = output_within(&mut run, LONG);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "--ttl {ttl}: {stderr}");
    }
    assert_eq!(lines(&ran), ttls, "every run ran its command once");
}

/// Every `--ttl` from 1 s to 1 h (a sample) on the SQL stores.
pub fn every_ttl_alone_starts(store: &str, dir: &Path) {
    ttl_alone_starts(
        store,
        dir,
        &["1s", "2s", "3s", "5s", "10s", "30s", "1m", "10m", "1h"],
    );
}

/// Starts a leader on `role` with `flags` whose command writes its pid to `NAME.pid` and
/// appends a `tick` line to `NAME.ticks` every 50 ms; returns once it runs.
fn ticking(
    store: &str,
    role: &str,
    flags: &[&str],
    name: &str,
    dir: &Path,
) -> (Proc, Pid, PathBuf) {
    let ticks = dir.join(format!("{name}.ticks"));
    let pid_file = dir.join(format!("{name}.pid"));
    let script = format!(
        "echo $$ > '{pid}'; while :; do echo tick >> '{ticks}'; sleep 0.05; done",
        pid = pid_file.display(),
        ticks = ticks.display()
    );
    let run = &mut run_sh_with(store, role, flags, &script);
    let (leader, child) = start_writing_pid(run, &pid_file, LONG);
    (leader, child, ticks)
}

/// Whether `pid` cannot run until it is resumed: stopped (`T`), or blocked in `vfork`
/// (`D`) behind a child stopped before its exec. dash starts a command with vfork, so a
/// Ctrl-Z landing between the two stops the child, and the shell, its SIGSTOP pending,
/// waits on it until a SIGCONT.
fn suspended(pid: Pid) -> bool {
    match state(pid) {
        Some('T') => true,
        Some('D') => std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|child| child.parse().ok())
            .any(|child| state(Pid::from_raw(child)) == Some('T')),
        _ => false,
    }
}

/// Waits until `pid` is suspended (see [`suspended`]), or, with `stopped` false, not.
fn await_stopped(pid: Pid, stopped: bool, what: &str) {
    assert!(
        wait_until(LONG, || suspended(pid) == stopped),
        "{what} ({pid}) is in state {:?}, expected stopped={stopped}",
        state(pid)
    );
}

/// Ctrl-Z (SIGTSTP to `tenure`) stops the command as well as tenure, as a shell stops a
/// job; SIGCONT to `tenure` resumes both, and the command goes on under the same term.
pub fn ctrl_z_suspends_the_command_too(store: &str, dir: &Path) {
    // The whole suspension must fit in one term: a TTL long enough that a loaded machine
    // (the test observing the stop late, a slow renewal before it) cannot lose it.
    let flags = [
        "--ttl",
        "30s",
        "--renew-every",
        "300ms",
        "--kill-after",
        "300ms",
    ];
    let (leader, child, ticks) = ticking(store, "tstp", &flags, "first", dir);
    leader.signal(Signal::SIGTSTP);
    await_stopped(leader.pid(), true, "tenure");
    await_stopped(child, true, "the command");

    leader.signal(Signal::SIGCONT);
    await_stopped(leader.pid(), false, "tenure");
    await_stopped(child, false, "the command");
    let before = lines(&ticks).len();
    assert!(
        wait_until(LONG, || lines(&ticks).len() > before),
        "the command did not go on after SIGCONT"
    );
    let mut leader = leader;
    leader.signal(Signal::SIGTERM);
    assert_eq!(leader.code_within(LONG), 128 + 15, "{}", leader.stderr());
}

/// A `tenure` suspended with Ctrl-Z past the TTL loses the role to a waiting one. Its
/// command is killed where it stands (by the guard at the term's deadline, or by tenure
/// on SIGCONT, whichever comes first: it never runs again, no tick after the
/// suspension), and on SIGCONT tenure exits 4.
pub fn lost_while_suspended_is_killed_not_resumed(store: &str, dir: &Path) {
    let (mut first, child, ticks) = ticking(store, "tstp-lost", &FAST, "first", dir);
    let taken = dir.join("taken");
    let mut second = Proc::spawn(&mut run_sh(
        store,
        "tstp-lost",
        &[],
        &format!("echo \"$TENURE_FENCING_TOKEN\" > '{}'", taken.display()),
    ));
    assert!(second.wait_stderr("; waiting", LONG), "{}", second.stderr());

    first.signal(Signal::SIGTSTP);
    await_stopped(child, true, "the command");
    let stopped_at = lines(&ticks).len();
    assert_eq!(second.code_within(LONG), 0, "{}", second.stderr());
    assert_eq!(
        lines(&taken),
        ["2"],
        "the waiting tenure took the role over"
    );

    first.signal(Signal::SIGCONT);
    assert_eq!(first.code_within(LONG), 4, "{}", first.stderr());
    assert!(dead(child), "the suspended command outlived its term");
    assert_eq!(
        lines(&ticks).len(),
        stopped_at,
        "the command ran after its term"
    );
    assert!(
        first
            .stderr()
            .contains("leadership of role \"tstp-lost\" was lost; the command was stopped"),
        "{}",
        first.stderr()
    );
}

/// A lost term stops what the command started outside its process group too: the
/// leading `tenure` is stopped (SIGSTOP) past the TTL and a waiting one takes over; on
/// SIGCONT the first exits 4, and the `setsid` process its command started is gone.
pub fn lost_term_stops_escaped_processes(store: &str, dir: &Path) {
    let escaped_pid = dir.join("escaped.pid");
    let script = format!(
        "setsid sh -c 'echo $$ > \"{}\"; exec sleep 60' & exec sleep 60",
        escaped_pid.display()
    );
    let mut first = Proc::spawn(&mut run_sh(store, "escaped", &[], &script));
    let escaped = read_pid(&escaped_pid, LONG);
    first.own_group(escaped);
    let mut second = Proc::spawn(&mut run_sh(store, "escaped", &[], "true"));
    assert!(second.wait_stderr("; waiting", LONG), "{}", second.stderr());

    first.signal(Signal::SIGSTOP);
    assert_eq!(second.code_within(LONG), 0, "{}", second.stderr());
    first.signal(Signal::SIGCONT);
    assert_eq!(first.code_within(LONG), 4, "{}", first.stderr());
    assert!(dead(escaped), "the setsid process outlived the lost term");
}

/// The shard count of the group scenario.
const SHARDS: u32 = 6;

/// One member: records `start SHARD TOKEN OWNER ROLE SHARDS` and `stop SHARD TOKEN
/// OWNER` lines in `log`. Each command holds an exclusive `flock` on its shard's file in
/// the log's directory while it (or anything it started) runs, and records `overlap SHARD
/// TOKEN OWNER` if it cannot take it at once: the kernel frees the lock only when the last
/// process holding it is gone, so the record says two commands of a shard ran at once,
/// however the first one ended. The stop line alone could not say it: a command SIGKILLed
/// after `--kill-after` (its shell starved on a busy host) never writes one, and before
/// the trap came first neither did one stopped between its start line and its trap.
fn member(store: &str, node: &str, log: &Path) -> Proc {
    let dir = log.parent().expect("the log is in a directory");
    let script = format!(
        "trap 'echo \"stop $TENURE_SHARD $TENURE_FENCING_TOKEN $TENURE_OWNER\" >> {log}; exit 0' TERM; \
         exec 9>>\"{dir}/shard-$TENURE_SHARD.lock\"; \
         flock -n 9 || echo \"overlap $TENURE_SHARD $TENURE_FENCING_TOKEN $TENURE_OWNER\" >> {log}; \
         echo \"start $TENURE_SHARD $TENURE_FENCING_TOKEN $TENURE_OWNER $TENURE_ROLE $TENURE_SHARDS\" >> {log}; \
         while :; do sleep 0.05; done",
        dir = dir.display(),
        log = log.display()
    );
    Proc::spawn(&mut group_sh(
        store,
        "jobs",
        &SHARDS.to_string(),
        node,
        &GROUP_FAST,
        &script,
    ))
}

/// Which member runs each shard now, from the log (a start stands until its own stop or
/// the shard's next start); an error if a shard ever had two commands at once.
fn shards_running(log: &Path) -> Result<BTreeMap<u32, String>, String> {
    let mut now: BTreeMap<u32, (String, String)> = BTreeMap::new();
    for line in lines(log) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let shard: u32 = fields[1].parse().unwrap();
        let term = (fields[3].to_owned(), fields[2].to_owned());
        match fields[0] {
            "overlap" => {
                return Err(format!(
                    "shard {shard}: {} started while another command of it ran",
                    fields[3]
                ))
            }
            "start" => {
                now.insert(shard, term);
            }
            _ => {
                if now.get(&shard) == Some(&term) {
                    now.remove(&shard);
                }
            }
        }
    }
    Ok(now
        .into_iter()
        .map(|(shard, (owner, _))| (shard, owner))
        .collect())
}

/// Panics if a shard ever had two commands at once, with the log and what the members
/// said.
fn assert_no_overlap<'a>(log: &Path, members: impl IntoIterator<Item = &'a Proc>) {
    if let Err(overlap) = shards_running(log) {
        let said: Vec<String> = members.into_iter().map(Proc::stderr).collect();
        panic!("{overlap}: {:?}\n{}", lines(log), said.join("\n"));
    }
}

/// The shards whose lock a command (or something it started) still holds.
fn shards_locked(log: &Path) -> Vec<u32> {
    let dir = log.parent().expect("the log is in a directory");
    (0..SHARDS)
        .filter(|shard| {
            let lock = dir.join(format!("shard-{shard}.lock"));
            lock.exists()
                && !std::process::Command::new("flock")
                    .arg("-n")
                    .arg(&lock)
                    .arg("true")
                    .status()
                    .expect("run flock")
                    .success()
        })
        .collect()
}

fn per_member(running: &BTreeMap<u32, String>) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for node in running.values() {
        *counts.entry(node.clone()).or_default() += 1;
    }
    counts
}

/// `tenure run --group G --shards N` with three real member processes: they settle with
/// one command per owned shard, 2 each; no shard ever has two commands at once; each
/// command sees its shard, the shard count, its role and its token; `tenure status
/// --group` agrees; a member that stops hands its shards over at once.
pub fn shard_group_shares_and_hands_over(store: &str, dir: &Path) {
    let log = dir.join("shards.log");
    std::fs::write(&log, "").unwrap();
    let mut members: BTreeMap<&str, Proc> = ["a", "b", "c"]
        .into_iter()
        .map(|node| (node, member(store, node, &log)))
        .collect();

    // An overlap ends the wait: it is reported, with what the members said, after it.
    let settled = |expect: usize| {
        let log = log.clone();
        move || {
            let Ok(now) = shards_running(&log) else {
                return true;
            };
            now.len() == SHARDS as usize
                && per_member(&now).len() == expect
                && per_member(&now)
                    .values()
                    .all(|&n| n == SHARDS as usize / expect)
        }
    };
    let settled_3 = wait_until(Duration::from_secs(20), settled(3));
    assert_no_overlap(&log, members.values());
    assert!(
        settled_3,
        "3 members never ran 2 shards each: {:?}",
        lines(&log)
    );
    let start: Vec<String> = lines(&log)
        .into_iter()
        .filter(|l| l.starts_with("start"))
        .collect();
    let first: Vec<&str> = start[0].split_whitespace().collect();
    assert_eq!(
        first[4],
        format!("jobs/{}", first[1]),
        "TENURE_ROLE is GROUP/SHARD"
    );
    assert_eq!(first[5], SHARDS.to_string(), "TENURE_SHARDS");

    let status = output_within(
        tenure().args(["status", "--group", "jobs", "--json", "--store", store]),
        Duration::from_secs(20),
    );
    let report: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(report["per_member"]["a"], 2, "{report}");
    assert_eq!(report["unowned"], 0, "{report}");

    // A stopping member hands its shards over at once (well inside the 2 s TTL).
    let b = members.remove("b").unwrap();
    b.signal(Signal::SIGTERM);
    let mut b = b;
    assert_eq!(b.code_within(Duration::from_secs(20)), 0, "{}", b.stderr());
    let settled_2 = wait_until(Duration::from_millis(1500), settled(2));
    assert_no_overlap(&log, members.values().chain([&b]));
    assert!(
        settled_2,
        "the others did not take b's shards at once: {:?}",
        lines(&log)
    );
    for member in members.values_mut() {
        member.signal(Signal::SIGTERM);
        assert_eq!(
            member.code_within(Duration::from_secs(20)),
            0,
            "{}",
            member.stderr()
        );
    }
    assert_no_overlap(&log, members.values().chain([&b]));
    let locked = shards_locked(&log);
    assert!(
        locked.is_empty(),
        "commands of shards {locked:?} outlived their members: {:?}",
        lines(&log)
    );
}

/// The TTL of the failover scenario: short, to keep it quick.
const FAILOVER_TTL: f64 = 2.0;

/// A member with default flags but `--ttl TTL` (seconds): each shard's command appends
/// `SHARD NODE UNIX_SECONDS` to `log` as it starts.
fn timed_member(store: &str, group: &str, ttl: f64, node: &str, log: &Path) -> Proc {
    let script = format!(
        "echo \"$TENURE_SHARD $TENURE_OWNER $(date +%s.%N)\" >> {log}; exec sleep 1000",
        log = log.display()
    );
    let ttl = format!("{}ms", (ttl * 1000.0) as u64);
    Proc::spawn(&mut group_sh(
        store,
        group,
        &FAILOVER_SHARDS.to_string(),
        node,
        &["--ttl", &ttl],
        &script,
    ))
}

/// The latest start of each shard in a `timed_member` log: (node, unix seconds).
fn latest_starts(log: &Path) -> BTreeMap<u32, (String, f64)> {
    let mut starts = BTreeMap::new();
    for line in lines(log) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if let [shard, node, at] = fields[..] {
            if let (Ok(shard), Ok(at)) = (shard.parse(), at.parse()) {
                starts.insert(shard, (node.to_owned(), at));
            }
        }
    }
    starts
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// The shard count of the failover scenario.
const FAILOVER_SHARDS: u32 = 8;

/// Two members of a group of 8 shards with default flags but `--ttl TTL` (seconds); one
/// is killed with SIGKILL `after_settle` past the settle (a fresh `group` per call).
/// Returns, per shard of the dead member, how long after the kill the survivor's command
/// for it started (seconds), waiting at most 15 s.
pub fn kill_one_member(
    store: &str,
    group: &str,
    ttl: f64,
    dir: &Path,
    after_settle: Duration,
) -> Vec<f64> {
    const SHARDS: u32 = FAILOVER_SHARDS;
    let log = dir.join(format!("{group}.log"));
    std::fs::write(&log, "").unwrap();
    let mut survivor = timed_member(store, group, ttl, "m1", &log);
    let victim = timed_member(store, group, ttl, "m2", &log);
    let settled = wait_until(Duration::from_secs(30), || {
        let starts = latest_starts(&log);
        starts.len() == SHARDS as usize && starts.values().filter(|(n, _)| n == "m2").count() == 4
    });
    assert!(
        settled,
        "the two members never ran 4 shards each: {:?}\nm1: {}\nm2: {}",
        lines(&log),
        survivor.stderr(),
        victim.stderr()
    );
    std::thread::sleep(after_settle);
    let theirs: Vec<u32> = latest_starts(&log)
        .into_iter()
        .filter(|(_, (node, _))| node == "m2")
        .map(|(shard, _)| shard)
        .collect();
    let killed = unix_now();
    victim.signal(Signal::SIGKILL);
    let moved = || {
        let starts = latest_starts(&log);
        theirs.iter().all(|k| {
            starts
                .get(k)
                .is_some_and(|(node, at)| node == "m1" && *at > killed)
        })
    };
    assert!(
        wait_until(Duration::from_secs(15), moved),
        "the survivor never ran the dead member's shards {theirs:?}: {:?}\nm1: {}",
        lines(&log),
        survivor.stderr()
    );
    let starts = latest_starts(&log);
    let took = theirs.iter().map(|k| starts[k].1 - killed).collect();
    survivor.signal(Signal::SIGTERM);
    assert_eq!(survivor.code_within(LONG), 0, "{}", survivor.stderr());
    took
}

/// `tenure run --group` with default flags but `--ttl 2s`: a member killed with SIGKILL
/// (no leave, no release) has every one of its shards' commands started on the survivor
/// within the TTL plus 0.5 s. Membership must not outlive the session (`--member-ttl`
/// defaults to `--ttl` with `--group`), or the shards wait for it to lapse.
pub fn killed_member_shards_move_within_the_ttl(store: &str, dir: &Path) {
    killed_member_shards_move_within(store, dir, 0.5);
}

/// As [`killed_member_shards_move_within_the_ttl`] on etcd, which checks lease expiry
/// every 500 ms: a dead member's session ends up to that much after its TTL, so the bound
/// is the TTL plus 1 s.
pub fn killed_member_shards_move_within_the_ttl_and_etcds_revocation(store: &str, dir: &Path) {
    killed_member_shards_move_within(store, dir, 1.0);
}

fn killed_member_shards_move_within(store: &str, dir: &Path, slack: f64) {
    let took = kill_one_member(
        store,
        "failover",
        FAILOVER_TTL,
        dir,
        Duration::from_millis(700),
    );
    let worst = took.iter().copied().fold(0.0, f64::max);
    eprintln!("re-owned after {took:?} s");
    assert!(
        worst <= FAILOVER_TTL + slack,
        "the dead member's shards started {took:?} s after the kill, over {} s",
        FAILOVER_TTL + slack
    );
}

/// 20 kills as in [`killed_member_shards_move_within_the_ttl`], each at another moment of
/// the renew and heartbeat cycles; prints the p50 and p99 (here the worst) of the time
/// from the kill until the survivor started all of the dead member's shards. The TTL is
/// 2 s, or `TENURE_FAILOVER_TTL` seconds.
pub fn measure_failover(store: &str, dir: &Path) {
    let ttl: f64 = std::env::var("TENURE_FAILOVER_TTL")
        .ok()
        .and_then(|ttl| ttl.parse().ok())
        .unwrap_or(FAILOVER_TTL);
    let mut worst_per_kill = Vec::new();
    for kill in 0..20u64 {
        // Across one renew interval (a third of the TTL), so the kill lands at every
        // moment of the renewal and heartbeat cycles.
        let after = Duration::from_secs_f64(ttl / 3.0 * kill as f64 / 20.0);
        let took = kill_one_member(store, &format!("failover{kill}"), ttl, dir, after);
        let worst = took.iter().copied().fold(0.0, f64::max);
        eprintln!("kill {kill}: all shards re-owned after {worst:.3} s ({took:?})");
        worst_per_kill.push(worst);
    }
    worst_per_kill.sort_by(f64::total_cmp);
    let p50 = worst_per_kill[worst_per_kill.len() / 2 - 1];
    let p99 = worst_per_kill[worst_per_kill.len() - 1];
    println!("failover over 20 kills, ttl {ttl} s: p50 {p50:.3} s, p99 {p99:.3} s, all {worst_per_kill:?}");
}
