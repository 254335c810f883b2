//! The relay's metrics (S-T36), each with the label `outbox`:
//!
//! | name | kind | meaning |
//! | --- | --- | --- |
//! | `outbox_table_rows_fetched_total` | counter | rows page reads returned (some are read again after a hand-over) |
//! | `outbox_table_rows_read_total` | counter | rows delivered towards the engine |
//! | `outbox_table_rows_deleted_total` | counter | rows deleted after their write |
//! | `outbox_table_rows_dead_lettered_total{reason}` | counter | rows moved to the dead-letter table, by reason |
//! | `outbox_table_unknown_version_total` | counter | rows met with a codec version this instance does not know (left in the table, S-T19) |

use metrics::Counter;

use crate::core::relay::{DeadReason, Removal, Removed};

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
}

impl RelayMetrics {
    /// Registers the counters of the outbox `name`, every reason's at zero.
    pub(crate) fn register(name: &str) -> Self {
        let label = name.to_owned();
        let counter = |metric: &'static str| metrics::counter!(metric, "outbox" => label.clone());
        RelayMetrics {
            fetched: counter("outbox_table_rows_fetched_total"),
            read: counter("outbox_table_rows_read_total"),
            deleted: counter("outbox_table_rows_deleted_total"),
            unknown_version: counter("outbox_table_unknown_version_total"),
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
