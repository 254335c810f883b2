//! Checks of the contract's "Writing" section, on each write handed out
//! and each failed attempt: the write's shape (S-W3, S-W4, S-B3, S-B5),
//! its bounds (I4, I8), its retries (I2, I7) and what follows a failure
//! (S-A5, S-W7, S-B2, I5).

use std::time::Duration;

use super::ledger::{Slice, Taken};
use super::{Harness, Violation};
use crate::core::{ErrorPolicy, Failure, Time, Write, WriteId};
use crate::testkit::op::weight_of;

impl Harness {
    /// Every check of a write just handed out (first attempt or retry),
    /// keeping the ledger's slices and backlogs in step.
    pub(super) fn check_write(&mut self, w: &Write<u8, u64>, group: u64) -> Result<(), Violation> {
        self.check_i8_no_write_after_the_end(w)?;
        self.check_i4_in_flight_bounds(w, group)?;
        self.check_s_b3_write_deadline(w)?;
        self.check_s_w4_not_empty(w)?;
        self.check_i10_only_probes_while_open(w)?;
        self.check_i12_no_item_too_old(w)?;
        if w.attempt == 1 {
            self.check_first_attempt(w)
        } else {
            self.check_retry(w)
        }
    }

    /// A write's first attempt: a new id, the front of its tenant's
    /// backlog, as large as the limits allow.
    fn check_first_attempt(&mut self, w: &Write<u8, u64>) -> Result<(), Violation> {
        self.check_i2_fresh_write_id(w)?;
        let taken = self.ledger_take_batch(w);
        self.check_s_w3_staging_order(w, &taken.prefix)?;
        self.check_s_w4_max_batch(w)?;
        self.check_s_b5_max_batch_bytes(w)?;
        self.check_s_w4_batch_takes_all_that_fits(w, &taken)?;
        self.ledger_open_slice(w);
        Ok(())
    }

    /// A retry: the identical slice, numbered in turn, after its backoff.
    fn check_retry(&mut self, w: &Write<u8, u64>) -> Result<(), Violation> {
        let Some(s) = self.slices.get_mut(&w.id) else {
            return Err(self.violation("I2", format!("retry of unknown write {}", w.id)));
        };
        let same = s.items == w.items && s.tenant == w.tenant;
        let numbered = w.attempt == s.attempts + 1;
        let not_before = s.retry_not_before.take();
        s.attempts = w.attempt;
        self.check_i2_identical_retry_slice(w, same, numbered)?;
        self.check_i7_backoff_respected(w, not_before)
    }

    /// I8: no write starts once a shutdown was answered or the engine
    /// abandoned.
    fn check_i8_no_write_after_the_end(&self, w: &Write<u8, u64>) -> Result<(), Violation> {
        self.expect(!self.is_finished(), "I8", || {
            format!("write {} started after shutdown or abandon", w.id)
        })
    }

    /// S-F1: a group holds 1 to `max_slices_per_write` slices (of
    /// distinct tenants: each slice is checked by I4 in turn).
    pub(super) fn check_s_f1_group_shape(&self, group: &[Write<u8, u64>]) -> Result<(), Violation> {
        let max = self.config.max_slices_per_write();
        self.expect(!group.is_empty() && group.len() <= max, "S-F1", || {
            format!(
                "a group of {} slices, max_slices_per_write {max}",
                group.len()
            )
        })
    }

    /// S-F2: a group of more than one slice carries at most
    /// `max_group_items` items.
    pub(super) fn check_s_f2_group_items(&self, group: &[Write<u8, u64>]) -> Result<(), Violation> {
        if let Some(cap) = self.config.max_group_items() {
            let items: usize = group.iter().map(|w| w.items.len()).sum();
            self.expect(group.len() == 1 || items <= cap, "S-F2", || {
                format!(
                    "a group of {} slices carries {items} items > max_group_items {cap}",
                    group.len()
                )
            })?;
        }
        Ok(())
    }

    /// I4: at most `concurrency` groups in flight (S-F1; a group is one
    /// write without fan-in), at most one write per tenant.
    fn check_i4_in_flight_bounds(&self, w: &Write<u8, u64>, group: u64) -> Result<(), Violation> {
        self.expect(
            self.groups_in_flight(Some(group)) < self.config.concurrency(),
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
        )
    }

    /// S-B3: an attempt's deadline is `write_timeout` from its start.
    fn check_s_b3_write_deadline(&self, w: &Write<u8, u64>) -> Result<(), Violation> {
        self.expect(
            w.deadline == self.config.write_timeout().map(|t| self.now + t),
            "S-B3",
            || format!("write {} deadline {:?}", w.id, w.deadline),
        )
    }

    /// S-W4: a write carries at least one item.
    fn check_s_w4_not_empty(&self, w: &Write<u8, u64>) -> Result<(), Violation> {
        self.expect(!w.items.is_empty(), "S-W4", || {
            format!("write {} is empty", w.id)
        })
    }

    /// I2: a first attempt has an id never seen.
    fn check_i2_fresh_write_id(&self, w: &Write<u8, u64>) -> Result<(), Violation> {
        self.expect(!self.slices.contains_key(&w.id), "I2", || {
            format!("write id {} reused", w.id)
        })
    }

    /// S-W3: a write takes the front of its tenant's backlog, in staging
    /// order (`prefix`: that front, as long as the write).
    fn check_s_w3_staging_order(
        &self,
        w: &Write<u8, u64>,
        prefix: &[u64],
    ) -> Result<(), Violation> {
        self.expect(prefix == w.items, "S-W3", || {
            format!(
                "write {} of tenant {} carries {:?}, staging order says {:?}",
                w.id, w.tenant, w.items, prefix
            )
        })
    }

    /// S-W4: a write carries at most `max_batch` items.
    fn check_s_w4_max_batch(&self, w: &Write<u8, u64>) -> Result<(), Violation> {
        if let Some(m) = self.config.max_batch() {
            let n = w.items.len();
            self.expect(n <= m, "S-W4", || {
                format!("write {} has {n} > max_batch {m}", w.id)
            })?;
        }
        Ok(())
    }

    /// S-B5: a write of more than one item weighs at most
    /// `max_batch_bytes`.
    fn check_s_b5_max_batch_bytes(&self, w: &Write<u8, u64>) -> Result<(), Violation> {
        if let Some(m) = self.config.max_batch_bytes() {
            let n = w.items.len();
            let bytes: u64 = w.items.iter().map(|i| weight_of(*i)).sum();
            self.expect(n == 1 || bytes <= m, "S-B5", || {
                format!("write {} has {bytes} bytes > {m}", w.id)
            })?;
        }
        Ok(())
    }

    /// S-W4, S-B5: a batch is as large as the limits allow: the whole
    /// backlog, or up to `max_batch` items, or until the next item would
    /// pass `max_batch_bytes`.
    fn check_s_w4_batch_takes_all_that_fits(
        &self,
        w: &Write<u8, u64>,
        taken: &Taken,
    ) -> Result<(), Violation> {
        let n = w.items.len();
        let item_room = self.config.max_batch().is_none_or(|m| n < m);
        if let Some(m) = self.config.max_batch_bytes() {
            let bytes: u64 = w.items.iter().map(|i| weight_of(*i)).sum();
            let next_fits = taken.next.is_some_and(|i| bytes + weight_of(i) <= m);
            self.expect(!(item_room && next_fits), "S-W4", || {
                format!(
                    "write {} took {n} items ({bytes} bytes) though the next fits {m} bytes",
                    w.id
                )
            })
        } else {
            let whole = taken.whole;
            self.expect(!item_room || n == whole, "S-W4", || {
                format!("write {} took {n} of a backlog of {whole}", w.id)
            })
        }
    }

    /// I2 (S-W5): a retry carries the identical slice of the same tenant
    /// (`same`) and the next attempt number (`numbered`).
    fn check_i2_identical_retry_slice(
        &self,
        w: &Write<u8, u64>,
        same: bool,
        numbered: bool,
    ) -> Result<(), Violation> {
        self.expect(same, "I2", || {
            format!("write {} retried with another slice", w.id)
        })?;
        self.expect(numbered, "I2", || {
            format!("write {} attempt numbering", w.id)
        })
    }

    /// I7: a retry starts no earlier than its backoff allows
    /// (`not_before`, set when the last attempt failed).
    fn check_i7_backoff_respected(
        &self,
        w: &Write<u8, u64>,
        not_before: Option<Time>,
    ) -> Result<(), Violation> {
        let now = self.now;
        self.expect(not_before.is_some_and(|t| now >= t), "I7", || {
            format!("write {} retried at {now} before {not_before:?}", w.id)
        })
    }

    /// S-A5: only the retry policy retries.
    pub(super) fn check_s_a5_retry_only_under_the_retry_policy(
        &self,
        id: WriteId,
    ) -> Result<(), Violation> {
        self.expect(
            self.config.error_policy() == ErrorPolicy::Retry,
            "S-A5",
            || format!("write {id} retried under the drop policy"),
        )
    }

    /// S-W7: no backoff above `max_backoff`.
    pub(super) fn check_s_w7_backoff_cap(&self, wait: Duration) -> Result<(), Violation> {
        self.expect(wait <= self.config.max_backoff(), "S-W7", || {
            format!("backoff {wait:?} above the cap")
        })
    }

    /// S-A5: a terminal rejection is never retried.
    pub(super) fn check_s_a5_no_retry_after_a_rejection(
        &self,
        id: WriteId,
        failure: Failure,
    ) -> Result<(), Violation> {
        self.expect(failure != Failure::Rejected, "S-A5", || {
            format!("write {id} retried after a terminal rejection")
        })
    }

    /// S-B2: no retry once `max_attempts` attempts were made or
    /// `max_retry_duration` passed since the first attempt (`first`).
    pub(super) fn check_s_b2_retry_limits(
        &self,
        id: WriteId,
        attempts: u32,
        first: Time,
    ) -> Result<(), Violation> {
        self.expect(
            self.config.max_attempts().is_none_or(|m| attempts < m),
            "S-B2",
            || format!("write {id} retried after {attempts} attempts"),
        )?;
        self.expect(
            self.config
                .max_retry_duration()
                .is_none_or(|d| self.now - first < d),
            "S-B2",
            || format!("write {id} retried past max_retry_duration"),
        )
    }

    /// S-W7, S-B2: the backoff after `attempts` failures in a row falls in
    /// [`backoff_range`](Self::backoff_range).
    pub(super) fn check_s_w7_backoff_range(
        &self,
        id: WriteId,
        attempts: u32,
        wait: Duration,
    ) -> Result<(), Violation> {
        let (lo, hi) = self.backoff_range(attempts);
        self.expect(lo <= wait && wait <= hi, "S-W7", || {
            format!(
                "write {id} waits {wait:?} after {attempts} failures, \
                 expected {lo:?}..={hi:?}"
            )
        })
    }

    /// I5: a failed batch is dropped (`sink_error`) only under the drop
    /// policy.
    pub(super) fn check_i5_batch_dropped_only_under_the_drop_policy(
        &self,
        id: WriteId,
    ) -> Result<(), Violation> {
        self.expect(
            self.config.error_policy() == ErrorPolicy::Drop,
            "I5",
            || format!("write {id} dropped under the retry policy"),
        )
    }

    /// I5: a write is lost after a failure only for a terminal rejection, a
    /// vanished task, or a retry limit reached (S-B2).
    pub(super) fn check_i5_write_loss_has_its_cause(
        &self,
        id: WriteId,
        failure: Failure,
        slice: Option<&Slice>,
    ) -> Result<(), Violation> {
        let cause = failure == Failure::Rejected
            || failure == Failure::TaskLost
            || slice.is_some_and(|s| {
                self.config.max_attempts().is_some_and(|m| s.attempts >= m)
                    || self
                        .config
                        .max_retry_duration()
                        .is_some_and(|d| self.now - s.first_started >= d)
            });
        self.expect(cause, "I5", || {
            format!("write {id} lost without a terminal rejection or limit")
        })
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
}
