//! Which row each of the engine's outcomes is about (S-T31). The relay
//! hands rows to the engine per tenant in delivery order, and the engine
//! ends a tenant's items in that order (one slice of a tenant at a time,
//! S-W5), so a tenant's queue of row ids, popped by each outcome's item
//! count, names the rows an outcome ends. Kept under the engine's lock,
//! pushed as rows go in and popped as the writer drains its events.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Mutex, PoisonError};

use tokio::sync::{mpsc, watch};

use super::gate::Gate;
use super::health::TableWatch;
use crate::core::lease::WriteGrant;
use crate::core::relay::{DeadReason, Done};
use crate::core::{DropReason, Event, LostReason, Outcome, Write, WriteId};
use crate::sink::WriteEpoch;

/// A row's end, for the relay task.
pub(crate) type Ended = (i64, Done);

/// The row ids the engine holds, per tenant, and where their ends go.
pub(crate) struct Feed<K> {
    inner: Mutex<Inner<K>>,
    ends: mpsc::UnboundedSender<Ended>,
    /// Where the engine's life stands, for the relay task.
    pub(crate) phase: watch::Sender<Phase>,
    /// The lease policy the writer asks before each write (S-T37).
    pub(crate) gate: std::sync::Arc<Gate>,
    /// What the relay task noted for `Outbox::health` (S-T36).
    pub(crate) watch: TableWatch,
    /// The rows the engine ended as written or given up whose removal
    /// from the table (delete or dead-letter move) is not yet done: a
    /// flush or settle answers once those it covers are removed (S-W10).
    unremoved: Mutex<Unremoved>,
    /// Notified whenever rows leave `unremoved`.
    removed: tokio::sync::Notify,
}

/// See [`Feed::unremoved`].
#[derive(Default)]
struct Unremoved {
    /// Row id to partition.
    rows: BTreeMap<i64, u32>,
    /// The relay task ended: nothing more is removed by this instance.
    gone: bool,
}

/// A group of writes (S-F1) as the lease lets it go: the writes granted,
/// with their epochs for the sink, and those refused.
pub(crate) struct Admitted<K, I> {
    /// The writes to start.
    pub(crate) writes: Vec<Write<K, I>>,
    /// Their epochs, one per write, when every one of them is relayed.
    pub(crate) epochs: Option<Vec<WriteEpoch>>,
    /// The writes the lease refuses: they end as a stale epoch without
    /// reaching the sink (S-T37).
    pub(crate) refused: Vec<Write<K, I>>,
}

/// Where the engine's life stands, as the relay task needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Taking items.
    Open,
    /// A shutdown began: nothing more goes into the engine.
    Closing,
    /// The engine ended everything it held.
    Closed,
}

impl Phase {
    /// Where `engine` stands.
    pub(crate) fn of<K: Ord + std::hash::Hash + Clone, I>(
        engine: &crate::core::Engine<K, I>,
    ) -> Phase {
        if engine.is_closed() {
            Phase::Closed
        } else if engine.is_shutting_down() {
            Phase::Closing
        } else {
            Phase::Open
        }
    }
}

struct Inner<K> {
    ids: BTreeMap<K, VecDeque<i64>>,
    /// The partition of each tenant with rows in the engine.
    partitions: BTreeMap<K, u32>,
    /// The same, by partition: a lost partition's tenants without a scan
    /// (S-L16, S-C4).
    by_partition: BTreeMap<u32, BTreeSet<K>>,
    /// The lease's grant of each write in flight (S-T37).
    grants: BTreeMap<WriteId, WriteGrant>,
    /// The last attempt number seen failing, per tenant: a slice given up
    /// next goes to the dead-letter table with it.
    attempts: BTreeMap<K, u32>,
}

impl<K: Ord + Clone> Feed<K> {
    pub(crate) fn new(
        ends: mpsc::UnboundedSender<Ended>,
        phase: watch::Sender<Phase>,
        gate: std::sync::Arc<Gate>,
        watch: TableWatch,
    ) -> Self {
        Feed {
            inner: Mutex::new(Inner {
                ids: BTreeMap::new(),
                partitions: BTreeMap::new(),
                by_partition: BTreeMap::new(),
                grants: BTreeMap::new(),
                attempts: BTreeMap::new(),
            }),
            ends,
            phase,
            gate,
            watch,
            unremoved: Mutex::default(),
            removed: tokio::sync::Notify::new(),
        }
    }

    /// The row `id` of `tenant`, in `partition`, went into the engine
    /// (under its lock).
    pub(crate) fn push(&self, tenant: &K, partition: u32, id: i64) {
        let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        g.ids.entry(tenant.clone()).or_default().push_back(id);
        if let Some(old) = g.partitions.insert(tenant.clone(), partition) {
            if old == partition {
                return;
            }
            g.forget_partition_of(tenant, old);
        }
        g.by_partition
            .entry(partition)
            .or_default()
            .insert(tenant.clone());
    }

    /// The tenants of `partition` with rows in the engine, in key order
    /// (S-L16: found through the index, never a scan, S-C4).
    pub(crate) fn tenants_of(&self, partition: u32) -> Vec<K> {
        let g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        g.by_partition
            .get(&partition)
            .map(|set| set.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Asks the lease for each write of `group` (S-T37): a relayed
    /// tenant's write starts only under a grant, and carries its epoch. A
    /// write of a tenant with no relayed row in the engine (not from the
    /// table) is not gated and carries no epoch.
    pub(crate) fn admit<I>(&self, group: Vec<Write<K, I>>) -> Admitted<K, I> {
        let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let mut admitted = Admitted {
            writes: Vec::with_capacity(group.len()),
            epochs: Some(Vec::with_capacity(group.len())),
            refused: Vec::new(),
        };
        for write in group {
            let Some(&partition) = g.partitions.get(&write.tenant) else {
                admitted.epochs = None;
                admitted.writes.push(write);
                continue;
            };
            match self.gate.begin(partition) {
                Ok(grant) => {
                    if let Some(epochs) = &mut admitted.epochs {
                        epochs.push(WriteEpoch::new(partition, grant.epoch.0));
                    }
                    g.grants.insert(write.id, grant);
                    admitted.writes.push(write);
                }
                Err(why) => {
                    tracing::debug!(write = %write.id, partition, %why, "outbox table: the lease refuses the write; its items are handed over");
                    admitted.refused.push(write);
                }
            }
        }
        if admitted.writes.is_empty() {
            admitted.epochs = None;
        }
        admitted
    }

    /// The write `id` ended with `outcome` (`None`: its task was lost):
    /// its grant goes back to the lease (S-L17), a stale epoch with it
    /// (S-L15).
    pub(crate) fn write_ended(&self, id: WriteId, outcome: Option<Outcome>) {
        let grant = {
            let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
            g.grants.remove(&id)
        };
        if let Some(grant) = grant {
            self.gate
                .end(grant, matches!(outcome, Some(Outcome::StaleEpoch)));
        }
    }

    /// Under the engine's lock, with its events in order: sends each row's
    /// end; notes where the engine's life stands.
    pub(crate) fn on_events<'a, I: 'a>(
        &self,
        events: impl IntoIterator<Item = &'a Event<K, I>>,
        phase: Phase,
    ) where
        K: 'a,
    {
        let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        for event in events {
            if let Event::AttemptFailed {
                tenant, attempt, ..
            } = event
            {
                g.attempts.insert(tenant.clone(), *attempt);
                continue;
            }
            let Some((tenant, items, how)) = ends(event) else {
                continue;
            };
            let attempts = g.attempts.remove(tenant).unwrap_or(1);
            let how = match how {
                End::Written => Done::Written,
                End::HandedOver => Done::HandedOver,
                End::Dead(reason) => Done::GivenUp { reason, attempts },
            };
            let partition = g.partitions.get(tenant).copied();
            let Some(queue) = g.ids.get_mut(tenant) else {
                continue;
            };
            for _ in 0..items {
                let Some(id) = queue.pop_front() else { break };
                if let (Some(p), Done::Written | Done::GivenUp { .. }) = (partition, how) {
                    self.unremoved_lock().rows.insert(id, p);
                }
                // The relay task gone (its runtime shut down): the rows
                // stay in the table for the next start.
                let _ = self.ends.send((id, how));
            }
            if queue.is_empty() {
                g.ids.remove(tenant);
                if let Some(partition) = g.partitions.remove(tenant) {
                    g.forget_partition_of(tenant, partition);
                }
            }
        }
        drop(g);
        self.phase.send_if_modified(|p| {
            let changed = *p != phase;
            *p = phase;
            changed
        });
    }
}

impl<K> Feed<K> {
    fn unremoved_lock(&self) -> std::sync::MutexGuard<'_, Unremoved> {
        self.unremoved
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The rows `ids` left the table, or are no longer this instance's to
    /// remove.
    pub(crate) fn removed(&self, ids: impl IntoIterator<Item = i64>) {
        {
            let mut u = self.unremoved_lock();
            for id in ids {
                u.rows.remove(&id);
            }
        }
        self.removed.notify_waiters();
    }

    /// `partition` is no longer this instance's: its rows are removed by
    /// the next owner, not here.
    pub(crate) fn partition_gone(&self, partition: u32) {
        self.unremoved_lock().rows.retain(|_, p| *p != partition);
        self.removed.notify_waiters();
    }

    /// Forgets the rows of partitions `owned` says this instance no longer
    /// relays (their ends came after the partition was lost).
    pub(crate) fn keep_owned(&self, owned: impl Fn(u32) -> bool) {
        let before = {
            let mut u = self.unremoved_lock();
            let before = u.rows.len();
            u.rows.retain(|_, p| owned(*p));
            before != u.rows.len()
        };
        if before {
            self.removed.notify_waiters();
        }
    }

    /// The relay task ended: no removal is waited for any more.
    pub(crate) fn relay_gone(&self) {
        {
            let mut u = self.unremoved_lock();
            u.rows.clear();
            u.gone = true;
        }
        self.removed.notify_waiters();
    }

    /// Runs `then` once every row ended and not yet removed at this call
    /// is removed (or no longer this instance's to remove), or at
    /// `deadline`: a flush's or settle's answer (S-W10, S-A4).
    pub(crate) fn after_removed(
        self: &std::sync::Arc<Self>,
        runtime: &tokio::runtime::Handle,
        deadline: tokio::time::Instant,
        then: impl FnOnce() + Send + 'static,
    ) where
        K: Send + 'static,
    {
        let waiting: Vec<i64> = self.unremoved_lock().rows.keys().copied().collect();
        if waiting.is_empty() {
            return then();
        }
        let feed = std::sync::Arc::clone(self);
        drop(runtime.spawn(async move {
            let sleep = tokio::time::sleep_until(deadline);
            tokio::pin!(sleep);
            loop {
                let notified = feed.removed.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                {
                    let u = feed.unremoved_lock();
                    if u.gone || waiting.iter().all(|id| !u.rows.contains_key(id)) {
                        break;
                    }
                }
                tokio::select! {
                    biased;
                    () = &mut notified => {}
                    () = &mut sleep => break,
                }
            }
            then();
        }));
    }
}

impl<K: Ord> Inner<K> {
    /// Takes `tenant` out of `partition`'s index entry.
    fn forget_partition_of(&mut self, tenant: &K, partition: u32) {
        if let Some(set) = self.by_partition.get_mut(&partition) {
            set.remove(tenant);
            if set.is_empty() {
                self.by_partition.remove(&partition);
            }
        }
    }
}

enum End {
    Written,
    HandedOver,
    Dead(DeadReason),
}

/// The tenant, item count and end of an event that ends relayed items
/// (as the journal's done marks, S-J3, with the shutdown's ends handed
/// over instead of lost: the rows stay in the table, S-T33).
fn ends<K, I>(event: &Event<K, I>) -> Option<(&K, u64, End)> {
    match event {
        // A write given up at a deadline that committed after all: its
        // rows were ended (handed over) when it was given up.
        Event::Written { given_up: true, .. } => None,
        Event::Written { tenant, items, .. } => Some((tenant, *items as u64, End::Written)),
        // A stale epoch, or a write the lease refused (S-E7, S-T37).
        Event::HandedOver { tenant, items } => Some((tenant, *items, End::HandedOver)),
        Event::Dropped {
            tenant,
            items,
            reason: DropReason::SinkError,
            ..
        } => Some((tenant, *items, End::Dead(DeadReason::SinkError))),
        Event::Lost {
            tenant,
            items,
            reason,
            ..
        } => {
            let end = match reason {
                LostReason::Terminal => End::Dead(DeadReason::Terminal),
                LostReason::RetriesExhausted => End::Dead(DeadReason::RetriesExhausted),
                LostReason::Expired => End::Dead(DeadReason::Expired),
                LostReason::Deadline | LostReason::Abandoned | LostReason::JoinFailed => {
                    End::HandedOver
                }
                // Refused after the fence (the relay feeds nothing then), part
                // of a written slice, or a journal's.
                _ => return None,
            };
            Some((tenant, *items, end))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed() -> (Feed<u64>, mpsc::UnboundedReceiver<Ended>) {
        let (ends, rx) = mpsc::unbounded_channel();
        let (phase, _) = watch::channel(Phase::Open);
        (
            Feed::new(
                ends,
                phase,
                std::sync::Arc::new(Gate::new(None)),
                TableWatch::new(false),
            ),
            rx,
        )
    }

    /// S-L16, S-C4: a partition's tenants with rows in the engine are
    /// found by the index, which forgets a tenant once its last row ended.
    #[tokio::test(start_paused = true)]
    async fn the_index_names_a_partitions_tenants_until_their_rows_end() {
        let (feed, mut rx) = feed();
        feed.push(&1, 0, 10);
        feed.push(&2, 1, 11);
        feed.push(&3, 0, 12);
        feed.push(&3, 0, 13);
        assert_eq!(feed.tenants_of(0), [1, 3]);
        assert_eq!(feed.tenants_of(1), [2]);
        assert!(feed.tenants_of(2).is_empty());
        let events: Vec<Event<u64, ()>> = vec![
            Event::HandedOver {
                tenant: 3,
                items: 1,
            },
            Event::HandedOver {
                tenant: 1,
                items: 1,
            },
        ];
        feed.on_events(&events, Phase::Open);
        assert_eq!(rx.try_recv().unwrap(), (12, Done::HandedOver));
        assert_eq!(rx.try_recv().unwrap(), (10, Done::HandedOver));
        assert_eq!(feed.tenants_of(0), [3], "tenant 3 still has row 13");
        let events: Vec<Event<u64, ()>> = vec![Event::HandedOver {
            tenant: 3,
            items: 1,
        }];
        feed.on_events(&events, Phase::Open);
        assert!(feed.tenants_of(0).is_empty());
        assert_eq!(feed.tenants_of(1), [2]);
    }
}
