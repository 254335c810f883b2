//! A suspect of a crash that keeps failing holds no one back (S-T18,
//! S-W8): once its attempt came back to be retried, its in-flight record
//! is dropped (a crash while it waits is not its own), the relay reads
//! and delivers the other tenants' rows again, and before its retry
//! reaches the sink its record is written again, alone (a crash during
//! the retry counts against it). Its tenant's later rows, and any other
//! suspect met meanwhile (with its tenant's later rows), wait in the table
//! until it ends, then catch up in order.

use super::tenants::Why;
use super::types::{InFlight, OpId, RelayEvent};
use super::{Quarantine, Relay};
use crate::core::time::Time;

impl Relay {
    /// The suspect `id`, delivered alone, came back from an attempt and
    /// waits for its retry (the engine's backoff): its in-flight record
    /// goes with the next removal, and reads start again for everyone but
    /// its tenant (S-T18). Ignored unless `id` is the suspect alone.
    pub fn handle_suspect_back(&mut self, _now: Time, id: i64) {
        if self.quarantine != Quarantine::Alone(id) {
            return;
        }
        let Some(key) = self.keys.get(&id).filter(|k| k.open) else {
            return;
        };
        let tenant = key.tenant.clone();
        let partition = key.partition;
        // A retry's record still being written is dropped after it: the
        // drop could overtake the write. Meanwhile the record is live,
        // so a crash counts the suspect: the safe side.
        if self.retry.is_none_or(|(_, r)| r != id) {
            self.leave_record(id);
        }
        self.quarantine = Quarantine::Waiting(id);
        self.tenants.entry(&tenant, partition);
        self.tenants.hold(&tenant, Why::Deferred);
        self.reads.wanted = true;
    }

    /// The suspect `id`'s retry is about to start: its in-flight record is
    /// written, alone, and reads stop until it comes back (S-T18). Answered
    /// by [`RelayEvent::SuspectRetry`]; the retry reaches the sink only
    /// once that says `recorded`.
    pub fn handle_suspect_retry(&mut self, _now: Time, id: i64) {
        let waiting = self.quarantine == Quarantine::Waiting(id)
            && self.keys.get(&id).is_some_and(|k| k.open);
        if !waiting {
            self.events.push_back(RelayEvent::SuspectRetry {
                id,
                recorded: false,
            });
            return;
        }
        self.quarantine = Quarantine::Alone(id);
        // A record call still out (an earlier retry that gave up waiting
        // for it) answers this retry too: the same record.
        if !self.retry.is_some_and(|(op, r)| r == id && op.is_some()) {
            self.retry = Some((None, id));
            self.send_retry_record();
        }
    }

    /// Sends the waiting retry's record once no drop of an earlier record
    /// of the suspect is pending (sent after one, the drop could delete
    /// it).
    pub(super) fn send_retry_record(&mut self) {
        let Some((None, id)) = self.retry else {
            return;
        };
        if self.records.dropping(id) {
            return;
        }
        let Some(key) = self.keys.get_mut(&id) else {
            return;
        };
        let partition = key.partition;
        // Its record may still be live (never dropped): written again.
        if key.record.is_none() {
            key.record = Some(id);
            self.records.open_alone(partition, id);
        }
        let op = self.ops.id();
        let fence = self.fence_for([partition]);
        let records = vec![InFlight {
            partition,
            ids: vec![id],
        }];
        self.ops.record_attempts(op, fence, records);
        self.retry = Some((Some(op), id));
    }

    /// The record call `op` was answered durable: a suspect's retry may
    /// go if it was its record.
    pub(super) fn retry_recorded(&mut self, op: OpId) {
        if let Some((Some(sent), id)) = self.retry {
            if sent == op {
                self.retry = None;
                self.events
                    .push_back(RelayEvent::SuspectRetry { id, recorded: true });
            }
        }
    }

    /// The record call `op` goes again as `fresh`.
    pub(super) fn retry_renamed(&mut self, op: OpId, fresh: OpId) {
        if let Some((Some(sent), _)) = &mut self.retry {
            if *sent == op {
                *sent = fresh;
            }
        }
    }

    /// The row `id` ended or is no longer this relay's: if it was the
    /// suspect, the quarantine is lifted, a retry waiting for its record
    /// is refused, and the tenants deferred behind it catch up (S-T18).
    pub(super) fn suspect_gone(&mut self, id: i64) {
        if !matches!(self.quarantine, Quarantine::Alone(s) | Quarantine::Waiting(s) if s == id) {
            return;
        }
        self.quarantine = Quarantine::Off;
        if self.retry.is_some_and(|(_, r)| r == id) {
            self.retry = None;
            self.events.push_back(RelayEvent::SuspectRetry {
                id,
                recorded: false,
            });
        }
        self.tenants.undefer();
        self.reads.wanted = true;
    }
}
