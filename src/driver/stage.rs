//! The staging pipeline (S-W21): every one-item stage (`stage`,
//! `try_stage`, `stage_wait`) in three steps.
//!
//! 1. Prepare, outside every lock: weigh (S-B5), stamp (S-A3, S-R3) and,
//!    with a journal, encode (S-J8): application code and the clock.
//! 2. Ask the core: [`decide`] over the facts this path sees, in the one
//!    refusal order (the fence, the journal, the capacities).
//! 3. Commit: the hand-off (S-W19), or the engine's intake under its lock
//!    when a `tenant_capacity` needs the tenant's count (S-B7); then the
//!    journal's append. A refusal is counted or handed back, as the call's
//!    [`OnRefusal`] says.

use std::fmt;
use std::time::Duration;

use super::journal::{Admitted, Journal, Record};
use crate::core::{decide, Admission, Checks, Engine, Handoff, OnRefusal, Refusal, Staged, Time};
use crate::sink::Sink;
use crate::Outbox;

/// Why [`Outbox::try_stage`] or [`Outbox::stage_wait`] did not stage an
/// item; each hands the item back, uncounted (S-R5).
///
/// Non-exhaustive: new causes may come (a match needs a `_` arm).
#[derive(Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StageError<I> {
    /// A capacity is full (`buffer_full`, `tenant_full`, or with a journal
    /// `journal_full`), as [`stage`](Outbox::stage) would have dropped it
    /// under this reason.
    Full {
        /// The capacity that is full.
        reason: crate::DropReason,
        /// The item, handed back.
        item: I,
    },
    /// A shutdown began (S-W9): nothing will be accepted any more.
    ShuttingDown(I),
    /// [`stage_wait`](Outbox::stage_wait)'s timeout passed with no room.
    TimedOut(I),
    /// The journal could not encode the item (S-J8), as `stage` would
    /// have dropped it under `encode_failed`.
    EncodeFailed(I),
    /// The outbox was built with an outbox table and takes items only
    /// from it (S-T32): stage in the caller's transaction instead
    /// (`outbox::table::OutboxTable`, feature `table`).
    TableOnly(I),
}

impl<I> StageError<I> {
    /// The item handed back.
    pub fn into_item(self) -> I {
        match self {
            StageError::Full { item, .. }
            | StageError::ShuttingDown(item)
            | StageError::TimedOut(item)
            | StageError::EncodeFailed(item)
            | StageError::TableOnly(item) => item,
        }
    }

    /// The error of a refusal handed back (S-W21).
    fn refused(refusal: Refusal, item: I) -> Self {
        match (refusal, refusal.drop_reason()) {
            (Refusal::EncodeFailed, _) => StageError::EncodeFailed(item),
            (Refusal::TableOnly, _) => StageError::TableOnly(item),
            (_, Some(reason)) => StageError::Full { reason, item },
            (_, None) => StageError::ShuttingDown(item),
        }
    }
}

impl<I> fmt::Display for StageError<I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StageError::Full { reason, .. } => write!(f, "outbox: no room ({})", reason.as_str()),
            StageError::ShuttingDown(_) => f.write_str("outbox: shutting down"),
            StageError::TimedOut(_) => f.write_str("outbox: no room before the timeout"),
            StageError::EncodeFailed(_) => {
                f.write_str("outbox: the journal cannot encode the item")
            }
            StageError::TableOnly(_) => f.write_str(
                "outbox: built with an outbox table, it takes items only from the table; \
                 stage in the caller's transaction with OutboxTable",
            ),
        }
    }
}

impl<I: fmt::Debug> std::error::Error for StageError<I> {}

/// What the pipeline did with an item: `Ok`, what [`Outbox::stage`]
/// answers (accepted, or a refusal counted); `Err`, a refusal handed back
/// with the item.
type Outcome<I> = Result<Staged, (Refusal, I)>;

/// An item prepared outside every lock (step 1): its weight, its stamp
/// and, with a journal, its record (`Err`: the codec refused it).
struct Prepared<K, I> {
    tenant: K,
    item: I,
    weight: u64,
    at: Option<Time>,
    record: Option<Result<Record, Refusal>>,
}

impl<K, I> Prepared<K, I> {
    /// The item on its way to the engine's intake, `refusal` as decided.
    fn handoff(self, refusal: Option<Refusal>) -> (Handoff<K, I>, Option<Record>) {
        let handoff = Handoff {
            tenant: self.tenant,
            item: self.item,
            weight: Some(self.weight),
            at: self.at,
            refusal,
        };
        (handoff, self.record.and_then(Result::ok))
    }
}

/// What one stage's path sees, for [`decide`] (step 2).
pub(super) struct Facts<'a, 'r, K, I> {
    pub(super) fenced: bool,
    /// Not `false` without a journal.
    pub(super) encoded: bool,
    pub(super) room: Room<'a, 'r, K, I>,
    /// The journal's lock, held from its room to the append.
    pub(super) admitted: Option<Admitted<'a, K, I>>,
    pub(super) admission: &'r Admission,
    pub(super) weight: u64,
    /// The engine and the tenant, for a `tenant_capacity` (S-B7).
    pub(super) quota: Option<(&'r Engine<K, I>, &'r K)>,
}

/// How a path reads the journal's room (S-J4).
pub(super) enum Room<'a, 'r, K, I> {
    /// No journal, or nothing to check.
    Any,
    /// One record: its room is checked and kept under the journal's lock.
    One(&'a Journal<K, I>, &'r Record),
    /// Checked already, under the run's lock (S-W20).
    Fits(bool),
}

impl<K: Ord + std::hash::Hash + Clone + Send + 'static, I: Send + 'static> Checks
    for Facts<'_, '_, K, I>
{
    fn table_only(&mut self) -> bool {
        self.admission.table_only()
    }

    fn fenced(&mut self) -> bool {
        self.fenced
    }

    fn encoded(&mut self) -> bool {
        self.encoded
    }

    fn journal_room(&mut self) -> bool {
        match self.room {
            Room::Any => true,
            Room::Fits(fits) => fits,
            Room::One(journal, record) => {
                self.admitted = journal.admit(record).ok();
                self.admitted.is_some()
            }
        }
    }

    fn buffer_room(&mut self) -> bool {
        self.admission.reserve(self.weight).is_ok()
    }

    fn tenant_room(&mut self) -> bool {
        self.quota
            .is_none_or(|(e, tenant)| e.tenant_has_room(tenant))
    }

    fn unreserve(&mut self) {
        self.admission.release(1, self.weight);
    }
}

impl<K, I> Prepared<K, I> {
    /// The facts of this stage, the fence as read and, under the engine's
    /// lock, the engine's quota.
    fn facts<'a, 'r>(
        &'r self,
        journal: Option<&'a Journal<K, I>>,
        admission: &'r Admission,
        fenced: bool,
        engine: Option<&'r Engine<K, I>>,
    ) -> Facts<'a, 'r, K, I> {
        Facts {
            fenced,
            encoded: !matches!(self.record, Some(Err(_))),
            room: match (journal, &self.record) {
                (Some(journal), Some(Ok(record))) => Room::One(journal, record),
                _ => Room::Any,
            },
            admitted: None,
            admission,
            weight: self.weight,
            quota: engine.map(|e| (e, &self.tenant)),
        }
    }
}

/// An accepted item's record, appended under the journal's lock still
/// held since its room was checked (the journal's order is the engine's,
/// D2).
#[allow(clippy::needless_pass_by_value)]
fn append<K: Ord + std::hash::Hash + Clone, I>(
    admitted: Option<Admitted<'_, K, I>>,
    key: Option<K>,
    record: Option<&Record>,
) {
    if let (Some(admitted), Some(key), Some(record)) = (admitted, key, record) {
        admitted.append(key, record);
    }
}

/// Lets the journal's lock go (a record not appended): before the
/// engine's lock is taken, never under it (S-W19).
#[allow(clippy::drop_non_drop)] // without the journal it holds no lock
fn unlock<K, I>(admitted: Option<Admitted<'_, K, I>>) {
    drop(admitted);
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
        match self.stage_one(tenant, item, OnRefusal::HandBack) {
            Ok(_) => Ok(()),
            Err((refusal, item)) => Err(StageError::refused(refusal, item)),
        }
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
                Err((refusal, back)) => return Err(StageError::refused(refusal, back)),
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

    /// The pipeline (S-W21): prepare, ask, commit. `Ok`: what
    /// [`stage`](Self::stage) answers (accepted, or a refusal counted);
    /// `Err`: a refusal handed back with the item, as `on` says.
    fn stage_one(&self, tenant: S::Tenant, item: S::Item, on: OnRefusal) -> Outcome<S::Item> {
        let shared = self.shared();
        // Step 1, outside every lock: application code and the clock.
        let weight = shared.weigh(&item);
        let at = shared.stamp();
        let record = shared.encode(&tenant, &item);
        let prepared = Prepared {
            tenant,
            item,
            weight,
            at,
            record,
        };
        let (staged, record) = if shared.locked_stage {
            self.commit_locked(prepared, on)
        } else {
            self.commit_handed_off(prepared, on)
        };
        shared.recycle(record);
        staged
    }

    /// Steps 2 and 3 on the request path (S-W19): the fence and the
    /// capacities without the engine's lock, the hand-off, then the
    /// append under the journal's lock (taken alone).
    fn commit_handed_off(
        &self,
        prepared: Prepared<S::Tenant, S::Item>,
        on: OnRefusal,
    ) -> (Outcome<S::Item>, Option<Record>) {
        let shared = self.shared();
        let weight = prepared.weight;
        let mut facts = prepared.facts(
            shared.journal(),
            &shared.admission,
            shared.is_fenced(),
            None,
        );
        let verdict = decide(&mut facts);
        let admitted = facts.admitted.take();
        let (handoff, record) = prepared.handoff(verdict.err());
        if let Err(refusal) = verdict {
            // The journal's lock goes before the engine's is taken (S-W19).
            unlock(admitted);
            return (self.refused(handoff, refusal, on), record);
        }
        let key = admitted.as_ref().map(|_| handoff.tenant.clone());
        let Handoff {
            tenant, item, at, ..
        } = handoff;
        match shared.hand_off_item(tenant, item, weight, at) {
            Ok(()) => {
                append(admitted, key, record.as_ref());
                (Ok(Staged::Accepted), record)
            }
            // The fence went up since it was read (S-W9): not appended.
            Err((tenant, item)) => {
                unlock(admitted);
                shared.admission.release(1, weight);
                let handoff = Handoff {
                    tenant,
                    item,
                    weight: Some(weight),
                    at,
                    refusal: Some(Refusal::ShuttingDown),
                };
                (self.refused(handoff, Refusal::ShuttingDown, on), record)
            }
        }
    }

    /// Steps 2 and 3 under the engine's lock, for a `tenant_capacity`
    /// (S-B7): the engine's intake, then the append under the journal's
    /// lock, taken inside the engine's.
    fn commit_locked(
        &self,
        prepared: Prepared<S::Tenant, S::Item>,
        on: OnRefusal,
    ) -> (Outcome<S::Item>, Option<Record>) {
        let shared = self.shared();
        let (out, record) = shared.engine_input(|st| {
            let mut facts = prepared.facts(
                shared.journal(),
                &shared.admission,
                st.engine.is_shutting_down(),
                Some(&st.engine),
            );
            let verdict = decide(&mut facts);
            let admitted = facts.admitted.take();
            let (handoff, record) = prepared.handoff(verdict.err());
            let out = match verdict {
                Ok(()) => {
                    let key = admitted.as_ref().map(|_| handoff.tenant.clone());
                    // The fence is down: checked under this lock.
                    let intake = shared.stage_admitted(st, [handoff]);
                    append(admitted, key, record.as_ref());
                    Ok((Staged::Accepted, intake.wake))
                }
                Err(refusal) if on.counts(refusal) => {
                    let intake = st.engine.stage_batch([handoff]);
                    Ok((refusal.staged(), intake.wake))
                }
                Err(refusal) => Err((refusal, handoff.item)),
            };
            (out, record)
        });
        match out {
            Ok((staged, wake)) => {
                if wake {
                    shared.wake();
                }
                (Ok(staged), record)
            }
            Err(back) => (Err(back), record),
        }
    }

    /// A refusal decided on the request path: handed back, or counted
    /// under the engine's lock in O(1), no tenant lookup, its event
    /// coalescing with a queued one (S-B8), as the fence's if it went up
    /// since (S-W21). The item is dropped after the lock (S-W13).
    fn refused(
        &self,
        handoff: Handoff<S::Tenant, S::Item>,
        refusal: Refusal,
        on: OnRefusal,
    ) -> Outcome<S::Item> {
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
}
