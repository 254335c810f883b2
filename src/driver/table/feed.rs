//! Which row each of the engine's outcomes is about (S-T31). Each row goes
//! into the engine with its id as its key ([`Durable::key`]), and the
//! engine hands the key back with how the item settled
//! ([`Event::KeyDone`]): every removal (delete or dead-letter move) is
//! decided by that key, never by counting a tenant's items, so nothing
//! can drift whatever ends a slice (a stale epoch's hand-over, a
//! partition lost and gained again, a shutdown). Kept under the engine's
//! lock, a row added as it goes in and taken out as the writer drains its
//! events.
//!
//! [`Durable::key`]: crate::core::Durable::key

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, PoisonError};

use tokio::sync::{mpsc, oneshot, watch};

use super::gate::Gate;
use super::health::TableWatch;
use crate::core::lease::WriteGrant;
use crate::core::relay::{DeadReason, Done};
use crate::core::{
    AfterFailure, DropReason, Event, Failure, ItemOutcome, LostReason, Outcome, Write, WriteId,
};
use crate::sink::WriteEpoch;

/// A row's end, for the relay task.
pub(crate) type Ended = (i64, Done);

/// What the writer tells the relay task of a suspect of a crash (S-T18).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SuspectNote {
    /// Its attempt came back and it waits for its retry.
    Back(i64),
    /// Its retry is about to start: record it, then open its gate.
    Retry(i64),
}

/// The rows the engine holds, by id, and where their ends go.
pub(crate) struct Feed<K> {
    inner: Mutex<Inner<K>>,
    ends: mpsc::UnboundedSender<Ended>,
    /// Where the suspects' attempts are told (S-T18).
    notes: mpsc::UnboundedSender<SuspectNote>,
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
pub(crate) struct Granted<K, I> {
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
    /// Each row in the engine, by its id (the key it went in with), with
    /// its tenant.
    rows: BTreeMap<i64, K>,
    /// Each tenant with rows in the engine: its partition and how many.
    tenants: BTreeMap<K, Held>,
    /// The same, by partition: a lost partition's tenants without a scan
    /// (S-L16, S-C4).
    by_partition: BTreeMap<u32, BTreeSet<K>>,
    /// The lease's grant of each write in flight (S-T37).
    grants: BTreeMap<WriteId, WriteGrant>,
    /// The last attempt number seen failing, per tenant whose slice waits
    /// for a retry: given up while it waits (expired), it goes to the
    /// dead-letter table with it.
    attempts: BTreeMap<K, u32>,
    /// The attempt number of the slice whose end the engine counted last
    /// (its failed attempt, or the number its retry waited with; 0 for a
    /// slice never attempted, such as a backlog that expired): its keys
    /// follow, so its rows given up carry it (S-T13).
    ending: u32,
    /// Each tenant whose oldest row in the engine is a suspect of a crash,
    /// written alone (S-T18), with that row.
    suspects: BTreeMap<K, i64>,
    /// Each suspect's retry waiting for its in-flight record (S-T18).
    gates: BTreeMap<i64, oneshot::Sender<()>>,
}

/// A tenant's rows in the engine.
struct Held {
    partition: u32,
    rows: usize,
}

impl<K: Ord + Clone> Feed<K> {
    pub(crate) fn new(
        ends: mpsc::UnboundedSender<Ended>,
        notes: mpsc::UnboundedSender<SuspectNote>,
        phase: watch::Sender<Phase>,
        gate: std::sync::Arc<Gate>,
        watch: TableWatch,
    ) -> Self {
        Feed {
            inner: Mutex::new(Inner {
                rows: BTreeMap::new(),
                tenants: BTreeMap::new(),
                by_partition: BTreeMap::new(),
                grants: BTreeMap::new(),
                attempts: BTreeMap::new(),
                ending: 0,
                suspects: BTreeMap::new(),
                gates: BTreeMap::new(),
            }),
            ends,
            notes,
            phase,
            gate,
            watch,
            unremoved: Mutex::default(),
            removed: tokio::sync::Notify::new(),
        }
    }

    /// The row `id` of `tenant`, in `partition`, went into the engine
    /// with `id` as its key (under its lock).
    pub(crate) fn push(&self, tenant: &K, partition: u32, id: i64) {
        let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        g.push(tenant, partition, id);
    }

    /// The row `id` of `tenant`, a suspect of a crash, went into the engine
    /// (the relay delivers one at a time, with no other row of its tenant
    /// in the engine): its attempts are told to the relay task (S-T18).
    pub(crate) fn suspect(&self, tenant: &K, id: i64) {
        let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        g.suspects.insert(tenant.clone(), id);
    }

    /// The gate of a suspect's retry (S-T18): `Some` for a group that is
    /// the retry of a suspect's lone write, which must not reach the sink
    /// before the relay task wrote the suspect's in-flight record again
    /// (the gate opens) or refused to (the gate's sender is dropped). The
    /// first attempt went with the record its page read wrote.
    pub(crate) fn retry_gate<I>(&self, group: &[Write<K, I>]) -> Option<oneshot::Receiver<()>> {
        let [write] = group else { return None };
        if write.attempt < 2 {
            return None;
        }
        let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let id = *g.suspects.get(&write.tenant)?;
        let (tx, rx) = oneshot::channel();
        g.gates.insert(id, tx);
        drop(g);
        if self.notes.send(SuspectNote::Retry(id)).is_err() {
            // The relay task is gone: the gate stays shut.
            self.retry_recorded(id, false);
        }
        Some(rx)
    }

    /// The relay task's answer to a suspect's retry (S-T18): its gate
    /// opens if `recorded`, else stays shut.
    pub(crate) fn retry_recorded(&self, id: i64, recorded: bool) {
        let gate = {
            let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
            g.gates.remove(&id)
        };
        if let (Some(tx), true) = (gate, recorded) {
            let _ = tx.send(());
        }
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
    pub(crate) fn grant<I>(&self, group: Vec<Write<K, I>>) -> Granted<K, I> {
        let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let mut granted = Granted {
            writes: Vec::with_capacity(group.len()),
            epochs: Some(Vec::with_capacity(group.len())),
            refused: Vec::new(),
        };
        for write in group {
            let Some(partition) = g.tenants.get(&write.tenant).map(|h| h.partition) else {
                granted.epochs = None;
                granted.writes.push(write);
                continue;
            };
            match self.gate.begin(partition) {
                Ok(grant) => {
                    if let Some(epochs) = &mut granted.epochs {
                        epochs.push(WriteEpoch::new(partition, grant.epoch.0));
                    }
                    g.grants.insert(write.id, grant);
                    granted.writes.push(write);
                }
                Err(why) => {
                    tracing::debug!(write = %write.id, partition, %why, "outbox table: the lease refuses the write; its items are handed over");
                    granted.refused.push(write);
                }
            }
        }
        if granted.writes.is_empty() {
            granted.epochs = None;
        }
        granted
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
            self.gate.end(
                grant,
                matches!(outcome, Some(Outcome::Failed(Failure::StaleEpoch))),
            );
        }
    }

    /// Under the engine's lock, with its events in order: sends each row's
    /// end, named by the key the engine hands back; notes where the
    /// engine's life stands.
    pub(crate) fn on_events<'a, I: 'a>(
        &self,
        events: impl IntoIterator<Item = &'a Event<K, I>>,
        phase: Phase,
    ) where
        K: 'a,
    {
        let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        for event in events {
            match event {
                Event::AttemptFailed {
                    tenant,
                    attempt,
                    next,
                    ..
                } => {
                    // Queued after the loss or drop it causes, before the
                    // slice's keys: the keys carry this attempt's number.
                    g.ending = *attempt;
                    if matches!(next, AfterFailure::RetryIn(_)) {
                        g.attempts.insert(tenant.clone(), *attempt);
                        if let Some(&id) = g.suspects.get(tenant) {
                            // Its attempt is over: a crash while it backs
                            // off is not its own (S-T18).
                            let _ = self.notes.send(SuspectNote::Back(id));
                        }
                    } else {
                        g.attempts.remove(tenant);
                    }
                }
                Event::KeyDone { key, outcome, .. } => {
                    // Keys are row ids (`feed_engine`): the cast back is exact.
                    let id = *key as i64;
                    let Some(partition) = g.pop(id) else {
                        // Not a row of ours, or a repeat: nothing to end.
                        continue;
                    };
                    let done = done_of(*outcome, g.ending);
                    if matches!(done, Done::Written | Done::GivenUp { .. }) {
                        self.unremoved_lock().rows.insert(id, partition);
                    }
                    // The relay task gone (its runtime shut down): the rows
                    // stay in the table for the next start.
                    let _ = self.ends.send((id, done));
                }
                event => {
                    // A retry slice's end carries the attempt it waited
                    // with; any other (an attempt's end follows with its
                    // own number) was never attempted: 0 (S-T13).
                    if let Some(tenant) = slice_end(event) {
                        g.ending = g.attempts.remove(tenant).unwrap_or(0);
                    }
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

impl<K: Ord + Clone> Inner<K> {
    /// Adds the row `id` of `tenant`, in `partition`.
    fn push(&mut self, tenant: &K, partition: u32, id: i64) {
        if self.rows.insert(id, tenant.clone()).is_some() {
            // In the engine twice (S-T39 keeps a relay from it): the second
            // end is a repeat the policy ignores.
            return;
        }
        let old = match self.tenants.get_mut(tenant) {
            Some(held) => {
                held.rows += 1;
                if held.partition == partition {
                    return;
                }
                Some(std::mem::replace(&mut held.partition, partition))
            }
            None => {
                let held = Held { partition, rows: 1 };
                self.tenants.insert(tenant.clone(), held);
                None
            }
        };
        if let Some(old) = old {
            self.forget_partition_of(tenant, old);
        }
        self.by_partition
            .entry(partition)
            .or_default()
            .insert(tenant.clone());
    }

    /// Takes the row `id` out: its partition, or `None` if it is not here.
    fn pop(&mut self, id: i64) -> Option<u32> {
        let tenant = self.rows.remove(&id)?;
        if self.suspects.get(&tenant) == Some(&id) {
            self.suspects.remove(&tenant);
            self.gates.remove(&id);
        }
        let held = self.tenants.get_mut(&tenant)?;
        let partition = held.partition;
        held.rows -= 1;
        if held.rows == 0 {
            self.tenants.remove(&tenant);
            self.forget_partition_of(&tenant, partition);
        }
        Some(partition)
    }

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

/// A row's end, from how its item settled (S-T31): written rows are
/// deleted, and so are those the sink consumed without writing (S-W12);
/// rows given up by policy are dead-lettered with `attempts`; every other
/// end (a stale epoch, a lost partition, a shutdown's deadline, a lost
/// task) hands the row over: it stays in the table (S-T29, S-T33).
fn done_of(outcome: ItemOutcome, attempts: u32) -> Done {
    let reason = match outcome {
        ItemOutcome::Written | ItemOutcome::Lost(LostReason::Discarded) => return Done::Written,
        ItemOutcome::Dropped(DropReason::SinkError) => DeadReason::SinkError,
        ItemOutcome::Lost(LostReason::Terminal) => DeadReason::Terminal,
        ItemOutcome::Lost(LostReason::RetriesExhausted) => DeadReason::RetriesExhausted,
        ItemOutcome::Lost(LostReason::Expired) => DeadReason::Expired,
        ItemOutcome::Lost(LostReason::Poisoned) => DeadReason::Poisoned,
        ItemOutcome::HandedOver | ItemOutcome::Lost(_) | ItemOutcome::Dropped(_) => {
            return Done::HandedOver
        }
    };
    Done::GivenUp { reason, attempts }
}

/// The tenant of an event that counts a slice's end, its keys to follow.
fn slice_end<K, I>(event: &Event<K, I>) -> Option<&K> {
    match event {
        Event::Written { tenant, .. }
        | Event::HandedOver { tenant, .. }
        | Event::Dropped { tenant, .. }
        | Event::Lost { tenant, .. } => Some(tenant),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{Config, Durable, Engine, Outcome, Time};

    fn feed() -> (Feed<u64>, mpsc::UnboundedReceiver<Ended>) {
        let (ends, rx) = mpsc::unbounded_channel();
        let (notes, _) = mpsc::unbounded_channel();
        let (phase, _) = watch::channel(Phase::Open);
        (
            Feed::new(
                ends,
                notes,
                phase,
                std::sync::Arc::new(Gate::new(None)),
                TableWatch::new(false),
            ),
            rx,
        )
    }

    /// An engine as an outbox table's driver builds it, `max_batch` items
    /// per write, no linger, a retry 1 ms after a failure.
    fn engine(max_batch: usize, max_attempts: u32) -> Engine<u64, i64> {
        let mut config = Config::builder()
            .concurrency(1)
            .max_batch(max_batch)
            .linger(std::time::Duration::ZERO)
            .initial_backoff(std::time::Duration::from_millis(1))
            .max_backoff(std::time::Duration::from_millis(1))
            .jitter(0.0)
            .max_attempts(max_attempts)
            .build()
            .unwrap();
        config.table_only = true;
        config.outbox_table = true;
        Engine::new(config).unwrap()
    }

    /// Rows `ids` of `tenant` (partition 0) go in, keyed by id, as the
    /// relay task feeds them.
    fn deliver(e: &mut Engine<u64, i64>, feed: &Feed<u64>, now: Time, tenant: u64, ids: &[i64]) {
        for &id in ids {
            let durable = Durable {
                tenant,
                item: id,
                age: std::time::Duration::ZERO,
                key: Some(id as u64),
            };
            assert_eq!(e.stage_durable(now, [durable], 0).accepted, 1);
            feed.push(&tenant, 0, id);
        }
    }

    /// Drains the engine's events into the feed, as the writer does, and
    /// checks the invariant the feed once counted on: the keys handed back
    /// are exactly the items the slice ends count (S-T31).
    fn drain(
        e: &mut Engine<u64, i64>,
        feed: &Feed<u64>,
        rx: &mut mpsc::UnboundedReceiver<Ended>,
    ) -> Vec<Ended> {
        let events: Vec<Event<u64, i64>> = std::iter::from_fn(|| e.poll_event()).collect();
        let counted: u64 = events
            .iter()
            .map(|ev| match ev {
                Event::Written {
                    given_up: false,
                    items,
                    ..
                } => *items,
                Event::HandedOver { items, .. } | Event::Dropped { items, .. } => *items,
                Event::Lost { items, reason, .. } if *reason != LostReason::Discarded => *items,
                _ => 0,
            })
            .sum();
        let keys = events
            .iter()
            .filter(|ev| matches!(ev, Event::KeyDone { .. }))
            .count();
        assert_eq!(
            counted, keys as u64,
            "every item a slice's end counts hands its key back: {events:?}"
        );
        feed.on_events(&events, Phase::Open);
        std::iter::from_fn(|| rx.try_recv().ok()).collect()
    }

    /// S-T31, S-L16: a partition lost in the middle of a delivered page,
    /// while a write of its tenant is in flight, and a later delivery of
    /// the same tenant: each row's end is the one its key names. The write
    /// commits: its rows are deleted, every row behind it (the later
    /// delivery too) is handed over, none deleted.
    #[tokio::test(start_paused = true)]
    async fn a_hand_over_mid_page_names_each_rows_end_by_its_key() {
        let (feed, mut rx) = feed();
        let mut e = engine(2, 10);
        let t0 = Time::ZERO;
        deliver(&mut e, &feed, t0, 1, &[10, 11, 12]);
        deliver(&mut e, &feed, t0, 2, &[20]);
        let w = e.poll_write(t0).expect("tenant 1's write");
        assert_eq!(w.items, [10, 11]);
        // The partition is lost: tenant 1 waits behind its write.
        assert_eq!(
            e.hand_over_tenants(t0, feed.tenants_of(0)),
            1,
            "tenant 2's row"
        );
        assert_eq!(drain(&mut e, &feed, &mut rx), [(20, Done::HandedOver)]);
        assert_eq!(feed.tenants_of(0), [1]);
        // A later delivery of the same tenant, before the write ends.
        deliver(&mut e, &feed, t0, 1, &[13]);
        e.finish(t0, w, Outcome::WRITTEN).unwrap();
        assert_eq!(
            drain(&mut e, &feed, &mut rx),
            [
                (10, Done::Written),
                (11, Done::Written),
                (12, Done::HandedOver),
                (13, Done::HandedOver)
            ]
        );
        assert!(feed.tenants_of(0).is_empty(), "every row ended");
        assert!(feed.inner.lock().unwrap().rows.is_empty());
    }

    /// S-T38: at a shutdown's deadline an outbox table's engine hands
    /// over what it holds (a write in flight and the rows behind it),
    /// counted `handed_over` with their events, none lost; each row ends
    /// handed over.
    #[tokio::test(start_paused = true)]
    async fn a_shutdown_deadline_hands_over_the_rows_in_flight_and_waiting() {
        let (feed, mut rx) = feed();
        let mut e = engine(2, 10);
        let t0 = Time::ZERO;
        deliver(&mut e, &feed, t0, 1, &[10, 11, 12]);
        let _w = e.poll_write(t0).expect("tenant 1's write");
        let _ = e.shutdown(t0, t0);
        let c = e.counters().clone();
        assert_eq!((c.handed_over, c.lost_total(), e.pending()), (3, 0, 0));
        assert_eq!(
            drain(&mut e, &feed, &mut rx),
            [
                (10, Done::HandedOver),
                (11, Done::HandedOver),
                (12, Done::HandedOver)
            ]
        );
    }

    /// S-T13, S-T31: a slice given up carries the number of its last
    /// attempt to the dead-letter table (the engine queues that attempt's
    /// event after the loss it causes; counted by the loss alone, the rows
    /// carried the attempt before it). A stale epoch hands over what the
    /// tenant holds; the tenant, delivered again, ends by its new keys.
    #[tokio::test(start_paused = true)]
    async fn a_slice_given_up_carries_its_last_attempt_and_a_stale_epoch_hands_over() {
        let (feed, mut rx) = feed();
        let mut e = engine(1, 2);
        let mut now = Time::ZERO;
        deliver(&mut e, &feed, now, 1, &[10, 11]);
        let w = e.poll_write(now).unwrap();
        e.finish(now, w, Outcome::Failed(Failure::Error)).unwrap();
        assert!(drain(&mut e, &feed, &mut rx).is_empty(), "a retry waits");
        now = now + std::time::Duration::from_millis(5);
        e.handle_timeout(now);
        let w = e.poll_write(now).expect("the retry");
        assert_eq!((w.items.as_slice(), w.attempt), (&[10][..], 2));
        e.finish(now, w, Outcome::Failed(Failure::Error)).unwrap();
        let dead = Done::GivenUp {
            reason: DeadReason::RetriesExhausted,
            attempts: 2,
        };
        assert_eq!(drain(&mut e, &feed, &mut rx), [(10, dead)]);
        // Row 11 goes; the sink answers a stale epoch: it is handed over.
        let w = e.poll_write(now).unwrap();
        assert_eq!(w.items, [11]);
        e.finish(now, w, Outcome::Failed(Failure::StaleEpoch))
            .unwrap();
        assert_eq!(drain(&mut e, &feed, &mut rx), [(11, Done::HandedOver)]);
        // Delivered again (the relay reads it back), then written.
        deliver(&mut e, &feed, now, 1, &[11]);
        let w = e.poll_write(now).unwrap();
        e.finish(now, w, Outcome::WRITTEN).unwrap();
        assert_eq!(drain(&mut e, &feed, &mut rx), [(11, Done::Written)]);
        assert!(feed.tenants_of(0).is_empty());
    }

    /// S-T13: a row that expired without ever being tried goes to the
    /// dead-letter table with 0 attempts; one that expired while its retry
    /// waited, with the attempt it waited after. (Both carried 1 before.)
    #[tokio::test(start_paused = true)]
    async fn an_expired_row_carries_the_attempts_it_had() {
        let (feed, mut rx) = feed();
        let mut config = Config::builder()
            .concurrency(1)
            .max_batch(1)
            .linger(std::time::Duration::ZERO)
            .initial_backoff(std::time::Duration::from_secs(1))
            .jitter(0.0)
            .max_item_age(std::time::Duration::from_millis(100))
            .build()
            .unwrap();
        config.table_only = true;
        config.outbox_table = true;
        let mut e: Engine<u64, i64> = Engine::new(config).unwrap();
        let mut now = Time::ZERO;
        deliver(&mut e, &feed, now, 1, &[10, 11]);
        let w = e.poll_write(now).expect("row 10's write");
        e.finish(now, w, Outcome::Failed(Failure::Error)).unwrap();
        assert!(drain(&mut e, &feed, &mut rx).is_empty(), "a retry waits");
        now = now + std::time::Duration::from_millis(500);
        e.handle_timeout(now);
        let _ = e.poll_write(now);
        let expired = |attempts| Done::GivenUp {
            reason: DeadReason::Expired,
            attempts,
        };
        assert_eq!(
            drain(&mut e, &feed, &mut rx),
            [(10, expired(1)), (11, expired(0))]
        );
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
        let done = |key| Event::KeyDone {
            key,
            written: false,
            outcome: ItemOutcome::HandedOver,
        };
        let events: Vec<Event<u64, ()>> = vec![done(12), done(10)];
        feed.on_events(&events, Phase::Open);
        assert_eq!(rx.try_recv().unwrap(), (12, Done::HandedOver));
        assert_eq!(rx.try_recv().unwrap(), (10, Done::HandedOver));
        assert_eq!(feed.tenants_of(0), [3], "tenant 3 still has row 13");
        let events: Vec<Event<u64, ()>> = vec![done(13), done(13)];
        feed.on_events(&events, Phase::Open);
        assert_eq!(rx.try_recv().unwrap(), (13, Done::HandedOver));
        assert!(rx.try_recv().is_err(), "a repeated key ends nothing");
        assert!(feed.tenants_of(0).is_empty());
        assert_eq!(feed.tenants_of(1), [2]);
    }
}
