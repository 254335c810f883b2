//! The core's rules of the contract's "Accounting and metrics" section
//! (S-W11, S-W12, S-W18), on the engine alone with a hand-driven clock.
//! S-W14 (every item in exactly one place, counters never decrease) is
//! checked by the test world after every step of every core test.

mod core_world;

use core_world::{dur, ms, World};
use outbox::core::{AfterFailure, Config, Event, Failure, LostReason, Outcome, Report};

// ----- S-W11: metrics (what events carry for the driver) ----------------

#[test]
fn events_carry_latency_items_and_attempt() {
    let mut w = World::new(Config::builder());
    w.at(10);
    w.stage_ok(1, [1, 2, 3]);
    let a = w.poll_one();
    w.at(35);
    w.fail(a);
    w.at(100);
    let a = w.poll_one();
    w.at(130);
    w.ok(a);
    let seen: Vec<_> = w
        .events
        .iter()
        .filter_map(|e| match e {
            Event::AttemptFailed {
                tenant,
                items,
                attempt,
                latency,
                ..
            } => Some(("failed", *tenant, *items, *attempt, *latency)),
            Event::Written {
                tenant,
                items,
                attempt,
                latency,
                ..
            } => Some(("written", *tenant, *items, *attempt, *latency)),
            _ => None,
        })
        .collect();
    assert_eq!(
        seen,
        [("failed", 1, 3, 1, dur(25)), ("written", 1, 3, 2, dur(30)),],
        "latency runs from this attempt's start"
    );
}

// ----- S-W12: a sink may discard ----------------------------------------

#[test]
fn s_w12_discarded_items_are_lost() {
    let mut w = World::new(Config::builder());
    w.stage_ok(1, [1, 2, 3, 4, 5]);
    let f = w.flush(1_000);
    let a = w.poll_one();
    w.finish(a, Outcome::Written { discarded: 2 });
    assert_eq!(w.c().written, 3);
    assert_eq!(w.c().writes, 1);
    assert_eq!(w.lost(LostReason::Discarded), 2);
    assert_eq!(w.written_of(1), [1, 2, 3]);
    assert_eq!(
        w.wait_done(f),
        Some(Report {
            written: 3,
            lost: 2,
            ..Report::default()
        })
    );

    // Clamped to the slice; zero discarded makes no loss event.
    w.stage_ok(1, [6, 7]);
    let a = w.poll_one();
    w.finish(a, Outcome::Written { discarded: 9 });
    assert_eq!(w.lost(LostReason::Discarded), 4);
    assert_eq!(w.c().written, 3);
    w.stage_ok(1, [8]);
    let a = w.poll_one();
    w.ok(a);
    assert_eq!(
        w.count_events(|e| matches!(
            e,
            Event::Lost {
                reason: LostReason::Discarded,
                ..
            }
        )),
        2
    );
}

// ----- S-W18: every attempt has one counted outcome ---------------------

#[test]
fn s_w18_every_given_up_attempt_ends_in_one_counted_outcome() {
    // Abandon gives up three writes in flight; they come back written,
    // cancelled, and with their task lost: a write, then two failures by
    // kind, each with its event and latency, no item counted twice.
    let mut w = World::new(Config::builder().concurrency(3));
    w.stage_ok(1, [1]);
    w.stage_ok(2, [2]);
    w.stage_ok(3, [3]);
    let [a, b, c] = <[_; 3]>::try_from(w.poll()).unwrap();
    w.at(5);
    let _ = w.e.abandon(w.now);
    w.at(7);
    w.finish(a, Outcome::WRITTEN);
    w.finish(b, Outcome::Failed(Failure::Cancelled));
    assert!(w.e.finish_lost(w.now, c.id));
    w.at(7); // collects the events
    let ends: Vec<_> = w
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Written {
                tenant,
                given_up,
                latency,
                ..
            } => Some((*tenant, "written", *given_up, *latency)),
            Event::AttemptFailed {
                tenant,
                failure,
                next,
                latency,
                ..
            } => Some((
                *tenant,
                failure.as_str(),
                *next == AfterFailure::GivenUp,
                *latency,
            )),
            _ => None,
        })
        .collect();
    assert_eq!(
        ends,
        [
            (1, "written", true, dur(7)),
            (2, "cancelled", true, dur(7)),
            (3, "task_lost", true, dur(7))
        ]
    );
    let k = w.e.counters();
    assert_eq!((k.attempts, k.writes, k.failed_attempts), (3, 1, 2));
    assert_eq!(
        (k.failed(Failure::Cancelled), k.failed(Failure::TaskLost)),
        (1, 1)
    );
    assert_eq!((k.written, k.lost(LostReason::Abandoned)), (0, 3));
    assert!(k.balanced());
}

// ----- S-R6: health -----------------------------------------------------

#[test]
fn s_r6_the_health_times_follow_the_oldest_pending_item_and_the_last_commit() {
    // With `max_item_age` items are stamped (S-R3), so the oldest pending
    // item's time is exact, waiting or in flight.
    let mut w = World::new(Config::builder().max_item_age(dur(1_000)));
    assert_eq!((w.e.oldest_pending(), w.e.last_written()), (None, None));
    w.at(10);
    w.stage_ok(1, [1, 2]);
    w.at(20);
    w.stage_ok(2, [3]);
    assert_eq!(w.e.oldest_pending(), Some(ms(10)));
    w.at(30);
    let mut writes = w.poll();
    assert_eq!(writes.len(), 2);
    assert_eq!(w.e.oldest_pending(), Some(ms(10)), "in flight");
    assert_eq!(w.e.last_written(), None);
    w.at(40);
    let second = writes.pop().unwrap();
    w.ok(writes.pop().unwrap());
    assert_eq!(w.e.oldest_pending(), Some(ms(20)));
    assert_eq!(w.e.last_written(), Some(ms(40)));
    w.at(50);
    w.ok(second);
    assert_eq!(
        (w.e.oldest_pending(), w.e.last_written()),
        (None, Some(ms(50)))
    );
}

#[test]
fn s_r6_a_write_given_up_at_the_shutdown_deadline_holds_no_pending_item() {
    // Its items are counted lost when the deadline passes (S-W9), while
    // the attempt itself may still run: it no longer makes them pending.
    let mut w = World::new(Config::builder().max_item_age(dur(1_000)));
    w.at(10);
    w.stage_ok(1, [1]);
    let write = w.poll_one();
    let _ = w.shutdown(20);
    assert_eq!(w.e.oldest_pending(), Some(ms(10)), "before the deadline");
    w.at(20);
    assert_eq!(w.e.pending(), 0);
    assert_eq!(w.e.oldest_pending(), None, "given up, still running");
    w.ok(write);
    assert_eq!(w.e.oldest_pending(), None);
}
