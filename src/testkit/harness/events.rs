//! Draining the engine's events: each event is recorded (trace hash,
//! trace), checked against the rules it answers to, and applied to the
//! ledger, one handler per kind of event.

use super::ledger::Fate;
use super::{Harness, Violation};
use crate::core::{
    AfterFailure, DropReason, Event, Failure, LostReason, Report, ShutdownReport, Time, WaitId,
    WriteId,
};

impl Harness {
    /// Takes every queued event, in order.
    pub(super) fn drain(&mut self) -> Result<(), Violation> {
        while let Some(ev) = self.engine.poll_event() {
            self.record_event(&ev);
            self.on_event(ev)?;
        }
        Ok(())
    }

    fn on_event(&mut self, ev: Event<u8, u64>) -> Result<(), Violation> {
        match ev {
            Event::Written {
                id, given_up: true, ..
            } => {
                self.writes_seen += 1;
                self.check_s_w18_given_up_write_ends_once(id)
            }
            Event::Written { id, items, .. } => self.on_written(id, items),
            Event::AttemptFailed {
                id, next, failure, ..
            } => self.on_attempt_failed(id, next, failure),
            Event::Lost {
                tenant,
                items,
                reason,
                ..
            } => {
                if reason == LostReason::Expired {
                    self.on_expired(tenant, items)?;
                }
                self.on_lost(items, reason)
            }
            Event::Dropped { items, reason, .. } => {
                self.dropped_seen[DropReason::ALL
                    .iter()
                    .position(|r| *r == reason)
                    .unwrap_or(0)] += items;
                Ok(())
            }
            Event::DeadLetter(dl) => self.on_dead_letter(&dl),
            // The harness stages no durable items, so no key comes back.
            Event::KeyDone { key, .. } => {
                Err(self.violation("S-W22", format!("key {key} handed back, never given")))
            }
            Event::CancelInFlight => {
                self.cancel_requests += 1;
                for w in &self.in_flight {
                    self.given_up.insert(w.id);
                }
                Ok(())
            }
            Event::WaitDone { id, report } => {
                self.stats.waits_answered += 1;
                self.on_answer(id, report, false)
            }
            Event::ShutdownDone { id, report } => self.on_shutdown_done(id, report),
            // The harness draws no stale epochs (tests/core_stale_epoch.rs
            // checks them): one here is the engine's invention.
            Event::HandedOver { tenant, items } => Err(self.violation(
                "S-E7",
                format!("{items} items of tenant {tenant} handed over without a stale epoch"),
            )),
        }
    }

    /// A write the harness handed out came back written: its items are
    /// written but for those the sink discarded (lost, S-W12).
    fn on_written(&mut self, id: WriteId, items: u64) -> Result<(), Violation> {
        self.writes_seen += 1;
        let Some(s) = self.slices.remove(&id) else {
            return Err(self.violation("I2", format!("unknown write {id} written")));
        };
        if s.items.len() as u64 != items {
            return Err(self.violation("S-C2", format!("write {id} size changed")));
        }
        let items = s.items.len();
        let d = self.discard.remove(&id).unwrap_or(0).min(items);
        self.set_fates(&s.items[..items - d], Fate::Written);
        self.set_fates(&s.items[items - d..], Fate::Lost);
        self.written
            .entry(s.tenant)
            .or_default()
            .extend_from_slice(&s.items[..items - d]);
        Ok(())
    }

    /// An attempt failed: its next step (retry, dropped, lost, given up)
    /// must follow the policy, the limits and the backoff.
    fn on_attempt_failed(
        &mut self,
        id: WriteId,
        next: AfterFailure,
        failure: Failure,
    ) -> Result<(), Violation> {
        self.failed_seen[Failure::ALL.iter().position(|f| *f == failure).unwrap_or(0)] += 1;
        self.discard.remove(&id);
        self.check_s_w18_given_up_matches_the_return(id, next)?;
        match next {
            AfterFailure::GivenUp => Ok(()),
            AfterFailure::HandedOver => Err(self.violation(
                "S-E7",
                format!("write {id} handed over without a stale epoch"),
            )),
            AfterFailure::RetryIn(wait) => self.on_retry(id, wait, failure),
            AfterFailure::Dropped => {
                self.check_i5_batch_dropped_only_under_the_drop_policy(id)?;
                if let Some(s) = self.slices.remove(&id) {
                    self.set_fates(&s.items, Fate::Dropped);
                }
                Ok(())
            }
            AfterFailure::Lost => {
                let s = self.slices.remove(&id);
                self.check_i5_write_loss_has_its_cause(id, failure, s.as_ref())?;
                if let Some(s) = s {
                    self.set_fates(&s.items, Fate::Lost);
                }
                Ok(())
            }
        }
    }

    /// A failed attempt will be retried after `wait`.
    fn on_retry(
        &mut self,
        id: WriteId,
        wait: std::time::Duration,
        failure: Failure,
    ) -> Result<(), Violation> {
        self.check_s_a5_retry_only_under_the_retry_policy(id)?;
        self.check_s_w7_backoff_cap(wait)?;
        self.check_s_a5_no_retry_after_a_rejection(id, failure)?;
        let now = self.now;
        if let Some(s) = self.slices.get(&id) {
            let (attempts, first) = (s.attempts, s.first_started);
            self.check_s_b2_retry_limits(id, attempts, first)?;
            self.check_s_w7_backoff_range(id, attempts, wait)?;
        }
        if let Some(s) = self.slices.get_mut(&id) {
            s.retry_not_before = Some(now + wait);
        }
        Ok(())
    }

    /// Items lost: counted by reason; a deadline or abandon gives up
    /// everything pending at once.
    fn on_lost(&mut self, items: u64, reason: LostReason) -> Result<(), Violation> {
        self.lost_seen[LostReason::ALL
            .iter()
            .position(|r| *r == reason)
            .unwrap_or(0)] += items;
        self.check_i5_loss_reason_holds(reason)?;
        if matches!(reason, LostReason::Deadline | LostReason::Abandoned) {
            self.check_s_w9_nothing_pending_after_a_mass_loss()?;
            self.ledger_lose_all_pending();
        }
        Ok(())
    }

    /// A shutdown answered: a joining caller reports nothing; the first
    /// hands back the dead letters and is checked as a wait.
    fn on_shutdown_done(
        &mut self,
        id: WaitId,
        report: ShutdownReport<u8, u64>,
    ) -> Result<(), Violation> {
        self.stats.shutdowns += 1;
        self.shutdown_done = true;
        let summary = report.report();
        if !report.first {
            return self.check_s_w9_a_joining_caller_reports_nothing(
                &summary,
                report.unwritten.is_empty(),
            );
        }
        self.check_s_b6_dead_letters(&report.unwritten)?;
        self.on_answer(id, summary, true)
    }

    /// A flush, settle or first shutdown answered: the report must be
    /// what its items say, and in time.
    fn on_answer(&mut self, id: WaitId, report: Report, shutdown: bool) -> Result<(), Violation> {
        let Some(w) = self.waits.remove(&id) else {
            return Err(self.violation("S-A4", format!("answer to unknown wait {id:?}")));
        };
        self.wait_deadlines.remove(&(w.deadline, id));
        self.check_s_a4_report_is_truthful(id, &w, &report)?;
        self.check_s_a4_not_answered_early(id, &report)?;
        let deadline = w.deadline.min(
            self.shutdown_deadline
                .filter(|_| shutdown)
                .unwrap_or(Time::MAX),
        );
        self.check_s_w15_deadline_passed_truthfully(id, &report, deadline)
    }
}
