//! The engine: every batching, retry, drop, loss, flush and shutdown
//! decision, as a sans-IO state machine (S-C1).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::hash::{BuildHasherDefault, DefaultHasher, Hash};
use std::mem;

use super::accounting::{Counters, DropReason, LostReason};
use super::backlog::{Phase, Retry, Tenant};
use super::backoff::Backoff;
use super::config::{Config, ConfigError, ErrorPolicy};
use super::schedule::{Due, Schedule};
use super::time::Time;
use super::wait::{Settled, WaitKind, Waits};
use super::write::{Event, Failure, Next, Outcome, Report, ShutdownReport, WaitId, Write, WriteId};

/// Measures an item in bytes for `max_batch_bytes` and `capacity_bytes`
/// (S-B5). It must be pure: the same item always weighs the same. A weight
/// above [`MAX_WEIGHT`] is taken as `MAX_WEIGHT`.
pub type Weigher<I> = Box<dyn Fn(&I) -> u64 + Send + Sync>;

/// The largest weight an item is given: 2^40 bytes (1 TiB). Weights are
/// clamped to it so byte sums cannot overflow below 2^24 such items pending;
/// byte sums saturate beyond that (S-B5: no input makes the batcher fail).
pub const MAX_WEIGHT: u64 = 1 << 40;

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

/// `finish` was given a write the engine does not know, or one whose item
/// count differs from what was handed out: a driver bug. The write comes
/// back whole so nothing is silently leaked, and the engine is unchanged.
#[derive(Debug, PartialEq, Eq)]
pub struct UnknownWrite<K, I>(pub Write<K, I>);

impl<K, I> fmt::Display for UnknownWrite<K, I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "write {} is not in flight, or its items were changed",
            self.0.id
        )
    }
}

impl<K: fmt::Debug, I: fmt::Debug> std::error::Error for UnknownWrite<K, I> {}

/// A write handed out and not yet finished.
#[derive(Debug)]
struct InFlight<K> {
    tenant: K,
    /// Items in the slice.
    len: usize,
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
    /// Dead letters: (tenant, rank, items); rank orders one tenant's runs
    /// (0 in flight, 1 retry, 2 backlog), which is their staging order.
    unwritten: Vec<(K, u8, Vec<I>)>,
    /// The first caller has been answered.
    reported: bool,
}

/// The tenant map's hasher: SipHash with fixed keys. Lookups only; nothing
/// ever iterates the map to decide anything (S-C1), so its order is moot.
type Tenants<K, I> = HashMap<K, Tenant<I>, BuildHasherDefault<DefaultHasher>>;

/// The outbox engine: a deterministic, sans-IO state machine (S-C1).
///
/// `K` is the tenant key (the driver uses [`TenantId`](crate::TenantId));
/// its `Ord`, `Eq` and `Hash` must agree, as for any map key. `I` is the
/// item. Feed it inputs, each with the current [`Time`]:
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
/// O(W) per touched tenant while W flushes, settles or shutdowns wait.
pub struct Engine<K, I> {
    config: Config,
    weigher: Option<Weigher<I>>,
    backoff: Backoff,
    now: Time,
    life: Life,
    counters: Counters,
    pending_bytes: u64,
    tenants: Tenants<K, I>,
    sched: Schedule<K>,
    in_flight: BTreeMap<WriteId, InFlight<K>>,
    next_write: u64,
    waits: Waits,
    shutdown: Option<Shutdown<K, I>>,
    events: VecDeque<Event<K, I>>,
    /// Items let go of and not handed back by a return value (see
    /// [`Engine::take_released`]): the engine never drops an item itself.
    released: Vec<I>,
}

impl<K: fmt::Debug, I> fmt::Debug for Engine<K, I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Engine")
            .field("now", &self.now)
            .field("life", &self.life)
            .field("counters", &self.counters)
            .field("tenants", &self.tenants.len())
            .field("in_flight", &self.in_flight.len())
            .finish_non_exhaustive()
    }
}

impl<K: Ord + Hash + Clone, I> Engine<K, I> {
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
            tenants: Tenants::default(),
            sched: Schedule::default(),
            in_flight: BTreeMap::new(),
            next_write: 1,
            waits: Waits::default(),
            shutdown: None,
            events: VecDeque::new(),
            released: Vec::new(),
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

    /// Takes the items the engine let go of since the last call: items
    /// refused or dropped by [`stage`](Self::stage) (counted lost under
    /// `shutdown` or dropped, S-W14), and items of a write given up by an
    /// abandon that no shutdown report will carry (counted lost). They are
    /// already counted; the caller only drops them.
    ///
    /// The engine never drops an item itself, so an item's `Drop`
    /// (application code) never runs inside an engine call, which a driver
    /// typically makes under a lock: the driver drops these after the
    /// lock, where a slow, re-entrant or panicking `Drop` harms nobody
    /// (S-W13). Allocation-free when there are none.
    pub fn take_released(&mut self) -> Vec<I> {
        mem::take(&mut self.released)
    }

    // ----- inputs -------------------------------------------------------

    /// Stages one item for `tenant` (S-W1). Never waits and never fails:
    /// the item is pending on return, or counted dropped (S-A1, S-B5, S-B7)
    /// or lost under `shutdown` (S-W9), as the result says; a refused or
    /// dropped item is kept for [`take_released`](Self::take_released).
    pub fn stage(&mut self, now: Time, tenant: K, item: I) -> Staged {
        self.advance(now);
        self.stage_at_now(tenant, item).0
    }

    /// Stages like [`stage`](Self::stage), for a driver whose clock read
    /// costs more than the rest of the stage: `clock` is called only when
    /// the decision depends on the time (a linger is configured), and only
    /// then are due timers handled here; otherwise the item is stamped with
    /// the latest time seen, which nothing reads without a linger (S-A3),
    /// and timers fire at the driver's next input.
    ///
    /// Also says whether the driver must drain the engine
    /// ([`poll_write`](Self::poll_write), [`poll_event`](Self::poll_event),
    /// [`poll_timeout`](Self::poll_timeout)) because of this stage: a
    /// tenant became ready while a write slot is free and nothing else was
    /// ready, an event was queued with none before it, or the next timeout
    /// moved earlier. When it says `false`, a drain already due (after the
    /// previous such `true`, or after the write that holds the slots comes
    /// back) covers this item, provided the driver drains fully each time.
    pub fn stage_with(
        &mut self,
        clock: impl FnOnce() -> Time,
        tenant: K,
        item: I,
    ) -> (Staged, bool) {
        if !self.config.linger.is_zero() {
            self.advance(clock());
        }
        self.stage_at_now(tenant, item)
    }

    /// Stages an item that a journal recovery read back (D4): counted
    /// under `recovered` rather than `staged`, and never refused by a
    /// capacity (it was accepted once already; refusing it now would lose
    /// it). Call before any new stage, per tenant in staging order (D2).
    /// After a shutdown began it is refused like a stage (`shutdown`).
    pub fn recover(&mut self, now: Time, tenant: K, item: I) -> Staged {
        self.advance(now);
        self.admit_at_now(tenant, item, true).0
    }

    /// Counts `items` that a journal recovery found but could not read
    /// back (damaged or undecodable records) as recovered and lost under
    /// `journal_unreadable` (D4). Their tenants are unknown, so there is no
    /// event: the driver logs the recovery's report. Returns whether to log
    /// (S-A6).
    pub fn recover_unreadable(&mut self, items: u64) -> bool {
        self.counters.recovered += items;
        self.counters.add_lost(LostReason::JournalUnreadable, items)
    }

    /// Counts an item the driver refused before the engine saw it (the
    /// journal could not encode it, or is full: `encode_failed`,
    /// `journal_full`, S-J4, S-J8) as staged and dropped for `reason`.
    pub fn refuse(&mut self, now: Time, tenant: K, reason: DropReason) -> Staged {
        self.advance(now);
        self.counters.staged += 1;
        self.count_dropped(&tenant, reason, 1);
        Staged::Dropped(reason)
    }

    /// `stage` at `self.now`; returns whether the driver must drain.
    fn stage_at_now(&mut self, tenant: K, item: I) -> (Staged, bool) {
        self.admit_at_now(tenant, item, false)
    }

    /// A stage, or with `recovered` a recovery's stage (no capacity).
    fn admit_at_now(&mut self, tenant: K, item: I, recovered: bool) -> (Staged, bool) {
        if recovered {
            self.counters.recovered += 1;
        } else {
            self.counters.staged += 1;
        }
        let quiet = self.events.is_empty();
        if self.life != Life::Open {
            let log = self.counters.add_lost(LostReason::Shutdown, 1);
            self.events.push_back(Event::Lost {
                tenant,
                items: 1,
                reason: LostReason::Shutdown,
                log,
            });
            self.released.push(item);
            return (Staged::Refused, quiet);
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
        let reason = if recovered {
            None
        } else if full {
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
            self.released.push(item);
            return (Staged::Dropped(reason), quiet);
        }

        self.counters.pending += 1;
        self.pending_bytes = self.pending_bytes.saturating_add(weight);
        let now = self.now;
        // A new ready tenant needs the driver only if nothing else was
        // ready and a slot is free: otherwise a drain is already due.
        let slot_free = self.in_flight.len() < self.config.concurrency;
        // One lookup: the fields are borrowed apart.
        let Engine {
            tenants,
            waits,
            sched,
            config,
            ..
        } = self;
        let t = tenants
            .entry(tenant.clone())
            .or_insert_with(|| Tenant::new(now));
        // The new item comes after every open wait (S-A4).
        waits.touch(&mut t.seen, t.pending as u64);
        if t.items.is_empty() {
            t.waiting_since = now;
        }
        t.items.push_back(item);
        t.bytes = t.bytes.saturating_add(weight);
        t.pending += 1;
        let first_ready = slot_free && !sched.has_ready();
        let drain = match t.phase {
            Phase::Idle => {
                // An idle tenant had nothing pending, so this item is its
                // only one: staged after every flush, never hurried (and
                // the engine is open, or the stage was refused above).
                debug_assert!(t.pending == 1 && !waits.hurried(&t.seen));
                let next = sched.next_timeout();
                place(tenant, t, config, now, false, sched);
                match t.phase {
                    Phase::Lingering(key) => next.is_none_or(|at| key.0 < at),
                    _ => first_ready,
                }
            }
            Phase::Lingering(_) if batch_full(t, config) => {
                sched.unschedule(&mut t.phase);
                sched.ready(tenant, &mut t.phase);
                first_ready
            }
            _ => false,
        };
        (Staged::Accepted, drain)
    }

    /// Hands out the next write to start, if a concurrency slot is free and
    /// a tenant is ready (S-W3, S-W4, S-B1). Call until `None` after every
    /// input.
    pub fn poll_write(&mut self, now: Time) -> Option<Write<K, I>> {
        self.advance(now);
        if self.life == Life::Closed || self.in_flight.len() >= self.config.concurrency {
            return None;
        }
        let tenant = self.sched.pop_ready()?;
        let now = self.now;
        let id;
        let t = self.tenants.get_mut(&tenant).expect("ready tenant exists");
        let (items, bytes, attempt, first_started) = match t.retry.take() {
            Some(r) => {
                id = r.id;
                (r.items, r.bytes, r.attempts + 1, r.first_started)
            }
            None => {
                id = WriteId(self.next_write);
                self.next_write += 1;
                let weigher = self.weigher.as_deref();
                let (items, bytes) = t.cut_batch(
                    self.config.max_batch,
                    self.config.max_batch_bytes,
                    |i| weigher.map_or(0, |w| w(i).min(MAX_WEIGHT)),
                    now,
                );
                (items, bytes, 1, now)
            }
        };
        debug_assert!(!items.is_empty());
        t.phase = Phase::InFlight(id);
        self.counters.attempts += 1;
        self.in_flight.insert(
            id,
            InFlight {
                tenant: tenant.clone(),
                len: items.len(),
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
    /// Returns the items the engine is done with (written, dropped, lost;
    /// empty when they are kept for a retry or handed back as dead letters)
    /// so the driver drops them outside its lock: an item's `Drop` is the
    /// application's code and may panic (S-W13 containment).
    ///
    /// A write the engine gave up at the shutdown deadline or on abandon is
    /// already counted lost. If it comes back [`Outcome::Written`], its
    /// items are in the store: they stay counted lost (counters never
    /// decrease; "lost" means given up) but are not handed back as dead
    /// letters, so nobody stores them twice (S-B6). Any other outcome hands
    /// them back.
    ///
    /// # Errors
    /// [`UnknownWrite`], carrying the write back, if it is not in flight or
    /// its item count is not the one handed out (the items must come back
    /// untouched, S-C2).
    pub fn finish(
        &mut self,
        now: Time,
        write: Write<K, I>,
        outcome: Outcome,
    ) -> Result<Vec<I>, Box<UnknownWrite<K, I>>> {
        self.advance(now);
        match self.in_flight.get(&write.id) {
            Some(rec) if rec.len == write.items.len() => {}
            _ => return Err(Box::new(UnknownWrite(write))),
        }
        let rec = self.in_flight.remove(&write.id).expect("just checked");
        if rec.given_up {
            let done = if matches!(outcome, Outcome::Written { .. }) {
                write.items
            } else {
                self.dead_letter(rec.tenant, 0, write.items);
                Vec::new()
            };
            self.forget_if_empty(&write.tenant);
            self.maybe_finish_shutdown();
            return Ok(done);
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
                self.settle_slice(&rec.tenant, n, rec.bytes, |i| {
                    if i < n - discarded {
                        Settled::Written
                    } else {
                        Settled::Lost
                    }
                });
                self.schedule_after_write(rec.tenant);
                return Ok(write.items);
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
                let t = self.tenants.get_mut(&rec.tenant).expect("tenant in flight");
                self.sched.backoff(rec.tenant, &mut t.phase, now + wait);
                t.retry = Some(Box::new(Retry {
                    id: write.id,
                    items: write.items,
                    bytes: rec.bytes,
                    attempts: rec.attempt,
                    first_started: rec.first_started,
                }));
                Ok(Vec::new())
            }
            Next::Dropped => {
                self.settle_slice(&rec.tenant, n, rec.bytes, |_| Settled::Dropped);
                self.schedule_after_write(rec.tenant);
                Ok(write.items)
            }
            Next::Lost => {
                self.settle_slice(&rec.tenant, n, rec.bytes, |_| Settled::Lost);
                self.schedule_after_write(rec.tenant);
                Ok(write.items)
            }
        }
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
        self.count_lost(&rec.tenant, LostReason::JoinFailed, rec.len as u64);
        self.settle_slice(&rec.tenant, rec.len, rec.bytes, |_| Settled::Lost);
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
                        self.sched.cancel_deadline(old);
                        let key = self.sched.deadline(first, deadline);
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
    /// Returns the items the engine held (those in flight are released,
    /// see [`take_released`](Self::take_released), when they come back,
    /// unless a shutdown is waiting for them). During
    /// a shutdown that has not answered yet, the held items go to that
    /// shutdown's dead letters instead and this returns nothing: each item
    /// is handed back once, to one caller.
    pub fn abandon(&mut self, now: Time) -> Vec<(K, Vec<I>)> {
        self.advance(now);
        let held = self.give_up_all(LostReason::Abandoned);
        self.close();
        held.into_iter().map(|(k, _, v)| (k, v)).collect()
    }

    // ----- outputs ------------------------------------------------------

    /// The next event to export or act on; call until `None` after every input.
    pub fn poll_event(&mut self) -> Option<Event<K, I>> {
        self.events.pop_front()
    }

    /// When the next timer falls due (linger, backoff, deadline), if any.
    /// The driver calls [`handle_timeout`](Self::handle_timeout) then.
    pub fn poll_timeout(&self) -> Option<Time> {
        self.sched.next_timeout()
    }

    // ----- time ---------------------------------------------------------

    /// Moves the clock to `now` and fires what is due, each timer once, in
    /// (instant, arming order) (S-W17).
    fn advance(&mut self, now: Time) {
        self.now = self.now.max(now);
        while let Some(due) = self.sched.pop_due(self.now) {
            match due {
                Due::Tenant(tenant) => self.make_ready(tenant),
                Due::Deadline(id) => {
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
    }

    // ----- scheduling ---------------------------------------------------

    fn weigh(&self, item: &I) -> u64 {
        self.weigher.as_ref().map_or(0, |w| w(item).min(MAX_WEIGHT))
    }

    /// A tenant whose linger or backoff ended.
    fn make_ready(&mut self, tenant: K) {
        let t = self
            .tenants
            .get_mut(&tenant)
            .expect("a timed tenant exists");
        self.sched.ready(tenant, &mut t.phase);
    }

    /// After a write settled (not retried), the tenant's next step.
    fn schedule_after_write(&mut self, tenant: K) {
        let Some(t) = self.tenants.get_mut(&tenant) else {
            return;
        };
        t.phase = Phase::Idle;
        if t.items.is_empty() || self.life == Life::Closed {
            // Nothing waits, or given up already and nothing may start (I8).
            if t.is_empty() {
                self.tenants.remove(&tenant);
            }
            return;
        }
        self.waits.touch(&mut t.seen, t.pending as u64);
        let hurry = self.life != Life::Open || self.waits.hurried(&t.seen);
        place(tenant, t, &self.config, self.now, hurry, &mut self.sched);
    }

    /// A flush or shutdown sends lingering batches at once (S-A3, S-A4), in
    /// the order their lingers would have ended.
    fn release_lingering(&mut self) {
        let lingering: Vec<K> = self.sched.take_lingering().collect();
        for tenant in lingering {
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
    /// The tenant's `n` oldest pending items (weighing `bytes`) left the
    /// pending state, their counters already moved: release the pending
    /// counts and tell the waits.
    fn settle_slice(&mut self, tenant: &K, n: usize, bytes: u64, how: impl Fn(usize) -> Settled) {
        self.counters.pending -= n as u64;
        self.pending_bytes = self.pending_bytes.saturating_sub(bytes);
        let t = self
            .tenants
            .get_mut(tenant)
            .expect("a settling tenant exists");
        self.waits.touch(&mut t.seen, t.pending as u64);
        t.pending -= n;
        for id in self.waits.settle(&mut t.seen, n, how) {
            self.answer_wait(id);
        }
    }

    fn start_wait(&mut self, kind: WaitKind, deadline: Time) -> WaitId {
        let id = self.waits.next_id();
        self.open_wait(id, kind, deadline);
        id
    }

    fn open_wait(&mut self, id: WaitId, kind: WaitKind, deadline: Time) {
        let key = self.sched.deadline(id, deadline);
        let done = self.waits.open(id, kind, self.counters.pending, key);
        if done {
            self.answer_wait(id);
        } else {
            // A deadline already past fires now.
            self.advance(self.now);
        }
    }

    /// A wait's items are all settled (or its deadline passed): answer it.
    fn answer_wait(&mut self, id: WaitId) {
        let Some((report, key)) = self.waits.take(id) else {
            return;
        };
        self.sched.cancel_deadline(key);
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
        self.sched.clear_ready();
    }

    /// Gives up every pending item for `reason` (S-W9 deadline, S-A7):
    /// in-flight writes are marked and the driver is told to cancel them;
    /// retry slices and backlogs are taken out. The items taken out go to a
    /// shutdown still to be answered (its dead letters), or are returned as
    /// (first seq, tenant, items) when there is none.
    fn give_up_all(&mut self, reason: LostReason) -> Vec<(K, u8, Vec<I>)> {
        let mut held = Vec::new();
        // Per tenant, oldest first: in flight, then retry, then backlog.
        let mut settle: Vec<(K, usize, u64)> = Vec::new();
        for rec in self.in_flight.values_mut().filter(|r| !r.given_up) {
            rec.given_up = true;
            settle.push((rec.tenant.clone(), rec.len, rec.bytes));
        }
        if !settle.is_empty() {
            self.events.push_back(Event::CancelInFlight);
        }
        // Tenant by tenant in key order, so the run is reproducible (S-C1).
        let mut keys: Vec<K> = self.tenants.keys().cloned().collect();
        keys.sort_unstable();
        for tenant in keys {
            let t = self.tenants.get_mut(&tenant).expect("key just listed");
            self.sched.unschedule(&mut t.phase);
            if t.phase == Phase::Ready {
                t.phase = Phase::Idle;
            }
            if let Some(r) = t.retry.take() {
                settle.push((tenant.clone(), r.items.len(), r.bytes));
                held.push((tenant.clone(), 1, r.items));
            }
            if !t.items.is_empty() {
                settle.push((tenant.clone(), t.items.len(), mem::take(&mut t.bytes)));
                held.push((tenant.clone(), 2, t.items.drain(..).collect()));
            }
        }
        self.sched.clear_ready();
        // Dead letters are filed before settling, which may answer the shutdown.
        if let Some(sd) = self.shutdown.as_mut().filter(|sd| !sd.reported) {
            sd.unwritten.append(&mut held);
        }
        for (tenant, n, bytes) in settle {
            self.count_lost(&tenant, reason, n as u64);
            self.settle_slice(&tenant, n, bytes, |_| Settled::Lost);
        }
        self.tenants.retain(|_, t| !t.is_empty());
        held
    }

    /// Files items that came back from a given-up write: dead letters of a
    /// shutdown still to be answered, else released (already counted lost).
    fn dead_letter(&mut self, tenant: K, rank: u8, items: Vec<I>) {
        match self.shutdown.as_mut().filter(|sd| !sd.reported) {
            Some(sd) => sd.unwritten.push((tenant, rank, items)),
            None => self.released.extend(items),
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
        unwritten.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
        let first = sd.first;
        let joined = mem::take(&mut sd.joined);
        self.events.push_back(Event::ShutdownDone {
            id: first,
            report: ShutdownReport {
                report,
                first: true,
                unwritten: unwritten.into_iter().map(|(k, _, v)| (k, v)).collect(),
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

/// Whether the tenant's waiting backlog fills a batch (S-A3).
fn batch_full<I>(t: &Tenant<I>, config: &Config) -> bool {
    config.max_batch.is_some_and(|m| t.items.len() >= m)
        || config.max_batch_bytes.is_some_and(|m| t.bytes >= m)
}

/// Places an idle tenant with waiting items (S-A3): ready at once when
/// there is no linger, the batch is full, its linger has run out, or a
/// flush or shutdown is waiting for its items (`hurry`); else lingering
/// until `linger` after its oldest waiting item.
fn place<K, I>(
    tenant: K,
    t: &mut Tenant<I>,
    config: &Config,
    now: Time,
    hurry: bool,
    sched: &mut Schedule<K>,
) {
    debug_assert!(t.phase == Phase::Idle && !t.items.is_empty());
    let until = t.waiting_since + config.linger;
    if hurry || config.linger.is_zero() || until <= now || batch_full(t, config) {
        sched.ready(tenant, &mut t.phase);
    } else {
        sched.linger(tenant, &mut t.phase, until);
    }
}
