//! The scenarios of `docs/scenarios.md` at core level: the engine alone,
//! a clock moved by hand, the test playing driver and sink. Each test is
//! named after its scenario and cites the rules it checks.

mod core_world;

use core_world::{dur, ms, World};
use outbox::core::{
    AfterFailure, Config, DropReason, ErrorPolicy, Event, Failure, LostReason, Outcome, Report,
    Staged, Time,
};

/// Scenario 1: S-W5, S-W6: a failing tenant's items are retried and written in order.
#[test]
fn s01_failed_write_retried_in_order() {
    let mut w = World::new(Config::builder());
    w.stage_ok(1, [1, 2]);
    let a = w.poll_one();
    w.fail(a); // backoff 50 ms
    w.at(50);
    let a = w.poll_one();
    assert_eq!((a.items.as_slice(), a.attempt), (&[1, 2][..], 2));
    w.fail(a); // backoff 100 ms
    w.stage_ok(1, [3]);
    assert!(w.poll().is_empty(), "S-W5: 3 waits behind the retry");
    w.at(150);
    let a = w.poll_one();
    assert_eq!(a.items, [1, 2]);
    w.ok(a); // healed
    let b = w.poll_one();
    assert_eq!(b.items, [3]);
    w.ok(b);
    assert_eq!(w.written_of(1), [1, 2, 3]);
    assert_eq!(w.e.pending(), 0);
    assert_eq!(w.c().failed_attempts, 2);
    assert_eq!(w.c().written, 3);
    assert_eq!(w.c().writes, 2);
}

/// Scenario 2: S-W5, I2: every attempt of a write carries the identical slice.
#[test]
fn s02_identical_retry_slice() {
    let mut w = World::new(Config::builder());
    w.stage_ok(1, [1, 2]);
    let a = w.poll_one();
    let id = a.id;
    w.fail(a);
    w.stage_ok(1, [3]);
    w.at(50);
    let a = w.poll_one();
    assert_eq!(a.id, id, "a retry keeps the write's id");
    w.fail(a);
    w.at(150);
    let a = w.poll_one();
    w.ok(a);
    let b = w.poll_one();
    assert_ne!(b.id, id);
    w.ok(b);
    let (last, before) = w.attempts.split_last().expect("attempts");
    assert_eq!(last, &(1, vec![3], 1), "the last write is [3]");
    assert_eq!(
        before,
        [(1, vec![1, 2], 1), (1, vec![1, 2], 2), (1, vec![1, 2], 3)],
        "three attempts of exactly [1, 2]"
    );
}

/// Scenario 3: S-W8, S-B1: a failing tenant does not delay another.
#[test]
fn s03_failing_tenant_does_not_delay_another() {
    let mut w = World::new(Config::builder().concurrency(1));
    w.stage_ok(1, [1]);
    let a = w.poll_one();
    w.fail(a);
    w.stage_ok(2, [2]);
    let b = w.poll_one();
    assert_eq!(b.tenant, 2, "T2 takes the slot T1's backoff does not hold");
    w.ok(b);
    for t in [50, 150, 350] {
        w.at(t);
        let a = w.poll_one();
        assert_eq!(a.tenant, 1);
        w.fail(a);
    }
    assert_eq!(w.written_of(2), [2]);
    assert!(w.written_of(1).is_empty());
    assert_eq!(w.e.pending(), 1);
}

/// Scenario 4: S-W2: no count limit.
#[test]
fn s04_no_count_limit() {
    let mut w = World::new(Config::builder());
    let mut in_flight = Vec::new();
    for i in 0..50_000 {
        assert_eq!(w.e.stage(w.now, 1, i), Staged::Accepted);
        if i % 1_000 == 999 {
            for x in in_flight.drain(..) {
                w.ok(x);
            }
            in_flight = w.poll();
        }
    }
    for x in in_flight.drain(..) {
        w.ok(x);
    }
    while let Some(x) = w.poll().pop() {
        w.ok(x);
    }
    assert_eq!(w.written_of(1), (0..50_000).collect::<Vec<_>>());
    assert_eq!(w.e.pending(), 0);
    assert_eq!(w.c().dropped_total(), 0);
}

/// Scenario 5: S-W9: shutdown keeps retrying until the deadline.
#[test]
fn s05_shutdown_keeps_retrying_until_the_deadline() {
    let mut w = World::new(Config::builder());
    w.stage_ok(1, [1]);
    let a = w.poll_one();
    let sd = w.shutdown(10_000);
    w.fail(a);
    w.at(50);
    let a = w.poll_one();
    w.fail(a); // second failure; heal
    assert!(w.shutdown_done(sd).is_none());
    w.at(150);
    let a = w.poll_one();
    assert_eq!(a.attempt, 3);
    w.ok(a);
    let r = w.shutdown_done(sd).expect("answered once drained");
    assert_eq!(
        r.report(),
        Report {
            written: 1,
            ..Report::default()
        }
    );
    assert!(r.first && r.unwritten.is_empty());
    assert_eq!(w.written_of(1), [1]);
    assert_eq!(w.stage(1, 2), Staged::ShuttingDown);
    assert_eq!(w.e.pending(), 0);
    assert_eq!(w.lost(LostReason::Shutdown), 1);
    assert!(w.e.is_closed());
}

/// Scenario 6: S-W9, S-B6: shutdown counts what is unwritten at the deadline and
/// hands it back.
#[test]
fn s06_shutdown_counts_what_is_unwritten_at_the_deadline() {
    let mut w = World::new(Config::builder());
    w.stage_ok(1, [1, 2]);
    w.stage_ok(2, [3]);
    let ws = w.poll();
    let (t1, t2): (Vec<_>, Vec<_>) = ws.into_iter().partition(|x| x.tenant == 1);
    let hung = t2.into_iter().next().expect("T2 in flight");
    w.fail(t1.into_iter().next().expect("T1 in flight"));
    let sd = w.shutdown(200);
    w.at(50);
    let a = w.poll_one();
    w.fail(a); // next retry at 150
    w.at(150);
    let a = w.poll_one();
    w.fail(a); // next retry at 350, after the deadline
    w.at(199);
    assert!(w.shutdown_done(sd).is_none());
    assert_eq!(w.e.pending(), 3);
    w.at(200);
    assert_eq!(w.lost(LostReason::Deadline), 3);
    assert_eq!(w.e.pending(), 0, "pending ends at zero at the deadline");
    assert!(w.events.iter().any(|e| matches!(e, Event::CancelInFlight)));
    assert!(
        w.shutdown_done(sd).is_none(),
        "the report waits for the hung write's items (dead letters)"
    );
    w.finish(hung, Outcome::Failed(Failure::Cancelled));
    let r = w.shutdown_done(sd).expect("answered");
    assert_eq!(
        r.report(),
        Report {
            lost: 3,
            deadline_passed: true,
            ..Report::default()
        }
    );
    assert_eq!(r.unwritten, [(1, vec![1, 2]), (2, vec![3])]);
    assert!(w.written.is_empty(), "nothing written");
    assert_eq!(w.c().written, 0);
    // S-W18: the cancelled, given-up attempt ends counted, as cancelled.
    let c = w.c();
    assert_eq!(c.failed_attempts, 4, "3 sink errors and the cancellation");
    assert_eq!(c.failed(Failure::Cancelled), 1);
    assert_eq!(c.attempts, c.writes + c.failed_attempts);
}

/// Scenario 7: S-W5: a panicking write is retried.
#[test]
fn s07_panicking_write_is_retried() {
    panic_like_retry(Outcome::Failed(Failure::Panic));
}

/// Scenario 8: S-W5: a sink error whose Display panics reaches the core as a panic
/// (the driver contains it); the outcome is the same as 7.
#[test]
fn s08_error_display_panics() {
    panic_like_retry(Outcome::Failed(Failure::Panic));
    // And a plain error takes the same road, only named differently.
    panic_like_retry(Outcome::Failed(Failure::Error));
}

fn panic_like_retry(outcome: Outcome) {
    let mut w = World::new(Config::builder());
    w.stage_ok(1, [1]);
    let a = w.poll_one();
    w.stage_ok(1, [2]); // after the panic started
    w.finish(a, outcome);
    let failure = w.events.iter().find_map(|e| match e {
        Event::AttemptFailed { failure, next, .. } => Some((*failure, *next)),
        _ => None,
    });
    let name = if outcome == Outcome::Failed(Failure::Panic) {
        Failure::Panic
    } else {
        Failure::Error
    };
    assert_eq!(failure, Some((name, AfterFailure::RetryIn(dur(50)))));
    w.at(50);
    let a = w.poll_one();
    assert_eq!(a.items, [1]);
    w.ok(a);
    let b = w.poll_one();
    w.ok(b);
    assert_eq!(w.written_of(1), [1, 2]);
    assert_eq!(w.c().failed_attempts, 1);
    assert_eq!(w.c().lost_total(), 0);
    assert_eq!(w.e.pending(), 0);
}

/// Scenario 9: S-W9: shutdown fences admission.
#[test]
fn s09_shutdown_fences_admission() {
    let mut w = World::new(Config::builder());
    w.stage_ok(1, [1]);
    let hung = w.poll_one();
    w.stage_ok(1, [2]);
    let sd = w.shutdown(60_000);
    assert_eq!(w.stage(1, 3), Staged::ShuttingDown);
    assert_eq!(w.lost(LostReason::Shutdown), 1);
    assert_eq!(w.e.pending(), 2);
    w.at(10_000);
    w.ok(hung); // released
    let b = w.poll_one();
    assert_eq!(b.items, [2]);
    w.ok(b);
    let r = w.shutdown_done(sd).expect("answered");
    assert_eq!(r.lost, 0);
    assert_eq!(r.written, 2);
    assert_eq!(w.written_of(1), [1, 2]);
}

/// Scenario 10: S-W4, S-A3: a full batch goes at once, as one write.
#[test]
fn s10_batches_not_one_by_one() {
    let mut w = World::new(Config::builder().capacity(64).max_batch(8).linger(dur(5)));
    w.stage_ok(1, 0..8);
    let a = w.poll_one();
    assert_eq!(a.items, (0..8).collect::<Vec<_>>());
    w.ok(a);
    assert!(w.poll().is_empty());
    assert_eq!(w.c().dropped_total(), 0);
    assert_eq!(w.c().writes, 1);
}

/// Scenario 11: S-A3: a partial batch goes on the linger.
#[test]
fn s11_partial_batch_goes_on_the_linger() {
    let mut w = World::new(Config::builder().max_batch(500).linger(dur(20)));
    w.stage_ok(1, [1]);
    assert!(w.poll().is_empty());
    assert_eq!(w.e.poll_timeout(), Some(ms(20)));
    w.at_time(Time::from_nanos(19_999_999));
    assert!(w.poll().is_empty(), "not before the linger");
    w.at(20);
    let a = w.poll_one();
    assert_eq!(a.items, [1]);
}

/// Scenario 12: S-A1, S-W1: a stalled sink drops instead of blocking.
#[test]
fn s12_stalled_sink_drops_instead_of_blocking() {
    let mut w = World::new(Config::builder().capacity(4).max_batch(1));
    let mut stuck = Vec::new();
    let mut dropped = 0;
    for i in 0..32 {
        match w.stage(i % 3, i) {
            Staged::Accepted => {}
            Staged::Dropped(DropReason::BufferFull) => dropped += 1,
            other => panic!("unexpected {other:?}"),
        }
        stuck.extend(w.poll());
    }
    assert_eq!(
        dropped, 28,
        "4 pending (in flight included), the rest dropped"
    );
    assert_eq!(w.dropped(DropReason::BufferFull), 28);
    assert_eq!(w.c().written, 0, "nothing written yet");
    assert_eq!(w.e.pending(), 4);
    assert_eq!(stuck.len(), 3, "one write per tenant");
}

/// Scenario 13: S-A4: flush writes a partial batch early.
#[test]
fn s13_flush_writes_a_partial_batch_early() {
    let mut w = World::new(Config::builder().linger(dur(60_000)));
    w.stage_ok(1, [1, 2]);
    assert!(w.poll().is_empty());
    let f = w.flush(1_000);
    let a = w.poll_one();
    assert_eq!(a.items, [1, 2]);
    w.ok(a);
    assert_eq!(
        w.wait_done(f),
        Some(Report {
            written: 2,
            ..Report::default()
        })
    );
}

/// Scenario 14: S-A5, S-A4: flush on a failing sink under the drop policy.
#[test]
fn s14_flush_on_a_failing_sink_drop_policy() {
    let mut w = World::new(Config::builder().error_policy(ErrorPolicy::Drop));
    w.stage_ok(1, [1]);
    let f = w.flush(1_000);
    let a = w.poll_one();
    w.fail(a);
    assert_eq!(
        w.wait_done(f),
        Some(Report {
            dropped: 1,
            ..Report::default()
        })
    );
    assert_eq!(w.dropped(DropReason::SinkError), 1);
    assert!(w.poll().is_empty(), "never retried");
    w.at(10_000);
    assert!(w.poll().is_empty());
}

/// Scenario 15: S-A7: abandon counts every queued item.
#[test]
fn s15_abandon_counts_every_queued_item() {
    let mut w = World::new(Config::builder().max_batch(2).linger(dur(1_000)));
    w.stage_ok(1, [1, 2, 3]); // [1, 2] goes, 3 lingers
    w.stage_ok(2, [4, 5]);
    let ws = w.poll();
    assert_eq!(ws.len(), 2);
    let mut ws = ws.into_iter();
    let t1 = ws.next().expect("T1");
    let t2 = ws.next().expect("T2");
    w.fail(t2); // T2 backing off with [4, 5]
    w.stage_ok(3, [6]); // lingering
    assert_eq!(w.e.pending(), 6);
    let held = w.abandon();
    assert_eq!(w.lost(LostReason::Abandoned), 6);
    assert_eq!(w.e.pending(), 0);
    assert_eq!(held, [(1, vec![3]), (2, vec![4, 5]), (3, vec![6])]);
    // S-J16: only the run that failed and waited for its retry was tried.
    let attempted: Vec<bool> = held.iter().map(|run| run.attempted).collect();
    assert_eq!(attempted, [false, true, false]);
    assert!(w.events.iter().any(|e| matches!(e, Event::CancelInFlight)));
    assert!(w.e.is_closed());
    let before = w.c().clone();
    // It comes back after the cancel. S-W18: the attempt ends as a write;
    // its items stay counted lost.
    w.finish(t1, Outcome::WRITTEN);
    let mut after = before.clone();
    after.writes += 1;
    assert_eq!(
        w.c(),
        &after,
        "a given-up write that commits counts a write"
    );
    assert_eq!(w.c().attempts, w.c().attempts_ended());
    assert!(w.poll().is_empty());
    assert_eq!(w.e.poll_timeout(), None, "no timer survives");
}

/// Scenario 17: S-W5, I7: no reordering on retry; B never starts while A waits.
#[test]
fn s17_reordering_on_retry() {
    let mut w = World::new(Config::builder().concurrency(4));
    w.stage_ok(1, [10]); // A
    let a = w.poll_one();
    w.fail(a);
    w.stage_ok(1, [20]); // B
    w.at_time(Time::from_nanos(49_999_999));
    assert!(w.poll().is_empty(), "B does not start during A's backoff");
    w.at(50);
    let a = w.poll_one();
    assert_eq!(a.items, [10]);
    assert!(w.poll().is_empty(), "B waits for A");
    w.ok(a);
    let b = w.poll_one();
    w.ok(b);
    assert_eq!(w.written_of(1), [10, 20]);
}

/// Scenario 20: S-A3, S-W4: eager batches under load.
#[test]
fn s20_eager_batches_under_load() {
    let mut w = World::new(
        Config::builder()
            .capacity(2_048)
            .max_batch(512)
            .linger(dur(5_000)),
    );
    let mut dropped = 0;
    let mut full_writes = 0;
    for i in 0..10_000u32 {
        // 10 items per millisecond, a healthy instant sink.
        w.now = Time::from_nanos(u64::from(i) * 100_000);
        match w.e.stage(w.now, 1, i) {
            Staged::Accepted => {}
            Staged::Dropped(_) => dropped += 1,
            other => panic!("{other:?}"),
        }
        for x in w.poll() {
            assert_eq!(x.items.len(), 512, "only full batches before the linger");
            full_writes += 1;
            w.ok(x);
        }
    }
    assert_eq!(full_writes, 19, "full batches went at once, not per linger");
    assert_eq!(w.e.pending(), 10_000 - 19 * 512);
    w.at(999 + 5_000);
    let last = w.poll_one();
    assert_eq!(last.items.len(), 272);
    w.ok(last);
    assert_eq!(w.c().written + dropped, 10_000);
    assert_eq!(dropped, 0);
    assert_eq!(w.written_of(1), (0..10_000).collect::<Vec<_>>());
}

/// Scenario 21: S-B7: one tenant's flood vs others' trickle.
#[test]
fn s21_flood_vs_trickle_with_tenant_capacity() {
    let mut w = World::new(Config::builder().capacity(100).tenant_capacity(10));
    let mut t1_dropped = 0;
    let mut item = 0;
    for round in 0..20u64 {
        w.at(round * 10_000); // every backoff is due again
        for _ in 0..5 {
            item += 1;
            if let Staged::Dropped(r) = w.stage(1, item) {
                assert_eq!(r, DropReason::TenantFull);
                t1_dropped += 1;
            }
        }
        for t in 2..=5 {
            item += 1;
            assert_eq!(w.stage(t, item), Staged::Accepted, "T{t} never sees a drop");
        }
        for x in w.poll() {
            if x.tenant == 1 {
                w.fail(x);
            } else {
                w.ok(x);
            }
        }
    }
    assert!(t1_dropped > 0);
    assert_eq!(w.dropped(DropReason::TenantFull), t1_dropped);
    assert_eq!(w.dropped(DropReason::BufferFull), 0);
    assert_eq!(w.e.pending(), 10, "T1 holds only its own quota");
    for t in 2..=5 {
        assert_eq!(w.written_of(t).len(), 20);
    }
}

/// Scenario 22: S-W3, S-W8: concurrency slots are not held by waiting tenants.
#[test]
fn s22_concurrency_slots_not_held_by_waiting_tenants() {
    let mut w = World::new(Config::builder().concurrency(5).max_batch(1));
    w.stage_ok(1, 0..20);
    let a = w.poll_one();
    assert_eq!(a.tenant, 1, "one write per tenant, whatever its backlog");
    w.stage_ok(2, [100]);
    let b = w.poll_one();
    assert_eq!((b.tenant, b.items.as_slice()), (2, &[100][..]));
    assert_eq!(w.e.in_flight(), 2);
}

/// Scenario 23: S-W14, I3, I5: every drop and loss path is counted.
#[test]
fn s23_every_drop_path_is_counted() {
    // Retry policy: buffer full, terminal, retries exhausted, deadline,
    // late stage. `World` checks the balance after every step.
    let mut w = World::new(Config::builder().capacity(6).max_attempts(2).max_batch(2));
    w.stage_ok(1, [1, 2]);
    w.stage_ok(2, [3, 4]);
    w.stage_ok(3, [5, 6]);
    assert_eq!(w.stage(4, 7), Staged::Dropped(DropReason::BufferFull));
    let ws = w.poll();
    let mut it = ws.into_iter();
    let (t1, t2, t3) = (it.next().unwrap(), it.next().unwrap(), it.next().unwrap());
    w.finish(t1, Outcome::Failed(Failure::Rejected));
    assert_eq!(w.lost(LostReason::Terminal), 2);
    w.fail(t2);
    w.at(50);
    let t2 = w.poll_one();
    w.fail(t2);
    assert_eq!(w.lost(LostReason::RetriesExhausted), 2);
    w.stage_ok(4, [8]);
    let sd = w.shutdown(1_000);
    assert_eq!(w.stage(4, 9), Staged::ShuttingDown);
    assert_eq!(w.lost(LostReason::Shutdown), 1);
    let t4 = w.poll_one();
    w.ok(t4);
    w.at(1_000);
    assert_eq!(w.lost(LostReason::Deadline), 2, "T3's hung write");
    w.finish(t3, Outcome::Failed(Failure::Cancelled));
    assert!(w.shutdown_done(sd).is_some());
    let c = w.c();
    assert_eq!(c.staged, 9);
    assert_eq!(c.written, 1);
    assert_eq!(c.dropped_total(), 1);
    assert_eq!(c.lost_total(), 7);

    // Drop policy: sink error.
    let mut w = World::new(Config::builder().error_policy(ErrorPolicy::Drop));
    w.stage_ok(1, [1, 2, 3]);
    let a = w.poll_one();
    w.fail(a);
    assert_eq!(w.dropped(DropReason::SinkError), 3);
    assert_eq!(w.e.pending(), 0);
}

/// Scenario 24: S-W9, S-W15: shutdown with every tenant in backoff returns at its
/// deadline, not at the backoffs.
#[test]
fn s24_shutdown_with_every_tenant_in_backoff() {
    let mut w = World::new(
        Config::builder()
            .initial_backoff(dur(30_000))
            .max_backoff(dur(60_000)),
    );
    for t in 1..=5 {
        w.stage_ok(t, (0..t).map(|i| t * 10 + i));
    }
    for x in w.poll() {
        w.fail(x);
    }
    w.at(1_000);
    let sd = w.shutdown(3_000);
    assert_eq!(w.e.poll_timeout(), Some(ms(3_000)));
    w.at(2_999);
    assert!(w.shutdown_done(sd).is_none());
    w.at(3_000);
    let r = w.shutdown_done(sd).expect("answered at the deadline");
    assert_eq!(r.lost, 15);
    assert!(r.deadline_passed);
    assert_eq!(w.lost(LostReason::Deadline), 15);
    assert_eq!(r.unwritten.len(), 5);
    assert_eq!(w.e.poll_timeout(), None, "no backoff timer survives");
}

/// Scenario 25: S-B2: retries exhausted after max_attempts.
#[test]
fn s25_retries_exhausted() {
    let mut w = World::new(Config::builder().max_attempts(3));
    w.stage_ok(1, [1, 2, 3, 4]);
    for (t, attempt) in [(0, 1), (50, 2), (150, 3)] {
        w.at(t);
        let a = w.poll_one();
        assert_eq!(a.attempt, attempt);
        assert_eq!(w.lost(LostReason::RetriesExhausted), 0);
        w.fail(a);
    }
    assert_eq!(w.lost(LostReason::RetriesExhausted), 4, "exactly the batch");
    assert_eq!(w.c().lost_total(), 4);
    assert_eq!(w.e.pending(), 0);
    w.at(10_000);
    assert!(w.poll().is_empty());
}

/// Scenario 27: S-B3: a write that outlives write_timeout is retried identically.
#[test]
fn s27_write_timeout() {
    let mut w = World::new(Config::builder().write_timeout(dur(30_000)));
    w.stage_ok(1, [1, 2]);
    let a = w.poll_one();
    assert_eq!(a.deadline, Some(ms(30_000)));
    w.at(30_000); // the driver cancels it at its deadline
    w.finish(a, Outcome::Failed(Failure::Timeout));
    assert!(w.events.iter().any(|e| matches!(
        e,
        Event::AttemptFailed {
            failure: Failure::Timeout,
            next: AfterFailure::RetryIn(_),
            ..
        }
    )));
    w.at(30_050);
    let a = w.poll_one();
    assert_eq!((a.items.as_slice(), a.attempt), (&[1, 2][..], 2));
    assert_eq!(a.deadline, Some(ms(30_050 + 30_000)));
}

/// Scenario 28: S-W7, S-B2: no wait ever exceeds max_backoff, with or without jitter.
#[test]
fn s28_backoff_cap() {
    for jitter in [0.0, 0.5] {
        let mut w = World::new(
            Config::builder()
                .max_backoff(dur(5_000))
                .jitter(jitter)
                .seed(9),
        );
        w.stage_ok(1, [1]);
        for _ in 0..40 {
            let t = w.e.poll_timeout().unwrap_or(w.now);
            w.at_time(t);
            let a = w.poll_one();
            w.fail(a);
        }
        let waits = w.backoffs();
        assert_eq!(waits.len(), 40);
        assert!(waits.iter().all(|d| *d <= dur(5_000)), "{waits:?}");
        if jitter == 0.0 {
            assert_eq!(
                &waits[..8],
                [50, 100, 200, 400, 800, 1_600, 3_200, 5_000].map(dur)
            );
            assert!(waits[8..].iter().all(|d| *d == dur(5_000)));
        } else {
            assert!(waits[8..].iter().all(|d| *d >= dur(2_500)));
        }
    }
}
