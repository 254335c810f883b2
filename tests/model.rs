//! Model test (proptest-state-machine): a deliberately simple reference
//! model of the outbox predicts every write the engine hands out (tenant,
//! items, attempt), every counter, every flush/settle/shutdown answer,
//! every loss and drop per tenant and reason, every run-time dead letter,
//! the breaker's state and the next timeout, and is checked after every
//! op. The same ops also run through the shared invariant-checking
//! `Harness`.
//!
//! The model is plain: per-tenant FIFO queues, a FIFO of ready tenants,
//! one timer list ordered by (instant, arming order), a counter and a
//! probe time for the breaker, no scheduling cleverness. The config space
//! is every knob (docs/testing.md says what is predicted per knob):
//! concurrency, capacity and `capacity_bytes`, tenant quotas, `max_batch`
//! and `max_batch_bytes`, linger, backoff with jitter (the seeded draw of
//! S-B2, S-B4), retry limits, the drop policy, write timeouts, fan-in
//! groups, the breaker, `max_item_age` and run-time dead letters; and the
//! ops cover flush, settle, shutdown with a deadline, abandon, terminal
//! rejections and lost write tasks.
//!
//! Transitions are `outbox::testkit::Op`s and configs are `ConfigDraw`s, so
//! a failure replays in the fuzz target and the simulation's fast world.
//! Run longer or elsewhere with `OUTBOX_MODEL_CASES=100000
//! OUTBOX_MODEL_SEED=7 cargo test --features arbitrary --test model`.
//! With the feature `canary`, `every_canary_fails_the_model` runs the
//! model under each of the engine's planted bugs (`OUTBOX_CANARY`).

#![cfg(feature = "arbitrary")]

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use outbox::core::{
    BreakerConfig, BreakerState, Config, Counters, DeadReason, DropReason, Engine, ErrorPolicy,
    Event, Failure, LostReason, Outcome, Report, Staged, Time, Write, WriteId,
};
use outbox::testkit::{weight_of, ConfigDraw, Harness, Op, OpOutcome};
use proptest::prelude::*;
use proptest::test_runner::{FileFailurePersistence, RngSeed};
use proptest_state_machine::{prop_state_machine, ReferenceStateMachine, StateMachineTest};
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};

// ----- the model ---------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Life {
    Open,
    Closing,
    Closed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    Pending,
    Written,
    Dropped,
    Lost,
}

type Key = (Time, u64);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Idle,
    Ready,
    Lingering(Key),
    InFlight,
    BackingOff(Key),
}

#[derive(Clone, Copy, Debug)]
enum Timer {
    Linger(u8),
    Backoff(u8),
    Deadline(u64),
}

#[derive(Clone, Debug)]
struct Retry {
    id: u64,
    items: Vec<u64>,
    attempts: u32,
    first_started: Time,
}

#[derive(Clone, Debug)]
struct MTenant {
    queue: VecDeque<u64>,
    /// The bytes of `queue` (S-B5).
    bytes: u64,
    /// When the linger clock of `queue` started (S-A3): its oldest item's
    /// stage, or the cut that left items behind.
    waiting_since: Time,
    retry: Option<Retry>,
    phase: Phase,
}

/// The breaker (S-R1, S-R2), as the contract states it.
#[derive(Clone, Debug, Default)]
struct MBreaker {
    /// Failed attempts in a row while closed.
    failures: u32,
    open: Option<MOpen>,
}

#[derive(Clone, Copy, Debug)]
struct MOpen {
    interval: Duration,
    next_probe: Time,
    probe: Option<u64>,
}

#[derive(Clone, Debug)]
struct MWrite {
    id: u64,
    tenant: u8,
    items: Vec<u64>,
    attempt: u32,
    first_started: Time,
    given_up: bool,
    /// The group it was handed out in (S-F1).
    group: u64,
}

#[derive(Clone, Debug)]
struct MWait {
    items: Vec<u64>,
    remaining: u64,
    report: Report,
    key: Key,
}

#[derive(Clone, Debug)]
struct MShutdown {
    first: u64,
    joined: Vec<u64>,
    settled: Option<Report>,
    unwritten: Vec<(u64, u8, Vec<u64>)>,
    reported: bool,
}

/// A shutdown answer: (first caller, dead letters).
type ShutdownAnswer = (bool, Vec<(u8, Vec<u64>)>);

/// A write as handed out: (id, tenant, items, attempt, deadline).
type WriteSeen = (u64, u8, Vec<u64>, u32, Option<Time>);

/// What one op is predicted to produce.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Out {
    staged: Vec<Staged>,
    writes: Vec<WriteSeen>,
    answers: BTreeMap<u64, (Report, Option<ShutdownAnswer>)>,
    /// (tenant, "lost"/"dropped", reason) -> items
    losses: BTreeMap<(u8, &'static str, &'static str), u64>,
    held: Option<Vec<(u8, Vec<u64>)>>,
    /// Run-time dead letters (S-R4), in the order handed out.
    dead_letters: Vec<(u8, Vec<u64>, DeadReason)>,
}

/// The knobs the model reads, from the engine's own validated config.
#[derive(Clone, Debug)]
struct Knobs {
    concurrency: usize,
    capacity: Option<u64>,
    capacity_bytes: Option<u64>,
    tenant_capacity: Option<usize>,
    max_batch: Option<usize>,
    max_batch_bytes: Option<u64>,
    linger: Duration,
    max_slices: usize,
    max_group_items: Option<usize>,
    initial: Duration,
    max: Duration,
    /// Jitter in parts per million of the backoff.
    jitter_ppm: u32,
    max_attempts: Option<u32>,
    max_retry: Option<Duration>,
    drop: bool,
    write_timeout: Option<Duration>,
    breaker: Option<BreakerConfig>,
    max_item_age: Option<Duration>,
    dead_letters: bool,
    /// Items weigh `weight_of(id)` bytes (a byte limit is set).
    weighs: bool,
}

#[derive(Clone, Debug)]
struct Model {
    draw: ConfigDraw,
    tenant_count: u8,
    k: Knobs,
    now: Time,
    next_item: u64,
    next_write: u64,
    next_wait: u64,
    timer_seq: u64,
    life: Life,
    c: Counters,
    tenants: BTreeMap<u8, MTenant>,
    ready: VecDeque<u8>,
    timers: BTreeMap<Key, Timer>,
    in_flight: Vec<MWrite>,
    next_group: u64,
    fate: BTreeMap<u64, Fate>,
    waits: BTreeMap<u64, MWait>,
    shutdown: Option<MShutdown>,
    /// When each item was staged, by item number (S-A3, S-R3).
    staged_at: Vec<Time>,
    /// Bytes pending (S-B5).
    pending_bytes: u64,
    /// Items numbered below this were staged before the latest flush or
    /// first shutdown call: they skip linger (S-A3, S-A4).
    flush_bound: u64,
    breaker: MBreaker,
    /// The jitter's generator (S-B2, S-B4).
    rng: ChaCha8Rng,
    out: Out,
}

impl Model {
    fn new(draw: ConfigDraw, tenant_count: u8) -> Self {
        let c = draw.config();
        let k = Knobs {
            concurrency: c.concurrency(),
            capacity: c.capacity().map(|v| v as u64),
            capacity_bytes: c.capacity_bytes(),
            tenant_capacity: c.tenant_capacity(),
            max_batch: c.max_batch(),
            max_batch_bytes: c.max_batch_bytes(),
            linger: c.linger(),
            max_slices: c.max_slices_per_write(),
            max_group_items: c.max_group_items(),
            initial: c.initial_backoff(),
            max: c.max_backoff(),
            jitter_ppm: (c.jitter() * 1_000_000.0).round() as u32,
            max_attempts: c.max_attempts(),
            max_retry: c.max_retry_duration(),
            drop: c.error_policy() == ErrorPolicy::Drop,
            write_timeout: c.write_timeout(),
            breaker: c.breaker(),
            max_item_age: c.max_item_age(),
            dead_letters: c.dead_letters(),
            weighs: draw.weighs(),
        };
        Model {
            draw,
            tenant_count,
            k,
            now: Time::ZERO,
            next_item: 0,
            next_write: 1,
            next_wait: 1,
            timer_seq: 0,
            life: Life::Open,
            c: Counters::default(),
            tenants: BTreeMap::new(),
            ready: VecDeque::new(),
            timers: BTreeMap::new(),
            in_flight: Vec::new(),
            next_group: 0,
            fate: BTreeMap::new(),
            waits: BTreeMap::new(),
            shutdown: None,
            staged_at: Vec::new(),
            pending_bytes: 0,
            flush_bound: 0,
            breaker: MBreaker::default(),
            rng: ChaCha8Rng::seed_from_u64(c.seed()),
            out: Out::default(),
        }
    }

    fn key(&mut self, at: Time) -> Key {
        self.timer_seq += 1;
        (at, self.timer_seq)
    }

    fn tenant(&mut self, t: u8) -> &mut MTenant {
        self.tenants.entry(t).or_insert_with(|| MTenant {
            queue: VecDeque::new(),
            bytes: 0,
            waiting_since: Time::ZERO,
            retry: None,
            phase: Phase::Idle,
        })
    }

    /// An item's weight in bytes (0 when nothing is weighed).
    fn weight(&self, item: u64) -> u64 {
        if self.k.weighs {
            weight_of(item)
        } else {
            0
        }
    }

    /// With dead letters on, `items` are handed out (S-R4).
    fn dead_letter(&mut self, t: u8, items: &[u64], reason: DeadReason) {
        if self.k.dead_letters && !items.is_empty() {
            self.out.dead_letters.push((t, items.to_vec(), reason));
        }
    }

    fn fail_attempt(&mut self, kind: Failure) {
        self.c.failed_attempts += 1;
        self.c.set_failed(kind, self.c.failed(kind) + 1);
    }

    fn lose(&mut self, t: u8, r: LostReason, n: u64) {
        self.c.set_lost(r, self.c.lost(r) + n);
        *self.out.losses.entry((t, "lost", r.as_str())).or_default() += n;
    }

    fn drop_(&mut self, t: u8, r: DropReason, n: u64) {
        self.c.set_dropped(r, self.c.dropped(r) + n);
        *self
            .out
            .losses
            .entry((t, "dropped", r.as_str()))
            .or_default() += n;
    }

    /// The wait after `attempt` failures in a row (S-W7), shortened by the
    /// jitter's draw (S-B2): a 32-bit uniform draw of the config's seeded
    /// ChaCha8 per backoff, taking up to `jitter` of it, so a seed draws
    /// the same waits on every machine (S-B4).
    fn backoff(&mut self, attempt: u32) -> Duration {
        let shift = attempt.saturating_sub(1);
        let base = if shift >= 64 {
            self.k.max
        } else {
            let ns = self.k.initial.as_nanos() << shift;
            Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
        };
        let base = base.min(self.k.max);
        if self.k.jitter_ppm == 0 {
            return base;
        }
        let draw = u128::from(self.rng.next_u32());
        let cut = (base.as_nanos() * u128::from(self.k.jitter_ppm) / 1_000_000 * draw) >> 32;
        base - Duration::from_nanos(u64::try_from(cut).unwrap_or(u64::MAX))
    }

    // ----- the breaker (S-R1, S-R2) ------------------------------------------

    fn breaker_may_start(&self) -> bool {
        self.breaker
            .open
            .is_none_or(|o| o.probe.is_none() && o.next_probe <= self.now)
    }

    /// Write `id` started: while open, it is the probe.
    fn breaker_started(&mut self, id: u64) {
        if let Some(o) = self.breaker.open.as_mut() {
            o.probe = Some(id);
        }
    }

    /// Write `id`'s attempt ended (`None`: written). The sink answered
    /// (written, rejected), failed, or we cancelled (neither way).
    fn breaker_ended(&mut self, id: u64, failure: Option<Failure>) {
        let up = matches!(failure, None | Some(Failure::Rejected));
        let moot = failure == Some(Failure::Cancelled);
        let now = self.now;
        let b = &mut self.breaker;
        let Some(config) = self.k.breaker else {
            // Off: the run is still counted (the health snapshot's).
            if up {
                b.failures = 0;
            } else if !moot {
                b.failures = b.failures.saturating_add(1);
            }
            return;
        };
        match b.open.as_mut() {
            None if up => b.failures = 0,
            None if moot => {}
            None => {
                b.failures += 1;
                if b.failures >= config.failures_to_open() {
                    b.open = Some(MOpen {
                        interval: config.first_probe_interval(),
                        next_probe: now + config.first_probe_interval(),
                        probe: None,
                    });
                }
            }
            Some(_) if up => {
                b.open = None;
                b.failures = 0;
            }
            Some(o) if o.probe == Some(id) => {
                if !moot {
                    o.interval = (o.interval * 2).min(config.probe_interval_cap());
                }
                o.next_probe = now + o.interval;
                o.probe = None;
            }
            Some(_) => {}
        }
    }

    fn breaker_state(&self) -> BreakerState {
        match self.breaker.open {
            None => BreakerState::Closed,
            Some(MOpen { probe: Some(p), .. }) => BreakerState::Probing { probe: WriteId(p) },
            Some(o) => BreakerState::Open {
                next_probe: o.next_probe,
            },
        }
    }

    // ----- ops --------------------------------------------------------------

    fn apply(&mut self, op: Op) {
        self.out = Out::default();
        match op {
            Op::Stage { tenant, count } => {
                self.fire_due();
                for _ in 0..=count % 8 {
                    self.stage(tenant % self.tenant_count);
                }
            }
            Op::Poll => {
                self.fire_due();
                self.poll();
            }
            Op::Finish { pick, outcome } => {
                self.fire_due();
                self.finish(pick, Some(outcome));
                // An age deadline already past when the write ended (S-R3).
                self.fire_due();
            }
            Op::FinishLost { pick } => {
                self.fire_due();
                self.finish(pick, None);
                self.fire_due();
            }
            Op::Advance { ms } => {
                self.now = self.now + Duration::from_millis(u64::from(ms));
                self.fire_due();
            }
            Op::AdvanceToTimeout => {
                if let Some(at) = self.poll_timeout() {
                    self.now = self.now.max(at);
                    self.fire_due();
                }
            }
            Op::Flush { timeout_ms } => {
                self.fire_due();
                self.release_lingering();
                self.flush_bound = self.next_item;
                let id = self.next_wait;
                self.next_wait += 1;
                self.open_wait(id, timeout_ms);
            }
            Op::Settle { timeout_ms } => {
                self.fire_due();
                let id = self.next_wait;
                self.next_wait += 1;
                self.open_wait(id, timeout_ms);
            }
            Op::Shutdown { timeout_ms } => {
                self.fire_due();
                self.shutdown(timeout_ms);
            }
            Op::Abandon => {
                self.fire_due();
                if self.life == Life::Open {
                    self.life = Life::Closing;
                }
                let held = self.give_up_all(LostReason::Abandoned);
                self.close();
                self.out.held = Some(held.into_iter().map(|(_, t, v)| (t, v)).collect());
            }
        }
    }

    fn stage(&mut self, t: u8) {
        let item = self.next_item;
        self.next_item += 1;
        self.c.staged += 1;
        self.staged_at.push(self.now);
        let w = self.weight(item);
        if self.life != Life::Open {
            self.lose(t, LostReason::Shutdown, 1);
            self.fate.insert(item, Fate::Lost);
            self.out.staged.push(Staged::ShuttingDown);
            return;
        }
        let tenant_pending = self.tenant_pending(t);
        let reason = if self.k.capacity.is_some_and(|cap| self.c.pending >= cap)
            || self
                .k
                .capacity_bytes
                .is_some_and(|cap| self.pending_bytes + w > cap)
        {
            Some(DropReason::BufferFull)
        } else if self
            .k
            .tenant_capacity
            .is_some_and(|cap| tenant_pending >= cap)
        {
            Some(DropReason::TenantFull)
        } else {
            None
        };
        if let Some(r) = reason {
            self.drop_(t, r, 1);
            self.fate.insert(item, Fate::Dropped);
            self.out.staged.push(Staged::Dropped(r));
            return;
        }
        self.c.pending += 1;
        self.pending_bytes += w;
        self.fate.insert(item, Fate::Pending);
        self.out.staged.push(Staged::Accepted);
        let now = self.now;
        let mt = self.tenant(t);
        if mt.queue.is_empty() {
            mt.waiting_since = now;
        }
        mt.queue.push_back(item);
        mt.bytes += w;
        let phase = mt.phase;
        match phase {
            // Nothing was pending: the item is after every flush.
            Phase::Idle => self.ready_or_linger(t, false),
            Phase::Lingering(key) if self.batch_full(t) => {
                self.timers.remove(&key);
                self.make_ready(t);
            }
            _ => {}
        }
    }

    /// Whether `t`'s waiting backlog fills a batch (S-A3, S-W4, S-B5).
    fn batch_full(&self, t: u8) -> bool {
        let mt = &self.tenants[&t];
        self.k.max_batch.is_some_and(|m| mt.queue.len() >= m)
            || self.k.max_batch_bytes.is_some_and(|m| mt.bytes >= m)
    }

    fn make_ready(&mut self, t: u8) {
        self.tenant(t).phase = Phase::Ready;
        self.ready.push_back(t);
    }

    /// An idle tenant with waiting items (S-A3): ready now when nothing
    /// lingers (no linger, `skip` for a flush or shutdown, its linger
    /// over, a full batch), else lingering until its linger is over.
    fn ready_or_linger(&mut self, t: u8, skip: bool) {
        let until = self.tenants[&t].waiting_since + self.k.linger;
        if skip || self.k.linger.is_zero() || until <= self.now || self.batch_full(t) {
            self.make_ready(t);
        } else {
            let key = self.key(until);
            self.timers.insert(key, Timer::Linger(t));
            self.tenant(t).phase = Phase::Lingering(key);
        }
    }

    /// A flush or shutdown sends every lingering tenant at once, in the
    /// order their lingers would have ended (S-A3, S-A4).
    fn release_lingering(&mut self) {
        let lingering: Vec<(Key, u8)> = self
            .timers
            .iter()
            .filter_map(|(k, t)| match t {
                Timer::Linger(t) => Some((*k, *t)),
                _ => None,
            })
            .collect();
        for (key, t) in lingering {
            self.timers.remove(&key);
            self.make_ready(t);
        }
    }

    fn tenant_pending(&self, t: u8) -> usize {
        let held = self.tenants.get(&t).map_or(0, |mt| {
            mt.queue.len() + mt.retry.as_ref().map_or(0, |r| r.items.len())
        });
        let flying: usize = self
            .in_flight
            .iter()
            .filter(|w| w.tenant == t && !w.given_up)
            .map(|w| w.items.len())
            .sum();
        held + flying
    }

    /// Groups with a write in flight (S-F1: each takes a slot).
    fn groups_in_flight(&self) -> usize {
        let mut g: Vec<u64> = self.in_flight.iter().map(|w| w.group).collect();
        g.sort_unstable();
        g.dedup();
        g.len()
    }

    /// The size the next ready tenant's slice would have.
    fn next_slice_len(&self, t: u8) -> usize {
        let mt = &self.tenants[&t];
        match &mt.retry {
            Some(r) => r.items.len(),
            None => self
                .k
                .max_batch
                .map_or(mt.queue.len(), |m| m.min(mt.queue.len())),
        }
    }

    /// The next ready tenant with something to start once its items older
    /// than `max_item_age` expired (S-R3), if a write may start: open, a
    /// slot free (S-W3, S-F1) and the breaker letting it (S-R1).
    fn next_ready(&mut self) -> Option<u8> {
        loop {
            let may = self.life != Life::Closed
                && self.groups_in_flight() < self.k.concurrency
                && self.breaker_may_start();
            if !may {
                return None;
            }
            let t = self.ready.pop_front()?;
            if !self.expire(t) {
                return Some(t);
            }
        }
    }

    fn poll(&mut self) {
        while let Some(first) = self.next_ready() {
            self.next_group += 1;
            let group = self.next_group;
            let mut slices = 1;
            let mut items = self.start(first, group);
            // While the breaker is open a probe goes alone (S-R1).
            while slices < self.k.max_slices && self.breaker_may_start() {
                let Some(&t) = self.ready.front() else {
                    break;
                };
                // Sized before it expires anything (S-F2: at most this).
                let len = self.next_slice_len(t);
                if self.k.max_group_items.is_some_and(|cap| items + len > cap) {
                    break;
                }
                self.ready.pop_front();
                if self.expire(t) {
                    continue;
                }
                items += self.start(t, group);
                slices += 1;
            }
        }
    }

    /// Before `t`'s write starts, what was staged longer than
    /// `max_item_age` ago is lost under `expired` (S-R3): its retry slice
    /// whole, else its oldest waiting items. Returns whether nothing is
    /// left to start now (`t` is then placed again).
    fn expire(&mut self, t: u8) -> bool {
        let Some(age) = self.k.max_item_age else {
            return false;
        };
        if self.tenants[&t].retry.is_none() && self.tenants[&t].queue.is_empty() {
            // Emptied by its age timer while it was ready.
            self.after_write(t);
            return true;
        }
        let Some(cutoff) = self.now.as_nanos().checked_sub(age.as_nanos() as u64) else {
            return false;
        };
        let old = |m: &Model, i: u64| m.staged_at[i as usize].as_nanos() < cutoff;
        let mut runs = Vec::new();
        let retry_expired = self.tenants[&t]
            .retry
            .as_ref()
            .is_some_and(|r| old(self, r.items[0]));
        if retry_expired {
            runs.push(self.tenant(t).retry.take().expect("checked").items);
        }
        if self.tenants[&t].retry.is_none() {
            let n = self.tenants[&t]
                .queue
                .iter()
                .take_while(|i| old(self, **i))
                .count();
            let items: Vec<u64> = self.tenant(t).queue.drain(..n).collect();
            let bytes: u64 = items.iter().map(|i| self.weight(*i)).sum();
            self.tenant(t).bytes -= bytes;
            if !items.is_empty() {
                runs.push(items);
            }
        }
        if runs.is_empty() {
            return false;
        }
        let nothing_left = retry_expired || self.tenants[&t].queue.is_empty();
        self.tenant(t).phase = Phase::Idle;
        for items in runs {
            self.lose(t, LostReason::Expired, items.len() as u64);
            self.mark_done(&items, |_| Fate::Lost);
            self.dead_letter(t, &items, DeadReason::Expired);
        }
        if nothing_left {
            self.after_write(t);
        } else {
            self.tenant(t).phase = Phase::Ready;
        }
        nothing_left
    }

    /// Starts `t`'s write in `group`: its retry slice, else a batch cut
    /// from the front of its backlog, as many items as `max_batch` and
    /// `max_batch_bytes` allow (a heavier item goes alone; S-W4, S-B5).
    /// Returns the write's size.
    fn start(&mut self, t: u8, group: u64) -> usize {
        {
            let now = self.now;
            let mt = &self.tenants[&t];
            assert_eq!(mt.phase, Phase::Ready, "model: ready tenant {t}");
            let mut n = self
                .k
                .max_batch
                .map_or(mt.queue.len(), |m| m.min(mt.queue.len()));
            if let Some(limit) = self.k.max_batch_bytes {
                let mut bytes = 0;
                let fits = mt
                    .queue
                    .iter()
                    .take(n)
                    .enumerate()
                    .take_while(|(k, i)| {
                        bytes += self.weight(**i);
                        *k == 0 || bytes <= limit
                    })
                    .count();
                n = fits;
            }
            let (id, items, attempt, first_started) = match self.tenant(t).retry.take() {
                Some(r) => (r.id, r.items, r.attempts + 1, r.first_started),
                None => {
                    let mt = self.tenant(t);
                    assert!(n > 0, "model: ready tenant {t} has nothing");
                    let items: Vec<u64> = mt.queue.drain(..n).collect();
                    if !mt.queue.is_empty() {
                        // Items left behind restart the linger clock (S-A3).
                        mt.waiting_since = now;
                    }
                    let bytes: u64 = items.iter().map(|i| self.weight(*i)).sum();
                    self.tenant(t).bytes -= bytes;
                    let id = self.next_write;
                    self.next_write += 1;
                    (id, items, 1, now)
                }
            };
            self.tenant(t).phase = Phase::InFlight;
            self.breaker_started(id);
            self.c.attempts += 1;
            let len = items.len();
            self.out.writes.push((
                id,
                t,
                items.clone(),
                attempt,
                self.k.write_timeout.map(|d| now + d),
            ));
            self.in_flight.push(MWrite {
                id,
                tenant: t,
                items,
                attempt,
                first_started,
                given_up: false,
                group,
            });
            len
        }
    }

    /// `outcome` `None`: the write's task was lost (S-W13). A lost task,
    /// a timeout, a panic or a cancellation ends the picked write's whole
    /// group (S-F4), the picked write first.
    fn finish(&mut self, pick: u8, outcome: Option<OpOutcome>) {
        if self.in_flight.is_empty() {
            return;
        }
        let picked = &self.in_flight[usize::from(pick) % self.in_flight.len()];
        let group_wide = !matches!(
            outcome,
            Some(
                OpOutcome::Written
                    | OpOutcome::Discard(_)
                    | OpOutcome::Failed
                    | OpOutcome::Rejected
            )
        );
        let mut ids = vec![picked.id];
        if group_wide {
            let g = picked.group;
            ids.extend(
                self.in_flight
                    .iter()
                    .filter(|w| w.group == g && w.id != picked.id)
                    .map(|w| w.id),
            );
        }
        for id in ids {
            let ix = self.in_flight.iter().position(|w| w.id == id).unwrap();
            self.finish_one(ix, outcome);
        }
    }

    fn finish_one(&mut self, ix: usize, outcome: Option<OpOutcome>) {
        let w = self.in_flight.remove(ix);
        let t = w.tenant;
        let n = w.items.len();
        let failure = match outcome {
            Some(o) => Outcome::from(o).failure(),
            None => Some(Failure::TaskLost),
        };
        // S-R1: every end reaches the breaker, a given-up write's too.
        self.breaker_ended(w.id, failure);
        // S-W18: every attempt ends in one counted outcome.
        if let Some(kind) = failure {
            self.fail_attempt(kind);
        }
        if w.given_up {
            // Written after all: in the store, so not a dead letter (S-B6).
            let written = matches!(outcome, Some(OpOutcome::Written | OpOutcome::Discard(_)));
            if written {
                self.c.writes += 1;
            }
            if outcome.is_some() && !written {
                if let Some(sd) = self.shutdown.as_mut().filter(|sd| !sd.reported) {
                    sd.unwritten.push((w.items[0], t, w.items));
                }
            }
            let mt = self.tenant(t);
            if mt.phase == Phase::InFlight {
                mt.phase = Phase::Idle;
            }
            self.maybe_finish_shutdown();
            return;
        }
        let Some(outcome) = outcome else {
            self.lose(t, LostReason::JoinFailed, n as u64);
            self.mark_done(&w.items, |_| Fate::Lost);
            self.after_write(t);
            return;
        };
        let rejected = match outcome {
            OpOutcome::Written | OpOutcome::Discard(_) => {
                let d = match outcome {
                    OpOutcome::Discard(d) => usize::from(d).min(n),
                    _ => 0,
                };
                self.c.written += (n - d) as u64;
                self.c.writes += 1;
                if d > 0 {
                    self.lose(t, LostReason::Discarded, d as u64);
                }
                self.mark_done(
                    &w.items,
                    |i| {
                        if i < n - d {
                            Fate::Written
                        } else {
                            Fate::Lost
                        }
                    },
                );
                self.after_write(t);
                return;
            }
            OpOutcome::Rejected => true,
            _ => false,
        };
        let exhausted = self.k.max_attempts.is_some_and(|m| w.attempt >= m)
            || self
                .k
                .max_retry
                .is_some_and(|d| self.now - w.first_started >= d);
        if rejected {
            self.lose(t, LostReason::Terminal, n as u64);
            self.mark_done(&w.items, |_| Fate::Lost);
            self.dead_letter(t, &w.items, DeadReason::Terminal);
            self.after_write(t);
        } else if self.k.drop {
            self.drop_(t, DropReason::SinkError, n as u64);
            self.mark_done(&w.items, |_| Fate::Dropped);
            self.dead_letter(t, &w.items, DeadReason::SinkError);
            self.after_write(t);
        } else if exhausted {
            self.lose(t, LostReason::RetriesExhausted, n as u64);
            self.mark_done(&w.items, |_| Fate::Lost);
            self.dead_letter(t, &w.items, DeadReason::RetriesExhausted);
            self.after_write(t);
        } else {
            let at = self.now + self.backoff(w.attempt);
            let key = self.key(at);
            self.timers.insert(key, Timer::Backoff(t));
            let mt = self.tenant(t);
            mt.phase = Phase::BackingOff(key);
            mt.retry = Some(Retry {
                id: w.id,
                items: w.items,
                attempts: w.attempt,
                first_started: w.first_started,
            });
        }
    }

    /// After a write settled (not retried), the tenant's next step: its
    /// backlog is placed, skipping linger once the fence is up or when it
    /// holds items staged before the latest flush (S-A3, S-A4, S-W9).
    fn after_write(&mut self, t: u8) {
        let closed = self.life == Life::Closed;
        let mt = self.tenant(t);
        mt.phase = Phase::Idle;
        if closed {
            return;
        }
        if let Some(&front) = mt.queue.front() {
            let skip = self.life != Life::Open || front < self.flush_bound;
            self.ready_or_linger(t, skip);
        }
    }

    /// Items leave the pending state; open waits count them.
    fn mark_done(&mut self, items: &[u64], how: impl Fn(usize) -> Fate) {
        self.c.pending -= items.len() as u64;
        self.pending_bytes -= items.iter().map(|i| self.weight(*i)).sum::<u64>();
        for (i, item) in items.iter().enumerate() {
            self.fate.insert(*item, how(i));
        }
        let mut done = Vec::new();
        for (id, w) in self.waits.iter_mut() {
            for (i, item) in items.iter().enumerate() {
                if w.remaining > 0 && w.items.binary_search(item).is_ok() {
                    match how(i) {
                        Fate::Written => w.report.written += 1,
                        Fate::Dropped => w.report.dropped += 1,
                        Fate::Lost => w.report.lost += 1,
                        Fate::Pending => unreachable!(),
                    }
                    w.remaining -= 1;
                    if w.remaining == 0 {
                        done.push(*id);
                    }
                }
            }
        }
        for id in done {
            self.answer(id);
        }
    }

    fn open_wait(&mut self, id: u64, timeout_ms: u16) {
        let deadline = self.now + Duration::from_millis(u64::from(timeout_ms));
        let key = self.key(deadline);
        let items: Vec<u64> = self
            .fate
            .iter()
            .filter(|(_, f)| **f == Fate::Pending)
            .map(|(i, _)| *i)
            .collect();
        let remaining = items.len() as u64;
        assert_eq!(remaining, self.c.pending, "model: pending items");
        self.waits.insert(
            id,
            MWait {
                items,
                remaining,
                report: Report::default(),
                key,
            },
        );
        if remaining == 0 {
            self.answer(id);
        } else {
            self.timers.insert(key, Timer::Deadline(id));
            self.fire_due();
        }
    }

    fn answer(&mut self, id: u64) {
        let Some(w) = self.waits.remove(&id) else {
            return;
        };
        self.timers.remove(&w.key);
        let report = Report {
            pending: w.remaining,
            ..w.report
        };
        if self.shutdown.as_ref().is_some_and(|sd| sd.first == id) {
            self.close();
            self.shutdown.as_mut().expect("checked").settled = Some(report);
            self.maybe_finish_shutdown();
        } else {
            self.out.answers.insert(id, (report, None));
        }
    }

    fn shutdown(&mut self, timeout_ms: u16) {
        let id = self.next_wait;
        self.next_wait += 1;
        match self.life {
            Life::Closed => {
                self.out
                    .answers
                    .insert(id, (Report::default(), Some((false, Vec::new()))));
            }
            Life::Closing => {
                let deadline = self.now + Duration::from_millis(u64::from(timeout_ms));
                let sd = self.shutdown.as_mut().expect("closing");
                sd.joined.push(id);
                let first = sd.first;
                let old = self.waits[&first].key;
                if deadline < old.0 {
                    self.timers.remove(&old);
                    let key = self.key(deadline);
                    self.timers.insert(key, Timer::Deadline(first));
                    self.waits.get_mut(&first).expect("open").key = key;
                    self.fire_due();
                }
            }
            Life::Open => {
                self.life = Life::Closing;
                self.release_lingering();
                self.flush_bound = self.next_item;
                self.shutdown = Some(MShutdown {
                    first: id,
                    joined: Vec::new(),
                    settled: None,
                    unwritten: Vec::new(),
                    reported: false,
                });
                self.open_wait(id, timeout_ms);
            }
        }
    }

    fn close(&mut self) {
        self.life = Life::Closed;
        self.ready.clear();
    }

    fn maybe_finish_shutdown(&mut self) {
        let given_up = self.in_flight.iter().any(|w| w.given_up);
        let Some(sd) = self.shutdown.as_mut() else {
            return;
        };
        let Some(report) = sd.settled else {
            return;
        };
        if given_up {
            return;
        }
        sd.settled = None;
        sd.reported = true;
        let mut unwritten = std::mem::take(&mut sd.unwritten);
        // By tenant; one tenant's runs in staging order (S-B6).
        unwritten.sort_by_key(|(first, t, _)| (*t, *first));
        let dead = unwritten.into_iter().map(|(_, t, v)| (t, v)).collect();
        self.out
            .answers
            .insert(sd.first, (report, Some((true, dead))));
        for id in std::mem::take(&mut sd.joined) {
            let r = Report {
                deadline_passed: report.deadline_passed,
                ..Report::default()
            };
            self.out.answers.insert(id, (r, Some((false, Vec::new()))));
        }
    }

    fn give_up_all(&mut self, reason: LostReason) -> Vec<(u64, u8, Vec<u64>)> {
        let mut settle: Vec<(u8, Vec<u64>)> = Vec::new();
        for w in self.in_flight.iter_mut().filter(|w| !w.given_up) {
            w.given_up = true;
            settle.push((w.tenant, w.items.clone()));
        }
        let mut held = Vec::new();
        for (t, mt) in self.tenants.iter_mut() {
            if let Phase::BackingOff(key) | Phase::Lingering(key) = mt.phase {
                self.timers.remove(&key);
            }
            if mt.phase != Phase::InFlight {
                mt.phase = Phase::Idle;
            }
            if let Some(r) = mt.retry.take() {
                held.push((r.items[0], *t, r.items.clone()));
                settle.push((*t, r.items));
            }
            if !mt.queue.is_empty() {
                mt.bytes = 0;
                let items: Vec<u64> = mt.queue.drain(..).collect();
                held.push((items[0], *t, items.clone()));
                settle.push((*t, items));
            }
        }
        self.ready.clear();
        if let Some(sd) = self.shutdown.as_mut().filter(|sd| !sd.reported) {
            sd.unwritten.append(&mut held);
        }
        for (t, items) in settle {
            self.lose(t, reason, items.len() as u64);
            self.mark_done(&items, |_| Fate::Lost);
        }
        held
    }

    /// The earliest age deadline (S-R3) of a tenant not in flight: just
    /// past its oldest item's staging time plus `max_item_age`; ties in
    /// tenant order.
    fn next_expiry(&self) -> Option<(Time, u8)> {
        let age = self.k.max_item_age?;
        let age = u64::try_from(age.as_nanos()).unwrap_or(u64::MAX);
        self.tenants
            .iter()
            .filter(|(_, mt)| mt.phase != Phase::InFlight)
            .filter_map(|(&t, mt)| {
                let oldest = mt
                    .retry
                    .as_ref()
                    .map(|r| r.items[0])
                    .or(mt.queue.front().copied())?;
                let at = self.staged_at[oldest as usize].as_nanos();
                Some((
                    Time::from_nanos(at.saturating_add(age).saturating_add(1)),
                    t,
                ))
            })
            .min()
    }

    /// At a tenant's age deadline (S-R3), breaker open or not, what it
    /// holds older than `max_item_age` is lost under `expired` as at a
    /// write's start; a ready tenant stays in the queue (an empty one is
    /// passed over there), any other is placed again or left idle.
    fn expire_by_timer(&mut self, t: u8) {
        let age = self.k.max_item_age.expect("armed only with an age");
        let Some(cutoff) = self.now.as_nanos().checked_sub(age.as_nanos() as u64) else {
            return;
        };
        let old = |m: &Model, i: u64| m.staged_at[i as usize].as_nanos() < cutoff;
        let mut runs = Vec::new();
        let retry_expired = self.tenants[&t]
            .retry
            .as_ref()
            .is_some_and(|r| old(self, r.items[0]));
        if retry_expired {
            runs.push(self.tenant(t).retry.take().expect("checked").items);
        }
        if self.tenants[&t].retry.is_none() {
            let n = self.tenants[&t]
                .queue
                .iter()
                .take_while(|i| old(self, **i))
                .count();
            let items: Vec<u64> = self.tenant(t).queue.drain(..n).collect();
            let bytes: u64 = items.iter().map(|i| self.weight(*i)).sum();
            self.tenant(t).bytes -= bytes;
            if !items.is_empty() {
                runs.push(items);
            }
        }
        if runs.is_empty() {
            return;
        }
        let placed = self.tenants[&t].phase == Phase::Ready;
        if !placed {
            match self.tenants[&t].phase {
                Phase::Lingering(key) | Phase::BackingOff(key) => {
                    self.timers.remove(&key);
                }
                _ => {}
            }
            self.tenant(t).phase = Phase::Idle;
        }
        for items in runs {
            self.lose(t, LostReason::Expired, items.len() as u64);
            self.mark_done(&items, |_| Fate::Lost);
            self.dead_letter(t, &items, DeadReason::Expired);
        }
        if !placed {
            self.after_write(t);
        }
    }

    fn fire_due(&mut self) {
        loop {
            let timer = self.timers.iter().next().map(|(&k, &t)| (k, t));
            let expiry = self.next_expiry().filter(|e| e.0 <= self.now);
            if let Some((at, t)) = expiry {
                if timer.is_none_or(|(k, _)| at < k.0) {
                    self.expire_by_timer(t);
                    continue;
                }
            }
            let Some((key, timer)) = timer else {
                return;
            };
            if key.0 > self.now {
                return;
            }
            self.timers.remove(&key);
            match timer {
                Timer::Backoff(t) | Timer::Linger(t) => self.make_ready(t),
                Timer::Deadline(id) => {
                    if self.shutdown.as_ref().is_some_and(|sd| sd.first == id) {
                        if let Some(w) = self.waits.get_mut(&id) {
                            w.report.deadline_passed = true;
                        }
                        self.give_up_all(LostReason::Deadline);
                        self.close();
                    } else if let Some(mut w) = self.waits.remove(&id) {
                        w.report.deadline_passed = true;
                        let report = Report {
                            pending: w.remaining,
                            ..w.report
                        };
                        self.out.answers.insert(id, (report, None));
                    }
                }
            }
        }
    }

    /// The next timer, or the breaker's next probe while a tenant is ready
    /// for it and a slot is free (S-R2).
    fn poll_timeout(&self) -> Option<Time> {
        let timer = self.timers.keys().next().map(|k| k.0);
        let timer = match (timer, self.next_expiry().map(|e| e.0)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let probe = self
            .breaker
            .open
            .filter(|o| o.probe.is_none())
            .map(|o| o.next_probe)
            .filter(|_| {
                self.life != Life::Closed
                    && !self.ready.is_empty()
                    && self.groups_in_flight() < self.k.concurrency
            });
        match (timer, probe) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

// ----- proptest wiring ---------------------------------------------------

/// Every knob, each off (or at its default) often enough that the plain
/// paths keep their share of the cases.
fn config_draw() -> impl Strategy<Value = ConfigDraw> {
    let opt = |hi: u8| prop_oneof![Just(0u8), 1..=hi];
    let rare = |hi: u8| prop_oneof![2 => Just(0u8), 1 => 1..=hi];
    (
        (0u8..5, opt(40), opt(12), opt(6)),
        (0u8..50, 0u8..30, opt(5), opt(30)),
        (prop::bool::weighted(0.2), opt(100), any::<u64>()),
        (prop_oneof![2 => Just(1u8), 1 => 2u8..5], opt(12)),
        (rare(99), opt(100), rare(31), rare(60)),
        (rare(4), 0u8..200, 0u8..30, rare(120), any::<bool>()),
    )
        .prop_map(
            |(
                (concurrency, capacity, tenant_capacity, max_batch),
                (initial_backoff_ms, max_backoff_extra, max_attempts, max_retry_10ms),
                (drop_policy, write_timeout_10ms, seed),
                (max_slices, max_group_items),
                (linger_ms, jitter_pct, max_batch_bytes, capacity_bytes),
                (
                    breaker_failures,
                    probe_interval_ms,
                    max_probe_extra_10ms,
                    max_item_age_5ms,
                    dead_letters,
                ),
            )| ConfigDraw {
                concurrency,
                capacity,
                tenant_capacity,
                max_batch,
                max_batch_bytes,
                capacity_bytes,
                linger_ms,
                initial_backoff_ms,
                max_backoff_extra,
                jitter_pct,
                max_attempts,
                max_retry_10ms,
                drop_policy,
                write_timeout_10ms,
                seed,
                max_slices,
                max_group_items,
                breaker_failures,
                probe_interval_ms,
                max_probe_extra_10ms,
                max_item_age_5ms,
                dead_letters,
            },
        )
}

fn op_outcome() -> impl Strategy<Value = OpOutcome> {
    prop_oneof![
        20 => Just(OpOutcome::Written),
        2 => (0u8..4).prop_map(OpOutcome::Discard),
        8 => Just(OpOutcome::Failed),
        2 => Just(OpOutcome::Panicked),
        2 => Just(OpOutcome::TimedOut),
        2 => Just(OpOutcome::Rejected),
        2 => Just(OpOutcome::Cancelled),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        60 => (any::<u8>(), prop_oneof![3 => 0u8..2, 1 => any::<u8>()])
            .prop_map(|(tenant, count)| Op::Stage { tenant, count }),
        40 => Just(Op::Poll),
        50 => (any::<u8>(), op_outcome()).prop_map(|(pick, outcome)| Op::Finish { pick, outcome }),
        3 => any::<u8>().prop_map(|pick| Op::FinishLost { pick }),
        20 => (0u16..300).prop_map(|ms| Op::Advance { ms }),
        2 => (300u16..5_000).prop_map(|ms| Op::Advance { ms }),
        12 => Just(Op::AdvanceToTimeout),
        5 => (0u16..400).prop_map(|timeout_ms| Op::Flush { timeout_ms }),
        4 => (0u16..400).prop_map(|timeout_ms| Op::Settle { timeout_ms }),
        3 => (0u16..600).prop_map(|timeout_ms| Op::Shutdown { timeout_ms }),
        1 => Just(Op::Abandon),
    ]
}

struct ModelMachine;

impl ReferenceStateMachine for ModelMachine {
    type State = Model;
    type Transition = Op;

    fn init_state() -> BoxedStrategy<Model> {
        (config_draw(), 1u8..=4)
            .prop_map(|(draw, tenants)| Model::new(draw, tenants))
            .boxed()
    }

    fn transitions(_: &Model) -> BoxedStrategy<Op> {
        // Built once: the strategy does not depend on the state, and
        // building it for each transition cost a few percent of the run.
        thread_local! {
            static OPS: BoxedStrategy<Op> = op().boxed();
        }
        OPS.with(Clone::clone)
    }

    fn apply(mut state: Model, op: &Op) -> Model {
        state.apply(*op);
        state
    }
}

/// The engine driven exactly as the `Harness` drives its own, plus the
/// harness itself on the same ops.
struct Sut {
    engine: Engine<u8, u64>,
    /// Stages into `engine` as the driver does (S-W19).
    stager: outbox::testkit::Stager,
    harness: Harness,
    tenant_count: u8,
    now: Time,
    next_item: u64,
    in_flight: Vec<Write<u8, u64>>,
    /// The group of each write in flight (S-F1).
    group_of: BTreeMap<WriteId, u64>,
    groups: u64,
    step: usize,
}

impl Sut {
    /// The indexes, one at a time as each is removed, of the picked
    /// write and, with `group_wide`, its group mates (S-F4).
    fn picked(&self, pick: u8, group_wide: bool) -> Vec<usize> {
        if self.in_flight.is_empty() {
            return Vec::new();
        }
        let first = &self.in_flight[usize::from(pick) % self.in_flight.len()];
        let mut ids = vec![first.id];
        if group_wide {
            let g = self.group_of.get(&first.id);
            ids.extend(
                self.in_flight
                    .iter()
                    .filter(|w| w.id != first.id && self.group_of.get(&w.id) == g)
                    .map(|w| w.id),
            );
        }
        // Each index is taken after the ones before it were removed.
        let mut left: Vec<WriteId> = self.in_flight.iter().map(|w| w.id).collect();
        ids.into_iter()
            .map(|id| {
                let ix = left.iter().position(|o| *o == id).unwrap();
                left.remove(ix);
                ix
            })
            .collect()
    }
}

/// Cases started, and whether a failure was already reported (to say how
/// many cases it took to catch a bug, for judging how strong the model is).
static CASES: AtomicUsize = AtomicUsize::new(0);
static REPORTED: AtomicBool = AtomicBool::new(false);

fn fail(step: usize, what: &str, got: &dyn std::fmt::Debug, want: &dyn std::fmt::Debug) -> ! {
    if !REPORTED.swap(true, Ordering::SeqCst) {
        eprintln!(
            "model: first failure in case {} (before shrinking)",
            CASES.load(Ordering::SeqCst)
        );
    }
    panic!("step {step}: {what}: engine {got:?}, model {want:?}");
}

fn check<T: PartialEq + std::fmt::Debug>(step: usize, what: &str, got: T, want: T) {
    if got != want {
        fail(step, what, &got, &want);
    }
}

struct ModelTest;

impl StateMachineTest for ModelTest {
    type SystemUnderTest = Sut;
    type Reference = ModelMachine;

    fn init_test(model: &Model) -> Sut {
        CASES.fetch_add(1, Ordering::SeqCst);
        let config: Config = model.draw.config();
        let weighs = model.draw.weighs();
        let engine = if weighs {
            Engine::with_weigher(config.clone(), |i: &u64| weight_of(*i))
        } else {
            Engine::new(config.clone())
        }
        .expect("a weigher whenever a byte limit is set");
        Sut {
            stager: outbox::testkit::Stager::new(&engine),
            engine,
            harness: Harness::new(config, model.tenant_count, weighs),
            tenant_count: model.tenant_count,
            now: Time::ZERO,
            next_item: 0,
            in_flight: Vec::new(),
            group_of: BTreeMap::new(),
            groups: 0,
            step: 0,
        }
    }

    fn apply(mut s: Sut, model: &Model, op: Op) -> Sut {
        s.step += 1;
        let step = s.step;
        // The model's predictions are compared first, the harness's
        // invariants last, so a plant says which of the two caught it.
        let harness = s.harness.apply(op);
        let mut out = Out::default();
        match op {
            Op::Stage { tenant, count } => {
                for _ in 0..=count % 8 {
                    let item = s.next_item;
                    s.next_item += 1;
                    // As the driver stages: a lazy clock (never read
                    // without a linger), the wake-up hint checked by the
                    // harness.
                    let now = s.now;
                    let staged = s
                        .stager
                        .stage(&mut s.engine, now, tenant % s.tenant_count, item)
                        .staged;
                    out.staged.push(staged);
                }
            }
            Op::Poll => {
                while let Some(group) = s.engine.poll_group(s.now) {
                    s.groups += 1;
                    for w in group {
                        out.writes
                            .push((w.id.0, w.tenant, w.items.clone(), w.attempt, w.deadline));
                        s.group_of.insert(w.id, s.groups);
                        s.in_flight.push(w);
                    }
                }
            }
            Op::Finish { pick, outcome } => {
                let group_wide = matches!(
                    outcome,
                    OpOutcome::TimedOut | OpOutcome::Panicked | OpOutcome::Cancelled
                );
                for ix in s.picked(pick, group_wide) {
                    let w = s.in_flight.remove(ix);
                    if let Err(err) = s.engine.finish(s.now, w, Outcome::from(outcome)) {
                        fail(step, "finish refused", &err.0.id, &"in flight");
                    }
                }
            }
            Op::FinishLost { pick } => {
                for ix in s.picked(pick, true) {
                    let w = s.in_flight.remove(ix);
                    let known = s.engine.finish_lost(s.now, w.id);
                    check(step, "finish_lost known", known, true);
                }
            }
            Op::Advance { ms } => {
                s.now = s.now + Duration::from_millis(u64::from(ms));
                s.engine.handle_timeout(s.now);
            }
            Op::AdvanceToTimeout => {
                if let Some(at) = s.engine.poll_timeout() {
                    s.now = s.now.max(at);
                    s.engine.handle_timeout(s.now);
                }
            }
            Op::Flush { timeout_ms } => {
                let d = s.now + Duration::from_millis(u64::from(timeout_ms));
                s.engine.flush(s.now, d);
            }
            Op::Settle { timeout_ms } => {
                let d = s.now + Duration::from_millis(u64::from(timeout_ms));
                s.engine.settle(s.now, d);
            }
            Op::Shutdown { timeout_ms } => {
                let d = s.now + Duration::from_millis(u64::from(timeout_ms));
                s.engine.shutdown(s.now, d);
            }
            Op::Abandon => {
                let held = s
                    .engine
                    .abandon(s.now)
                    .into_iter()
                    .map(outbox::core::Unwritten::into_parts)
                    .collect();
                out.held = Some(held);
            }
        }
        while let Some(ev) = s.engine.poll_event() {
            match ev {
                Event::Lost {
                    tenant,
                    items,
                    reason,
                    ..
                } => {
                    *out.losses
                        .entry((tenant, "lost", reason.as_str()))
                        .or_default() += items;
                }
                Event::Dropped {
                    tenant,
                    items,
                    reason,
                    ..
                } => {
                    *out.losses
                        .entry((tenant, "dropped", reason.as_str()))
                        .or_default() += items;
                }
                Event::WaitDone { id, report } => {
                    if out.answers.insert(id.0, (report, None)).is_some() {
                        fail(step, "answered twice", &id, &"once");
                    }
                }
                Event::ShutdownDone { id, report } => {
                    let (accounting, first) = (report.report(), report.first);
                    let unwritten = report.unwritten.into_iter().map(|r| r.into_parts());
                    let answer = (accounting, Some((first, unwritten.collect())));
                    if out.answers.insert(id.0, answer).is_some() {
                        fail(step, "answered twice", &id, &"once");
                    }
                }
                Event::DeadLetter(dl) => out.dead_letters.push((dl.tenant, dl.items, dl.reason)),
                Event::Written { .. } | Event::AttemptFailed { .. } | Event::CancelInFlight => {}
                other => fail(step, "an event the model does not know", &other, &"none"),
            }
        }
        let want = &model.out;
        check(step, "stage decisions", &out.staged, &want.staged);
        check(step, "writes handed out", &out.writes, &want.writes);
        check(step, "wait answers", &out.answers, &want.answers);
        check(step, "losses and drops", &out.losses, &want.losses);
        check(step, "abandon hand-back", &out.held, &want.held);
        check(step, "dead letters", &out.dead_letters, &want.dead_letters);
        if let Err(v) = harness {
            fail(step, "harness invariant", &v, &"no violation");
        }
        s
    }

    fn check_invariants(s: &Sut, model: &Model) {
        let step = s.step;
        let e = &s.engine;
        check(step, "counters", e.counters(), &model.c);
        check(step, "now", e.now(), model.now);
        check(step, "poll_timeout", e.poll_timeout(), model.poll_timeout());
        check(step, "in flight", e.in_flight(), model.in_flight.len());
        check(
            step,
            "pending bytes",
            e.pending_bytes(),
            model.pending_bytes,
        );
        check(step, "breaker", e.breaker(), model.breaker_state());
        check(
            step,
            "failures in a row",
            e.consecutive_failures(),
            model.breaker.failures,
        );
        check(
            step,
            "life",
            (e.is_shutting_down(), e.is_closed()),
            (model.life != Life::Open, model.life == Life::Closed),
        );
        check(
            step,
            "harness engine agrees",
            s.harness.engine().counters(),
            e.counters(),
        );
    }
}

/// The generator's seed: fixed, so every run explores the same cases;
/// `OUTBOX_MODEL_SEED=n` explores others.
fn seed() -> u64 {
    std::env::var("OUTBOX_MODEL_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x0b0c_5eed)
}

fn cases() -> u32 {
    std::env::var("OUTBOX_MODEL_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000)
}

/// Under a canary (`OUTBOX_CANARY` set: a child of
/// `every_canary_fails_the_model`), a failure is the point: it is neither
/// shrunk nor kept as a regression.
fn under_a_canary() -> bool {
    std::env::var_os("OUTBOX_CANARY").is_some()
}

prop_state_machine! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        max_shrink_iters: if under_a_canary() { 0 } else { 4_096 },
        rng_seed: RngSeed::Fixed(seed()),
        failure_persistence: if under_a_canary() {
            None
        } else {
            Some(Box::new(FileFailurePersistence::Direct(
                "proptest-regressions/model.txt",
            )))
        },
        ..ProptestConfig::default()
    })]

    /// The engine matches the model after every op.
    #[test]
    fn engine_matches_the_model(sequential 1..=200 => ModelTest);
}

/// The engine's planted bugs (feature `canary`, issue 26), each with the
/// checks that may see it first: the model's predictions, or the
/// harness's invariants.
#[cfg(feature = "canary")]
const CANARIES: [(&str, &[&str]); 4] = [
    // The breaker stays closed (or its run short) after a timeout (S-R1).
    ("breaker_timeout", &["breaker", "failures in a row"]),
    // A retry slice older than max_item_age goes out (S-R3, I12).
    // Its age timer (S-R3) stops too: what waits on it is not answered.
    (
        "expired_retry",
        &[
            "writes handed out",
            "losses and drops",
            "wait answers",
            "poll_timeout",
        ],
    ),
    // A commit on the last allowed attempt is dead-lettered (S-R4, I13).
    ("written_dead_letter", &["dead letters"]),
    // A retry joining a group carries its mate's items (S-W5, S-F3).
    ("group_retry_swap", &["writes handed out"]),
];

/// Each canary fails the model within the default number of cases. The
/// engine reads `OUTBOX_CANARY` at run time and a variable set here would
/// reach the tests running beside this one, so each canary runs this
/// binary's `engine_matches_the_model` in a child process, with the
/// default cases and seed.
#[cfg(feature = "canary")]
#[test]
fn every_canary_fails_the_model() {
    for (name, checks) in CANARIES {
        let out = std::process::Command::new(std::env::current_exe().expect("this test binary"))
            .args(["engine_matches_the_model", "--exact", "--test-threads=1"])
            .env("OUTBOX_CANARY", name)
            .env_remove("OUTBOX_MODEL_CASES")
            .env_remove("OUTBOX_MODEL_SEED")
            .env("RUST_BACKTRACE", "0")
            .output()
            .expect("the child runs");
        let text = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "canary {name}: {} cases passed:\n{text}",
            cases()
        );
        let case = text
            .lines()
            .find_map(|l| l.strip_prefix("model: first failure in case "))
            .and_then(|l| l.split(' ').next())
            .unwrap_or("?");
        // The first failure's message (`fail` panics with it), before
        // anything proptest adds.
        let failure = text
            .lines()
            .find(|l| l.starts_with("step "))
            .unwrap_or_else(|| panic!("canary {name}: the child failed otherwise:\n{text}"));
        assert!(
            checks
                .iter()
                .any(|c| failure.split(": ").nth(1) == Some(*c)),
            "canary {name} caught by another check than {checks:?}: {failure}"
        );
        eprintln!("canary {name}: caught in case {case}: {failure}");
    }
}

// ----- the model's own sanity ---------------------------------------------

#[test]
fn model_predicts_a_simple_retry() {
    let draw = ConfigDraw {
        concurrency: 1,
        initial_backoff_ms: 49,
        max_backoff_extra: 10,
        ..ConfigDraw::default()
    };
    let mut m = Model::new(draw, 1);
    m.apply(Op::Stage {
        tenant: 0,
        count: 1,
    });
    m.apply(Op::Poll);
    assert_eq!(m.out.writes, [(1, 0, vec![0, 1], 1, None)]);
    m.apply(Op::Finish {
        pick: 0,
        outcome: OpOutcome::Failed,
    });
    assert_eq!(m.poll_timeout(), Some(Time::from_millis(50)));
    m.apply(Op::AdvanceToTimeout);
    m.apply(Op::Poll);
    assert_eq!(m.out.writes, [(1, 0, vec![0, 1], 2, None)]);
    let _ = WriteId(1);
}
