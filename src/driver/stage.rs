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

use super::journal::{Appender, Journal, Piece};
use super::shared::State;
use crate::core::{decide, recheck, Facts, Handoff, OnRefusal, Refusal, Staged, Time, Verdict};
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
    /// Refused on the request path already (S-W19): only counted under
    /// the engine's lock, as the fence's if it went up since (S-W21).
    pub(super) refused: Option<Refusal>,
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
    /// are woken when items settle and, with a journal, when a group
    /// commit ends (a full journal's room comes back with the commit of
    /// its done marks, S-J2); the item is tried again each time,
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
        // Far away rather than an overflow: `Duration::MAX` is no deadline.
        let timer = tokio::time::sleep(timeout);
        tokio::pin!(timer);
        loop {
            // Registered before the try, so a wake between the two is not
            // missed.
            let notified = self.handle.shared.capacity.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            // A full journal's room comes back with its commits, not with
            // a settle.
            let journal = self.handle.shared.journal.as_deref();
            let room = journal.map(Journal::room_freed);
            tokio::pin!(room);
            if let Some(room) = room.as_mut().as_pin_mut() {
                room.enable();
            }
            match self.stage_one(tenant.clone(), item, OnRefusal::Wait) {
                Ok(_) => return Ok(()),
                Err((refusal, back)) if OnRefusal::Wait.waits(refusal) => item = back,
                Err(back) => return Err(StageError::refused(back)),
            }
            tokio::select! {
                biased;
                () = &mut notified => {}
                () = async {
                    match room.as_mut().as_pin_mut() {
                        Some(room) => room.await,
                        None => std::future::pending().await,
                    }
                } => {}
                () = &mut timer => {
                    return Err(StageError::TimedOut(item));
                }
            }
        }
    }

    /// The pipeline for one item (S-W21): prepare, then ask and commit on
    /// the outbox's one path for single stages: under the engine's lock
    /// ([`commit_locked`](Self::commit_locked)) when the outbox decides
    /// there, else the request path (S-W19): the fence and the capacities
    /// without the engine's lock, the hand-off, then the append under the
    /// journal's lock (taken alone, held from its room to the append, D2);
    /// a refusal is counted under the engine's lock after the journal's
    /// is let go.
    fn stage_one(&self, tenant: S::Tenant, item: S::Item, on: OnRefusal) -> Verdict<S::Item> {
        let shared = &*self.handle.shared;
        // Step 1, outside every lock: application code and the clock.
        let weight = crate::core::weight(shared.weigher.as_deref(), &item);
        let at = shared.stamps.then(|| shared.now());
        let journal = shared.journal.as_deref();
        let mut run = None;
        let record = journal.map(|j| j.encode_into(&mut run, &tenant, &item));
        let record = record.map(|i| i.and_then(|i| run.as_ref()?.get(i)));
        let mut verdict = Ok(Staged::Accepted);
        // What is left for the engine's lock: nothing (handed off), the
        // item to decide there (`None`), or a refusal to count (`Some`).
        let refused = if shared.locked_stage {
            Some((None, tenant, item))
        } else {
            let mut facts = Facts::<S::Tenant, S::Item> {
                table_only: shared.admission.table_only(),
                fenced: shared.handoff.is_closed(),
                encoded: !matches!(record, Some(None)),
                journal_room: true,
                admission: &shared.admission,
                weight,
                quota: None,
            };
            // Steps 2 and 3: decided, sent, and named for the append.
            let send = |room: bool| {
                facts.journal_room = room;
                if let Err(refusal) = decide(&mut facts) {
                    return (None, Some((Some(refusal), tenant, item)));
                }
                let key = matches!(record, Some(Some(_))).then(|| tenant.clone());
                match shared.handoff.send(tenant, item, weight, at) {
                    Ok(()) => (key, None),
                    // The fence went up since it was read (S-W9): not
                    // appended, its reservation given back.
                    Err((tenant, item)) => {
                        shared.admission.release(1, weight);
                        (None, Some((Some(Refusal::ShuttingDown), tenant, item)))
                    }
                }
            };
            match (journal, record) {
                (Some(j), Some(Some(piece))) => j.appending(|a| a.append_if(piece, send)),
                _ => send(true).1,
            }
        };
        match refused {
            Some((Some(refusal), _, item)) if !on.counts(refusal) => verdict = Err((refusal, item)),
            Some((refused, tenant, item)) => {
                // A refusal of the request path carries no record.
                let record = if refused.is_some() { None } else { record };
                let prepared = Prepared {
                    tenant,
                    item,
                    weight,
                    record,
                    refused,
                };
                // Overwritten: the commit answers once per item.
                self.commit_locked([prepared], at, on, &mut |v| verdict = v);
            }
            None => {}
        }
        Journal::<S::Tenant, S::Item>::recycle_run(run);
        verdict
    }

    /// Steps 2 and 3 under the engine's lock (S-B7, S-W20), for `items`
    /// stamped `at`, each answered through `answer` in order: the queued
    /// hand-offs taken in first (with a journal, under its lock: each
    /// appended its record under it, so the engine takes them in the
    /// journal's order, D2), then each item decided (one refused on the
    /// request path only counted, S-W21), its record appended, and the
    /// item taken in: at once with a quota, which reads the engine's
    /// count, else all together.
    pub(super) fn commit_locked<'r>(
        &self,
        items: impl IntoIterator<Item = Prepared<'r, S::Tenant, S::Item>>,
        at: Option<Time>,
        on: OnRefusal,
        answer: &mut impl FnMut(Verdict<S::Item>),
    ) {
        let shared = &*self.handle.shared;
        let commit =
            |st: &mut State<S::Tenant, S::Item>,
             mut appender: Option<&mut Appender<'_, S::Tenant, S::Item>>| {
                let (mut wake, mut batch) = (false, Vec::new());
                // Under the lock: the fence cannot go up meanwhile.
                let fenced = st.engine.is_shutting_down();
                for p in items {
                    let ask = |room: bool| {
                        decide(&mut Facts {
                            table_only: shared.admission.table_only(),
                            fenced,
                            encoded: !matches!(p.record, Some(None)),
                            journal_room: room,
                            admission: &shared.admission,
                            weight: p.weight,
                            quota: shared.locked_stage.then_some((&st.engine, &p.tenant)),
                        })
                    };
                    let verdict = match (p.refused, appender.as_deref_mut(), p.record) {
                        (Some(refusal), ..) => recheck(Err(refusal), fenced),
                        (None, Some(a), Some(Some(piece))) => a.append_if(piece, |room| {
                            let verdict = ask(room);
                            (verdict.is_ok().then(|| p.tenant.clone()), verdict)
                        }),
                        (None, ..) => ask(true),
                    };
                    match verdict {
                        Err(refusal) if !on.counts(refusal) => {
                            answer(Err((refusal, p.item)));
                            continue;
                        }
                        Err(refusal) => answer(Ok(refusal.staged())),
                        Ok(()) => answer(Ok(Staged::Accepted)),
                    }
                    // Its event is drained by the writer.
                    wake |= p.refused.is_some();
                    let handoff = Handoff {
                        tenant: p.tenant,
                        item: p.item,
                        weight: Some(p.weight),
                        at,
                        refusal: verdict.err(),
                    };
                    if shared.locked_stage {
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
                wake | intake.wake
            };
        let (wake, took) = shared.input(|st| match shared.journal.as_deref() {
            Some(j) => j.appending(|a| {
                let to = (&mut st.engine, &shared.admission, &mut st.admitted);
                st.handoffs.take_in(to, false) | commit(st, Some(a))
            }),
            None => commit(st, None),
        });
        if wake || took {
            shared.wake.notify_one();
        }
    }
}
