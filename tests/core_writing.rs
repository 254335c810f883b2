//! The core's rules of the contract's "Writing" section (S-W3, S-W4, S-A3,
//! S-W5, S-W7, S-A5, S-W13), on the engine alone with a hand-driven clock.
//! Each test cites its rule and checks both sides of the rule's conditions
//! and its boundaries.

mod core_world;

use core_world::{dur, ms, World};
use outbox::core::{
    AfterFailure, Config, DropReason, ErrorPolicy, Event, Failure, LostReason, Outcome, Staged,
    Time, WriteId,
};

// ----- S-W3: order and concurrency --------------------------------------

#[test]
fn s_w3_staging_order_one_write_per_tenant_and_concurrency() {
    let mut w = World::new(Config::builder().concurrency(2));
    w.stage_ok(1, [1]);
    w.stage_ok(2, [2]);
    w.stage_ok(3, [3]);
    let ws = w.poll();
    assert_eq!(ws.iter().map(|x| x.tenant).collect::<Vec<_>>(), [1, 2]);
    assert_eq!(w.e.in_flight(), 2, "concurrency 2: the third waits");
    w.stage_ok(1, [4, 5]);
    assert!(
        w.poll().is_empty(),
        "no slot, and T1 already has a write in flight"
    );
    let mut ws = ws.into_iter();
    let (t1, t2) = (ws.next().unwrap(), ws.next().unwrap());
    w.ok(t2);
    let t3 = w.poll_one();
    assert_eq!(
        t3.tenant, 3,
        "T1 is in flight: at most one write per tenant"
    );
    w.ok(t1);
    let t1 = w.poll_one();
    assert_eq!(t1.items, [4, 5], "staging order");
    w.ok(t1);
    w.ok(t3);
    assert_eq!(w.written_of(1), [1, 4, 5]);
    assert_eq!(w.e.tenants(), 0, "settled tenants are forgotten");
}

#[test]
fn s_w3_concurrency_zero_is_one() {
    let mut w = World::new(Config::builder().concurrency(0));
    w.stage_ok(1, [1]);
    w.stage_ok(2, [2]);
    let a = w.poll_one();
    assert_eq!(a.tenant, 1);
    w.ok(a);
    assert_eq!(w.poll_one().tenant, 2);
}

// ----- S-W4: a write takes the backlog ----------------------------------

#[test]
fn s_w4_max_batch_cuts_in_order() {
    let mut w = World::new(Config::builder().max_batch(3));
    w.stage_ok(1, 0..7);
    let mut sizes = Vec::new();
    while let Some(x) = w.poll().pop() {
        sizes.push(x.items.clone());
        w.ok(x);
    }
    assert_eq!(sizes, [vec![0, 1, 2], vec![3, 4, 5], vec![6]]);
    // Exactly max_batch: one write.
    w.stage_ok(2, 10..13);
    assert_eq!(w.poll_one().items, [10, 11, 12]);
}

#[test]
fn s_w4_without_max_batch_the_whole_backlog_goes() {
    let mut w = World::new(Config::builder());
    w.stage_ok(1, [1]);
    let a = w.poll_one();
    w.stage_ok(1, 2..100);
    w.ok(a);
    assert_eq!(w.poll_one().items, (2..100).collect::<Vec<_>>());
}

// ----- S-A3: linger -----------------------------------------------------

#[test]
fn s_a3_full_batch_goes_at_once_partial_waits() {
    let mut w = World::new(Config::builder().max_batch(3).linger(dur(10)));
    w.stage_ok(1, [1]);
    w.at(5);
    w.stage_ok(1, [2]);
    assert!(w.poll().is_empty(), "2 < max_batch: lingers");
    assert_eq!(w.e.poll_timeout(), Some(ms(10)), "from the oldest item");
    w.stage_ok(1, [3]);
    assert_eq!(w.poll_one().items, [1, 2, 3], "full: at once, at 5 ms");
    assert_eq!(w.e.poll_timeout(), None, "the linger timer is gone");
}

#[test]
fn s_a3_a_durable_item_older_than_the_linger_is_ready_at_once() {
    // S-W22: its age counts toward its linger too; 50 ms old under a
    // 10 ms linger, it is ready when taken in, with no timer armed in the
    // past.
    let mut w = World::new(Config::builder().max_batch(2).linger(dur(10)));
    w.at(100);
    let old = outbox::core::Durable {
        tenant: 1,
        item: 1,
        age: dur(50),
        key: None,
    };
    let intake = w.e.stage_durable(w.now, [old], 0);
    assert!(intake.wake, "ready: a write can start");
    assert_eq!(w.e.poll_timeout(), None, "no linger timer");
    assert_eq!(w.poll_one().items, [1]);
}

#[test]
fn s_a3_full_by_bytes_goes_at_once() {
    let mut w = World::weighed(Config::builder().max_batch_bytes(10).linger(dur(1_000)));
    w.stage_ok(1, [4]);
    assert!(w.poll().is_empty());
    w.stage_ok(1, [5]);
    assert!(w.poll().is_empty(), "9 bytes < 10");
    w.stage_ok(1, [1]);
    assert_eq!(w.poll_one().items, [4, 5, 1], "10 bytes: full");
}

#[test]
fn s_a3_leftover_after_a_cut_restarts_its_linger() {
    let mut w = World::new(Config::builder().max_batch(3).linger(dur(10)));
    w.stage_ok(1, [1]); // lingers from 0
    w.at(9);
    w.stage_ok(1, [2, 3, 4]); // full at 3; 4 is left over
    let a = w.poll_one();
    assert_eq!(a.items, [1, 2, 3]);
    w.at(10);
    w.ok(a);
    assert!(
        w.poll().is_empty(),
        "the leftover does not inherit the first batch's linger clock"
    );
    assert_eq!(w.e.poll_timeout(), Some(ms(19)));
    w.at_time(Time::from_nanos(18_999_999));
    assert!(w.poll().is_empty());
    w.at(19);
    assert_eq!(w.poll_one().items, [4]);
}

#[test]
fn s_a3_a_leftover_below_the_byte_limit_lingers_after_the_cut() {
    // S-A3, S-B5: [6, 6] with a 10-byte batch is full, so it goes at once,
    // but only [6] fits; the leftover [6] (6 bytes < 10) is a partial batch
    // and lingers from the cut, not sent at once.
    let mut w = World::weighed(Config::builder().max_batch_bytes(10).linger(dur(100)));
    w.stage_ok(1, [6, 6]);
    let a = w.poll_one();
    assert_eq!(a.items, [6]);
    w.at(1);
    w.ok(a);
    assert!(w.poll().is_empty(), "the leftover is not a full batch");
    assert_eq!(
        w.e.poll_timeout(),
        Some(ms(100)),
        "lingers from the cut at 0"
    );
    w.at(100);
    assert_eq!(w.poll_one().items, [6]);
}

#[test]
fn s_a3_linger_rearmed_when_a_tenant_gains_items() {
    let mut w = World::new(Config::builder().linger(dur(20)));
    w.stage_ok(1, [1]);
    w.at(20);
    let a = w.poll_one();
    w.ok(a);
    w.at(100);
    w.stage_ok(1, [2]);
    assert_eq!(w.e.poll_timeout(), Some(ms(120)), "armed from the new item");
    w.at(119);
    assert!(w.poll().is_empty());
    w.at(120);
    assert_eq!(w.poll_one().items, [2]);
}

#[test]
fn s_a3_items_that_waited_out_their_linger_in_flight_go_at_once() {
    let mut w = World::new(Config::builder().linger(dur(10)));
    w.stage_ok(1, [1]);
    w.at(10);
    let a = w.poll_one();
    w.at(11);
    w.stage_ok(1, [2]); // waits from 11 while [1] is in flight
    w.at(21); // exactly when its linger ends
    w.ok(a);
    assert_eq!(
        w.e.poll_timeout(),
        None,
        "ready at once, no timer in the past"
    );
    assert_eq!(w.poll_one().items, [2], "its linger ended at 21");
}

#[test]
fn s_a3_items_staged_after_a_flush_linger_even_if_a_settle_opened_later() {
    // S-A3, S-A4: only items staged before a flush skip linger; a settle
    // opened later changes nothing for the ones staged after the flush.
    let mut w = World::new(Config::builder().linger(dur(100)));
    w.stage_ok(1, [1]);
    w.at(100);
    let a = w.poll_one(); // linger ran out
    let _f = w.flush(10_000); // covers item 1 (in flight)
    w.at(101);
    w.stage_ok(1, [2]); // after the flush
    w.at(102);
    let _s = w.settle(10_000);
    w.at(103);
    w.ok(a);
    assert!(w.poll().is_empty(), "item 2 lingers");
    assert_eq!(w.e.poll_timeout(), Some(ms(201)), "from its staging at 101");
}

// ----- S-W5: a failed attempt is retried with the identical slice -------

#[test]
fn s_w5_later_arrivals_never_merge_into_a_retry() {
    let mut w = World::new(Config::builder().max_batch(4));
    w.stage_ok(1, [1, 2]);
    let a = w.poll_one();
    w.stage_ok(1, [3, 4, 5]);
    w.fail(a);
    w.at(50);
    let a = w.poll_one();
    assert_eq!(a.items, [1, 2], "room for two more, yet no merging");
    assert_eq!(a.attempt, 2);
    w.ok(a);
    assert_eq!(w.poll_one().items, [3, 4, 5]);
}

#[test]
fn s_w5_every_failure_kind_keeps_the_slice() {
    for outcome in [
        Outcome::Failed(Failure::Error),
        Outcome::Failed(Failure::Panic),
        Outcome::Failed(Failure::Timeout),
        Outcome::Failed(Failure::Cancelled),
    ] {
        let mut w = World::new(Config::builder());
        w.stage_ok(1, [1, 2]);
        let a = w.poll_one();
        let id = a.id;
        w.finish(a, outcome);
        assert_eq!(w.c().failed_attempts, 1, "{outcome:?}");
        w.at(50);
        let a = w.poll_one();
        assert_eq!((a.id, a.items.as_slice(), a.attempt), (id, &[1, 2][..], 2));
    }
}

// ----- S-W7: exponential backoff ----------------------------------------

#[test]
fn s_w7_backoff_doubles_and_resets_on_success() {
    let mut w = World::new(Config::builder());
    w.stage_ok(1, [1]);
    let mut t = 0;
    for expect in [50, 100, 200] {
        let a = w.poll_one();
        w.fail(a);
        assert_eq!(w.e.poll_timeout(), Some(ms(t + expect)));
        // I7: not a nanosecond early.
        w.at_time(Time::from_nanos((t + expect) * 1_000_000 - 1));
        assert!(w.poll().is_empty());
        t += expect;
        w.at(t);
    }
    let a = w.poll_one();
    w.ok(a);
    w.stage_ok(1, [2]);
    let a = w.poll_one();
    w.fail(a);
    assert_eq!(
        w.backoffs(),
        [50, 100, 200, 50].map(dur),
        "reset on success"
    );
    // Another tenant's streak is its own.
    w.stage_ok(2, [3]);
    let b = w.poll_one();
    w.fail(b);
    assert_eq!(w.backoffs().last(), Some(&dur(50)));
}

// ----- S-A5: error policy and terminal rejection ------------------------

#[test]
fn s_a5_drop_policy_drops_the_batch_and_moves_on() {
    for outcome in [
        Outcome::Failed(Failure::Error),
        Outcome::Failed(Failure::Panic),
        Outcome::Failed(Failure::Timeout),
        Outcome::Failed(Failure::Cancelled),
    ] {
        let mut w = World::new(Config::builder().error_policy(ErrorPolicy::Drop));
        w.stage_ok(1, [1, 2]);
        let a = w.poll_one();
        w.stage_ok(1, [3]);
        w.finish(a, outcome);
        assert_eq!(w.dropped(DropReason::SinkError), 2, "{outcome:?}");
        assert_eq!(w.c().failed_attempts, 1);
        assert_eq!(w.c().lost_total(), 0);
        assert_eq!(w.e.poll_timeout(), None, "no backoff");
        let b = w.poll_one();
        assert_eq!((b.items.as_slice(), b.attempt), (&[3][..], 1));
    }
}

#[test]
fn s_a5_terminal_rejection_is_lost_under_either_policy() {
    for policy in [ErrorPolicy::Retry, ErrorPolicy::Drop] {
        let mut w = World::new(Config::builder().error_policy(policy));
        w.stage_ok(1, [1, 2]);
        let a = w.poll_one();
        w.stage_ok(1, [3]);
        w.finish(a, Outcome::Failed(Failure::Rejected));
        assert_eq!(w.lost(LostReason::Terminal), 2, "{policy:?}");
        assert_eq!(w.c().dropped_total(), 0);
        assert_eq!(w.c().failed_attempts, 1);
        assert!(w.events.iter().any(|e| matches!(
            e,
            Event::AttemptFailed {
                next: AfterFailure::Lost,
                ..
            }
        )));
        assert_eq!(w.poll_one().items, [3], "never retried");
    }
}

// ----- S-W13: a write task that vanishes is counted ---------------------

#[test]
fn s_w13_finish_lost_counts_join_failed_and_keeps_running() {
    let mut w = World::new(Config::builder());
    w.stage_ok(1, [1, 2]);
    let a = w.poll_one();
    w.stage_ok(1, [3]);
    assert!(w.finish_lost(a.id));
    assert_eq!(w.lost(LostReason::JoinFailed), 2);
    assert_eq!(w.c().failed_attempts, 1);
    assert_eq!(w.e.pending(), 1);
    assert!(!w.finish_lost(a.id), "not in flight any more");
    let err = w.e.finish(w.now, a, Outcome::WRITTEN).unwrap_err();
    assert_eq!(err.0.items, [1, 2], "an unknown write's items come back");
    assert!(!w.finish_lost(WriteId(99)));
    let b = w.poll_one();
    assert_eq!(b.items, [3]);
    w.ok(b);
    assert_eq!(w.e.pending(), 0);
}

/// A lost task reported with its items through `finish` means what
/// `finish_lost` records: lost under `join_failed`, never retried, one
/// failed attempt of kind `task_lost`; the items come back to be dropped,
/// never as a dead letter, also with dead letters on.
#[test]
fn s_w13_finish_failed_task_lost_is_finish_lost_with_the_items() {
    let mut w = World::new(Config::builder().dead_letters(true));
    w.stage_ok(1, [1, 2]);
    let a = w.poll_one();
    w.stage_ok(1, [3]);
    let done = w.e.finish(w.now, a, Outcome::Failed(Failure::TaskLost));
    assert_eq!(
        done.unwrap(),
        [1, 2],
        "the items are returned to be dropped"
    );
    w.at(0);
    assert_eq!(w.count_events(|e| matches!(e, Event::DeadLetter(_))), 0);
    assert_eq!(w.lost(LostReason::JoinFailed), 2);
    assert_eq!(w.c().failed(Failure::TaskLost), 1);
    assert_eq!(w.c().failed_attempts, 1);
    assert_eq!(w.e.pending(), 1);
    let b = w.poll_one();
    assert_eq!(
        (b.items.as_slice(), b.attempt),
        (&[3][..], 1),
        "not retried"
    );
    w.ok(b);
    assert_eq!(w.e.pending(), 0);
}

/// Refused and dropped items, and in-flight items coming back after an
/// abandon with no shutdown to hand them to, are released to the caller
/// (already counted), never dropped inside the engine; items a shutdown
/// reports are not released.
#[test]
fn s_w13_items_let_go_of_are_released_not_dropped() {
    let mut w = World::new(Config::builder().capacity(2).tenant_capacity(1));
    w.stage_ok(1, [1]);
    assert_eq!(w.stage(1, 2), Staged::Dropped(DropReason::TenantFull));
    w.stage_ok(2, [3]);
    assert_eq!(w.stage(3, 4), Staged::Dropped(DropReason::BufferFull));
    assert_eq!(w.e.take_released(), [2, 4]);
    assert!(w.e.take_released().is_empty(), "taken once");
    let [a, b] = <[_; 2]>::try_from(w.poll()).unwrap();
    assert!(w.e.abandon(w.now).is_empty(), "everything is in flight");
    assert_eq!(w.stage(1, 5), Staged::ShuttingDown);
    assert_eq!(w.e.take_released(), [5]);
    w.finish(a, Outcome::Failed(Failure::Error));
    w.finish(b, Outcome::Failed(Failure::Error));
    assert_eq!(w.e.take_released(), [1, 3], "no shutdown takes them");
    assert_eq!(w.e.counters().lost(LostReason::Abandoned), 2);

    // During a shutdown, the given-up write's items are its dead letters.
    let mut w = World::new(Config::builder());
    w.stage_ok(1, [1]);
    let a = w.poll_one();
    let _ = w.e.shutdown(w.now, w.now);
    w.e.handle_timeout(w.now);
    w.finish(a, Outcome::Failed(Failure::Error));
    assert!(w.e.take_released().is_empty(), "handed back by the report");
    let sd = w.events.iter().find_map(|e| match e {
        Event::ShutdownDone { report, .. } => Some(
            report
                .unwritten
                .iter()
                .map(|r| (r.tenant, r.items.clone()))
                .collect::<Vec<_>>(),
        ),
        _ => None,
    });
    assert_eq!(sd, Some(vec![(1, vec![1])]));
}

// ----- S-F2: the group size limit ----------------------------------------

#[test]
fn s_f2_a_group_counts_every_slice_it_took_toward_max_group_items() {
    // Slices of 1, 3 and 2 items under a limit of 5: the third would take
    // the group to 6, so it waits for the next group.
    let mut w = World::new(Config::builder().max_slices_per_write(4).max_group_items(5));
    w.stage_ok(1, [10]);
    w.stage_ok(2, [20, 21, 22]);
    w.stage_ok(3, [30, 31]);
    let group = w.e.poll_group(w.now).expect("a group");
    let sizes: Vec<(u32, usize)> = group.iter().map(|s| (s.tenant, s.items.len())).collect();
    assert_eq!(sizes, [(1, 1), (2, 3)]);
    let next = w.e.poll_group(w.now).expect("the next group");
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].tenant, 3);
}
