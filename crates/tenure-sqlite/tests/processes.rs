//! Contention across processes: several OS processes race on one SQLite file.
//!
//! The test re-executes its own binary as child processes (selected by an environment
//! variable and `--exact`); the parent drives them over stdin and reads their answers
//! from stdout, so every race happens between separate processes, each with its own
//! pool, on the file's write lock.

use std::collections::BTreeSet;
use std::process::Stdio;
use std::time::Duration;

use tenure::{FencingToken, LeaseStore};
use tenure_sqlite::SqliteLeaseStore;
use tenure_testkit::MustAnswer;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

const CHILD_DB: &str = "TENURE_SQLITE_TEST_CHILD_DB";
const CHILD_OWNER: &str = "TENURE_SQLITE_TEST_CHILD_OWNER";
const PROCESSES: usize = 8;
const ROUNDS: usize = 5;
const CHURN_PER_PROCESS: usize = 40;
const TTL: Duration = Duration::from_secs(60);

/// Child mode: answer commands from the parent until `exit`.
///
/// - `go ROLE` -> `result ACQUIRED TOKEN HOLDER`: one `try_acquire_or_renew`.
/// - `churn ROLE N` -> `tokens T1 T2 ...`: N tries with fresh owners, releasing each
///   term won at once; lists the tokens of the terms won.
async fn child(path: String, owner: String) {
    let store = SqliteLeaseStore::open(&path).await.unwrap();
    let mut out = tokio::io::stdout();
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    out.write_all(b"\nready\n").await.unwrap();
    out.flush().await.unwrap();
    while let Some(line) = lines.next_line().await.unwrap() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let reply = match words.as_slice() {
            ["go", role] => {
                let r = store.try_acquire(role, &owner, TTL).await;
                format!("result {} {} {}", r.acquired, r.fencing_token, r.holder)
            }
            ["churn", role, n] => {
                let mut won = Vec::new();
                for i in 0..n.parse::<usize>().unwrap() {
                    let me = format!("{owner}-{i}");
                    let r = store.try_acquire(role, &me, TTL).await;
                    if r.acquired {
                        won.push(r.fencing_token.to_string());
                        assert!(store.release_term(role, &me, r.fencing_token).await);
                    }
                }
                format!("tokens {}", won.join(" "))
            }
            ["exit"] => return,
            other => panic!("unknown command {other:?}"),
        };
        out.write_all(format!("{reply}\n").as_bytes())
            .await
            .unwrap();
        out.flush().await.unwrap();
    }
}

struct Proc {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
}

impl Proc {
    async fn send(&mut self, line: &str) {
        self.stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .unwrap();
        self.stdin.flush().await.unwrap();
    }

    /// The next line starting with `prefix` (the test harness prints its own lines too).
    async fn expect(&mut self, prefix: &str) -> String {
        loop {
            let line = self
                .stdout
                .next_line()
                .await
                .unwrap()
                .unwrap_or_else(|| panic!("child exited while we waited for {prefix:?}"));
            if let Some(rest) = line.strip_prefix(prefix) {
                return rest.trim().to_owned();
            }
        }
    }
}

fn spawn(path: &std::path::Path, owner: &str) -> Proc {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "processes_race_on_one_file",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DB, path)
        .env(CHILD_OWNER, owner)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdin = child.stdin.take().unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    Proc {
        child,
        stdin,
        stdout,
    }
}

/// Setup: 8 processes open one file. Phase 1, 5 rounds: all are told to try at once;
/// exactly one wins each round, every answer names that one term, and tokens never
/// repeat; the parent then releases the winner's term. Phase 2: every process churns
/// (acquire with fresh owners, release at once); the tokens won across all processes
/// are exactly 1..=N with none twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_race_on_one_file() {
    if let (Ok(path), Ok(owner)) = (std::env::var(CHILD_DB), std::env::var(CHILD_OWNER)) {
        return child(path, owner).await;
    }
    tokio::time::timeout(Duration::from_secs(120), parent())
        .await
        .expect("the cross-process race finishes in time");
}

async fn parent() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("race.db");
    let store = SqliteLeaseStore::open(&path).await.unwrap();
    let mut procs: Vec<Proc> = (0..PROCESSES)
        .map(|i| spawn(&path, &format!("proc-{i}")))
        .collect();
    for proc in &mut procs {
        proc.expect("ready").await;
    }

    tracing::info!("--- rounds: one winner each");
    let mut seen = BTreeSet::new();
    for round in 0..ROUNDS {
        for proc in &mut procs {
            proc.send("go contested").await;
        }
        let mut winners = Vec::new();
        let mut tokens = BTreeSet::new();
        for (i, proc) in procs.iter_mut().enumerate() {
            let answer = proc.expect("result").await;
            let fields: Vec<&str> = answer.split(' ').collect();
            let [acquired, token, holder] = fields[..] else {
                panic!("bad answer {answer:?}");
            };
            let token: u64 = token.parse().unwrap();
            tokens.insert(token);
            if acquired == "true" {
                assert_eq!(holder, format!("proc-{i}"));
                winners.push((holder.to_owned(), token));
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: winners {winners:?}");
        assert_eq!(
            tokens.len(),
            1,
            "round {round}: answers name one term: {tokens:?}"
        );
        let (winner, token) = winners.pop().unwrap();
        assert!(seen.insert(token), "round {round}: token {token} twice");
        assert_eq!(seen.last(), Some(&token), "round {round}: tokens increase");
        assert!(
            store
                .release_term("contested", &winner, FencingToken::from(token))
                .await
        );
    }
    assert_eq!(seen.len(), ROUNDS);

    tracing::info!("--- churn: no token twice");
    for proc in &mut procs {
        proc.send(&format!("churn churned {CHURN_PER_PROCESS}"))
            .await;
    }
    let mut won = Vec::new();
    for proc in &mut procs {
        let answer = proc.expect("tokens").await;
        won.extend(answer.split_whitespace().map(|t| t.parse::<u64>().unwrap()));
    }
    won.sort_unstable();
    let last = store
        .get("churned")
        .await
        .unwrap()
        .unwrap()
        .fencing_token
        .get();
    assert!(!won.is_empty(), "somebody won a term");
    assert_eq!(
        won,
        (1..=last).collect::<Vec<_>>(),
        "tokens won are exactly 1..={last}, none twice"
    );

    for proc in &mut procs {
        proc.send("exit").await;
    }
    for mut proc in procs {
        let status = proc.child.wait().await.unwrap();
        assert!(status.success(), "child failed: {status}");
    }
}
