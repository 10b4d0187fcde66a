//! Where a SQLite store reads time: the host's monotonic clock, its boot id, and the
//! wall clock for display.
//!
//! Expiry is decided on `CLOCK_MONOTONIC`, the clock every local deadline uses (tokio's
//! and std's `Instant`), which one host's processes share and which no NTP step or
//! `date -s` moves. It restarts at every boot, so each reading carries the kernel's boot
//! id: times recorded under another boot mean nothing now. The wall clock only turns
//! stored times into `SystemTime`s for answers.

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use nix::time::{clock_gettime, ClockId};
use parking_lot::Mutex;
use tenure::{Error, Result};

use crate::BACKEND;

/// Where the kernel publishes the id of the current boot.
const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

/// One reading of the host's clocks, taken together.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostTime {
    /// The id of the current boot: monotonic readings compare only within one boot.
    pub boot_id: String,
    /// The monotonic clock: decides expiry. Never goes back within a boot.
    pub monotonic: Duration,
    /// The wall clock: only for showing stored times as `SystemTime`.
    pub wall: SystemTime,
}

/// A source of [`HostTime`] for a SQLite store
/// ([`SqliteOptions::with_clock`](crate::SqliteOptions::with_clock)).
///
/// Every process sharing a file must read the same monotonic clock and boot id, which
/// [`SystemHostClock`] does on one host (and in one time namespace); tests inject a
/// [`ManualHostClock`].
pub trait HostClock: Send + Sync + fmt::Debug + 'static {
    /// The current reading. `monotonic` must never decrease while `boot_id` stays the same.
    fn now(&self) -> Result<HostTime>;
}

impl<C: HostClock + ?Sized> HostClock for Arc<C> {
    fn now(&self) -> Result<HostTime> {
        (**self).now()
    }
}

/// The host's clocks: `CLOCK_MONOTONIC`, the boot id from
/// `/proc/sys/kernel/random/boot_id` (Linux), and `SystemTime::now()`.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemHostClock;

impl HostClock for SystemHostClock {
    fn now(&self) -> Result<HostTime> {
        // A process never outlives a boot, so the id is read once.
        static BOOT_ID: OnceLock<std::result::Result<String, String>> = OnceLock::new();
        let boot_id = BOOT_ID
            .get_or_init(|| {
                std::fs::read_to_string(BOOT_ID_PATH)
                    .map(|id| id.trim().to_owned())
                    .map_err(|e| e.to_string())
            })
            .clone()
            .map_err(|e| {
                Error::store_msg(
                    BACKEND,
                    format!(
                        "cannot read the boot id from {BOOT_ID_PATH} ({e}): the sqlite store \
                         keeps time on the monotonic clock and must tell a reboot from none"
                    ),
                )
            })?;
        Ok(HostTime {
            boot_id,
            monotonic: monotonic_now()?,
            wall: SystemTime::now(),
        })
    }
}

/// `CLOCK_MONOTONIC` as a duration since its origin (about the boot).
pub(crate) fn monotonic_now() -> Result<Duration> {
    let now = clock_gettime(ClockId::CLOCK_MONOTONIC)
        .map_err(|e| Error::store(BACKEND, "cannot read the monotonic clock", e))?;
    match (u64::try_from(now.tv_sec()), u32::try_from(now.tv_nsec())) {
        (Ok(secs), Ok(nanos)) => Ok(Duration::new(secs, nanos)),
        _ => Err(Error::store_msg(
            BACKEND,
            format!("the monotonic clock reads {now:?}, before its origin"),
        )),
    }
}

/// Host clocks that move only when a test says so; clones share one state.
///
/// [`advance`](Self::advance) is time passing (both clocks move),
/// [`set_wall`](Self::set_wall) a wall-clock step (an NTP step, `date -s`) that leaves
/// the monotonic clock alone, and [`reboot`](Self::reboot) a new boot.
///
/// # Examples
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use tenure_sqlite::{HostClock, ManualHostClock};
///
/// let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
/// let clock = ManualHostClock::new(start);
/// clock.advance(Duration::from_secs(5));
/// clock.set_wall(start + Duration::from_secs(3600));
/// let now = clock.now()?;
/// assert_eq!(now.monotonic, Duration::from_secs(5));
/// assert_eq!(now.wall, start + Duration::from_secs(3600));
/// let boot = now.boot_id;
/// clock.reboot();
/// assert_ne!(clock.now()?.boot_id, boot);
/// assert_eq!(clock.now()?.monotonic, Duration::ZERO);
/// # Ok::<(), tenure::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct ManualHostClock {
    state: Arc<Mutex<ManualState>>,
}

#[derive(Debug)]
struct ManualState {
    boot: u64,
    monotonic: Duration,
    wall: SystemTime,
}

impl ManualHostClock {
    /// Boot 1, the monotonic clock at zero, the wall clock at `wall`.
    pub fn new(wall: SystemTime) -> Self {
        ManualHostClock {
            state: Arc::new(Mutex::new(ManualState {
                boot: 1,
                monotonic: Duration::ZERO,
                wall,
            })),
        }
    }

    /// Time passes: the monotonic and the wall clock both move forward by `by`.
    pub fn advance(&self, by: Duration) {
        let mut state = self.state.lock();
        state.monotonic += by;
        state.wall += by;
    }

    /// The wall clock alone steps to `to`, forward or back; the monotonic clock does not move.
    pub fn set_wall(&self, to: SystemTime) {
        self.state.lock().wall = to;
    }

    /// The host reboots: a new boot id and the monotonic clock back at zero; the wall
    /// clock reads on.
    pub fn reboot(&self) {
        let mut state = self.state.lock();
        state.boot += 1;
        state.monotonic = Duration::ZERO;
    }
}

impl HostClock for ManualHostClock {
    fn now(&self) -> Result<HostTime> {
        let state = self.state.lock();
        Ok(HostTime {
            boot_id: format!("manual-boot-{}", state.boot),
            monotonic: state.monotonic,
            wall: state.wall,
        })
    }
}

/// Store time of one call: the monotonic reading in the file's unit (nanoseconds) and
/// the wall clock read with it, for showing stored times.
#[derive(Clone, Debug)]
pub(crate) struct StoreNow {
    pub(crate) boot_id: String,
    pub(crate) mono: i64,
    pub(crate) wall: SystemTime,
}

impl StoreNow {
    pub(crate) fn from_host(host: HostTime) -> Result<StoreNow> {
        Ok(StoreNow {
            mono: mono_nanos(host.monotonic)?,
            boot_id: host.boot_id,
            wall: host.wall,
        })
    }

    /// A stored monotonic time as a wall-clock time: `wall + (at - mono)`.
    pub(crate) fn wall_at(&self, at: i64) -> Result<SystemTime> {
        let ahead = i128::from(at) - i128::from(self.mono);
        let by = Duration::from_nanos(u64::try_from(ahead.unsigned_abs()).unwrap_or(u64::MAX));
        let shown = if ahead >= 0 {
            self.wall.checked_add(by)
        } else {
            self.wall.checked_sub(by)
        };
        shown.ok_or_else(|| {
            Error::store_msg(
                BACKEND,
                "a stored time cannot be shown as a wall-clock time",
            )
        })
    }
}

/// A monotonic reading in nanoseconds, the unit of the file's times.
fn mono_nanos(monotonic: Duration) -> Result<i64> {
    i64::try_from(monotonic.as_nanos()).map_err(|_| {
        Error::store_msg(
            BACKEND,
            format!("the monotonic clock reads {monotonic:?}, more than 292 years"),
        )
    })
}

/// The store time of the host's own clocks in the file's unit (monotonic nanoseconds).
/// Public (through `statements`) only so the benchmark reads exactly the store's clock.
#[doc(hidden)]
pub fn monotonic_nanos() -> Result<i64> {
    mono_nanos(crate::clock::monotonic_now()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stored time is shown at its distance from the monotonic reading, on either
    /// side, out to the extremes of the file's range.
    #[test]
    fn stored_times_shown_on_the_wall_clock() {
        let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let now = StoreNow {
            boot_id: "b".to_owned(),
            mono: 1_000,
            wall,
        };
        assert_eq!(now.wall_at(1_000).unwrap(), wall);
        assert_eq!(
            now.wall_at(1_500).unwrap(),
            wall + Duration::from_nanos(500)
        );
        assert_eq!(now.wall_at(400).unwrap(), wall - Duration::from_nanos(600));
        assert!(now.wall_at(i64::MAX).is_ok());
        assert!(now.wall_at(i64::MIN).is_ok());
    }
}
