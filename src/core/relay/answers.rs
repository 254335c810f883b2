//! The store's answers to removals and records.

use super::types::{Fenced, OpId, RelayEvent, Removed, StoreError, StoreOp};
use super::Relay;
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
                let Some(rows) = self.ops.removal_answered(op) else {
                    return;
                };
                for partition in &removed.stale {
                    self.stale(now, *partition);
                }
                for id in rows.keys() {
                    self.forget_key(*id);
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

    /// The answer to the attempt record `op`: the write may start
    /// ([`RelayEvent::AttemptRecorded`]), or its partition is stale.
    pub fn handle_attempt_recorded(
        &mut self,
        now: Time,
        op: OpId,
        recorded: Result<Fenced<()>, StoreError>,
    ) {
        match recorded {
            Ok(answer) => {
                let Some(StoreOp::RecordAttempt { record, .. }) = self.ops.record_answered(op)
                else {
                    return;
                };
                match answer {
                    Fenced::Done(()) => {
                        if let Some(&first_id) = record.ids.first() {
                            self.events
                                .push_back(RelayEvent::AttemptRecorded { first_id });
                        }
                    }
                    Fenced::Stale => self.stale(now, record.partition),
                }
            }
            Err(e) => {
                self.events
                    .push_back(RelayEvent::StoreFailed { kind: e.kind() });
                self.ops.record_failed(now, op);
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
