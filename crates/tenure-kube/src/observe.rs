//! Time on the Kubernetes API: judged by watching records not change.
//!
//! The API server keeps no timers: a Lease object stays as its holder last wrote it
//! however long ago that was, and the times inside it are the holder's wall clock. So,
//! as client-go's elector does, a record is judged by observation: it has expired once
//! its `resourceVersion` stayed the same for `leaseDurationSeconds` on *this process's*
//! monotonic clock, counted from when this process first saw that version. Only the
//! rates of the clocks must agree (within the elector's `max_clock_drift`); their
//! readings never meet, so a wall-clock step anywhere changes nothing.
//!
//! A version is first seen when an answer carrying it arrives (a read, or an event of the
//! namespace watch), which is after the write that made it. A version this process wrote
//! itself counts from when the write was *sent*: the holder's own deadline counts from
//! no later than that, so a contender in this process cannot take the term over before
//! the holder has given it up.
//!
//! [`Observer::now`] is this store's "store time": a wall-clock reading taken once when
//! the store was made, moved on by the monotonic clock.

use std::collections::HashMap;
use std::time::SystemTime;

use parking_lot::Mutex;
use tokio::time::Instant;

/// First sightings of record versions, and the store's clock.
#[derive(Debug)]
pub(crate) struct Observer {
    base_wall: SystemTime,
    base: Instant,
    seen: Mutex<HashMap<String, (String, Instant)>>,
}

impl Observer {
    pub fn new() -> Self {
        Observer {
            base_wall: SystemTime::now(),
            base: Instant::now(),
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// The monotonic now.
    pub fn instant(&self) -> Instant {
        Instant::now()
    }

    /// `at` as store time.
    pub fn wall(&self, at: Instant) -> SystemTime {
        self.base_wall + at.saturating_duration_since(self.base)
    }

    /// Store time now.
    pub fn now(&self) -> SystemTime {
        self.wall(self.instant())
    }

    /// Records that `version` of `object` was seen in an answer that arrived at `at`, and
    /// returns when that version was first seen (`at` unless seen before).
    pub fn saw(&self, object: &str, version: &str, at: Instant) -> Instant {
        let mut seen = self.seen.lock();
        match seen.get(object) {
            Some((known, first)) if known == version => *first,
            _ => {
                seen.insert(object.to_owned(), (version.to_owned(), at));
                at
            }
        }
    }

    /// Records that this process wrote `version` of `object` with a request sent at
    /// `sent`.
    pub fn wrote(&self, object: &str, version: &str, sent: Instant) {
        self.seen
            .lock()
            .insert(object.to_owned(), (version.to_owned(), sent));
    }

    /// When `version` of `object` was first seen, if it is the newest version seen.
    pub fn first_sighting(&self, object: &str, version: &str) -> Option<Instant> {
        self.latest(object)
            .and_then(|(known, first)| (known == version).then_some(first))
    }

    /// The newest version of `object` seen, and when it was first seen.
    pub fn latest(&self, object: &str) -> Option<(String, Instant)> {
        self.seen.lock().get(object).cloned()
    }

    /// Forgets `object` (deleted).
    pub fn forget(&self, object: &str) {
        self.seen.lock().remove(object);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn a_version_counts_from_its_first_sighting() {
        let observer = Observer::new();
        let t0 = observer.instant();
        assert_eq!(observer.saw("a", "1", t0), t0);
        tokio::time::advance(Duration::from_secs(3)).await;
        let t1 = observer.instant();
        assert_eq!(
            observer.saw("a", "1", t1),
            t0,
            "unchanged: still counts from t0"
        );
        assert_eq!(observer.saw("a", "2", t1), t1, "a new version starts over");
        observer.wrote("a", "3", t0);
        assert_eq!(
            observer.saw("a", "3", t1),
            t0,
            "own writes count from when sent"
        );
        assert_eq!(
            observer.wall(t0 + Duration::from_secs(10)),
            observer.wall(t0) + Duration::from_secs(10)
        );
    }
}
