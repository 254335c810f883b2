//! The staging pipeline (S-W21): every stage call (`stage`, `try_stage`,
//! `stage_wait`, and a run's `stage_many`, S-W20) is a thin wrapper over
//! one [`pipeline`](Outbox::pipeline), in three steps.
//!
//! 1. Prepare, outside every lock: weigh (S-B5), stamp (S-A3, S-R3) and,
//!    with a journal, encode (S-J8, the journal's step,
//!    `journal::stage`): application code and the clock.
//! 2. Ask the core: [`decide`](crate::core::decide) over the [`Facts`]
//!    this path sees, in the one refusal order (the fence, the journal,
//!    the capacities).
//! 3. Commit: the hand-off (S-W19, [`crate::handoff`]), or the engine's
//!    intake under its lock ([`Admission::commit`]) when a
//!    `tenant_capacity` needs the tenant's count (S-B7) or a run is staged
//!    at once (S-W20); then the journal's append. A refusal is counted or
//!    handed back, as the call's [`OnRefusal`] says.
//!
//! The driver decides nothing here: which commit a stage takes is the
//! outbox's setting (`locked_stage`), every verdict is the core's.
//!
//! [`Admission::commit`]: crate::core::Admission::commit

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::time::Duration;

use super::journal::{Appender, Staging};
use crate::core::{hand_off, Append, Commit, Facts, OnRefusal, Prepared, Staged, Verdict};
use crate::sink::Sink;
use crate::Outbox;
use crate::StageError;

/// The most items reserved up front from a run's size hint: a lying hint
/// must not reserve more than a run's worth.
const MAX_RESERVE: usize = 1 << 16;

/// What one pass of the [pipeline](Outbox::pipeline) stages.
pub(super) enum Items<K, I, T> {
    /// One item: `stage`, `try_stage`, `stage_wait`.
    One(K, I),
    /// A run (S-W20): `stage_many`, `stage_many_outcomes`.
    Run(T),
}

/// The journal's lock held for a stage's appends, in an outbox over `S`.
type Appending<'a, S> = Appender<'a, <S as Sink>::Tenant, <S as Sink>::Item>;

/// No run: the type of [`Items::One`]'s unused run.
type NoRun<K, I> = std::iter::Empty<(K, I)>;

impl<S: Sink> Outbox<S> {
    /// Stages `item` for `tenant` (S-W1): never waits for the writer or
    /// the disk, never fails, never panics. Costs one push onto the
    /// hand-off queue (under its own lock, held only for a push or the
    /// intake's exchange of the queue for an empty buffer), plus an
    /// atomic reservation when a capacity is set, whatever the number of
    /// tenants: the engine takes the item in later, before any write,
    /// flush, settle, shutdown or counter read (S-W19); with a
    /// `tenant_capacity` the engine decides under its lock instead. The item is accepted on return, or, as the
    /// result says, refused after a shutdown began (S-W9: lost under
    /// `shutdown`), or dropped: with a journal, when the item cannot be
    /// encoded (S-J8: `encode_failed`) or the journal is full (S-J4:
    /// `journal_full`); by a capacity limit (S-A1, S-B5, S-B7:
    /// `buffer_full`, `tenant_full`). The first of these in this order is
    /// the answer (S-W21). The disk is never waited for (S-J1). Every
    /// outcome is counted; the caller need not look.
    pub fn stage(&self, tenant: S::Tenant, item: S::Item) -> Staged {
        let mut staged = Staged::Accepted;
        let one = Items::<_, _, NoRun<_, _>>::One(tenant, item);
        // `Count` counts every refusal: nothing comes back.
        self.pipeline(one, OnRefusal::Count, &mut |v| {
            staged = v.unwrap_or_else(|(refusal, item)| {
                super::contain::drop_quietly(item);
                refusal.staged()
            });
        });
        staged
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
        let mut verdict = Ok(Staged::Accepted);
        let one = Items::<_, _, NoRun<_, _>>::One(tenant, item);
        self.pipeline(one, OnRefusal::HandBack, &mut |v| verdict = v);
        verdict.map(drop).map_err(StageError::refused)
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
        // On the outbox's runtime, whose timer the build checked: the
        // caller may await this in no runtime, or in one without timers.
        let timer = self
            .handle
            .shared
            .on_runtime(|| tokio::time::sleep(timeout));
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
            let room = journal.map(|j| j.staging.room_freed());
            tokio::pin!(room);
            if let Some(room) = room.as_mut().as_pin_mut() {
                room.enable();
            }
            let mut verdict = Ok(Staged::Accepted);
            let one = Items::<_, _, NoRun<_, _>>::One(tenant.clone(), item);
            self.pipeline(one, OnRefusal::Wait, &mut |v| verdict = v);
            match verdict {
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

    /// The pipeline (S-W21) for one item (`stage`, `try_stage`,
    /// `stage_wait`) or a run (S-W20), each item answered through
    /// `answer`, in order. Step 1, outside every lock: the caller's
    /// iterator, the weigher, the codec, one stamp. Steps 2 and 3: a
    /// single item, unless the outbox decides under the engine's lock,
    /// takes the request path (S-W19): decided, handed off, then appended
    /// under the journal's lock (taken alone, held from its room to the
    /// append, D2); what is left (a run, a stage decided under the lock, a
    /// refusal of the request path to count) is decided, appended and
    /// taken in under the engine's lock, after the hand-offs queued before
    /// it ([`Admission::commit`](crate::core::Admission::commit)); with a
    /// journal, under its lock too, the queued hand-offs taken in first
    /// (each appended its record under it, so the engine takes items in
    /// the journal's order, D2). If the
    /// caller's iterator panics, the items it yielded before are staged,
    /// then its panic goes on.
    pub(super) fn pipeline<T: IntoIterator<Item = (S::Tenant, S::Item)>>(
        &self,
        items: Items<S::Tenant, S::Item, T>,
        on: OnRefusal,
        answer: &mut impl FnMut(Verdict<S::Item>),
    ) {
        let (shared, mut run) = (&*self.handle.shared, None);
        let (admission, journal) = (&shared.admission, shared.journal.as_deref());
        let journal = journal.map(|j| &j.staging);
        let at = shared.stamps.then(|| shared.now());
        let mut prepare = |(tenant, item): (S::Tenant, S::Item)| {
            let weight = crate::core::weight(shared.weigher.as_deref(), &item);
            let record = journal.map(|j| j.encode_into(&mut run, &tenant, &item));
            Prepared::new(tenant, item, weight, record)
        };
        let (mut one, many, iterated) = match items {
            Items::One(tenant, item) => (Some(prepare((tenant, item))), Vec::new(), Ok(())),
            Items::Run(items) => {
                let mut many = Vec::new();
                let iterated = catch_unwind(AssertUnwindSafe(|| {
                    let items = items.into_iter();
                    many.reserve(items.size_hint().0.min(MAX_RESERVE));
                    many.extend(items.map(&mut prepare));
                }));
                (None, many, iterated)
            }
        };
        if let Some(p) = one.take_if(|_| !shared.locked_stage) {
            let (fenced, encoded) = (shared.handoff.is_closed(), !matches!(p.record, Some(None)));
            let mut facts = Facts::new(admission, fenced, encoded, p.weight);
            let send = |tenant, item| shared.handoff.send(tenant, item, p.weight, at);
            let sent = match (journal, p.record) {
                (Some(j), Some(Some(i))) => j.appending(run.as_ref(), |a| {
                    let key = p.tenant.clone();
                    a.append_if(i, |room| {
                        facts.journal_room = room;
                        let sent = hand_off(&mut facts, p.tenant, p.item, send);
                        (sent.is_ok().then_some(key), sent)
                    })
                }),
                _ => hand_off(&mut facts, p.tenant, p.item, send), // no record, no room asked
            };
            one = match sent {
                // Counted under the engine's lock, with no record.
                Err((refusal, tenant, item)) if on.counts(refusal) => Some(Prepared {
                    refused: Some(refusal),
                    ..Prepared::new(tenant, item, p.weight, None)
                }),
                sent => {
                    answer(sent.map(|()| Staged::Accepted).map_err(|(r, _, i)| (r, i)));
                    None
                }
            };
        }
        if one.is_some() || !many.is_empty() {
            let quota = shared.locked_stage;
            let how = Commit { at, on, quota };
            let (wake, took) = shared.input(|st| {
                let (engine, held, handoffs) = (&mut st.engine, &mut st.admitted, &mut st.handoffs);
                let items = one.into_iter().chain(many);
                match journal {
                    Some(j) => j.appending(run.as_ref(), |a| {
                        let took = handoffs.take_in((engine, admission, held), false, usize::MAX);
                        took | admission.commit((engine, held), Some(a), how, items, answer)
                    }),
                    None => {
                        let none = None::<&mut Appending<'_, S>>;
                        admission.commit((engine, held), none, how, items, answer)
                    }
                }
            });
            if wake || took {
                shared.wake.notify_one();
            }
        }
        Staging::<S::Tenant, S::Item>::recycle_run(run);
        if let Err(panic) = iterated {
            resume_unwind(panic);
        }
    }
}
