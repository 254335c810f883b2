//! The relay task (S-T31): runs the sans-IO relay policy
//! ([`Relay`](crate::core::relay::Relay)) against the outbox table's
//! [`Store`] for the partitions the lease task publishes, and feeds the
//! rows it delivers into the engine. IO only: which rows to read, hold,
//! delete or dead-letter, and when, is the policy's.
//!
//! - The rows a page read delivers first get their in-flight records, one
//!   store call per page (S-T17); the policy hands them over once those
//!   are durable, so a crash during any of their writes is counted
//!   against the rows still in the table.
//! - Rows go in through the engine's input for items already durable
//!   (S-W22: never refused by a capacity; the read-ahead is the
//!   back-pressure, S-T8, S-T9), with the row's age, each keyed by its
//!   row id: the engine hands the key back with the item's end, and
//!   [`Feed`] turns it into the row's.
//! - A partition lost (the lease task stopped it, or a fenced call found
//!   its lease taken): the policy forgets it, and the engine hands its
//!   tenants over at once (S-L16), found through the feed's index by
//!   partition, never a scan (S-C4).
//! - Wake-ups: a listener of its own (S-T15), opened again after every
//!   loss with a read at once; and the policy's poll.
//! - Health (S-T36): the task reads the store's horizon on a schedule of
//!   its own (see [`super::health`]) and notes it, and the listener's
//!   state, where `Outbox::health` reads them without IO.
//! - At a shutdown, nothing more goes into the engine; the task waits for
//!   the engine to end what it holds and for the removals, at most
//!   [`REMOVAL_GRACE`] after the engine closed, then stops, which stops
//!   the lease task (its leases are released only after the last
//!   removal, so no removal runs under a released lease).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::feed::{Ended, Feed, Phase, SuspectNote};
use super::health::{HORIZON_EVERY, HORIZON_TIMEOUT};
use super::lease::{Owned, Stale};
use super::metrics::RelayMetrics;
use crate::codec::Codec;
use crate::core::relay::{
    DeadReason, Done, Fenced, OpId, Page, Recorded, Relay, RelayEvent, Removal, Removed, Row,
    StoreError, StoreOp,
};
use crate::core::{Durable, Time};
use crate::driver::shared::Shared;
use crate::sink::Sink;
use crate::table::{Horizon, Listener, Relayed, Store};

/// How long the task waits, after the engine closed at a shutdown, for
/// its last removals: rows not removed by then are delivered again at the
/// next start (the sink absorbs the repeat, S-T14).
pub(crate) const REMOVAL_GRACE: Duration = Duration::from_secs(5);

/// How often a shutting-down relay looks whether the engine closed.
const CLOSE_CHECK: Duration = Duration::from_millis(50);

/// The wait before a listener is opened again after a failure.
const LISTEN_RETRY: Duration = Duration::from_secs(1);

/// A store call's answer, for the policy.
enum Answer<L> {
    Page(OpId, Result<Page, StoreError>),
    Removed(OpId, Removal, Result<Removed, StoreError>),
    Crashes(OpId, Result<Fenced<u64>, StoreError>),
    Attempt(OpId, Result<Recorded, StoreError>),
    Listener(Result<L, StoreError>),
    /// A horizon read: `Err` for a store error or a read past
    /// [`HORIZON_TIMEOUT`].
    Horizon(Result<Horizon, String>),
}

/// The relay task's state.
pub(crate) struct RelayTask<S: Sink, St: Store, I> {
    pub(crate) shared: Arc<Shared<S>>,
    pub(crate) store: Arc<St>,
    pub(crate) codec: Arc<dyn Codec<S::Tenant, I>>,
    pub(crate) relay: Relay,
    pub(crate) feed: Arc<Feed<S::Tenant>>,
    pub(crate) owned: watch::Receiver<Owned>,
    pub(crate) ends: mpsc::UnboundedReceiver<Ended>,
    /// A suspect's attempts, from the writer (S-T18).
    pub(crate) notes: mpsc::UnboundedReceiver<SuspectNote>,
    pub(crate) stale: mpsc::UnboundedSender<Stale>,
    /// Dropped when the task ends: the lease task shuts down.
    pub(crate) _stop_leases: watch::Sender<bool>,
    pub(crate) phase: watch::Receiver<Phase>,
    /// Whether to open a listener (else the policy's poll alone).
    pub(crate) listen: bool,
    pub(crate) metrics: RelayMetrics,
}

/// The task's moving parts, beside its configuration.
struct Run<L> {
    calls: JoinSet<Answer<L>>,
    listener: Option<L>,
    listen_at: Option<Instant>,
    /// The partitions the policy was told of.
    known: Owned,
    /// When the engine closed at a shutdown.
    closed_at: Option<Instant>,
    /// When the next horizon read is due; `None` while one runs.
    horizon_at: Option<Instant>,
    /// The policy's orphans as last noted for health (S-T39).
    orphans: usize,
}

impl<S, St, I> RelayTask<S, St, I>
where
    S: Sink<Item = Relayed<I>>,
    St: Store,
    I: Send + 'static,
{
    /// Runs until a shutdown's end (see the module docs).
    pub(crate) async fn run(mut self) {
        let mut run = Run {
            calls: JoinSet::new(),
            listener: None,
            listen_at: self.listen.then(Instant::now),
            known: Owned::new(),
            closed_at: None,
            horizon_at: Some(Instant::now()),
            orphans: 0,
        };
        loop {
            let now = self.shared.now();
            self.open_listener(&mut run);
            self.read_horizon(&mut run);
            self.sync_owned(now, &mut run);
            self.drain(now, &mut run);
            if self.relay.orphans() != run.orphans {
                run.orphans = self.relay.orphans();
                self.feed.watch.orphans(run.orphans);
            }
            if self.finished(&mut run) {
                break;
            }
            let wake = self.wake_at(&run);
            tokio::select! {
                biased;
                Some(ended) = self.ends.recv() => self.ended(ended),
                Some(note) = self.notes.recv() => self.suspect_note(note),
                Some(joined) = run.calls.join_next() => match joined {
                    Ok(answer) => self.answer(answer, &mut run),
                    // A panicked store call: its op is answered by the
                    // policy's own retry of nothing; read again.
                    Err(_) => self.relay.handle_wakeup(self.shared.now()),
                },
                Ok(()) = self.owned.changed() => {}
                Ok(()) = self.phase.changed() => {}
                woke = next(&mut run.listener) => match woke {
                    Ok(()) => self.relay.handle_wakeup(self.shared.now()),
                    Err(_) => {
                        run.listener = None;
                        run.listen_at = Some(Instant::now());
                        self.feed.watch.listening(false);
                        self.metrics.listening.set(0.0);
                    }
                },
                () = sleep_until(wake) => self.relay.handle_timeout(self.shared.now()),
            }
        }
        // A flush or settle waiting for removals answers now.
        self.feed.relay_gone();
    }

    fn ended(&mut self, (id, done): Ended) {
        let now = self.shared.now();
        self.relay.handle_done(now, id, done);
        while let Ok((id, done)) = self.ends.try_recv() {
            self.relay.handle_done(now, id, done);
        }
        // Ends of a partition lost meanwhile are no removal of ours.
        let owned: BTreeSet<u32> = self.relay.partitions().map(|(p, _)| p).collect();
        self.feed.keep_owned(|p| owned.contains(&p));
    }

    /// A suspect's attempt came back, or its retry asks for its record
    /// (S-T18).
    fn suspect_note(&mut self, note: SuspectNote) {
        let now = self.shared.now();
        match note {
            SuspectNote::Back(id) => self.relay.handle_suspect_back(now, id),
            SuspectNote::Retry(id) => self.relay.handle_suspect_retry(now, id),
        }
    }

    /// The next instant anything is due: the policy's timer, a listener
    /// to open again, the end of the shutdown's grace.
    fn wake_at(&self, run: &Run<St::Listener>) -> Option<Instant> {
        let policy = self.relay.poll_timeout().map(|t| self.shared.instant(t));
        let grace = run.closed_at.map(|t| t + REMOVAL_GRACE);
        // While shutting down, the engine's close is looked for often:
        // the policy's poll stops with the reads.
        let closing = self.closing().then(|| Instant::now() + CLOSE_CHECK);
        [policy, run.listen_at, grace, closing, run.horizon_at]
            .into_iter()
            .flatten()
            .min()
    }

    /// Whether the shutdown's work is done: the engine closed, and every
    /// row it held removed or the grace passed.
    fn finished(&self, run: &mut Run<St::Listener>) -> bool {
        // The engine itself, not only the writer's last word on it: the
        // writer may exit right after the input that closed the engine.
        // The loop comes here at least every `poll_interval`.
        if Phase::of(&self.shared.lock().engine) != Phase::Closed {
            return false;
        }
        let closed_at = *run.closed_at.get_or_insert_with(Instant::now);
        self.relay.held() == 0 || Instant::now() >= closed_at + REMOVAL_GRACE
    }

    /// Whether a shutdown began.
    fn closing(&self) -> bool {
        *self.phase.borrow() != Phase::Open || self.shared.lock().engine.is_shutting_down()
    }

    fn open_listener(&mut self, run: &mut Run<St::Listener>) {
        if run.listen_at.is_some_and(|t| t <= Instant::now()) {
            run.listen_at = None;
            let store = Arc::clone(&self.store);
            run.calls
                .spawn(async move { Answer::Listener(store.listen().await) });
        }
    }

    /// Starts a horizon read when one is due (S-T36): one at a time, each
    /// bounded by [`HORIZON_TIMEOUT`]; none once a shutdown began.
    fn read_horizon(&mut self, run: &mut Run<St::Listener>) {
        if self.closing() {
            run.horizon_at = None;
            return;
        }
        if run.horizon_at.is_some_and(|t| t <= Instant::now()) {
            run.horizon_at = None;
            let store = Arc::clone(&self.store);
            run.calls.spawn(async move {
                let read = tokio::time::timeout(HORIZON_TIMEOUT, store.horizon()).await;
                Answer::Horizon(match read {
                    Ok(Ok(h)) => Ok(h),
                    Ok(Err(e)) => Err(e.to_string()),
                    Err(_) => Err(format!("no answer within {HORIZON_TIMEOUT:?}")),
                })
            });
        }
    }

    /// Notes a horizon read's answer and schedules the next read.
    fn horizon_read(
        &mut self,
        now: Time,
        read: Result<Horizon, String>,
        run: &mut Run<St::Listener>,
    ) {
        let every = self.relay.config().poll_interval;
        let every = every.clamp(HORIZON_EVERY.0, HORIZON_EVERY.1);
        run.horizon_at = Some(Instant::now() + every);
        match read {
            Ok(h) => {
                self.metrics.horizon(&h);
                self.feed.watch.horizon(now, Some(h));
            }
            Err(e) => {
                tracing::debug!(outbox = %self.shared.sink.name(), error = %e, "outbox table: cannot read the horizon; health keeps the last");
                self.feed.watch.horizon(now, None);
            }
        }
    }

    /// Tells the policy the partitions gained and lost since last time.
    fn sync_owned(&mut self, now: Time, run: &mut Run<St::Listener>) {
        let owned = self.owned.borrow_and_update().clone();
        if owned == run.known {
            return;
        }
        let mut lost = Vec::new();
        for (&p, &e) in &run.known {
            if owned.get(&p) != Some(&e) {
                self.relay.handle_partition_lost(now, p);
                self.feed.partition_gone(p);
                lost.push(p);
            }
        }
        self.hand_over(now, &lost);
        for (&p, &e) in &owned {
            if run.known.get(&p) != Some(&e) {
                self.relay.handle_partition_gained(now, p, e);
            }
        }
        run.known = owned;
    }

    /// Runs the policy's store calls, sends its deliveries on their way,
    /// acts on its events.
    fn drain(&mut self, now: Time, run: &mut Run<St::Listener>) {
        while let Some(op) = self.relay.poll_op(now) {
            self.spawn_op(op, run);
        }
        // Rows whose in-flight records are durable, in delivery order.
        let rows: Vec<Row> = std::iter::from_fn(|| self.relay.poll_delivery()).collect();
        if !rows.is_empty() {
            self.metrics.read.increment(rows.len() as u64);
            self.feed_engine(now, rows);
        }
        while let Some(event) = self.relay.poll_event() {
            self.event(now, event, run);
        }
        // The events may have asked for more calls.
        while let Some(op) = self.relay.poll_op(now) {
            self.spawn_op(op, run);
        }
    }

    fn event(&mut self, now: Time, event: RelayEvent, run: &mut Run<St::Listener>) {
        match event {
            RelayEvent::PartitionStale { partition } => {
                self.feed.partition_gone(partition);
                if let Some(epoch) = run.known.remove(&partition) {
                    let _ = self.stale.send((partition, epoch));
                }
                self.hand_over(now, &[partition]);
            }
            RelayEvent::UnknownVersion {
                id,
                partition,
                version,
            } => {
                self.metrics.unknown_version.increment(1);
                tracing::warn!(outbox = %self.shared.sink.name(), row = id, partition, version,
                    "outbox table: a row's codec version is unknown here; it stays in the table");
            }
            RelayEvent::SuspectRetry { id, recorded } => self.feed.retry_recorded(id, recorded),
            RelayEvent::StoreFailed { kind } => {
                tracing::debug!(outbox = %self.shared.sink.name(), ?kind, "outbox table: a store call failed; it is tried again");
            }
            _ => {}
        }
    }

    /// The engine hands these lost partitions' tenants over (S-L16): the
    /// feed's index names them; their waiting items leave the engine now
    /// and their rows stay in the table (the policy's rows forgot them
    /// already, so their ends change nothing here).
    fn hand_over(&self, now: Time, partitions: &[u32]) {
        if partitions.is_empty() {
            return;
        }
        let feed = Arc::clone(&self.feed);
        let handed = self.shared.engine_input(|st| {
            let mut handed = 0;
            for &p in partitions {
                handed += st.engine.hand_over_tenants(now, feed.tenants_of(p));
            }
            handed
        });
        tracing::debug!(outbox = %self.shared.sink.name(), ?partitions, handed,
            "outbox table: partitions lost; their waiting items are handed over");
        // The writer drains the events: the rows' ends, the waits answered.
        self.shared.wake();
    }

    fn spawn_op(&mut self, op: StoreOp, run: &mut Run<St::Listener>) {
        if matches!(op, StoreOp::ReadPage { .. }) && self.closing() {
            // A shutdown began: nothing more is read (the read stays
            // unanswered; the task ends before it would matter).
            return;
        }
        let store = Arc::clone(&self.store);
        match op {
            StoreOp::ReadPage { op, request } => run
                .calls
                .spawn(async move { Answer::Page(op, store.read_page(&request).await) }),
            StoreOp::Remove { op, fence, removal } => run.calls.spawn(async move {
                let out = store.remove(&fence, &removal).await;
                Answer::Removed(op, removal, out)
            }),
            StoreOp::RecordCrashes {
                op,
                fence,
                partition,
            } => run.calls.spawn(async move {
                Answer::Crashes(op, store.record_crashes(&fence, partition).await)
            }),
            StoreOp::RecordAttempts { op, fence, records } => run.calls.spawn(async move {
                Answer::Attempt(op, store.record_attempts(&fence, &records).await)
            }),
        };
    }

    fn answer(&mut self, answer: Answer<St::Listener>, run: &mut Run<St::Listener>) {
        let now = self.shared.now();
        match answer {
            Answer::Page(op, page) => {
                if let Ok(page) = &page {
                    let rows: usize = page
                        .partitions
                        .iter()
                        .chain(&page.tenants)
                        .map(Vec::len)
                        .sum();
                    self.metrics.fetched.increment(rows as u64);
                }
                self.relay.handle_page(now, op, page);
            }
            Answer::Removed(op, removal, removed) => {
                if let Ok(removed) = &removed {
                    self.metrics.removed(&removal, removed);
                    // Removed, already gone, or (a stale partition) the
                    // next owner's to remove.
                    let dead = removal.dead.iter().map(|d| d.id);
                    self.feed
                        .removed(removal.delete.iter().copied().chain(dead));
                }
                self.relay.handle_removed(now, op, removed);
            }
            Answer::Crashes(op, r) => self.relay.handle_crashes_recorded(now, op, r),
            Answer::Attempt(op, r) => self.relay.handle_attempt_recorded(now, op, r),
            Answer::Listener(Ok(listener)) => {
                run.listener = Some(listener);
                self.feed.watch.listening(true);
                self.metrics.listening.set(1.0);
                // Notifications sent while it was away are lost (S-T15).
                self.relay.handle_wakeup(now);
            }
            Answer::Horizon(read) => self.horizon_read(now, read, run),
            Answer::Listener(Err(e)) => {
                tracing::debug!(outbox = %self.shared.sink.name(), error = %e, "outbox table: the listener cannot connect; polling meanwhile");
                run.listen_at = Some(Instant::now() + LISTEN_RETRY);
            }
        }
    }

    /// Decodes rows and hands them to the engine, keyed by row id;
    /// after a shutdown began, hands it over instead (it stays in the
    /// table, S-T33).
    fn feed_engine(&mut self, now: Time, rows: Vec<Row>) {
        let mut decoded = Vec::with_capacity(rows.len());
        let mut ends = Vec::new();
        for row in rows {
            let tenant = self.codec.decode_tenant(&row.tenant);
            let item = self.codec.decode_item(&row.item);
            match (tenant, item) {
                (Ok(tenant), Ok(item)) => {
                    let suspect = row.crashes > 0;
                    decoded.push((row.id, row.partition, row.age, tenant, item, suspect));
                }
                (Err(e), _) | (_, Err(e)) => {
                    tracing::error!(outbox = %self.shared.sink.name(), row = row.id, error = %e,
                        "outbox table: a row of a known codec version cannot be decoded; dead-lettered as terminal");
                    let dead = Done::GivenUp {
                        reason: DeadReason::Terminal,
                        attempts: 0,
                    };
                    ends.push((row.id, dead));
                }
            }
        }
        let feed = Arc::clone(&self.feed);
        self.shared.engine_input(|st| {
            for (row_id, partition, age, tenant, item, suspect) in decoded {
                if st.engine.is_shutting_down() {
                    ends.push((row_id, Done::HandedOver));
                    continue;
                }
                // The input for items already durable (S-W22), with the
                // row's age on the database's clock (S-R3).
                // Keyed by the row's id: the engine hands it back with the
                // item's end, which decides the row's removal (S-T31).
                let durable = Durable {
                    tenant: tenant.clone(),
                    item: Relayed { row_id, item },
                    age,
                    key: Some(row_id as u64),
                };
                let intake = st.engine.stage_durable(now, [durable], 0);
                if intake.accepted == 1 {
                    feed.push(&tenant, partition, row_id);
                    if suspect {
                        // Its every attempt goes alone (S-T18): it is its
                        // tenant's only row in the engine.
                        st.engine.write_alone(tenant.clone(), 1);
                        feed.suspect(&tenant, row_id);
                    }
                } else {
                    ends.push((row_id, Done::HandedOver));
                }
            }
        });
        self.shared.wake();
        for (id, done) in ends {
            self.relay.handle_done(now, id, done);
        }
    }
}

async fn next<L: Listener>(listener: &mut Option<L>) -> Result<(), StoreError> {
    match listener {
        Some(l) => l.next().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
