//! The core's rules of the contract's "Staging" section (S-A1, S-B7, S-B5),
//! and the wake-up hint a lazy stage gives the driver (I6), on the engine
//! alone with a hand-driven clock. Each test cites its rule
//! and checks both sides of the rule's conditions and its boundaries.

mod core_world;

use std::cell::Cell;

use core_world::{dur, ms, World};
use outbox::core::{Config, DropReason, Engine, Event, Failure, Outcome, Staged, Time};

// ----- S-A1: bounded mode drops instead of blocking ---------------------

#[test]
fn s_a1_capacity_boundary() {
    let mut w = World::new(Config::builder().capacity(3));
    w.stage_ok(1, [1, 2, 3]);
    assert_eq!(w.stage(2, 4), Staged::Dropped(DropReason::BufferFull));
    let a = w.poll_one();
    w.ok(a);
    assert_eq!(w.stage(2, 5), Staged::Accepted);
    assert_eq!(w.dropped(DropReason::BufferFull), 1);
    assert!(w.events.iter().any(|e| matches!(
        e,
        Event::Dropped {
            tenant: 2,
            items: 1,
            reason: DropReason::BufferFull,
            log: true
        }
    )));
}

// ----- S-B7: per-tenant quota -------------------------------------------

#[test]
fn s_b7_tenant_capacity_counts_waiting_in_flight_and_retry() {
    let mut w = World::new(Config::builder().tenant_capacity(2));
    w.stage_ok(1, [1, 2]);
    assert_eq!(w.stage(1, 3), Staged::Dropped(DropReason::TenantFull));
    assert_eq!(w.stage(2, 4), Staged::Accepted, "another tenant's quota");
    let ws = w.poll();
    assert_eq!(
        w.stage(1, 5),
        Staged::Dropped(DropReason::TenantFull),
        "in flight"
    );
    let mut ws = ws.into_iter();
    let a = ws.next().unwrap();
    w.fail(a);
    assert_eq!(
        w.stage(1, 6),
        Staged::Dropped(DropReason::TenantFull),
        "retry"
    );
    w.at(50);
    let a = w.poll_one();
    w.ok(a);
    assert_eq!(w.stage(1, 7), Staged::Accepted);
    assert_eq!(w.dropped(DropReason::TenantFull), 3);
    assert_eq!(w.dropped(DropReason::BufferFull), 0);
}

#[test]
fn s_b7_global_capacity_is_checked_first() {
    let mut w = World::new(Config::builder().capacity(2).tenant_capacity(2));
    w.stage_ok(1, [1, 2]);
    assert_eq!(w.stage(1, 3), Staged::Dropped(DropReason::BufferFull));
}

// ----- S-B5: size limits ------------------------------------------------

#[test]
fn s_b5_max_batch_bytes_cuts_and_an_oversized_item_goes_alone() {
    let mut w = World::weighed(Config::builder().max_batch_bytes(10));
    w.stage_ok(1, [4, 6, 4, 25, 3, 3, 5]);
    let mut batches = Vec::new();
    while let Some(x) = w.poll().pop() {
        batches.push(x.items.clone());
        w.ok(x);
    }
    assert_eq!(
        batches,
        [vec![4, 6], vec![4], vec![25], vec![3, 3], vec![5]],
        "10 bytes fit exactly; 25 alone; never an empty write"
    );
    assert_eq!(w.e.pending_bytes(), 0);
    assert_eq!(w.written_of(1), [4, 6, 4, 25, 3, 3, 5]);
}

#[test]
fn s_b5_oversized_item_first_and_max_batch_both_bind() {
    let mut w = World::weighed(Config::builder().max_batch_bytes(10).max_batch(2));
    w.stage_ok(1, [11, 1, 1, 1]);
    let mut batches = Vec::new();
    while let Some(x) = w.poll().pop() {
        batches.push(x.items.clone());
        w.ok(x);
    }
    assert_eq!(batches, [vec![11], vec![1, 1], vec![1]]);
}

#[test]
fn s_b5_capacity_bytes() {
    let mut w = World::weighed(Config::builder().capacity_bytes(20));
    w.stage_ok(1, [10, 10]); // exactly 20: accepted
    assert_eq!(w.e.pending_bytes(), 20);
    assert_eq!(w.stage(2, 1), Staged::Dropped(DropReason::BufferFull));
    // S-B8: an item weighs at least 1 byte, so `capacity_bytes` bounds the
    // count too: a weightless item does not slip past a full buffer.
    assert_eq!(
        w.stage(2, 0),
        Staged::Dropped(DropReason::BufferFull),
        "a weightless item weighs 1 byte"
    );
    let a = w.poll();
    assert_eq!(w.e.pending_bytes(), 20, "in flight still counts");
    for x in a {
        w.ok(x);
    }
    assert_eq!(w.e.pending_bytes(), 0);
    assert_eq!(w.stage(2, 20), Staged::Accepted);
    assert_eq!(w.dropped(DropReason::BufferFull), 2);
}

#[test]
fn s_b5_pending_bytes_follow_retries_drops_and_losses() {
    let mut w = World::weighed(Config::builder().max_attempts(2).max_batch_bytes(5));
    w.stage_ok(1, [3, 2, 4]);
    let a = w.poll_one();
    assert_eq!(a.items, [3, 2]);
    w.fail(a);
    assert_eq!(w.e.pending_bytes(), 9);
    w.at(50);
    let a = w.poll_one();
    w.fail(a); // exhausted
    assert_eq!(w.e.pending_bytes(), 4);
    let b = w.poll_one();
    w.finish(b, Outcome::Failed(Failure::Rejected));
    assert_eq!(w.e.pending_bytes(), 0);
}

#[test]
fn s_b5_byte_limits_need_a_weigher() {
    let c = Config::builder().max_batch_bytes(1).build().unwrap();
    assert!(Engine::<u32, u32>::new(c).is_err());
    let c = Config::builder().capacity_bytes(1).build().unwrap();
    assert!(Engine::<u32, u32>::new(c).is_err());
}

#[test]
fn s_b5_a_huge_weight_neither_overflows_nor_panics() {
    // S-B5: weights are clamped to MAX_WEIGHT and byte sums saturate.
    let mut w = World::with_engine(
        outbox::core::Engine::with_weigher(
            Config::builder().max_batch_bytes(10).build().unwrap(),
            |_: &u32| u64::MAX,
        )
        .unwrap(),
    );
    w.stage_ok(1, [1, 2, 3]);
    assert_eq!(w.e.pending_bytes(), 3 * outbox::core::MAX_WEIGHT);
    let a = w.poll_one();
    assert_eq!(a.items, [1], "heavier than a batch: alone");
    w.ok(a);
    assert_eq!(w.e.pending_bytes(), 2 * outbox::core::MAX_WEIGHT);
}

#[test]
fn s_b5_an_intake_uses_the_drivers_weight_not_the_weigher() {
    // A driver weighs an item before its lock, and the admission decides
    // the byte capacity on that weight (S-W21): the intake takes it as
    // given, never calls the weigher again, and clamps a weight past
    // MAX_WEIGHT.
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let c = std::sync::Arc::clone(&calls);
    let config = Config::builder().capacity_bytes(10).build().unwrap();
    let mut e: Engine<u8, u32> = Engine::with_weigher(config, move |_: &u32| {
        c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        1
    })
    .unwrap();
    let admission = outbox::core::Admission::new(e.config());
    for (item, weight) in [(0, 6), (1, 5), (2, 4)] {
        let refusal = admission
            .reserve(weight)
            .err()
            .map(|_| outbox::core::Refusal::BufferFull);
        let intake = e.stage_batch([handoff(1, item, Some(weight), None, refusal)]);
        assert_eq!(intake.accepted, u64::from(refusal.is_none()));
    }
    assert_eq!(e.pending_bytes(), 10, "6 + 5 bytes pass capacity_bytes 10");
    assert_eq!(e.counters().dropped(DropReason::BufferFull), 1);
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 0);
    let mut big: Engine<u8, u32> = Engine::with_weigher(Config::default(), |_: &u32| 1).unwrap();
    let intake = big.stage_batch([handoff(0, 0, Some(u64::MAX), None, None)]);
    assert_eq!(intake.accepted, 1);
    assert_eq!(big.pending_bytes(), outbox::core::MAX_WEIGHT);
}

/// One item for the engine's intake.
fn handoff(
    tenant: u8,
    item: u32,
    weight: Option<u64>,
    at: Option<Time>,
    refusal: Option<outbox::core::Refusal>,
) -> outbox::core::Handoff<u8, u32> {
    outbox::core::Handoff {
        tenant,
        item,
        weight,
        at,
        refusal,
    }
}

// ----- I6: the wake-up hint of an intake ---------------------------

#[test]
fn i6_an_intake_asks_for_a_drain_only_when_one_is_needed() {
    // The hint is what the driver's stage path wakes the writer on: a
    // `false` that hides work is a lost wake-up (the harness checks that),
    // a `true` that hides none is a wasted wake-up (checked here).
    let clock = || None;
    let config = Config::builder().concurrency(1).build().unwrap();
    let mut e: Engine<u8, u32> = Engine::new(config).unwrap();
    assert_eq!(
        staged_and_wake(&mut e, clock, 1, 0),
        (Staged::Accepted, true),
        "first ready"
    );
    assert_eq!(
        staged_and_wake(&mut e, clock, 1, 1),
        (Staged::Accepted, false),
        "already ready"
    );
    let w = e.poll_write(Time::ZERO).unwrap();
    while e.poll_event().is_some() {}
    assert_eq!(
        staged_and_wake(&mut e, clock, 2, 2),
        (Staged::Accepted, false),
        "no slot free: the write coming back drains"
    );
    assert_eq!(
        staged_and_wake(&mut e, clock, 3, 3),
        (Staged::Accepted, false),
        "2 goes first"
    );
    drop(e.finish(Time::ZERO, w, Outcome::WRITTEN));

    let config = Config::builder()
        .linger(dur(10))
        .max_batch(2)
        .build()
        .unwrap();
    let mut e: Engine<u8, u32> = Engine::new(config).unwrap();
    let at = Cell::new(ms(0));
    let clock = || Some(at.get());
    assert_eq!(
        staged_and_wake(&mut e, clock, 1, 0),
        (Staged::Accepted, true),
        "earliest timer"
    );
    at.set(ms(2));
    assert_eq!(
        staged_and_wake(&mut e, clock, 2, 1),
        (Staged::Accepted, false),
        "a later linger: the armed timer comes first"
    );
    assert_eq!(e.poll_timeout(), Some(ms(10)));
    assert_eq!(
        staged_and_wake(&mut e, clock, 2, 2),
        (Staged::Accepted, true),
        "a full batch ends the linger with a slot free"
    );
}

#[test]
fn i6_an_intake_that_arms_the_earliest_age_timer_asks_for_a_drain() {
    // S-R3, S-W22: with no slot free, a new tenant's item asks for no
    // write, but a durable item keeps its age, so its age timer may come
    // before every armed one: then the driver must learn of it; at the
    // same time as one, it need not.
    let config = Config::builder()
        .concurrency(1)
        .initial_backoff(dur(1_000))
        .jitter(0.0)
        .max_item_age(dur(100))
        .build()
        .unwrap();
    let stamped = || Some(ms(50));
    // An age timer fires just past its limit.
    let past = |t| Some(Time::from_nanos(ms(t).as_nanos() + 1));
    for (age, wake) in [(50, true), (0, false)] {
        let mut e: Engine<u8, u32> = Engine::new(config.clone()).unwrap();
        assert_eq!(staged_and_wake(&mut e, stamped, 3, 0).0, Staged::Accepted);
        let w = e.poll_write(ms(50)).unwrap();
        e.finish(ms(50), w, Outcome::Failed(Failure::Error))
            .unwrap();
        assert_eq!(staged_and_wake(&mut e, stamped, 2, 1).0, Staged::Accepted);
        let w = e.poll_write(ms(50)).unwrap();
        assert_eq!(w.tenant, 2, "the only slot");
        assert_eq!(e.poll_timeout(), past(150), "tenant 3's retry's age timer");
        let intake = e.stage_durable(ms(50), [durable(1, 2, age, None)], 0);
        assert_eq!(intake.accepted, 1);
        assert_eq!(intake.wake, wake, "tenant 1's {age} ms old item");
        assert_eq!(e.poll_timeout(), past(150 - age));
        drop(e.finish(ms(50), w, Outcome::WRITTEN));
    }
}

#[test]
fn i6_a_linger_due_with_an_armed_timer_asks_for_no_drain() {
    // The driver wakes at the armed timer anyway: a second tenant's
    // linger due at the same time changes nothing it must learn.
    let config = Config::builder().linger(dur(10)).build().unwrap();
    let mut e: Engine<u8, u32> = Engine::new(config).unwrap();
    let clock = || Some(ms(0));
    assert_eq!(
        staged_and_wake(&mut e, clock, 1, 0),
        (Staged::Accepted, true)
    );
    assert_eq!(
        staged_and_wake(&mut e, clock, 2, 1),
        (Staged::Accepted, false)
    );
    assert_eq!(e.poll_timeout(), Some(ms(10)));
}

/// What an intake of one item stamped `clock()` decided, as (staged,
/// wake).
fn staged_and_wake(
    e: &mut Engine<u8, u32>,
    clock: impl FnOnce() -> Option<Time>,
    tenant: u8,
    item: u32,
) -> (Staged, bool) {
    let intake = e.stage_batch([handoff(tenant, item, None, clock(), None)]);
    let staged = if intake.accepted == 1 {
        Staged::Accepted
    } else {
        Staged::ShuttingDown
    };
    (staged, intake.wake)
}

// ----- S-W22: items already durable -------------------------------------

/// A durable item for `stage_durable`.
fn durable(tenant: u8, item: u32, age_ms: u64, key: Option<u64>) -> outbox::core::Durable<u8, u32> {
    outbox::core::Durable {
        tenant,
        item,
        age: dur(age_ms),
        key,
    }
}

/// The keys handed back so far, with whether each item was written.
fn keys_done(e: &mut Engine<u8, u32>) -> Vec<(u64, bool)> {
    std::iter::from_fn(|| e.poll_event())
        .filter_map(|ev| match ev {
            Event::KeyDone { key, written, .. } => Some((key, written)),
            _ => None,
        })
        .collect()
}

#[test]
fn s_w22_durable_items_pass_every_capacity_and_hand_their_keys_back_in_order() {
    let config = Config::builder()
        .capacity(1)
        .tenant_capacity(1)
        .build()
        .unwrap();
    let mut e: Engine<u8, u32> = Engine::new(config).unwrap();
    let items = [
        durable(1, 0, 0, Some(10)),
        durable(1, 1, 0, None),
        durable(1, 2, 0, Some(12)),
        durable(2, 3, 0, Some(13)),
    ];
    let intake = e.stage_durable(ms(0), items, 2);
    assert_eq!((intake.accepted, intake.refused), (4, 0));
    assert!(intake.log, "the first unreadable items are logged (S-A6)");
    let c = e.counters().clone();
    assert_eq!((c.recovered, c.staged, c.pending), (6, 0, 4));
    assert_eq!(c.lost(outbox::LostReason::JournalUnreadable), 2);
    // A new stage still meets the capacity the durable items fill.
    assert_eq!(
        e.stage(ms(0), 3, 9),
        Staged::Dropped(DropReason::BufferFull)
    );
    let w = e.poll_write(ms(0)).unwrap();
    assert_eq!((w.tenant, w.items.clone()), (1, vec![0, 1, 2]));
    assert_eq!(keys_done(&mut e), []);
    e.finish(ms(1), w, Outcome::WRITTEN).unwrap();
    assert_eq!(keys_done(&mut e), [(10, true), (12, true)]);
    // After the fence: lost under `shutdown`, the key back at once.
    let _ = e.shutdown(ms(1), ms(1));
    let intake = e.stage_durable(ms(2), [durable(4, 4, 0, Some(14))], 0);
    assert_eq!((intake.accepted, intake.refused), (0, 1));
    assert_eq!(keys_done(&mut e), [(13, false), (14, false)]);
    assert!(e.counters().balanced(), "{:?}", e.counters());
}

#[test]
fn s_w22_a_durable_intake_asks_for_a_drain_when_it_leaves_work() {
    // I6 for `stage_durable`: a taken item the engine may write at once,
    // and, after the fence, a refusal's event to hand out or a key to
    // give back, each ask for a drain; a refusal while events already
    // wait adds nothing the next drain would not see.
    let mut e: Engine<u8, u32> = Engine::new(Config::default()).unwrap();
    let intake = e.stage_durable(ms(0), [durable(1, 0, 0, None)], 0);
    assert_eq!((intake.accepted, intake.wake), (1, true), "first ready");
    let _ = e.shutdown(ms(0), ms(10));
    while e.poll_event().is_some() {}
    let intake = e.stage_durable(ms(0), [durable(2, 1, 0, None)], 0);
    assert_eq!(
        (intake.refused, intake.wake),
        (1, true),
        "its event, the first"
    );
    let intake = e.stage_durable(ms(0), [durable(3, 2, 0, None)], 0);
    assert_eq!(
        (intake.refused, intake.wake),
        (1, false),
        "events wait already"
    );
    let intake = e.stage_durable(ms(0), [durable(4, 3, 0, Some(7))], 0);
    assert_eq!((intake.refused, intake.wake), (1, true), "its key");
}

#[test]
fn s_w22_a_later_slices_keys_say_which_of_its_items_the_store_discarded() {
    // S-W12 per key: a tenant's keys are counted from its first item, so
    // the second slice's first key is that slice's item 0, whatever the
    // first slice held.
    let config = Config::builder().max_batch(2).build().unwrap();
    let mut e: Engine<u8, u32> = Engine::new(config).unwrap();
    let items = (0..4).map(|i| durable(1, i, 0, Some(20 + u64::from(i))));
    let _ = e.stage_durable(ms(0), items, 0);
    let w = e.poll_write(ms(0)).unwrap();
    assert_eq!(w.items, [0, 1]);
    e.finish(ms(1), w, Outcome::WRITTEN).unwrap();
    assert_eq!(keys_done(&mut e), [(20, true), (21, true)]);
    let w = e.poll_write(ms(1)).unwrap();
    assert_eq!(w.items, [2, 3]);
    e.finish(ms(2), w, Outcome::Written { discarded: 1 })
        .unwrap();
    assert_eq!(keys_done(&mut e), [(22, true), (23, false)]);
    assert_eq!(e.counters().lost(outbox::LostReason::Discarded), 1);
}

#[test]
fn s_w22_a_durable_items_age_counts_toward_max_item_age() {
    // Stamped its age before `now`, never before its tenant's latest
    // stamp (S-R3 expires from the oldest): an item 40 ms old at 50 ms is
    // past its 100 ms limit at 111 ms (a fresh stamp would not be).
    let config = Config::builder().max_item_age(dur(100)).build().unwrap();
    let mut e: Engine<u8, u32> = Engine::new(config.clone()).unwrap();
    let _ = e.stage_durable(ms(50), [durable(1, 0, 40, Some(1))], 0);
    assert!(e.poll_write(ms(111)).is_none(), "expired, not written");
    assert_eq!(e.pending(), 0);
    assert_eq!(keys_done(&mut e), [(1, false)]);
    // Behind an item stamped 120 ms, one 100 ms old at 130 ms is stamped
    // 120 ms too: at 200 ms neither is past the limit.
    let mut e: Engine<u8, u32> = Engine::new(config).unwrap();
    assert_eq!(e.stage(ms(120), 2, 1), Staged::Accepted);
    let _ = e.stage_durable(ms(130), [durable(2, 2, 100, Some(2))], 0);
    let w = e.poll_write(ms(200)).expect("nothing expired");
    assert_eq!(w.items, [1, 2]);
    e.finish(ms(201), w, Outcome::WRITTEN).unwrap();
    assert_eq!(keys_done(&mut e), [(2, true)]);
}
