//! The fast world's fault plan: which faults a run injects, how often, and
//! when its controls (flush, settle, shutdown, abandon) come.

use std::time::Duration;

use rand::Rng;

use crate::draw::{chance, log_uniform, SimRng};

/// Which faults a run injects and how often, in parts per 1,000 attempts
/// (swarm testing: each kind is on in about half the runs, so rare
/// combinations meet often).
#[derive(Clone, Debug)]
pub struct FaultPlan {
    /// Retryable sink errors.
    pub error: u32,
    /// Panics in the sink.
    pub panic: u32,
    /// Terminal rejections.
    pub reject: u32,
    /// Write tasks lost (finish_lost, S-W13).
    pub lose_task: u32,
    /// Hangs: attempts that run for a long time (cut by a write timeout).
    pub hang: u32,
    /// Commits whose reply is lost: written, then reported failed.
    pub ghost: u32,
    /// Items consumed without writing (S-W12).
    pub discard: u32,
    /// Attempts cancelled by the driver though not given up.
    pub cancel: u32,
    /// Mean attempt latency.
    pub latency: Duration,
    /// During a storm every fault rate is multiplied by this.
    pub storm_factor: u32,
    /// Mean length of calm and of stormy spells.
    pub spell: Duration,
    /// Tenants below this index fail every attempt during a storm.
    pub bad_tenants: u8,
    /// A flush or settle every so often, on average (`None`: never).
    pub control_gap: Option<Duration>,
    /// Whether and when (in steps) a shutdown is called, with its deadline.
    pub shutdown_at: Option<(u64, Duration)>,
    /// A second shutdown call joins the first, this many steps later.
    pub shutdown_join: Option<(u64, Duration)>,
    /// Whether and when (in steps) the engine is abandoned.
    pub abandon_at: Option<u64>,
}

impl FaultPlan {
    /// Draws a fault plan for a run of `steps` steps.
    pub fn draw(rng: &mut SimRng, steps: u64, tenants: u8) -> FaultPlan {
        let rate = |rng: &mut SimRng, max: u64| {
            if chance(rng, 1, 2) {
                log_uniform(rng, 1, max) as u32
            } else {
                0
            }
        };
        let error = rate(rng, 500);
        let panic = rate(rng, 100);
        let reject = rate(rng, 20);
        let lose_task = rate(rng, 10);
        let hang = rate(rng, 50);
        let ghost = rate(rng, 100);
        let discard = rate(rng, 20);
        let cancel = rate(rng, 20);
        let steps = steps.max(1);
        let shutdown_at = chance(rng, 1, 4).then(|| {
            (
                rng.random_range(0..steps),
                Duration::from_millis(log_uniform(rng, 1, 60_000)),
            )
        });
        let shutdown_join = (shutdown_at.is_some() && chance(rng, 1, 4)).then(|| {
            (
                rng.random_range(0..=50),
                Duration::from_millis(log_uniform(rng, 1, 60_000)),
            )
        });
        FaultPlan {
            error,
            panic,
            reject,
            lose_task,
            hang,
            ghost,
            discard,
            cancel,
            latency: Duration::from_micros(log_uniform(rng, 1, 50_000)),
            storm_factor: log_uniform(rng, 1, 20) as u32,
            spell: Duration::from_millis(log_uniform(rng, 10, 30_000)),
            bad_tenants: if chance(rng, 1, 3) {
                rng.random_range(1..=tenants.max(1))
            } else {
                0
            },
            control_gap: chance(rng, 2, 3)
                .then(|| Duration::from_millis(log_uniform(rng, 1, 5_000))),
            shutdown_at,
            shutdown_join,
            abandon_at: chance(rng, 1, 20).then(|| rng.random_range(0..steps)),
        }
    }
}
