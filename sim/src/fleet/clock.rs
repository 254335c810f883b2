//! Per-host clock skew (S-FW9): the clock each host's lease policy reads
//! (the driver's lease-clock hook, `TableRelay::lease_clock`), skewed
//! against the store's clock, drawn per seed within the bound S-L7 sets:
//! over any one lease ttl, the store's clock gains at most
//! `max_clock_drift` on the host's lease clock.
//!
//! A host's lease clock runs at a drawn rate (at most `drift / (2 ttl)`
//! off the store's, either way), stalls now and then (the clock stands
//! still: the store gains the stall, at most `drift / 2`, at most one
//! stall in any window of a ttl), and jumps ahead now and then (the host
//! gains; safe for the lease, tested anyway). So the rate's loss over a
//! ttl plus one stall is at most `drift`. The host's runtime (its timers,
//! its link delays) keeps the store's pace: only what the lease policy
//! judges is skewed.

use std::time::Duration;

use rand::Rng;

use super::Setup;
use crate::draw::SimRng;

/// One host's lease clock, as a function of the store's clock.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Skew {
    /// The rate error, in millionths (negative: the host's clock is slow,
    /// so the store gains on it).
    pub ppm: i64,
    /// Stalls: `(from, length)` on the store's clock, in order.
    pub stalls: Vec<(Duration, Duration)>,
    /// Jumps ahead: `(at, by)` on the store's clock.
    pub jumps: Vec<(Duration, Duration)>,
}

impl Skew {
    /// Draws one host's skew for `s`; within the bound when `within`,
    /// else with a rate error of up to three times the drift per ttl (the
    /// documentation's bound broken on purpose).
    pub fn draw(rng: &mut SimRng, s: &Setup, within: bool) -> Skew {
        let ttl_us = s.ttl.as_micros().max(1) as i64;
        let drift_us = s.drift.as_micros() as i64;
        // Rate loss over one ttl at most drift / 2.
        let limit = if within {
            drift_us * 1_000_000 / (2 * ttl_us)
        } else {
            drift_us * 3_000_000 / ttl_us
        };
        // Half the hosts at the limit, either way.
        let ppm = match rng.random_range(0..4u32) {
            0 => -limit,
            1 => limit,
            _ => rng.random_range(-limit..=limit),
        };
        let mut skew = Skew {
            ppm,
            ..Skew::default()
        };
        // Stalls in disjoint slots, each slot longer than two ttls: never
        // two in one window of a ttl.
        let stalls = rng.random_range(0..=3u32);
        let slot = s.phase / stalls.max(1);
        if stalls > 0 && slot > s.ttl * 2 {
            for i in 0..stalls {
                let len = Duration::from_micros(rng.random_range(1..=(drift_us as u64 / 2).max(1)));
                let room = (slot - s.ttl - len).as_millis().max(1) as u64;
                let at = slot * i + Duration::from_millis(rng.random_range(0..room));
                skew.stalls.push((at, len));
            }
        }
        for _ in 0..rng.random_range(0..=2u32) {
            let at = Duration::from_millis(rng.random_range(0..s.phase.as_millis().max(1) as u64));
            let by = Duration::from_micros(rng.random_range(1..=drift_us.max(1) as u64));
            skew.jumps.push((at, by));
        }
        skew.jumps.sort_unstable();
        skew
    }

    /// Whether the clock is the store's.
    pub fn is_none(&self) -> bool {
        self.ppm == 0 && self.stalls.is_empty() && self.jumps.is_empty()
    }

    /// The host's lease clock when the store's reads `t` (non-decreasing
    /// in `t`).
    pub fn at(&self, t: Duration) -> Duration {
        let stalled: Duration = self
            .stalls
            .iter()
            .filter(|(from, _)| *from < t)
            .map(|&(from, len)| len.min(t - from))
            .sum();
        let running = t.saturating_sub(stalled).as_nanos() as i128;
        let rated = running + running * i128::from(self.ppm) / 1_000_000;
        let jumped: Duration = self
            .jumps
            .iter()
            .filter(|(at, _)| *at <= t)
            .map(|(_, by)| *by)
            .sum();
        Duration::from_nanos(rated.max(0) as u64) + jumped
    }

    /// The most the store's clock gains on this clock over any window of
    /// `window` starting at a multiple of `step` before `until` (a
    /// self-check of the draw).
    pub fn worst_gain(&self, window: Duration, step: Duration, until: Duration) -> Duration {
        let mut worst = Duration::ZERO;
        let mut t = Duration::ZERO;
        while t < until {
            let host = self.at(t + window).saturating_sub(self.at(t));
            worst = worst.max(window.saturating_sub(host));
            t += step;
        }
        worst
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::draw::rng;

    fn setup(ttl_ms: u64) -> Setup {
        let ms = Duration::from_millis;
        Setup {
            seed: 0,
            hosts: 3,
            partitions: 4,
            tenants: 4,
            stagers: 1,
            stage_gap: ms(100),
            phase: Duration::from_secs(30),
            ttl: ms(ttl_ms),
            renew: ms(ttl_ms / 4),
            drift: ms(ttl_ms / 10),
            acquire_poll: ms(100),
            heartbeat: ms(100),
            grace: ms(ttl_ms),
            poll: ms(200),
            skews: Vec::new(),
            poison_per_mille: 0,
            write_timeout: ms(2_000),
            idle_timeout: ms(2_000),
            join_at: vec![Duration::ZERO; 3],
            leave: None,
            repeat_window: None,
        }
    }

    /// S-FW9: every drawn skew keeps within the bound (the store gains
    /// at most the drift over any ttl), and the clock never goes back.
    #[test]
    fn drawn_skews_keep_within_the_drift_bound() {
        for seed in 0..200 {
            let s = setup(1_500 + seed * 10);
            let skew = Skew::draw(&mut rng(seed), &s, true);
            let gain = skew.worst_gain(s.ttl, Duration::from_millis(20), s.phase);
            assert!(gain <= s.drift, "seed {seed}: {skew:?} gains {gain:?}");
            let mut last = Duration::ZERO;
            for ms in (0..31_000).step_by(7) {
                let now = skew.at(Duration::from_millis(ms));
                assert!(now >= last, "seed {seed}: the clock went back at {ms} ms");
                last = now;
            }
        }
    }
}
