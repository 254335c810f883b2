//! Checks of the contract's "Running through an outage" section: the
//! breaker starts only probes while open (I10, S-R1, S-R2) and is never
//! overdue with one (I11); no attempt starts with an item older than
//! `max_item_age`, and what is counted `expired` was that old (I12, S-R3);
//! every run-time dead letter matches a counted loss or drop, and with
//! dead letters on every such loss is handed out, once (I13, S-R4).
//!
//! The harness keeps its own model of the breaker from the outcomes it
//! fed: the run of failures, when it opened or its last probe ended, and
//! the probe in flight. The model is looser than the engine where the
//! contract is (a probe may come any time between one `probe_interval` and
//! one `max_probe_interval` after), so it checks the rule, not a copy of
//! the code.

use super::{Harness, Violation};
use crate::core::{Counters, DeadLetter, DeadReason, Failure, Time, Write, WriteId};

/// The harness's model of the breaker.
#[derive(Debug, Default)]
pub(super) struct BreakerModel {
    /// Failed attempts in a row while closed.
    failures: u32,
    /// `Some` while open.
    open: Option<OpenModel>,
}

#[derive(Clone, Copy, Debug)]
struct OpenModel {
    /// When it opened, or its last probe ended: the next probe is due
    /// between one `probe_interval` and one `max_probe_interval` later.
    since: Time,
    probe: Option<WriteId>,
}

impl Harness {
    /// I10: while the model says open, a write starts only as the one
    /// probe, no sooner than `probe_interval` after the breaker opened or
    /// its last probe ended.
    pub(super) fn check_i10_only_probes_while_open(
        &mut self,
        w: &Write<u8, u64>,
    ) -> Result<(), Violation> {
        let Some(config) = self.config.breaker() else {
            return Ok(());
        };
        let Some(open) = self.breaker.open else {
            return Ok(());
        };
        if let Some(p) = open.probe {
            return Err(self.violation(
                "I10",
                format!("write {} started while probe {p} is in flight", w.id),
            ));
        }
        let due = open.since + config.first_probe_interval();
        self.expect(self.now >= due, "I10", || {
            format!(
                "probe {} started at {} before {due}, one probe interval after {}",
                w.id, self.now, open.since
            )
        })?;
        if let Some(o) = self.breaker.open.as_mut() {
            o.probe = Some(w.id);
        }
        self.stats.probes += 1;
        Ok(())
    }

    /// Updates the breaker model with an attempt's end (`None`: written).
    pub(super) fn model_attempt_ended(&mut self, id: WriteId, failure: Option<Failure>) {
        let Some(config) = self.config.breaker() else {
            return;
        };
        // The sink answered, failed, or we cancelled (neither way).
        let up = matches!(failure, None | Some(Failure::Rejected));
        let moot = failure == Some(Failure::Cancelled);
        let m = &mut self.breaker;
        match m.open.as_mut() {
            None if up => m.failures = 0,
            None if moot => {}
            None => {
                m.failures += 1;
                if m.failures >= config.failures_to_open() {
                    m.open = Some(OpenModel {
                        since: self.now,
                        probe: None,
                    });
                    self.stats.breaker_opened += 1;
                }
            }
            Some(_) if up => {
                m.open = None;
                m.failures = 0;
            }
            Some(o) if o.probe == Some(id) => {
                o.since = self.now;
                o.probe = None;
            }
            Some(_) => {}
        }
    }

    /// Whether the S-B1 work-conserving check applies now: always with
    /// the breaker closed; while open only once a probe is overdue (I11),
    /// when the check then finds the tenant that should have probed.
    pub(super) fn breaker_lets_work_start(&self) -> bool {
        let (Some(config), Some(open)) = (self.config.breaker(), self.breaker.open) else {
            return true;
        };
        open.probe.is_none() && self.now >= open.since + config.probe_interval_cap()
    }

    /// Whether the model says the breaker is open.
    pub(super) fn breaker_open(&self) -> bool {
        self.breaker.open.is_some()
    }

    /// I12: no attempt starts with an item staged longer than
    /// `max_item_age` ago.
    pub(super) fn check_i12_no_item_too_old(&self, w: &Write<u8, u64>) -> Result<(), Violation> {
        let Some(age) = self.config.max_item_age() else {
            return Ok(());
        };
        let oldest = w
            .items
            .iter()
            .map(|i| self.staged_at[*i as usize])
            .min()
            .unwrap_or(self.now);
        self.expect(self.now.saturating_since(oldest) <= age, "I12", || {
            format!(
                "write {} attempt {} starts at {} with an item staged at {oldest}, older than {age:?}",
                w.id, w.attempt, self.now
            )
        })
    }

    /// I12, S-R3: `n` items of `tenant` counted `expired`: its retry slice
    /// whole if it holds one, else the front of its backlog; each was
    /// older than `max_item_age`. Settles them in the ledger.
    pub(super) fn on_expired(&mut self, tenant: u8, n: u64) -> Result<(), Violation> {
        let Some(age) = self.config.max_item_age() else {
            return Err(self.violation("I12", "expired without a max_item_age".to_string()));
        };
        let retry = self
            .slices
            .iter()
            .find(|(id, s)| s.tenant == tenant && !self.in_flight.iter().any(|w| w.id == **id))
            .map(|(id, s)| (*id, s.items.clone()));
        let items: Vec<u64> = match retry {
            Some((id, items)) => {
                self.expect(items.len() as u64 == n, "S-R3", || {
                    format!(
                        "{n} items of tenant {tenant} expired, its retry slice {id} holds {}",
                        items.len()
                    )
                })?;
                self.slices.remove(&id);
                items
            }
            None => {
                let queue = self.waiting.entry(tenant).or_default();
                let take = (n as usize).min(queue.len());
                let items: Vec<u64> = queue.drain(..take).collect();
                let bytes: u64 = items.iter().map(|i| super::weight_of(*i)).sum();
                let wb = &mut self.waiting_bytes[usize::from(tenant)];
                *wb = wb.saturating_sub(bytes);
                self.expect(items.len() as u64 == n, "S-R3", || {
                    format!("{n} items of tenant {tenant} expired, {take} were waiting")
                })?;
                items
            }
        };
        let oldest = items
            .iter()
            .map(|i| self.staged_at[*i as usize])
            .min()
            .unwrap_or(self.now);
        self.expect(self.now.saturating_since(oldest) > age, "I12", || {
            format!(
                "items {items:?} of tenant {tenant} expired at {}, staged at {oldest}: not older than {age:?}",
                self.now
            )
        })?;
        self.set_fates(&items, super::Fate::Lost);
        Ok(())
    }

    /// I13, S-R4: a run-time dead letter carries items of its tenant,
    /// already counted under its reason (lost, or dropped for
    /// `sink_error`), each handed out once.
    pub(super) fn on_dead_letter(&mut self, dl: &DeadLetter<u8, u64>) -> Result<(), Violation> {
        self.expect(self.config.dead_letters(), "I13", || {
            "a dead letter with dead letters off".to_string()
        })?;
        self.expect(!dl.items.is_empty(), "I13", || {
            "an empty dead letter".to_string()
        })?;
        let want = if dl.reason == DeadReason::SinkError {
            super::Fate::Dropped
        } else {
            super::Fate::Lost
        };
        for &i in &dl.items {
            let (fate, tenant) = (self.fate(i), self.tenant_of(i));
            self.expect(
                fate == Some(want) && tenant == Some(dl.tenant),
                "I13",
                || {
                    format!(
                        "dead letter ({}) of tenant {} holds item {i} of tenant {tenant:?}, counted {fate:?}",
                        dl.reason.as_str(),
                        dl.tenant
                    )
                },
            )?;
            let first = self.dead_lettered_items.insert(i);
            self.expect(first, "I13", || {
                format!("item {i} handed out as a dead letter twice")
            })?;
        }
        self.dead_lettered[dl.reason.index()] += dl.items.len() as u64;
        Ok(())
    }

    /// I13: with dead letters on, every item lost or dropped for a
    /// run-time reason has been handed out, by reason.
    pub(super) fn check_i13_every_run_time_loss_handed_out(
        &self,
        c: &Counters,
    ) -> Result<(), Violation> {
        if !self.config.dead_letters() {
            return Ok(());
        }
        for (ix, reason) in DeadReason::ALL.iter().enumerate() {
            let counted = reason.counted(c);
            self.expect(counted == self.dead_lettered[ix], "I13", || {
                format!(
                    "{counted} items counted under {}, {} handed out as dead letters",
                    reason.as_str(),
                    self.dead_lettered[ix]
                )
            })?;
        }
        Ok(())
    }
}
