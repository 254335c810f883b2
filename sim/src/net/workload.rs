//! The net world's workload, drawn from the seed: how many tenants (1 to
//! 10,000) and how skewed, how many items and how fast, bursts, item sizes
//! and how many tasks stage concurrently.

use std::time::Duration;

use rand::Rng;

use crate::draw::{chance, log_uniform, zipf_cumulative, SimRng};

/// What the application stages during the faulty phase.
#[derive(Clone, Debug)]
pub struct NetWorkload {
    /// Tenants in play (1..=10,000); tenant `k` is `TenantId::from_u128(k + 1)`.
    pub tenants: u32,
    /// Cumulative Zipf-like weights, one per tenant.
    cumulative: Vec<u64>,
    /// Skew exponent ×2 (0: uniform, 4: Zipf s = 2).
    pub skew_half: u8,
    /// Items the stagers aim to stage in the faulty phase, all together.
    pub items: u64,
    /// Hard cap on items staged (bursts included), to bound a run's cost.
    pub cap: u64,
    /// Tasks staging concurrently (1..=4).
    pub stagers: u32,
    /// Mean gap between two stage calls of one stager outside bursts.
    pub mean_gap: Duration,
    /// One stage call in `burst_odds` starts a burst.
    pub burst_odds: u32,
    /// Stage calls in a burst, at most.
    pub burst_max: u32,
    /// Items per stage call, at most (1..=8), for one tenant back to back.
    pub max_count: u8,
    /// Item payload size in bytes, at most (sizes are log-uniform in
    /// `1..=max_size`); the weigher weighs an item by its size.
    pub max_size: u32,
}

impl NetWorkload {
    /// Draws the workload of a faulty phase of `phase` (virtual time).
    pub fn draw(rng: &mut SimRng, phase: Duration) -> NetWorkload {
        let tenants = match rng.random_range(0..8) {
            0 => 1,
            1 | 2 => rng.random_range(2..=8),
            3 | 4 => log_uniform(rng, 1, 64) as u32,
            5 | 6 => log_uniform(rng, 1, 1_000) as u32,
            _ => log_uniform(rng, 1, 10_000) as u32,
        };
        let skew_half = rng.random_range(0..=4u8);
        let items = log_uniform(rng, 20, 12_000);
        let stagers = rng.random_range(1..=4u32);
        let max_count = rng.random_range(1..=8u8);
        let calls = (items * 2 / (u64::from(max_count) + 1)).max(1);
        let per_stager = (calls / u64::from(stagers)).max(1);
        let phase_us = u64::try_from(phase.as_micros()).unwrap_or(u64::MAX);
        let mean_gap = Duration::from_micros((phase_us / per_stager).max(10));
        let max_size = if chance(rng, 1, 8) {
            log_uniform(rng, 1, 16_384) as u32
        } else {
            log_uniform(rng, 1, 512) as u32
        };
        NetWorkload {
            tenants,
            cumulative: zipf_cumulative(tenants, skew_half),
            skew_half,
            items,
            cap: items * 3,
            stagers,
            mean_gap,
            burst_odds: rng.random_range(5..=200),
            burst_max: log_uniform(rng, 2, 200) as u32,
            max_count,
            max_size,
        }
    }

    /// A tenant index, Zipf-skewed towards the low ones.
    pub fn tenant(&self, rng: &mut SimRng) -> u32 {
        let total = *self.cumulative.last().expect("at least one tenant");
        let x = rng.random_range(0..total);
        self.cumulative.partition_point(|c| *c <= x) as u32
    }

    /// An item size in bytes.
    pub fn size(&self, rng: &mut SimRng) -> u32 {
        log_uniform(rng, 1, u64::from(self.max_size)) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::draw::rng;

    #[test]
    fn tenants_stay_in_range_and_skew_low() {
        for seed in 0..200 {
            let w = NetWorkload::draw(&mut rng(seed), Duration::from_secs(60));
            assert!((1..=10_000).contains(&w.tenants));
            let mut r = rng(seed);
            for _ in 0..100 {
                assert!(w.tenant(&mut r) < w.tenants);
                assert!((1..=w.max_size).contains(&w.size(&mut r)));
            }
        }
    }
}
