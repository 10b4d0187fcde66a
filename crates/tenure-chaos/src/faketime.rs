//! Stepping the wall clock of real processes: libfaketime with one shared offset file.
//!
//! Every process started with [`FakeTime::env`] reads its wall clock as the real one
//! plus the offset in the file, re-read on every call, while `CLOCK_MONOTONIC` is left
//! alone (`FAKETIME_DONT_FAKE_MONOTONIC=1`): what an NTP step or `date -s` does to a
//! host. Writing a new offset steps every such process at once.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::ChaosError;

/// The preload library's name; the package that ships it is `libfaketime`.
const LIBRARY: &str = "libfaketime.so.1";

/// One offset file and the preload library that applies it.
#[derive(Clone, Debug)]
pub struct FakeTime {
    library: PathBuf,
    offset_file: PathBuf,
}

impl FakeTime {
    /// Finds libfaketime (a [`ChaosError::Setup`] naming the package when it is not
    /// installed) and starts `offset_file` at offset zero.
    pub fn new(offset_file: impl AsRef<Path>) -> Result<FakeTime, ChaosError> {
        let fake = FakeTime {
            library: library()?,
            offset_file: offset_file.as_ref().to_owned(),
        };
        fake.set_offset(0)?;
        Ok(fake)
    }

    /// Sets the wall clock of every process under this offset file to the real one plus
    /// `offset_ms` (negative: behind). The file is replaced at once, so no process ever
    /// reads a half-written offset.
    pub fn set_offset(&self, offset_ms: i64) -> Result<(), ChaosError> {
        let sign = if offset_ms < 0 { '-' } else { '+' };
        let offset = Duration::from_millis(offset_ms.unsigned_abs());
        let tmp = self.offset_file.with_extension("tmp");
        let io = |source| ChaosError::Io {
            what: "cannot write the libfaketime offset file",
            source,
        };
        std::fs::write(&tmp, format!("{sign}{:.3}s\n", offset.as_secs_f64())).map_err(io)?;
        std::fs::rename(&tmp, &self.offset_file).map_err(io)
    }

    /// The environment that puts a process under this offset file.
    pub fn env(&self) -> [(&'static str, OsString); 4] {
        [
            ("LD_PRELOAD", self.library.clone().into_os_string()),
            (
                "FAKETIME_TIMESTAMP_FILE",
                self.offset_file.clone().into_os_string(),
            ),
            ("FAKETIME_NO_CACHE", "1".into()),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1".into()),
        ]
    }
}

/// The preload library, wherever the distribution put it (multiarch directories too).
fn library() -> Result<PathBuf, ChaosError> {
    let mut candidates = vec![
        PathBuf::from("/usr/lib/faketime").join(LIBRARY),
        PathBuf::from("/usr/local/lib/faketime").join(LIBRARY),
    ];
    if let Ok(entries) = std::fs::read_dir("/usr/lib") {
        for entry in entries.flatten() {
            candidates.push(entry.path().join("faketime").join(LIBRARY));
        }
    }
    candidates
        .into_iter()
        .find(|path| path.is_file())
        .ok_or_else(|| {
            ChaosError::Setup(format!(
                "{LIBRARY} not found under /usr/lib: install the package `libfaketime` \
                 (scripts/test installs it); wall-clock steps of real processes need it"
            ))
        })
}
