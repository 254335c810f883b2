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
//! answers), [`handle_write_started`] and [`handle_done`] (from the
//! engine), [`handle_timeout`]. Outputs, drained after every input:
//! [`poll_op`] (store calls to run), [`poll_delivery`] (rows for the
//! engine, in order per tenant), [`poll_event`], then [`poll_timeout`].
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
//! let delivered = relay.poll_delivery().unwrap();
//! relay.handle_done(now, delivered.id, Done::Written);
//! let Some(StoreOp::Remove { removal, .. }) = relay.poll_op(now) else { panic!() };
//! assert_eq!(removal.delete, [1]);
//! ```
//!
//! [`handle_partition_gained`]: Relay::handle_partition_gained
//! [`handle_partition_lost`]: Relay::handle_partition_lost
//! [`handle_wakeup`]: Relay::handle_wakeup
//! [`handle_page`]: Relay::handle_page
//! [`handle_removed`]: Relay::handle_removed
//! [`handle_crashes_recorded`]: Relay::handle_crashes_recorded
//! [`handle_attempt_recorded`]: Relay::handle_attempt_recorded
//! [`handle_write_started`]: Relay::handle_write_started
//! [`handle_done`]: Relay::handle_done
//! [`handle_timeout`]: Relay::handle_timeout
//! [`poll_op`]: Relay::poll_op
//! [`poll_delivery`]: Relay::poll_delivery
//! [`poll_event`]: Relay::poll_event
//! [`poll_timeout`]: Relay::poll_timeout

mod answers;
mod config;
mod ops;
mod read;
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
    PartitionRead, Position, ReadOrder, RelayEvent, Removal, Removed, Row, StoreError,
    StoreErrorKind, StoreOp, TenantRead,
};

use super::time::Time;
use ops::Ops;
use read::Reads;
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
}

/// Suspects of a crash are written alone (S-T18).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Quarantine {
    Off,
    /// A suspect was met: nothing more is delivered until every delivered
    /// row has ended, then the suspect goes alone; reads meanwhile ask only
    /// for where the suspect is, so it comes first.
    Draining(Source),
    /// This suspect is the only row delivered and not ended.
    Alone(i64),
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
    reads: Reads,
    ops: Ops,
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
        for entry in self.tenants.drop_partition(partition) {
            if self.keys.get(&entry.id).is_some_and(|k| k.open) {
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

    /// The engine is about to start the first attempt of a write of these
    /// rows (one tenant's, in delivery order): the relay asks for the
    /// write's in-flight record first; the attempt starts once
    /// [`RelayEvent::AttemptRecorded`] names its first row (S-T17).
    pub fn handle_write_started(&mut self, now: Time, ids: Vec<i64>) {
        let Some(&first) = ids.first() else { return };
        let Some(partition) = self.keys.get(&first).map(|k| k.partition) else {
            return;
        };
        if crate::core::canary::on(crate::core::canary::DELETE_BEFORE_WRITTEN) {
            self.plant_delete_at_start(&ids);
        }
        let fence = self.fence_for([partition]);
        self.ops
            .record_attempt(now, fence, InFlight { partition, ids });
    }

    /// The canary `delete_before_written`: the rows of a write that starts
    /// count as written at once, so they go into the next removal.
    fn plant_delete_at_start(&mut self, ids: &[i64]) {
        let Some(tenant) = ids
            .first()
            .and_then(|id| self.keys.get(id))
            .map(|k| k.tenant.clone())
        else {
            return;
        };
        if let Some(t) = self.tenants.get_mut(&tenant) {
            for e in t.queue.iter_mut().filter(|e| ids.contains(&e.id)) {
                e.ended.get_or_insert(Ended::Written);
            }
        }
        self.collect_removable(&tenant);
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
        if self.quarantine == Quarantine::Alone(id) {
            self.quarantine = Quarantine::Off;
        }
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
        }
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

    fn forget_key(&mut self, id: i64) {
        if let Some(key) = self.keys.remove(&id) {
            self.held -= 1;
            if key.open {
                self.open -= 1;
                if self.quarantine == Quarantine::Alone(id) {
                    self.quarantine = Quarantine::Off;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
