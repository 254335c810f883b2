//! What the five stage calls answer (S-W21), one vocabulary for one
//! outcome: [`Staged`] for an item counted ([`Outbox::stage`]), a
//! [`StageError`] for an item handed back ([`Outbox::try_stage`],
//! [`Outbox::stage_wait`]), a [`StagedMany`] tally for a run
//! ([`Outbox::stage_many`], S-W20).
//!
//! [`Outbox::stage`]: crate::Outbox::stage
//! [`Outbox::try_stage`]: crate::Outbox::try_stage
//! [`Outbox::stage_wait`]: crate::Outbox::stage_wait
//! [`Outbox::stage_many`]: crate::Outbox::stage_many

use std::fmt;

use super::accounting::DropReason;
use super::admission::Refusal;
use super::engine::Staged;

/// Why [`Outbox::try_stage`](crate::Outbox::try_stage) or
/// [`Outbox::stage_wait`](crate::Outbox::stage_wait) did not stage an
/// item; each hands the item back, uncounted (S-R5).
///
/// Non-exhaustive: new causes may come (a match needs a `_` arm).
#[derive(Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StageError<I> {
    /// A capacity is full (`buffer_full`, `tenant_full`, or with a journal
    /// `journal_full`), as [`stage`](crate::Outbox::stage) would have
    /// dropped it under this reason.
    Full {
        /// The capacity that is full.
        reason: DropReason,
        /// The item, handed back.
        item: I,
    },
    /// A shutdown began (S-W9): nothing will be accepted any more.
    ShuttingDown(I),
    /// [`stage_wait`](crate::Outbox::stage_wait)'s timeout passed with no
    /// room.
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

    /// The error of a refusal handed back with its item (S-W21).
    pub(crate) fn refused((refusal, item): (Refusal, I)) -> Self {
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

/// What the staging pipeline did with one item (S-W21): `Ok`, what
/// [`Outbox::stage`](crate::Outbox::stage) answers (accepted, or a
/// refusal counted); `Err`, a refusal handed back with the item.
pub(crate) type Verdict<I> = Result<Staged, (Refusal, I)>;

/// What [`Outbox::stage_many`](crate::Outbox::stage_many) did with its
/// items: each one is counted under exactly one field, as [`Staged`]
/// would have said for it (S-W20). Every refusal is also counted in the
/// outbox's counters and metrics, as for
/// [`Outbox::stage`](crate::Outbox::stage); the caller need not look.
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
    /// `shutdown` ([`Staged::ShuttingDown`], S-W9).
    pub shutting_down: u64,
}

/// A run's outcomes as they are decided (S-W20): the tally, and each one
/// in order if the caller asked for them.
pub(crate) struct Tally {
    /// The counts.
    pub(crate) tally: StagedMany,
    /// Each outcome, in order, if asked for.
    pub(crate) each: Option<Vec<Staged>>,
}

impl Tally {
    /// A tally of a run of `len` items, keeping each outcome if `each`.
    pub(crate) fn new(len: usize, each: bool) -> Self {
        Tally {
            tally: StagedMany::default(),
            each: each.then(|| Vec::with_capacity(len)),
        }
    }

    /// Counts one item's outcome.
    pub(crate) fn note(&mut self, staged: Staged) {
        match staged {
            Staged::Accepted => self.tally.accepted += 1,
            Staged::Dropped(_) => self.tally.dropped += 1,
            Staged::ShuttingDown => self.tally.shutting_down += 1,
        }
        if let Some(each) = &mut self.each {
            each.push(staged);
        }
    }
}
