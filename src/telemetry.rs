//! Metrics and logs of an outbox (S-W11, S-A6, I3).
//!
//! Every metric goes through the [`metrics`] facade and carries the label
//! `outbox` = [`Sink::name`](crate::Sink::name):
//!
//! | name | kind | meaning |
//! | --- | --- | --- |
//! | `outbox_pending` | gauge | items accepted and not yet written, lost or dropped; equals [`Outbox::pending`](crate::Outbox::pending) whenever the writer is at rest |
//! | `outbox_items_written_total` | counter | items written by successful writes |
//! | `outbox_writes_total` | counter | successful writes (batches) |
//! | `outbox_write_failures_total` | counter | failed attempts: sink errors, panics, timeouts, terminal rejections, cancellations |
//! | `outbox_events_lost_total{reason}` | counter | items lost, by [`LostReason`] |
//! | `outbox_items_dropped_total{reason}` | counter | items dropped, by [`DropReason`] |
//! | `outbox_write_latency_seconds` | histogram | seconds from an attempt's start to its outcome, one sample per attempt that came back (success or failure) |
//! | `outbox_items_recovered_total` | counter | items a journal recovery found pending at build (D4): staged again, or lost under `journal_unreadable` |
//!
//! With a journal (feature `journal`), also: `outbox_journal_bytes`
//! (gauge, bytes in its segment files), `outbox_journal_segments` (gauge),
//! `outbox_journal_sync_seconds` (histogram, one sample per group commit:
//! write, then `fdatasync`), `outbox_items_unjournaled_total` (counter,
//! items accepted while the journal was failing, held in memory only) and
//! `outbox_journal_faults_total` (counter, failed group commits).
//!
//! Counters are exported as the differences between successive snapshots
//! of the engine's [`Counters`], so they equal the engine's counters
//! exactly (I3) however events are batched. The handles are registered
//! when the outbox is built, with the recorder installed then (global, or
//! local to the building thread); every reason's series exists from the
//! start, at zero.
//!
//! Logs go through [`tracing`] with the fields `outbox`, `tenant`, `items`,
//! `attempt`, `backoff_ms`, `reason`: successful writes at `DEBUG`, failed
//! attempts at `WARN`, drops and losses at `WARN`/`ERROR` but only when the
//! engine's rate limit says so (S-A6: the first, then every 1,000th per
//! reason), shutdown reports at `INFO`.

use metrics::{Counter, Gauge, Histogram};

use crate::core::{Counters, DropReason, Event, LostReason, Next};
use crate::TenantId;

/// The metric names (S-W11).
pub mod names {
    /// Gauge: items pending.
    pub const PENDING: &str = "outbox_pending";
    /// Counter: items written.
    pub const ITEMS_WRITTEN: &str = "outbox_items_written_total";
    /// Counter: successful writes.
    pub const WRITES: &str = "outbox_writes_total";
    /// Counter: failed attempts.
    pub const WRITE_FAILURES: &str = "outbox_write_failures_total";
    /// Counter: items lost, label `reason`.
    pub const EVENTS_LOST: &str = "outbox_events_lost_total";
    /// Counter: items dropped, label `reason`.
    pub const ITEMS_DROPPED: &str = "outbox_items_dropped_total";
    /// Histogram: write latency in seconds.
    pub const WRITE_LATENCY: &str = "outbox_write_latency_seconds";
    /// Counter: items a journal recovery found pending (D4).
    pub const ITEMS_RECOVERED: &str = "outbox_items_recovered_total";
    /// The label naming the outbox (its sink's name).
    pub const LABEL_OUTBOX: &str = "outbox";
    /// The label naming a loss or drop reason.
    pub const LABEL_REASON: &str = "reason";
}

/// The metric handles of one outbox: the counters and the pending gauge,
/// exported under the engine's lock after every input, so they equal the
/// engine's counters after every step (I3).
pub(crate) struct Export {
    pending: Gauge,
    written: Counter,
    writes: Counter,
    failures: Counter,
    recovered: Counter,
    lost: [Counter; LostReason::ALL.len()],
    dropped: [Counter; DropReason::ALL.len()],
    /// The counters last exported.
    last: Counters,
}

/// What the writer logs, and the latency histogram.
pub(crate) struct Log {
    name: String,
    latency: Histogram,
}

/// Registers every series of the outbox named `name` with the current
/// recorder.
pub(crate) fn register(name: &str) -> (Export, Log) {
    use names::*;
    let label = name.to_owned();
    let lost = LostReason::ALL.map(|r| {
        metrics::counter!(EVENTS_LOST, LABEL_OUTBOX => label.clone(), LABEL_REASON => r.as_str())
    });
    let dropped = DropReason::ALL.map(|r| {
        metrics::counter!(ITEMS_DROPPED, LABEL_OUTBOX => label.clone(), LABEL_REASON => r.as_str())
    });
    let pending = metrics::gauge!(PENDING, LABEL_OUTBOX => label.clone());
    pending.set(0.0);
    let export = Export {
        pending,
        written: metrics::counter!(ITEMS_WRITTEN, LABEL_OUTBOX => label.clone()),
        writes: metrics::counter!(WRITES, LABEL_OUTBOX => label.clone()),
        failures: metrics::counter!(WRITE_FAILURES, LABEL_OUTBOX => label.clone()),
        recovered: metrics::counter!(ITEMS_RECOVERED, LABEL_OUTBOX => label.clone()),
        lost,
        dropped,
        last: Counters::default(),
    };
    let log = Log {
        latency: metrics::histogram!(WRITE_LATENCY, LABEL_OUTBOX => label),
        name: name.to_owned(),
    };
    (export, log)
}

fn add(counter: &Counter, before: u64, after: u64) {
    if after > before {
        counter.increment(after - before);
    }
}

impl Export {
    /// Exports the growth of every counter since the last call, and the
    /// pending gauge (S-W11, S-W14, I3). Cheap when little changed: one
    /// comparison per series, one gauge store.
    pub(crate) fn export(&mut self, now: &Counters) {
        let last = &self.last;
        add(&self.written, last.written, now.written);
        add(&self.writes, last.writes, now.writes);
        add(&self.failures, last.failed_attempts, now.failed_attempts);
        add(&self.recovered, last.recovered, now.recovered);
        for (i, c) in self.lost.iter().enumerate() {
            add(c, last.lost[i], now.lost[i]);
        }
        for (i, c) in self.dropped.iter().enumerate() {
            add(c, last.dropped[i], now.dropped[i]);
        }
        if now.pending != last.pending {
            // Exact for every count below 2^53 items.
            self.pending.set(now.pending as f64);
        }
        self.last.clone_from(now);
    }
}

impl Log {
    /// The outbox's name (its sink's).
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Logs one engine event and records write latency. `error` is the
    /// sink's error text for an [`Event::AttemptFailed`], when the writer
    /// has it.
    pub(crate) fn event<I>(&self, event: &Event<TenantId, I>, error: Option<&str>) {
        let outbox = self.name();
        match event {
            Event::Written {
                id,
                tenant,
                items,
                attempt,
                latency,
            } => {
                self.latency.record(latency.as_secs_f64());
                tracing::debug!(outbox, %tenant, write = %id, items, attempt, latency_ms = latency.as_secs_f64() * 1e3, "write committed");
            }
            Event::AttemptFailed {
                id,
                tenant,
                items,
                attempt,
                failure,
                next,
                latency,
            } => {
                self.latency.record(latency.as_secs_f64());
                let reason = failure.as_str();
                let error = error.unwrap_or("");
                match next {
                    Next::RetryIn(backoff) => tracing::warn!(
                        outbox, %tenant, write = %id, items, attempt, reason,
                        backoff_ms = backoff.as_secs_f64() * 1e3, error,
                        "write attempt failed; retrying the same items after the backoff"
                    ),
                    Next::Dropped => tracing::warn!(
                        outbox, %tenant, write = %id, items, attempt, reason, error,
                        "write attempt failed; items dropped (error policy `drop`)"
                    ),
                    Next::Lost => tracing::warn!(
                        outbox, %tenant, write = %id, items, attempt, reason, error,
                        "write attempt failed; items lost"
                    ),
                }
            }
            Event::Dropped {
                tenant,
                items,
                reason,
                log,
            } => {
                if *log {
                    tracing::warn!(outbox, %tenant, items, reason = reason.as_str(),
                        "items dropped (logged for the first, then every 1000th per reason)");
                }
            }
            Event::Lost {
                tenant,
                items,
                reason,
                log,
            } => {
                if *log {
                    tracing::error!(outbox, %tenant, items, reason = reason.as_str(),
                        "items lost (logged for the first, then every 1000th per reason)");
                }
            }
            Event::CancelInFlight => {
                tracing::debug!(outbox, "cancelling the writes in flight");
            }
            Event::WaitDone { id, report } => {
                tracing::debug!(
                    outbox,
                    wait = id.0,
                    written = report.written,
                    dropped = report.dropped,
                    lost = report.lost,
                    pending = report.pending,
                    deadline_passed = report.deadline_passed,
                    "flush or settle answered"
                );
            }
            Event::ShutdownDone { report, .. } => {
                if report.first {
                    let r = &report.report;
                    tracing::info!(
                        outbox,
                        written = r.written,
                        dropped = r.dropped,
                        lost = r.lost,
                        deadline_passed = r.deadline_passed,
                        "outbox shut down"
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    #[test]
    fn counters_are_exported_as_exact_differences() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::with_local_recorder(&recorder, || {
            let (mut t, _) = register("db");
            let mut c = Counters {
                staged: 5,
                pending: 2,
                written: 3,
                writes: 1,
                ..Counters::default()
            };
            t.export(&c);
            c.written = 4;
            c.pending = 0;
            c.lost[LostReason::Terminal as usize] = 1;
            c.failed_attempts = 2;
            c.recovered = 3;
            t.export(&c);
            t.export(&c);
        });
        let mut seen = 0;
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            let key = key.key();
            let labels: Vec<_> = key.labels().map(|l| (l.key(), l.value())).collect();
            assert!(labels.contains(&("outbox", "db")));
            let reason = labels.iter().find(|l| l.0 == "reason").map(|l| l.1);
            let expected = match (key.name(), reason) {
                ("outbox_items_written_total", None) => DebugValue::Counter(4),
                ("outbox_writes_total", None) => DebugValue::Counter(1),
                ("outbox_write_failures_total", None) => DebugValue::Counter(2),
                ("outbox_items_recovered_total", None) => DebugValue::Counter(3),
                ("outbox_events_lost_total", Some("terminal")) => DebugValue::Counter(1),
                ("outbox_events_lost_total", Some(_)) => DebugValue::Counter(0),
                ("outbox_items_dropped_total", Some(_)) => DebugValue::Counter(0),
                ("outbox_pending", None) => DebugValue::Gauge(0.0.into()),
                ("outbox_write_latency_seconds", None) => continue,
                other => panic!("unexpected series {other:?}"),
            };
            assert_eq!(value, expected, "{}", key.name());
            seen += 1;
        }
        assert_eq!(
            seen,
            5 + LostReason::ALL.len() + DropReason::ALL.len(),
            "every series but the histogram"
        );
    }
}
