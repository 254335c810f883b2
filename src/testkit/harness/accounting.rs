//! Checks of the contract's "Accounting and metrics" section, after every
//! op: the engine's counters agree with the ledger and with the events
//! (I3, S-W14), every item the engine lets go of is already counted (I5),
//! and every attempt ends in one counted outcome (S-W18).

use super::ledger::Fate;
use super::{Harness, Violation};
use crate::core::{AfterFailure, Counters, ItemOutcome, WriteId};

impl Harness {
    /// The checks that hold between ops, in a fixed order.
    pub(super) fn check_after_op(&mut self) -> Result<(), Violation> {
        self.check_i5_released_items_are_counted()?;
        let c = self.engine.counters().clone();
        self.check_i3_counters_match_the_ledger(&c)?;
        self.check_s_w18_attempts(&c)?;
        self.check_s_w14_accounting(&c)?;
        if self.weighs {
            self.check_i3_pending_bytes()?;
            self.check_s_b5_capacity_bytes(self.pending_bytes)?;
        }
        self.check_s_w15_waits_answered_by_deadline()?;
        self.check_s_w15_shutdown_answered_by_deadline()?;
        self.check_s_a1_capacity(c.pending)?;
        self.check_i8_shutdown_is_final(&c)?;
        self.check_i13_every_run_time_loss_handed_out(&c)?;
        self.check_s_r7_item_ages()?;
        self.last = c;
        Ok(())
    }

    /// S-R7: the engine's age samples since the last op are exactly those
    /// of the items the harness saw settle, by fate (written, dropped,
    /// lost), each its staging time to now; none without a
    /// `max_item_age`.
    fn check_s_r7_item_ages(&mut self) -> Result<(), Violation> {
        let mut got: Vec<(Fate, u64)> = self
            .engine
            .drain_item_ages()
            .map(|a| {
                let fate = match a.outcome {
                    ItemOutcome::Written => Fate::Written,
                    ItemOutcome::Dropped(_) => Fate::Dropped,
                    ItemOutcome::Lost(_) | ItemOutcome::HandedOver => Fate::Lost,
                };
                (fate, u64::try_from(a.age.as_nanos()).unwrap_or(u64::MAX))
            })
            .collect();
        let mut due = std::mem::take(&mut self.ages_due);
        got.sort_unstable_by_key(|&(f, ns)| (f as u8, ns));
        due.sort_unstable_by_key(|&(f, ns)| (f as u8, ns));
        self.expect(got == due, "S-R7", || {
            format!(
                "the engine's item ages {:?} differ from the settled items' {:?} (fate, ns)",
                &got[..got.len().min(8)],
                &due[..due.len().min(8)]
            )
        })
    }

    /// I5: items the engine let go of are already counted lost or dropped
    /// (the engine drops none itself, so the driver can drop them outside
    /// its lock).
    fn check_i5_released_items_are_counted(&mut self) -> Result<(), Violation> {
        for id in self.engine.take_released() {
            let fate = self.fate(id);
            self.expect(
                matches!(fate, Some(Fate::Lost | Fate::Dropped)),
                "I5",
                || format!("the engine released item {id}, whose fate is {fate:?}"),
            )?;
        }
        Ok(())
    }

    /// I3: the counters balance and agree with the ledger's count of items
    /// by fate and with the drops and losses the events reported, by
    /// reason.
    fn check_i3_counters_match_the_ledger(&self, c: &Counters) -> Result<(), Violation> {
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
        )
    }

    /// S-W18: every attempt started is in flight or ended in exactly one
    /// counted outcome (written, or failed by kind), as the events said; a
    /// given-up write's end is counted too.
    fn check_s_w18_attempts(&self, c: &Counters) -> Result<(), Violation> {
        self.expect(self.returning.is_none(), "S-W18", || {
            format!("given-up write {:?} ended uncounted", self.returning)
        })?;
        let in_flight = self.engine.in_flight() as u64;
        self.expect(
            in_flight == self.in_flight.len() as u64
                && c.attempts == c.attempts_ended() + in_flight
                && c.failed_attempts == c.failed.iter().sum::<u64>()
                && c.writes == self.writes_seen
                && c.failed == self.failed_seen,
            "S-W18",
            || {
                format!(
                    "attempts {} != writes {} + failed {} ({:?}) + in flight {in_flight} \
                     (harness: {} in flight, events say writes {} failed {:?})",
                    c.attempts,
                    c.writes,
                    c.failed_attempts,
                    c.failed,
                    self.in_flight.len(),
                    self.writes_seen,
                    self.failed_seen
                )
            },
        )
    }

    /// S-W14: counters never decrease.
    fn check_s_w14_accounting(&self, c: &Counters) -> Result<(), Violation> {
        let last = &self.last;
        let monotonic = c.staged >= last.staged
            && c.written >= last.written
            && c.writes >= last.writes
            && c.attempts >= last.attempts
            && c.failed_attempts >= last.failed_attempts
            && c.lost.iter().zip(last.lost).all(|(a, b)| *a >= b)
            && c.dropped.iter().zip(last.dropped).all(|(a, b)| *a >= b);
        self.expect(monotonic, "S-W14", || "a counter decreased".to_string())
    }

    /// I3: the engine's pending bytes are the ledger's, kept as fates
    /// change.
    fn check_i3_pending_bytes(&self) -> Result<(), Violation> {
        let bytes = self.pending_bytes;
        self.expect(self.engine.pending_bytes() == bytes, "I3", || {
            format!("pending bytes {} vs {bytes}", self.engine.pending_bytes())
        })
    }

    /// S-W18: a write ended as given up (written after the engine gave it
    /// up) is the one the harness is returning, and ends once.
    pub(super) fn check_s_w18_given_up_write_ends_once(
        &mut self,
        id: WriteId,
    ) -> Result<(), Violation> {
        let returning = self.returning.take();
        self.expect(returning == Some(id), "S-W18", || {
            format!("write {id} ended as given up, but it was not")
        })
    }

    /// S-W18: a failed attempt ends as given up exactly when it is the
    /// given-up write the harness is returning.
    pub(super) fn check_s_w18_given_up_matches_the_return(
        &mut self,
        id: WriteId,
        next: AfterFailure,
    ) -> Result<(), Violation> {
        let given_up = next == AfterFailure::GivenUp;
        let returning = self.returning == Some(id);
        self.expect(given_up == returning, "S-W18", || {
            format!("write {id} ended {next:?}; given up: {returning}")
        })?;
        if given_up {
            self.returning = None;
        }
        Ok(())
    }
}
