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

use super::stage::Items;
use crate::core::{OnRefusal, Staged, Tally};
use crate::sink::Sink;
use crate::Outbox;
use crate::StagedMany;

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
        let mut tally = Tally::new(0, false);
        // `Count`: every verdict is `Ok`, a refusal counted.
        self.pipeline(Items::Run(items), OnRefusal::Count, &mut |v| {
            tally.note(v.unwrap_or_else(|(refusal, _)| refusal.staged()));
        });
        tally.tally
    }

    /// [`stage_many`](Self::stage_many), returning each item's outcome, in
    /// the order of `items` (S-W20): for a caller that must know which
    /// items of a run were refused (to hand them elsewhere, or to keep its
    /// own books). Costs a `Vec` of one [`Staged`] per item.
    pub fn stage_many_outcomes(
        &self,
        items: impl IntoIterator<Item = (S::Tenant, S::Item)>,
    ) -> Vec<Staged> {
        let mut tally = Tally::new(0, true);
        self.pipeline(Items::Run(items), OnRefusal::Count, &mut |v| {
            tally.note(v.unwrap_or_else(|(refusal, _)| refusal.staged()));
        });
        tally.each.unwrap_or_default()
    }
}
