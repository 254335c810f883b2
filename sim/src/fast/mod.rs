//! The fast world: the core alone, driven through `testkit::Harness` under
//! a virtual clock that jumps to the next thing due (a stage call, an
//! attempt's end, an engine timer, a flush), in the style of quinn's test
//! `Pair`. Faults come from the seed; the harness checks safety after every
//! step; a healed phase then checks liveness (I6) and the datastore (I1).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use outbox::core::{Time, WriteId};
use outbox::testkit::{Fate, Harness, Op, OpOutcome, Violation};
use rand::Rng;

use crate::draw::{self, chance, gap, log_uniform, SimRng};

pub mod faults;
pub mod workload;

use crate::timeline::{Attempt, AttemptEnd, ControlKind, Timeline};
use crate::world::{RunOptions, RunResult};
pub use faults::FaultPlan;
pub use workload::Workload;

/// What the simulated sink does with one attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Act {
    Ok,
    Discard(u8),
    Fail,
    Panic,
    Reject,
    LoseTask,
    /// Commits, then the reply is lost: reported as a failure.
    Ghost,
    Cancel,
}

/// The planned end of one attempt.
#[derive(Clone, Copy, Debug)]
struct Planned {
    at: Time,
    act: Act,
    /// Cut by the write timeout at `at`.
    timed_out: bool,
    /// Committed before the cut (an unknown outcome).
    commit_before_cut: bool,
}

/// The simulated datastore: de-duplicates repeated attempts of one write by
/// its id, as an idempotent sink keyed by the slice would (I1).
#[derive(Debug, Default)]
struct Store {
    by_tenant: BTreeMap<u8, Vec<u64>>,
    committed: BTreeSet<WriteId>,
    /// Items committed by an attempt reported as failed (unknown outcome):
    /// they may be in the store though counted lost or dropped.
    ghosts: BTreeSet<u64>,
}

impl Store {
    fn commit(&mut self, id: WriteId, tenant: u8, items: &[u64], ghost: bool) {
        if ghost {
            self.ghosts.extend(items.iter().copied());
        }
        if self.committed.insert(id) {
            self.by_tenant
                .entry(tenant)
                .or_default()
                .extend_from_slice(items);
        }
    }
}

/// Fault counter names, in report order.
pub const FAULT_KINDS: [&str; 14] = [
    "error",
    "panic",
    "timeout",
    "reject",
    "lose_task",
    "hang",
    "ghost",
    "discard",
    "cancel",
    "storm",
    "flush",
    "settle",
    "shutdown",
    "abandon",
];

/// One run of the fast world.
pub struct FastWorld {
    seed: u64,
    rng: SimRng,
    h: Harness,
    workload: Workload,
    plan: FaultPlan,
    steps: u64,
    sink: BTreeMap<WriteId, Planned>,
    due: BTreeSet<(Time, WriteId)>,
    store: Store,
    next_arrival: Time,
    burst_left: u32,
    next_control: Option<Time>,
    storm: bool,
    next_spell: Time,
    storm_began: Time,
    cancels_seen: u64,
    shutdown_called: bool,
    joined: bool,
    abandoned: bool,
    faults: [u64; FAULT_KINDS.len()],
    setup: String,
    timeline: Option<Timeline>,
    /// Index into `timeline.attempts` of each in-flight write's attempt.
    open_attempts: BTreeMap<WriteId, usize>,
    last_end: BTreeMap<WriteId, Time>,
}

fn fault(kind: &str) -> usize {
    FAULT_KINDS
        .iter()
        .position(|k| *k == kind)
        .expect("a known fault kind")
}

fn ms_u16(d: Duration) -> u16 {
    u16::try_from(d.as_millis()).unwrap_or(u16::MAX)
}

impl FastWorld {
    /// Draws the config, workload and faults of `seed`.
    pub fn new(seed: u64, opts: &RunOptions) -> FastWorld {
        let mut rng = draw::rng(seed);
        let pick = draw::config_with(&mut rng, |b| draw::groups(seed, b));
        let workload = Workload::draw(&mut rng);
        let plan = FaultPlan::draw(&mut rng, opts.steps, workload.tenants);
        let setup = format!(
            "config {:?} weighs={} | tenants {} skew {}/2 gap {:?} burst 1/{} x{} | faults {:?}",
            pick.config,
            pick.weighs,
            workload.tenants,
            workload.skew_half,
            workload.mean_gap,
            workload.burst_odds,
            workload.burst_max,
            plan
        );
        let mut h = Harness::new(pick.config, workload.tenants, pick.weighs);
        if opts.trace {
            h = h.with_trace();
        }
        let next_control = plan.control_gap.map(|g| Time::ZERO + gap(&mut rng, g));
        let next_spell = Time::ZERO + gap(&mut rng, plan.spell);
        let timeline = opts.trace.then(|| Timeline {
            tenants: workload.tenants,
            ..Timeline::default()
        });
        FastWorld {
            seed,
            rng,
            h,
            workload,
            plan,
            steps: opts.steps,
            sink: BTreeMap::new(),
            due: BTreeSet::new(),
            store: Store::default(),
            next_arrival: Time::ZERO,
            burst_left: 0,
            next_control,
            storm: false,
            next_spell,
            storm_began: Time::ZERO,
            cancels_seen: 0,
            shutdown_called: false,
            joined: false,
            abandoned: false,
            faults: [0; FAULT_KINDS.len()],
            setup,
            timeline,
            open_attempts: BTreeMap::new(),
            last_end: BTreeMap::new(),
        }
    }

    /// Runs the faulty phase, then (unless shut down or abandoned) the healed
    /// phase, then the datastore check.
    pub fn run(mut self) -> RunResult {
        let outcome = self
            .faulty()
            .and_then(|()| self.healed())
            .and_then(|()| self.check_store());
        let failure = outcome.err();
        let mut timeline = self.timeline.take();
        if let Some(t) = timeline.as_mut() {
            t.losses = self.h.losses().to_vec();
            t.end = self.h.now();
            if self.storm {
                t.storms.push((self.storm_began, self.h.now()));
            }
        }
        let mut faults = BTreeMap::new();
        for (k, n) in FAULT_KINDS.iter().zip(self.faults) {
            faults.insert(*k, n);
        }
        // What the faults made the breaker do (S-R1, S-R2).
        faults.insert("breaker_opened", self.h.stats.breaker_opened);
        faults.insert("probe", self.h.stats.probes);
        RunResult {
            seed: self.seed,
            steps: self.h.stats.steps,
            items: self.h.items_staged(),
            counters: self.h.engine().counters().clone(),
            faults,
            failure,
            trace_hash: self.h.trace_hash(),
            trace: self.h.trace().to_vec(),
            timeline,
            setup: self.setup,
            end: self.h.now(),
        }
    }

    // ----- phases -------------------------------------------------------

    fn faulty(&mut self) -> Result<(), Violation> {
        let mut after_finish = 0;
        while self.h.stats.steps < self.steps {
            if self.h.is_finished() {
                // A few stage calls after the end check the refusal (I8).
                after_finish += 1;
                if after_finish > 20 {
                    break;
                }
            }
            self.scripted()?;
            self.tick()?;
        }
        Ok(())
    }

    fn healed(&mut self) -> Result<(), Violation> {
        if self.h.is_finished() {
            return Ok(());
        }
        if self.storm {
            self.end_storm();
        }
        let now = self.h.now();
        self.h
            .note(|| format!("{now} world: healed phase, the sink recovers"));
        if let Some(t) = self.timeline.as_mut() {
            t.healed_at = Some(now);
        }
        // Every write still in flight completes now; then drain. Bound: a
        // poll, a finish and a timer per item, plus a timer per tenant and
        // per open wait.
        let pending = self.h.engine().pending() as usize;
        let bound = 4 * (pending + self.h.in_flight()) + 4 * 256 + 1_000;
        let store = &mut self.store;
        let given_up: Vec<WriteId> = self
            .h
            .in_flight_writes()
            .iter()
            .map(|w| w.id)
            .filter(|id| self.h.is_given_up(*id))
            .collect();
        let timeline = &mut self.timeline;
        let open = &mut self.open_attempts;
        self.h.drain_healthy_with(bound, |w| {
            store.commit(w.id, w.tenant, &w.items, given_up.contains(&w.id));
            if let (Some(t), Some(ix)) = (timeline.as_mut(), open.remove(&w.id)) {
                t.attempts[ix].result = AttemptEnd::Written;
            }
        })?;
        self.sink.clear();
        self.due.clear();
        // I6: a settle now answers with nothing pending.
        self.h.apply(Op::Settle { timeout_ms: 0 })?;
        if self.shutdown_called && !self.h.is_finished() {
            return Err(self.violation(
                "S-W9",
                "the shutdown was never answered after everything drained".to_string(),
            ));
        }
        Ok(())
    }

    /// I1: per tenant, the store holds each written item exactly once, in
    /// staging order; anything else it holds came from an unknown outcome.
    fn check_store(&self) -> Result<(), Violation> {
        let mut written = 0u64;
        for (tenant, items) in &self.store.by_tenant {
            if let Some(w) = items.windows(2).find(|w| w[0] >= w[1]) {
                return Err(self.violation(
                    "I1",
                    format!(
                        "tenant {tenant}'s store has {} before {}: out of order or twice",
                        w[0], w[1]
                    ),
                ));
            }
            for &i in items {
                if self.h.tenant_of(i) != Some(*tenant) {
                    return Err(
                        self.violation("I1", format!("item {i} stored under tenant {tenant}"))
                    );
                }
                match self.h.fate(i) {
                    Some(Fate::Written) => written += 1,
                    _ if self.store.ghosts.contains(&i) => {}
                    f => {
                        return Err(self.violation(
                            "I1",
                            format!("item {i} is in the store but counted {f:?}"),
                        ))
                    }
                }
            }
        }
        let counted = self.h.engine().counters().written;
        if written != counted {
            return Err(self.violation(
                "I1",
                format!("{counted} items counted written, {written} of them in the store"),
            ));
        }
        Ok(())
    }

    fn violation(&self, rule: &'static str, detail: String) -> Violation {
        Violation {
            rule,
            detail,
            step: self.h.stats.steps as usize,
        }
    }

    // ----- the event loop -----------------------------------------------

    /// Shutdown and abandon at the steps the plan says.
    fn scripted(&mut self) -> Result<(), Violation> {
        let steps = self.h.stats.steps;
        if let Some((at, deadline)) = self.plan.shutdown_at {
            if !self.shutdown_called && steps >= at {
                self.shutdown_called = true;
                self.control(ControlKind::Shutdown, Some(deadline))?;
            } else if let Some((after, deadline)) = self.plan.shutdown_join {
                if self.shutdown_called && !self.joined && steps >= at + after {
                    self.joined = true;
                    self.control(ControlKind::Shutdown, Some(deadline))?;
                }
            }
        }
        if let Some(at) = self.plan.abandon_at {
            if !self.abandoned && steps >= at {
                self.abandoned = true;
                self.control(ControlKind::Abandon, None)?;
            }
        }
        Ok(())
    }

    /// Does the next thing due, or moves the clock to it.
    fn tick(&mut self) -> Result<(), Violation> {
        let now = self.h.now();
        if let Some(&(at, id)) = self.due.first() {
            if at <= now {
                self.due.remove(&(at, id));
                self.complete(id)?;
                return self.poll();
            }
        }
        if self.next_spell <= now {
            if self.storm {
                self.end_storm();
            } else {
                self.storm = true;
                self.storm_began = now;
                self.faults[fault("storm")] += 1;
                self.h.note(|| format!("{now} world: storm begins"));
            }
            self.next_spell =
                now + gap(&mut self.rng, self.plan.spell).max(Duration::from_millis(1));
            return Ok(());
        }
        if self.next_arrival <= now {
            self.arrive(now)?;
            return self.poll();
        }
        if let Some(at) = self.next_control.filter(|at| *at <= now) {
            let kind = if chance(&mut self.rng, 1, 2) {
                ControlKind::Flush
            } else {
                ControlKind::Settle
            };
            let deadline = if chance(&mut self.rng, 1, 10) {
                Duration::ZERO
            } else {
                Duration::from_millis(log_uniform(&mut self.rng, 1, 60_000))
            };
            let g = self.plan.control_gap.unwrap_or(Duration::from_secs(1));
            self.next_control = Some(at + gap(&mut self.rng, g).max(Duration::from_micros(1)));
            return self.control(kind, Some(deadline));
        }
        // Nothing due: move the clock to the earliest of the world's next
        // event and the engine's next timer.
        let world = [
            Some(self.next_arrival),
            self.next_control,
            self.due.first().map(|(t, _)| *t),
            Some(self.next_spell),
        ]
        .into_iter()
        .flatten()
        .min()
        .expect("an arrival is always scheduled");
        match self.h.engine().poll_timeout() {
            Some(timer) if timer <= world => {
                self.h.apply(Op::AdvanceToTimeout)?;
            }
            _ => {
                let nanos = (world - now).as_nanos();
                let ms = nanos.div_ceil(1_000_000).clamp(1, u128::from(u16::MAX));
                self.h.apply(Op::Advance {
                    ms: u16::try_from(ms).unwrap_or(u16::MAX),
                })?;
            }
        }
        self.poll()
    }

    fn end_storm(&mut self) {
        self.storm = false;
        let now = self.h.now();
        self.h.note(|| format!("{now} world: storm ends"));
        if let Some(t) = self.timeline.as_mut() {
            t.storms.push((self.storm_began, now));
        }
    }

    /// One stage call, or in a burst a chunk of them whose items reach the
    /// engine together, as the writer takes its hand-offs in (S-C10): a
    /// drawn number of calls, their items 1 to 512 in all. Then the time
    /// of the next.
    fn arrive(&mut self, now: Time) -> Result<(), Violation> {
        let calls = if self.burst_left > 1 {
            let items = log_uniform(&mut self.rng, 1, 512);
            let mut calls = Vec::new();
            let mut staged = 0;
            while staged < items && calls.len() < self.burst_left as usize {
                let tenant = self.workload.tenant(&mut self.rng);
                let count = self.rng.random_range(0..self.workload.max_count);
                staged += u64::from(count) + 1;
                calls.push((tenant, count));
            }
            // The calls beyond the first came in the same burst.
            self.burst_left -= calls.len() as u32 - 1;
            calls
        } else {
            let tenant = self.workload.tenant(&mut self.rng);
            vec![(tenant, self.rng.random_range(0..self.workload.max_count))]
        };
        let before = self.h.engine().counters().clone();
        if let [(tenant, count)] = calls[..] {
            self.h.apply(Op::Stage { tenant, count })?;
        } else {
            self.h.stage_calls(&calls)?;
        }
        if let Some(t) = self.timeline.as_mut() {
            let c = self.h.engine().counters();
            // Refusals are told apart by call only roughly: the first calls
            // take them (the trace draws counts, not items).
            let mut refused = (c.lost_total() + c.dropped_total())
                .saturating_sub(before.lost_total() + before.dropped_total());
            for &(tenant, count) in &calls {
                let n = u64::from(count) + 1;
                let r = refused.min(n);
                refused -= r;
                t.stages.push((now, tenant, (n - r) as u32, r as u32));
            }
        }
        if self.burst_left == 0 && chance(&mut self.rng, 1, self.workload.burst_odds) {
            self.burst_left = self.rng.random_range(1..=self.workload.burst_max);
        }
        let wait = if self.burst_left > 0 {
            self.burst_left -= 1;
            Duration::from_micros(self.rng.random_range(0..=1_000))
        } else {
            gap(&mut self.rng, self.workload.mean_gap)
        };
        self.next_arrival = now + wait;
        Ok(())
    }

    fn control(&mut self, kind: ControlKind, deadline: Option<Duration>) -> Result<(), Violation> {
        self.faults[fault(kind.as_str())] += 1;
        let now = self.h.now();
        if let Some(t) = self.timeline.as_mut() {
            t.controls.push((now, kind, deadline.map(|d| now + d)));
        }
        let deadline_ms = deadline.map_or(0, ms_u16);
        let op = match kind {
            ControlKind::Flush => Op::Flush {
                timeout_ms: deadline_ms,
            },
            ControlKind::Settle => Op::Settle {
                timeout_ms: deadline_ms,
            },
            ControlKind::Shutdown => Op::Shutdown {
                timeout_ms: deadline_ms,
            },
            ControlKind::Abandon => Op::Abandon,
        };
        self.h.apply(op)?;
        self.poll()
    }

    /// Starts every write the engine hands out and plans its end; cancels
    /// what the engine gave up.
    fn poll(&mut self) -> Result<(), Violation> {
        self.h.apply(Op::Poll)?;
        let now = self.h.now();
        let new: Vec<(WriteId, u8, u32, usize, Option<Time>)> = self
            .h
            .in_flight_writes()
            .iter()
            .filter(|w| !self.sink.contains_key(&w.id))
            .map(|w| (w.id, w.tenant, w.attempt, w.items.len(), w.deadline))
            .collect();
        for (id, tenant, attempt, items, deadline) in new {
            let planned = self.plan_attempt(now, tenant, deadline);
            self.sink.insert(id, planned);
            self.due.insert((planned.at, id));
            if let Some(t) = self.timeline.as_mut() {
                if let Some(end) = self.last_end.remove(&id) {
                    t.backoffs.push((tenant, end, now));
                }
                self.open_attempts.insert(id, t.attempts.len());
                t.attempts.push(Attempt {
                    tenant,
                    write: id.0,
                    attempt,
                    items,
                    start: now,
                    end: now,
                    result: AttemptEnd::Running,
                });
            }
        }
        if self.h.cancel_requests() != self.cancels_seen {
            self.cancels_seen = self.h.cancel_requests();
            let cancel: Vec<WriteId> = self
                .h
                .in_flight_writes()
                .iter()
                .map(|w| w.id)
                .filter(|id| self.h.is_given_up(*id))
                .collect();
            for id in cancel {
                if let Some(p) = self.sink.get_mut(&id) {
                    if p.at > now {
                        self.due.remove(&(p.at, id));
                        p.at = now;
                        p.act = Act::Cancel;
                        p.timed_out = false;
                        self.due.insert((now, id));
                    }
                }
            }
        }
        Ok(())
    }

    fn plan_attempt(&mut self, now: Time, tenant: u8, deadline: Option<Time>) -> Planned {
        let p = &self.plan;
        let factor = if self.storm { p.storm_factor } else { 1 };
        let act = if self.storm && tenant < p.bad_tenants {
            Act::Fail
        } else {
            let rates = [
                (p.error, Act::Fail),
                (p.panic, Act::Panic),
                (p.reject, Act::Reject),
                (p.lose_task, Act::LoseTask),
                (p.ghost, Act::Ghost),
                (p.discard, Act::Discard(0)),
                (p.cancel, Act::Cancel),
            ];
            let mut x = self.rng.random_range(0..1_000u32);
            let mut act = Act::Ok;
            for (rate, a) in rates {
                let r = rate.saturating_mul(factor).min(1_000);
                if x < r {
                    act = a;
                    break;
                }
                x -= r;
            }
            act
        };
        let act = match act {
            Act::Discard(_) => Act::Discard(self.rng.random_range(1..=3)),
            a => a,
        };
        let hang_rate = p.hang.saturating_mul(factor).min(1_000);
        let hang = self.rng.random_range(0..1_000u32) < hang_rate;
        let latency = if hang {
            self.faults[fault("hang")] += 1;
            Duration::from_millis(log_uniform(&mut self.rng, 5_000, 120_000))
        } else {
            gap(&mut self.rng, p.latency)
        };
        let mut at = now + latency;
        let mut timed_out = false;
        if let Some(d) = deadline {
            if at >= d {
                at = d;
                timed_out = true;
            }
        }
        let commit_before_cut = timed_out && chance(&mut self.rng, 1, 4);
        Planned {
            at,
            act,
            timed_out,
            commit_before_cut,
        }
    }

    /// Ends write `id`'s attempt as planned.
    fn complete(&mut self, id: WriteId) -> Result<(), Violation> {
        let Some(p) = self.sink.remove(&id) else {
            return Ok(());
        };
        let Some(pick) = self.h.in_flight_writes().iter().position(|w| w.id == id) else {
            return Ok(());
        };
        let given_up = self.h.is_given_up(id);
        let (tenant, commit) = {
            let w = &self.h.in_flight_writes()[pick];
            let commit = match (p.timed_out, p.act) {
                (true, _) if p.commit_before_cut => Some((w.items.clone(), true)),
                (true, _) => None,
                (false, Act::Ok) => Some((w.items.clone(), given_up)),
                (false, Act::Discard(n)) => {
                    let keep = w.items.len().saturating_sub(usize::from(n));
                    Some((w.items[..keep].to_vec(), given_up))
                }
                (false, Act::Ghost) => Some((w.items.clone(), true)),
                _ => None,
            };
            (w.tenant, commit)
        };
        if let Some((items, ghost)) = commit {
            self.store.commit(id, tenant, &items, ghost);
        }
        let pick = u8::try_from(pick).expect("at most 255 writes in flight");
        let (op, end) = if p.timed_out {
            self.faults[fault("timeout")] += 1;
            (
                Op::Finish {
                    pick,
                    outcome: OpOutcome::TimedOut,
                },
                AttemptEnd::TimedOut,
            )
        } else {
            let (outcome, end, kind) = match p.act {
                Act::Ok => (OpOutcome::Written, AttemptEnd::Written, None),
                Act::Discard(n) => (OpOutcome::Discard(n), AttemptEnd::Written, Some("discard")),
                Act::Fail => (OpOutcome::Failed, AttemptEnd::Failed, Some("error")),
                Act::Ghost => (OpOutcome::Failed, AttemptEnd::Failed, Some("ghost")),
                Act::Panic => (OpOutcome::Panicked, AttemptEnd::Panicked, Some("panic")),
                Act::Reject => (OpOutcome::Rejected, AttemptEnd::Rejected, Some("reject")),
                Act::Cancel => (OpOutcome::Cancelled, AttemptEnd::Cancelled, Some("cancel")),
                Act::LoseTask => (OpOutcome::Written, AttemptEnd::TaskLost, Some("lose_task")),
            };
            if let Some(kind) = kind {
                if !(given_up && p.act == Act::Cancel) {
                    self.faults[fault(kind)] += 1;
                }
            }
            let op = if p.act == Act::LoseTask {
                Op::FinishLost { pick }
            } else {
                Op::Finish { pick, outcome }
            };
            (op, end)
        };
        let now = self.h.now();
        if let Some(t) = self.timeline.as_mut() {
            if let Some(ix) = self.open_attempts.remove(&id) {
                t.attempts[ix].end = now;
                t.attempts[ix].result = end;
            }
            self.last_end.insert(id, now);
        }
        self.h.apply(op)
    }
}
