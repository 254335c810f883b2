//! The net world's checks, gathered by rule: each file is named for the
//! rule it checks, and each function for what it checks. Where each rule
//! is checked:
//!
//! | rule | function | when |
//! | --- | --- | --- |
//! | I1 | [`i1::store_holds_what_was_written`] | at the end |
//! | I1 | [`i1::slice_of_one_tenant_in_order`], [`i1::slice_starts_after_earlier_ones`] | each attempt's start (the sink) |
//! | I1 | a commit's tenant and no item committed twice: `datastore::handle` (interleaved with the commit) | each commit (the datastore) |
//! | I2 | [`i2::retry_is_identical`] | each retry's start (the sink) |
//! | I2 | the same request bytes for a slice: `datastore::handle` | each request (the datastore) |
//! | I3 | [`i3::counters_balance`]; the metrics against the counters, [`super::metrics::SimRecorder::mismatch`] | after every stage call, at each sample and at the end (the app) |
//! | I3 | [`i3::counters_balance_after_exit`], [`i3::counters_never_decrease`] | after the writer exits, in the drop ending (the app) |
//! | I4 | [`i4::one_attempt_per_slice`], [`i4::in_flight_within_bounds`] | each attempt's start (the sink) |
//! | I5 | [`i5::stage_answers_explained`], [`i5::nothing_vanished`], [`i5::end_losses_explained`] | at the end |
//! | I6 | the healed phase's settle (`app::healed`) and the run's time cap (`world`) | healed phase |
//! | I7 | [`i7::retry_after_backoff`] | each retry's start (the sink) |
//! | I8 | [`i8::nothing_starts_after_close`]; [`fates::tally`] (no attempt left running) | each attempt's start; at the end |
//! | S-W4 | [`s_w4::slice_not_empty`] | each attempt's start (the sink) |
//! | S-W15, I8, S-A4 | `app::judge` | each flush, settle and shutdown answer (the app) |
//! | S-W16 | [`s_w16::nothing_pending_after_exit`], [`s_w16::drained_what_it_held`]; the writer's exit, `app::writer_exits` | after every handle is dropped (the app) |
//! | S-W16 | [`s_w16::nothing_pending_after_drop`]; [`fates::tally`] | at the end of a drop ending |
//! | S-W9, S-B6, S-A7 | `app::shut_down`, `app::controls` | each shutdown and abandon (the app) |
//!
//! The end checks ([`end`]) read the book (what the application and the
//! sink saw), the datastore's durable state and the outbox's final
//! counters:
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

use outbox::core::{Counters, Time};

use super::book::Book;
use super::datastore::Durable;

pub mod attempt;
pub mod fates;
pub mod i1;
pub mod i2;
pub mod i3;
pub mod i4;
pub mod i5;
pub mod i7;
pub mod i8;
pub mod s_w16;
pub mod s_w4;

/// A broken rule: its id and what was seen.
pub type Broken = (&'static str, String);

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

/// Runs the end checks in a fixed order; the first broken one.
pub fn end(book: &Book, store: &Durable, c: &Counters, ending: Ending) -> Option<Broken> {
    end_checks(book, store, c, ending).err()
}

fn end_checks(book: &Book, store: &Durable, c: &Counters, ending: Ending) -> Result<(), Broken> {
    let fates = fates::tally(book, c, ending)?;
    i1::store_holds_what_was_written(book, store, c, &fates)?;
    i5::stage_answers_explained(book, c)?;
    if c.pending == 0 && !ending.is_drop() {
        i5::nothing_vanished(book, &fates)?;
    }
    if ending.is_drop() {
        s_w16::nothing_pending_after_drop(c)?;
    }
    if ending == Ending::Abandoned || c.pending != 0 {
        return Ok(());
    }
    i5::end_losses_explained(book, c, &fates, ending.is_drop())
}

impl Ending {
    /// Every handle was dropped without a shutdown.
    pub fn is_drop(self) -> bool {
        matches!(self, Ending::Dropped { .. })
    }

    /// When the writer gave up at its drop deadline, after a drop.
    pub fn gave_up_at(self) -> Option<Time> {
        match self {
            Ending::Dropped { gave_up_at } => gave_up_at,
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::draw::rng;
    use crate::net::book::{Admit, End};
    use crate::net::book::{ItemRec, SliceRec};
    use crate::net::faults::Rates;
    use outbox::core::LostReason;

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
