//! The end checks of a net-world run, from the book (what the application
//! and the sink saw), the datastore's durable state and the outbox's final
//! counters. The checks made during the run live where the thing is seen:
//! I2 and I4 in the sink and the datastore, I3 after every stage call and
//! at the end, S-W15 and I8 at each answer, I6 in the healed phase.
//!
//! - I1: per tenant, the datastore holds every item the driver counted
//!   written exactly once, in staging order, and their number equals the
//!   `written` counter; it holds nothing that was refused or dropped at
//!   stage time; items given up may or may not be there.
//! - I5: every loss and drop is explained by a cause the world saw: stage
//!   refusals and drops by `stage`'s answers, `terminal` by rejections,
//!   `discarded` by the datastore's discards, `deadline` by the dead
//!   letters, `retries_exhausted` and `sink_error` by slices whose last
//!   attempt failed; no item vanishes.

use outbox::core::{Counters, DropReason, LostReason};

use super::book::{Admit, Book, End};
use super::datastore::Durable;

/// Runs the end checks; the first broken one, as (rule, detail).
pub fn end(
    book: &Book,
    store: &Durable,
    c: &Counters,
    abandoned: bool,
) -> Option<(&'static str, String)> {
    let n = book.items.len();
    // Where each item went, as the sink saw it.
    let mut written = vec![false; n];
    let mut in_slice = vec![false; n];
    let (mut discarded, mut terminal, mut failed) = (0u64, 0u64, 0u64);
    for (first, s) in &book.slices {
        let back = s.ids.iter().any(|id| book.items[*id as usize].handed_back);
        for id in &s.ids {
            in_slice[*id as usize] = true;
        }
        if back {
            continue;
        }
        match s.last {
            End::Ok(d) => {
                let keep = s.ids.len().saturating_sub(d as usize);
                for id in &s.ids[..keep] {
                    written[*id as usize] = true;
                }
                discarded += u64::from(d).min(s.ids.len() as u64);
            }
            End::Terminal => terminal += s.ids.len() as u64,
            End::Failed | End::Dropped => failed += s.ids.len() as u64,
            End::Running => {
                if c.pending == 0 {
                    return Some((
                        "I8",
                        format!("slice #{first}'s attempt is still running at the end"),
                    ));
                }
            }
        }
    }
    // I1: the store against what was written.
    let mut stored = vec![false; n];
    for (tenant, rows) in &store.by_tenant {
        let mut last_written: Option<u64> = None;
        for &id in rows {
            let Some(rec) = book.items.get(id as usize) else {
                return Some(("I1", format!("the store holds item #{id}, never staged")));
            };
            if rec.tenant != *tenant {
                return Some((
                    "I1",
                    format!(
                        "item #{id} of tenant {} stored under tenant {tenant}",
                        rec.tenant
                    ),
                ));
            }
            if rec.admit != Admit::Accepted {
                return Some((
                    "I1",
                    format!(
                        "item #{id} is in the store, but stage answered {:?}",
                        rec.admit
                    ),
                ));
            }
            if stored[id as usize] {
                return Some(("I1", format!("item #{id} is in the store twice")));
            }
            stored[id as usize] = true;
            if written[id as usize] {
                if let Some(prev) = last_written.filter(|p| *p > id) {
                    return Some((
                        "I1",
                        format!(
                            "tenant {tenant}'s store has written item #{prev} before #{id}: \
                             out of staging order"
                        ),
                    ));
                }
                last_written = Some(id);
            }
        }
    }
    let mut count = 0u64;
    for id in 0..n {
        if written[id] {
            count += 1;
            if !stored[id] {
                return Some((
                    "I1",
                    format!(
                        "item #{id}'s write was answered committed, but it is not in the store"
                    ),
                ));
            }
        }
    }
    if count != c.written {
        return Some((
            "I1",
            format!(
                "the sink saw {count} items committed (not given up), the counters say {} written",
                c.written
            ),
        ));
    }
    // I5: every loss and drop has a cause the world saw.
    let admits =
        |want: fn(&Admit) -> bool| book.items.iter().filter(|i| want(&i.admit)).count() as u64;
    let refused = admits(|a| *a == Admit::Refused);
    let buffer_full = admits(|a| *a == Admit::Dropped(DropReason::BufferFull.as_str()));
    let tenant_full = admits(|a| *a == Admit::Dropped(DropReason::TenantFull.as_str()));
    let expect = [
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
    ];
    for (what, got, want) in expect {
        if got != want {
            return Some(("I5", format!("{what} is {got}; the world saw {want}")));
        }
    }
    if c.pending == 0 {
        if let Some(id) = (0..n).find(|id| {
            book.items[*id].admit == Admit::Accepted
                && !in_slice[*id]
                && !book.items[*id].handed_back
        }) {
            return Some((
                "I5",
                format!("item #{id} was accepted, never written, given up nor handed back"),
            ));
        }
    }
    if abandoned || c.pending != 0 {
        return None;
    }
    let handed_back = book.items.iter().filter(|i| i.handed_back).count() as u64;
    let expect = [
        (
            "lost(discarded)",
            c.lost_for(LostReason::Discarded),
            discarded,
        ),
        ("lost(terminal)", c.lost_for(LostReason::Terminal), terminal),
        (
            "lost(retries_exhausted) + dropped(sink_error)",
            c.lost_for(LostReason::RetriesExhausted) + c.dropped_for(DropReason::SinkError),
            failed,
        ),
        (
            "lost(deadline)",
            c.lost_for(LostReason::Deadline),
            handed_back,
        ),
        ("lost(abandoned)", c.lost_for(LostReason::Abandoned), 0),
    ];
    for (what, got, want) in expect {
        if got != want {
            return Some(("I5", format!("{what} is {got}; the world saw {want}")));
        }
    }
    None
}
