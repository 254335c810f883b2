//! The health snapshot (S-R6) and its gauges.

use std::time::Duration;

use metrics::Gauge;

use crate::core::{BreakerState, Engine, Time};
use crate::telemetry::names;

/// How an outbox is doing, at one instant: [`Outbox::health`](crate::Outbox::health).
///
/// Non-exhaustive: fields may be added.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Health {
    /// The sink-wide breaker (S-R1); always closed without one.
    pub breaker: BreakerState,
    /// Failed attempts in a row across all tenants (S-R1), with the
    /// breaker off too.
    pub consecutive_failures: u32,
    /// How long ago a write last committed; `None` if none has.
    pub since_last_written: Option<Duration>,
    /// The age of the oldest pending item: exact with a `max_item_age`
    /// set; otherwise a lower bound (see
    /// [`Engine::oldest_pending`](crate::core::Engine::oldest_pending)).
    /// `None` with nothing pending.
    pub oldest_pending: Option<Duration>,
    /// Items pending (S-W14).
    pub pending: u64,
    /// Writes in flight.
    pub in_flight: usize,
    /// Tenants the outbox holds items or a write in flight for.
    pub tenants: usize,
    /// Run-time dead letters that could not be handed out (S-R4).
    pub dead_letters_dropped: u64,
    /// With an outbox table (feature `table`): its listener's state and
    /// the last horizon the relay read (S-T36); `None` for an outbox
    /// without one.
    #[cfg(feature = "table")]
    pub table: Option<crate::table::TableHealth>,
}

impl Health {
    pub(crate) fn of<K: Ord + std::hash::Hash + Clone, I>(
        engine: &Engine<K, I>,
        now: Time,
        dead_letters_dropped: u64,
    ) -> Health {
        Health {
            breaker: engine.breaker(),
            consecutive_failures: engine.consecutive_failures(),
            since_last_written: engine.last_written().map(|t| now.saturating_since(t)),
            oldest_pending: engine.oldest_pending().map(|t| now.saturating_since(t)),
            pending: engine.pending(),
            in_flight: engine.in_flight(),
            tenants: engine.tenants(),
            dead_letters_dropped,
            #[cfg(feature = "table")]
            table: None,
        }
    }
}

/// The health gauges of one outbox (see [`telemetry`](crate::telemetry)).
pub(crate) struct Gauges {
    breaker_open: Gauge,
    consecutive_failures: Gauge,
    in_flight: Gauge,
    tenants: Gauge,
    oldest_pending: Gauge,
    dead_letters_dropped: Gauge,
}

impl Gauges {
    pub(crate) fn register(name: &str) -> Gauges {
        use names::*;
        let g = |n: &'static str| metrics::gauge!(n, LABEL_OUTBOX => name.to_owned());
        Gauges {
            breaker_open: g(BREAKER_OPEN),
            consecutive_failures: g(CONSECUTIVE_FAILURES),
            in_flight: g(WRITES_IN_FLIGHT),
            tenants: g(TENANTS),
            oldest_pending: g(OLDEST_PENDING),
            dead_letters_dropped: g(DEAD_LETTERS_DROPPED),
        }
    }

    /// Sets every gauge from a snapshot.
    pub(crate) fn set(&self, h: &Health) {
        self.breaker_open.set(match h.breaker {
            BreakerState::Closed => 0.0,
            _ => 1.0,
        });
        self.consecutive_failures
            .set(f64::from(h.consecutive_failures));
        self.in_flight.set(h.in_flight as f64);
        self.tenants.set(h.tenants as f64);
        self.oldest_pending
            .set(h.oldest_pending.map_or(0.0, |d| d.as_secs_f64()));
        self.dead_letters_dropped.set(h.dead_letters_dropped as f64);
    }
}
