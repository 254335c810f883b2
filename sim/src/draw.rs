//! The draws both worlds share: the run's generator, the integer draws
//! (chance, log-uniform, gaps, Zipf weights) and the engine's config
//! (S-B4: a run is reproducible from its seed). Each world draws its own
//! workload and faults (`fast::workload`, `fast::faults`, `net::workload`,
//! `net::faults`).
//!
//! One ChaCha8 generator per run, seeded with `seed_from_u64(seed)`, is the
//! only source of randomness; draws use integer arithmetic only, so a seed
//! means the same run on every machine.

use std::time::Duration;

use outbox::core::{BreakerConfig, Config, ConfigBuilder, ConfigError, ErrorPolicy};
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The run's random source.
pub type SimRng = ChaCha8Rng;

/// The generator for `seed`.
pub fn rng(seed: u64) -> SimRng {
    ChaCha8Rng::seed_from_u64(seed)
}

/// True with probability `num / den`.
pub fn chance(rng: &mut SimRng, num: u32, den: u32) -> bool {
    rng.random_range(0..den) < num
}

/// A log-uniform draw in `lo..=hi` (both at least 1): small values are as
/// likely as large ones, per order of magnitude.
pub fn log_uniform(rng: &mut SimRng, lo: u64, hi: u64) -> u64 {
    debug_assert!(1 <= lo && lo <= hi);
    let bits_lo = 63 - lo.leading_zeros();
    let bits_hi = 63 - hi.leading_zeros();
    let bits = rng.random_range(bits_lo..=bits_hi);
    let a = (1u64 << bits).max(lo);
    let b = ((1u64 << bits) * 2 - 1).min(hi);
    rng.random_range(a..=b)
}

/// An exponential-ish gap with the given mean, from integer draws: a
/// uniform draw scaled by a geometric number of doublings, capped.
pub fn gap(rng: &mut SimRng, mean: Duration) -> Duration {
    let mean_us = u64::try_from(mean.as_micros()).unwrap_or(u64::MAX).max(1);
    // Uniform in 0..2*mean, with a 1/8 chance of a 4x longer quiet spell.
    let mut us = rng.random_range(0..=2 * mean_us);
    if chance(rng, 1, 8) {
        us = us.saturating_mul(4);
    }
    Duration::from_micros(us)
}

/// The engine configuration of a run and whether items are weighed.
#[derive(Clone, Debug)]
pub struct ConfigPick {
    /// The validated config.
    pub config: Config,
    /// Whether a byte limit is set (the harness weighs items then).
    pub weighs: bool,
}

/// Draws every knob in its valid range: usually everyday values, sometimes
/// the extremes (a 1 ns write timeout, an hour of linger or backoff, one
/// byte per batch).
pub fn config(rng: &mut SimRng) -> ConfigPick {
    config_with(rng, |b| b)
}

/// [`config`], with `extra` applied to the builder after every draw (a
/// world's own knobs, drawn from a generator of its own so the draws
/// above keep their stream).
pub fn config_with(
    rng: &mut SimRng,
    extra: impl FnOnce(ConfigBuilder) -> ConfigBuilder,
) -> ConfigPick {
    let extreme = chance(rng, 1, 16);
    let ms = |v: u64| Duration::from_millis(v);
    let mut b = Config::builder();
    b = b.concurrency(match rng.random_range(0..8) {
        0 => 0,
        1 => 1,
        2..=4 => rng.random_range(2..=8),
        _ => log_uniform(rng, 1, 64) as usize,
    });
    let mut weighs = false;
    if chance(rng, 1, 2) {
        b = b.capacity(log_uniform(rng, 1, 4096) as usize);
    }
    if chance(rng, 1, 4) {
        b = b.capacity_bytes(log_uniform(rng, 1, 16_384));
        weighs = true;
    }
    if chance(rng, 2, 5) {
        b = b.tenant_capacity(log_uniform(rng, 1, 512) as usize);
    }
    if chance(rng, 3, 5) {
        b = b.max_batch(log_uniform(rng, 1, 512) as usize);
    }
    if chance(rng, 1, 4) {
        b = b.max_batch_bytes(log_uniform(rng, 1, 256));
        weighs = true;
    }
    if chance(rng, 1, 2) {
        let linger = if extreme && chance(rng, 1, 3) {
            Duration::from_secs(3600)
        } else {
            ms(log_uniform(rng, 1, 2_000))
        };
        b = b.linger(linger);
    }
    let initial = if extreme && chance(rng, 1, 3) {
        Duration::from_nanos(1)
    } else {
        ms(log_uniform(rng, 1, 500))
    };
    let max = if extreme && chance(rng, 1, 3) {
        Duration::from_secs(3600)
    } else if chance(rng, 1, 5) {
        initial
    } else {
        initial + ms(log_uniform(rng, 1, 30_000))
    };
    b = b.initial_backoff(initial).max_backoff(max);
    if chance(rng, 1, 2) {
        b = b.jitter(f64::from(rng.random_range(0..=100u32)) / 100.0);
    }
    if chance(rng, 3, 10) {
        b = b.max_attempts(log_uniform(rng, 1, 12) as u32);
    }
    if chance(rng, 1, 5) {
        b = b.max_retry_duration(ms(log_uniform(rng, 1, 30_000)));
    }
    if chance(rng, 3, 20) {
        b = b.error_policy(ErrorPolicy::Drop);
    }
    if chance(rng, 1, 2) {
        let timeout = if extreme && chance(rng, 1, 3) {
            Duration::from_nanos(1)
        } else {
            ms(log_uniform(rng, 1, 30_000))
        };
        b = b.write_timeout(timeout);
    }
    let seed = rng.next_u64();
    b = outage(&mut self::rng(seed ^ OUTAGE_STREAM), b.seed(seed));
    b = extra(b);
    // An age limit drawn below the linger is out of range (every
    // partial batch would expire): it then runs from the linger on.
    let config = match b.clone().build() {
        Err(ConfigError::LingerAboveItemAge {
            linger,
            max_item_age,
        }) => b.max_item_age(linger.saturating_add(max_item_age)).build(),
        built => built,
    }
    .expect("every draw is in range");
    ConfigPick { config, weighs }
}

/// Salt of the generator the outage knobs are drawn from: a stream of its
/// own, so adding them left every other draw of a seed as it was.
const OUTAGE_STREAM: u64 = 0x0b7e_a4e7_0015_0015;

/// The outage knobs (S-R1, S-R2, S-R3): a breaker in a third of the runs,
/// from "opens at the first failure, probes every millisecond" to "opens
/// after 64, probes after 2 s backing off to 30 s"; an item age limit in a
/// quarter, from 1 ms to a minute; run-time dead letters in half (S-R4).
fn outage(rng: &mut SimRng, mut b: ConfigBuilder) -> ConfigBuilder {
    let ms = |v: u64| Duration::from_millis(v);
    if chance(rng, 1, 3) {
        let probe = ms(log_uniform(rng, 1, 2_000));
        let max = if chance(rng, 1, 4) {
            probe
        } else {
            probe + ms(log_uniform(rng, 1, 30_000))
        };
        b = b.breaker(
            BreakerConfig::new()
                .failures(log_uniform(rng, 1, 64) as u32)
                .probe_interval(probe)
                .max_probe_interval(max),
        );
    }
    if chance(rng, 1, 4) {
        b = b.max_item_age(ms(log_uniform(rng, 1, 60_000)));
    }
    b.dead_letters(chance(rng, 1, 2))
}

/// Fan-in (S-F1, S-F2) for half the seeds: up to 16 slices per write,
/// sometimes a cap on a group's items. Drawn from a generator of its own
/// (`seed` with a fixed tweak), so a seed drawn without fan-in runs
/// exactly as it did before fan-in existed: its trace hash is unchanged.
pub fn groups(seed: u64, b: ConfigBuilder) -> ConfigBuilder {
    let mut g = rng(seed ^ 0x6661_6e2d_696e_0000);
    if !chance(&mut g, 1, 2) {
        return b;
    }
    let b = b.max_slices_per_write(log_uniform(&mut g, 2, 16) as usize);
    if chance(&mut g, 1, 2) {
        b.max_group_items(log_uniform(&mut g, 1, 512) as usize)
    } else {
        b
    }
}

/// Integer Zipf weights: tenant `k` weighs about `1 / (k+1)^(skew_half/2)`.
pub(crate) fn zipf_cumulative(tenants: u32, skew_half: u8) -> Vec<u64> {
    let mut acc = 0u64;
    (0..u64::from(tenants))
        .map(|k| {
            let r = k + 1;
            // (k+1)^(s/2) scaled by 1000, from integer square roots.
            let root = (r * 1_000_000).isqrt();
            let denom = match skew_half {
                0 => 1_000,
                1 => root,
                2 => r * 1_000,
                3 => r * root,
                _ => r * r * 1_000,
            };
            acc += (1_000_000_000_000 / denom).max(1);
            acc
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_draws() {
        let a = config(&mut rng(7));
        let b = config(&mut rng(7));
        assert_eq!(a.config, b.config);
    }

    #[test]
    fn zipf_is_skewed_and_covers_every_tenant() {
        let w = zipf_cumulative(10, 4);
        assert_eq!(w.len(), 10);
        assert!(w[0] > w[9] - w[8]);
        let flat = zipf_cumulative(4, 0);
        assert_eq!(flat[1] - flat[0], flat[0]);
    }

    #[test]
    fn log_uniform_stays_in_range() {
        let mut r = rng(1);
        for _ in 0..10_000 {
            let v = log_uniform(&mut r, 3, 700);
            assert!((3..=700).contains(&v));
        }
    }
}
