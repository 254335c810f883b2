//! The relay's metrics (S-T36), each with the label `outbox`:
//!
//! | name | kind | meaning |
//! | --- | --- | --- |
//! | `outbox_table_rows_fetched_total` | counter | rows page reads returned (some are read again after a hand-over) |
//! | `outbox_table_rows_read_total` | counter | rows delivered towards the engine |
//! | `outbox_table_rows_deleted_total` | counter | rows deleted after their write |
//! | `outbox_table_rows_dead_lettered_total{reason}` | counter | rows moved to the dead-letter table, by reason |
//! | `outbox_table_unknown_version_total` | counter | rows met with a codec version this instance does not know (left in the table, S-T19) |
//! | `outbox_table_lag_seconds` | gauge | the oldest row's age at the last horizon read (0: the table was empty) |
//! | `outbox_table_oldest_transaction_seconds` | gauge | the oldest open transaction holding delivery back, at the last horizon read (0: none) |
//! | `outbox_table_listening` | gauge | 1 while the relay's listener is connected, else 0 (also polling only) |

use metrics::{Counter, Gauge};

use crate::core::relay::{DeadReason, Removal, Removed};
use crate::table::Horizon;

const REASONS: [DeadReason; 6] = [
    DeadReason::Terminal,
    DeadReason::RetriesExhausted,
    DeadReason::SinkError,
    DeadReason::Expired,
    DeadReason::Poisoned,
    DeadReason::RetiredVersion,
];

/// The relay's counters.
pub(crate) struct RelayMetrics {
    pub(crate) fetched: Counter,
    pub(crate) read: Counter,
    pub(crate) deleted: Counter,
    dead: Vec<(DeadReason, Counter)>,
    pub(crate) unknown_version: Counter,
    lag: Gauge,
    oldest_transaction: Gauge,
    pub(crate) listening: Gauge,
}

impl RelayMetrics {
    /// Registers the counters of the outbox `name`, every reason's at zero.
    pub(crate) fn register(name: &str) -> Self {
        let label = name.to_owned();
        let counter = |metric: &'static str| metrics::counter!(metric, "outbox" => label.clone());
        let gauge = |metric: &'static str| metrics::gauge!(metric, "outbox" => label.clone());
        RelayMetrics {
            fetched: counter("outbox_table_rows_fetched_total"),
            read: counter("outbox_table_rows_read_total"),
            deleted: counter("outbox_table_rows_deleted_total"),
            unknown_version: counter("outbox_table_unknown_version_total"),
            lag: gauge("outbox_table_lag_seconds"),
            oldest_transaction: gauge("outbox_table_oldest_transaction_seconds"),
            listening: gauge("outbox_table_listening"),
            dead: REASONS
                .iter()
                .map(|&r| {
                    let c = metrics::counter!("outbox_table_rows_dead_lettered_total",
                        "outbox" => label.clone(), "reason" => r.as_str());
                    (r, c)
                })
                .collect(),
        }
    }

    /// Sets the horizon's gauges from a read.
    pub(crate) fn horizon(&self, h: &Horizon) {
        let secs = |d: Option<std::time::Duration>| d.map_or(0.0, |d| d.as_secs_f64());
        self.lag.set(secs(h.lag));
        self.oldest_transaction.set(secs(h.oldest_transaction));
    }

    /// Counts what a removal did.
    pub(crate) fn removed(&self, removal: &Removal, removed: &Removed) {
        self.deleted.increment(removed.deleted.len() as u64);
        for row in removal.dead.iter().filter(|r| removed.dead.contains(&r.id)) {
            if let Some((_, c)) = self.dead.iter().find(|(r, _)| *r == row.reason) {
                c.increment(1);
            }
        }
    }
}
