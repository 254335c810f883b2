//! Staging a run of items at once (S-W20): `stage` on each, in order, for
//! one clock read, one hold of the engine's lock and, with a journal, one
//! of the journal's.
//!
//! Application code runs first, outside every lock: the caller's iterator,
//! the weigher and the codec, item by item. Then, under the engine's lock
//! (and the journal's inside it, the lock order of S-W19), every decision
//! `stage` would make, in the same order (S-W21): the fence (S-W9), the
//! journal's refusals (S-J8, S-J4), the capacities (S-A1, S-B5, S-B7).
//! The accepted items enter the
//! engine right there, after the hand-offs queued before them, so each
//! tenant's items keep their order in the engine and in the journal alike
//! (D2).

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};

use super::journal::{Journal, Run};
use super::stage::{Facts, Room};
use crate::core::{decide, Handoff, Refusal, Staged, Time};
use crate::sink::Sink;
use crate::Outbox;

/// What [`Outbox::stage_many`] did with its items: each one is counted
/// under exactly one field, as [`Staged`] would have said for it (S-W20).
/// Every refusal is also counted in the outbox's counters and metrics, as
/// for [`Outbox::stage`]; the caller need not look.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[must_use = "the tally is informational; use `let _ =` to ignore it"]
pub struct StagedMany {
    /// Items accepted: pending, and will be written ([`Staged::Accepted`]).
    pub accepted: u64,
    /// Items dropped by a capacity or the journal, counted under their
    /// reason ([`Staged::Dropped`]).
    pub dropped: u64,
    /// Items refused because a shutdown began, counted lost under
    /// `shutdown` ([`Staged::Refused`], S-W9).
    pub refused: u64,
}

/// The outcomes of a run as they are decided: the tally, and each one in
/// order if the caller asked for them.
struct Outcomes {
    tally: StagedMany,
    each: Option<Vec<Staged>>,
}

impl Outcomes {
    fn note(&mut self, staged: Staged) {
        match staged {
            Staged::Accepted => self.tally.accepted += 1,
            Staged::Dropped(_) => self.tally.dropped += 1,
            Staged::Refused => self.tally.refused += 1,
        }
        if let Some(each) = &mut self.each {
            each.push(staged);
        }
    }
}

/// The most items reserved up front from an iterator's size hint.
const MAX_RESERVE: usize = 1 << 16;

/// An item readied outside the locks: its weight and, with a journal, its
/// record's index in the run (`None` when the codec refused it).
struct Ready<K, I> {
    tenant: K,
    item: I,
    weight: u64,
    /// Always `None` without a journal.
    record: Option<usize>,
}

impl<S: Sink> Outbox<S> {
    /// Stages every item of `items`, in order (S-W20): the caller's
    /// iterator is used up first, then every item is decided at once, with
    /// the outcome [`stage`](Self::stage) would give it called once per
    /// item at that moment; each tenant's items keep their order, every
    /// outcome is counted. Never fails, never waits for a disk or a write.
    ///
    /// Cheaper than as many `stage` calls when items come in runs (a
    /// request that produced many records, an import): the weigher and
    /// the codec run first, outside every lock; then the clock is read
    /// once (every item gets the same stamp), the engine's lock is taken
    /// once and the items enter the engine directly instead of through the
    /// request path's queue, and with a journal its lock is taken once and
    /// its commit task woken at most once. The price is that the call
    /// holds the engine's lock for O(items): the writer, control calls and
    /// other `stage_many` callers wait that long (plain `stage` calls do
    /// not). With a journal, keep a run's records well under
    /// `max_buffered_bytes` (default 64 MiB): the buffer cannot be
    /// committed while the run holds its lock, so a tail past it is
    /// dropped under `journal_full`.
    ///
    /// Not atomic: a capacity or a full journal can refuse some items of a
    /// run and accept the rest, exactly as separate stages would. The
    /// shutdown's fence goes up under the same lock, so it falls before or
    /// after a whole run: past it, every item is refused (S-W21). What the iterator itself does to the
    /// outbox (a stage, a shutdown) comes before the whole run.
    ///
    /// # Panics
    /// Only with the caller's own panic: if `items` panics while it is
    /// iterated, the items it yielded before are staged and counted as
    /// usual, then that panic goes on to the caller.
    pub fn stage_many(&self, items: impl IntoIterator<Item = (S::Tenant, S::Item)>) -> StagedMany {
        self.stage_run(items, false).tally
    }

    /// [`stage_many`](Self::stage_many), returning each item's outcome, in
    /// the order of `items` (S-W20): for a caller that must know which
    /// items of a run were refused (to hand them elsewhere, or to keep its
    /// own books). Costs a `Vec` of one [`Staged`] per item.
    pub fn stage_many_outcomes(
        &self,
        items: impl IntoIterator<Item = (S::Tenant, S::Item)>,
    ) -> Vec<Staged> {
        self.stage_run(items, true).each.unwrap_or_default()
    }

    fn stage_run(
        &self,
        items: impl IntoIterator<Item = (S::Tenant, S::Item)>,
        each: bool,
    ) -> Outcomes {
        let shared = self.shared();
        let journal = shared.journal();
        let at = shared.stamp();
        let mut run = journal.map(Journal::new_run);
        let mut ready: Vec<Ready<S::Tenant, S::Item>> = Vec::new();
        // The caller's iterator is the caller's code: if it panics, the
        // items it yielded before are staged and counted as usual, then
        // its panic goes on to the caller.
        let iterated = catch_unwind(AssertUnwindSafe(|| {
            let items = items.into_iter();
            // A hint is only a hint: a lying one must not reserve more
            // than a run's worth up front.
            ready.reserve(items.size_hint().0.min(MAX_RESERVE));
            for (tenant, item) in items {
                ready.push(Ready {
                    weight: shared.weigh(&item),
                    record: journal
                        .zip(run.as_mut())
                        .and_then(|(j, run)| j.encode_into(run, &tenant, &item)),
                    tenant,
                    item,
                });
            }
        }));
        let mut outcomes = Outcomes {
            tally: StagedMany::default(),
            each: each.then(|| Vec::with_capacity(ready.len())),
        };
        if !ready.is_empty() {
            self.stage_ready(ready, at, &mut outcomes, run.as_ref());
        }
        if let Some(run) = run {
            Journal::<S::Tenant, S::Item>::recycle_run(run);
        }
        if let Err(panic) = iterated {
            resume_unwind(panic);
        }
        outcomes
    }

    /// The locked part of a run: `ready` items, stamped `at`, with their
    /// records in `run` (with a journal), each decided as
    /// [`stage`](Self::stage) decides it (S-W21), at this moment.
    fn stage_ready(
        &self,
        ready: Vec<Ready<S::Tenant, S::Item>>,
        at: Option<Time>,
        outcomes: &mut Outcomes,
        run: Option<&Run>,
    ) {
        let shared = self.shared();
        let mut wake = false;
        let ((), took) = shared.input(|st| {
            let mut appender = shared.journal().map(|j| {
                let appender = j.appender();
                // Every queued stage appended its record under the
                // journal's lock, now held: taking them in again puts
                // each such item before this run in the engine as in the
                // journal (D2).
                wake |= shared.take_in(st, false);
                appender
            });
            // Under the lock: the fence cannot go up meanwhile.
            let fenced = st.engine.is_shutting_down();
            let mut batch = Vec::with_capacity(ready.len());
            for r in ready {
                let record = r.record.and_then(|i| run.and_then(|run| run.get(i)));
                let (encoded, fits) = match &appender {
                    None => (true, true),
                    Some(a) => (record.is_some(), record.is_some_and(|rec| a.fits(rec))),
                };
                let verdict = decide(&mut Facts {
                    fenced,
                    encoded,
                    room: Room::Fits(fits),
                    admitted: None,
                    admission: &shared.admission,
                    weight: r.weight,
                    quota: shared.locked_stage.then_some((&st.engine, &r.tenant)),
                });
                outcomes.note(verdict.map_or_else(Refusal::staged, |()| Staged::Accepted));
                if let (Ok(()), Some(appender), Some(record)) = (verdict, &mut appender, record) {
                    appender.append(r.tenant.clone(), record);
                }
                batch.push(Handoff {
                    tenant: r.tenant,
                    item: r.item,
                    weight: Some(r.weight),
                    at,
                    refusal: verdict.err(),
                });
                // A quota reads the engine's count: each item goes in
                // before the next is decided.
                if shared.locked_stage {
                    wake |= shared.stage_admitted(st, batch.drain(..)).wake;
                }
            }
            // Accepted ones: the fence is down (read under this lock) and
            // their room is reserved; refused ones are counted.
            let intake = shared.stage_admitted(st, batch);
            debug_assert_eq!(intake.refused, 0);
            wake |= intake.wake;
            if let Some(appender) = appender {
                appender.finish();
            }
        });
        if wake || took {
            shared.wake();
        }
    }
}
