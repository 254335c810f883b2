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
//! | `outbox_attempts_total` | counter | attempts started, first tries and retries (S-W18) |
//! | `outbox_write_failures_total{kind}` | counter | failed attempts, by [`Failure`] kind: `error`, `panic`, `timeout`, `rejected` (terminal), `cancelled` (at a shutdown deadline or by an abandon), `task_lost`, `stale_epoch` (a sink refused the write for a newer epoch, S-E7) |
//! | `outbox_events_lost_total{reason}` | counter | items lost, by [`LostReason`] |
//! | `outbox_items_dropped_total{reason}` | counter | items dropped, by [`DropReason`] |
//! | `outbox_breaker_open` | gauge | 1 while the sink-wide breaker is open or probing, else 0 (S-R1) |
//! | `outbox_consecutive_failures` | gauge | failed attempts in a row across tenants (S-R1) |
//! | `outbox_writes_in_flight` | gauge | writes in flight |
//! | `outbox_tenants` | gauge | tenants holding items or a write in flight |
//! | `outbox_oldest_pending_seconds` | gauge | age of the oldest pending item (S-R6; refreshed at most once a second, and by [`Outbox::health`](crate::Outbox::health)) |
//! | `outbox_dead_letters_dropped` | gauge | run-time dead letters that could not be handed out (S-R4) |
//! | `outbox_item_age_seconds{outcome}` | histogram | seconds from an item's staging to when it left the engine, one sample per pending item as it settles (S-R7): `outcome` is `written`, `handed_over`, or the reason it was lost or dropped under; recorded only with a `max_item_age` set (items are stamped then, S-R3), exact then, a durable item's age at recovery or relay included |
//! | `outbox_write_latency_seconds` | histogram | seconds from an attempt's start to its end, one sample per ended attempt whatever its outcome: written, failed by any kind, given up at a deadline or by an abandon, or its task lost (then up to when the loss was seen) |
//!
//! S-W18: every attempt ends in exactly one counted outcome, so whenever
//! no write is in flight, `outbox_attempts_total` equals
//! `outbox_writes_total` plus the sum over `kind` of
//! `outbox_write_failures_total`, which is also the latency histogram's
//! sample count. A write the engine had given
//! up that commits anyway counts in `outbox_writes_total` while its items
//! stay counted lost.
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
//! Logs go through [`tracing`] with the fields `outbox`, `tenant` (the
//! key's `Debug`), `items`,
//! `attempt`, `backoff_ms`, `reason`: successful writes at `DEBUG`, failed
//! attempts at `WARN`, drops and losses at `WARN`/`ERROR` but only when the
//! engine's rate limit says so (S-A6: the first, then every 1,000th per
//! reason), shutdown reports at `INFO`. Each attempt runs in a span
//! `outbox.attempt` with the fields `outbox`, `tenant`, `write` and
//! `attempt` (S-R6).

use std::fmt::Debug;
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram};

use crate::core::{
    AfterFailure, Counters, DropReason, Event, Failure, ItemAge, ItemOutcome, LostReason, Report,
    ShutdownReport, WaitId, WriteId,
};

/// The metric names (S-W11).
pub mod names {
    /// Gauge: items pending.
    pub const PENDING: &str = "outbox_pending";
    /// Counter: items written.
    pub const ITEMS_WRITTEN: &str = "outbox_items_written_total";
    /// Counter: successful writes.
    pub const WRITES: &str = "outbox_writes_total";
    /// Counter: attempts started (S-W18).
    pub const ATTEMPTS: &str = "outbox_attempts_total";
    /// Counter: failed attempts, label `kind`.
    pub const WRITE_FAILURES: &str = "outbox_write_failures_total";
    /// Counter: items lost, label `reason`.
    pub const EVENTS_LOST: &str = "outbox_events_lost_total";
    /// Counter: items dropped, label `reason`.
    pub const ITEMS_DROPPED: &str = "outbox_items_dropped_total";
    /// Histogram: write latency in seconds.
    pub const WRITE_LATENCY: &str = "outbox_write_latency_seconds";
    /// Histogram: an item's age in seconds as it settled, label
    /// `outcome` (S-R7).
    pub const ITEM_AGE: &str = "outbox_item_age_seconds";
    /// The label naming how an item left the engine (S-R7).
    pub const LABEL_OUTCOME: &str = "outcome";
    /// Counter: items a journal recovery found pending (D4).
    pub const ITEMS_RECOVERED: &str = "outbox_items_recovered_total";
    /// Counter: items handed over to another instance after a write came
    /// back under a stale epoch (S-E7).
    pub const ITEMS_HANDED_OVER: &str = "outbox_items_handed_over_total";
    /// Gauge: 1 while the breaker is open or probing, else 0 (S-R1).
    pub const BREAKER_OPEN: &str = "outbox_breaker_open";
    /// Gauge: failed attempts in a row across tenants (S-R1).
    pub const CONSECUTIVE_FAILURES: &str = "outbox_consecutive_failures";
    /// Gauge: writes in flight.
    pub const WRITES_IN_FLIGHT: &str = "outbox_writes_in_flight";
    /// Gauge: tenants held.
    pub const TENANTS: &str = "outbox_tenants";
    /// Gauge: seconds since the oldest pending item was staged (S-R6).
    pub const OLDEST_PENDING: &str = "outbox_oldest_pending_seconds";
    /// Gauge: run-time dead letters that could not be handed out (S-R4).
    pub const DEAD_LETTERS_DROPPED: &str = "outbox_dead_letters_dropped";
    /// The label naming the outbox (its sink's name).
    pub const LABEL_OUTBOX: &str = "outbox";
    /// The label naming a loss or drop reason.
    pub const LABEL_REASON: &str = "reason";
    /// The label naming a failed attempt's kind (S-W18).
    pub const LABEL_KIND: &str = "kind";
}

/// The metric handles of one outbox: the counters and the pending gauge,
/// exported under the engine's lock after every input, so they equal the
/// engine's counters after every step (I3).
pub(crate) struct Export {
    pending: Gauge,
    written: Counter,
    writes: Counter,
    attempts: Counter,
    failures: [Counter; Failure::ALL.len()],
    recovered: Counter,
    handed_over: Counter,
    lost: [Counter; LostReason::ALL.len()],
    dropped: [Counter; DropReason::ALL.len()],
    /// Per [`ItemOutcome`], in its index's order (S-R7).
    ages: Vec<Histogram>,
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
        attempts: metrics::counter!(ATTEMPTS, LABEL_OUTBOX => label.clone()),
        failures: Failure::ALL.map(|k| {
            metrics::counter!(WRITE_FAILURES, LABEL_OUTBOX => label.clone(), LABEL_KIND => k.as_str())
        }),
        recovered: metrics::counter!(ITEMS_RECOVERED, LABEL_OUTBOX => label.clone()),
        handed_over: metrics::counter!(ITEMS_HANDED_OVER, LABEL_OUTBOX => label.clone()),
        lost,
        dropped,
        ages: ItemOutcome::all()
            .map(|o| {
                metrics::histogram!(ITEM_AGE, LABEL_OUTBOX => label.clone(), LABEL_OUTCOME => o.as_str())
            })
            .collect(),
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
        add(&self.attempts, last.attempts, now.attempts);
        for (i, c) in self.failures.iter().enumerate() {
            add(c, last.failed[i], now.failed[i]);
        }
        add(&self.recovered, last.recovered, now.recovered);
        add(&self.handed_over, last.handed_over, now.handed_over);
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

    /// Records the ages of the items settled since the last call (S-R7).
    pub(crate) fn ages(&self, ages: impl Iterator<Item = ItemAge>) {
        for a in ages {
            if let Some(h) = self.ages.get(a.outcome.index()) {
                h.record(a.age.as_secs_f64());
            }
        }
    }
}

impl Log {
    /// The outbox's name (its sink's).
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Logs one engine event and records write latency: every ended
    /// attempt, written or failed, is one latency sample (S-W18). `error`
    /// is the sink's error text for an [`Event::AttemptFailed`], when the
    /// writer has it.
    pub(crate) fn event<K: Debug, I>(&self, event: &Event<K, I>, error: Option<&str>) {
        let outbox = self.name();
        match event {
            Event::Written {
                id,
                tenant,
                items,
                attempt,
                latency,
                given_up,
            } => {
                self.latency.record(latency.as_secs_f64());
                let write = WriteLog::new(outbox, *id, tenant, *items, *attempt);
                write.written(*latency, *given_up);
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
                let write = WriteLog::new(outbox, *id, tenant, *items, *attempt);
                write.failed(*failure, *next, error.unwrap_or(""));
            }
            Event::Dropped {
                tenant,
                items,
                reason,
                log: true,
            } => tracing::warn!(
                outbox,
                ?tenant,
                items,
                reason = reason.as_str(),
                "items dropped (logged for the first, then every 1000th per reason)"
            ),
            Event::Lost {
                tenant,
                items,
                reason,
                log: true,
            } => tracing::error!(
                outbox,
                ?tenant,
                items,
                reason = reason.as_str(),
                "items lost (logged for the first, then every 1000th per reason)"
            ),
            // Counted; logged only now and then (S-A6).
            Event::Dropped { .. } | Event::Lost { .. } => {}
            Event::DeadLetter(dl) => {
                tracing::debug!(
                    outbox,
                    tenant = ?dl.tenant,
                    items = dl.items.len(),
                    reason = dl.reason.as_str(),
                    "dead letter handed out"
                );
            }
            Event::CancelInFlight => {
                tracing::debug!(outbox, "cancelling the writes in flight");
            }
            // Counted with the event that settled the item.
            Event::KeyDone { .. } => {}
            Event::HandedOver { tenant, items } => {
                tracing::debug!(outbox, ?tenant, items, "items handed over (stale epoch)");
            }
            Event::WaitDone { id, report } => answered(outbox, *id, report),
            Event::ShutdownDone { report, .. } => shut_down(outbox, report),
        }
    }
}

/// A flush or settle was answered.
fn answered(outbox: &str, id: WaitId, report: &Report) {
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

/// A shutdown was answered. Joined shutdowns report zeros: only the first
/// is news.
fn shut_down<K, I>(outbox: &str, report: &ShutdownReport<K, I>) {
    if report.first {
        tracing::info!(
            outbox,
            written = report.written,
            dropped = report.dropped,
            lost = report.lost,
            deadline_passed = report.deadline_passed,
            "outbox shut down"
        );
    }
}

/// The fields every log line about one write attempt carries.
struct WriteLog<'a, K> {
    outbox: &'a str,
    id: WriteId,
    tenant: &'a K,
    items: u64,
    attempt: u32,
}

impl<'a, K: Debug> WriteLog<'a, K> {
    fn new(outbox: &'a str, id: WriteId, tenant: &'a K, items: u64, attempt: u32) -> Self {
        WriteLog {
            outbox,
            id,
            tenant,
            items,
            attempt,
        }
    }

    /// The attempt committed; `given_up`: after the engine gave it up.
    fn written(&self, latency: Duration, given_up: bool) {
        let (outbox, tenant, items, attempt) = (self.outbox, self.tenant, self.items, self.attempt);
        let write = self.id;
        if given_up {
            tracing::warn!(outbox, ?tenant, %write, items, attempt,
                "a write given up at the shutdown deadline or by an abandon committed \
                 after all; its items stay counted lost and are not handed back");
            return;
        }
        tracing::debug!(outbox, ?tenant, %write, items, attempt, latency_ms = latency.as_secs_f64() * 1e3, "write committed");
    }

    /// The attempt failed with `failure`; `next` says what became of its
    /// items.
    fn failed(&self, failure: Failure, next: AfterFailure, error: &str) {
        let (outbox, tenant, items, attempt) = (self.outbox, self.tenant, self.items, self.attempt);
        let write = self.id;
        let reason = failure.as_str();
        match next {
            AfterFailure::RetryIn(backoff) => tracing::warn!(
                outbox, ?tenant, %write, items, attempt, reason,
                backoff_ms = backoff.as_secs_f64() * 1e3, error,
                "write attempt failed; retrying the same items after the backoff"
            ),
            AfterFailure::Dropped => tracing::warn!(
                outbox, ?tenant, %write, items, attempt, reason, error,
                "write attempt failed; items dropped (error policy `drop`)"
            ),
            AfterFailure::Lost => tracing::warn!(
                outbox, ?tenant, %write, items, attempt, reason, error,
                "write attempt failed; items lost"
            ),
            AfterFailure::GivenUp => tracing::debug!(
                outbox, ?tenant, %write, items, attempt, reason, error,
                "a write given up (already counted lost) ended"
            ),
            AfterFailure::HandedOver => tracing::info!(
                outbox, ?tenant, %write, items, attempt, reason, error,
                "write refused under a stale epoch; its tenant is handed over to the partition's new owner"
            ),
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
            c.attempts = 4;
            c.add_failed(Failure::Cancelled);
            c.add_failed(Failure::Cancelled);
            c.add_failed(Failure::TaskLost);
            c.recovered = 3;
            c.handed_over = 2;
            t.export(&c);
            t.export(&c);
        });
        let (mut seen, mut ages) = (0, 0);
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            let key = key.key();
            let labels: Vec<_> = key.labels().map(|l| (l.key(), l.value())).collect();
            assert!(labels.contains(&("outbox", "db")));
            let reason = labels
                .iter()
                .find(|l| l.0 == "reason" || l.0 == "kind")
                .map(|l| l.1);
            let expected = match (key.name(), reason) {
                ("outbox_items_written_total", None) => DebugValue::Counter(4),
                ("outbox_writes_total", None) => DebugValue::Counter(1),
                ("outbox_attempts_total", None) => DebugValue::Counter(4),
                ("outbox_write_failures_total", Some("cancelled")) => DebugValue::Counter(2),
                ("outbox_write_failures_total", Some("task_lost")) => DebugValue::Counter(1),
                ("outbox_write_failures_total", Some(_)) => DebugValue::Counter(0),
                ("outbox_items_recovered_total", None) => DebugValue::Counter(3),
                ("outbox_items_handed_over_total", None) => DebugValue::Counter(2),
                ("outbox_events_lost_total", Some("terminal")) => DebugValue::Counter(1),
                ("outbox_events_lost_total", Some(_)) => DebugValue::Counter(0),
                ("outbox_items_dropped_total", Some(_)) => DebugValue::Counter(0),
                ("outbox_pending", None) => DebugValue::Gauge(0.0.into()),
                ("outbox_write_latency_seconds", None) => continue,
                // One series per outcome, no sample (nothing exported one).
                ("outbox_item_age_seconds", None) => {
                    assert_eq!(value, DebugValue::Histogram(Vec::new()));
                    ages += 1;
                    continue;
                }
                other => panic!("unexpected series {other:?}"),
            };
            assert_eq!(value, expected, "{}", key.name());
            seen += 1;
        }
        assert_eq!(
            seen,
            6 + Failure::ALL.len() + LostReason::ALL.len() + DropReason::ALL.len(),
            "every series but the histograms"
        );
        assert_eq!(
            ages,
            crate::core::ItemOutcome::COUNT,
            "an age series per outcome"
        );
    }
}
