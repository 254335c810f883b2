//! The core's rules of the contract's "Beyond the basics" section (S-B1,
//! S-B2, S-B8), on the engine alone with a hand-driven clock. Each test
//! cites its rule and checks both sides of the rule's conditions and its
//! boundaries.

mod core_world;

use core_world::{dur, World};
use outbox::core::{Config, DropReason, Engine, Event, LostReason, Staged, Time};

// ----- S-B1: fairness (I9) ----------------------------------------------

#[test]
fn s_b1_ready_tenants_are_served_in_the_order_they_became_ready() {
    let mut w = World::new(Config::builder().concurrency(1));
    w.stage_ok(1, [1]);
    let a = w.poll_one();
    for t in [3, 2, 4] {
        w.stage_ok(t, [t * 10]);
    }
    w.ok(a);
    w.stage_ok(1, [2]); // T1 ready again: behind 3, 2, 4
    let mut order = Vec::new();
    while let Some(x) = w.poll().pop() {
        order.push(x.tenant);
        w.stage_ok(x.tenant, [x.tenant * 100]); // keeps staging while served
        w.ok(x);
        if order.len() == 8 {
            break;
        }
    }
    assert_eq!(order, [3, 2, 4, 1, 3, 2, 4, 1], "no tenant starves");
}

#[test]
fn s_b1_backoffs_due_together_join_in_arming_order() {
    let mut w = World::new(Config::builder().concurrency(1));
    for t in [5, 6, 7] {
        w.stage_ok(t, [t]);
    }
    let a = w.poll_one();
    w.fail(a); // T5 due at 50
    let b = w.poll_one();
    w.fail(b); // T6 due at 50
    let c = w.poll_one();
    assert_eq!(c.tenant, 7);
    w.at(60);
    w.stage_ok(1, [1]); // ready after the backoffs fired
    w.ok(c);
    let mut order = Vec::new();
    while let Some(x) = w.poll().pop() {
        order.push(x.tenant);
        w.ok(x);
    }
    assert_eq!(order, [5, 6, 1]);
}

// ----- S-B2: retry limits and jitter ------------------------------------

#[test]
fn s_b2_max_attempts_boundary() {
    let mut w = World::new(Config::builder().max_attempts(1));
    w.stage_ok(1, [1]);
    let a = w.poll_one();
    w.fail(a);
    assert_eq!(w.lost(LostReason::RetriesExhausted), 1, "one attempt only");

    let mut w = World::new(Config::builder().max_attempts(2));
    w.stage_ok(1, [1]);
    let a = w.poll_one();
    w.fail(a);
    assert_eq!(w.lost(LostReason::RetriesExhausted), 0);
    w.at(50);
    let a = w.poll_one();
    assert_eq!(a.attempt, 2);
    w.fail(a);
    assert_eq!(w.lost(LostReason::RetriesExhausted), 1);
}

#[test]
fn s_b2_max_retry_duration_boundary() {
    for (fail_at, lost) in [(99, 0), (100, 1)] {
        let mut w = World::new(Config::builder().max_retry_duration(dur(100)));
        w.stage_ok(1, [1]);
        let a = w.poll_one(); // first attempt at 0
        w.fail(a);
        w.at(50);
        let a = w.poll_one();
        w.at(fail_at);
        w.fail(a);
        assert_eq!(
            w.lost(LostReason::RetriesExhausted),
            lost,
            "failed at {fail_at}"
        );
        assert_eq!(w.e.pending(), 1 - lost);
    }
}

#[test]
fn s_b2_retry_limit_counts_from_the_first_attempt_not_the_staging() {
    let mut w = World::new(
        Config::builder()
            .max_retry_duration(dur(100))
            .concurrency(1),
    );
    w.stage_ok(2, [9]);
    let hung = w.poll_one();
    w.stage_ok(1, [1]); // staged at 0, starts at 500
    w.at(500);
    w.ok(hung);
    let a = w.poll_one();
    w.at(550);
    w.fail(a);
    assert_eq!(w.lost(LostReason::RetriesExhausted), 0);
}

// ----- S-B8: bounded memory ---------------------------------------------

/// Every event queued, in order: (tenant, items, reason, log) for drops and
/// losses, drained from `e`.
fn refusal_events(e: &mut Engine<u8, u32>) -> Vec<(u8, u64, &'static str, bool)> {
    std::iter::from_fn(|| e.poll_event())
        .filter_map(|ev| match ev {
            Event::Dropped {
                tenant,
                items,
                reason,
                log,
            } => Some((tenant, items, reason.as_str(), log)),
            Event::Lost {
                tenant,
                items,
                reason,
                log,
            } => Some((tenant, items, reason.as_str(), log)),
            _ => None,
        })
        .collect()
}

#[test]
fn s_b8_refusals_coalesce_per_reason_while_their_event_is_queued() {
    let config = Config::builder()
        .capacity(2)
        .tenant_capacity(1)
        .build()
        .unwrap();
    let mut e: Engine<u8, u32> = Engine::new(config).unwrap();
    // As the driver stages (S-W21), with its wake-up hint.
    let mut stager = outbox::core::Stager::new(&e);
    let mut stage = |e: &mut Engine<u8, u32>, t: u8, i: u32| {
        let s = stager.stage(e, Time::ZERO, t, i);
        (s.staged, s.wake)
    };
    assert_eq!(stage(&mut e, 1, 0), (Staged::Accepted, true));
    // The first refusal queues an event with none before it: drain.
    assert_eq!(
        stage(&mut e, 1, 1),
        (Staged::Dropped(DropReason::TenantFull), true)
    );
    assert_eq!(stage(&mut e, 2, 2), (Staged::Accepted, false), "1 is ready");
    for (t, i) in [(3, 3), (1, 4), (4, 5), (5, 6)] {
        assert_eq!(
            stage(&mut e, t, i),
            (Staged::Dropped(DropReason::BufferFull), false),
            "a drain is already due"
        );
    }
    assert_eq!(
        refusal_events(&mut e),
        [(1, 1, "tenant_full", true), (3, 4, "buffer_full", true)],
        "one event per reason, the first tenant's, counting every refusal"
    );
    assert_eq!(e.take_released(), [1, 3, 4, 5, 6]);
    // Once polled, a refusal queues a new event.
    let _ = stage(&mut e, 6, 7);
    assert_eq!(refusal_events(&mut e), [(6, 1, "buffer_full", false)]);
    // After the fence: lost under `shutdown`, coalesced the same way.
    let _ = e.shutdown(Time::ZERO, Time::from_millis(10));
    while e.poll_event().is_some() {}
    for i in 8..11 {
        assert_eq!(stage(&mut e, 7, i).0, Staged::ShuttingDown);
    }
    assert_eq!(refusal_events(&mut e), [(7, 3, "shutdown", true)]);
    let c = e.counters();
    assert_eq!(
        (
            c.dropped(DropReason::TenantFull),
            c.dropped(DropReason::BufferFull),
            c.lost(LostReason::Shutdown)
        ),
        (1, 5, 3)
    );
}

#[test]
fn s_b8_coalesced_refusals_keep_the_log_rate_of_s_a6() {
    // 1,000 refusals span two log points, the last item being the second:
    // two events, (1..=999) and (1,000).
    let config = Config::builder().capacity(1).build().unwrap();
    let mut e: Engine<u8, u32> = Engine::new(config.clone()).unwrap();
    for i in 0..=1_000 {
        let _ = e.stage(Time::ZERO, 1, i);
    }
    assert_eq!(
        refusal_events(&mut e),
        [(1, 999, "buffer_full", true), (1, 1, "buffer_full", true)]
    );
    // 2,500 refusals queued as one event come out one log point at a time
    // (the 1st, the 1,000th, the 2,000th), however many pile up meanwhile.
    let mut e: Engine<u8, u32> = Engine::new(config).unwrap();
    for i in 0..=2_500 {
        let _ = e.stage(Time::ZERO, 1, i);
    }
    let first = e.poll_event();
    assert_eq!(
        first,
        Some(Event::Dropped {
            tenant: 1,
            items: 999,
            reason: DropReason::BufferFull,
            log: true
        })
    );
    // More refusals join the rest of the queued event.
    for i in 0..600 {
        let _ = e.stage(Time::ZERO, 2, i);
    }
    assert_eq!(
        refusal_events(&mut e),
        [
            (1, 1_000, "buffer_full", true),
            (1, 1_000, "buffer_full", true),
            (1, 101, "buffer_full", true)
        ],
        "items 1,000..=1,999, 2,000..=2,999, 3,000..=3,100"
    );
    // A queued event with no log point logs nothing.
    for i in 0..5 {
        let _ = e.stage(Time::ZERO, 3, i);
    }
    assert_eq!(refusal_events(&mut e), [(3, 5, "buffer_full", false)]);
    assert_eq!(e.counters().dropped(DropReason::BufferFull), 3_105);

    // Refusals past the shutdown fence are lost, not dropped: their
    // coalesced event is cut at the log points the same way.
    let mut e: Engine<u8, u32> = Engine::new(Config::default()).unwrap();
    let _ = e.shutdown(Time::ZERO, Time::ZERO);
    while e.poll_event().is_some() {}
    for i in 0..=1_000 {
        let _ = e.stage(Time::ZERO, 1, i);
    }
    assert_eq!(
        refusal_events(&mut e),
        [(1, 999, "shutdown", true), (1, 2, "shutdown", true)]
    );
}
