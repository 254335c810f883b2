//! Drives an [`Engine`] with [`Op`]s and checks the invariants after every
//! op (I2-I5, I7-I9 and the order half of I1): the one checker the
//! fuzz target, the model test and the simulation's fast world share.
//!
//! The harness keeps its own account of every item (pending, written,
//! dropped, lost) from what it did and what the engine said, and compares
//! it with the engine's counters, the writes it hands out and the reports
//! it gives. Any mismatch is a [`Violation`] naming the invariant.
//!
//! It stages as the driver does, through a [`Stager`](crate::testkit::Stager)
//! (admission by reservation and the intake, S-W19; a lazy clock and a
//! wake-up hint), and holds the hint to its promise: a stage
//! that says "no need to drain" when no drain is already due (an earlier
//! "drain" or another input since the last full drain, a write holding
//! every slot that will come back, a timer armed at or before now) must
//! leave nothing a full drain would find: no write to start, no event, no
//! earlier timeout. Otherwise it is a lost wake-up (I6). Every attempt
//! must end in exactly one counted outcome (S-W18), checked after every op.
//!
//! # Where things are
//! - `ops`: the driver of ops ([`Harness::apply`]), one function per op.
//! - `events`: the drain of events, one handler per kind of event.
//! - `ledger`: the harness's own account of items, backlogs, slices, waits.
//! - `trace`: the trace hash, the trace lines and the losses seen.
//! - one file per group of rules, named for the contract's section:
//!   `staging`, `writing`, `waits` (flush, settle, shutdown), `accounting`,
//!   `liveness`.
//!
//! # Rule → check
//! Each check is a function named for its rule (`check_<rule>_<what>`);
//! docs/contract.md defines the ids.
//!
//! | Rule | Check (file) |
//! |------|--------------|
//! | I2 (S-W5) | `check_i2_fresh_write_id`, `check_i2_identical_retry_slice` (writing); an unknown write written (events) |
//! | I3 | `check_i3_counters_match_the_ledger`, `check_i3_pending_bytes` (accounting) |
//! | I4, S-F1 | `check_i4_in_flight_bounds`, `check_s_f1_group_shape` (writing) |
//! | S-F2 | `check_s_f2_group_items` (writing) |
//! | S-F3 | every per-write check, each slice of a group checked as a write (writing, events) |
//! | S-F4 | a group-wide failure ends every slice of its group (ops: `finish`, `finish_lost`) |
//! | I5 | `check_i5_stage_drop_has_its_cause`, `check_i5_refused_only_after_the_fence` (staging); `check_i5_batch_dropped_only_under_the_drop_policy`, `check_i5_write_loss_has_its_cause` (writing); `check_i5_loss_reason_holds` (waits); `check_i5_released_items_are_counted` (accounting) |
//! | I6 | `check_wake_hint` (liveness); [`Harness::drain_healthy`] (ops) |
//! | I7 | `check_i7_backoff_respected` (writing) |
//! | I8 | `check_i8_no_write_after_the_end` (writing); `check_i8_shutdown_is_final` (waits) |
//! | S-A1 | `check_s_a1_capacity` (staging) |
//! | S-A4 | `check_s_a4_report_is_truthful`, `check_s_a4_not_answered_early` (waits) |
//! | S-A5 | `check_s_a5_retry_only_under_the_retry_policy`, `check_s_a5_no_retry_after_a_rejection` (writing) |
//! | S-A7 | `check_s_a7_abandon_hands_back_lost_items` (waits) |
//! | S-B1, S-W8 (I9) | `check_s_b1_work_conserving`, `check_s_b1_ready_backlogs_started` (liveness) |
//! | S-B2 | `check_s_b2_retry_limits` (writing) |
//! | S-B3 | `check_s_b3_write_deadline` (writing) |
//! | S-B5 | `check_s_b5_capacity_bytes` (staging); `check_s_b5_max_batch_bytes` (writing) |
//! | S-B6 | `check_s_b6_dead_letters`, `check_s_b6_dead_letters_are_kept` (waits) |
//! | S-B7 | `check_s_b7_tenant_quota` (staging) |
//! | S-C2 | a write whose size changed (events); a refused finish (ops) |
//! | S-W3 | `check_s_w3_staging_order` (writing) |
//! | S-W4 | `check_s_w4_not_empty`, `check_s_w4_max_batch`, `check_s_w4_batch_takes_all_that_fits` (writing) |
//! | S-W7 | `check_s_w7_backoff_cap`, `check_s_w7_backoff_range` (writing); `check_s_w7_due_retries_started` (liveness) |
//! | S-W9 | `check_s_w9_accepted_before_the_fence` (staging); `check_s_w9_nothing_pending_after_a_mass_loss`, `check_s_w9_a_joining_caller_reports_nothing` (waits) |
//! | S-W13 | a vanished task's write not in flight (ops) |
//! | S-W14 | `check_s_w14_accounting` (accounting) |
//! | S-W15 | `check_s_w15_deadline_passed_truthfully`, `check_s_w15_waits_answered_by_deadline`, `check_s_w15_shutdown_answered_by_deadline` (waits) |
//! | I10, S-R1, S-R2 | `check_i10_only_probes_while_open` (outage); the model in `model_attempt_ended` |
//! | I11 | `check_s_b1_work_conserving` once a probe is overdue (liveness, outage) |
//! | I12, S-R3 | `check_i12_no_item_too_old` (outage, on each write); `on_expired` (outage, on each `expired` loss) |
//! | I13, S-R4 | `on_dead_letter`, `check_i13_every_run_time_loss_handed_out` (outage) |
//! | S-W18 | `check_s_w18_attempts`, `check_s_w18_given_up_write_ends_once`, `check_s_w18_given_up_matches_the_return` (accounting) |
//!
//! The checks between ops run in the order of `check_after_op`
//! (accounting); those of a write in the order of `check_write` (writing).

mod accounting;
mod events;
mod ledger;
mod liveness;
mod ops;
mod outage;
mod staging;
mod trace;
mod violation;
mod waits;
mod writing;

use std::collections::{BTreeMap, BTreeSet, VecDeque};

pub use ledger::Fate;
use ledger::{FateTree, Slice, WaitCheck};
use trace::Fnv;
pub use trace::Loss;
pub use violation::Violation;

use super::op::weight_of;
#[cfg(doc)]
use super::op::Op;
use crate::core::{
    Config, Counters, DropReason, Engine, Failure, LostReason, Time, WaitId, Write, WriteId,
};

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
    /// Times the breaker opened, as the harness models it (S-R1).
    pub breaker_opened: u64,
    /// Probes started while it was open (S-R2).
    pub probes: u64,
}

/// The engine under test plus the harness's own account.
pub struct Harness {
    engine: Engine<u8, u64>,
    /// Stages into `engine` as the driver does (S-W19).
    stager: crate::testkit::Stager,
    config: Config,
    weighs: bool,
    tenants: u8,
    now: Time,
    next_item: u64,
    step: usize,
    in_flight: Vec<Write<u8, u64>>,
    /// The group each write in flight was handed out in (S-F1), numbered
    /// by the harness from 1.
    group_of: BTreeMap<WriteId, u64>,
    /// The last group number given.
    groups: u64,
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
    /// A drain is due, as the driver would have one: a stage said so, or
    /// another input came, since the last full drain (`Op::Poll`).
    drain_due: bool,
    /// The timeout the last full drain armed (the driver's timer).
    armed: Option<Time>,
    /// The given-up write being finished now, whose end the engine still
    /// counts (S-W18).
    returning: Option<WriteId>,
    /// Attempt ends seen in events: written, and failed by kind (S-W18).
    writes_seen: u64,
    failed_seen: [u64; Failure::ALL.len()],
    /// When each item was staged, indexed by item number (I12).
    staged_at: Vec<Time>,
    /// The age samples the engine owes for the items settled since the
    /// last check, by fate, in ns (S-R7; with a `max_item_age` only).
    ages_due: Vec<(Fate, u64)>,
    /// The harness's model of the breaker (I10, I11).
    breaker: outage::BreakerModel,
    /// Items handed out as run-time dead letters (I13).
    dead_lettered_items: BTreeSet<u64>,
    /// Of those, how many per [`DeadReason`](crate::core::DeadReason), in its `ALL` order.
    dead_lettered: [u64; crate::core::DeadReason::ALL.len()],
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
            stager: crate::testkit::Stager::new(&engine),
            engine,
            config,
            weighs,
            tenants: tenants.max(1),
            now: Time::ZERO,
            next_item: 0,
            step: 0,
            in_flight: Vec::new(),
            group_of: BTreeMap::new(),
            groups: 0,
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
            drain_due: false,
            armed: None,
            returning: None,
            writes_seen: 0,
            failed_seen: [0; Failure::ALL.len()],
            staged_at: Vec::new(),
            ages_due: Vec::new(),
            breaker: outage::BreakerModel::default(),
            dead_lettered_items: BTreeSet::new(),
            dead_lettered: [0; crate::core::DeadReason::ALL.len()],
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
    /// flight ([`Event::CancelInFlight`](crate::core::Event::CancelInFlight)) so far.
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

    /// Groups with a write in flight, other than `except` (S-F1: each
    /// holds one concurrency slot).
    fn groups_in_flight(&self, except: Option<u64>) -> usize {
        let mut open: Vec<u64> = self
            .in_flight
            .iter()
            .filter_map(|w| self.group_of.get(&w.id).copied())
            .filter(|g| Some(*g) != except)
            .collect();
        open.sort_unstable();
        open.dedup();
        open.len()
    }

    /// The writes in flight in the group of write `id` (S-F4), `id` first.
    pub fn group_mates(&self, id: WriteId) -> Vec<WriteId> {
        let group = self.group_of.get(&id).copied();
        let mut mates = vec![id];
        mates.extend(
            self.in_flight
                .iter()
                .map(|w| w.id)
                .filter(|o| *o != id && group.is_some() && self.group_of.get(o).copied() == group),
        );
        mates
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

    /// Whether the harness's model of the breaker says it is open (S-R1).
    pub fn is_breaker_open(&self) -> bool {
        self.breaker_open()
    }

    /// Whether a shutdown has been answered or the engine abandoned.
    pub fn is_finished(&self) -> bool {
        self.shutdown_done || self.abandoned
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::core::Config;
    use crate::testkit::op::{Op, OpOutcome};

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
            Op::Flush { timeout_ms: 100 },
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
