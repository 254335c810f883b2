//! The core's rules for running through an outage (S-R1, S-R2, S-R3), on
//! the engine alone with a hand-driven clock: the sink-wide breaker and
//! the item age limit.

mod core_world;

use core_world::{dur, ms, World};
use outbox::core::{BreakerConfig, BreakerState, Config, Event, Failure, LostReason, Outcome};

fn breaker(failures: u32) -> BreakerConfig {
    BreakerConfig::new()
        .failures(failures)
        .probe_interval(dur(100))
        .max_probe_interval(dur(400))
}

// ----- S-R1, S-R2: the breaker --------------------------------------------

#[test]
fn s_r1_a_run_of_failures_across_tenants_stops_every_new_attempt() {
    let mut w = World::new(Config::builder().concurrency(8).breaker(breaker(3)));
    for t in 1..=5 {
        w.stage_ok(t, [t]);
    }
    let ws = w.poll();
    assert_eq!(ws.len(), 5);
    let mut ws = ws.into_iter();
    for x in ws.by_ref().take(3) {
        w.fail(x);
    }
    assert_eq!(
        w.e.breaker(),
        BreakerState::Open {
            next_probe: ms(100)
        }
    );
    // The two still in flight fail too: nothing changes, nothing starts.
    for x in ws {
        w.fail(x);
    }
    w.at(99);
    assert!(w.poll().is_empty(), "open: no attempt before the probe");
    assert_eq!(w.e.poll_timeout(), Some(ms(100)), "the probe is a timeout");
    w.at(100);
    let probe = w.poll_one();
    assert_eq!(probe.tenant, 1, "the first tenant ready goes first (S-B1)");
    assert_eq!(w.e.breaker(), BreakerState::Probing { probe: probe.id });
    assert!(w.poll().is_empty(), "one probe at a time");
    w.ok(probe);
    assert_eq!(w.e.breaker(), BreakerState::Closed);
    let order: Vec<u32> = w.poll().iter().map(|x| x.tenant).collect();
    assert_eq!(order, [2, 3, 4, 5], "tenants keep their order");
}

#[test]
fn s_r2_failed_probes_back_off_to_the_cap() {
    let mut w = World::new(Config::builder().concurrency(1).breaker(breaker(1)));
    w.stage_ok(1, [1]);
    let a = w.poll_one();
    w.fail(a); // opens at 0: probe at 100; the tenant's backoff ends at 50
    let mut at = 0;
    for gap in [100, 200, 400, 400] {
        at += gap;
        w.at(at - 1);
        assert!(w.poll().is_empty());
        w.at(at);
        let p = w.poll_one();
        w.fail(p);
    }
    assert_eq!(w.e.consecutive_failures(), 1, "frozen while open");
    assert_eq!(
        w.e.breaker(),
        BreakerState::Open {
            next_probe: ms(at + 400)
        }
    );
    // 5 attempts in 1.1 s where the tenant's own backoff would allow more.
    assert_eq!(w.c().attempts, 5);
}

#[test]
fn s_r2_no_probe_timeout_without_a_tenant_ready() {
    let mut w = World::new(
        Config::builder()
            .breaker(breaker(1))
            .initial_backoff(dur(1_000))
            .max_backoff(dur(1_000)),
    );
    w.stage_ok(1, [1]);
    let a = w.poll_one();
    w.fail(a);
    // The tenant backs off until 1,000; the probe is not armed before.
    assert_eq!(w.e.poll_timeout(), Some(ms(1_000)));
    w.at(1_000);
    let p = w.poll_one();
    w.finish(p, Outcome::Failed(Failure::Rejected));
    assert_eq!(w.e.breaker(), BreakerState::Closed, "the sink answered");
}

#[test]
fn s_r2_the_probe_is_armed_while_a_group_of_several_slices_holds_one_slot() {
    // S-F1: a group holds one concurrency slot whatever its slices. Found
    // by the model test once it drew the breaker: with a group of two
    // slices in flight and one of two slots free, the next probe was left
    // out of `poll_timeout` (slices counted as slots), so a driver slept
    // past it until the group came back (I11).
    let mut w = World::new(
        Config::builder()
            .concurrency(2)
            .max_slices_per_write(2)
            .breaker(breaker(2)),
    );
    for t in 1..=4 {
        w.stage_ok(t, [t]);
    }
    let a = w.e.poll_group(w.now).expect("tenants 1 and 2");
    let b = w.e.poll_group(w.now).expect("tenants 3 and 4");
    assert_eq!((a.len(), b.len(), w.e.groups_in_flight()), (2, 2, 2));
    for x in b {
        w.fail(x);
    }
    assert_eq!(
        w.e.breaker(),
        BreakerState::Open {
            next_probe: ms(100)
        }
    );
    // Tenants 3 and 4 are ready again at 50 (their backoff); group `a`
    // still holds one slot of two.
    w.at(50);
    assert_eq!(w.e.groups_in_flight(), 1);
    assert_eq!(w.e.poll_timeout(), Some(ms(100)), "the probe is armed");
    w.at(100);
    let probe = w.e.poll_group(w.now).expect("the probe");
    assert_eq!(probe.len(), 1, "a probe goes alone");
    assert_eq!(w.e.breaker(), BreakerState::Probing { probe: probe[0].id });
    drop(a);
}

#[test]
fn s_r2_a_late_success_of_an_older_write_closes() {
    let mut w = World::new(Config::builder().breaker(breaker(2)));
    for t in 1..=3 {
        w.stage_ok(t, [t]);
    }
    let mut ws = w.poll().into_iter();
    w.fail(ws.next().unwrap());
    w.fail(ws.next().unwrap());
    assert!(matches!(w.e.breaker(), BreakerState::Open { .. }));
    w.ok(ws.next().unwrap());
    assert_eq!(w.e.breaker(), BreakerState::Closed);
}

#[test]
fn s_r1_flush_and_shutdown_deadlines_hold_while_open() {
    let mut w = World::new(Config::builder().breaker(breaker(1)));
    w.stage_ok(1, [1]);
    let a = w.poll_one();
    w.fail(a);
    let f = w.flush(30);
    w.at(30);
    let r = w.wait_done(f).expect("answered at its deadline");
    assert!(r.deadline_passed);
    assert_eq!(r.pending, 1);
    let s = w.shutdown(60);
    w.at(60);
    let r = w.shutdown_done(s).expect("answered at its deadline");
    assert_eq!(r.unwritten, vec![(1, vec![1])]);
    assert_eq!(w.lost(LostReason::Deadline), 1);
}

// ----- S-R3: max_item_age -------------------------------------------------

#[test]
fn s_r3_items_older_than_the_limit_are_lost_as_expired_not_written() {
    let mut w = World::new(Config::builder().concurrency(1).max_item_age(dur(100)));
    w.stage_ok(2, [20]);
    let busy = w.poll_one(); // holds the only slot
    w.stage_ok(1, [1, 2]);
    w.at(60);
    w.stage_ok(1, [3]);
    w.at(100);
    w.ok(busy);
    // At 100 items 1, 2 are exactly 100 ms old: still written.
    let x = w.poll_one();
    assert_eq!(x.items, [1, 2, 3]);
    w.fail(x); // retry at 150: item 1 is then 150 ms old
    w.stage_ok(1, [4]);
    w.at(150);
    let y = w.poll_one();
    assert_eq!(y.items, [4], "the expired retry went whole (S-W5)");
    assert_eq!(w.lost(LostReason::Expired), 3);
    assert!(w.events.iter().any(|e| matches!(
        e,
        Event::Lost {
            tenant: 1,
            items: 3,
            reason: LostReason::Expired,
            ..
        }
    )));
    w.ok(y);
    assert_eq!(w.e.pending(), 0);
    assert_eq!(w.written_of(1), [4]);
}

#[test]
fn s_r3_a_backlog_loses_only_its_expired_front() {
    let mut w = World::new(Config::builder().concurrency(1).max_item_age(dur(100)));
    w.stage_ok(9, [90]);
    let busy = w.poll_one();
    w.stage_ok(1, [1]);
    w.at(50);
    w.stage_ok(1, [2]);
    w.at(120);
    w.ok(busy);
    let x = w.poll_one();
    assert_eq!(x.items, [2]);
    assert_eq!(w.lost(LostReason::Expired), 1);
    w.ok(x);
    assert_eq!(w.e.tenants(), 0, "nothing held");
}

#[test]
fn s_r3_a_wholly_expired_tenant_makes_way_for_the_next() {
    let mut w = World::new(Config::builder().concurrency(1).max_item_age(dur(10)));
    w.stage_ok(9, [90]);
    let busy = w.poll_one();
    w.stage_ok(1, [1]);
    w.at(20);
    w.stage_ok(2, [2]);
    w.ok(busy);
    let x = w.poll_one();
    assert_eq!((x.tenant, x.items.clone()), (2, vec![2]));
    assert_eq!(w.lost(LostReason::Expired), 1);
}

#[test]
fn s_r3_the_age_timer_gives_items_up_while_the_breaker_is_open() {
    // The probe is 10 s away; the items' age deadlines come first, and
    // `pending` tells the truth at each.
    let config = Config::builder()
        .concurrency(4)
        .max_item_age(dur(100))
        .breaker(
            BreakerConfig::new()
                .failures(1)
                .probe_interval(dur(10_000))
                .max_probe_interval(dur(10_000)),
        );
    let mut w = World::new(config);
    w.stage_ok(1, [1]);
    let x = w.poll_one();
    w.fail(x); // open: the retry slice waits for the probe at 10 s
    w.at(10);
    w.stage_ok(2, [2, 3]);
    assert!(w.poll().is_empty(), "open: nothing starts");
    assert_eq!(w.e.poll_timeout(), Some(ms(50)), "tenant 1's backoff");
    w.at(50);
    assert!(w.poll().is_empty(), "ready, but open");
    // Expired means older than the limit: due just past 100 ms.
    let due = outbox::core::Time::from_nanos(100_000_001);
    assert_eq!(w.e.poll_timeout(), Some(due));
    w.at_time(due);
    assert_eq!(w.lost(LostReason::Expired), 1, "tenant 1's retry slice");
    assert_eq!(w.e.pending(), 2);
    w.at(111);
    assert_eq!(w.lost(LostReason::Expired), 3);
    assert_eq!(w.e.pending(), 0);
    assert!(w.c().balanced(), "{:?}", w.c());
    // The emptied tenants are still in the ready queue (taken out only
    // from its front): the probe's turn finds nothing to start and
    // forgets them.
    assert_eq!(w.e.poll_timeout(), Some(ms(10_000)));
    w.at(10_000);
    assert!(w.poll().is_empty());
    assert_eq!(w.e.tenants(), 0, "nothing held");
    assert_eq!(w.e.poll_timeout(), None, "no timer left");
}

#[test]
fn s_r3_the_age_timer_leaves_a_write_in_flight_to_its_end() {
    let mut w = World::new(Config::builder().concurrency(1).max_item_age(dur(100)));
    w.stage_ok(1, [1]);
    let x = w.poll_one();
    w.at(50);
    w.stage_ok(1, [2]);
    w.at(200);
    // Item 2 waits behind the write past its age: a tenant's items settle
    // in staging order, so both are decided when the write ends.
    assert_eq!(w.lost(LostReason::Expired), 0);
    assert_eq!(w.e.pending(), 2);
    w.ok(x);
    assert_eq!(w.written_of(1), [1]);
    assert!(w.poll().is_empty(), "item 2 is not written");
    assert_eq!(w.lost(LostReason::Expired), 1);
    assert_eq!(w.e.pending(), 0);
    assert_eq!(w.e.tenants(), 0);
}

#[test]
fn s_r3_a_ready_tenant_emptied_by_its_age_timer_starts_nothing() {
    let mut w = World::new(Config::builder().concurrency(1).max_item_age(dur(100)));
    w.stage_ok(9, [90]);
    let busy = w.poll_one(); // holds the only slot: tenant 1 is ready, waiting
    w.stage_ok(1, [1]);
    w.at(150);
    assert_eq!(w.lost(LostReason::Expired), 1);
    w.ok(busy);
    assert!(w.poll().is_empty(), "the emptied tenant starts no write");
    assert_eq!(w.e.tenants(), 0);
}

#[test]
fn s_r3_a_retry_due_exactly_at_the_age_limit_is_written() {
    // Expired means staged before `now - max_item_age`: a retry that comes
    // due when its oldest item is exactly the limit old still goes.
    let mut w = World::new(
        Config::builder()
            .initial_backoff(dur(100))
            .jitter(0.0)
            .max_item_age(dur(100)),
    );
    w.stage_ok(1, [1]);
    let a = w.poll_one();
    w.fail(a);
    w.at(100);
    let retry = w.poll_one();
    assert_eq!((retry.items.as_slice(), retry.attempt), (&[1][..], 2));
    w.ok(retry);
    assert_eq!(w.lost(LostReason::Expired), 0);
}
