//! Backoff with optional seeded jitter (S-W7, S-B2).

use std::time::Duration;

use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};

/// Computes retry waits. The generator is ChaCha8, a named portable
/// algorithm, seeded from `Config::seed`, so a seed draws the same waits on
/// every machine and release (S-B4).
#[derive(Clone, Debug)]
pub(crate) struct Backoff {
    initial: Duration,
    max: Duration,
    jitter_ppm: u32,
    rng: ChaCha8Rng,
}

impl Backoff {
    pub(crate) fn new(initial: Duration, max: Duration, jitter_ppm: u32, seed: u64) -> Self {
        Backoff {
            initial,
            max,
            jitter_ppm,
            rng: ChaCha8Rng::seed_from_u64(seed),
        }
    }

    /// The wait after the `failures`-th failure in a row (1-based):
    /// `initial * 2^(failures-1)`, capped at `max`, then shortened by a
    /// uniform share of up to `jitter` of it. Never above `max` (S-W7;
    /// scenario 28 of docs/scenarios.md).
    pub(crate) fn wait(&mut self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(64);
        let initial = self.initial.as_nanos();
        let base = initial
            .checked_shl(doublings)
            .filter(|b| b >> doublings == initial)
            .map_or(self.max, |b| {
                Duration::from_nanos(u64::try_from(b).unwrap_or(u64::MAX))
            })
            .min(self.max);
        if self.jitter_ppm == 0 {
            return base;
        }
        // A 32-bit uniform draw; integer maths so no float rounding can
        // differ between machines.
        let draw = u128::from(self.rng.next_u32());
        let cut = (base.as_nanos() * u128::from(self.jitter_ppm) / 1_000_000 * draw) >> 32;
        base - Duration::from_nanos(u64::try_from(cut).unwrap_or(u64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn doubles_from_initial_and_caps_at_max() {
        // S-W7: 50 ms doubling, capped at 5 s.
        let mut b = Backoff::new(50 * MS, 5_000 * MS, 0, 0);
        let waits: Vec<_> = (1..=9).map(|f| b.wait(f)).collect();
        assert_eq!(
            waits,
            [50, 100, 200, 400, 800, 1600, 3200, 5000, 5000].map(|m| m * MS)
        );
        assert_eq!(b.wait(u32::MAX), 5_000 * MS, "no overflow");
    }

    #[test]
    fn jitter_stays_within_its_share_and_never_exceeds_the_cap() {
        // S-W7 (scenario 28 of docs/scenarios.md) and S-B2.
        let mut b = Backoff::new(50 * MS, 5_000 * MS, 500_000, 7);
        let mut distinct = std::collections::BTreeSet::new();
        for f in 1..200 {
            let base = (50 * MS * 2u32.pow((f - 1).min(7))).min(5_000 * MS);
            let w = b.wait(f);
            assert!(w <= base && w >= base / 2, "{w:?} for base {base:?}");
            distinct.insert(w);
        }
        assert!(distinct.len() > 100, "jitter actually varies");
    }

    #[test]
    fn same_seed_same_waits() {
        // S-B4: reproducible from the seed.
        let draw = |seed| {
            let mut b = Backoff::new(MS, 1_000 * MS, 1_000_000, seed);
            (1..50).map(|f| b.wait(f)).collect::<Vec<_>>()
        };
        assert_eq!(draw(3), draw(3));
        assert_ne!(draw(3), draw(4));
    }
}
