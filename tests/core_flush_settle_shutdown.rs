//! The core's rules of the contract's "Flush, settle, shutdown" section
//! (S-W10, S-A4, S-W9, S-A7, S-B6, S-W17), on the engine alone with a
//! hand-driven clock. Each test cites its rule and checks both sides of the
//! rule's conditions and its boundaries.

mod core_world;

use core_world::{dur, ms, World};
use outbox::core::{
    Config, Engine, Event, Failure, LostReason, Outcome, Report, Staged, Time, WriteId,
};

// ----- S-W10: settle ----------------------------------------------------

#[test]
fn s_w10_settle_keeps_the_linger() {
    let mut w = World::new(Config::builder().linger(dur(1_000)));
    w.stage_ok(1, [1]);
    let s = w.settle(5_000);
    let early = w.settle(500);
    assert!(w.poll().is_empty(), "settle does not release the linger");
    w.at(500);
    assert_eq!(
        w.wait_done(early),
        Some(Report {
            pending: 1,
            deadline_passed: true,
            ..Report::default()
        })
    );
    assert!(!w.e.is_shutting_down(), "settle does not close");
    w.at(1_000);
    let a = w.poll_one();
    w.ok(a);
    assert_eq!(
        w.wait_done(s),
        Some(Report {
            written: 1,
            ..Report::default()
        })
    );
    assert_eq!(w.stage(1, 2), Staged::Accepted);
}

// ----- S-A4: flush ------------------------------------------------------

#[test]
fn s_a4_overlapping_flushes_each_truthful() {
    let mut w = World::new(Config::builder());
    w.stage_ok(1, [1, 2]);
    let t1 = w.poll_one();
    let a = w.flush(1_000); // waits for 1, 2
    w.stage_ok(2, [3]);
    let b = w.flush(1_000); // waits for 1, 2, 3
    let t2 = w.poll_one();
    w.fail(t2);
    assert_eq!(w.wait_done(a), None);
    w.ok(t1);
    assert_eq!(
        w.wait_done(a),
        Some(Report {
            written: 2,
            ..Report::default()
        })
    );
    assert_eq!(w.wait_done(b), None, "3 still pending");
    w.at(50);
    let t2 = w.poll_one();
    w.ok(t2);
    assert_eq!(
        w.wait_done(b),
        Some(Report {
            written: 3,
            ..Report::default()
        })
    );
    // Items staged after a flush are not its business.
    w.stage_ok(1, [4]);
    let c = w.flush(2_000);
    w.stage_ok(1, [5]);
    let x = w.poll_one();
    assert_eq!(x.items, [4, 5]);
    w.finish(x, Outcome::Written { discarded: 1 });
    assert_eq!(
        w.wait_done(c),
        Some(Report {
            written: 1,
            ..Report::default()
        }),
        "only item 4 counts; 5 was discarded but staged after"
    );
}

#[test]
fn s_a4_flush_never_overtakes_earlier_items() {
    let mut w = World::new(Config::builder().linger(dur(1_000)));
    w.stage_ok(1, [1]);
    w.at(1_000);
    let a = w.poll_one();
    w.fail(a); // [1] backing off until 1050
    w.stage_ok(1, [2]);
    let f = w.flush(5_000);
    assert!(w.poll().is_empty(), "2 does not overtake the retry of 1");
    w.at(1_050);
    let a = w.poll_one();
    assert_eq!(a.items, [1]);
    w.ok(a);
    let b = w.poll_one();
    assert_eq!(b.items, [2], "released by the flush: no linger");
    w.ok(b);
    assert_eq!(w.wait_done(f).unwrap().written, 2);
    assert_eq!(w.written_of(1), [1, 2]);
}

#[test]
fn s_a4_flush_releases_only_what_was_staged_before_it() {
    let mut w = World::new(Config::builder().linger(dur(1_000)));
    w.stage_ok(1, [1]);
    let f = w.flush(5_000);
    w.stage_ok(2, [2]);
    let a = w.poll_one();
    assert_eq!(a.tenant, 1);
    w.ok(a);
    assert_eq!(w.wait_done(f).unwrap().written, 1);
    assert!(
        w.poll().is_empty(),
        "T2 staged after the flush keeps its linger"
    );
    assert_eq!(w.e.poll_timeout(), Some(ms(1_000)));
}

#[test]
fn s_a4_flush_deadline_answers_truthfully() {
    let mut w = World::new(Config::builder());
    w.stage_ok(1, [1, 2]);
    let hung = w.poll_one();
    let f = w.flush(300);
    w.at(299);
    assert_eq!(w.wait_done(f), None);
    w.at(300);
    assert_eq!(
        w.wait_done(f),
        Some(Report {
            pending: 2,
            deadline_passed: true,
            ..Report::default()
        })
    );
    w.ok(hung);
    assert_eq!(
        w.count_events(|e| matches!(e, Event::WaitDone { .. })),
        1,
        "answered once"
    );
    // Nothing pending: answered at once; deadline already past: at once.
    let g = w.flush(300);
    assert_eq!(w.wait_done(g), Some(Report::default()));
    w.stage_ok(1, [3]);
    let h = w.flush(300);
    assert_eq!(
        w.wait_done(h),
        Some(Report {
            pending: 1,
            deadline_passed: true,
            ..Report::default()
        })
    );
}

// ----- S-W9: shutdown ---------------------------------------------------

#[test]
fn s_w9_fence_releases_lingering_batches_and_refuses_late_stages() {
    let mut w = World::new(Config::builder().linger(dur(60_000)).max_batch(10));
    w.stage_ok(1, [1]);
    assert!(w.poll().is_empty());
    assert!(!w.e.is_shutting_down());
    let sd = w.shutdown(1_000);
    assert!(w.e.is_shutting_down() && !w.e.is_closed());
    assert_eq!(w.stage(1, 2), Staged::ShuttingDown);
    assert!(w.events.iter().any(|e| matches!(
        e,
        Event::Lost {
            tenant: 1,
            items: 1,
            reason: LostReason::Shutdown,
            ..
        }
    )));
    let a = w.poll_one();
    assert_eq!(a.items, [1], "sent at once, not after its linger");
    w.ok(a);
    assert_eq!(w.shutdown_done(sd).unwrap().written, 1);
    assert!(w.e.is_closed());
    assert_eq!(w.e.pending(), 0);
}

#[test]
fn s_w9_shutdown_with_nothing_pending_answers_at_once() {
    let mut w = World::new(Config::builder());
    let sd = w.shutdown(1_000);
    let r = w.shutdown_done(sd).expect("at once");
    assert!(r.first);
    assert_eq!(r.report(), Report::default());
    assert!(w.e.is_closed());
}

#[test]
fn s_w9_deadline_gives_up_everything_once_and_hands_it_back() {
    let mut w = World::new(Config::builder().concurrency(2).max_batch(2));
    w.stage_ok(1, [1, 2, 3]); // [1, 2] in flight (hung), 3 waiting
    w.stage_ok(2, [4]); // fails, backing off
    w.stage_ok(3, [5]); // no slot
    let ws = w.poll();
    let mut it = ws.into_iter();
    let hung = it.next().unwrap();
    w.fail(it.next().unwrap());
    assert_eq!(w.poll_one().tenant, 3);
    let sd = w.shutdown(40);
    let late = w.shutdown(500); // a concurrent caller
    w.at(39);
    assert_eq!(w.e.pending(), 5);
    w.at(40);
    assert_eq!(w.lost(LostReason::Deadline), 5);
    assert_eq!(w.e.pending(), 0);
    assert_eq!(w.e.pending_bytes(), 0);
    assert_eq!(w.count_events(|e| matches!(e, Event::CancelInFlight)), 1);
    assert!(
        w.shutdown_done(sd).is_none(),
        "waits for the cancelled writes"
    );
    let t3 = w.e.in_flight();
    assert_eq!(t3, 2);
    w.ok(hung); // committed just before the cancel: still counted lost,
                // but in the store, so not handed back as a dead letter (S-B6)
    assert_eq!(w.c().written, 0);
    assert!(w.shutdown_done(sd).is_none());
    // T3's task never gives its items back.
    let t3_id = WriteId(3);
    assert!(w.finish_lost(t3_id));
    assert_eq!(w.lost(LostReason::JoinFailed), 0, "already counted lost");
    let r = w.shutdown_done(sd).expect("answered");
    assert!(r.first);
    assert_eq!(
        r.report(),
        Report {
            lost: 5,
            deadline_passed: true,
            ..Report::default()
        }
    );
    assert_eq!(
        r.unwritten,
        [(1, vec![3]), (2, vec![4])],
        "by tenant, in staging order; T1's written slice and T3's lost task are not handed back"
    );
    let r2 = w.shutdown_done(late).expect("the other caller too");
    assert!(!r2.first);
    assert_eq!(r2.lost, 0, "exactly one caller reports the loss");
    assert!(r2.deadline_passed);
    assert!(r2.unwritten.is_empty());
    // After it: answered at once with zeros.
    let again = w.shutdown(10_000);
    let r3 = w.shutdown_done(again).unwrap();
    assert!(!r3.first && r3.report() == Report::default());
    assert_eq!(w.c().lost_total(), 5);
}

#[test]
fn s_w9_a_second_caller_with_an_earlier_deadline_tightens_it() {
    let mut w = World::new(Config::builder());
    w.stage_ok(1, [1]);
    let hung = w.poll_one();
    let sd = w.shutdown(10_000);
    let second = w.shutdown(100);
    assert_eq!(w.e.poll_timeout(), Some(ms(100)));
    let third = w.shutdown(5_000); // later: changes nothing
    assert_eq!(w.e.poll_timeout(), Some(ms(100)));
    w.at(100);
    assert_eq!(w.lost(LostReason::Deadline), 1);
    w.finish(hung, Outcome::Failed(Failure::Cancelled));
    let reports: Vec<_> = [sd, second, third]
        .iter()
        .map(|id| w.shutdown_done(*id).expect("every caller answered"))
        .map(|r| (r.first, r.lost))
        .collect();
    assert_eq!(reports, [(true, 1), (false, 0), (false, 0)]);
}

#[test]
fn s_w9_a_joining_shutdown_with_the_same_deadline_keeps_the_first_timer() {
    // S-W9, S-W17: the shutdown deadline armed first fires before a flush
    // deadline armed later for the same instant, so the flush's items are
    // answered as lost by the shutdown, not as still pending.
    let mut w = World::new(Config::builder());
    w.stage_ok(1, [1]);
    let a = w.poll_one();
    let sd = w.shutdown(100);
    let f = w.flush(100);
    let _joined = w.shutdown(100); // same deadline: nothing to tighten
    w.at(100);
    let r = w.wait_done(f).expect("answered at 100");
    assert_eq!((r.lost, r.pending), (1, 0), "the shutdown gave it up first");
    w.finish(a, Outcome::Failed(Failure::Cancelled));
    assert!(w.shutdown_done(sd).is_some());
}

#[test]
fn s_w9_deadline_already_past_gives_up_at_once() {
    let mut w = World::new(Config::builder());
    w.at(10);
    w.stage_ok(1, [1]);
    let sd = w.shutdown(10);
    assert_eq!(w.lost(LostReason::Deadline), 1);
    let r = w
        .shutdown_done(sd)
        .expect("nothing in flight: answered at once");
    assert!(r.deadline_passed);
    assert_eq!(r.unwritten, [(1, vec![1])]);
    assert!(w.poll().is_empty());
}

#[test]
fn s_w9_a_tenant_with_a_given_up_write_is_held_until_the_write_returns() {
    // S-W9: at the deadline the engine keeps the tenant of a write it gave
    // up (its items come back for the dead letters), and forgets it after.
    let mut w = World::new(Config::builder());
    w.stage_ok(1, [1]);
    let a = w.poll_one();
    let sd = w.shutdown(10);
    w.at(10);
    assert_eq!(w.e.pending(), 0);
    assert_eq!(w.e.tenants(), 1, "held while its write is out");
    assert!(w.shutdown_done(sd).is_none(), "waits for the dead letters");
    w.finish(a, Outcome::Failed(Failure::Cancelled));
    assert_eq!(w.e.tenants(), 0);
    let report = w
        .shutdown_done(sd)
        .expect("answered once the write is back");
    assert_eq!(report.unwritten, vec![(1, vec![1])]);
}

#[test]
fn no_cancel_is_asked_when_nothing_is_in_flight() {
    let mut w = World::new(Config::builder());
    w.stage_ok(1, [1]);
    let a = w.poll_one();
    w.fail(a);
    let sd = w.shutdown(10);
    w.at(10);
    assert!(w.shutdown_done(sd).is_some());
    assert_eq!(w.count_events(|e| matches!(e, Event::CancelInFlight)), 0);
    w.abandon();
    assert_eq!(w.count_events(|e| matches!(e, Event::CancelInFlight)), 0);
}

// ----- S-A7: abandon ----------------------------------------------------

#[test]
fn s_a7_abandon_answers_waits_and_refuses_later_stages() {
    let mut w = World::new(Config::builder());
    w.stage_ok(1, [1, 2]);
    let a = w.poll_one();
    let f = w.flush(10_000);
    let held = w.abandon();
    assert!(held.is_empty(), "the in-flight slice is not held");
    assert_eq!(w.lost(LostReason::Abandoned), 2);
    assert_eq!(
        w.wait_done(f),
        Some(Report {
            lost: 2,
            ..Report::default()
        })
    );
    assert_eq!(w.stage(1, 3), Staged::ShuttingDown);
    assert_eq!(w.lost(LostReason::Shutdown), 1);
    assert!(w.abandon().is_empty(), "a second abandon changes nothing");
    assert_eq!(w.lost(LostReason::Abandoned), 2);
    assert!(w.finish_lost(a.id));
    assert_eq!(w.lost(LostReason::JoinFailed), 0);
    assert_eq!(w.e.in_flight(), 0);
}

#[test]
fn s_a7_abandon_during_shutdown_reports_through_the_shutdown() {
    let mut w = World::new(Config::builder());
    w.stage_ok(1, [1]);
    w.stage_ok(2, [2]);
    let ws = w.poll();
    let mut it = ws.into_iter();
    let a = it.next().unwrap();
    w.fail(it.next().unwrap()); // T2 backing off
    let sd = w.shutdown(10_000);
    let held = w.abandon();
    assert!(held.is_empty(), "the shutdown's report hands them back");
    w.finish(a, Outcome::Failed(Failure::Cancelled));
    let r = w.shutdown_done(sd).expect("answered");
    assert_eq!(r.lost, 2);
    assert_eq!(r.unwritten, [(1, vec![1]), (2, vec![2])]);
    assert_eq!(w.lost(LostReason::Abandoned), 2);
    assert_eq!(w.lost(LostReason::Deadline), 0);
}

// ----- S-B6: typed reports and the dead-letter hand-off -----------------

/// A write the shutdown deadline gave up,
/// whose sink then answered `Written` (it committed before the cancellation
/// reached it), was handed back as a dead letter, so a service re-storing
/// dead letters would bill it twice. It stays counted lost (given up at the
/// deadline; counters never decrease) but is not handed back (S-B6).
#[test]
fn s_b6_a_given_up_write_that_came_back_written_is_not_a_dead_letter() {
    let mut e: Engine<u32, u32> = Engine::new(Config::default()).unwrap();
    let _ = e.stage(Time::ZERO, 1, 7);
    let w = e.poll_write(Time::ZERO).unwrap();
    let sd = e.shutdown(Time::ZERO, Time::from_millis(100));
    e.handle_timeout(Time::from_millis(100)); // the deadline: given up
                                              // The sink had committed; its answer arrives just after.
    e.finish(Time::from_millis(101), w, Outcome::WRITTEN)
        .unwrap();
    let mut report = None;
    while let Some(ev) = e.poll_event() {
        if let Event::ShutdownDone { id, report: r } = ev {
            assert_eq!(id, sd);
            report = Some(r);
        }
    }
    let r = report.expect("answered once the write came back");
    assert!(
        r.unwritten.is_empty(),
        "the sink said it wrote item 7, yet it is handed back: {:?} (lost {})",
        r.unwritten,
        r.lost
    );
}

// ----- S-W17: timers never fire in bursts -------------------------------

#[test]
fn s_w17_no_timer_bursts_after_a_stall() {
    let mut w = World::new(Config::builder().linger(dur(20)).concurrency(16));
    for t in 1..=3 {
        w.stage_ok(t, [t]);
    }
    w.at(20);
    for x in w.poll() {
        w.fail(x); // three backoffs due at 70
    }
    w.stage_ok(4, [4]);
    w.stage_ok(5, [5]); // two lingers due at 40
    w.at(10_000); // the driver stalled
    let ws = w.poll();
    let mut tenants: Vec<_> = ws.iter().map(|x| x.tenant).collect();
    tenants.sort_unstable();
    assert_eq!(tenants, [1, 2, 3, 4, 5], "each due timer handled once");
    assert_eq!(w.c().attempts, 8);
    w.at(10_000);
    assert!(w.poll().is_empty(), "nothing fires twice");
    assert_eq!(w.e.poll_timeout(), None);
}

#[test]
fn s_w17_a_driver_that_only_wakes_at_poll_timeout_writes_everything() {
    let mut w = World::new(
        Config::builder()
            .linger(dur(20))
            .max_batch(3)
            .concurrency(2),
    );
    let mut item = 0;
    let mut in_flight = Vec::new();
    for round in 0..40u32 {
        // Stage a little, fail every third write, wake only when told.
        for _ in 0..(round % 4) {
            item += 1;
            w.stage_ok(round % 5, [item]);
        }
        in_flight.extend(w.poll());
        if let Some(x) = in_flight.pop() {
            if x.attempt == 1 && x.items[0] % 3 == 0 {
                w.fail(x);
            } else {
                w.ok(x);
            }
        } else if let Some(t) = w.e.poll_timeout() {
            w.at_time(t);
        }
    }
    for _ in 0..1_000 {
        in_flight.extend(w.poll());
        if let Some(x) = in_flight.pop() {
            w.ok(x);
        } else if let Some(t) = w.e.poll_timeout() {
            w.at_time(t);
        } else {
            break;
        }
    }
    assert_eq!(w.e.pending(), 0, "I6: nothing stuck without a timer");
    assert_eq!(w.c().written, u64::from(item));
    for (t, items) in &w.written {
        let mut sorted = items.clone();
        sorted.sort_unstable();
        assert_eq!(&sorted, items, "tenant {t} in staging order");
    }
}

#[test]
fn s_w17_poll_timeout_is_the_earliest_timer_of_either_kind() {
    // A linger before a backoff.
    let mut w = World::new(Config::builder().linger(dur(20)));
    w.stage_ok(1, [1]);
    w.at(20);
    let a = w.poll_one();
    w.fail(a); // backoff due at 70
    w.at(30);
    w.stage_ok(2, [2]); // linger due at 50
    assert_eq!(w.e.poll_timeout(), Some(ms(50)));
    w.at(50);
    assert_eq!(w.poll_one().tenant, 2);
    assert_eq!(w.e.poll_timeout(), Some(ms(70)));
    // A backoff before a linger.
    w.at(65);
    w.stage_ok(3, [3]); // linger due at 85
    assert_eq!(w.e.poll_timeout(), Some(ms(70)));
}

#[test]
fn s_w17_after_a_stall_timers_fire_in_the_order_they_fell_due() {
    for (linger, backoff, first) in [(20, 50, 2), (80, 50, 1)] {
        let mut w = World::new(
            Config::builder()
                .concurrency(1)
                .linger(dur(linger))
                .initial_backoff(dur(backoff))
                .max_backoff(dur(backoff)),
        );
        w.stage_ok(1, [1]);
        w.at(linger);
        let a = w.poll_one();
        w.fail(a); // T1 due at linger + backoff
        w.stage_ok(2, [2]); // T2 due at 2 * linger
        w.at(10_000);
        let x = w.poll_one();
        assert_eq!(x.tenant, first, "linger {linger}, backoff {backoff}");
        w.ok(x);
        assert_eq!(w.poll_one().tenant, 3 - first);
    }
}

/// The shutdown's deadline is the earliest any call gave, and outlives the
/// answer (the driver bounds its wait for a journal's last marks by it,
/// S-W15).
#[test]
fn s_w9_the_shutdown_deadline_is_the_earliest_given_and_outlives_the_answer() {
    let mut e: Engine<u32, u32> = Engine::new(Config::default()).unwrap();
    assert_eq!(e.shutdown_deadline(), None);
    let _ = e.shutdown(Time::ZERO, Time::from_millis(500));
    assert_eq!(e.shutdown_deadline(), Some(Time::from_millis(500)));
    let _ = e.shutdown(Time::from_millis(1), Time::from_millis(900));
    assert_eq!(
        e.shutdown_deadline(),
        Some(Time::from_millis(500)),
        "a later one does not loosen it"
    );
    let _ = e.shutdown(Time::from_millis(2), Time::from_millis(200));
    assert_eq!(e.shutdown_deadline(), Some(Time::from_millis(200)));
    // Nothing pending: the shutdown is answered at once.
    let answered = std::iter::from_fn(|| e.poll_event())
        .filter(|ev| matches!(ev, Event::ShutdownDone { .. }))
        .count();
    assert_eq!(answered, 3);
    assert_eq!(e.shutdown_deadline(), Some(Time::from_millis(200)));
}
