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
//!
//! When every handle was dropped without a shutdown (S-W16), the writer's
//! own shutdown hands nothing back: what it gave up at its drop deadline
//! (items never sliced, slices whose last attempt failed or was cancelled,
//! and attempts that committed or were rejected only after the deadline
//! fired, which a shutdown would hand back) must equal `deadline`,
//! `retries_exhausted` and `sink_error` together, in one row. The other
//! rows stand as they are, nothing may be pending, and an attempt still
//! running after the writer exited is a broken S-W16.

use outbox::core::{Counters, DropReason, LostReason, Time};

use super::book::{Admit, Book, End};
use super::datastore::Durable;

/// How a run ended, for the end checks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Ending {
    /// A shutdown, during the run or after the heal.
    #[default]
    Shutdown,
    /// An abandon during the run.
    Abandoned,
    /// Every handle dropped at the heal, without a shutdown (S-W16).
    Dropped {
        /// When the writer gave up at its drop deadline (the first item
        /// counted lost under `deadline`), if attempts ending from then on
        /// were given up: `None` if it drained everything in time, or if
        /// the deadline was zero (it then gives up in the round that
        /// starts its shutdown, after applying the outcomes it holds).
        gave_up_at: Option<Time>,
    },
}

/// Runs the end checks; the first broken one, as (rule, detail).
pub fn end(
    book: &Book,
    store: &Durable,
    c: &Counters,
    ending: Ending,
) -> Option<(&'static str, String)> {
    let n = book.items.len();
    let dropped = matches!(ending, Ending::Dropped { .. });
    // An attempt that ended at or after the drop deadline fired was given
    // up (its items are lost under `deadline`) whatever it returned: the
    // writer applies an outcome at the instant the attempt ends, and the
    // engine fires a due deadline before it applies any outcome. A shutdown
    // hands such items back instead; here nobody gets them back.
    let gave_up_at = match ending {
        Ending::Dropped { gave_up_at } => gave_up_at,
        _ => None,
    };
    // Where each item went, as the sink saw it.
    let mut written = vec![false; n];
    let mut in_slice = vec![false; n];
    let (mut discarded, mut terminal, mut failed) = (0u64, 0u64, 0u64);
    // Items of attempts that committed or were rejected after the drop
    // deadline fired: given up like a shutdown's dead letters.
    let mut given_up = 0u64;
    for (first, s) in &book.slices {
        let back = s.ids.iter().any(|id| book.items[*id as usize].handed_back);
        for id in &s.ids {
            in_slice[*id as usize] = true;
        }
        if back {
            continue;
        }
        let late = gave_up_at.is_some_and(|at| s.ended_at.is_some_and(|e| e >= at));
        if late && matches!(s.last, End::Ok(_) | End::Terminal) {
            given_up += s.ids.len() as u64;
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
                    // After a drop: a write the writer left running (S-W16).
                    return Some((
                        if dropped { "S-W16" } else { "I8" },
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
    // After a drop, the items never sliced are lost under `deadline` with
    // nobody to hand them back to: the sum below covers them.
    if c.pending == 0 && !dropped {
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
    if dropped && c.pending != 0 {
        return Some((
            "S-W16",
            format!("{} items pending after the writer exited", c.pending),
        ));
    }
    if ending == Ending::Abandoned || c.pending != 0 {
        return None;
    }
    let handed_back = book.items.iter().filter(|i| i.handed_back).count() as u64;
    let failed_or_given_up = if dropped {
        // Nothing is handed back after a drop: what the writer gave up at
        // its deadline (never sliced, failed last, or ended after the
        // deadline) shares one row with what failed for good.
        let unsliced = (0..n)
            .filter(|id| book.items[*id].admit == Admit::Accepted && !in_slice[*id])
            .count() as u64;
        (
            "lost(deadline) + lost(retries_exhausted) + dropped(sink_error)",
            c.lost_for(LostReason::Deadline)
                + c.lost_for(LostReason::RetriesExhausted)
                + c.dropped_for(DropReason::SinkError),
            unsliced + failed + given_up,
        )
    } else {
        (
            "lost(retries_exhausted) + dropped(sink_error)",
            c.lost_for(LostReason::RetriesExhausted) + c.dropped_for(DropReason::SinkError),
            failed,
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
    let expect = [
        ("lost(abandoned)", c.lost_for(LostReason::Abandoned), 0),
        (
            "lost(discarded)",
            c.lost_for(LostReason::Discarded),
            discarded,
        ),
        ("lost(terminal)", c.lost_for(LostReason::Terminal), terminal),
        failed_or_given_up,
        deadline,
    ];
    for (what, got, want) in expect {
        if got != want {
            return Some(("I5", format!("{what} is {got}; the world saw {want}")));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::draw::rng;
    use crate::net::book::{ItemRec, SliceRec};
    use crate::net::faults::Rates;

    /// A drop run in miniature, one tenant: slice #0 (items 0 and 1)
    /// committed at 10 ms, slice #2 (item 2) at 20 ms, item 3 never sliced;
    /// the store holds items 0 to 2.
    fn run() -> (Book, Durable) {
        let mut b = Book::new(false, 1);
        for _ in 0..4 {
            b.items.push(ItemRec {
                tenant: 0,
                admit: Admit::Accepted,
                handed_back: false,
            });
        }
        for (first, ids, at) in [(0, vec![0, 1], 10), (2, vec![2], 20)] {
            let slice = SliceRec {
                tenant: 0,
                ids,
                attempts: 1,
                last: End::Ok(0),
                ended_at: Some(Time::from_millis(at)),
            };
            b.slices.insert(first, slice);
        }
        let mut store = Durable::new(rng(1), Rates::default(), 1);
        store.by_tenant.insert(0, vec![0, 1, 2]);
        (b, store)
    }

    /// Counters with `written` items written in `writes` writes, the rest
    /// of the 4 lost under `deadline`.
    fn counters(written: u64, writes: u64) -> Counters {
        let mut c = Counters {
            staged: 4,
            written,
            writes,
            ..Counters::default()
        };
        c.lost[1] = 4 - written;
        assert_eq!(c.lost_for(LostReason::Deadline), 4 - written);
        c
    }

    fn dropped(at_ms: Option<u64>) -> Ending {
        Ending::Dropped {
            gave_up_at: at_ms.map(Time::from_millis),
        }
    }

    #[test]
    fn a_commit_after_the_drop_deadline_fired_is_given_up() {
        // S-W16, I5: slice #2 committed at the instant the deadline fired,
        // so the engine counted it lost under `deadline`, not written.
        let (b, store) = run();
        assert_eq!(end(&b, &store, &counters(2, 1), dropped(Some(20))), None);
        // Had the deadline fired later, the commit would be written.
        assert_eq!(end(&b, &store, &counters(3, 2), dropped(Some(21))), None);
        assert!(matches!(
            end(&b, &store, &counters(2, 1), dropped(Some(21))),
            Some(("I1", _))
        ));
        // A commit before the deadline fired cannot be given up.
        assert!(matches!(
            end(&b, &store, &counters(3, 2), dropped(Some(20))),
            Some(("I1", _))
        ));
    }

    #[test]
    fn after_a_drop_unsliced_items_are_lost_under_deadline() {
        // I5: item 3 was never sliced; nobody gets it back after a drop.
        let (b, store) = run();
        assert_eq!(end(&b, &store, &counters(3, 2), dropped(Some(30))), None);
        // The same accounts after a shutdown lack the dead letter.
        assert!(matches!(
            end(&b, &store, &counters(3, 2), Ending::Shutdown),
            Some(("I5", _))
        ));
        // A loss under another reason is not the deadline's.
        let mut c = counters(3, 2);
        c.lost = Default::default();
        c.lost[2] = 1;
        assert_eq!(c.lost_for(LostReason::Abandoned), 1);
        assert!(matches!(
            end(&b, &store, &c, dropped(Some(30))),
            Some(("I5", _))
        ));
        // Still pending after the writer exited.
        let mut c = counters(3, 2);
        c.lost = Default::default();
        c.pending = 1;
        assert!(matches!(
            end(&b, &store, &c, dropped(None)),
            Some(("S-W16", _))
        ));
    }
}
