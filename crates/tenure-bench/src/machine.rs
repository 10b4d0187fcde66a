//! The machine a run measured on: cores, load before and after, kernel, backend version.
//!
//! Figures from a shared machine mean little without the load they were taken under.

use serde::Serialize;

/// Where a run took place.
#[derive(Clone, Debug, Serialize)]
pub struct Machine {
    /// CPUs this process may use.
    pub nproc: usize,
    /// `/proc/loadavg`'s 1, 5 and 15 minute averages when the run started.
    pub load_before: Option<String>,
    /// The same when it ended.
    pub load_after: Option<String>,
    /// The kernel release.
    pub kernel: Option<String>,
    /// The store's server or library version, when cheap to ask.
    pub backend_version: Option<String>,
}

impl Machine {
    pub(crate) fn describe(load_before: Option<String>, backend_version: Option<String>) -> Self {
        Machine {
            nproc: std::thread::available_parallelism().map_or(1, |n| n.get()),
            load_before,
            load_after: load_average(),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .ok()
                .map(|s| s.trim().to_owned()),
            backend_version,
        }
    }
}

/// The three load averages, as `/proc/loadavg` writes them.
pub(crate) fn load_average() -> Option<String> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let fields: Vec<&str> = text.split_whitespace().take(3).collect();
    (fields.len() == 3).then(|| fields.join(" "))
}
