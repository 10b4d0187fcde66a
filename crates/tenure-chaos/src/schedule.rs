//! The nemesis's plan: which fault when, drawn from a seeded generator.
//!
//! The plan (times, kinds, pause lengths, target picks) is a pure function of the seed
//! and the settings, so `--seed` replays it. What the real processes do in between is
//! not reproducible: "pause the leader" hits whoever leads at that moment.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::config::FaultKind;

/// One planned fault.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedFault {
    /// Offset from the start of the run.
    pub at: Duration,
    /// What to inject.
    pub kind: FaultKind,
    /// Chooses the target when the leader is not the target (or not known).
    pub pick: u64,
    /// Pause length as a multiple of the TTL, in [1, 3].
    pub factor: f64,
}

/// Plans faults of `kinds` over `duration`, one every `every` on average (each gap
/// uniform in 0.5x..1.5x of it).
pub fn plan(
    seed: u64,
    kinds: &[FaultKind],
    duration: Duration,
    every: Duration,
) -> Vec<PlannedFault> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Vec::new();
    if kinds.is_empty() || every.is_zero() {
        return out;
    }
    let mut at = Duration::ZERO;
    loop {
        at += every.mul_f64(rng.random_range(0.5..1.5));
        if at >= duration {
            return out;
        }
        let kind = kinds[rng.random_range(0..kinds.len())];
        out.push(PlannedFault {
            at,
            kind,
            pick: rng.random(),
            factor: rng.random_range(1.0..=3.0),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_replays_its_plan_and_another_seed_does_not() {
        let kinds = [FaultKind::Pause, FaultKind::Kill, FaultKind::Cut];
        let d = Duration::from_secs(30);
        let e = Duration::from_millis(250);
        let a = plan(7, &kinds, d, e);
        assert_eq!(a, plan(7, &kinds, d, e));
        assert_ne!(a, plan(8, &kinds, d, e));
        // About duration / every faults, every kind drawn, in time order.
        assert!((80..=160).contains(&a.len()), "{} faults", a.len());
        for kind in kinds {
            assert!(a.iter().any(|f| f.kind == kind), "{kind} never drawn");
        }
        assert!(a.windows(2).all(|w| w[0].at < w[1].at));
        assert!(a
            .iter()
            .all(|f| (1.0..=3.0).contains(&f.factor) && f.at < d));
    }
}
