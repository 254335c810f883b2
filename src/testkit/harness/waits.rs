//! Checks of the contract's "Flush, settle, shutdown" section: truthful
//! and timely answers (S-A4, S-W15), the fence and the deadline (S-W9,
//! I8), the dead letters (S-B6) and abandon (S-A7), and the causes of the
//! losses they bring (I5).

use super::ledger::{Fate, WaitCheck};
use super::{Harness, Violation};
use crate::core::{Counters, LostReason, Report, Time, Unwritten, WaitId, WriteId};

impl Harness {
    /// S-B6: a given-up write that did not come back written (`kept`)
    /// keeps its items for the dead letters: the engine hands nothing back
    /// (`returned_none`).
    pub(super) fn check_s_b6_dead_letters_are_kept(
        &self,
        id: WriteId,
        kept: bool,
        returned_none: bool,
    ) -> Result<(), Violation> {
        if kept {
            self.expect(returned_none, "S-B6", || {
                format!("write {id} handed back as a dead letter and returned")
            })?;
        }
        Ok(())
    }

    /// S-A7: what abandon hands back is counted lost, each item with its
    /// tenant.
    pub(super) fn check_s_a7_abandon_hands_back_lost_items(
        &self,
        held: &[Unwritten<u8, u64>],
    ) -> Result<(), Violation> {
        for run in held {
            for &i in &run.items {
                self.expect(
                    self.fate(i) == Some(Fate::Lost) && self.tenant_of(i) == Some(run.tenant),
                    "S-A7",
                    || format!("abandon handed back item {i} not counted lost"),
                )?;
            }
        }
        Ok(())
    }

    /// I5: a loss under `shutdown` comes after the fence, under `deadline`
    /// at or after the shutdown deadline, under `abandoned` after abandon.
    pub(super) fn check_i5_loss_reason_holds(&self, reason: LostReason) -> Result<(), Violation> {
        match reason {
            LostReason::Shutdown => self.expect(self.engine.is_shutting_down(), "I5", || {
                "lost under shutdown while open".to_string()
            }),
            LostReason::Deadline => self.expect(
                self.shutdown_deadline.is_some_and(|d| self.now >= d),
                "I5",
                || format!("lost under deadline at {} before it", self.now),
            ),
            LostReason::Abandoned => self.expect(self.abandoned, "I5", || {
                "lost under abandoned without abandon".to_string()
            }),
            _ => Ok(()),
        }
    }

    /// S-W9: a deadline or abandon gives up everything pending at once, in
    /// one engine call.
    pub(super) fn check_s_w9_nothing_pending_after_a_mass_loss(&self) -> Result<(), Violation> {
        self.expect(self.engine.pending() == 0, "S-W9", || {
            format!("{} still pending after the deadline", self.engine.pending())
        })
    }

    /// S-W9: a shutdown caller that joined one under way reports nothing
    /// (`summary` and `no_dead_letters`: its report).
    pub(super) fn check_s_w9_a_joining_caller_reports_nothing(
        &self,
        summary: &Report,
        no_dead_letters: bool,
    ) -> Result<(), Violation> {
        self.expect(
            summary.lost == 0 && summary.written == 0 && no_dead_letters,
            "S-W9",
            || "a joining shutdown caller reported a loss".to_string(),
        )
    }

    /// S-B6: the first shutdown caller gets back, per tenant in staging
    /// order, every item given up at the deadline (or by an abandon during
    /// the shutdown), each counted lost, except those of a given-up write
    /// whose task was lost or that came back written.
    pub(super) fn check_s_b6_dead_letters(
        &self,
        unwritten: &[crate::core::Unwritten<u8, u64>],
    ) -> Result<(), Violation> {
        let mut handed_back = 0u64;
        for run in unwritten {
            let (tenant, items) = (&run.tenant, &run.items);
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
        let c = self.engine.counters();
        let expected = (c.lost(LostReason::Deadline) + c.lost(LostReason::Abandoned))
            .saturating_sub(self.given_up_task_lost);
        self.expect(handed_back == expected, "S-B6", || {
            format!("{handed_back} dead letters handed back, {expected} items given up")
        })
    }

    /// S-A4: an answer reports, of the items pending at the call (staged
    /// before it, not settled then), how many settled each way since and
    /// how many are still pending. O(log n), from the ledger's fate tree.
    pub(super) fn check_s_a4_report_is_truthful(
        &self,
        id: WaitId,
        w: &WaitCheck,
        report: &Report,
    ) -> Result<(), Violation> {
        let below = self.settled.prefix(w.bound as usize);
        let since: Vec<u64> = (0..3).map(|f| below[f] - w.settled_before[f]).collect();
        let expected = Report {
            written: since[0],
            dropped: since[1],
            lost: since[2],
            // The harness draws no stale epochs.
            handed_over: 0,
            pending: w.pending - since.iter().sum::<u64>(),
            deadline_passed: report.deadline_passed,
        };
        self.expect(*report == expected, "S-A4", || {
            format!("wait {id:?} reported {report:?}, its items say {expected:?}")
        })
    }

    /// S-A4: a wait answers before its deadline only once nothing it
    /// covers is pending.
    pub(super) fn check_s_a4_not_answered_early(
        &self,
        id: WaitId,
        report: &Report,
    ) -> Result<(), Violation> {
        self.expect(
            report.deadline_passed || report.pending == 0,
            "S-A4",
            || format!("wait {id:?} answered early with items pending"),
        )
    }

    /// S-W15: an answer says its deadline passed only at or after it
    /// (`deadline`: the wait's, or for a shutdown the tightest caller's).
    pub(super) fn check_s_w15_deadline_passed_truthfully(
        &self,
        id: WaitId,
        report: &Report,
        deadline: Time,
    ) -> Result<(), Violation> {
        self.expect(
            !report.deadline_passed || self.now >= deadline,
            "S-W15",
            || format!("wait {id:?} says its deadline passed at {}", self.now),
        )
    }

    /// S-W15: no flush or settle outlives its deadline.
    pub(super) fn check_s_w15_waits_answered_by_deadline(&self) -> Result<(), Violation> {
        if let Some(&(deadline, id)) = self.wait_deadlines.first() {
            self.expect(deadline > self.now, "S-W15", || {
                format!("wait {} not answered by its deadline {deadline}", id.0)
            })?;
        }
        Ok(())
    }

    /// S-W15: a shutdown is answered by its deadline; past it, only a
    /// given-up write still to come back (the driver cancels it at once)
    /// may hold the answer.
    pub(super) fn check_s_w15_shutdown_answered_by_deadline(&self) -> Result<(), Violation> {
        if let Some(deadline) = self.shutdown_deadline {
            let overdue = !self.shutdown_done
                && !self.abandoned
                && deadline <= self.now
                && self.given_up.is_empty();
            self.expect(!overdue, "S-W15", || {
                format!("shutdown not answered by its deadline {deadline}")
            })?;
        }
        Ok(())
    }

    /// I8: once a shutdown was answered or the engine abandoned, nothing is
    /// pending and no write starts.
    pub(super) fn check_i8_shutdown_is_final(&mut self, c: &Counters) -> Result<(), Violation> {
        if self.is_finished() {
            self.expect(c.pending == 0, "I8", || {
                format!("{} pending after shutdown", c.pending)
            })?;
            let starts = self.engine.poll_write(self.now).is_some();
            self.expect(!starts, "I8", || {
                "a write starts after shutdown".to_string()
            })?;
        }
        Ok(())
    }
}
