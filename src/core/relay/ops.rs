//! The relay's store calls other than reads: the removal (one in flight at
//! a time, so a tenant's rows leave in delivery order, S-T12, carrying the
//! in-flight records its rows settle, S-T17), crash and attempt records,
//! and their retries after a backoff.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use super::tenants::Ended;
use super::types::{Fence, InFlight, OpId, Removal, StoreOp};
use crate::core::time::Time;

#[derive(Debug)]
pub(crate) struct Ops {
    next: u64,
    ready: VecDeque<StoreOp>,
    /// Calls to send again after a failure, by when.
    delayed: BTreeMap<(Time, u64), StoreOp>,
    /// Crash and attempt records sent and not yet answered.
    sent: BTreeMap<OpId, StoreOp>,
    /// Rows ended and not yet in a removal: id -> (partition, how).
    pending: BTreeMap<i64, (u32, Ended)>,
    /// In-flight records settled and not yet in a removal: first row ->
    /// partition.
    pending_records: BTreeMap<i64, u32>,
    pending_fence: Fence,
    /// The removal sent (or waiting to be sent again), with its rows'
    /// partitions.
    removal: Option<Sent>,
    backoff: Duration,
    max_backoff: Duration,
    failures: u32,
}

#[derive(Debug)]
pub(crate) struct Sent {
    pub(crate) op: StoreOp,
    pub(crate) partitions: BTreeMap<i64, u32>,
    /// Sent and awaiting its answer (else waiting for `retry_at`).
    pub(crate) out: bool,
    pub(crate) retry_at: Time,
}

impl Ops {
    pub(crate) fn new(backoff: Duration, max_backoff: Duration) -> Self {
        Ops {
            next: 0,
            ready: VecDeque::new(),
            delayed: BTreeMap::new(),
            sent: BTreeMap::new(),
            pending: BTreeMap::new(),
            pending_records: BTreeMap::new(),
            pending_fence: Fence::default(),
            removal: None,
            backoff,
            max_backoff,
            failures: 0,
        }
    }

    pub(crate) fn id(&mut self) -> OpId {
        self.next += 1;
        OpId(self.next)
    }

    pub(crate) fn record_crashes(&mut self, _now: Time, fence: Fence, partition: u32) {
        let op = self.id();
        self.ready.push_back(StoreOp::RecordCrashes {
            op,
            fence,
            partition,
        });
    }

    pub(crate) fn record_attempts(&mut self, op: OpId, fence: Fence, records: Vec<InFlight>) {
        self.ready
            .push_back(StoreOp::RecordAttempts { op, fence, records });
    }

    pub(crate) fn add_removal(&mut self, partition: u32, id: i64, how: Ended) {
        self.pending.insert(id, (partition, how));
    }

    /// The in-flight record `first` of `partition` goes with the next
    /// removal (its last row is in it, or was settled otherwise).
    pub(crate) fn add_record_drop(&mut self, partition: u32, first: i64) {
        self.pending_records.insert(first, partition);
    }

    /// Whether the next poll builds a new removal from what is pending:
    /// its fence is wanted then, and only then (worked out per removal,
    /// not per row ended: that was quadratic in the rows pending).
    pub(crate) fn removal_due(&self) -> bool {
        self.removal.is_none() && !(self.pending.is_empty() && self.pending_records.is_empty())
    }

    pub(crate) fn removal_partitions(&self) -> BTreeSet<u32> {
        let rows = self.pending.values().map(|(p, _)| *p);
        rows.chain(self.pending_records.values().copied()).collect()
    }

    pub(crate) fn set_removal_fence(&mut self, fence: Fence) {
        self.pending_fence = fence;
    }

    /// Drops what is queued for `partition` (lost): its pending removals
    /// and queued records. A call already sent is answered as usual.
    pub(crate) fn forget_partition(&mut self, partition: u32) {
        self.pending.retain(|_, (p, _)| *p != partition);
        self.pending_records.retain(|_, p| *p != partition);
        self.pending_fence.epochs.retain(|(p, _)| *p != partition);
        // A queued attempt record keeps its other partitions' records.
        let keep = |op: &mut StoreOp| match op {
            StoreOp::RecordCrashes { partition: p, .. } => *p != partition,
            StoreOp::RecordAttempts { fence, records, .. } => {
                records.retain(|r| r.partition != partition);
                fence.epochs.retain(|(p, _)| *p != partition);
                !records.is_empty()
            }
            _ => true,
        };
        self.ready.retain_mut(keep);
        self.delayed.retain(|_, op| keep(op));
    }

    /// Takes the first queued attempt record, as if polled (tests answer
    /// it in place).
    #[cfg(test)]
    pub(crate) fn take_record_op(&mut self) -> Option<StoreOp> {
        let at = self
            .ready
            .iter()
            .position(|op| matches!(op, StoreOp::RecordAttempts { .. }))?;
        let op = self.ready.remove(at)?;
        self.sent.insert(op.id(), op.clone());
        Some(op)
    }

    pub(crate) fn poll(&mut self, now: Time) -> Option<StoreOp> {
        if let Some(op) = self.ready.pop_front() {
            self.sent.insert(op.id(), op.clone());
            return Some(op);
        }
        self.poll_removal(now)
    }

    fn poll_removal(&mut self, now: Time) -> Option<StoreOp> {
        match &mut self.removal {
            Some(sent) if sent.out => None,
            Some(sent) if sent.retry_at <= now => {
                sent.out = true;
                Some(sent.op.clone())
            }
            Some(_) => None,
            None if self.pending.is_empty() && self.pending_records.is_empty() => None,
            None => {
                let mut removal = Removal::default();
                let records = std::mem::take(&mut self.pending_records);
                removal.records = records.into_keys().collect();
                let mut partitions = BTreeMap::new();
                for (id, (partition, how)) in std::mem::take(&mut self.pending) {
                    partitions.insert(id, partition);
                    match how {
                        Ended::Written => removal.delete.push(id),
                        Ended::Dead(row) => removal.dead.push(row),
                    }
                }
                let fence = std::mem::take(&mut self.pending_fence);
                let op = StoreOp::Remove {
                    op: self.id(),
                    fence,
                    removal,
                };
                self.removal = Some(Sent {
                    op: op.clone(),
                    partitions,
                    out: true,
                    retry_at: now,
                });
                Some(op)
            }
        }
    }

    /// The removal `op` was answered: `Some` with its rows' partitions and
    /// the records it dropped if it was the removal in flight.
    pub(crate) fn removal_answered(&mut self, op: OpId) -> Option<(BTreeMap<i64, u32>, Vec<i64>)> {
        match &self.removal {
            Some(sent) if sent.out && sent.op.id() == op => {
                self.failures = 0;
                let sent = self.removal.take()?;
                let records = match sent.op {
                    StoreOp::Remove { removal, .. } => removal.records,
                    _ => Vec::new(),
                };
                Some((sent.partitions, records))
            }
            _ => None,
        }
    }

    /// The removal `op` failed: the same removal goes again after the
    /// backoff (nothing newer before it).
    pub(crate) fn removal_failed(&mut self, now: Time, op: OpId) {
        let wait = self.next_backoff();
        if let Some(sent) = &mut self.removal {
            if sent.out && sent.op.id() == op {
                sent.out = false;
                sent.retry_at = now + wait;
            }
        }
    }

    /// A crash or attempt record was answered: the call, if it was sent.
    pub(crate) fn record_answered(&mut self, op: OpId) -> Option<StoreOp> {
        let sent = self.sent.remove(&op);
        if sent.is_some() {
            self.failures = 0;
        }
        sent
    }

    /// A crash or attempt record failed: the same call goes again after
    /// the backoff, under the new id returned.
    pub(crate) fn record_failed(&mut self, now: Time, op: OpId) -> Option<OpId> {
        let mut call = self.sent.remove(&op)?;
        let fresh = self.id();
        match &mut call {
            StoreOp::RecordCrashes { op, .. } | StoreOp::RecordAttempts { op, .. } => *op = fresh,
            _ => return None,
        }
        let wait = self.next_backoff();
        self.delayed.insert((now + wait, fresh.0), call);
        Some(fresh)
    }

    pub(crate) fn next_backoff(&mut self) -> Duration {
        let shift = self.failures.min(20);
        self.failures = self.failures.saturating_add(1);
        self.backoff
            .saturating_mul(1u32 << shift)
            .min(self.max_backoff)
    }

    pub(crate) fn handle_timeout(&mut self, now: Time) {
        while let Some(entry) = self.delayed.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let op = entry.remove();
            self.ready.push_back(op);
        }
    }

    pub(crate) fn next_timeout(&self) -> Option<Time> {
        let delayed = self.delayed.keys().next().map(|(t, _)| *t);
        let removal = self.removal.as_ref().filter(|s| !s.out).map(|s| s.retry_at);
        [delayed, removal].into_iter().flatten().min()
    }
}
