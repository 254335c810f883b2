//! Drives an [`Engine`] with [`Op`]s and checks the invariants after every
//! op (I2-I5, I7-I9 and the order half of I1): the one checker the
//! fuzz target, the model test and the simulation's fast world share.
//!
//! The harness keeps its own account of every item (pending, written,
//! dropped, lost) from what it did and what the engine said, and compares
//! it with the engine's counters, the writes it hands out and the reports
//! it gives. Any mismatch is a [`Violation`] naming the invariant.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::hash::{Hash, Hasher};
use std::time::Duration;

use super::op::{weight_of, Op, OpOutcome};
use crate::core::{
    Config, Counters, DropReason, Engine, ErrorPolicy, Event, LostReason, Next, Outcome, Report,
    Staged, Time, WaitId, Write, WriteId,
};

/// A broken invariant, with the rule it breaks and what was seen: the one
/// failure type of the harness and of both simulation worlds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The invariant or rule id of docs/contract.md, e.g. `"I2"` or
    /// `"S-A4"`; the simulation also uses `"panic"` (a panic escaped the
    /// run) and `"determinism"` (two runs of a seed differ).
    pub rule: &'static str,
    /// What was seen.
    pub detail: String,
    /// Where it was seen: the op index in the harness, the step of the run
    /// in the simulation.
    pub step: usize,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} broken at step {}: {}",
            self.rule, self.step, self.detail
        )
    }
}

impl std::error::Error for Violation {}

/// What became of an item, in the harness's own account.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fate {
    /// Accepted, not yet written, dropped or lost.
    Pending,
    /// Written by the sink.
    Written,
    /// Dropped by a policy (refused at stage time or a failed batch under
    /// the drop policy).
    Dropped,
    /// Lost (refused after the fence, or given up).
    Lost,
}

/// Items dropped or lost, as an event reported them (kept with a trace, for
/// timelines).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Loss {
    /// When.
    pub at: Time,
    /// Whose items.
    pub tenant: u8,
    /// How many.
    pub items: u64,
    /// The reason label (`buffer_full`, `deadline`, ...).
    pub reason: &'static str,
    /// Dropped by a policy (else lost).
    pub dropped: bool,
}

/// A write the harness has seen, across its attempts.
#[derive(Debug)]
struct Slice {
    tenant: u8,
    items: Vec<u64>,
    attempts: u32,
    /// Set when an attempt failed with a retry: no retry before this (I7).
    retry_not_before: Option<Time>,
    /// The first attempt's start (S-B2 `max_retry_duration`).
    first_started: Time,
}

/// A flush, settle or shutdown waiting for its answer. It covers the items
/// pending at the call: those staged before it (`item < bound`) that were
/// still pending then. Its answer is computed incrementally (O(log n)),
/// never by walking the items.
#[derive(Debug)]
struct WaitCheck {
    /// Items numbered below this were staged before the call.
    bound: u64,
    /// Items pending at the call.
    pending: u64,
    /// Items staged before the call and already written, dropped or lost
    /// at the call, by fate (index `Fate as usize - 1`).
    settled_before: [u64; 3],
    deadline: Time,
}

/// Counts of settled items by fate (written, dropped, lost) over item
/// numbers, as a Fenwick tree that grows by one slot per staged item:
/// O(log n) to settle an item, to stage one and to ask how many items
/// below a bound have each fate.
#[derive(Debug, Default)]
struct FateTree {
    /// 1-based; slot `n` sums items `(n - lowbit(n), n]`.
    tree: Vec<[u64; 3]>,
}

impl FateTree {
    fn len(&self) -> usize {
        self.tree.len().saturating_sub(1)
    }

    /// Appends an unsettled item.
    fn push(&mut self) {
        if self.tree.is_empty() {
            self.tree.push([0; 3]);
        }
        let n = self.tree.len();
        let low = n & n.wrapping_neg();
        let a = self.prefix(n - 1);
        let b = self.prefix(n - low);
        self.tree.push([a[0] - b[0], a[1] - b[1], a[2] - b[2]]);
    }

    /// Item `item` (0-based) settled with fate index `f` (0..3).
    fn add(&mut self, item: u64, f: usize) {
        let mut i = item as usize + 1;
        while i < self.tree.len() {
            self.tree[i][f] += 1;
            i += i & i.wrapping_neg();
        }
    }

    /// Settled counts among items `0..n`.
    fn prefix(&self, n: usize) -> [u64; 3] {
        let mut out = [0; 3];
        let mut i = n.min(self.len());
        while i > 0 {
            for (o, v) in out.iter_mut().zip(self.tree[i]) {
                *o += v;
            }
            i &= i - 1;
        }
        out
    }
}

/// Figures a run accumulates, for campaign summaries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Ops applied.
    pub steps: u64,
    /// Attempts started.
    pub attempts: u64,
    /// Failed attempts reported by the harness, by outcome.
    pub faults: BTreeMap<&'static str, u64>,
    /// Flushes and settles answered.
    pub waits_answered: u64,
    /// Shutdowns answered.
    pub shutdowns: u64,
}

/// The engine under test plus the harness's own account.
pub struct Harness {
    engine: Engine<u8, u64>,
    config: Config,
    weighs: bool,
    tenants: u8,
    now: Time,
    next_item: u64,
    step: usize,
    in_flight: Vec<Write<u8, u64>>,
    given_up: BTreeSet<WriteId>,
    /// Accepted items not yet in any write, per tenant, in staging order.
    waiting: BTreeMap<u8, VecDeque<u64>>,
    /// The fate of every item staged, indexed by item number.
    fate: Vec<Fate>,
    /// The tenant of every item staged.
    tenant_of: Vec<u8>,
    /// Items by fate: (pending, written, dropped, lost), kept as fates change.
    model: [u64; 4],
    /// Settled items by fate over item numbers (wait answers).
    settled: FateTree,
    /// Pending items per tenant.
    tenant_pending: Vec<usize>,
    /// Bytes of the pending items.
    pending_bytes: u64,
    slices: BTreeMap<WriteId, Slice>,
    discard: BTreeMap<WriteId, usize>,
    waits: BTreeMap<WaitId, WaitCheck>,
    /// Per tenant, when its waiting backlog's linger clock started (S-A3).
    linger_from: Vec<Time>,
    /// Per tenant, bytes of its waiting backlog.
    waiting_bytes: Vec<u64>,
    /// Items numbered below this skip linger (a flush or shutdown asked).
    flush_bound: u64,
    /// Items of given-up writes whose task was lost or that came back
    /// written: not handed back (S-B6).
    given_up_task_lost: u64,
    /// Open flushes and settles by deadline: none may outlive it (S-W15).
    wait_deadlines: BTreeSet<(Time, WaitId)>,
    shutdown_deadline: Option<Time>,
    shutdown_first: Option<WaitId>,
    shutdown_done: bool,
    abandoned: bool,
    lost_seen: [u64; LostReason::ALL.len()],
    dropped_seen: [u64; DropReason::ALL.len()],
    last: Counters,
    hasher: Fnv,
    trace: Option<Vec<String>>,
    /// Written items per tenant, in the order they were written.
    written: BTreeMap<u8, Vec<u64>>,
    /// Drops and losses seen, with a trace.
    losses: Vec<Loss>,
    /// `CancelInFlight` events seen.
    cancel_requests: u64,
    /// Figures for summaries.
    pub stats: Stats,
}

impl Harness {
    /// A harness over a fresh engine with `config`, `tenants` tenants
    /// (at least 1), items weighed by [`weight_of`] when `weighs`.
    pub fn new(config: Config, tenants: u8, weighs: bool) -> Self {
        let engine = if weighs {
            Engine::with_weigher(config.clone(), |i: &u64| weight_of(*i))
        } else {
            Engine::new(config.clone())
        }
        .expect("a weigher is given whenever a byte limit is set");
        Harness {
            engine,
            config,
            weighs,
            tenants: tenants.max(1),
            now: Time::ZERO,
            next_item: 0,
            step: 0,
            in_flight: Vec::new(),
            given_up: BTreeSet::new(),
            waiting: BTreeMap::new(),
            fate: Vec::new(),
            tenant_of: Vec::new(),
            model: [0; 4],
            settled: FateTree::default(),
            tenant_pending: vec![0; 256],
            pending_bytes: 0,
            slices: BTreeMap::new(),
            discard: BTreeMap::new(),
            waits: BTreeMap::new(),
            wait_deadlines: BTreeSet::new(),
            linger_from: vec![Time::ZERO; 256],
            waiting_bytes: vec![0; 256],
            flush_bound: 0,
            given_up_task_lost: 0,
            shutdown_deadline: None,
            shutdown_first: None,
            shutdown_done: false,
            abandoned: false,
            lost_seen: [0; LostReason::ALL.len()],
            dropped_seen: [0; DropReason::ALL.len()],
            last: Counters::default(),
            hasher: Fnv::default(),
            trace: None,
            written: BTreeMap::new(),
            cancel_requests: 0,
            losses: Vec::new(),
            stats: Stats::default(),
        }
    }

    /// Keep a one-line-per-op-and-event trace (for replays).
    pub fn with_trace(mut self) -> Self {
        self.trace = Some(Vec::new());
        self
    }

    /// The trace so far (empty unless [`with_trace`](Self::with_trace)).
    pub fn trace(&self) -> &[String] {
        self.trace.as_deref().unwrap_or(&[])
    }

    /// Appends a line to the trace (a world's own notes: faults it plans,
    /// spells of failure). Not hashed; ignored without a trace.
    pub fn note(&mut self, line: impl FnOnce() -> String) {
        if let Some(t) = self.trace.as_mut() {
            t.push(line());
        }
    }

    /// Every drop and loss event so far (empty unless
    /// [`with_trace`](Self::with_trace)).
    pub fn losses(&self) -> &[Loss] {
        &self.losses
    }

    /// How many times the engine asked the driver to cancel the writes in
    /// flight ([`Event::CancelInFlight`]) so far.
    pub fn cancel_requests(&self) -> u64 {
        self.cancel_requests
    }

    /// A hash of every op and every output so far: the same seed must give
    /// the same hash (determinism self-check, S-C1).
    pub fn trace_hash(&self) -> u64 {
        self.hasher.0
    }

    /// The engine under test.
    pub fn engine(&self) -> &Engine<u8, u64> {
        &self.engine
    }

    /// The harness's clock.
    pub fn now(&self) -> Time {
        self.now
    }

    /// Writes handed out and not finished.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// The writes in flight, in the order they were handed out (the order
    /// `Op::Finish { pick }` indexes).
    pub fn in_flight_writes(&self) -> &[Write<u8, u64>] {
        &self.in_flight
    }

    /// Whether the engine gave up write `id` (a shutdown deadline or
    /// abandon asked the driver to cancel it).
    pub fn is_given_up(&self, id: WriteId) -> bool {
        self.given_up.contains(&id)
    }

    /// What became of item `item` so far (`None`: never staged).
    pub fn fate(&self, item: u64) -> Option<Fate> {
        self.fate.get(item as usize).copied()
    }

    /// The tenant item `item` was staged to.
    pub fn tenant_of(&self, item: u64) -> Option<u8> {
        self.tenant_of.get(item as usize).copied()
    }

    /// Items staged so far (they are numbered `0..items_staged()`).
    pub fn items_staged(&self) -> u64 {
        self.next_item
    }

    /// The number of tenants (ops' tenant indexes are taken modulo it).
    pub fn tenants(&self) -> u8 {
        self.tenants
    }

    /// Whether `abandon` was applied.
    pub fn is_abandoned(&self) -> bool {
        self.abandoned
    }

    /// Items written per tenant, in write order.
    pub fn written(&self) -> &BTreeMap<u8, Vec<u64>> {
        &self.written
    }

    /// Whether a shutdown has been answered or the engine abandoned.
    pub fn is_finished(&self) -> bool {
        self.shutdown_done || self.abandoned
    }

    /// Applies every op in turn, stopping at the first violation.
    ///
    /// # Errors
    /// The first [`Violation`].
    pub fn run(&mut self, ops: &[Op]) -> Result<(), Violation> {
        ops.iter().try_for_each(|op| self.apply(*op))
    }

    /// Applies one op and checks every invariant.
    ///
    /// # Errors
    /// The first [`Violation`] seen.
    pub fn apply(&mut self, op: Op) -> Result<(), Violation> {
        self.step += 1;
        self.stats.steps += 1;
        op.hash(&mut self.hasher);
        if let Some(t) = self.trace.as_mut() {
            t.push(format!("{} op {op:?}", self.now));
        }
        match op {
            Op::Stage { tenant, count } => {
                let tenant = tenant % self.tenants;
                for _ in 0..=count % 8 {
                    self.stage(tenant)?;
                }
            }
            Op::Poll => {
                self.poll()?;
                self.check_work_conserving()?;
            }
            Op::Finish { pick, outcome } => self.finish(pick, outcome)?,
            Op::FinishLost { pick } => self.finish_lost(pick)?,
            Op::Advance { ms } => {
                self.now = self.now + Duration::from_millis(u64::from(ms));
                self.engine.handle_timeout(self.now);
                self.drain()?;
            }
            Op::AdvanceToTimeout => {
                if let Some(at) = self.engine.poll_timeout() {
                    self.now = self.now.max(at);
                    self.engine.handle_timeout(self.now);
                    self.drain()?;
                }
            }
            Op::Flush { deadline_ms } | Op::Settle { deadline_ms } => {
                let flush = matches!(op, Op::Flush { .. });
                if flush {
                    self.flush_bound = self.next_item;
                }
                let deadline = self.now + Duration::from_millis(u64::from(deadline_ms));
                let check = self.wait_check(deadline);
                let id = if flush {
                    self.engine.flush(self.now, deadline)
                } else {
                    self.engine.settle(self.now, deadline)
                };
                self.waits.insert(id, check);
                self.wait_deadlines.insert((deadline, id));
                self.drain()?;
            }
            Op::Shutdown { deadline_ms } => {
                let deadline = self.now + Duration::from_millis(u64::from(deadline_ms));
                let check = self.wait_check(deadline);
                let first = !self.engine.is_shutting_down();
                let id = self.engine.shutdown(self.now, deadline);
                if first {
                    self.flush_bound = self.next_item;
                    self.shutdown_first = Some(id);
                    self.shutdown_deadline = Some(deadline);
                    self.waits.insert(id, check);
                } else if let Some(d) = self.shutdown_deadline.as_mut() {
                    if !self.shutdown_done {
                        *d = (*d).min(deadline);
                    }
                }
                self.drain()?;
            }
            Op::Abandon => {
                let held = self.engine.abandon(self.now);
                self.abandoned = true;
                self.drain()?;
                for (tenant, items) in held {
                    for i in items {
                        self.expect(
                            self.fate(i) == Some(Fate::Lost) && self.tenant_of(i) == Some(tenant),
                            "S-A7",
                            || format!("abandon handed back item {i} not counted lost"),
                        )?;
                    }
                }
            }
        }
        self.check()
    }

    /// Drives the engine with a healthy sink until nothing is pending, for
    /// at most `max_steps` ops: the liveness half of the checker (I6).
    ///
    /// # Errors
    /// A [`Violation`] of I6 if items are still pending after `max_steps`,
    /// or any safety violation on the way.
    pub fn drain_healthy(&mut self, max_steps: usize) -> Result<(), Violation> {
        self.drain_healthy_with(max_steps, |_| {})
    }

    /// [`drain_healthy`](Self::drain_healthy), calling `on_write` with each
    /// write just before it is finished as written (a world keeping its own
    /// datastore records the commit there).
    ///
    /// # Errors
    /// As [`drain_healthy`](Self::drain_healthy).
    pub fn drain_healthy_with(
        &mut self,
        max_steps: usize,
        mut on_write: impl FnMut(&Write<u8, u64>),
    ) -> Result<(), Violation> {
        for _ in 0..max_steps {
            if self.engine.pending() == 0 && self.in_flight.is_empty() {
                return Ok(());
            }
            if let Some(w) = self.in_flight.first() {
                on_write(w);
                self.apply(Op::Finish {
                    pick: 0,
                    outcome: OpOutcome::Written,
                })?;
            } else {
                self.apply(Op::Poll)?;
                if self.in_flight.is_empty() {
                    self.apply(Op::AdvanceToTimeout)?;
                }
            }
        }
        Err(self.violation(
            "I6",
            format!(
                "{} items still pending after {max_steps} healthy steps",
                self.engine.pending()
            ),
        ))
    }

    // ----- ops ----------------------------------------------------------

    fn stage(&mut self, tenant: u8) -> Result<(), Violation> {
        let id = self.next_item;
        self.next_item += 1;
        let pending_before = self.engine.pending();
        let tenant_pending = self.tenant_pending[usize::from(tenant)];
        let staged = self.engine.stage(self.now, tenant, id);
        self.tenant_of.push(tenant);
        self.settled.push();
        let w = if self.weighs { weight_of(id) } else { 0 };
        match staged {
            Staged::Accepted => {
                self.expect(!self.engine.is_shutting_down(), "S-W9", || {
                    format!("item {id} accepted after the fence")
                })?;
                self.expect(
                    self.config
                        .tenant_capacity()
                        .is_none_or(|c| tenant_pending < c),
                    "S-B7",
                    || format!("item {id} accepted with tenant {tenant} at its quota"),
                )?;
                self.new_fate(Fate::Pending);
                self.tenant_pending[usize::from(tenant)] += 1;
                let queue = self.waiting.entry(tenant).or_default();
                if queue.is_empty() {
                    self.linger_from[usize::from(tenant)] = self.now;
                }
                queue.push_back(id);
                self.waiting_bytes[usize::from(tenant)] += weight_of(id);
                self.pending_bytes += w;
            }
            Staged::Dropped(reason) => {
                let cause = match reason {
                    DropReason::BufferFull => {
                        self.config
                            .capacity()
                            .is_some_and(|c| pending_before >= c as u64)
                            || self
                                .config
                                .capacity_bytes()
                                .is_some_and(|c| self.pending_bytes + w > c)
                    }
                    DropReason::TenantFull => self
                        .config
                        .tenant_capacity()
                        .is_some_and(|c| tenant_pending >= c),
                    // The engine alone has no journal: it never refuses
                    // for one.
                    DropReason::SinkError | DropReason::EncodeFailed | DropReason::JournalFull => {
                        false
                    }
                };
                self.expect(cause, "I5", || {
                    format!("item {id} dropped under {reason} without its cause")
                })?;
                self.new_fate(Fate::Dropped);
                self.settled.add(id, Fate::Dropped as usize - 1);
            }
            Staged::Refused => {
                self.expect(self.engine.is_shutting_down(), "I5", || {
                    format!("item {id} refused while open")
                })?;
                self.new_fate(Fate::Lost);
                self.settled.add(id, Fate::Lost as usize - 1);
            }
        }
        self.drain()
    }

    fn poll(&mut self) -> Result<(), Violation> {
        while let Some(w) = self.engine.poll_write(self.now) {
            self.stats.attempts += 1;
            w.hash(&mut self.hasher);
            if let Some(t) = self.trace.as_mut() {
                t.push(format!(
                    "{} write {} tenant {} attempt {} items {:?}",
                    self.now, w.id, w.tenant, w.attempt, w.items
                ));
            }
            self.check_write(&w)?;
            self.in_flight.push(w);
        }
        self.drain()
    }

    fn check_write(&mut self, w: &Write<u8, u64>) -> Result<(), Violation> {
        self.expect(!self.is_finished(), "I8", || {
            format!("write {} started after shutdown or abandon", w.id)
        })?;
        self.expect(
            self.in_flight.len() < self.config.concurrency(),
            "I4",
            || {
                format!(
                    "write {} exceeds concurrency {}",
                    w.id,
                    self.config.concurrency()
                )
            },
        )?;
        self.expect(
            !self.in_flight.iter().any(|o| o.tenant == w.tenant),
            "I4",
            || format!("tenant {} has two writes in flight", w.tenant),
        )?;
        self.expect(
            w.deadline == self.config.write_timeout().map(|t| self.now + t),
            "S-B3",
            || format!("write {} deadline {:?}", w.id, w.deadline),
        )?;
        self.expect(!w.items.is_empty(), "S-W4", || {
            format!("write {} is empty", w.id)
        })?;
        if w.attempt == 1 {
            self.expect(!self.slices.contains_key(&w.id), "I2", || {
                format!("write id {} reused", w.id)
            })?;
            let queue = self.waiting.entry(w.tenant).or_default();
            let n = w.items.len();
            let prefix: Vec<u64> = queue.iter().take(n).copied().collect();
            let whole = queue.len();
            queue.drain(..n.min(whole));
            let next = queue.front().copied();
            if next.is_some() {
                // Items left behind restart the linger clock (S-A3).
                self.linger_from[usize::from(w.tenant)] = self.now;
            }
            let taken: u64 = w.items.iter().map(|i| weight_of(*i)).sum();
            let wb = &mut self.waiting_bytes[usize::from(w.tenant)];
            *wb = wb.saturating_sub(taken);
            self.expect(prefix == w.items, "S-W3", || {
                format!(
                    "write {} of tenant {} carries {:?}, staging order says {:?}",
                    w.id, w.tenant, w.items, prefix
                )
            })?;
            if let Some(m) = self.config.max_batch() {
                self.expect(n <= m, "S-W4", || {
                    format!("write {} has {n} > max_batch {m}", w.id)
                })?;
            }
            // A batch is as large as the limits allow (S-W4, S-B5): the whole
            // backlog, or up to `max_batch` items, or until the next item
            // would pass `max_batch_bytes`.
            let item_room = self.config.max_batch().is_none_or(|m| n < m);
            if let Some(m) = self.config.max_batch_bytes() {
                let bytes: u64 = w.items.iter().map(|i| weight_of(*i)).sum();
                self.expect(n == 1 || bytes <= m, "S-B5", || {
                    format!("write {} has {bytes} bytes > {m}", w.id)
                })?;
                let next_fits = next.is_some_and(|i| bytes + weight_of(i) <= m);
                self.expect(!(item_room && next_fits), "S-W4", || {
                    format!(
                        "write {} took {n} items ({bytes} bytes) though the next fits {m} bytes",
                        w.id
                    )
                })?;
            } else {
                self.expect(!item_room || n == whole, "S-W4", || {
                    format!("write {} took {n} of a backlog of {whole}", w.id)
                })?;
            }
            self.slices.insert(
                w.id,
                Slice {
                    tenant: w.tenant,
                    items: w.items.clone(),
                    attempts: 1,
                    retry_not_before: None,
                    first_started: self.now,
                },
            );
        } else {
            let now = self.now;
            let Some(s) = self.slices.get_mut(&w.id) else {
                return Err(self.violation("I2", format!("retry of unknown write {}", w.id)));
            };
            let same = s.items == w.items && s.tenant == w.tenant;
            let attempt_ok = w.attempt == s.attempts + 1;
            let not_before = s.retry_not_before.take();
            s.attempts = w.attempt;
            self.expect(same, "I2", || {
                format!("write {} retried with another slice", w.id)
            })?;
            self.expect(attempt_ok, "I2", || {
                format!("write {} attempt numbering", w.id)
            })?;
            self.expect(not_before.is_some_and(|t| now >= t), "I7", || {
                format!("write {} retried at {now} before {not_before:?}", w.id)
            })?;
        }
        Ok(())
    }

    fn finish(&mut self, pick: u8, outcome: OpOutcome) -> Result<(), Violation> {
        if self.in_flight.is_empty() {
            return Ok(());
        }
        let w = self
            .in_flight
            .remove(usize::from(pick) % self.in_flight.len());
        let id = w.id;
        if let OpOutcome::Discard(n) = outcome {
            self.discard.insert(id, usize::from(n));
        }
        let outcome = Outcome::from(outcome);
        if !matches!(outcome, Outcome::Written { .. }) {
            *self.stats.faults.entry(fault_name(outcome)).or_default() += 1;
        }
        let given_up = self.given_up.remove(&id);
        let len = w.items.len();
        if given_up {
            self.slices.remove(&id);
            if matches!(outcome, Outcome::Written { .. }) {
                // In the store after all: counted lost, not handed back (S-B6).
                self.given_up_task_lost += len as u64;
            }
        }
        let done = match self.engine.finish(self.now, w, outcome) {
            Ok(done) => done,
            Err(e) => return Err(self.violation("S-C2", format!("finish refused: {e}"))),
        };
        // The engine hands back what it is done with: everything but a
        // retry's slice or a given-up write's dead letters (S-C2).
        let kept = given_up && !matches!(outcome, Outcome::Written { .. });
        if kept {
            self.expect(done.is_empty(), "S-B6", || {
                format!("write {id} handed back as a dead letter and returned")
            })?;
        }
        self.drain()
    }

    fn finish_lost(&mut self, pick: u8) -> Result<(), Violation> {
        if self.in_flight.is_empty() {
            return Ok(());
        }
        let w = self
            .in_flight
            .remove(usize::from(pick) % self.in_flight.len());
        *self.stats.faults.entry("join_failed").or_default() += 1;
        let given_up = self.given_up.remove(&w.id);
        if given_up {
            self.given_up_task_lost += w.items.len() as u64;
        }
        let slice = self.slices.remove(&w.id);
        if !self.engine.finish_lost(self.now, w.id) {
            return Err(self.violation("S-W13", format!("write {} not in flight", w.id)));
        }
        if !given_up {
            if let Some(s) = slice {
                self.set_fates(&s.items, Fate::Lost);
            }
        }
        self.drain()
    }

    // ----- events -------------------------------------------------------

    fn drain(&mut self) -> Result<(), Violation> {
        while let Some(ev) = self.engine.poll_event() {
            ev.hash(&mut self.hasher);
            if let Some(t) = self.trace.as_mut() {
                t.push(format!("{}   {}", self.now, short_event(&ev)));
                match &ev {
                    Event::Lost {
                        tenant,
                        items,
                        reason,
                        ..
                    } => self.losses.push(Loss {
                        at: self.now,
                        tenant: *tenant,
                        items: *items,
                        reason: reason.as_str(),
                        dropped: false,
                    }),
                    Event::Dropped {
                        tenant,
                        items,
                        reason,
                        ..
                    } => self.losses.push(Loss {
                        at: self.now,
                        tenant: *tenant,
                        items: *items,
                        reason: reason.as_str(),
                        dropped: true,
                    }),
                    _ => {}
                }
            }
            match ev {
                Event::Written { id, items, .. } => {
                    let Some(s) = self.slices.remove(&id) else {
                        return Err(self.violation("I2", format!("unknown write {id} written")));
                    };
                    if s.items.len() != items {
                        return Err(self.violation("S-C2", format!("write {id} size changed")));
                    }
                    let d = self.discard.remove(&id).unwrap_or(0).min(items);
                    self.set_fates(&s.items[..items - d], Fate::Written);
                    self.set_fates(&s.items[items - d..], Fate::Lost);
                    self.written
                        .entry(s.tenant)
                        .or_default()
                        .extend_from_slice(&s.items[..items - d]);
                }
                Event::AttemptFailed {
                    id, next, failure, ..
                } => {
                    self.discard.remove(&id);
                    match next {
                        Next::RetryIn(wait) => {
                            self.expect(
                                self.config.error_policy() == ErrorPolicy::Retry,
                                "S-A5",
                                || format!("write {id} retried under the drop policy"),
                            )?;
                            self.expect(wait <= self.config.max_backoff(), "S-W7", || {
                                format!("backoff {wait:?} above the cap")
                            })?;
                            self.expect(failure != crate::core::Failure::Rejected, "S-A5", || {
                                format!("write {id} retried after a terminal rejection")
                            })?;
                            let now = self.now;
                            if let Some(s) = self.slices.get(&id) {
                                let attempts = s.attempts;
                                let first = s.first_started;
                                self.expect(
                                    self.config.max_attempts().is_none_or(|m| attempts < m),
                                    "S-B2",
                                    || format!("write {id} retried after {attempts} attempts"),
                                )?;
                                self.expect(
                                    self.config
                                        .max_retry_duration()
                                        .is_none_or(|d| now - first < d),
                                    "S-B2",
                                    || format!("write {id} retried past max_retry_duration"),
                                )?;
                                let (lo, hi) = self.backoff_range(attempts);
                                self.expect(lo <= wait && wait <= hi, "S-W7", || {
                                    format!(
                                        "write {id} waits {wait:?} after {attempts} failures, \
                                         expected {lo:?}..={hi:?}"
                                    )
                                })?;
                            }
                            if let Some(s) = self.slices.get_mut(&id) {
                                s.retry_not_before = Some(now + wait);
                            }
                        }
                        Next::Dropped => {
                            self.expect(
                                self.config.error_policy() == ErrorPolicy::Drop,
                                "I5",
                                || format!("write {id} dropped under the retry policy"),
                            )?;
                            if let Some(s) = self.slices.remove(&id) {
                                self.set_fates(&s.items, Fate::Dropped);
                            }
                        }
                        Next::Lost => {
                            let s = self.slices.remove(&id);
                            let cause = failure == crate::core::Failure::Rejected
                                || s.as_ref().is_some_and(|s| {
                                    self.config.max_attempts().is_some_and(|m| s.attempts >= m)
                                        || self
                                            .config
                                            .max_retry_duration()
                                            .is_some_and(|d| self.now - s.first_started >= d)
                                });
                            self.expect(cause, "I5", || {
                                format!("write {id} lost without a terminal rejection or limit")
                            })?;
                            if let Some(s) = s {
                                self.set_fates(&s.items, Fate::Lost);
                            }
                        }
                    }
                }
                Event::Lost { items, reason, .. } => {
                    self.lost_seen[LostReason::ALL
                        .iter()
                        .position(|r| *r == reason)
                        .unwrap_or(0)] += items;
                    match reason {
                        LostReason::Shutdown => {
                            self.expect(self.engine.is_shutting_down(), "I5", || {
                                "lost under shutdown while open".to_string()
                            })?
                        }
                        LostReason::Deadline => {
                            self.expect(
                                self.shutdown_deadline.is_some_and(|d| self.now >= d),
                                "I5",
                                || format!("lost under deadline at {} before it", self.now),
                            )?;
                            self.mass_loss()?;
                        }
                        LostReason::Abandoned => {
                            self.expect(self.abandoned, "I5", || {
                                "lost under abandoned without abandon".to_string()
                            })?;
                            self.mass_loss()?;
                        }
                        _ => {}
                    }
                }
                Event::Dropped { items, reason, .. } => {
                    self.dropped_seen[DropReason::ALL
                        .iter()
                        .position(|r| *r == reason)
                        .unwrap_or(0)] += items;
                }
                Event::CancelInFlight => {
                    self.cancel_requests += 1;
                    for w in &self.in_flight {
                        self.given_up.insert(w.id);
                    }
                }
                Event::WaitDone { id, report } => self.check_answer(id, report, None)?,
                Event::ShutdownDone { id, report } => {
                    self.check_answer(id, report.report, Some((report.first, report.unwritten)))?;
                }
            }
        }
        Ok(())
    }

    /// A deadline or abandon gave up everything pending, in one engine call.
    fn mass_loss(&mut self) -> Result<(), Violation> {
        {
            // A deadline or abandon gives up everything pending at once.
            self.expect(self.engine.pending() == 0, "S-W9", || {
                format!("{} still pending after the deadline", self.engine.pending())
            })?;
            let pending: Vec<u64> = self.pending_items();
            self.set_fates(&pending, Fate::Lost);
            for q in self.waiting.values_mut() {
                q.clear();
            }
            self.waiting_bytes.iter_mut().for_each(|b| *b = 0);
            // Retry slices and in-flight slices are settled too.
            let ids: Vec<WriteId> = self.slices.keys().copied().collect();
            for id in ids {
                if !self.in_flight.iter().any(|w| w.id == id) {
                    self.slices.remove(&id);
                }
            }
        }
        Ok(())
    }

    #[allow(clippy::type_complexity)]
    fn check_answer(
        &mut self,
        id: WaitId,
        report: Report,
        shutdown: Option<(bool, Vec<(u8, Vec<u64>)>)>,
    ) -> Result<(), Violation> {
        if let Some((first, unwritten)) = &shutdown {
            self.stats.shutdowns += 1;
            self.shutdown_done = true;
            if !first {
                self.expect(
                    report.lost == 0 && report.written == 0 && unwritten.is_empty(),
                    "S-W9",
                    || "a joining shutdown caller reported a loss".to_string(),
                )?;
                return Ok(());
            }
            let mut handed_back = 0u64;
            for (tenant, items) in unwritten {
                for i in items {
                    self.expect(
                        self.fate(*i) == Some(Fate::Lost) && self.tenant_of(*i) == Some(*tenant),
                        "S-B6",
                        || format!("dead letter {i} of tenant {tenant} not counted lost"),
                    )?;
                }
                let mut sorted = items.clone();
                handed_back += items.len() as u64;
                sorted.sort_unstable();
                self.expect(&sorted == items, "S-B6", || {
                    format!("dead letters of tenant {tenant} out of order: {items:?}")
                })?;
            }
            // Every item given up at the deadline (or by an abandon during
            // the shutdown) is handed back, except those of a given-up write
            // whose task was lost or that came back written (S-B6).
            let c = self.engine.counters();
            let expected = (c.lost_for(LostReason::Deadline) + c.lost_for(LostReason::Abandoned))
                .saturating_sub(self.given_up_task_lost);
            self.expect(handed_back == expected, "S-B6", || {
                format!("{handed_back} dead letters handed back, {expected} items given up")
            })?;
        } else {
            self.stats.waits_answered += 1;
        }
        let Some(w) = self.waits.remove(&id) else {
            return Err(self.violation("S-A4", format!("answer to unknown wait {id:?}")));
        };
        self.wait_deadlines.remove(&(w.deadline, id));
        // Of the items pending at the call (staged before it, not settled
        // then), how many settled each way since.
        let below = self.settled.prefix(w.bound as usize);
        let since: Vec<u64> = (0..3).map(|f| below[f] - w.settled_before[f]).collect();
        let expected = Report {
            written: since[0],
            dropped: since[1],
            lost: since[2],
            pending: w.pending - since.iter().sum::<u64>(),
            deadline_passed: report.deadline_passed,
        };
        self.expect(report == expected, "S-A4", || {
            format!("wait {id:?} reported {report:?}, its items say {expected:?}")
        })?;
        self.expect(
            report.deadline_passed || report.pending == 0,
            "S-A4",
            || format!("wait {id:?} answered early with items pending"),
        )?;
        self.expect(
            !report.deadline_passed
                || self.now
                    >= w.deadline.min(
                        self.shutdown_deadline
                            .filter(|_| shutdown.is_some())
                            .unwrap_or(Time::MAX),
                    ),
            "S-W15",
            || format!("wait {id:?} says its deadline passed at {}", self.now),
        )?;
        Ok(())
    }

    // ----- checks -------------------------------------------------------

    fn check(&mut self) -> Result<(), Violation> {
        // Items the engine let go of are already counted lost or dropped
        // (the engine drops none itself, so the driver can drop them
        // outside its lock).
        for id in self.engine.take_released() {
            let fate = self.fate(id);
            self.expect(
                matches!(fate, Some(Fate::Lost | Fate::Dropped)),
                "I5",
                || format!("the engine released item {id}, whose fate is {fate:?}"),
            )?;
        }
        let c = self.engine.counters().clone();
        let model = self.model;
        self.expect(c.balanced(), "I3", || format!("counters unbalanced: {c:?}"))?;
        self.expect(c.staged == self.fate.len() as u64, "I3", || {
            format!(
                "staged {} but the harness staged {}",
                c.staged,
                self.fate.len()
            )
        })?;
        self.expect(
            [c.pending, c.written, c.dropped_total(), c.lost_total()] == model,
            "I3",
            || format!("counters {c:?} but the harness counts (pending, written, dropped, lost) {model:?}"),
        )?;
        self.expect(
            c.lost == self.lost_seen && c.dropped == self.dropped_seen,
            "I3",
            || {
                format!(
                    "events say lost {:?} dropped {:?}, counters say {:?} {:?}",
                    self.lost_seen, self.dropped_seen, c.lost, c.dropped
                )
            },
        )?;
        let last = &self.last;
        let monotonic = c.staged >= last.staged
            && c.written >= last.written
            && c.writes >= last.writes
            && c.attempts >= last.attempts
            && c.failed_attempts >= last.failed_attempts
            && c.lost.iter().zip(last.lost).all(|(a, b)| *a >= b)
            && c.dropped.iter().zip(last.dropped).all(|(a, b)| *a >= b);
        self.expect(monotonic, "S-W14", || "a counter decreased".to_string())?;
        if self.weighs {
            // Bytes of pending items, kept as fates change.
            let bytes = self.pending_bytes;
            self.expect(self.engine.pending_bytes() == bytes, "I3", || {
                format!("pending bytes {} vs {bytes}", self.engine.pending_bytes())
            })?;
            if let Some(cap) = self.config.capacity_bytes() {
                self.expect(bytes <= cap, "S-B5", || {
                    format!("{bytes} bytes pending > {cap}")
                })?;
            }
        }
        // S-W15: the deadline bounds every wait.
        if let Some(&(deadline, id)) = self.wait_deadlines.first() {
            self.expect(deadline > self.now, "S-W15", || {
                format!("wait {} not answered by its deadline {deadline}", id.0)
            })?;
        }
        if let Some(deadline) = self.shutdown_deadline {
            // Once the deadline passed, only a given-up write still to come
            // back (the driver cancels it at once) may hold the answer.
            let overdue = !self.shutdown_done
                && !self.abandoned
                && deadline <= self.now
                && self.given_up.is_empty();
            self.expect(!overdue, "S-W15", || {
                format!("shutdown not answered by its deadline {deadline}")
            })?;
        }
        if let Some(cap) = self.config.capacity() {
            self.expect(c.pending <= cap as u64, "S-A1", || {
                format!("{} pending > capacity {cap}", c.pending)
            })?;
        }
        if self.is_finished() {
            self.expect(c.pending == 0, "I8", || {
                format!("{} pending after shutdown", c.pending)
            })?;
            let starts = self.engine.poll_write(self.now).is_some();
            self.expect(!starts, "I8", || {
                "a write starts after shutdown".to_string()
            })?;
        }
        self.last = c;
        Ok(())
    }

    // ----- helpers ------------------------------------------------------

    /// After a poll with a concurrency slot free, no tenant may be left
    /// with a write it is entitled to start (S-B1, S-W8): a retry whose
    /// backoff has elapsed (S-W7), or a waiting backlog that need not wait
    /// for company: no linger, a flush or shutdown covering its oldest item
    /// (S-A4, S-W9), its linger elapsed or a full batch (S-A3). Catches lost
    /// wake-ups and flushes that do not send at once.
    fn check_work_conserving(&self) -> Result<(), Violation> {
        if self.engine.is_closed()
            || self.is_finished()
            || self.in_flight.len() >= self.config.concurrency()
        {
            return Ok(());
        }
        let mut busy = [false; 256];
        for w in &self.in_flight {
            busy[usize::from(w.tenant)] = true;
        }
        for (id, s) in &self.slices {
            if busy[usize::from(s.tenant)] {
                continue;
            }
            if let Some(at) = s.retry_not_before {
                self.expect(at > self.now, "S-W7", || {
                    format!(
                        "write {id} of tenant {} was due for a retry at {at}, not started with a slot free",
                        s.tenant
                    )
                })?;
                busy[usize::from(s.tenant)] = true;
            }
        }
        let linger = self.config.linger();
        for (&tenant, queue) in &self.waiting {
            let t = usize::from(tenant);
            let Some(&front) = queue.front() else {
                continue;
            };
            if busy[t] {
                continue;
            }
            let why = if linger.is_zero() {
                Some("no linger")
            } else if self.engine.is_shutting_down() {
                Some("a shutdown")
            } else if front < self.flush_bound {
                Some("a flush")
            } else if self.linger_from[t] + linger <= self.now {
                Some("its linger elapsed")
            } else if self.config.max_batch().is_some_and(|m| queue.len() >= m)
                || self
                    .config
                    .max_batch_bytes()
                    .is_some_and(|m| self.waiting_bytes[t] >= m)
            {
                Some("a full batch")
            } else {
                None
            };
            if let Some(why) = why {
                return Err(self.violation(
                    "S-B1",
                    format!(
                        "tenant {tenant} has {} items waiting (oldest {front}) and {why}, \
                         but no write started with {} of {} slots busy",
                        queue.len(),
                        self.in_flight.len(),
                        self.config.concurrency()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The range a backoff after `failures` failures in a row must fall in
    /// (S-W7, S-B2): `initial * 2^(failures-1)` capped at `max_backoff`,
    /// shortened by at most the jitter's share.
    fn backoff_range(&self, failures: u32) -> (Duration, Duration) {
        let initial = self.config.initial_backoff().as_nanos();
        let max = self.config.max_backoff().as_nanos();
        let doublings = failures.saturating_sub(1).min(64);
        let base = initial
            .checked_shl(doublings)
            .filter(|b| b >> doublings == initial)
            .map_or(max, |b| b.min(max));
        let ppm = (self.config.jitter() * 1_000_000.0).round() as u128;
        let cut = base * ppm / 1_000_000;
        let nanos = |n: u128| Duration::from_nanos(u64::try_from(n).unwrap_or(u64::MAX));
        (nanos(base - cut), nanos(base))
    }

    /// Every pending item (O(items); only for a mass loss, once a run).
    fn pending_items(&self) -> Vec<u64> {
        self.fate
            .iter()
            .enumerate()
            .filter(|(_, f)| **f == Fate::Pending)
            .map(|(i, _)| i as u64)
            .collect()
    }

    /// The check for a wait opened now, covering the items pending now.
    fn wait_check(&self, deadline: Time) -> WaitCheck {
        let [_, written, dropped, lost] = self.model;
        WaitCheck {
            bound: self.next_item,
            pending: self.model[0],
            settled_before: [written, dropped, lost],
            deadline,
        }
    }

    /// Records the fate of the item just numbered.
    fn new_fate(&mut self, fate: Fate) {
        debug_assert_eq!(self.fate.len() as u64 + 1, self.next_item);
        self.fate.push(fate);
        self.model[fate as usize] += 1;
    }

    /// Settles pending items (items already settled keep their fate) and
    /// keeps every derived count in step: O(log n) per item.
    fn set_fates(&mut self, items: &[u64], fate: Fate) {
        debug_assert_ne!(fate, Fate::Pending);
        for &i in items {
            let ix = i as usize;
            let Some(f) = self.fate.get_mut(ix) else {
                continue;
            };
            if *f != Fate::Pending {
                continue;
            }
            *f = fate;
            self.model[Fate::Pending as usize] -= 1;
            self.model[fate as usize] += 1;
            self.settled.add(i, fate as usize - 1);
            self.tenant_pending[usize::from(self.tenant_of[ix])] -= 1;
            if self.weighs {
                self.pending_bytes -= weight_of(i);
            }
        }
    }

    fn violation(&self, rule: &'static str, detail: String) -> Violation {
        Violation {
            rule,
            detail,
            step: self.step,
        }
    }

    fn expect(
        &self,
        ok: bool,
        rule: &'static str,
        detail: impl FnOnce() -> String,
    ) -> Result<(), Violation> {
        if ok {
            Ok(())
        } else {
            Err(self.violation(rule, detail()))
        }
    }
}

fn fault_name(o: Outcome) -> &'static str {
    match o {
        Outcome::Written { .. } => "written",
        Outcome::Failed => "error",
        Outcome::Panicked => "panic",
        Outcome::TimedOut => "timeout",
        Outcome::Rejected => "rejected",
        Outcome::Cancelled => "cancelled",
    }
}

/// One line for an event in a trace.
fn short_event(ev: &Event<u8, u64>) -> String {
    match ev {
        Event::Written {
            id,
            tenant,
            items,
            attempt,
            ..
        } => format!("written {id} tenant {tenant} items {items} attempt {attempt}"),
        Event::AttemptFailed {
            id,
            tenant,
            attempt,
            failure,
            next,
            ..
        } => format!(
            "failed {id} tenant {tenant} attempt {attempt} {} -> {next:?}",
            failure.as_str()
        ),
        Event::Lost {
            tenant,
            items,
            reason,
            ..
        } => format!("lost {items} tenant {tenant} reason {reason}"),
        Event::Dropped {
            tenant,
            items,
            reason,
            ..
        } => format!("dropped {items} tenant {tenant} reason {reason}"),
        Event::CancelInFlight => "cancel in-flight writes".to_string(),
        Event::WaitDone { id, report } => format!("wait {} done {report:?}", id.0),
        Event::ShutdownDone { id, report } => format!(
            "shutdown {} done first={} {:?} unwritten runs {}",
            id.0,
            report.first,
            report.report,
            report.unwritten.len()
        ),
    }
}

/// FNV-1a, 64-bit: a fixed, portable hash for trace hashes.
#[derive(Clone, Copy, Debug)]
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fate_tree_agrees_with_a_plain_count() {
        let mut tree = FateTree::default();
        let mut plain: Vec<Option<usize>> = Vec::new();
        // A fixed pseudo-random mix of stages and settles.
        let mut x = 12_345u64;
        for _ in 0..2_000 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            if plain.is_empty() || x % 3 == 0 {
                tree.push();
                plain.push(None);
            } else {
                let i = (x >> 33) as usize % plain.len();
                if plain[i].is_none() {
                    let f = (x >> 20) as usize % 3;
                    plain[i] = Some(f);
                    tree.add(i as u64, f);
                }
            }
            let n = (x >> 40) as usize % (plain.len() + 1);
            let mut want = [0u64; 3];
            for f in plain[..n].iter().flatten() {
                want[*f] += 1;
            }
            assert_eq!(tree.prefix(n), want);
        }
    }

    #[test]
    fn a_flush_is_answered_truthfully_with_the_incremental_account() {
        let config = Config::builder()
            .linger(Duration::from_millis(50))
            .build()
            .unwrap();
        let mut h = Harness::new(config, 3, false);
        h.run(&[
            Op::Stage {
                tenant: 0,
                count: 2,
            },
            Op::Stage {
                tenant: 1,
                count: 0,
            },
            Op::Flush { deadline_ms: 100 },
            Op::Poll,
            Op::Stage {
                tenant: 2,
                count: 1,
            },
            Op::Finish {
                pick: 0,
                outcome: OpOutcome::Written,
            },
            Op::Finish {
                pick: 0,
                outcome: OpOutcome::Rejected,
            },
            Op::Advance { ms: 200 },
        ])
        .unwrap();
        assert_eq!(h.stats.waits_answered, 1);
        h.drain_healthy(100).unwrap();
    }
}
