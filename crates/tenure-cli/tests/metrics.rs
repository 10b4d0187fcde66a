//! `tenure run --metrics-addr`: the endpoint of real `tenure run` processes scraped
//! while they hand a role over (SQLite and a throwaway PostgreSQL server), a shard
//! group member's `/leader` and shards-owned gauge beside `tenure status --group`,
//! `/healthz` through a store outage, and the addresses refused before contending.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::time::Duration;

use common::scenarios::tenure_on;
use common::{
    group_sh, lines, run_sh, run_sh_with, sqlite_url, tempdir, wait_until, Proc, GROUP_FAST,
};
use nix::sys::signal::Signal;
use tenure_testkit::postgres::{PgServer, SUPERUSER};

/// The bound on each wait: generous for a loaded 2-core machine.
const LONG: Duration = Duration::from_secs(30);

/// The stderr line that announces the endpoint.
const ANNOUNCE: &str = "tenure: metrics on http://";

/// One HTTP GET; `None` if nothing answered in time (a stopped process, a closed port).
fn get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let timeout = Duration::from_secs(2);
    let mut stream = TcpStream::connect_timeout(&addr, timeout).ok()?;
    stream.set_read_timeout(Some(timeout)).ok()?;
    stream.set_write_timeout(Some(timeout)).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_owned()))
}

/// A `/leader` or `/healthz` answer: the status and the parsed one-line JSON body.
fn probe(addr: SocketAddr, path: &str) -> Option<(u16, serde_json::Value)> {
    let (status, body) = get(addr, path)?;
    assert_eq!(body.lines().count(), 1, "{path}: not one line: {body:?}");
    let json = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body:?}"));
    Some((status, json))
}

/// The value of the sample `series` (name and labels exactly as exposed) on `/metrics`.
fn sample(addr: SocketAddr, series: &str) -> Option<f64> {
    let (status, body) = get(addr, "/metrics")?;
    assert_eq!(status, 200, "/metrics: {body}");
    body.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
}

/// Waits until `proc` announces its endpoint; returns the address.
fn endpoint(proc: &Proc) -> SocketAddr {
    assert!(
        proc.wait_stderr(ANNOUNCE, LONG),
        "no endpoint announced: {}",
        proc.stderr()
    );
    let stderr = proc.stderr();
    let line = stderr
        .lines()
        .find_map(|line| line.strip_prefix(ANNOUNCE))
        .expect("announce line");
    line.split_whitespace()
        .next()
        .and_then(|addr| addr.parse().ok())
        .unwrap_or_else(|| panic!("bad announce line {line:?}"))
}

/// Polls until `/leader` answers `status`; returns its body.
fn await_leader(addr: SocketAddr, status: u16, what: &str) -> serde_json::Value {
    let mut last = None;
    let found = wait_until(LONG, || {
        last = probe(addr, "/leader");
        last.as_ref().is_some_and(|(code, _)| *code == status)
    });
    assert!(found, "{what}: /leader never answered {status}: {last:?}");
    last.map(|(_, body)| body).unwrap_or_default()
}

/// A `tenure run --role handover` (3 s TTL, renewals every 300 ms) with an endpoint on a
/// free port, whose command runs until `NAME.stop` exists and, once told to stop (on a
/// loss), lingers 0.8 s; `kill_after` is its `--kill-after`.
fn contender(store: &str, dir: &Path, name: &str, kill_after: &str) -> Proc {
    let stop = dir.join(format!("{name}.stop"));
    let log = dir.join(format!("{name}.log"));
    let script = format!(
        "echo \"$TENURE_FENCING_TOKEN\" >> '{log}'; trap 'sleep 0.8; exit 0' TERM; \
         while [ ! -e '{stop}' ]; do sleep 0.05; done",
        log = log.display(),
        stop = stop.display()
    );
    let flags = [
        "--ttl",
        "3s",
        "--renew-every",
        "300ms",
        "--retry-every",
        "100ms",
        "--kill-after",
        kill_after,
        "--metrics-addr",
        "127.0.0.1:0",
    ];
    Proc::spawn(&mut run_sh_with(store, "handover", &flags, &script))
}

/// The gauges of the endpoint at `addr` say it leads `handover` under `token`.
#[track_caller]
fn assert_gauges_lead(addr: SocketAddr, token: u64) {
    assert_eq!(
        sample(addr, r#"tenure_is_leader{role="handover"}"#),
        Some(1.0)
    );
    assert_eq!(
        sample(addr, r#"tenure_fencing_token{role="handover"}"#),
        Some(token as f64)
    );
}

/// Two `tenure run` processes with endpoints hand a role over twice:
/// - A leads (`/leader` 200 with its token, `tenure_is_leader` 1, the token gauge), B
///   waits (503, 0); both are healthy.
/// - A and its guard are stopped (SIGSTOP) past its TTL, as a frozen VM would be (with
///   the guard running, A's command would be killed at the deadline and A would exit as
///   soon as it resumed): B takes over, its gauge and `/leader` flip, and its token is
///   larger.
/// - A resumes: it sees the term is over and says so at once (503, gauge 0) while its
///   command winds down (the command lingers 0.8 s after SIGTERM), then exits 4.
/// - B's command exits on its own: B releases and exits 0.
fn handover(store: &str, dir: &Path) {
    eprintln!("--- A leads, B waits");
    // A gives its command 1.5 s after a loss: time to see A's probe flip.
    let mut a = contender(store, dir, "a", "1500ms");
    let a_addr = endpoint(&a);
    let body = await_leader(a_addr, 200, "A");
    assert_eq!(body["role"], "handover", "{body}");
    assert_eq!(body["leader"], true, "{body}");
    let first = body["fencing_token"].as_u64().expect("A's token");
    assert_gauges_lead(a_addr, first);
    assert_eq!(
        sample(a_addr, r#"tenure_terms_started_total{role="handover"}"#),
        Some(1.0)
    );

    let mut b = contender(store, dir, "b", "300ms");
    let b_addr = endpoint(&b);
    assert!(b.wait_stderr("is held by", LONG), "{}", b.stderr());
    let (status, body) = probe(b_addr, "/leader").expect("B's /leader");
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["leader"], false, "{body}");
    assert_eq!(body["fencing_token"], serde_json::Value::Null, "{body}");
    // B does not lead, and says who does.
    assert_eq!(body["current"]["fencing_token"], first, "{body}");
    assert!(body["current"]["owner"].is_string(), "{body}");
    assert_eq!(
        sample(b_addr, r#"tenure_is_leader{role="handover"}"#),
        Some(0.0)
    );
    for addr in [a_addr, b_addr] {
        let (status, body) = probe(addr, "/healthz").expect("/healthz");
        assert_eq!(
            (status, &body["healthy"]),
            (200, &serde_json::json!(true)),
            "{body}"
        );
    }

    eprintln!("--- A stopped: B takes over");
    let a_guard = common::guard_of(a.pid());
    nix::sys::signal::kill(a_guard, Signal::SIGSTOP).expect("stop A's guard");
    a.signal(Signal::SIGSTOP);
    let body = await_leader(b_addr, 200, "B after A stopped");
    let second = body["fencing_token"].as_u64().expect("B's token");
    assert!(second > first, "token {second} after {first}");
    assert_gauges_lead(b_addr, second);

    eprintln!("--- A resumes: its term is over");
    a.signal(Signal::SIGCONT);
    let body = await_leader(a_addr, 503, "A after it resumed");
    assert_eq!(body["leader"], false, "{body}");
    // A exits moments after it learns its term is over (its command was stopped): a
    // scrape that comes after that finds nobody; one that comes before sees 0.
    let gauge = sample(a_addr, r#"tenure_is_leader{role="handover"}"#);
    if gauge.is_some() || !wait_until(LONG, || a.exited().is_some()) {
        assert_eq!(gauge, Some(0.0));
    }
    let a_code = a.code_within(LONG);
    // Gone with A (its pipe closed), once it may run.
    let _ = nix::sys::signal::kill(a_guard, Signal::SIGCONT);
    assert_eq!(a_code, 4, "{}", a.stderr());

    eprintln!("--- B's command exits: B releases");
    std::fs::write(dir.join("b.stop"), "").unwrap();
    assert_eq!(b.code_within(LONG), 0, "{}", b.stderr());
    assert_eq!(lines(&dir.join("b.log")), [second.to_string()]);
}

#[test]
fn handover_flips_the_probes_on_sqlite() {
    let dir = tempdir();
    handover(&sqlite_url(dir.path()), dir.path());
}

#[test]
fn handover_flips_the_probes_on_postgres() {
    let dir = tempdir();
    handover(&common::fresh_database("metrics", "handover"), dir.path());
}

/// A `--metrics-addr` that does not parse, or whose port is in use, is refused with exit
/// 2 and a message naming the flag; the command does not run and no lease is taken.
#[test]
fn unusable_addresses_are_refused_before_contending() {
    let dir = tempdir();
    let store = sqlite_url(dir.path());
    let marker = dir.path().join("ran");
    let script = format!("touch '{}'", marker.display());
    let taken = TcpListener::bind("127.0.0.1:0").expect("bind a port");
    let in_use = taken.local_addr().expect("local addr").to_string();
    for (addr, expect) in [
        ("nonsense", "expected IP:PORT"),
        ("127.0.0.1:99999", "expected IP:PORT"),
        (":http", "is not a port"),
        (in_use.as_str(), "cannot listen"),
    ] {
        let output = common::assert_usage_error(
            &mut run_sh(&store, "refused", &["--metrics-addr", addr], &script),
            &addr,
            "--metrics-addr",
            LONG,
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(expect), "{addr}: {stderr}");
        assert!(!marker.exists(), "{addr}: the command ran");
    }
    let (code, stdout, stderr) = tenure_on(&store, &["status", "--json"]);
    assert_eq!(
        (code, stdout.trim()),
        (0, "[]"),
        "a lease was taken: {stderr}"
    );
}

/// A member of a shard group with `--metrics-addr` that runs `--ttl 2s` timings.
fn member(store: &str, node: &str, shards: &str) -> Proc {
    let flags = [&GROUP_FAST[..], &["--metrics-addr", "0"]].concat();
    let script = "trap 'exit 0' TERM; while :; do sleep 0.05; done";
    Proc::spawn(&mut group_sh(store, "jobs", shards, node, &flags, script))
}

/// How many shards `tenure status --group jobs --json` says `node` owns.
fn owned_per_status(store: &str, node: &str) -> u64 {
    let (code, stdout, stderr) = tenure_on(store, &["status", "--group", "jobs", "--json"]);
    assert_eq!(code, 0, "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("status json");
    report["per_member"][node].as_u64().unwrap_or(0)
}

/// Two members of a 6-shard group, the second joining once the first owns every
/// shard: each one's `/leader` answers 200 once it owns a shard, listing its shards and
/// tokens; once they settle at 3 each, each one's `tenure_shards_owned` gauge, its
/// `/leader` body and `tenure status --group` agree, each owned shard's role reports
/// `tenure_is_leader` 1 with its token, and each shard handed over reports 0 where it
/// was owned before.
#[test]
fn group_member_reports_the_shards_it_owns() {
    let dir = tempdir();
    let store = sqlite_url(dir.path());
    let first = member(&store, "a", "6");
    let first_addr = endpoint(&first);
    assert!(
        wait_until(LONG, || sample(
            first_addr,
            r#"tenure_shards_owned{group="jobs"}"#
        ) == Some(6.0)),
        "the first member never owned all 6 shards"
    );
    let members = [("a", first), ("b", member(&store, "b", "6"))];
    let addrs: Vec<(&str, SocketAddr)> = members
        .iter()
        .map(|(node, proc)| (*node, endpoint(proc)))
        .collect();
    for &(node, addr) in &addrs {
        let body = await_leader(addr, 200, node);
        assert_eq!(body["group"], "jobs", "{body}");
    }
    let settled = wait_until(LONG, || {
        addrs.iter().all(|&(node, addr)| {
            let gauge = sample(addr, r#"tenure_shards_owned{group="jobs"}"#);
            gauge == Some(3.0) && owned_per_status(&store, node) == 3
        })
    });
    assert!(
        settled,
        "the members never showed 3 shards each in both views"
    );
    for &(node, addr) in &addrs {
        let (status, body) = probe(addr, "/leader").expect("/leader");
        assert_eq!(status, 200, "{body}");
        let shards = body["shards"].as_object().expect("shards").clone();
        assert_eq!(shards.len(), 3, "{node}: {body}");
        for (shard, token) in &shards {
            let role = format!(r#"{{role="jobs/{shard}"}}"#);
            assert_eq!(
                sample(addr, &format!("tenure_is_leader{role}")),
                Some(1.0),
                "{node}"
            );
            assert_eq!(
                sample(addr, &format!("tenure_fencing_token{role}")),
                token.as_u64().map(|t| t as f64),
                "{node}"
            );
        }
        for shard in (0..6).filter(|k| !shards.contains_key(&k.to_string())) {
            let series = format!(r#"tenure_is_leader{{role="jobs/{shard}"}}"#);
            let gauge = sample(addr, &series);
            assert!(
                gauge.is_none_or(|g| g == 0.0),
                "{node}: {series} is {gauge:?} for a shard it does not own"
            );
        }
    }
    for (_, proc) in members {
        proc.signal(Signal::SIGTERM);
        let mut proc = proc;
        assert_eq!(proc.code_within(LONG), 0, "{}", proc.stderr());
    }
}

/// A group member on its own PostgreSQL server: `/healthz` answers 200, turns 503 (and
/// `/leader` 503, the shards lost) within the TTL and a margin once the server is
/// stopped, with failed calls counted in `tenure_store_errors_total`; and 200 again once
/// the server is back.
#[test]
fn healthz_follows_the_store() {
    let server = PgServer::start().expect("PostgreSQL server");
    server.psql("CREATE DATABASE metrics_health").expect("psql");
    let store = server.url_for(SUPERUSER, server.password(), "metrics_health");
    let proc = member(&store, "a", "2");
    let addr = endpoint(&proc);
    await_leader(addr, 200, "before the outage");
    let (status, body) = probe(addr, "/healthz").expect("/healthz");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["healthy"], true, "{body}");

    eprintln!("--- the server stops");
    server.stop();
    let unhealthy = wait_until(Duration::from_secs(15), || {
        probe(addr, "/healthz").is_some_and(|(status, _)| status == 503)
    });
    assert!(unhealthy, "/healthz stayed 200: {}", proc.stderr());
    let (_, body) = probe(addr, "/healthz").expect("/healthz");
    assert_eq!(body["healthy"], false, "{body}");
    assert!(
        body["last_success_seconds_ago"].as_f64() > body["window_seconds"].as_f64(),
        "{body}"
    );
    await_leader(addr, 503, "during the outage");
    let (_, metrics) = get(addr, "/metrics").expect("/metrics");
    assert!(
        metrics.contains("tenure_store_errors_total{operation="),
        "{metrics}"
    );

    eprintln!("--- the server is back");
    server.start_again().expect("restart PostgreSQL");
    let healthy = wait_until(LONG, || {
        probe(addr, "/healthz").is_some_and(|(status, _)| status == 200)
    });
    assert!(healthy, "/healthz stayed 503: {}", proc.stderr());
    await_leader(addr, 200, "after the outage");
    proc.signal(Signal::SIGTERM);
    let mut proc = proc;
    assert_eq!(proc.code_within(LONG), 0, "{}", proc.stderr());
}
