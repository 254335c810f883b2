//! The journal's decisions, sans IO (SPEC D1-D6, S-J1..S-J8): one state
//! machine, [`Machine`], built like the [`Engine`](crate::core::Engine),
//! and the recovery plan that builds it.
//!
//! The driver (feature `journal`) does the file IO: it reads the segment
//! files back, carries out the batches the machine hands out, reads the
//! clock and answers the callers. Everything it does is decided here:
//! what a round commits, when a segment rolls or goes, when a failed
//! commit is tried again and what that retry seals and redoes, which
//! deletions wait, when a closing journal gives up, and at recovery what
//! is refused, cut, sealed, staged again or counted lost. Nothing here
//! reads a clock, touches a file or iterates a hash map: the same inputs
//! give the same decisions (S-C1).
//!
//! # Rooms
//! - [`ledger`](Ledger): sequence numbers, segments, done marks, which
//!   segment can go (S-J1..S-J4, D6).
//! - `commits`: what a round commits, and after a fault what a resume
//!   seals and redoes (S-J5).
//! - `disk`: deletions that wait and segments whose creation failed
//!   (S-J2, S-J7).
//! - [`Faults`]: when a failed commit is tried again, when a close gives
//!   up (S-J5, S-J6).
//! - [`Machine`]: the rounds, the sync barrier, the close.
//! - [`recovery`](plan): the plan from the scanned segments (D2, D4, S-J7).
//! - [`Batch`], [`Op`], [`Executed`]: the contract with the IO.
//!
//! # A round
//! ```text
//! driver                                  machine
//! stage (under the outbox's lock)  ──►  fits, append        (no clock)
//! writer's events                  ──►  handle_done
//! wake-up after a stage or mark    ──►  handle_wake(now)
//! sync() / close                   ──►  handle_sync(waiter) / handle_close
//! commit task                      ◄──  poll_batch(now) -> Batch
//!   carry the ops out, in order (create, append, seal, sync, delete)
//!                                  ──►  handle_executed(now, batch, done)
//!   answer, log, count             ◄──  poll_answer, poll_event
//!   sleep                          ◄──  poll_timeout
//! ```
//!
//! Done marks are the journal's word for an item's end: an item is
//! **done** when it is written, lost or dropped ([`done_by`] reads it off
//! the engine's events), and its **done mark** on disk keeps a recovery
//! from staging it again (S-J3).

mod batch;
mod commits;
mod disk;
mod faults;
mod ledger;
mod machine;
mod poison;
mod recovery;

// The whole surface is public with `testkit`; the driver uses a part.
#[cfg_attr(not(feature = "testkit"), allow(unused_imports))]
pub use batch::{Batch, Executed, Note, Op, Record, Sizes, LIFE_LEN};
#[cfg_attr(not(feature = "testkit"), allow(unused_imports))]
pub use faults::{Faults, Next, CLOSING_RETRIES, CLOSING_RETRY_CAP};
#[cfg_attr(not(feature = "testkit"), allow(unused_imports))]
pub use ledger::{
    Append, Bounds, Costs, Ledger, Limits, MarkRun, MarkSizes, NoRoom, SegmentId, Seq,
    DEFAULT_SEGMENT_BYTES, MIN_MAX_BYTES, MIN_SEGMENT_BYTES,
};
#[cfg_attr(not(feature = "testkit"), allow(unused_imports))]
pub use machine::{Event, LoneStep, Machine, Settings, SyncError};
#[cfg_attr(not(feature = "testkit"), allow(unused_imports))]
pub use poison::{crashes, poisoned, Lives};
#[cfg_attr(not(feature = "testkit"), allow(unused_imports))]
pub use recovery::{
    plan, segment_ids, Found, Head, Plan, Recovery, ScannedSegment, SegmentFile, Step, Unrecognized,
};

use super::{AfterFailure, DropReason, Event as EngineEvent, LostReason};

/// The tenant and count of items whose attempt an engine event ends
/// failed, to be retried, for [`Machine::handle_ended`] (S-J17): always
/// the tenant's oldest pending items. `None` for every other event (an
/// attempt that ends its items is a done mark, [`done_by`]).
pub fn ended_by<K, I>(event: &EngineEvent<K, I>) -> Option<(&K, u64)> {
    match event {
        EngineEvent::AttemptFailed {
            tenant,
            items,
            next: AfterFailure::RetryIn(_),
            ..
        } => Some((tenant, *items)),
        _ => None,
    }
}

/// The tenant and count of accepted items an engine event ends (written,
/// lost or dropped), for [`Machine::handle_done`]: they are always the
/// tenant's oldest pending items (S-W3). `None` for events that end
/// nothing, and for refusals at stage (`buffer_full`, `tenant_full`,
/// `encode_failed`, `journal_full`, `shutdown`), whose items were never
/// accepted. A slice written with some items discarded ends once, through
/// its `Written` event; its `discarded` loss ends nothing more.
pub fn done_by<K, I>(event: &EngineEvent<K, I>) -> Option<(&K, u64)> {
    match event {
        EngineEvent::Written { tenant, items, .. } => Some((tenant, *items)),
        // In the outbox table still, for the partition's next owner.
        EngineEvent::HandedOver { tenant, items } => Some((tenant, *items)),
        EngineEvent::Dropped {
            tenant,
            items,
            reason,
            ..
        } => match reason {
            DropReason::SinkError => Some((tenant, *items)),
            DropReason::BufferFull
            | DropReason::TenantFull
            | DropReason::EncodeFailed
            | DropReason::JournalFull
            | DropReason::TableOnly => None,
        },
        EngineEvent::Lost {
            tenant,
            items,
            reason,
            ..
        } => match reason {
            // Refused after the fence; part of a written slice; never
            // journaled in this process.
            LostReason::Shutdown
            | LostReason::Discarded
            | LostReason::JournalUnreadable
            | LostReason::OtherVersion => None,
            LostReason::Deadline
            | LostReason::Abandoned
            | LostReason::JoinFailed
            | LostReason::Terminal
            | LostReason::RetriesExhausted
            | LostReason::Expired
            | LostReason::StaleEpoch => Some((tenant, *items)),
            // Marked done by the recovery that poisoned it (S-J17): it
            // never entered the tenant's queue.
            LostReason::Poisoned => None,
        },
        EngineEvent::AttemptFailed { .. }
        | EngineEvent::DeadLetter(_)
        | EngineEvent::CancelInFlight
        | EngineEvent::KeyDone { .. }
        | EngineEvent::WaitDone { .. }
        | EngineEvent::ShutdownDone { .. } => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_events_mark_done_the_accepted_items_they_end() {
        use crate::core::{Config, Engine, Failure, Outcome, Staged, Time};
        use std::collections::BTreeMap;
        // Every accepted item is marked done exactly once, refusals never:
        // a drop policy, a discard, a shutdown deadline and a refusal.
        let config = Config::builder()
            .capacity(3)
            .error_policy(crate::core::ErrorPolicy::Drop)
            .build()
            .unwrap();
        let mut e: Engine<u32, u32> = Engine::new(config).unwrap();
        let t0 = Time::ZERO;
        for i in 0..4 {
            let s = e.stage(t0, i % 2, i);
            assert_eq!(s == Staged::Accepted, i < 3);
        }
        let w = e.poll_write(t0).unwrap();
        e.finish(t0, w, Outcome::Failed(Failure::Error)).unwrap();
        let w = e.poll_write(t0).unwrap();
        e.finish(t0, w, Outcome::Written { discarded: 1 }).unwrap();
        let _ = e.stage(t0, 5, 9);
        let _ = e.shutdown(t0, t0);
        let _ = e.stage(t0, 6, 10);
        let mut marked: BTreeMap<u32, u64> = BTreeMap::new();
        while let Some(ev) = e.poll_event() {
            if let Some((t, n)) = done_by(&ev) {
                *marked.entry(*t).or_default() += n;
            }
        }
        let c = e.counters();
        let total: u64 = marked.values().sum();
        assert_eq!(
            total,
            c.staged - c.dropped(DropReason::BufferFull) - c.lost(LostReason::Shutdown)
        );
        assert_eq!(marked.get(&6), None, "refused after the fence");
        assert_eq!(marked.get(&5), Some(&1), "lost at the deadline");
    }

    #[test]
    fn the_engine_takes_recovered_items_past_its_capacity_and_coalesces_journal_refusals() {
        // D4, S-W14, S-B8: recovered items are input too; the journal's
        // refusals queue one event per reason, however many.
        use crate::core::{Config, Durable, Engine, Handoff, Refusal, Staged, Time};
        let config = Config::builder().capacity(1).build().unwrap();
        let mut e: Engine<u32, u32> = Engine::new(config).unwrap();
        let t0 = Time::ZERO;
        let durable = (0..3).map(|item| Durable {
            tenant: 1,
            item,
            age: std::time::Duration::ZERO,
            key: None,
        });
        let intake = e.stage_durable(t0, durable, 2);
        assert_eq!((intake.accepted, intake.refused), (3, 0));
        assert_eq!(e.stage(t0, 1, 9), Staged::Dropped(DropReason::BufferFull));
        for item in 0..5 {
            let refused = Handoff {
                tenant: 2,
                item,
                weight: None,
                at: None,
                refusal: Some(Refusal::EncodeFailed),
            };
            assert_eq!(e.stage_batch([refused]).counted, 1);
        }
        let c = e.counters().clone();
        assert_eq!((c.recovered, c.staged, c.pending), (5, 6, 3));
        assert_eq!(c.lost(LostReason::JournalUnreadable), 2);
        assert_eq!(c.dropped(DropReason::EncodeFailed), 5);
        assert!(c.balanced(), "{c:?}");
        let encode_events: Vec<u64> = std::iter::from_fn(|| e.poll_event())
            .filter_map(|ev| match ev {
                EngineEvent::Dropped {
                    reason: DropReason::EncodeFailed,
                    items,
                    ..
                } => Some(items),
                _ => None,
            })
            .collect();
        assert_eq!(encode_events, [5]);
    }
}
