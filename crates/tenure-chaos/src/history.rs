//! Histories: what each worker did and saw, one JSON object per line.
//!
//! Every worker incarnation appends to its own file, one `write(2)` per line on an
//! `O_APPEND` file and no buffering, so a SIGKILL loses at most the line being written:
//! an operation whose outcome line is missing is *unknown* (it may or may not have
//! committed). Times are `CLOCK_MONOTONIC` nanoseconds, which on Linux is one clock for
//! every process on the host, so the orchestrator and all workers share a time line.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

/// Nanoseconds on the host-wide monotonic clock.
pub fn mono_ns() -> u64 {
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC) {
        Ok(ts) => (ts.tv_sec() as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(ts.tv_nsec() as u64),
        // CLOCK_MONOTONIC cannot fail on Linux; a zero would only blur one timestamp.
        Err(_) => 0,
    }
}

/// What happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// The worker started (owner id in `owner`).
    Start,
    /// The elector called work: this worker believes it leads with `token`.
    Lead,
    /// The work for `token` ended (leadership cancelled).
    Unlead,
    /// A write `(worker, token, seq)` is about to be sent.
    Invoke,
    /// The write committed: acknowledged.
    Ok,
    /// The fence refused the token; nothing was written.
    Fenced,
    /// The write failed before commit was sent; nothing was written.
    Error,
    /// The commit was sent but its answer is unknown (error or timeout during commit).
    Unknown,
}

/// One history line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Host monotonic time, nanoseconds.
    pub t: u64,
    /// The worker incarnation's name, e.g. `w3.2` (slot 3, third incarnation).
    pub worker: String,
    /// What happened.
    pub ev: EventKind,
    /// The fencing token involved (0 for `Start`).
    #[serde(default)]
    pub token: u64,
    /// The write's sequence number within this incarnation (0 when not a write).
    #[serde(default)]
    pub seq: u64,
    /// The shard the event is about (shard mode; `None` for one role and for `Start`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<u32>,
    /// Owner id (on `Start`) or a short error message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// Appends events to one worker's history file.
#[derive(Clone, Debug)]
pub struct HistoryWriter {
    worker: String,
    shard: Option<u32>,
    file: Arc<Mutex<File>>,
}

impl HistoryWriter {
    /// Opens (creating) `path` for appending as worker `worker`.
    pub fn create(path: &Path, worker: &str) -> std::io::Result<Self> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(HistoryWriter {
            worker: worker.to_owned(),
            shard: None,
            file: Arc::new(Mutex::new(file)),
        })
    }

    /// The same file, with every event marked as about `shard`.
    pub fn for_shard(&self, shard: u32) -> Self {
        HistoryWriter {
            shard: Some(shard),
            ..self.clone()
        }
    }

    /// Records an event now. A failed write is logged, not fatal: the checker treats a
    /// missing outcome as unknown, which is the truth.
    pub fn record(&self, ev: EventKind, token: u64, seq: u64, note: Option<String>) {
        let event = Event {
            t: mono_ns(),
            worker: self.worker.clone(),
            ev,
            token,
            seq,
            shard: self.shard,
            note,
        };
        let Ok(mut line) = serde_json::to_vec(&event) else {
            return;
        };
        line.push(b'\n');
        let mut file = self.file.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(error) = file.write_all(&line) {
            tracing::warn!(%error, "cannot append to the history file");
        }
    }
}

/// Reads every `*.jsonl` history in `dir`. A torn last line (a kill mid-write) is
/// skipped; any other malformed line is an error.
pub fn read_histories(dir: &Path) -> std::io::Result<Vec<Event>> {
    let mut events = Vec::new();
    let mut paths: Vec<_> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    paths.sort();
    for path in paths {
        let lines: Vec<String> = BufReader::new(File::open(&path)?)
            .lines()
            .collect::<Result<_, _>>()?;
        let count = lines.len();
        for (i, line) in lines.into_iter().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            match serde_json::from_str::<Event>(&line) {
                Ok(event) => events.push(event),
                Err(_) if i + 1 == count => {}
                Err(error) => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("{}: line {}: {error}", path.display(), i + 1),
                    ))
                }
            }
        }
    }
    events.sort_by_key(|e| e.t);
    Ok(events)
}
