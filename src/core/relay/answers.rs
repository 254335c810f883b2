//! The store's answers to removals and records.

use super::types::{Fenced, OpId, Recorded, RelayEvent, Removed, StoreError, StoreOp};
use super::{Quarantine, Relay};
use crate::core::time::Time;

impl Relay {
    /// The answer to the removal `op`. On success its rows are forgotten
    /// (room for reading again) and partitions the store found stale are
    /// dropped ([`RelayEvent::PartitionStale`]); on failure the same
    /// removal goes again after a backoff, and nothing newer goes before
    /// it (S-T12).
    pub fn handle_removed(&mut self, now: Time, op: OpId, removed: Result<Removed, StoreError>) {
        match removed {
            Ok(removed) => {
                let Some((rows, records)) = self.ops.removal_answered(op) else {
                    return;
                };
                for partition in &removed.stale {
                    self.stale(now, *partition);
                }
                for id in rows.keys() {
                    self.forget_key(*id);
                }
                // Dropped, or (a stale partition) forgotten already.
                self.records.dropped(&records);
                // A suspect's retry waiting for its old record's drop.
                self.send_retry_record();
                // A suspect waits for every record to go (S-T18).
                if matches!(self.quarantine, Quarantine::Draining(_)) {
                    self.reads.wanted = true;
                }
                self.events.push_back(RelayEvent::Removed {
                    deleted: removed.deleted.len() as u64,
                    dead: removed.dead.len() as u64,
                });
                // Room freed: a page left short for want of it reads again.
                if self.reads.more || !self.tenants.saturated.is_empty() {
                    self.reads.wanted = true;
                }
            }
            Err(e) => {
                self.events
                    .push_back(RelayEvent::StoreFailed { kind: e.kind() });
                self.ops.removal_failed(now, op);
            }
        }
    }

    /// The answer to the crash record `op` of a partition just gained: it
    /// may now be read (or, stale, it is dropped).
    pub fn handle_crashes_recorded(
        &mut self,
        now: Time,
        op: OpId,
        recorded: Result<Fenced<u64>, StoreError>,
    ) {
        match recorded {
            Ok(answer) => {
                let Some(StoreOp::RecordCrashes {
                    partition, fence, ..
                }) = self.ops.record_answered(op)
                else {
                    return;
                };
                let current = self.partitions.get(&partition).map(|p| p.epoch);
                if fence.epochs.first().map(|e| e.1) != current {
                    return;
                }
                match answer {
                    Fenced::Done(_) => {
                        if let Some(p) = self.partitions.get_mut(&partition) {
                            p.ready = true;
                        }
                        self.reads.wanted = true;
                    }
                    Fenced::Stale => self.stale(now, partition),
                }
            }
            Err(e) => {
                self.events
                    .push_back(RelayEvent::StoreFailed { kind: e.kind() });
                self.ops.record_failed(now, op);
            }
        }
    }

    /// The answer to the attempt record `op`: the page's rows of partitions
    /// still held go to the engine ([`poll_delivery`](Self::poll_delivery),
    /// after any earlier page's still waiting); a stale partition is
    /// dropped. A failure sends the same records again after a backoff.
    pub fn handle_attempt_recorded(
        &mut self,
        now: Time,
        op: OpId,
        recorded: Result<Recorded, StoreError>,
    ) {
        match recorded {
            Ok(answer) => {
                let Some(StoreOp::RecordAttempts { fence, .. }) = self.ops.record_answered(op)
                else {
                    return;
                };
                for (partition, epoch) in &fence.epochs {
                    let current = self.partitions.get(partition).map(|p| p.epoch);
                    if answer.stale.contains(partition) && current == Some(*epoch) {
                        self.stale(now, *partition);
                    }
                }
                let rows = self.records.answered(op);
                self.release(rows);
                self.retry_recorded(op);
            }
            Err(e) => {
                self.events
                    .push_back(RelayEvent::StoreFailed { kind: e.kind() });
                if let Some(fresh) = self.ops.record_failed(now, op) {
                    self.records.renamed(op, fresh);
                    self.retry_renamed(op, fresh);
                }
            }
        }
    }

    fn stale(&mut self, now: Time, partition: u32) {
        if self.partitions.contains_key(&partition) {
            self.handle_partition_lost(now, partition);
            self.events
                .push_back(RelayEvent::PartitionStale { partition });
        }
    }
}
