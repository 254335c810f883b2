//! The writer task: the one place that drains the engine, spawns sink
//! writes, joins them, arms the engine's timer and answers waiting callers
//! (S-C3, S-W13, S-W15, S-W16, S-W17).

use std::collections::BTreeMap;
use std::mem;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::{self, JoinError, JoinSet};
use tokio_util::sync::CancellationToken;

use super::contain;
use super::shared::{Shared, State, Waiter};
use super::task::{self as write_task, SinkFinished};
use crate::core::{
    Engine, Event, Failure, LostReason, Outcome, ShutdownReport, Time, WaitId, Write, WriteId,
};
use crate::sink::Sink;
use crate::telemetry::Log;

/// A write task's end, handed to the engine in the next drain.
enum TaskEnd<K, I> {
    /// The write came back with its outcome (S-C2).
    Finished(Write<K, I>, Outcome),
    /// The task ended without giving the items back (S-W13).
    Lost(WriteId),
}

/// How a write ends that the lease did not grant: it never reached the
/// sink, and another instance owns its partition (S-T37, S-E7).
#[cfg(feature = "table")]
const NOT_GRANTED: Outcome = Outcome::Failed(Failure::StaleEpoch);

/// Finishes the ended tasks' writes in the engine (S-C2, S-W13). The
/// items it is done with go to `done`, to be dropped after the lock; a
/// write it did not know (a driver bug) goes there too, its id to
/// `unknown`.
fn finish_ended<K: Ord + std::hash::Hash + Clone, I>(
    engine: &mut Engine<K, I>,
    now: Time,
    ended: Vec<TaskEnd<K, I>>,
    done: &mut Vec<Vec<I>>,
    unknown: &mut Vec<WriteId>,
) {
    for end in ended {
        match end {
            TaskEnd::Finished(write, outcome) => match engine.finish(now, write, outcome) {
                Ok(items) => done.push(items),
                Err(e) => {
                    unknown.push(e.0.id);
                    done.push(e.0.items);
                }
            },
            TaskEnd::Lost(id) => {
                engine.finish_lost(now, id);
            }
        }
    }
}

/// What one [`Writer::pump`] left to do.
struct Pumped {
    /// When the engine next needs time.
    timeout: Option<Time>,
    /// Every handle is gone, the engine closed and no task runs: the
    /// writer exits (S-W16).
    exit: bool,
}

/// What one round of draining the engine found: its writes to start, its
/// events, and the callers those events answer.
struct Drained<K, I> {
    /// Groups of slices (S-F1): one slice each unless the config asks
    /// for fan-in.
    writes: Vec<Vec<Write<K, I>>>,
    /// The tenant whose suspect's lone attempt is in flight (S-J17).
    lone: Option<K>,
    events: Vec<Event<K, I>>,
    waiters: BTreeMap<WaitId, Waiter<K, I>>,
}

impl<K: Ord + std::hash::Hash + Clone, I> Drained<K, I> {
    /// Drains the engine's writes and events (its drain order), taking
    /// out the waiters the events answer.
    fn take(st: &mut State<K, I>, now: Time) -> Self {
        let mut drained = Drained {
            writes: Vec::new(),
            lone: None,
            events: Vec::new(),
            waiters: BTreeMap::new(),
        };
        while let Some(group) = st.engine.poll_group(now) {
            drained.writes.push(group);
        }
        drained.lone = st.engine.lone_tenant().cloned();
        while let Some(event) = st.engine.poll_event() {
            if let Event::WaitDone { id, .. } | Event::ShutdownDone { id, .. } = &event {
                if let Some(waiter) = st.waiters.remove(id) {
                    drained.waiters.insert(*id, waiter);
                }
            }
            drained.events.push(event);
        }
        drained
    }
}

pub(crate) struct Writer<S: Sink> {
    shared: Arc<Shared<S>>,
    tasks: JoinSet<Vec<SinkFinished<S>>>,
    /// Which writes (a group's slices) each running task carries, to
    /// count a task that could not be joined (S-W13).
    running: BTreeMap<task::Id, Vec<WriteId>>,
    /// Cancels the writes in flight when the engine says so.
    cancel: CancellationToken,
    log: Log,
    /// The timeout of the shutdown that follows the last handle's drop.
    drop_timeout: Duration,
    /// Sink error texts of attempts joined but not yet logged.
    errors: BTreeMap<WriteId, String>,
    /// When the oldest-pending gauge was last refreshed (an O(tenants)
    /// scan, so at most once a second).
    gauged_at: Option<Time>,
    /// The last export of the gauges found the engine quiet (nothing
    /// pending, nothing in flight): a quiet engine is exported once as it
    /// becomes quiet, so gauges read after the work stops are current.
    gauged_quiet: bool,
    /// Tasks joined since the last drain: every task already done is
    /// joined first and all go to the engine under the drain's one lock,
    /// rather than one lock per write (the callers contend for it).
    ended: Vec<TaskEnd<S::Tenant, S::Item>>,
}

/// The writer task ended, or was dropped with its runtime (possibly
/// before it ever ran): nobody will write any more. Whatever is still
/// pending is given up as if abandoned (S-A7), so every item stays counted
/// (S-W14); the writes in flight are dropped with the task set; every
/// caller still waiting is answered, from the engine's own reports where
/// it has them, else as [`Answer`](super::Answer) answers when the writer
/// is gone.
impl<S: Sink> Drop for Writer<S> {
    fn drop(&mut self) {
        let now = self.shared.now();
        let mut answers = Vec::new();
        let ended = mem::take(&mut self.ended);
        // Items the engine is done with are dropped after the lock, contained:
        // an item's `Drop` is application code (S-W13).
        let mut done = Vec::new();
        // Shutdown reports nobody takes any more (their dead letters).
        let mut unclaimed = Vec::new();
        // The other events, logged after the lock: every ended attempt is
        // sampled by the latency histogram, these too (S-W18).
        let mut logged = Vec::new();
        // Run-time dead letters, handed out after the lock (S-R4).
        let mut letters = Vec::new();
        let lost = self.shared.engine_input(|st| {
            st.writer_gone = true;
            // Nobody takes in hand-offs any more: closed with the fence.
            let _ = self.shared.take_in(st, true);
            // Joined but not yet handed back (only if dropped mid-round);
            // an unknown write is not worth a log line here.
            finish_ended(&mut st.engine, now, ended, &mut done, &mut Vec::new());
            let before = st.engine.counters().lost(LostReason::Abandoned);
            done.extend(st.engine.abandon(now).into_iter().map(|run| run.items));
            for id in self.running.values().flatten() {
                // Given up by the abandon: this only lets a waiting shutdown
                // answer with its dead letters.
                st.engine.finish_lost(now, *id);
            }
            while let Some(event) = st.engine.poll_event() {
                match event {
                    Event::WaitDone { id, report } => {
                        if let Some(Waiter::Report(tx, _)) = st.waiters.remove(&id) {
                            answers.push(tx.send(report).is_ok());
                        }
                    }
                    Event::ShutdownDone { id, report } => match st.waiters.remove(&id) {
                        Some(Waiter::Shutdown(tx)) => match tx.send(report) {
                            Ok(()) => answers.push(true),
                            Err(report) => {
                                answers.push(false);
                                unclaimed.push(report);
                            }
                        },
                        _ => unclaimed.push(report),
                    },
                    Event::DeadLetter(letter) => letters.push(letter),
                    other => logged.push(other),
                }
            }
            // The rest get what a caller gets when the writer is gone (its
            // `Answer` sees the sender dropped).
            st.waiters.clear();
            st.engine.counters().lost(LostReason::Abandoned) - before
        });
        contain::drop_runs(done);
        for report in unclaimed {
            contain::drop_report(report);
        }
        for letter in letters {
            self.hand_dead_letter(letter);
        }
        self.log_dropped(&logged, lost);
    }
}

impl<S: Sink> Writer<S> {
    /// The drop's log lines: the events it took from the engine and, when
    /// items were pending, why they are counted lost.
    fn log_dropped(&self, logged: &[Event<S::Tenant, S::Item>], lost: u64) {
        // Dropped while the writer unwinds from a panic (in a log
        // subscriber, a metrics recorder or a tenant key's `Debug`): a
        // second panic here would abort the process, so the logging is
        // contained; the counts above are already settled.
        let unwinding = std::thread::panicking();
        let _ = contain::call(|| {
            for event in logged {
                self.log.event(event, None);
            }
            if lost == 0 {
            } else if unwinding {
                tracing::error!(
                    outbox = self.log.name(),
                    items = lost,
                    reason = LostReason::Abandoned.as_str(),
                    "the writer task ended by a panic with items pending; they are counted lost"
                );
            } else {
                tracing::error!(
                    outbox = self.log.name(),
                    items = lost,
                    reason = LostReason::Abandoned.as_str(),
                    "the writer task was dropped (its runtime shut down) with items pending; \
                     they are counted lost"
                );
            }
        });
    }

    pub(crate) fn new(shared: Arc<Shared<S>>, log: Log, drop_timeout: Duration) -> Self {
        Writer {
            shared,
            tasks: JoinSet::new(),
            running: BTreeMap::new(),
            cancel: CancellationToken::new(),
            log,
            drop_timeout,
            errors: BTreeMap::new(),
            gauged_at: None,
            gauged_quiet: false,
            ended: Vec::new(),
        }
    }

    /// Runs until every handle is gone and the engine is closed with no
    /// write left in flight (S-W16).
    ///
    /// Dropped unpolled or mid-way (its runtime shut down), the writer
    /// still accounts for everything (see its `Drop`).
    pub(crate) async fn run(mut self) {
        let shared = Arc::clone(&self.shared);
        let sleep = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(sleep);
        let mut armed: Option<Time> = None;
        loop {
            let Pumped { timeout, exit } = self.pump();
            if exit {
                tracing::debug!(outbox = self.log.name(), "writer exits");
                if let Some(journal) = &self.shared.journal {
                    journal.close();
                }
                return;
            }
            if timeout != armed {
                if let Some(at) = timeout {
                    sleep.as_mut().reset(shared.instant(at));
                }
                armed = timeout;
            }
            // Joins first: they are bounded by `concurrency`, while stages
            // from other threads may keep the wake-up ready forever. Every
            // branch is followed by a full drain, so none queues behind
            // another for longer than one round (S-W15).
            tokio::select! {
                biased;
                Some(joined) = self.tasks.join_next_with_id(), if !self.tasks.is_empty() => {
                    self.task_ended(joined);
                    while let Some(joined) = self.tasks.try_join_next_with_id() {
                        self.task_ended(joined);
                    }
                }
                () = shared.wake.notified() => {}
                // A stage handed off while the writer waited (S-W19).
                // One turn of the scheduler before the intake: the stages
                // landing now land first, so one exchange of the queue
                // takes them all, not a few at a time under the lock the
                // stagers push under (S-W19). It sets no timer: it waits
                // for the runtime's other ready tasks and one poll of its
                // IO.
                () = std::future::poll_fn(|cx| shared.poll_handoff(cx)) => {
                    tokio::task::yield_now().await;
                }
                () = &mut sleep, if armed.is_some() => {
                    // The engine fires what is due in the next drain.
                    armed = None;
                }
            }
        }
    }

    /// A write task ended: its outcome goes to the engine with its items
    /// (S-C2), or, if the task panicked past containment or was aborted,
    /// its items are counted lost (S-W13); both in the next drain.
    fn task_ended(&mut self, joined: Result<(task::Id, Vec<SinkFinished<S>>), JoinError>) {
        match joined {
            Ok((task, group)) => {
                self.running.remove(&task);
                for finished in group {
                    #[cfg(feature = "table")]
                    if let Some(feed) = &self.shared.relay_feed {
                        feed.write_ended(finished.write.id, Some(finished.outcome));
                    }
                    if let Some(error) = finished.error {
                        self.errors.insert(finished.write.id, error);
                    }
                    self.ended
                        .push(TaskEnd::Finished(finished.write, finished.outcome));
                }
            }
            Err(error) => {
                let Some(ids) = self.running.remove(&error.id()) else {
                    return;
                };
                for id in ids {
                    #[cfg(feature = "table")]
                    if let Some(feed) = &self.shared.relay_feed {
                        feed.write_ended(id, None);
                    }
                    tracing::error!(
                        outbox = self.log.name(),
                        write = %id,
                        panicked = error.is_panic(),
                        "a write task ended without giving its items back; they are counted lost"
                    );
                    self.ended.push(TaskEnd::Lost(id));
                }
            }
        }
    }

    /// Drains the engine after an input: hands back the ended writes,
    /// starts the writes it hands out, exports and acts on its events,
    /// answers callers.
    fn pump(&mut self) -> Pumped {
        let now = self.shared.now();
        let ended = mem::take(&mut self.ended);
        let mut unknown = Vec::new();
        // Items the engine is done with, dropped after the lock (see below).
        let mut done = Vec::new();
        let gauge = self
            .gauged_at
            .is_none_or(|at| now.saturating_since(at) >= Duration::from_secs(1));
        if gauge {
            self.gauged_at = Some(now);
        }
        let was_quiet = self.gauged_quiet;
        let dead_dropped = self
            .shared
            .dead_letters_dropped
            .load(std::sync::atomic::Ordering::Relaxed);
        // A round's worth of hand-offs first (S-W19); this input drains.
        let ((mut drained, timeout, closed, handles_gone, freed, quiet), _) = self
            .shared
            .input_taking(crate::handoff::WRITER_INTAKE, |st| {
                let pending_before = st.engine.pending();
                finish_ended(&mut st.engine, now, ended, &mut done, &mut unknown);
                if st.handles_gone && !st.engine.is_shutting_down() {
                    // The hand-off closes with the engine's fence (S-W19).
                    let _ = self.shared.take_in(st, true);
                    self.shut_down_after_last_handle(&mut st.engine, now);
                }
                st.engine.handle_timeout(now);
                let drained = Drained::take(st, now);
                // Done marks, in the engine's order, under its lock (S-J3).
                if let Some(journal) = &self.shared.journal {
                    journal.mark_done(&drained.events);
                }
                // The relayed rows they end, in the same order (S-T31).
                #[cfg(feature = "table")]
                if let Some(feed) = &self.shared.relay_feed {
                    feed.on_events(&drained.events, super::table::feed::Phase::of(&st.engine));
                }
                // Once a second while there is work, and once more as it stops
                // (the engine quiet, or closed): no gauge keeps a busy value
                // while nothing happens.
                let quiet = st.engine.pending() == 0 && st.engine.in_flight() == 0;
                let stopped = (quiet && !was_quiet) || st.engine.is_closed();
                let exported = gauge || stopped;
                if exported {
                    let health = super::Health::of(&st.engine, now, dead_dropped);
                    self.shared.gauges.set(&health);
                }
                let freed = st.engine.pending() < pending_before || st.engine.is_shutting_down();
                (
                    drained,
                    st.engine.poll_timeout(),
                    st.engine.is_closed(),
                    st.handles_gone,
                    freed,
                    exported.then_some(quiet),
                )
            });
        if let Some(quiet) = quiet {
            self.gauged_quiet = quiet;
        }
        if freed {
            // Callers waiting for capacity try again (S-R5).
            self.shared.capacity.notify_waiters();
        }
        self.let_go(done, unknown);
        for group in drained.writes {
            self.spawn(group, drained.lone.as_ref());
        }
        for event in drained.events {
            self.handle_event(event, &mut drained.waiters);
        }
        self.errors.clear();
        Pumped {
            timeout,
            exit: handles_gone && closed && self.tasks.is_empty(),
        }
    }

    /// After the lock: drops the items of finished writes and logs the
    /// writes the engine did not know.
    fn let_go(&self, done: Vec<Vec<S::Item>>, unknown: Vec<WriteId>) {
        // An item's `Drop` is application code: run it outside the lock and
        // contain a panic, so one bad item never stops the writer (S-W13).
        // One item at a time: two panicking destructors in one drop abort.
        let mut panicked = false;
        for item in done.into_iter().flatten() {
            panicked |= contain::call(move || drop(item)).is_err();
        }
        if panicked {
            tracing::error!(
                outbox = self.log.name(),
                "an item panicked while being dropped after its write; the writer carries on"
            );
        }
        for id in unknown {
            // A driver bug: the engine handed the items back; they cannot
            // be accounted anywhere else.
            tracing::error!(
                outbox = self.log.name(),
                write = %id,
                "a finished write was not in flight"
            );
        }
    }

    /// S-W16: the last handle is gone without a shutdown: shut down with
    /// the builder's drop timeout.
    fn shut_down_after_last_handle(&self, engine: &mut Engine<S::Tenant, S::Item>, now: Time) {
        let _ = engine.shutdown(now, now + self.drop_timeout);
        tracing::info!(
            outbox = self.log.name(),
            timeout_ms = self.drop_timeout.as_millis() as u64,
            "every handle dropped; draining before the writer exits"
        );
    }

    /// Starts one task for a group of slices (S-F1); they share their
    /// start, so their deadline.
    fn spawn(&mut self, group: Vec<Write<S::Tenant, S::Item>>, lone: Option<&S::Tenant>) {
        let deadline = group
            .first()
            .and_then(|w| w.deadline)
            .map(|at| self.shared.instant(at));
        // S-J17: an attempt waits for its attempt marks; a suspect's lone
        // one until they are on disk.
        let gate = self.shared.journal.as_ref().and_then(|journal| {
            let lone = match (&group[..], lone) {
                ([write], Some(tenant)) => write.tenant == *tenant,
                _ => false,
            };
            journal.on_spawn(&group, lone)
        });
        // One span per attempt (S-R6), the sink's own logs nesting in it;
        // under fan-in one per group, named by its first slice.
        let span = match group.first() {
            Some(w) => tracing::info_span!(
                "outbox.attempt",
                outbox = self.log.name(),
                tenant = ?w.tenant,
                write = %w.id,
                attempt = w.attempt,
                slices = group.len(),
            ),
            None => tracing::Span::none(),
        };
        // With an outbox table, the lease lets each write go, with its
        // epoch (S-T37).
        #[cfg(feature = "table")]
        let (group, epochs) = match &self.shared.relay_feed {
            Some(feed) => {
                let granted = feed.grant(group);
                if !granted.refused.is_empty() {
                    for write in granted.refused {
                        self.ended.push(TaskEnd::Finished(write, NOT_GRANTED));
                    }
                    self.shared.wake();
                }
                if granted.writes.is_empty() {
                    return;
                }
                (granted.writes, granted.epochs)
            }
            None => (group, None),
        };
        #[cfg(not(feature = "table"))]
        let epochs = None;
        // A suspect's retry waits for its in-flight record (S-T18).
        #[cfg(feature = "table")]
        let recorded = self
            .shared
            .relay_feed
            .as_ref()
            .and_then(|feed| feed.retry_gate(&group));
        #[cfg(not(feature = "table"))]
        let recorded: Option<tokio::sync::oneshot::Receiver<()>> = None;
        let ids: Vec<_> = group.iter().map(|w| w.id).collect();
        let sink = Arc::clone(&self.shared.sink);
        let cancel = self.cancel.clone();
        let run = async move {
            if let Some(gate) = gate {
                wait_gate(gate, deadline, &cancel).await;
            }
            if let Some(recorded) = recorded {
                if let Some(outcome) = wait_recorded(recorded, deadline, &cancel).await {
                    return not_started(group, outcome);
                }
            }
            write_task::run_group_with_epochs(sink, group, epochs, deadline, cancel).await
        };
        // Boxed: the task's cell then holds a pointer, not the ~1 KB
        // future, which spawning would otherwise copy on every write.
        let task = self
            .tasks
            .spawn(tracing::Instrument::instrument(Box::pin(run), span))
            .id();
        self.running.insert(task, ids);
    }

    /// Logs an event and does what it asks: cancel the writes in flight,
    /// or answer a caller.
    fn handle_event(
        &mut self,
        event: Event<S::Tenant, S::Item>,
        waiters: &mut BTreeMap<WaitId, Waiter<S::Tenant, S::Item>>,
    ) {
        let error = match &event {
            Event::AttemptFailed { id, .. } => self.errors.get(id).map(String::as_str),
            _ => None,
        };
        self.log.event(&event, error);
        match event {
            Event::CancelInFlight => {
                mem::replace(&mut self.cancel, CancellationToken::new()).cancel();
            }
            Event::WaitDone { id, report } => {
                if let Some(Waiter::Report(tx, deadline)) = waiters.remove(&id) {
                    self.answer_report(tx, deadline, report);
                }
            }
            Event::DeadLetter(letter) => self.hand_dead_letter(letter),
            Event::ShutdownDone { id, report } => {
                // Unclaimed dead letters (the caller dropped its answer)
                // are dropped here, an item's `Drop` contained (S-W13).
                match waiters.remove(&id) {
                    Some(Waiter::Shutdown(tx)) => self.answer_shutdown(tx, report),
                    _ => contain::drop_report(report),
                }
            }
            _ => {}
        }
    }

    /// Hands a run-time dead letter out (S-R4); with nowhere to go (the
    /// engine's `dead_letters` set without a hand-off) it is dropped,
    /// contained, and counted.
    fn hand_dead_letter(&self, letter: crate::core::DeadLetter<S::Tenant, S::Item>) {
        let dropped = &self.shared.dead_letters_dropped;
        match &self.shared.dead_letters {
            Some(to) => {
                if to.hand(letter, dropped) {
                    tracing::error!(
                        outbox = self.log.name(),
                        "the dead-letter callback panicked; the letter is dropped, the writer carries on"
                    );
                }
            }
            None => {
                dropped.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                contain::drop_letter(letter);
            }
        }
    }

    /// Answers a flush or settle; with an outbox table, once the rows it
    /// ended as written or given up are removed from the table too, at
    /// the latest at `deadline` (S-W10, S-A4 restated for the table).
    fn answer_report(
        &self,
        tx: tokio::sync::oneshot::Sender<crate::core::Report>,
        deadline: Time,
        report: crate::core::Report,
    ) {
        // The caller may have stopped waiting (S-A4 docs).
        let send = move || {
            let _ = tx.send(report);
        };
        #[cfg(feature = "table")]
        if let Some(feed) = &self.shared.relay_feed {
            let at = self.shared.instant(deadline);
            feed.after_removed(self.shared.runtime(), at, send);
            return;
        }
        let _ = deadline;
        send();
    }

    /// Answers a shutdown; with a journal, once the done marks of its
    /// items (written, or lost and handed back) are on disk, so that a
    /// clean shutdown leaves no pending item in the journal (S-J3).
    fn answer_shutdown(
        &self,
        tx: tokio::sync::oneshot::Sender<ShutdownReport<S::Tenant, S::Item>>,
        report: ShutdownReport<S::Tenant, S::Item>,
    ) {
        let send = move |report| {
            if let Err(report) = tx.send(report) {
                contain::drop_report(report);
            }
        };
        if let Some(journal) = &self.shared.journal {
            // The shutdown's deadline bounds this wait too (S-W15): a slow
            // or hung disk does not hold the answer.
            let deadline = self.shared.lock().engine.shutdown_deadline();
            let deadline = deadline.map(|at| self.shared.instant(at));
            let name = self.log.name().to_owned();
            journal.after_sync(self.shared.runtime(), deadline, name, move || send(report));
            return;
        }
        send(report);
    }
}

/// Sleeps until `deadline`, or for ever without one.
async fn until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Waits for a write's attempt marks (S-J17), at most until its
/// deadline or its cancellation, which the write then meets at once.
async fn wait_gate(
    gate: super::journal::Gate,
    deadline: Option<tokio::time::Instant>,
    cancel: &CancellationToken,
) {
    let until = until(deadline);
    tokio::select! {
        biased;
        () = cancel.cancelled() => {}
        () = gate => {}
        () = until => {}
    }
}

/// Waits for a suspect's in-flight record (S-T18): `None` once it is
/// durable; else the outcome the write ends with, without reaching the
/// sink: cancelled, timed out at its deadline, or (the record refused)
/// timed out at once, to be retried or handed over as the engine decides.
async fn wait_recorded(
    recorded: tokio::sync::oneshot::Receiver<()>,
    deadline: Option<tokio::time::Instant>,
    cancel: &CancellationToken,
) -> Option<Outcome> {
    let until = until(deadline);
    tokio::select! {
        biased;
        () = cancel.cancelled() => Some(Outcome::Failed(Failure::Cancelled)),
        answer = recorded => answer.err().map(|_| Outcome::Failed(Failure::Timeout)),
        () = until => Some(Outcome::Failed(Failure::Timeout)),
    }
}

/// The group's writes, ended with `outcome` before reaching the sink.
fn not_started<K, I>(group: Vec<Write<K, I>>, outcome: Outcome) -> Vec<write_task::Finished<K, I>> {
    group
        .into_iter()
        .map(|write| write_task::Finished {
            write,
            outcome,
            error: Some("the suspect's in-flight record is not durable".to_owned()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{Config, Engine, Staged};
    use crate::sink::{WriteError, Written};
    use crate::TenantId;

    struct Never;
    impl Sink for Never {
        type Tenant = TenantId;
        type Item = u32;
        fn name(&self) -> &str {
            "never"
        }
        async fn write(&self, _: &TenantId, _: &[u32]) -> Result<Written, WriteError> {
            std::future::pending().await
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_that_cannot_be_joined_counts_its_items_lost() {
        // S-W13: a write task that ends without giving its items back (a
        // panic past containment) has its items lost under `join_failed`,
        // and the writer goes on.
        let engine = Engine::new(Config::default()).unwrap();
        let shared = Arc::new(Shared::new(
            engine,
            None,
            crate::telemetry::register("never").0,
            Arc::new(Never),
            tokio::runtime::Handle::current(),
        ));
        let mut writer = Writer::new(
            Arc::clone(&shared),
            crate::telemetry::register("never").1,
            Duration::ZERO,
        );
        let t = TenantId::from_u128(1);
        let now = shared.now();
        assert_eq!(shared.lock().engine.stage(now, t, 7), Staged::Accepted);
        let write = shared.lock().engine.poll_write(now).unwrap();
        // A task that escapes containment: it panics outright.
        let task = writer
            .tasks
            .spawn(async move {
                let _items = write;
                panic!("escaped");
            })
            .id();
        writer.running.insert(task, vec![WriteId(1)]);
        let joined = writer.tasks.join_next_with_id().await.unwrap();
        assert!(joined.as_ref().is_err_and(JoinError::is_panic));
        writer.task_ended(joined);
        assert!(!writer.pump().exit);
        let c = shared.lock().engine.counters().clone();
        assert_eq!(c.lost(LostReason::JoinFailed), 1);
        assert_eq!(c.pending, 0);
        assert!(c.balanced());
        // The writer still works: the next item gets its own write.
        assert_eq!(shared.lock().engine.stage(now, t, 8), Staged::Accepted);
        assert!(!writer.pump().exit);
        assert_eq!(writer.tasks.len(), 1);
    }
}
