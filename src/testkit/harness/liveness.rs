//! Liveness checks (I6 and the contract's S-B1 fairness): a stage's wake-up
//! hint keeps its promise, and after a full drain no tenant is left with a
//! write it may start while a slot is free. The other half of I6, that a
//! healthy sink drains everything, is
//! [`Harness::drain_healthy`](super::Harness::drain_healthy).

use super::trace::short_event;
use super::{Harness, Violation};

impl Harness {
    /// I6: holds a stage's wake-up hint to its promise (see the module
    /// doc): a "no need to drain" that hides work no due drain covers is a
    /// lost wake-up. Probes with a full drain, which finds nothing unless
    /// that is the violation.
    pub(super) fn check_wake_hint(&mut self, wake: bool) -> Result<(), Violation> {
        if wake {
            self.drain_due = true;
            return Ok(());
        }
        let slots_full = self.engine.groups_in_flight() >= self.config.concurrency();
        let timer_due = self.armed.is_some_and(|at| at <= self.now);
        if self.drain_due || slots_full || timer_due {
            return Ok(());
        }
        if let Some(w) = self.engine.poll_write(self.now) {
            return Err(self.violation(
                "I6",
                format!(
                    "lost wake-up: a stage said no drain was needed, but write {} of tenant {} \
                     was ready with a slot free",
                    w.id, w.tenant
                ),
            ));
        }
        if let Some(ev) = self.engine.poll_event() {
            return Err(self.violation(
                "I6",
                format!(
                    "lost wake-up: a stage said no drain was needed, but queued {}",
                    short_event(&ev)
                ),
            ));
        }
        let next = self.engine.poll_timeout();
        let armed = self.armed;
        self.expect(
            next.is_none_or(|at| armed.is_some_and(|a| a <= at)),
            "I6",
            || {
                format!(
                    "lost wake-up: a stage said no drain was needed, but moved the next \
                     timeout to {next:?} before the armed {armed:?}"
                )
            },
        )
    }

    /// S-B1, S-W8: after a poll with a concurrency slot free, no tenant may
    /// be left with a write it is entitled to start: a retry whose backoff
    /// has elapsed (S-W7), or a waiting backlog that need not wait for
    /// company: no linger, a flush or shutdown covering its oldest item
    /// (S-A4, S-W9), its linger elapsed or a full batch (S-A3). Catches
    /// lost wake-ups and flushes that do not send at once. While the
    /// breaker is open it applies once a probe is overdue (I11).
    pub(super) fn check_s_b1_work_conserving(&self) -> Result<(), Violation> {
        if self.engine.is_closed()
            || self.is_finished()
            || self.groups_in_flight(None) >= self.config.concurrency()
            || !self.breaker_lets_work_start()
        {
            return Ok(());
        }
        let mut busy = [false; 256];
        for w in &self.in_flight {
            busy[usize::from(w.tenant)] = true;
        }
        let overdue_probe = self.breaker_open();
        self.check_s_w7_due_retries_started(&mut busy)
            .and_then(|()| self.check_s_b1_ready_backlogs_started(&busy))
            .map_err(|mut v| {
                if overdue_probe {
                    v.rule = "I11";
                    v.detail = format!("breaker open, probe overdue: {}", v.detail);
                }
                v
            })
    }

    /// S-W7: a retry whose backoff elapsed is started when its tenant has
    /// no write in flight; marks the tenants holding a retry `busy`.
    fn check_s_w7_due_retries_started(&self, busy: &mut [bool; 256]) -> Result<(), Violation> {
        for (id, s) in &self.slices {
            if busy[usize::from(s.tenant)] {
                continue;
            }
            if let Some(at) = s.retry_not_before {
                self.expect(at > self.now, "S-W7", || {
                    format!(
                        "write {id} of tenant {} was due for a retry at {at}, not started with a slot free",
                        s.tenant
                    )
                })?;
                busy[usize::from(s.tenant)] = true;
            }
        }
        Ok(())
    }

    /// S-B1: a tenant with no write in flight or backing off whose backlog
    /// need not wait (see [`ready_reason`](Self::ready_reason)) has a write
    /// started.
    fn check_s_b1_ready_backlogs_started(&self, busy: &[bool; 256]) -> Result<(), Violation> {
        for (&tenant, queue) in &self.waiting {
            let Some(&front) = queue.front() else {
                continue;
            };
            if busy[usize::from(tenant)] {
                continue;
            }
            if let Some(why) = self.ready_reason(tenant, front, queue.len()) {
                return Err(self.violation(
                    "S-B1",
                    format!(
                        "tenant {tenant} has {} items waiting (oldest {front}) and {why}, \
                         but no write started with {} of {} slots busy",
                        queue.len(),
                        self.groups_in_flight(None),
                        self.config.concurrency()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Why `tenant`'s backlog (`len` items, the oldest `front`) need not
    /// wait for company: no linger, a shutdown or a flush covering it
    /// (S-W9, S-A4), its linger elapsed or a full batch (S-A3); `None` if
    /// it may still linger.
    fn ready_reason(&self, tenant: u8, front: u64, len: usize) -> Option<&'static str> {
        let t = usize::from(tenant);
        let linger = self.config.linger();
        if linger.is_zero() {
            Some("no linger")
        } else if self.engine.is_shutting_down() {
            Some("a shutdown")
        } else if front < self.flush_bound {
            Some("a flush")
        } else if self.linger_from[t] + linger <= self.now {
            Some("its linger elapsed")
        } else if self.config.max_batch().is_some_and(|m| len >= m)
            || self
                .config
                .max_batch_bytes()
                .is_some_and(|m| self.waiting_bytes[t] >= m)
        {
            Some("a full batch")
        } else {
            None
        }
    }
}
