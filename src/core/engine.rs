//! The engine: every batching, retry, drop, loss, flush and shutdown
//! decision, as a sans-IO state machine (SPEC S-C1).

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::mem;

use super::accounting::{Counters, DropReason, LostReason};
use super::backlog::{Phase, Retry, Tenant, TimerKey};
use super::backoff::Backoff;
use super::config::{Config, ConfigError, ErrorPolicy};
use super::time::Time;
use super::wait::{Settled, WaitKind, Waits};
use super::write::{Event, Failure, Next, Outcome, Report, ShutdownReport, WaitId, Write, WriteId};

/// Measures an item in bytes for `max_batch_bytes` and `capacity_bytes`
/// (S-B5). It must be pure: the same item always weighs the same.
pub type Weigher<I> = Box<dyn Fn(&I) -> u64 + Send + Sync>;

/// Whether `stage` accepted the item (S-W1, S-A1). The caller need not look.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[must_use = "the decision is informational; use `let _ =` to ignore it"]
pub enum Staged {
    /// The item is pending and will be written.
    Accepted,
    /// Refused by a capacity policy; counted dropped.
    Dropped(DropReason),
    /// Refused because the outbox is shutting down or shut down; counted
    /// lost under `shutdown` (S-W9).
    Refused,
}

/// `finish` was given a write the engine does not know: a driver bug. The
/// items come back so nothing is silently leaked.
#[derive(Debug, PartialEq, Eq)]
pub struct UnknownWrite<K, I>(pub Write<K, I>);

impl<K, I> fmt::Display for UnknownWrite<K, I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "write {} is not in flight", self.0.id)
    }
}

impl<K: fmt::Debug, I: fmt::Debug> std::error::Error for UnknownWrite<K, I> {}

/// A write handed out and not yet finished.
#[derive(Debug)]
struct InFlight<K> {
    tenant: K,
    seqs: Vec<u64>,
    /// Staging seq of the slice's first item (orders dead letters).
    first_seq: u64,
    bytes: u64,
    attempt: u32,
    started: Time,
    first_started: Time,
    /// Given up by a shutdown deadline or abandon: its items are already
    /// counted lost; when they come back they go to the dead-letter hand-off.
    given_up: bool,
}

/// Lifecycle of the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Life {
    Open,
    /// The shutdown fence is up: nothing is accepted, the rest drains.
    Closing,
    /// Shut down or abandoned: nothing pending, no write starts (I8).
    Closed,
}

/// The shutdown in progress (S-W9).
#[derive(Debug)]
struct Shutdown<K, I> {
    /// The first caller's wait; its report carries the accounting.
    first: WaitId,
    /// Later callers, answered with zeros (S-W9).
    joined: Vec<WaitId>,
    /// Set once the first wait settled: the report to send when the last
    /// given-up write has come back.
    settled: Option<Report>,
    /// Dead letters: (first staging seq, tenant, items).
    unwritten: Vec<(u64, K, Vec<I>)>,
    /// The first caller has been answered.
    reported: bool,
}

/// A timer that is not a tenant's linger.
#[derive(Clone, Debug)]
enum Timer<K> {
    Backoff(K),
    Deadline(WaitId),
}

/// The outbox engine: a deterministic, sans-IO state machine (S-C1).
///
/// `K` is the tenant key (the driver uses [`TenantId`](crate::TenantId)); `I`
/// the item. Feed it inputs, each with the current [`Time`]:
/// [`stage`](Self::stage), [`finish`](Self::finish) /
/// [`finish_lost`](Self::finish_lost), [`flush`](Self::flush),
/// [`settle`](Self::settle), [`shutdown`](Self::shutdown),
/// [`abandon`](Self::abandon), [`handle_timeout`](Self::handle_timeout).
/// After every input, drain its outputs in this order:
/// 1. [`poll_write`](Self::poll_write) until `None`: writes to start;
/// 2. [`poll_event`](Self::poll_event) until `None`: what to count, log and
///    answer (including [`Event::CancelInFlight`]);
/// 3. [`poll_timeout`](Self::poll_timeout): when to call
///    [`handle_timeout`](Self::handle_timeout) next.
///
/// Every input first handles the timers due at its `now`, so a driver that
/// is late with `handle_timeout` loses nothing (S-W17). Time never runs
/// backwards: a `now` earlier than one already seen is taken as the latest
/// seen.
///
/// Cost: O(log T) per input and per write for T tenants (S-C4), plus
/// O(F log n) per settled write while F flushes wait.
pub struct Engine<K, I> {
    config: Config,
    weigher: Option<Weigher<I>>,
    backoff: Backoff,
    now: Time,
    life: Life,
    counters: Counters,
    pending_bytes: u64,
    tenants: BTreeMap<K, Tenant<I>>,
    /// Tenants ready to write, in the order they became ready (S-B1).
    ready: VecDeque<K>,
    /// Lingering tenants by deadline (S-A3), apart so a flush can release
    /// them without looking at backoffs.
    lingering: BTreeMap<TimerKey, K>,
    timers: BTreeMap<TimerKey, Timer<K>>,
    timer_seq: u64,
    in_flight: BTreeMap<WriteId, InFlight<K>>,
    next_write: u64,
    /// Staging sequence of the next accepted item.
    next_seq: u64,
    /// Items staged before this sequence skip linger (a flush asked).
    flush_floor: u64,
    waits: Waits,
    shutdown: Option<Shutdown<K, I>>,
    events: VecDeque<Event<K, I>>,
}

impl<K: fmt::Debug, I> fmt::Debug for Engine<K, I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Engine")
            .field("now", &self.now)
            .field("life", &self.life)
            .field("counters", &self.counters)
            .field("tenants", &self.tenants.len())
            .field("ready", &self.ready.len())
            .field("in_flight", &self.in_flight.len())
            .finish_non_exhaustive()
    }
}

impl<K: Ord + Clone, I> Engine<K, I> {
    /// An engine whose items are not weighed.
    ///
    /// # Errors
    /// [`ConfigError::WeigherRequired`] if the config sets a byte limit;
    /// use [`Engine::with_weigher`].
    pub fn new(config: Config) -> Result<Self, ConfigError> {
        Self::build(config, None)
    }

    /// An engine that weighs items with `weigher` for the byte limits (S-B5).
    ///
    /// # Errors
    /// None today; the `Result` keeps the constructors alike.
    pub fn with_weigher(
        config: Config,
        weigher: impl Fn(&I) -> u64 + Send + Sync + 'static,
    ) -> Result<Self, ConfigError> {
        Self::build(config, Some(Box::new(weigher)))
    }

    fn build(config: Config, weigher: Option<Weigher<I>>) -> Result<Self, ConfigError> {
        if weigher.is_none() {
            if config.max_batch_bytes.is_some() {
                return Err(ConfigError::WeigherRequired {
                    field: "max_batch_bytes",
                });
            }
            if config.capacity_bytes.is_some() {
                return Err(ConfigError::WeigherRequired {
                    field: "capacity_bytes",
                });
            }
        }
        let backoff = Backoff::new(
            config.initial_backoff,
            config.max_backoff,
            config.jitter_ppm,
            config.seed,
        );
        Ok(Engine {
            config,
            weigher,
            backoff,
            now: Time::ZERO,
            life: Life::Open,
            counters: Counters::default(),
            pending_bytes: 0,
            tenants: BTreeMap::new(),
            ready: VecDeque::new(),
            lingering: BTreeMap::new(),
            timers: BTreeMap::new(),
            timer_seq: 0,
            in_flight: BTreeMap::new(),
            next_write: 1,
            next_seq: 0,
            flush_floor: 0,
            waits: Waits::default(),
            shutdown: None,
            events: VecDeque::new(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// A snapshot of the counters (S-W14).
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Items accepted and not yet written, lost or dropped (S-W14).
    pub fn pending(&self) -> u64 {
        self.counters.pending
    }

    /// Bytes pending, as the weigher measures them (0 without one).
    pub fn pending_bytes(&self) -> u64 {
        self.pending_bytes
    }

    /// Writes handed out and not yet finished, given-up ones included.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Tenants the engine holds state for (waiting, in flight or backing off).
    pub fn tenants(&self) -> usize {
        self.tenants.len()
    }

    /// Whether the shutdown fence is up (S-W9).
    pub fn is_shutting_down(&self) -> bool {
        self.life != Life::Open
    }

    /// Whether the engine is shut down or abandoned: nothing pending, no
    /// write starts (I8).
    pub fn is_closed(&self) -> bool {
        self.life == Life::Closed
    }

    /// The latest time the engine has seen.
    pub fn now(&self) -> Time {
        self.now
    }

    // ----- inputs -------------------------------------------------------

    /// Stages one item for `tenant` (S-W1). Never waits and never fails:
    /// the item is pending on return, or counted dropped (S-A1, S-B5, S-B7)
    /// or lost under `shutdown` (S-W9), as the result says.
    pub fn stage(&mut self, now: Time, tenant: K, item: I) -> Staged {
        self.advance(now);
        self.counters.staged += 1;
        if self.life != Life::Open {
            let log = self.counters.add_lost(LostReason::Shutdown, 1);
            self.events.push_back(Event::Lost {
                tenant,
                items: 1,
                reason: LostReason::Shutdown,
                log,
            });
            return Staged::Refused;
        }
        let weight = self.weigh(&item);
        let full = self
            .config
            .capacity
            .is_some_and(|cap| self.counters.pending >= cap as u64)
            || self
                .config
                .capacity_bytes
                .is_some_and(|cap| self.pending_bytes.saturating_add(weight) > cap);
        let reason = if full {
            Some(DropReason::BufferFull)
        } else if self
            .config
            .tenant_capacity
            .is_some_and(|cap| self.tenants.get(&tenant).is_some_and(|t| t.pending >= cap))
        {
            Some(DropReason::TenantFull)
        } else {
            None
        };
        if let Some(reason) = reason {
            let log = self.counters.add_dropped(reason, 1);
            self.events.push_back(Event::Dropped {
                tenant,
                items: 1,
                reason,
                log,
            });
            return Staged::Dropped(reason);
        }

        let seq = self.next_seq;
        self.next_seq += 1;
        self.counters.pending += 1;
        self.pending_bytes += weight;
        let now = self.now;
        let t = self
            .tenants
            .entry(tenant.clone())
            .or_insert_with(|| Tenant::new(now));
        if t.items.is_empty() {
            t.waiting_since = now;
        }
        t.items.push_back(item);
        t.seqs.push_back(seq);
        t.bytes += weight;
        t.pending += 1;
        let phase = t.phase;
        match phase {
            Phase::Idle => self.schedule(tenant),
            Phase::Lingering(key) if self.batch_full(&tenant) => {
                self.lingering.remove(&key);
                self.make_ready(tenant);
            }
            _ => {}
        }
        Staged::Accepted
    }

    /// Hands out the next write to start, if a concurrency slot is free and
    /// a tenant is ready (S-W3, S-W4, S-B1). Call until `None` after every
    /// input.
    pub fn poll_write(&mut self, now: Time) -> Option<Write<K, I>> {
        self.advance(now);
        if self.life == Life::Closed || self.in_flight.len() >= self.config.concurrency {
            return None;
        }
        let tenant = self.ready.pop_front()?;
        let now = self.now;
        let id;
        let t = self.tenants.get_mut(&tenant).expect("ready tenant exists");
        let (items, seqs, bytes, attempt, first_started) = match t.retry.take() {
            Some(r) => {
                id = r.id;
                (r.items, r.seqs, r.bytes, r.attempts + 1, r.first_started)
            }
            None => {
                id = WriteId(self.next_write);
                self.next_write += 1;
                let weigher = self.weigher.as_deref();
                let (items, seqs, bytes) = t.cut_batch(
                    self.config.max_batch,
                    self.config.max_batch_bytes,
                    |i| weigher.map_or(0, |w| w(i)),
                    now,
                );
                (items, seqs, bytes, 1, now)
            }
        };
        debug_assert!(!items.is_empty());
        t.phase = Phase::InFlight(id);
        self.counters.attempts += 1;
        self.in_flight.insert(
            id,
            InFlight {
                tenant: tenant.clone(),
                first_seq: seqs[0],
                seqs,
                bytes,
                attempt,
                started: now,
                first_started,
                given_up: false,
            },
        );
        Some(Write {
            id,
            tenant,
            items,
            attempt,
            deadline: self.config.write_timeout.map(|d| now + d),
        })
    }

    /// Takes back a write with its outcome (S-C2): the items are settled,
    /// kept for a retry with the identical slice (S-W5), dropped (S-A5) or
    /// lost (S-A5, S-B2, S-W12).
    ///
    /// # Errors
    /// [`UnknownWrite`], carrying the write back, if it is not in flight.
    pub fn finish(
        &mut self,
        now: Time,
        write: Write<K, I>,
        outcome: Outcome,
    ) -> Result<(), Box<UnknownWrite<K, I>>> {
        self.advance(now);
        let Some(rec) = self.in_flight.remove(&write.id) else {
            return Err(Box::new(UnknownWrite(write)));
        };
        if rec.given_up {
            self.dead_letter(rec.first_seq, rec.tenant, write.items);
            self.forget_if_empty(&write.tenant);
            self.maybe_finish_shutdown();
            return Ok(());
        }
        let now = self.now;
        let latency = now - rec.started;
        let n = write.items.len();
        let failure = match outcome {
            Outcome::Written { discarded } => {
                let discarded = discarded.min(n);
                let written = (n - discarded) as u64;
                self.counters.written += written;
                self.counters.writes += 1;
                self.events.push_back(Event::Written {
                    id: write.id,
                    tenant: rec.tenant.clone(),
                    items: n,
                    attempt: rec.attempt,
                    latency,
                });
                if discarded > 0 {
                    self.count_lost(&rec.tenant, LostReason::Discarded, discarded as u64);
                }
                self.settle_slice(&rec.tenant, &rec.seqs, rec.bytes, |i| {
                    if i < n - discarded {
                        Settled::Written
                    } else {
                        Settled::Lost
                    }
                });
                self.schedule_after_write(rec.tenant);
                return Ok(());
            }
            Outcome::Failed => Failure::Error,
            Outcome::Panicked => Failure::Panic,
            Outcome::TimedOut => Failure::Timeout,
            Outcome::Rejected => Failure::Rejected,
            Outcome::Cancelled => Failure::Cancelled,
        };
        self.counters.failed_attempts += 1;
        let exhausted = self
            .config
            .max_attempts
            .is_some_and(|max| rec.attempt >= max)
            || self
                .config
                .max_retry_duration
                .is_some_and(|max| now - rec.first_started >= max);
        let next = if failure == Failure::Rejected {
            self.count_lost(&rec.tenant, LostReason::Terminal, n as u64);
            Next::Lost
        } else if self.config.error_policy == ErrorPolicy::Drop {
            self.count_dropped(&rec.tenant, DropReason::SinkError, n as u64);
            Next::Dropped
        } else if exhausted {
            self.count_lost(&rec.tenant, LostReason::RetriesExhausted, n as u64);
            Next::Lost
        } else {
            Next::RetryIn(self.backoff.wait(rec.attempt))
        };
        self.events.push_back(Event::AttemptFailed {
            id: write.id,
            tenant: rec.tenant.clone(),
            items: n,
            attempt: rec.attempt,
            failure,
            next,
            latency,
        });
        match next {
            Next::RetryIn(wait) => {
                let key = self.timer_key(now + wait);
                self.timers.insert(key, Timer::Backoff(rec.tenant.clone()));
                let t = self.tenants.get_mut(&rec.tenant).expect("tenant in flight");
                t.phase = Phase::BackingOff(key);
                t.retry = Some(Retry {
                    id: write.id,
                    items: write.items,
                    seqs: rec.seqs,
                    bytes: rec.bytes,
                    attempts: rec.attempt,
                    first_started: rec.first_started,
                });
            }
            Next::Dropped => {
                self.settle_slice(&rec.tenant, &rec.seqs, rec.bytes, |_| Settled::Dropped);
                self.schedule_after_write(rec.tenant);
            }
            Next::Lost => {
                self.settle_slice(&rec.tenant, &rec.seqs, rec.bytes, |_| Settled::Lost);
                self.schedule_after_write(rec.tenant);
            }
        }
        Ok(())
    }

    /// The task running write `id` ended without giving its items back
    /// (S-W13): they are counted lost under `join_failed`. Returns whether
    /// `id` was in flight.
    pub fn finish_lost(&mut self, now: Time, id: WriteId) -> bool {
        self.advance(now);
        let Some(rec) = self.in_flight.remove(&id) else {
            return false;
        };
        if rec.given_up {
            self.forget_if_empty(&rec.tenant);
            self.maybe_finish_shutdown();
            return true;
        }
        self.counters.failed_attempts += 1;
        self.count_lost(&rec.tenant, LostReason::JoinFailed, rec.seqs.len() as u64);
        self.settle_slice(&rec.tenant, &rec.seqs, rec.bytes, |_| Settled::Lost);
        self.schedule_after_write(rec.tenant);
        true
    }

    /// Handles every timer due at `now`, once each, in the order they fall
    /// due (S-W17). Every other input does this too.
    pub fn handle_timeout(&mut self, now: Time) {
        self.advance(now);
    }

    /// Starts a flush (S-A4): everything pending is sent at once, lingering
    /// batches included, never overtaking earlier items; the answer comes as
    /// [`Event::WaitDone`] when those items are settled or at `deadline`.
    pub fn flush(&mut self, now: Time, deadline: Time) -> WaitId {
        self.advance(now);
        self.release_lingering();
        self.start_wait(WaitKind::Flush, deadline)
    }

    /// Starts a settle (S-W10): like [`flush`](Self::flush) but lingering
    /// batches keep their linger. Answered by [`Event::WaitDone`].
    pub fn settle(&mut self, now: Time, deadline: Time) -> WaitId {
        self.advance(now);
        self.start_wait(WaitKind::Settle, deadline)
    }

    /// Raises the shutdown fence (S-W9): later stages are refused; what is
    /// pending drains with retries until `deadline`, then every unwritten
    /// item is lost under `deadline` and handed back (S-B6). Answered by
    /// [`Event::ShutdownDone`]. A second call joins the first (its deadline
    /// tightens the shutdown's if earlier) and is answered with zeros.
    pub fn shutdown(&mut self, now: Time, deadline: Time) -> WaitId {
        self.advance(now);
        match self.life {
            Life::Closed => {
                let id = self.waits.next_id();
                self.events.push_back(Event::ShutdownDone {
                    id,
                    report: ShutdownReport {
                        report: Report::default(),
                        first: false,
                        unwritten: Vec::new(),
                    },
                });
                id
            }
            Life::Closing => {
                let sd = self.shutdown.as_mut().expect("closing has a shutdown");
                let id = self.waits.next_id();
                sd.joined.push(id);
                let first = sd.first;
                if let Some(old) = self.waits.deadline_key(first) {
                    if deadline < old.0 {
                        self.timers.remove(&old);
                        let key = self.timer_key(deadline);
                        self.timers.insert(key, Timer::Deadline(first));
                        self.waits.set_deadline_key(first, key);
                        self.advance(self.now);
                    }
                }
                id
            }
            Life::Open => {
                self.life = Life::Closing;
                self.release_lingering();
                let id = self.waits.next_id();
                self.shutdown = Some(Shutdown {
                    first: id,
                    joined: Vec::new(),
                    settled: None,
                    unwritten: Vec::new(),
                    reported: false,
                });
                self.open_wait(id, WaitKind::Shutdown, deadline);
                id
            }
        }
    }

    /// Gives up at once (S-A7): everything pending is counted lost under
    /// `abandoned`, writes in flight are to be cancelled
    /// ([`Event::CancelInFlight`]), waits are answered, the engine closes.
    /// Returns the items the engine held (those in flight are discarded
    /// when they come back, unless a shutdown is waiting for them).
    pub fn abandon(&mut self, now: Time) -> Vec<(K, Vec<I>)> {
        self.advance(now);
        if self.life == Life::Open {
            self.life = Life::Closing;
        }
        let held = self.give_up_all(LostReason::Abandoned);
        self.close();
        held.into_iter().map(|(_, k, v)| (k, v)).collect()
    }

    // ----- outputs ------------------------------------------------------

    /// The next event to export or act on; call until `None` after every input.
    pub fn poll_event(&mut self) -> Option<Event<K, I>> {
        self.events.pop_front()
    }

    /// When the next timer falls due (linger, backoff, deadline), if any.
    /// The driver calls [`handle_timeout`](Self::handle_timeout) then.
    pub fn poll_timeout(&self) -> Option<Time> {
        let a = self.lingering.keys().next().map(|k| k.0);
        let b = self.timers.keys().next().map(|k| k.0);
        match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    // ----- time ---------------------------------------------------------

    /// Moves the clock to `now` and fires what is due, each timer once, in
    /// (instant, arming order) (S-W17).
    fn advance(&mut self, now: Time) {
        self.now = self.now.max(now);
        loop {
            let linger = self.lingering.keys().next().copied();
            let timer = self.timers.keys().next().copied();
            let due = |k: Option<TimerKey>| k.filter(|k| k.0 <= self.now);
            match (due(linger), due(timer)) {
                (Some(l), Some(t)) if l < t => self.fire_linger(l),
                (Some(l), None) => self.fire_linger(l),
                (_, Some(t)) => {
                    let timer = self.timers.remove(&t).expect("key just seen");
                    self.fire(timer);
                }
                (None, None) => return,
            }
        }
    }

    fn fire_linger(&mut self, key: TimerKey) {
        let tenant = self.lingering.remove(&key).expect("key just seen");
        self.make_ready(tenant);
    }

    fn fire(&mut self, timer: Timer<K>) {
        match timer {
            Timer::Backoff(tenant) => self.make_ready(tenant),
            Timer::Deadline(id) => {
                if self.shutdown.as_ref().is_some_and(|sd| sd.first == id) {
                    self.waits.mark_deadline_passed(id);
                    self.give_up_all(LostReason::Deadline);
                    self.close();
                } else if let Some(report) = self.waits.expire(id) {
                    self.events.push_back(Event::WaitDone { id, report });
                }
            }
        }
    }

    fn timer_key(&mut self, at: Time) -> TimerKey {
        self.timer_seq += 1;
        (at, self.timer_seq)
    }

    // ----- scheduling ---------------------------------------------------

    fn weigh(&self, item: &I) -> u64 {
        self.weigher.as_ref().map_or(0, |w| w(item))
    }

    /// Whether the tenant's waiting backlog fills a batch (S-A3).
    fn batch_full(&self, tenant: &K) -> bool {
        let t = &self.tenants[tenant];
        self.config.max_batch.is_some_and(|m| t.items.len() >= m)
            || self.config.max_batch_bytes.is_some_and(|m| t.bytes >= m)
    }

    /// Places an idle tenant that may have waiting items: ready, lingering,
    /// or forgotten when empty.
    fn schedule(&mut self, tenant: K) {
        let t = &self.tenants[&tenant];
        debug_assert_eq!(t.phase, Phase::Idle);
        let Some(&front) = t.seqs.front() else {
            if t.is_empty() {
                self.tenants.remove(&tenant);
            }
            return;
        };
        let linger_until = t.waiting_since + self.config.linger;
        let send_now = self.config.linger.is_zero()
            || self.life != Life::Open
            || front < self.flush_floor
            || linger_until <= self.now
            || self.batch_full(&tenant);
        if send_now {
            self.make_ready(tenant);
        } else {
            let key = self.timer_key(linger_until);
            self.tenants.get_mut(&tenant).expect("tenant exists").phase = Phase::Lingering(key);
            self.lingering.insert(key, tenant);
        }
    }

    fn make_ready(&mut self, tenant: K) {
        let t = self.tenants.get_mut(&tenant).expect("tenant exists");
        t.phase = Phase::Ready;
        self.ready.push_back(tenant);
    }

    /// After a write settled (not retried), the tenant's next step.
    fn schedule_after_write(&mut self, tenant: K) {
        if let Some(t) = self.tenants.get_mut(&tenant) {
            t.phase = Phase::Idle;
            if self.life == Life::Closed {
                // Given up already; nothing may start (I8).
                if t.is_empty() {
                    self.tenants.remove(&tenant);
                }
                return;
            }
            self.schedule(tenant);
        }
    }

    /// A flush or shutdown sends lingering batches at once (S-A3, S-A4), in
    /// the order their lingers would have ended.
    fn release_lingering(&mut self) {
        self.flush_floor = self.next_seq;
        for (_, tenant) in mem::take(&mut self.lingering) {
            self.make_ready(tenant);
        }
    }

    // ----- accounting ---------------------------------------------------

    fn count_lost(&mut self, tenant: &K, reason: LostReason, items: u64) {
        let log = self.counters.add_lost(reason, items);
        self.events.push_back(Event::Lost {
            tenant: tenant.clone(),
            items,
            reason,
            log,
        });
    }

    fn count_dropped(&mut self, tenant: &K, reason: DropReason, items: u64) {
        let log = self.counters.add_dropped(reason, items);
        self.events.push_back(Event::Dropped {
            tenant: tenant.clone(),
            items,
            reason,
            log,
        });
    }

    /// Items of a slice left the pending state (their counters are already
    /// moved): release pending counts and tell the waits.
    fn settle_slice(
        &mut self,
        tenant: &K,
        seqs: &[u64],
        bytes: u64,
        how: impl Fn(usize) -> Settled,
    ) {
        let n = seqs.len();
        self.counters.pending -= n as u64;
        self.pending_bytes -= bytes;
        if let Some(t) = self.tenants.get_mut(tenant) {
            t.pending -= n;
        }
        for id in self.waits.settle(seqs, how) {
            self.answer_wait(id);
        }
    }

    fn start_wait(&mut self, kind: WaitKind, deadline: Time) -> WaitId {
        let id = self.waits.next_id();
        self.open_wait(id, kind, deadline);
        id
    }

    fn open_wait(&mut self, id: WaitId, kind: WaitKind, deadline: Time) {
        let key = self.timer_key(deadline);
        let done = self
            .waits
            .open(id, kind, self.next_seq, self.counters.pending, key);
        if done {
            self.answer_wait(id);
        } else {
            self.timers.insert(key, Timer::Deadline(id));
            // A deadline already past fires now.
            self.advance(self.now);
        }
    }

    /// A wait's items are all settled (or its deadline passed): answer it.
    fn answer_wait(&mut self, id: WaitId) {
        let Some((report, key)) = self.waits.take(id) else {
            return;
        };
        self.timers.remove(&key);
        if self.shutdown.as_ref().is_some_and(|sd| sd.first == id) {
            self.close();
            self.shutdown.as_mut().expect("checked").settled = Some(report);
            self.maybe_finish_shutdown();
        } else {
            self.events.push_back(Event::WaitDone { id, report });
        }
    }

    fn forget_if_empty(&mut self, tenant: &K) {
        if let Some(t) = self.tenants.get_mut(tenant) {
            if matches!(t.phase, Phase::InFlight(_)) {
                t.phase = Phase::Idle;
            }
            if t.is_empty() {
                self.tenants.remove(tenant);
            }
        }
    }

    /// Closes the engine: no write starts from now on (I8).
    fn close(&mut self) {
        self.life = Life::Closed;
        self.ready.clear();
    }

    /// Gives up every pending item for `reason` (S-W9 deadline, S-A7):
    /// in-flight writes are marked and the driver is told to cancel them;
    /// retry slices and backlogs are taken out. The items taken out go to a
    /// shutdown still to be answered (its dead letters), or are returned as
    /// (first seq, tenant, items) when there is none.
    fn give_up_all(&mut self, reason: LostReason) -> Vec<(u64, K, Vec<I>)> {
        let mut held = Vec::new();
        let mut settle: Vec<(K, Vec<u64>, u64)> = Vec::new();
        for rec in self.in_flight.values_mut().filter(|r| !r.given_up) {
            rec.given_up = true;
            settle.push((rec.tenant.clone(), mem::take(&mut rec.seqs), rec.bytes));
        }
        if !settle.is_empty() {
            self.events.push_back(Event::CancelInFlight);
        }
        for (tenant, t) in self.tenants.iter_mut() {
            match t.phase {
                Phase::Lingering(key) => {
                    self.lingering.remove(&key);
                }
                Phase::BackingOff(key) => {
                    self.timers.remove(&key);
                }
                _ => {}
            }
            if !matches!(t.phase, Phase::InFlight(_)) {
                t.phase = Phase::Idle;
            }
            if let Some(r) = t.retry.take() {
                held.push((r.seqs[0], tenant.clone(), r.items));
                settle.push((tenant.clone(), r.seqs, r.bytes));
            }
            if !t.items.is_empty() {
                let seqs: Vec<u64> = t.seqs.drain(..).collect();
                held.push((seqs[0], tenant.clone(), t.items.drain(..).collect()));
                settle.push((tenant.clone(), seqs, mem::take(&mut t.bytes)));
            }
        }
        self.ready.clear();
        // Dead letters are filed before settling, which may answer the shutdown.
        if let Some(sd) = self.shutdown.as_mut().filter(|sd| !sd.reported) {
            sd.unwritten.append(&mut held);
        }
        for (tenant, seqs, bytes) in settle {
            self.count_lost(&tenant, reason, seqs.len() as u64);
            self.settle_slice(&tenant, &seqs, bytes, |_| Settled::Lost);
        }
        self.tenants.retain(|_, t| !t.is_empty());
        held
    }

    /// Files items that came back from a given-up write: dead letters of a
    /// shutdown still to be answered, else discarded (already counted lost).
    fn dead_letter(&mut self, first_seq: u64, tenant: K, items: Vec<I>) {
        if let Some(sd) = self.shutdown.as_mut().filter(|sd| !sd.reported) {
            sd.unwritten.push((first_seq, tenant, items));
        }
    }

    /// Sends the shutdown reports once the shutdown wait settled and every
    /// given-up write has come back (so the dead letters are complete).
    fn maybe_finish_shutdown(&mut self) {
        let Some(sd) = self.shutdown.as_mut() else {
            return;
        };
        let Some(report) = sd.settled else {
            return;
        };
        if self.in_flight.values().any(|r| r.given_up) {
            return;
        }
        sd.settled = None;
        sd.reported = true;
        let mut unwritten = mem::take(&mut sd.unwritten);
        unwritten.sort_by_key(|(seq, _, _)| *seq);
        let first = sd.first;
        let joined = mem::take(&mut sd.joined);
        self.events.push_back(Event::ShutdownDone {
            id: first,
            report: ShutdownReport {
                report,
                first: true,
                unwritten: unwritten.into_iter().map(|(_, k, v)| (k, v)).collect(),
            },
        });
        for id in joined {
            self.events.push_back(Event::ShutdownDone {
                id,
                report: ShutdownReport {
                    report: Report {
                        deadline_passed: report.deadline_passed,
                        ..Report::default()
                    },
                    first: false,
                    unwritten: Vec::new(),
                },
            });
        }
    }
}
