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

use super::journal::Journal;
use super::stage::Prepared;
use crate::core::{OnRefusal, Staged, Tally};
use crate::sink::Sink;
use crate::Outbox;
use crate::StagedMany;

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

    /// Step 1 of the pipeline for a run (S-W21): the caller's iterator,
    /// the weigher and the codec, outside every lock, one stamp for all;
    /// then the locked commit, every refusal counted.
    fn stage_run(
        &self,
        items: impl IntoIterator<Item = (S::Tenant, S::Item)>,
        each: bool,
    ) -> Tally {
        let shared = &*self.handle.shared;
        let journal = shared.journal.as_deref();
        let at = shared.stamps.then(|| shared.now());
        let mut run = None;
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
                    weight: crate::core::weight(shared.weigher.as_deref(), &item),
                    record: journal.and_then(|j| j.encode_into(&mut run, &tenant, &item)),
                    tenant,
                    item,
                });
            }
        }));
        let mut tally = Tally::new(ready.len(), each);
        if !ready.is_empty() {
            let prepared = ready.into_iter().map(|r| Prepared {
                record: run.as_ref().map(|run| r.record.and_then(|i| run.get(i))),
                tenant: r.tenant,
                item: r.item,
                weight: r.weight,
                refused: None,
            });
            // `Count`: every verdict is `Ok`, a refusal counted.
            self.commit_locked(prepared, at, OnRefusal::Count, &mut |verdict| {
                tally.note(verdict.unwrap_or_else(|(refusal, _)| refusal.staged()));
            });
        }
        Journal::<S::Tenant, S::Item>::recycle_run(run);
        if let Err(panic) = iterated {
            resume_unwind(panic);
        }
        tally
    }
}
