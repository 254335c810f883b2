//! The fast world's workload: how many tenants, how skewed, how fast and
//! how bursty the stage calls are.

use std::time::Duration;

use rand::Rng;

use crate::draw::{log_uniform, zipf_cumulative, SimRng};

/// How tenants are picked: integer Zipf-like weights over `tenants`.
#[derive(Clone, Debug)]
pub struct Workload {
    /// Tenants in play (1..=255).
    pub tenants: u8,
    /// Cumulative weights, one per tenant.
    cumulative: Vec<u64>,
    /// Mean gap between two stage calls outside bursts.
    pub mean_gap: Duration,
    /// One stage call in `burst_odds` starts a burst.
    pub burst_odds: u32,
    /// Stage calls in a burst, at most.
    pub burst_max: u32,
    /// Items per stage call, at most (1..=8).
    pub max_count: u8,
    /// Skew exponent ×2 (0: uniform, 4: Zipf s = 2).
    pub skew_half: u8,
}

impl Workload {
    /// Draws tenants, skew, rate and bursts.
    pub fn draw(rng: &mut SimRng) -> Workload {
        let tenants = match rng.random_range(0..6) {
            0 => 1,
            1 | 2 => rng.random_range(2..=8),
            3 | 4 => log_uniform(rng, 1, 64) as u8,
            _ => log_uniform(rng, 1, 255) as u8,
        };
        let skew_half = rng.random_range(0..=4u8);
        let cumulative = zipf_cumulative(u32::from(tenants), skew_half);
        Workload {
            tenants,
            cumulative,
            mean_gap: Duration::from_micros(log_uniform(rng, 10, 200_000)),
            burst_odds: rng.random_range(5..=200),
            burst_max: log_uniform(rng, 2, 500) as u32,
            max_count: rng.random_range(1..=8),
            skew_half,
        }
    }

    /// A tenant index, Zipf-skewed towards the low ones.
    pub fn tenant(&self, rng: &mut SimRng) -> u8 {
        let total = *self.cumulative.last().expect("at least one tenant");
        let x = rng.random_range(0..total);
        self.cumulative.partition_point(|c| *c <= x) as u8
    }
}
