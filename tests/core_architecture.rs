//! The core's rules of the contract's "Architecture" section (S-C1, S-C2,
//! S-C4), on the engine alone with a hand-driven clock: determinism, time
//! that never runs backwards, items that travel with their write, and a
//! cost per step that does not grow with the tenants.

mod core_world;

use std::cell::Cell;
use std::cmp::Ordering;
use std::time::Duration;

use core_world::{dur, ms, World};
use outbox::core::{Config, Engine, Event, Failure, Outcome, Time};

// ----- S-C1: the core is a sans-IO state machine ------------------------

/// Every event, and every attempt as (tenant, items, attempt).
type Run = (Vec<Event<u32, u32>>, Vec<(u32, Vec<u32>, u32)>);

/// A scripted run with jitter, several tenants, failures, a flush and a
/// shutdown; a fixed LCG stands for the sink's mood.
fn scripted_run(seed: u64) -> Run {
    let mut w = World::new(
        Config::builder()
            .jitter(0.5)
            .seed(seed)
            .max_batch(4)
            .linger(dur(7))
            .concurrency(3)
            .capacity(40),
    );
    let mut lcg = 0x2545_f491_u64;
    let mut next = || {
        lcg = lcg
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (lcg >> 33) as u32
    };
    let mut in_flight = Vec::new();
    for step in 0..600u32 {
        match next() % 6 {
            0 | 1 => {
                let _ = w.stage(next() % 5, step);
            }
            2 => in_flight.extend(w.poll()),
            3 if !in_flight.is_empty() => {
                let x = in_flight.remove(next() as usize % in_flight.len());
                if next() % 3 == 0 {
                    w.fail(x);
                } else {
                    w.ok(x);
                }
            }
            4 => {
                let t = w.now + dur(u64::from(next() % 40));
                w.at_time(t);
            }
            _ if step == 300 => {
                w.flush(w.now.as_nanos() / 1_000_000 + 100);
            }
            _ => {}
        }
    }
    w.shutdown(w.now.as_nanos() / 1_000_000 + 50);
    let t = w.now + dur(50);
    w.at_time(t);
    for x in in_flight {
        w.finish(x, Outcome::Failed(Failure::Cancelled));
    }
    (w.events, w.attempts)
}

#[test]
fn s_c1_same_inputs_give_identical_event_streams() {
    let (a, wa) = scripted_run(7);
    let (b, wb) = scripted_run(7);
    assert!(wa.len() > 50, "the script exercises the engine");
    assert!(a.iter().any(|e| matches!(e, Event::ShutdownDone { .. })));
    assert!(
        a.iter().any(|e| matches!(e, Event::AttemptFailed { .. })),
        "with retries"
    );
    assert_eq!(a, b, "bit for bit");
    assert_eq!(wa, wb);
    let (c, _) = scripted_run(8);
    assert_ne!(a, c, "the jitter seed is used");
}

#[test]
fn s_c1_an_earlier_now_is_taken_as_the_latest_seen() {
    let mut w = World::new(Config::builder().linger(dur(10)));
    w.at(100);
    w.e.handle_timeout(ms(50));
    assert_eq!(w.e.now(), ms(100));
    let _ = w.e.stage(ms(0), 1, 1);
    assert_eq!(w.e.poll_timeout(), Some(ms(110)), "staged at 100, not 0");
}

#[test]
fn s_c1_an_earlier_now_in_finish_and_poll_write_is_taken_as_the_latest() {
    // Engine docs: a `now` earlier than one seen is taken as the latest.
    let mut e: Engine<u32, u32> = Engine::new(Config::default()).unwrap();
    let t10 = Time::from_millis(10_000);
    let _ = e.stage(t10, 1, 1);
    let w = e.poll_write(Time::ZERO).unwrap();
    e.finish(Time::from_millis(5), w, Outcome::Failed(Failure::Error))
        .unwrap();
    // Backoff 50 ms from 10 s, not from 5 ms or 0.
    assert_eq!(e.poll_timeout(), Some(Time::from_millis(10_050)));
    assert!(e.poll_write(Time::from_millis(10_049)).is_none());
    assert!(e.poll_write(Time::ZERO).is_none());
    let w = e.poll_write(Time::from_millis(10_050)).unwrap();
    assert_eq!(w.items, [1]);
    e.finish(Time::ZERO, w, Outcome::WRITTEN).unwrap();
    assert_eq!(e.pending(), 0);
    assert_eq!(e.now(), Time::from_millis(10_050));
}

#[test]
fn s_c1_time_max_and_deadline_max_saturate_without_panicking() {
    let mut e: Engine<u32, u32> = Engine::new(
        Config::builder()
            .linger(Duration::MAX)
            .write_timeout(Duration::MAX)
            .build()
            .unwrap(),
    )
    .unwrap();
    let _ = e.stage(Time::MAX, 1, 1);
    // Lingering until Time::MAX == now: it is due at once.
    let w = e.poll_write(Time::MAX).expect("due at Time::MAX");
    assert_eq!(w.deadline, Some(Time::MAX));
    e.finish(Time::MAX, w, Outcome::Failed(Failure::Error))
        .unwrap();
    // Backoff saturates at Time::MAX, and is due there.
    let w = e
        .poll_write(Time::MAX)
        .expect("retry due at saturated time");
    e.finish(Time::MAX, w, Outcome::WRITTEN).unwrap();
    let _ = e.shutdown(Time::MAX, Time::MAX);
    assert!(e.is_closed());
    assert_eq!(e.pending(), 0);
}

#[test]
fn engine_debug_names_its_state() {
    let w = World::new(Config::builder());
    let text = format!("{:?}", w.e);
    assert!(text.starts_with("Engine"), "{text}");
    assert!(
        text.contains("tenants") && text.contains("in_flight"),
        "{text}"
    );
}

#[test]
fn the_engine_keeps_its_config() {
    let c = Config::builder().max_batch(7).seed(9).build().unwrap();
    let w = World::config(c.clone());
    assert_eq!(w.e.config(), &c);
}

// ----- S-C2: a write's items travel with it -----------------------------

#[test]
fn s_c2_a_write_whose_items_were_changed_is_refused_and_changes_nothing() {
    // S-C2: the items must come back untouched; a shortened slice would
    // make the pending counts drift.
    let mut w = World::new(Config::builder());
    w.stage_ok(1, [1, 2]);
    let mut a = w.poll_one();
    a.items.pop();
    let before = w.c().clone();
    let err = w.e.finish(w.now, a, Outcome::WRITTEN).unwrap_err();
    assert_eq!(err.0.items, [1], "handed back as given");
    assert_eq!(w.c(), &before);
    assert_eq!(w.e.in_flight(), 1, "still in flight");
}

#[test]
fn an_unknown_write_names_itself() {
    let mut w = World::new(Config::builder());
    w.stage_ok(1, [1]);
    let a = w.poll_one();
    let id = a.id;
    w.ok(a);
    let ghost = outbox::core::Write {
        id,
        tenant: 1,
        items: vec![1],
        attempt: 1,
        deadline: None,
    };
    let err = w.e.finish(w.now, ghost, Outcome::WRITTEN).unwrap_err();
    assert_eq!(
        err.to_string(),
        "write w1 is not in flight, or its items were changed"
    );
    assert_eq!(w.c().written, 1, "nothing counted twice");
}

// ----- S-C4: cost per event does not grow with the tenants --------------

thread_local! {
    static KEY_OPS: Cell<u64> = const { Cell::new(0) };
}

fn key_op() {
    KEY_OPS.with(|c| c.set(c.get() + 1));
}

/// A tenant key that counts every comparison, equality test and clone:
/// the engine's work on tenants, in operations rather than time.
#[derive(Debug)]
struct Key(u32);

impl Clone for Key {
    fn clone(&self) -> Self {
        key_op();
        Key(self.0)
    }
}
impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        key_op();
        self.0 == other.0
    }
}
impl Eq for Key {}
impl std::hash::Hash for Key {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        key_op();
        self.0.hash(state);
    }
}
impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Key {
    fn cmp(&self, other: &Self) -> Ordering {
        key_op();
        self.0.cmp(&other.0)
    }
}

/// Key operations of one stage, poll, finish and timer step on an engine
/// where `backing_off` other tenants wait for a backoff.
fn key_ops_per_step(backing_off: u32) -> u64 {
    let c = Config::builder()
        .concurrency(backing_off as usize + 1)
        .initial_backoff(dur(60_000))
        .max_backoff(dur(60_000))
        .build()
        .unwrap();
    let mut e: Engine<Key, u32> = Engine::new(c).unwrap();
    let t0 = Time::ZERO;
    for t in 0..backing_off {
        let _ = e.stage(t0, Key(t), t);
    }
    while let Some(x) = e.poll_write(t0) {
        e.finish(t0, x, Outcome::Failed(Failure::Error)).unwrap();
    }
    while e.poll_event().is_some() {}
    assert_eq!(e.tenants(), backing_off as usize);
    let now = ms(1);
    KEY_OPS.with(|c| c.set(0));
    // A new tenant in the middle of the key space, and a backing-off one.
    let _ = e.stage(now, Key(backing_off / 2 + 7_000_000), 1);
    let _ = e.stage(now, Key(backing_off / 2), 2);
    let x = e.poll_write(now).expect("the new tenant is ready");
    e.finish(now, x, Outcome::WRITTEN).unwrap();
    let _ = e.poll_timeout();
    e.handle_timeout(ms(2));
    let _ = e.flush(ms(2), ms(3));
    while e.poll_event().is_some() {}
    KEY_OPS.with(Cell::get)
}

#[test]
fn s_c4_many_tenants_in_backoff_do_not_slow_a_step() {
    let small = key_ops_per_step(10);
    let big = key_ops_per_step(100_000);
    assert!(small > 0, "the counter sees the engine's key work");
    // O(log T) or better: 100,000 tenants cost at most a few dozen more
    // key operations per lookup (hashes, comparisons), not 100,000 more.
    assert!(
        big <= small * 8 && big < 1_000,
        "key operations: {small} with 10 tenants, {big} with 100,000"
    );
}
