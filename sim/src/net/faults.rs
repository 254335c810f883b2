//! The net world's faults, drawn from the seed (swarm testing: each kind is
//! on in about half the runs): what the sink and the datastore do wrong per
//! attempt, and a schedule of network events (partitions and repairs, slow
//! and jittery links, datastore crashes and restarts, storms) plus the
//! application's controls (flushes, settles, shutdowns, abandon) and its
//! ending ([`draw_drop`]).

use std::time::Duration;

use rand::Rng;

use crate::draw::{chance, gap, log_uniform, SimRng};

/// Rates in parts per 1,000 attempts (client side) or requests (datastore
/// side), in calm weather; a storm multiplies them by `storm_factor`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Rates {
    /// The sink panics while creating the write future (S-W5).
    pub panic_create: u32,
    /// The sink panics while the future is polled (S-W5).
    pub panic_poll: u32,
    /// The sink fails with an error whose `Display` panics (S-W5).
    pub panic_display: u32,
    /// The sink hangs before sending (cut by `write_timeout`, S-B3).
    pub hang_client: u32,
    /// The sink fails before sending (a pool error), retryable.
    pub client_error: u32,
    /// The datastore answers a retryable error without committing.
    pub error: u32,
    /// The datastore commits, then drops the connection: the reply is lost.
    pub ghost: u32,
    /// The datastore rejects the slice terminally (S-A5); it stays rejected.
    pub reject: u32,
    /// The datastore consumes some items without writing them (S-W12).
    pub discard: u32,
    /// The datastore is slow (10 ms to 2 s) before it commits.
    pub slow: u32,
    /// The datastore hangs (5 s to 120 s) before it commits.
    pub hang: u32,
}

impl Rates {
    /// Every rate multiplied by `factor`, capped at 1,000.
    pub fn times(self, factor: u32) -> Rates {
        let m = |r: u32| r.saturating_mul(factor).min(1_000);
        Rates {
            panic_create: m(self.panic_create),
            panic_poll: m(self.panic_poll),
            panic_display: m(self.panic_display),
            hang_client: m(self.hang_client),
            client_error: m(self.client_error),
            error: m(self.error),
            ghost: m(self.ghost),
            reject: m(self.reject),
            discard: m(self.discard),
            slow: m(self.slow),
            hang: m(self.hang),
        }
    }
}

/// One event of the network schedule, applied by the world between turmoil
/// steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NetEvent {
    /// Cut the link between the application and the datastore.
    Partition,
    /// Repair it.
    Repair,
    /// Crash the datastore host (its committed data survives).
    Crash,
    /// Restart it.
    Restart,
    /// Set the link's maximum message latency, in microseconds.
    Latency(u64),
    /// Fault rates rise by the storm factor.
    StormBegins,
    /// Back to calm rates.
    StormEnds,
}

impl NetEvent {
    /// The name in traces and fault counts.
    pub fn kind(self) -> &'static str {
        match self {
            NetEvent::Partition => "partition",
            NetEvent::Repair => "repair",
            NetEvent::Crash => "crash",
            NetEvent::Restart => "restart",
            NetEvent::Latency(_) => "latency",
            NetEvent::StormBegins => "storm",
            NetEvent::StormEnds => "storm_end",
        }
    }
}

/// The fault plan of one run.
#[derive(Clone, Debug)]
pub struct NetFaults {
    /// Calm rates.
    pub rates: Rates,
    /// Storm multiplier (1..=20).
    pub storm_factor: u32,
    /// The sink's own per-call timeout (connect, send, reply): a lost
    /// segment or a partition becomes a retryable error after it.
    pub rpc_timeout: Duration,
    /// The calm link's maximum message latency.
    pub calm_latency: Duration,
    /// Network events, in time order (time from the start of the run).
    pub schedule: Vec<(Duration, NetEvent)>,
    /// A flush or settle every so often, on average (`None`: never).
    pub control_gap: Option<Duration>,
    /// A shutdown at this time, with this deadline.
    pub shutdown_at: Option<(Duration, Duration)>,
    /// A second shutdown joins the first this much later, with its deadline.
    pub shutdown_join: Option<(Duration, Duration)>,
    /// An abandon at this time.
    pub abandon_at: Option<Duration>,
}

impl NetFaults {
    /// Draws the plan for a faulty phase of length `phase`.
    pub fn draw(rng: &mut SimRng, phase: Duration) -> NetFaults {
        let rate = |rng: &mut SimRng, max: u64| {
            if chance(rng, 1, 2) {
                log_uniform(rng, 1, max) as u32
            } else {
                0
            }
        };
        let rates = Rates {
            panic_create: rate(rng, 30),
            panic_poll: rate(rng, 30),
            panic_display: rate(rng, 30),
            hang_client: rate(rng, 20),
            client_error: rate(rng, 100),
            error: rate(rng, 300),
            ghost: rate(rng, 100),
            reject: rate(rng, 10),
            discard: rate(rng, 20),
            slow: rate(rng, 200),
            hang: rate(rng, 20),
        };
        let storm_factor = log_uniform(rng, 1, 20) as u32;
        let rpc_timeout = Duration::from_millis(log_uniform(rng, 50, 5_000));
        let calm_latency = Duration::from_micros(log_uniform(rng, 1, 20_000));
        let mut schedule = Vec::new();
        let end = phase;
        // Storms: alternating calm and stormy spells.
        if chance(rng, 2, 3) {
            let spell = Duration::from_millis(log_uniform(rng, 100, 20_000));
            let mut t = gap(rng, spell);
            let mut storm = false;
            while t < end {
                storm = !storm;
                schedule.push((
                    t,
                    if storm {
                        NetEvent::StormBegins
                    } else {
                        NetEvent::StormEnds
                    },
                ));
                t += gap(rng, spell).max(Duration::from_millis(1));
            }
        }
        // Partitions and their repairs.
        if chance(rng, 1, 2) {
            let every = Duration::from_millis(log_uniform(rng, 500, 30_000));
            let mut t = gap(rng, every);
            while t < end {
                let len = Duration::from_millis(log_uniform(rng, 1, 10_000));
                schedule.push((t, NetEvent::Partition));
                schedule.push(((t + len).min(end), NetEvent::Repair));
                t += len + gap(rng, every).max(Duration::from_millis(1));
            }
        }
        // Datastore crashes and restarts.
        if chance(rng, 1, 3) {
            let every = Duration::from_millis(log_uniform(rng, 2_000, 60_000));
            let mut t = gap(rng, every);
            while t < end {
                let down = Duration::from_millis(log_uniform(rng, 1, 5_000));
                schedule.push((t, NetEvent::Crash));
                schedule.push(((t + down).min(end), NetEvent::Restart));
                t += down + gap(rng, every).max(Duration::from_millis(1));
            }
        }
        // Slow and jittery spells.
        if chance(rng, 1, 2) {
            let every = Duration::from_millis(log_uniform(rng, 200, 20_000));
            let mut t = gap(rng, every);
            while t < end {
                let max = Duration::from_micros(log_uniform(rng, 1, 500_000));
                let len = Duration::from_millis(log_uniform(rng, 10, 10_000));
                schedule.push((t, NetEvent::Latency(max.as_micros() as u64)));
                schedule.push((
                    (t + len).min(end),
                    NetEvent::Latency(calm_latency.as_micros() as u64),
                ));
                t += len + gap(rng, every).max(Duration::from_millis(1));
            }
        }
        // A stable sort keeps each pair's order when two events tie.
        schedule.sort_by_key(|(t, _)| *t);
        let phase_ms = u64::try_from(phase.as_millis()).unwrap_or(u64::MAX).max(1);
        let shutdown_at = chance(rng, 1, 5).then(|| {
            (
                Duration::from_millis(rng.random_range(0..phase_ms)),
                Duration::from_millis(log_uniform(rng, 1, 60_000)),
            )
        });
        let shutdown_join = (shutdown_at.is_some() && chance(rng, 1, 3)).then(|| {
            (
                Duration::from_millis(log_uniform(rng, 1, 5_000)),
                Duration::from_millis(log_uniform(rng, 1, 60_000)),
            )
        });
        NetFaults {
            rates,
            storm_factor,
            rpc_timeout,
            calm_latency,
            schedule,
            control_gap: chance(rng, 2, 3)
                .then(|| Duration::from_millis(log_uniform(rng, 10, 10_000))),
            shutdown_at,
            shutdown_join,
            abandon_at: chance(rng, 1, 25)
                .then(|| Duration::from_millis(rng.random_range(0..phase_ms))),
        }
    }
}

/// XOR-ed into the seed for [`draw_drop`]'s generator: a stream of its own,
/// so adding the drop ending shifted none of a seed's other draws.
pub const DROP_STREAM: u64 = 0xD809_0000_5EED;

/// Draws the ending of a run that reaches the healed phase with no
/// shutdown or abandon behind it: in 1 run in 4 the application drops
/// every handle instead of settling and shutting down (S-W16), and this is
/// the writer's drop deadline (`None`: the usual ending). `covers` is a
/// deadline long enough for the I6 bound, when I6 is checked in the run;
/// half of those drops take it, so the drain must end with nothing lost.
/// The rest: 1 s mostly, sometimes anything from 1 ms to 10 s, or zero
/// (everything given up at once).
pub fn draw_drop(rng: &mut SimRng, covers: Option<Duration>) -> Option<Duration> {
    if !chance(rng, 1, 4) {
        return None;
    }
    if let Some(long) = covers.filter(|_| chance(rng, 1, 2)) {
        return Some(long);
    }
    Some(match rng.random_range(0..10u32) {
        0 => Duration::ZERO,
        1..=5 => Duration::from_secs(1),
        _ => Duration::from_millis(log_uniform(rng, 1, 10_000)),
    })
}
