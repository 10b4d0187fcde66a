//! Latency statistics: a fixed-size histogram for the millions of samples a throughput
//! round records, exact percentiles for the hundred-odd failover trials, and medians.
//!
//! Percentiles are nearest-rank: the value at rank `ceil(p * n)` of the sorted samples,
//! so p100 is the maximum and no value is invented by interpolation.

use std::time::Duration;

use serde::Serialize;

/// Sub-buckets per power of two: each bucket spans at most 1/64 (1.6%) of its value.
const SUB_BITS: u32 = 6;
const SUB: u64 = 1 << SUB_BITS;
/// Powers of two covered: 2^40 ns is about 18 minutes, far above any one operation.
const OCTAVES: u32 = 40;

/// A log-linear histogram of durations in nanoseconds: recording is a few instructions
/// and no allocation, so timing every operation of an in-memory store stays cheap.
#[derive(Clone, Debug)]
pub struct Histogram {
    counts: Vec<u64>,
    count: u64,
    max: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: vec![0; ((OCTAVES as u64 + 1) * SUB) as usize],
            count: 0,
            max: 0,
        }
    }
}

fn bucket_of(nanos: u64) -> usize {
    if nanos < SUB {
        return nanos as usize;
    }
    let octave = 63 - nanos.leading_zeros() - SUB_BITS + 1;
    if octave >= OCTAVES {
        // Beyond the covered range: the last bucket, reported as the exact maximum.
        return ((OCTAVES as u64 + 1) * SUB - 1) as usize;
    }
    let sub = (nanos >> (octave - 1)) & (SUB - 1);
    (u64::from(octave) * SUB + sub) as usize
}

/// The largest value that falls in `bucket` (a percentile never under-reports).
fn bucket_high(bucket: usize) -> u64 {
    let bucket = bucket as u64;
    let octave = bucket / SUB;
    let sub = bucket % SUB;
    if octave == 0 {
        return sub;
    }
    ((SUB + sub + 1) << (octave - 1)) - 1
}

impl Histogram {
    /// Records one duration.
    pub fn record(&mut self, value: Duration) {
        let nanos = u64::try_from(value.as_nanos()).unwrap_or(u64::MAX);
        let bucket = bucket_of(nanos).min(self.counts.len() - 1);
        self.counts[bucket] += 1;
        self.count += 1;
        self.max = self.max.max(nanos);
    }

    /// Adds every sample of `other`.
    pub fn merge(&mut self, other: &Histogram) {
        for (mine, theirs) in self.counts.iter_mut().zip(&other.counts) {
            *mine += theirs;
        }
        self.count += other.count;
        self.max = self.max.max(other.max);
    }

    /// How many samples were recorded.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The nearest-rank percentile `p` (0 < p <= 1), within 1.6% and never below the
    /// true value; `None` without samples.
    pub fn percentile(&self, p: f64) -> Option<Duration> {
        if self.count == 0 {
            return None;
        }
        let rank = rank(self.count as usize, p) as u64;
        let mut seen = 0;
        for (bucket, &n) in self.counts.iter().enumerate() {
            seen += n;
            if seen >= rank {
                let high = if bucket == self.counts.len() - 1 {
                    self.max
                } else {
                    bucket_high(bucket).min(self.max)
                };
                return Some(Duration::from_nanos(high));
            }
        }
        Some(Duration::from_nanos(self.max))
    }

    /// p50, p99 and max.
    pub fn summary(&self) -> Latency {
        Latency {
            count: self.count,
            p50_us: micros(self.percentile(0.5)),
            p99_us: micros(self.percentile(0.99)),
            max_us: micros(self.count.gt(&0).then(|| Duration::from_nanos(self.max))),
        }
    }
}

/// The 1-based nearest rank of percentile `p` among `n` samples.
fn rank(n: usize, p: f64) -> usize {
    ((p.clamp(0.0, 1.0) * n as f64).ceil() as usize).clamp(1, n.max(1))
}

fn micros(d: Option<Duration>) -> f64 {
    d.map_or(0.0, |d| d.as_secs_f64() * 1e6)
}

/// A latency distribution's headline figures, in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Latency {
    /// Samples behind the figures.
    pub count: u64,
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// Largest sample.
    pub max_us: f64,
}

/// The nearest-rank percentile `p` of samples already in ascending order; `None` when
/// empty. `tenure chaos` reports its recovery times with this too, so both tools mean
/// the same by p50 and p99.
pub fn nearest_rank<T: Copy>(sorted: &[T], p: f64) -> Option<T> {
    (!sorted.is_empty()).then(|| sorted[rank(sorted.len(), p) - 1])
}

/// p50, p99 and max of exact samples (any order).
pub fn summarize(samples: &[Duration]) -> Latency {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    Latency {
        count: sorted.len() as u64,
        p50_us: micros(nearest_rank(&sorted, 0.5)),
        p99_us: micros(nearest_rank(&sorted, 0.99)),
        max_us: micros(sorted.last().copied()),
    }
}

/// The median (the lower middle value for an even count); `None` when empty or any
/// value is NaN.
pub fn median(values: &[f64]) -> Option<f64> {
    if values.iter().any(|v| v.is_nan()) {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    nearest_rank(&sorted, 0.5)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn exact_percentiles_are_nearest_rank() {
        let samples: Vec<Duration> = (1..=100).map(ms).collect();
        assert_eq!(nearest_rank(&samples, 0.5), Some(ms(50)));
        assert_eq!(nearest_rank(&samples, 0.99), Some(ms(99)));
        assert_eq!(nearest_rank(&samples, 1.0), Some(ms(100)));
        assert_eq!(nearest_rank(&samples, 0.001), Some(ms(1)));
        assert_eq!(nearest_rank::<Duration>(&[], 0.5), None);
        // Few samples: p99 of three is the largest, not an interpolation.
        assert_eq!(nearest_rank(&[ms(1), ms(2), ms(30)], 0.99), Some(ms(30)));
        let s = summarize(&[ms(3), ms(1), ms(2)]);
        assert_eq!((s.count, s.p50_us, s.max_us), (3, 2000.0, 3000.0));
    }

    #[test]
    fn histogram_is_within_its_precision_and_never_under() {
        let mut h = Histogram::default();
        let values: Vec<u64> = (1..=10_000).map(|i| i * 997).collect();
        for &v in &values {
            h.record(Duration::from_nanos(v));
        }
        assert_eq!(h.count(), 10_000);
        for p in [0.01, 0.5, 0.9, 0.99, 1.0] {
            let exact = nearest_rank(&values, p).unwrap() as f64;
            let got = h.percentile(p).unwrap().as_nanos() as f64;
            assert!(got >= exact, "p{p}: {got} < {exact}");
            assert!(got <= exact * 1.016 + 1.0, "p{p}: {got} vs {exact}");
        }
        assert_eq!(h.percentile(1.0), Some(Duration::from_nanos(9_970_000)));
        assert_eq!(Histogram::default().percentile(0.5), None);
    }

    #[test]
    fn histogram_buckets_are_contiguous_and_small_values_exact() {
        for v in 0..SUB {
            assert_eq!(bucket_high(bucket_of(v)), v);
        }
        let mut previous = 0;
        for v in [
            64u64,
            65,
            127,
            128,
            129,
            1_000,
            65_535,
            1 << 30,
            (1 << 39) + 5,
        ] {
            let b = bucket_of(v);
            assert!(b >= previous);
            previous = b;
            assert!(
                bucket_high(b) >= v,
                "{v} above its bucket's top {}",
                bucket_high(b)
            );
            assert!(b == 0 || bucket_high(b - 1) < v, "{v} fits a lower bucket");
        }
        // Larger than the covered range: clamped into the last bucket, max kept exact.
        let mut h = Histogram::default();
        h.record(Duration::from_secs(100_000));
        assert_eq!(h.percentile(0.5), Some(Duration::from_secs(100_000)));
    }

    #[test]
    fn merge_adds_counts_and_keeps_the_max() {
        let mut a = Histogram::default();
        let mut b = Histogram::default();
        a.record(ms(1));
        b.record(ms(5));
        b.record(ms(5));
        a.merge(&b);
        assert_eq!(a.count(), 3);
        let s = a.summary();
        assert!(s.p50_us >= 5000.0 && s.p50_us < 5100.0, "{s:?}");
        assert_eq!(s.max_us, 5000.0);
    }

    #[test]
    fn medians() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.0));
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[1.0, f64::NAN]), None);
    }
}
