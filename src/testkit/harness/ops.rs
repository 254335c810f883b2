//! The driver of ops: applies each [`Op`] to the engine as the tokio driver
//! would (stage, poll writes, finish them, move the clock, flush, settle,
//! shut down, abandon), keeps the ledger in step, and runs the checks of
//! each step. Every op ends with a full drain of events and
//! [`Harness::check_after_op`].

use std::hash::Hash;
use std::time::Duration;

use super::ledger::Fate;
use super::trace::fault_name;
use super::{Harness, Violation};
use crate::core::{LazyStaged, Outcome, Staged, Time, Write};
use crate::testkit::op::{weight_of, Op, OpOutcome};

impl Harness {
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
        if !matches!(op, Op::Stage { .. } | Op::Poll) {
            // The driver drains fully after every input but a stage.
            self.drain_due = true;
        }
        match op {
            Op::Stage { tenant, count } => {
                let tenant = tenant % self.tenants;
                for _ in 0..=count % 8 {
                    self.stage(tenant)?;
                }
            }
            Op::Poll => self.poll_full()?,
            Op::Finish { pick, outcome } => self.finish(pick, outcome)?,
            Op::FinishLost { pick } => self.finish_lost(pick)?,
            Op::Advance { ms } => {
                self.advance_to(self.now + Duration::from_millis(u64::from(ms)))?;
            }
            Op::AdvanceToTimeout => {
                if let Some(at) = self.engine.poll_timeout() {
                    self.advance_to(self.now.max(at))?;
                }
            }
            Op::Flush { timeout_ms } => self.open_wait(true, timeout_ms)?,
            Op::Settle { timeout_ms } => self.open_wait(false, timeout_ms)?,
            Op::Shutdown { timeout_ms } => self.shutdown(timeout_ms)?,
            Op::Abandon => self.abandon()?,
        }
        self.check_after_op()
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

    /// Stages the next item through the driver's path (a lazy clock and a
    /// wake-up hint), checks the verdict's cause and records it.
    fn stage(&mut self, tenant: u8) -> Result<(), Violation> {
        let id = self.next_item;
        self.next_item += 1;
        let pending_before = self.engine.pending();
        let now = self.now;
        let LazyStaged { staged, wake } = self.stager.stage(&mut self.engine, now, tenant, id);
        self.check_wake_hint(wake)?;
        self.record_verdict(id, tenant, staged, pending_before)?;
        self.drain()
    }

    /// Applies stage calls `(tenant, count)` whose items reach the engine
    /// together, as one intake chunk (S-W19, S-C10): each call stages
    /// `count % 8 + 1` items, as [`Op::Stage`] does, and the engine takes
    /// them in only after the last one was admitted. One step, checked
    /// as a whole, as the driver's writer takes its hand-offs in.
    ///
    /// # Errors
    /// The first [`Violation`] seen.
    pub fn stage_calls(&mut self, calls: &[(u8, u8)]) -> Result<(), Violation> {
        self.step += 1;
        self.stats.steps += 1;
        let mut items = Vec::new();
        for &(tenant, count) in calls {
            Op::Stage { tenant, count }.hash(&mut self.hasher);
            let tenant = tenant % self.tenants;
            for _ in 0..=count % 8 {
                items.push((tenant, self.next_item + items.len() as u64));
            }
        }
        if let Some(t) = self.trace.as_mut() {
            t.push(format!("{} op StageChunk {calls:?}", self.now));
        }
        let first = self.next_item;
        let tenants: Vec<u8> = items.iter().map(|(t, _)| *t).collect();
        let mut pending_before = self.engine.pending();
        let now = self.now;
        let (verdicts, wake) = self.stager.stage_chunk(&mut self.engine, now, items);
        self.check_wake_hint(wake)?;
        // Each verdict is checked against what the admission saw then: the
        // engine's pending items before the chunk and the chunk's accepted
        // ones before it.
        for (k, (tenant, staged)) in tenants.into_iter().zip(verdicts).enumerate() {
            // The ledger numbers items as they are recorded.
            self.next_item += 1;
            self.record_verdict(first + k as u64, tenant, staged, pending_before)?;
            pending_before += u64::from(staged == Staged::Accepted);
        }
        self.drain()?;
        self.check_after_op()
    }

    /// Checks a stage's verdict against its cause and records it in the
    /// ledger; `pending_before`: the items admitted before it.
    fn record_verdict(
        &mut self,
        id: u64,
        tenant: u8,
        staged: Staged,
        pending_before: u64,
    ) -> Result<(), Violation> {
        let tenant_pending = self.tenant_pending[usize::from(tenant)];
        let now = self.now;
        self.tenant_of.push(tenant);
        self.staged_at.push(now);
        self.settled.push();
        let w = if self.weighs { weight_of(id) } else { 0 };
        match staged {
            Staged::Accepted => {
                self.check_s_w9_accepted_before_the_fence(id)?;
                self.check_s_b7_tenant_quota(id, tenant, tenant_pending)?;
                self.ledger_accept(tenant, id, w);
            }
            Staged::Dropped(reason) => {
                self.check_i5_stage_drop_has_its_cause(
                    id,
                    reason,
                    pending_before,
                    tenant_pending,
                    w,
                )?;
                self.ledger_done_at_stage(id, Fate::Dropped);
            }
            Staged::ShuttingDown => {
                self.check_i5_refused_only_after_the_fence(id)?;
                self.ledger_done_at_stage(id, Fate::Lost);
            }
        }
        Ok(())
    }

    /// A full drain, as the driver's loop does: every write due, then every
    /// event; then the drain is no longer due and the timer is re-armed.
    fn poll_full(&mut self) -> Result<(), Violation> {
        self.poll()?;
        self.check_s_b1_work_conserving()?;
        self.drain_due = false;
        self.armed = self.engine.poll_timeout();
        Ok(())
    }

    /// Takes every write due, checking each (S-W3, S-W4, I2, I4, ...).
    fn poll(&mut self) -> Result<(), Violation> {
        while let Some(group) = self.engine.poll_group(self.now) {
            self.groups += 1;
            let g = self.groups;
            // What the engine settled before handing this group out (items
            // expired, S-R3) is in the ledger before its writes are checked
            // against it.
            self.drain()?;
            self.check_s_f1_group_shape(&group)?;
            self.check_s_f2_group_items(&group)?;
            let size = group.len();
            for w in group {
                self.stats.attempts += 1;
                // Hashed as before, so a run without fan-in keeps its hash.
                w.hash(&mut self.hasher);
                if let Some(t) = self.trace.as_mut() {
                    let of = if size > 1 {
                        format!(" group {g}/{size}")
                    } else {
                        String::new()
                    };
                    t.push(format!(
                        "{} write {} tenant {} attempt {} items {:?}{of}",
                        self.now, w.id, w.tenant, w.attempt, w.items
                    ));
                }
                self.check_write(&w, g)?;
                self.group_of.insert(w.id, g);
                self.in_flight.push(w);
            }
        }
        self.drain()
    }

    /// Moves the clock to `to` and fires the engine's timers.
    fn advance_to(&mut self, to: Time) -> Result<(), Violation> {
        self.now = to;
        self.engine.handle_timeout(self.now);
        self.drain()
    }

    /// A write in flight ends with `outcome` (picked by index, modulo the
    /// writes in flight; nothing when none is).
    ///
    /// A timeout, panic or cancellation applies to the whole group (S-F4):
    /// the picked write's group mates still in flight end the same way,
    /// right after it. Any other outcome is the picked slice's own (S-F3).
    fn finish(&mut self, pick: u8, outcome: OpOutcome) -> Result<(), Violation> {
        if self.in_flight.is_empty() {
            return Ok(());
        }
        let ix = usize::from(pick) % self.in_flight.len();
        let group_wide = matches!(
            outcome,
            OpOutcome::TimedOut | OpOutcome::Panicked | OpOutcome::Cancelled
        );
        let mates = if group_wide {
            self.group_mates(self.in_flight[ix].id)
        } else {
            vec![self.in_flight[ix].id]
        };
        for id in mates {
            let ix = self
                .in_flight
                .iter()
                .position(|w| w.id == id)
                .expect("a group mate is in flight");
            self.finish_one(ix, outcome)?;
        }
        Ok(())
    }

    /// The write in flight at `ix` ends with `outcome`.
    fn finish_one(&mut self, ix: usize, outcome: OpOutcome) -> Result<(), Violation> {
        let w = self.in_flight.remove(ix);
        self.group_of.remove(&w.id);
        let id = w.id;
        if let OpOutcome::Discard(n) = outcome {
            self.discard.insert(id, usize::from(n));
        }
        let outcome = Outcome::from(outcome);
        let written = matches!(outcome, Outcome::Written { .. });
        if !written {
            *self.stats.faults.entry(fault_name(outcome)).or_default() += 1;
        }
        self.model_attempt_ended(id, outcome.failure());
        let given_up = self.given_up.remove(&id);
        if given_up {
            self.returning = Some(id);
            self.slices.remove(&id);
            if written {
                // In the store after all: counted lost, not handed back (S-B6).
                self.given_up_task_lost += w.items.len() as u64;
            }
        }
        let done = match self.engine.finish(self.now, w, outcome) {
            Ok(done) => done,
            Err(e) => return Err(self.violation("S-C2", format!("finish refused: {e}"))),
        };
        self.check_s_b6_dead_letters_are_kept(id, given_up && !written, done.is_empty())?;
        self.drain()
    }

    /// A write in flight whose task vanished (S-W13).
    /// A lost task loses its whole group (S-F4).
    fn finish_lost(&mut self, pick: u8) -> Result<(), Violation> {
        if self.in_flight.is_empty() {
            return Ok(());
        }
        let ix = usize::from(pick) % self.in_flight.len();
        for id in self.group_mates(self.in_flight[ix].id) {
            let ix = self
                .in_flight
                .iter()
                .position(|w| w.id == id)
                .expect("a group mate is in flight");
            self.finish_lost_one(ix)?;
        }
        Ok(())
    }

    /// The task of the write in flight at `ix` vanished (S-W13).
    fn finish_lost_one(&mut self, ix: usize) -> Result<(), Violation> {
        let w = self.in_flight.remove(ix);
        self.group_of.remove(&w.id);
        *self.stats.faults.entry("join_failed").or_default() += 1;
        self.model_attempt_ended(w.id, Some(crate::core::Failure::TaskLost));
        let given_up = self.given_up.remove(&w.id);
        if given_up {
            self.returning = Some(w.id);
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

    /// Opens a flush (`flush`) or a settle that must answer within
    /// `timeout_ms`.
    fn open_wait(&mut self, flush: bool, timeout_ms: u16) -> Result<(), Violation> {
        if flush {
            self.flush_bound = self.next_item;
        }
        let deadline = self.now + Duration::from_millis(u64::from(timeout_ms));
        let check = self.wait_check(deadline);
        let id = if flush {
            self.engine.flush(self.now, deadline)
        } else {
            self.engine.settle(self.now, deadline)
        };
        self.waits.insert(id, check);
        self.wait_deadlines.insert((deadline, id));
        self.drain()
    }

    /// A shutdown call: the first raises the fence and opens the check of
    /// its answer; a later one may only tighten the deadline (S-W9).
    fn shutdown(&mut self, timeout_ms: u16) -> Result<(), Violation> {
        let deadline = self.now + Duration::from_millis(u64::from(timeout_ms));
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
        self.drain()
    }

    /// Abandon: everything pending is given up at once and what was held
    /// is handed back (S-A7).
    fn abandon(&mut self) -> Result<(), Violation> {
        let held = self.engine.abandon(self.now);
        self.abandoned = true;
        self.drain()?;
        self.check_s_a7_abandon_hands_back_lost_items(&held)
    }
}
