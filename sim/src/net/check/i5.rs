//! I5: nothing is lost or dropped without a cause the world saw.

use outbox::core::{Counters, DropReason, LostReason};

use super::fates::Fates;
use super::Broken;
use crate::net::book::{Admit, Book};

/// A counter against what the world saw: (what, counted, seen).
type Row = (&'static str, u64, u64);

fn rows_match(rows: impl IntoIterator<Item = Row>) -> Result<(), Broken> {
    for (what, got, want) in rows {
        if got != want {
            return Err(("I5", format!("{what} is {got}; the world saw {want}")));
        }
    }
    Ok(())
}

/// Refusals and drops at stage time equal `stage`'s answers; no write task
/// was lost (`join_failed`).
pub fn stage_answers_explained(book: &Book, c: &Counters) -> Result<(), Broken> {
    let admits =
        |want: fn(&Admit) -> bool| book.items.iter().filter(|i| want(&i.admit)).count() as u64;
    let refused = admits(|a| *a == Admit::Refused);
    let buffer_full = admits(|a| *a == Admit::Dropped(DropReason::BufferFull.as_str()));
    let tenant_full = admits(|a| *a == Admit::Dropped(DropReason::TenantFull.as_str()));
    rows_match([
        ("lost(shutdown)", c.lost_for(LostReason::Shutdown), refused),
        (
            "dropped(buffer_full)",
            c.dropped_for(DropReason::BufferFull),
            buffer_full,
        ),
        (
            "dropped(tenant_full)",
            c.dropped_for(DropReason::TenantFull),
            tenant_full,
        ),
        ("lost(join_failed)", c.lost_for(LostReason::JoinFailed), 0),
    ])
}

/// With nothing pending (and no drop, after which the items never sliced
/// are lost under `deadline` with nobody to hand them back to): every
/// accepted item was sliced or handed back.
pub fn nothing_vanished(book: &Book, fates: &Fates) -> Result<(), Broken> {
    let n = book.items.len();
    if let Some(id) = (0..n).find(|id| {
        book.items[*id].admit == Admit::Accepted
            && !fates.in_slice[*id]
            && !book.items[*id].handed_back
    }) {
        return Err((
            "I5",
            format!("item #{id} was accepted, never written, given up nor handed back"),
        ));
    }
    Ok(())
}

/// At a quiet end (not abandoned, nothing pending): every loss and drop
/// reason equals what the world saw.
pub fn end_losses_explained(
    book: &Book,
    c: &Counters,
    fates: &Fates,
    dropped: bool,
) -> Result<(), Broken> {
    let n = book.items.len();
    let handed_back = book.items.iter().filter(|i| i.handed_back).count() as u64;
    let failed_or_given_up = if dropped {
        // Nothing is handed back after a drop: what the writer gave up at
        // its deadline (never sliced, failed last, or ended after the
        // deadline) shares one row with what failed for good.
        let unsliced = (0..n)
            .filter(|id| book.items[*id].admit == Admit::Accepted && !fates.in_slice[*id])
            .count() as u64;
        (
            "lost(deadline) + lost(retries_exhausted) + dropped(sink_error)",
            c.lost_for(LostReason::Deadline)
                + c.lost_for(LostReason::RetriesExhausted)
                + c.dropped_for(DropReason::SinkError),
            unsliced + fates.failed + fates.given_up,
        )
    } else {
        (
            "lost(retries_exhausted) + dropped(sink_error)",
            c.lost_for(LostReason::RetriesExhausted) + c.dropped_for(DropReason::SinkError),
            fates.failed,
        )
    };
    let deadline = if dropped {
        // Lost under `deadline` is in the row above; nobody took any back.
        ("items handed back", handed_back, 0)
    } else {
        (
            "lost(deadline)",
            c.lost_for(LostReason::Deadline),
            handed_back,
        )
    };
    // `abandoned` first: a writer that gave up everything as abandoned
    // would otherwise show only as a short sum.
    rows_match([
        ("lost(abandoned)", c.lost_for(LostReason::Abandoned), 0),
        (
            "lost(discarded)",
            c.lost_for(LostReason::Discarded),
            fates.discarded,
        ),
        (
            "lost(terminal)",
            c.lost_for(LostReason::Terminal),
            fates.terminal,
        ),
        failed_or_given_up,
        deadline,
    ])
}
