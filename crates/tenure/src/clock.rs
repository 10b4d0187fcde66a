//! Clocks: where "now" comes from for stores that keep time themselves.
//!
//! In-memory stores and registries take a [`Clock`]; shared stores use their server's
//! clock instead. [`ManualClock`] moves only when a test says so; [`TokioClock`] follows
//! tokio's clock, so under `#[tokio::test(start_paused = true)]` advancing the runtime
//! moves store expiry and the elector's timers together.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;

/// A source of wall-clock time for a store.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The current time.
    fn now(&self) -> SystemTime;
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now(&self) -> SystemTime {
        (**self).now()
    }
}

/// The operating system's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A clock that moves only when told to. Clones share one time.
///
/// # Examples
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use tenure::{Clock, ManualClock};
/// let clock = ManualClock::new(SystemTime::UNIX_EPOCH);
/// let view = clock.clone();
/// clock.advance(Duration::from_secs(5));
/// assert_eq!(view.now(), SystemTime::UNIX_EPOCH + Duration::from_secs(5));
/// ```
#[derive(Clone, Debug)]
pub struct ManualClock {
    now: Arc<Mutex<SystemTime>>,
}

impl ManualClock {
    /// A clock reading `start` until moved.
    pub fn new(start: SystemTime) -> Self {
        ManualClock {
            now: Arc::new(Mutex::new(start)),
        }
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let mut now = self.now.lock();
        *now += by;
    }

    /// Sets the clock to `to`, forwards or backwards.
    pub fn set(&self, to: SystemTime) {
        *self.now.lock() = to;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> SystemTime {
        *self.now.lock()
    }
}

/// A wall clock that follows tokio's clock: `start + (tokio now - tokio now at creation)`.
///
/// With a paused runtime (`start_paused`, `tokio::time::advance`) it moves exactly as
/// the runtime's timers do, which makes whole elections deterministic.
#[derive(Clone, Debug)]
pub struct TokioClock {
    start: SystemTime,
    origin: tokio::time::Instant,
    rate: f64,
}

impl TokioClock {
    /// A clock reading `start` now and moving with tokio's clock from here on.
    pub fn starting_at(start: SystemTime) -> Self {
        TokioClock {
            start,
            origin: tokio::time::Instant::now(),
            rate: 1.0,
        }
    }

    /// A clock reading the system time now and moving with tokio's clock.
    pub fn new() -> Self {
        Self::starting_at(SystemTime::now())
    }

    /// The same clock running `rate` times as fast as tokio's (for drift experiments:
    /// a store clock that runs fast shortens leases as seen by the elector).
    pub fn with_rate(mut self, rate: f64) -> Self {
        self.rate = rate;
        self
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    fn now(&self) -> SystemTime {
        let elapsed = self.origin.elapsed();
        if self.rate == 1.0 {
            self.start + elapsed
        } else {
            self.start + elapsed.mul_f64(self.rate)
        }
    }
}
