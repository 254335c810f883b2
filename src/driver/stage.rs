//! The staging pipeline (S-W21): every stage call (`stage`, `try_stage`,
//! `stage_wait`, and a run's `stage_many`, S-W20) in three steps.
//!
//! 1. Prepare, outside every lock: weigh (S-B5), stamp (S-A3, S-R3) and,
//!    with a journal, encode (S-J8): application code and the clock.
//! 2. Ask the core: [`decide`] over the [`Facts`] this path sees, in the
//!    one refusal order (the fence, the journal, the capacities).
//! 3. Commit: the hand-off (S-W19), or the engine's intake under its lock
//!    when a `tenant_capacity` needs the tenant's count (S-B7) or a run is
//!    staged at once (S-W20); then the journal's append. A refusal is
//!    counted or handed back, as the call's [`OnRefusal`] says.
//!
//! The driver decides nothing here: which commit a stage takes is the
//! outbox's setting (`locked_stage`), every verdict is the core's.

use std::time::Duration;

use super::journal::{Journal, Piece};
use crate::core::{decide, Facts, Handoff, OnRefusal, Refusal, Staged, Time, Verdict};
use crate::sink::Sink;
use crate::Outbox;
use crate::StageError;

/// An item prepared outside every lock (step 1): its weight and, with a
/// journal, its record (`Some(None)`: the codec refused it; `None`: no
/// journal).
pub(super) struct Prepared<'r, K, I> {
    pub(super) tenant: K,
    pub(super) item: I,
    pub(super) weight: u64,
    pub(super) record: Option<Option<Piece<'r>>>,
}

impl<S: Sink> Outbox<S> {
    /// Stages `item` for `tenant` (S-W1): never waits, never fails, never
    /// panics. Costs a channel send, plus an atomic reservation when a
    /// capacity is set, whatever the number of tenants: the engine takes
    /// the item in later, before any write, flush, settle, shutdown or
    /// counter read (S-W19); with a `tenant_capacity` the engine decides
    /// under its lock instead. The item is accepted on return, or, as the
    /// result says, refused after a shutdown began (S-W9: lost under
    /// `shutdown`), or dropped: with a journal, when the item cannot be
    /// encoded (S-J8: `encode_failed`) or the journal is full (S-J4:
    /// `journal_full`); by a capacity limit (S-A1, S-B5, S-B7:
    /// `buffer_full`, `tenant_full`). The first of these in this order is
    /// the answer (S-W21). The disk is never waited for (S-J1). Every
    /// outcome is counted; the caller need not look.
    pub fn stage(&self, tenant: S::Tenant, item: S::Item) -> Staged {
        match self.stage_one(tenant, item, OnRefusal::Count) {
            Ok(staged) => staged,
            // `Count` counts every refusal: nothing comes back.
            Err((refusal, item)) => {
                super::contain::drop_quietly(item);
                refusal.staged()
            }
        }
    }

    /// Stages `item` if there is room, else hands it back (S-R5): like
    /// [`stage`](Self::stage), never waits, but a refusal (a shutdown
    /// under way, with a journal an item it cannot encode or a full
    /// journal, a full capacity; the first in this order, S-W21) is not
    /// counted anywhere: the caller still holds the item and decides.
    ///
    /// # Errors
    /// [`StageError::TableOnly`] on an outbox built with an outbox table
    /// (S-T32), [`StageError::ShuttingDown`], [`StageError::EncodeFailed`],
    /// [`StageError::Full`], each with the item.
    pub fn try_stage(&self, tenant: S::Tenant, item: S::Item) -> Result<(), StageError<S::Item>> {
        self.stage_one(tenant, item, OnRefusal::HandBack)
            .map(drop)
            .map_err(StageError::refused)
    }

    /// Stages `item`, waiting up to `timeout` for room when a capacity is
    /// full (S-R5): for batch jobs that would rather wait than drop. Not
    /// for request paths, where [`stage`](Self::stage) never waits. Waits
    /// are woken when items settle; the item is tried again each time,
    /// with no place kept in a queue (a waiter may be overtaken). A
    /// shutdown is never waited out: once its fence is up, the answer is
    /// [`StageError::ShuttingDown`] at once, whatever else is full (S-W21).
    ///
    /// # Errors
    /// [`StageError::TimedOut`] when the timeout passes with no room;
    /// [`StageError::ShuttingDown`] at once when a shutdown begins, also
    /// while waiting; [`StageError::EncodeFailed`] with a journal that cannot
    /// encode it; [`StageError::TableOnly`] at once on an outbox built with
    /// an outbox table (S-T32). Each hands the item back, uncounted.
    ///
    /// # Cancellation
    /// Cancel safe: dropping the future before it completes drops the
    /// item, which was never staged and is counted nowhere; an item
    /// accepted is accepted before the future completes, in the same poll,
    /// so a completed stage is never undone by a drop.
    pub async fn stage_wait(
        &self,
        tenant: S::Tenant,
        mut item: S::Item,
        timeout: Duration,
    ) -> Result<(), StageError<S::Item>> {
        let shared = self.shared();
        let deadline = super::deadline(tokio::time::Instant::now(), timeout);
        loop {
            // Registered before the try, so a wake between the two is not
            // missed.
            let notified = shared.capacity.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match self.stage_one(tenant.clone(), item, OnRefusal::Wait) {
                Ok(_) => return Ok(()),
                Err((refusal, back)) if OnRefusal::Wait.waits(refusal) => item = back,
                Err(back) => return Err(StageError::refused(back)),
            }
            tokio::select! {
                biased;
                () = &mut notified => {}
                () = tokio::time::sleep_until(deadline) => {
                    return Err(StageError::TimedOut(item));
                }
            }
        }
    }

    /// The pipeline for one item (S-W21): prepare, then ask and commit on
    /// the outbox's one path for single stages.
    fn stage_one(&self, tenant: S::Tenant, item: S::Item, on: OnRefusal) -> Verdict<S::Item> {
        let shared = self.shared();
        // Step 1, outside every lock: application code and the clock.
        let weight = crate::core::weight(shared.weigher.as_deref(), &item);
        let at = shared.stamps.then(|| shared.now());
        let journal = shared.journal.as_deref();
        let mut run = journal.map(Journal::new_run);
        let record = journal
            .zip(run.as_mut())
            .and_then(|(j, run)| j.encode_into(run, &tenant, &item));
        let prepared = Prepared {
            tenant,
            item,
            weight,
            record: run.as_ref().map(|run| record.and_then(|i| run.get(i))),
        };
        let verdict = if shared.locked_stage {
            // Overwritten: the commit answers once per item.
            let mut verdict = Ok(Staged::Accepted);
            self.commit_locked([prepared], at, on, &mut |v| verdict = v);
            verdict
        } else {
            self.commit_handed_off(prepared, at, on)
        };
        if let Some(run) = run {
            Journal::<S::Tenant, S::Item>::recycle_run(run);
        }
        verdict
    }

    /// Steps 2 and 3 on the request path (S-W19): the fence and the
    /// capacities without the engine's lock, the hand-off, then the
    /// append under the journal's lock (taken alone, held from its room
    /// to the append, D2).
    fn commit_handed_off(
        &self,
        prepared: Prepared<'_, S::Tenant, S::Item>,
        at: Option<Time>,
        on: OnRefusal,
    ) -> Verdict<S::Item> {
        let shared = self.shared();
        let Prepared {
            tenant,
            item,
            weight,
            record,
        } = prepared;
        let appender = (shared.journal.as_deref())
            .filter(|_| matches!(record, Some(Some(_))))
            .map(Journal::appender);
        let verdict = decide(&mut Facts::<S::Tenant, S::Item> {
            table_only: shared.admission.table_only(),
            fenced: shared.handoff.is_closed(),
            encoded: !matches!(record, Some(None)),
            journal_room: (appender.as_ref().zip(record.flatten())).is_none_or(|(a, p)| a.fits(p)),
            admission: &shared.admission,
            weight,
            quota: None,
        });
        let (tenant, item, refusal) = match verdict {
            Err(refusal) => (tenant, item, refusal),
            Ok(()) => {
                let key = appender.as_ref().map(|_| tenant.clone());
                match shared.handoff.send(tenant, item, weight, at) {
                    Ok(()) => {
                        if let (Some(mut a), Some(key), Some(Some(piece))) = (appender, key, record)
                        {
                            a.append(key, piece);
                            a.finish();
                        }
                        return Ok(Staged::Accepted);
                    }
                    // The fence went up since it was read (S-W9): not
                    // appended, its reservation given back.
                    Err((tenant, item)) => {
                        shared.admission.release(1, weight);
                        (tenant, item, Refusal::ShuttingDown)
                    }
                }
            }
        };
        // The journal's lock goes before the engine's is taken (S-W19).
        if let Some(appender) = appender {
            appender.finish();
        }
        let handoff = Handoff {
            tenant,
            item,
            weight: Some(weight),
            at,
            refusal: Some(refusal),
        };
        self.count_refused(handoff, refusal, on)
    }

    /// A refusal decided on the request path: handed back, or counted
    /// under the engine's lock in O(1), no tenant lookup, its event
    /// coalescing with a queued one (S-B8), as the fence's if it went up
    /// since (S-W21). The item is dropped after the lock (S-W13).
    fn count_refused(
        &self,
        handoff: Handoff<S::Tenant, S::Item>,
        refusal: Refusal,
        on: OnRefusal,
    ) -> Verdict<S::Item> {
        if !on.counts(refusal) {
            return Err((refusal, handoff.item));
        }
        let shared = self.shared();
        let staged = shared.engine_input(|st| {
            let fenced = st.engine.is_shutting_down();
            let counted = crate::core::recheck(Err(refusal), fenced).err();
            let _ = st.engine.stage_batch([handoff]);
            counted.unwrap_or(refusal).staged()
        });
        // Its event is drained by the writer.
        shared.wake();
        Ok(staged)
    }

    /// Steps 2 and 3 under the engine's lock (S-B7, S-W20), for `items`
    /// stamped `at`, each answered through `answer` in order: the queued
    /// hand-offs taken in first, then each item decided, taken in (at
    /// once with a quota, which reads the engine's count) and its record
    /// appended under the journal's lock, taken inside the engine's.
    pub(super) fn commit_locked<'r>(
        &self,
        items: impl IntoIterator<Item = Prepared<'r, S::Tenant, S::Item>>,
        at: Option<Time>,
        on: OnRefusal,
        answer: &mut impl FnMut(Verdict<S::Item>),
    ) {
        let shared = self.shared();
        let wake = shared.engine_input(|st| {
            let mut wake = false;
            let mut appender = shared.journal.as_deref().map(|j| {
                let appender = j.appender();
                // Every queued stage appended its record under the
                // journal's lock, now held: taking them in again puts each
                // such item before these in the engine as in the journal
                // (D2).
                wake |= shared.take_in(st, false);
                appender
            });
            // Under the lock: the fence cannot go up meanwhile.
            let fenced = st.engine.is_shutting_down();
            let mut batch = Vec::new();
            for p in items {
                let verdict = decide(&mut Facts {
                    table_only: shared.admission.table_only(),
                    fenced,
                    encoded: !matches!(p.record, Some(None)),
                    journal_room: (appender.as_ref().zip(p.record.flatten()))
                        .is_none_or(|(a, piece)| a.fits(piece)),
                    admission: &shared.admission,
                    weight: p.weight,
                    quota: shared.locked_stage.then_some((&st.engine, &p.tenant)),
                });
                match verdict {
                    Err(refusal) if !on.counts(refusal) => {
                        answer(Err((refusal, p.item)));
                        continue;
                    }
                    Err(refusal) => answer(Ok(refusal.staged())),
                    Ok(()) => answer(Ok(Staged::Accepted)),
                }
                if let (Ok(()), Some(a), Some(Some(piece))) = (verdict, &mut appender, p.record) {
                    a.append(p.tenant.clone(), piece);
                }
                let handoff = Handoff {
                    tenant: p.tenant,
                    item: p.item,
                    weight: Some(p.weight),
                    at,
                    refusal: verdict.err(),
                };
                if shared.locked_stage {
                    // A quota reads the engine's count: each item goes in
                    // before the next is decided.
                    let intake =
                        (shared.admission).intake(&mut st.engine, &mut st.admitted, [handoff]);
                    wake |= intake.wake;
                } else {
                    batch.push(handoff);
                }
            }
            // Accepted ones: the fence is down (read under this lock) and
            // their room is reserved; refused ones are counted.
            let intake = (shared.admission).intake(&mut st.engine, &mut st.admitted, batch);
            debug_assert_eq!(intake.refused, 0);
            if let Some(appender) = appender {
                appender.finish();
            }
            wake | intake.wake
        });
        if wake {
            shared.wake();
        }
    }
}
