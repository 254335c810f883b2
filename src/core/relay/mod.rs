//! The outbox table's relay policy, sans-IO (S-T5..S-T19, S-C1): which
//! rows to read and in what order, how far to read ahead, which rows to
//! delete or dead-letter and when, and what to do with a crash's suspects
//! and with codec versions it does not know.
//!
//! The [`Relay`] does no IO and reads no clock. Its driver runs the store
//! calls it asks for (`outbox::table::Store`, the real SQL or the
//! simulation's model), hands the rows it delivers to the engine (the
//! input for items already durable, keyed by the row's id), and tells it
//! how each row ended. The same machine runs in production and in the
//! simulation.
//!
//! Inputs (each takes `now`): [`handle_partition_gained`] /
//! [`handle_partition_lost`] (from the lease policy), [`handle_wakeup`]
//! (a notification), [`handle_page`], [`handle_removed`],
//! [`handle_crashes_recorded`], [`handle_attempt_recorded`] (store
//! answers), [`handle_done`] (from the engine), [`handle_suspect_back`]
//! and [`handle_suspect_retry`] (a suspect's attempts, from the writer,
//! S-T18), [`handle_timeout`].
//! Outputs, drained after every input: [`poll_op`] (store calls to run),
//! [`poll_delivery`] (rows for the engine, in order per tenant, once their
//! in-flight records are durable), [`poll_event`], then [`poll_timeout`].
//!
//! ```
//! use std::time::Duration;
//! use outbox::core::relay::{Done, Page, Relay, RelayConfig, Row, StoreOp};
//! use outbox::core::Time;
//!
//! let mut relay = Relay::new(RelayConfig::new("instance-a")).unwrap();
//! let now = Time::ZERO;
//! relay.handle_partition_gained(now, 0, 7);
//! // A partition just gained first turns its leftover in-flight records
//! // into crash counts (S-T17).
//! let Some(StoreOp::RecordCrashes { op, .. }) = relay.poll_op(now) else { panic!() };
//! relay.handle_crashes_recorded(now, op, Ok(outbox::core::relay::Fenced::Done(0)));
//! // Then it reads.
//! let Some(StoreOp::ReadPage { op, request }) = relay.poll_op(now) else { panic!() };
//! assert_eq!(request.partitions[0].after, None);
//! let row = Row {
//!     id: 1, xid: 100, partition: 0, tenant: b"t".to_vec(), item: b"i".to_vec(),
//!     codec_version: 0, age: Duration::ZERO, crashes: 0,
//! };
//! let page = Page { xmin: 101, partitions: vec![vec![row]], tenants: vec![] };
//! relay.handle_page(now, op, Ok(page));
//! // The page's rows are recorded in flight, one call, before the engine
//! // gets any of them (S-T17).
//! let Some(StoreOp::RecordAttempts { op, records, .. }) = relay.poll_op(now) else { panic!() };
//! assert_eq!(records[0].ids, [1]);
//! relay.handle_attempt_recorded(now, op, Ok(Default::default()));
//! let delivered = relay.poll_delivery().unwrap();
//! relay.handle_done(now, delivered.id, Done::Written);
//! // The removal that settles the record's last row drops the record.
//! let Some(StoreOp::Remove { removal, .. }) = relay.poll_op(now) else { panic!() };
//! assert_eq!(removal.delete, [1]);
//! assert_eq!(removal.records, [1]);
//! ```
//!
//! [`handle_partition_gained`]: Relay::handle_partition_gained
//! [`handle_partition_lost`]: Relay::handle_partition_lost
//! [`handle_wakeup`]: Relay::handle_wakeup
//! [`handle_page`]: Relay::handle_page
//! [`handle_removed`]: Relay::handle_removed
//! [`handle_crashes_recorded`]: Relay::handle_crashes_recorded
//! [`handle_attempt_recorded`]: Relay::handle_attempt_recorded
//! [`handle_done`]: Relay::handle_done
//! [`handle_suspect_back`]: Relay::handle_suspect_back
//! [`handle_suspect_retry`]: Relay::handle_suspect_retry
//! [`handle_timeout`]: Relay::handle_timeout
//! [`poll_op`]: Relay::poll_op
//! [`poll_delivery`]: Relay::poll_delivery
//! [`poll_event`]: Relay::poll_event
//! [`poll_timeout`]: Relay::poll_timeout

mod answers;
mod config;
mod ops;
mod read;
mod records;
mod suspect;
mod take;
mod tenants;
mod types;

use std::collections::{BTreeMap, VecDeque};

pub use config::{
    RelayConfig, RelayConfigError, DEFAULT_MAX_CRASH_ATTEMPTS, DEFAULT_PAGE_ROWS,
    DEFAULT_POLL_INTERVAL, DEFAULT_READ_AHEAD,
};
pub use types::{
    DeadLetterRow, DeadReason, Done, Fence, Fenced, InFlight, OpId, Page, PageRequest,
    PartitionRead, Position, ReadOrder, Recorded, RelayEvent, Removal, Removed, Row, StoreError,
    StoreErrorKind, StoreOp, TenantRead,
};

use super::time::Time;
use ops::Ops;
use read::Reads;
use records::Records;
use tenants::{Ended, Tenants};

/// A partition this instance owns, as the relay sees it.
#[derive(Debug)]
struct Partition {
    epoch: u64,
    /// Its leftover in-flight records are counted as crashes (S-T17)
    /// before its first read.
    ready: bool,
    /// That count was asked for: only once the engine ended every row this
    /// relay delivered from the partition under an earlier epoch (S-T39).
    started: bool,
    /// The last row read (taken or skipped): the next read starts after it.
    cursor: Option<Position>,
}

/// A delivered (or dead-letter-bound) row the relay holds.
#[derive(Debug)]
struct Key {
    tenant: Vec<u8>,
    partition: u32,
    /// Handed to the engine and not yet ended.
    open: bool,
    /// Its in-flight record (by first row) while the row is not settled.
    record: Option<i64>,
}

/// Suspects of a crash are written alone (S-T18).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Quarantine {
    Off,
    /// A suspect was met: nothing more is delivered until every delivered
    /// row has ended, then the suspect goes alone; reads meanwhile ask only
    /// for where the suspect is, so it comes first.
    Draining(Source),
    /// This suspect is the only row delivered and not ended, or its retry
    /// is (its attempt in flight, or about to start).
    Alone(i64),
    /// This suspect's attempt came back and it waits for its retry: its
    /// in-flight record is dropped, the others' rows are read and written
    /// (S-W8), its tenant's and any other suspect's wait in the table.
    Waiting(i64),
}

/// Where a suspect was met.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Source {
    Partition(u32),
    Tenant(Vec<u8>),
}

/// The relay's policy: see the [module docs](self).
#[derive(Debug)]
pub struct Relay {
    config: RelayConfig,
    partitions: BTreeMap<u32, Partition>,
    tenants: Tenants,
    keys: BTreeMap<i64, Key>,
    /// Rows of partitions lost while the engine held them, to their
    /// partition: forgotten once the engine ends them (S-T39).
    orphans: BTreeMap<i64, u32>,
    /// How many of `orphans` each partition has.
    orphaned: BTreeMap<u32, u32>,
    /// Rows held: delivered or dead-letter-bound, not yet removed (S-T8).
    held: u32,
    /// Rows handed to the engine and not yet ended.
    open: u32,
    quarantine: Quarantine,
    /// The suspect whose retry asked for its in-flight record: the record
    /// call (`None` while an earlier drop of its record is pending), and
    /// the row (S-T18).
    retry: Option<(Option<OpId>, i64)>,
    reads: Reads,
    ops: Ops,
    records: Records,
    deliveries: VecDeque<Row>,
    events: VecDeque<RelayEvent>,
}

impl Relay {
    /// A relay owning no partition yet.
    ///
    /// # Errors
    /// [`RelayConfigError`] for a configuration it refuses.
    pub fn new(config: RelayConfig) -> Result<Self, RelayConfigError> {
        config.validate()?;
        Ok(Relay {
            reads: Reads::default(),
            ops: Ops::new(config.retry_backoff, config.max_retry_backoff),
            config,
            partitions: BTreeMap::new(),
            tenants: Tenants::default(),
            keys: BTreeMap::new(),
            orphans: BTreeMap::new(),
            orphaned: BTreeMap::new(),
            held: 0,
            open: 0,
            quarantine: Quarantine::Off,
            retry: None,
            records: Records::default(),
            deliveries: VecDeque::new(),
            events: VecDeque::new(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &RelayConfig {
        &self.config
    }

    /// The lease policy gained `partition` under `epoch`, with the epoch
    /// installed at the sink: the relay counts the partition's leftover
    /// in-flight records as crashes, then reads it from its oldest row
    /// (a new owner starts at the oldest undeleted row, S-T7). Gaining a
    /// partition already owned under another epoch starts it afresh. A
    /// partition gained again while the engine still holds rows this relay
    /// delivered from it before starts only once the engine ended them
    /// (S-T39): until then its rows would go into the engine twice.
    pub fn handle_partition_gained(&mut self, now: Time, partition: u32, epoch: u64) {
        if self.partitions.contains_key(&partition) {
            self.handle_partition_lost(now, partition);
        }
        self.partitions.insert(
            partition,
            Partition {
                epoch,
                ready: false,
                started: false,
                cursor: None,
            },
        );
        self.start_partition(now, partition);
    }

    /// Asks for a gained partition's crash count, unless the engine still
    /// holds rows delivered from it before (S-T39).
    fn start_partition(&mut self, now: Time, partition: u32) {
        if self.orphaned.contains_key(&partition) {
            return;
        }
        let Some(p) = self.partitions.get_mut(&partition) else {
            return;
        };
        if p.started {
            return;
        }
        p.started = true;
        let fence = self.fence_for([partition]);
        self.ops.record_crashes(now, fence, partition);
    }

    /// The lease policy lost `partition` (or released it): the relay
    /// forgets its cursor and its tenants. Rows of it the engine still
    /// holds end as handed over; their ends are ignored here.
    pub fn handle_partition_lost(&mut self, _now: Time, partition: u32) {
        if self.partitions.remove(&partition).is_none() {
            return;
        }
        // A suspect met in this partition is no longer this relay's to
        // deliver: reads must not keep waiting for it (S-T18).
        let draining_here = match &self.quarantine {
            Quarantine::Draining(Source::Partition(p)) => *p == partition,
            Quarantine::Draining(Source::Tenant(t)) => {
                self.tenants.get(t).is_none_or(|t| t.partition == partition)
            }
            _ => false,
        };
        if draining_here {
            self.quarantine = Quarantine::Off;
        }
        // Rows still waiting for their records never reached the engine:
        // no end of theirs is to be waited for (S-T39).
        let waiting = self.records.waiting(partition);
        // Its records are the next owner's to count (S-T17).
        self.records.forget_partition(partition);
        for entry in self.tenants.drop_partition(partition) {
            let open = self.keys.get(&entry.id).is_some_and(|k| k.open);
            if open && !waiting.contains(&entry.id) {
                *self.orphaned.entry(partition).or_default() += 1;
                self.orphans.insert(entry.id, partition);
            }
            self.forget_key(entry.id);
        }
        self.ops.forget_partition(partition);
    }

    /// A notification came (or the driver wants a read now): read soon.
    pub fn handle_wakeup(&mut self, _now: Time) {
        self.reads.wanted = true;
    }

    /// Records the rows the page just taken delivers, one record per
    /// partition in one store call, before any goes to the engine (S-T17).
    fn record_page(&mut self) {
        let op = self.ops.id();
        let records = self.records.open(op);
        if records.is_empty() {
            return;
        }
        for (id, first) in Records::keys(&records) {
            if let Some(key) = self.keys.get_mut(&id) {
                key.record = Some(first);
            }
        }
        let fence = self.fence_for(records.iter().map(|r| r.partition));
        self.ops.record_attempts(op, fence, records);
    }

    /// Rows whose records are durable go to the engine.
    fn release(&mut self, rows: Vec<Row>) {
        if rows.is_empty() {
            return;
        }
        if crate::core::canary::on(crate::core::canary::DELETE_BEFORE_WRITTEN) {
            self.plant_delete_at_start(&rows);
        }
        self.events.push_back(RelayEvent::AttemptsRecorded {
            rows: rows.len() as u64,
        });
        self.deliveries.extend(rows);
    }

    /// The canary `delete_before_written`: rows that go to the engine count
    /// as written at once, so they go into the next removal.
    fn plant_delete_at_start(&mut self, rows: &[Row]) {
        for row in rows {
            if let Some(t) = self.tenants.get_mut(&row.tenant) {
                for e in t.queue.iter_mut().filter(|e| e.id == row.id) {
                    e.ended.get_or_insert(Ended::Written);
                }
            }
            self.collect_removable(&row.tenant);
        }
    }

    /// The engine ended the row `id` (the key it was delivered with), or
    /// the driver dropped it before it went into the engine. The end of a
    /// row of a lost partition only forgets it (and may let that partition,
    /// gained again, start: S-T39); unknown ids (repeats) are ignored.
    pub fn handle_done(&mut self, now: Time, id: i64, done: Done) {
        if let Some(partition) = self.orphans.remove(&id) {
            self.orphan_ended(now, partition);
            return;
        }
        let Some(key) = self.keys.get_mut(&id) else {
            return;
        };
        if key.open {
            key.open = false;
            self.open -= 1;
        }
        let tenant = key.tenant.clone();
        self.suspect_gone(id);
        let ended = match done {
            Done::Written => Ended::Written,
            Done::GivenUp { reason, attempts } => Ended::Dead(DeadLetterRow {
                id,
                reason,
                attempts,
            }),
            Done::HandedOver => {
                for entry in self.tenants.drop_from(&tenant, id) {
                    self.forget_key(entry.id);
                }
                return;
            }
        };
        if let Some(t) = self.tenants.get_mut(&tenant) {
            if let Some(e) = t.queue.iter_mut().find(|e| e.id == id) {
                e.ended = Some(ended);
            }
        }
        self.collect_removable(&tenant);
    }

    /// Whatever timer came due: retries of failed calls, the poll.
    pub fn handle_timeout(&mut self, now: Time) {
        self.ops.handle_timeout(now);
        if self.reads.next_poll.is_some_and(|t| t <= now) {
            self.reads.next_poll = None;
            self.reads.wanted = true;
        }
    }

    /// The next store call to run, if any.
    pub fn poll_op(&mut self, now: Time) -> Option<StoreOp> {
        if self.ops.removal_due() {
            self.refresh_removal_fence();
        }
        if let Some(op) = self.ops.poll(now) {
            return Some(op);
        }
        self.poll_read(now)
    }

    /// The next row for the engine: per tenant in (xid, id) order (S-T5),
    /// keyed by its id.
    pub fn poll_delivery(&mut self) -> Option<Row> {
        self.deliveries.pop_front()
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<RelayEvent> {
        self.events.pop_front()
    }

    /// When [`handle_timeout`](Self::handle_timeout) is next due.
    pub fn poll_timeout(&self) -> Option<Time> {
        [self.ops.next_timeout(), self.reads.timeout()]
            .into_iter()
            .flatten()
            .min()
    }

    /// Rows held (delivered or dead-letter-bound, not yet removed).
    pub fn held(&self) -> u32 {
        self.held
    }

    /// Rows handed to the engine and not yet ended.
    pub fn open(&self) -> u32 {
        self.open
    }

    /// Tenants the relay keeps state for (held rows or held back).
    pub fn tenants(&self) -> usize {
        self.tenants.len()
    }

    /// In-flight records written or being written and not yet dropped
    /// (S-T17).
    pub fn records(&self) -> usize {
        self.records.live()
    }

    /// The partitions owned, with their epochs.
    pub fn partitions(&self) -> impl Iterator<Item = (u32, u64)> + '_ {
        self.partitions.iter().map(|(p, s)| (*p, s.epoch))
    }

    /// The fence of the given partitions (those still owned).
    fn fence_for(&self, partitions: impl IntoIterator<Item = u32>) -> Fence {
        let mut epochs: Vec<(u32, u64)> = partitions
            .into_iter()
            .filter_map(|p| self.partitions.get(&p).map(|s| (p, s.epoch)))
            .collect();
        epochs.sort_unstable();
        epochs.dedup();
        Fence {
            owner: self.config.owner.clone(),
            epochs,
        }
    }

    /// Moves `tenant`'s ended prefix into the next removal (S-T12).
    fn collect_removable(&mut self, tenant: &[u8]) {
        let ended = self.tenants.take_ended_prefix(tenant);
        for (id, how) in ended {
            let Some(key) = self.keys.get(&id) else {
                continue;
            };
            let partition = key.partition;
            self.ops.add_removal(partition, id, how);
            self.leave_record(id);
        }
    }

    fn refresh_removal_fence(&mut self) {
        let fence = self.fence_for(self.ops.removal_partitions());
        self.ops.set_removal_fence(fence);
    }

    /// A row of `partition`, lost while the engine held it, ended.
    fn orphan_ended(&mut self, now: Time, partition: u32) {
        let Some(n) = self.orphaned.get_mut(&partition) else {
            return;
        };
        *n -= 1;
        if *n == 0 {
            self.orphaned.remove(&partition);
            self.start_partition(now, partition);
        }
    }

    /// Rows of lost partitions the engine still holds (S-T39).
    pub fn orphans(&self) -> usize {
        self.orphans.len()
    }

    /// The row `id` leaves its in-flight record (in the next
    /// removal, or no longer this relay's): the record goes with the next
    /// removal once this was its last row (S-T17).
    fn leave_record(&mut self, id: i64) {
        let Some(first) = self.keys.get_mut(&id).and_then(|k| k.record.take()) else {
            return;
        };
        if let Some(partition) = self.records.row_done(first) {
            self.ops.add_record_drop(partition, first);
        }
    }

    fn forget_key(&mut self, id: i64) {
        self.leave_record(id);
        if let Some(key) = self.keys.remove(&id) {
            self.held -= 1;
            if key.open {
                self.open -= 1;
                self.suspect_gone(id);
            }
        }
    }
}

#[cfg(test)]
mod tests;
