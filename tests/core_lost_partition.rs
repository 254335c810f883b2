//! A lost partition's tenants handed over (S-L16), on the engine alone
//! with a hand-driven clock: their waiting items (backlog and retry
//! slices) leave the engine at once, counted `handed_over` with one
//! `Event::HandedOver` per tenant; a write in flight ends as written, then
//! what waited behind it is handed over, or fails and is handed over with
//! it, never retried; flush, settle and shutdown answer with them as
//! handed over; every other tenant is untouched. The world checks S-W14
//! (with `handed_over` as a place) after every step.

mod core_world;

use core_world::{dur, World};
use outbox::core::{AfterFailure, Config, ConfigBuilder, Event, Failure, Outcome, Report};

/// One write at a time per tenant, one item per write, retries an hour
/// away: nothing leaves the engine by a timer during a test.
fn config(concurrency: usize) -> ConfigBuilder {
    Config::builder()
        .concurrency(concurrency)
        .max_batch(1)
        .initial_backoff(dur(3_600_000))
        .max_backoff(dur(3_600_000))
        .jitter(0.0)
}

/// The tenants handed over, with their items, in event order.
fn handed_over(w: &World) -> Vec<(u32, u64)> {
    w.events
        .iter()
        .filter_map(|e| match e {
            Event::HandedOver { tenant, items } => Some((*tenant, *items)),
            _ => None,
        })
        .collect()
}

#[test]
fn s_l16_waiting_items_of_a_lost_partition_leave_at_once_and_others_stay() {
    let mut w = World::new(config(2));
    // Tenants 1, 2 and 4 are of the lost partition, 3 of another.
    w.stage_ok(1, [1, 2]);
    w.stage_ok(2, [10, 11]);
    w.stage_ok(3, [30]);
    w.stage_ok(4, [40]);
    let ws = w.poll();
    let tenants: Vec<u32> = ws.iter().map(|w| w.tenant).collect();
    assert_eq!(tenants, [1, 2]);
    let mut ws = ws.into_iter();
    let (one, two) = (ws.next().unwrap(), ws.next().unwrap());
    // Tenant 2's write fails: its slice backs off for an hour.
    w.fail(two);
    let flush = w.flush(10_000_000);
    // Tenant 99 is not in the engine: skipped.
    let now = w.now;
    let handed = w.e.hand_over_tenants(now, [1, 2, 4, 99]);
    while let Some(e) = w.e.poll_event() {
        w.events.push(e);
    }
    assert_eq!(handed, 3, "tenant 2's retry slice and backlog, tenant 4's");
    assert_eq!(handed_over(&w), [(2, 2), (4, 1)]);
    let c = w.c().clone();
    assert_eq!((c.handed_over, c.pending, c.lost_total()), (3, 3, 0));
    assert!(c.balanced(), "{c:?}");
    // One slot is free: tenant 3 goes, tenant 4 has nothing left.
    let three = w.poll_one();
    assert_eq!((three.tenant, three.items.clone()), (3, vec![30]));
    // The write in flight ends as written; what waited behind it is then
    // handed over, not written.
    w.ok(one);
    assert_eq!(handed_over(&w), [(2, 2), (4, 1), (1, 1)]);
    assert!(w.poll().is_empty(), "nothing of tenant 1 starts");
    w.ok(three);
    assert_eq!(
        w.wait_done(flush),
        Some(Report {
            written: 2,
            handed_over: 4,
            ..Report::default()
        })
    );
    // An hour on, tenant 2's retry never comes.
    w.at(7_200_000);
    assert!(w.poll().is_empty());
    assert_eq!(w.written_of(1), [1]);
    assert_eq!(w.written_of(3), [30]);
    assert!(w.written_of(2).is_empty() && w.written_of(4).is_empty());
    let c = w.c();
    assert_eq!((c.written, c.handed_over, c.pending), (2, 4, 0));
    assert_eq!(c.attempts, c.writes + c.failed_attempts, "S-W18");
    assert_eq!(w.e.tenants(), 0, "every tenant forgotten");
}

#[test]
fn s_l16_a_write_in_flight_that_fails_is_handed_over_with_its_tenant_never_retried() {
    let mut w = World::new(config(1));
    w.stage_ok(1, [1, 2, 3]);
    let a = w.poll_one();
    let settle = w.settle(10_000_000);
    let now = w.now;
    assert_eq!(w.e.hand_over_tenants(now, [1]), 0, "all behind the write");
    assert_eq!(w.c().pending, 3);
    w.fail(a);
    let failed: Vec<_> = w
        .events
        .iter()
        .filter_map(|e| match e {
            Event::AttemptFailed { failure, next, .. } => Some((*failure, *next)),
            _ => None,
        })
        .collect();
    assert_eq!(failed, [(Failure::Error, AfterFailure::HandedOver)]);
    assert_eq!(handed_over(&w), [(1, 3)]);
    assert_eq!(
        w.wait_done(settle),
        Some(Report {
            handed_over: 3,
            ..Report::default()
        })
    );
    w.at(7_200_000);
    assert!(w.poll().is_empty(), "never retried");
    let c = w.c();
    assert_eq!(
        (c.handed_over, c.lost_total(), c.failed(Failure::Error)),
        (3, 0, 1)
    );
    assert_eq!(w.e.tenants(), 0);
}

#[test]
fn s_l16_a_stale_write_after_the_hand_over_ends_once_as_stale() {
    let mut w = World::new(config(1));
    w.stage_ok(1, [1, 2]);
    let a = w.poll_one();
    let now = w.now;
    w.e.hand_over_tenants(now, [1]);
    w.finish(a, Outcome::StaleEpoch);
    assert_eq!(handed_over(&w), [(1, 2)]);
    let c = w.c();
    assert_eq!((c.handed_over, c.failed(Failure::StaleEpoch)), (2, 1));
    assert_eq!(c.attempts, c.writes + c.failed_attempts, "S-W18");
}

#[test]
fn s_l16_a_tenant_handed_over_and_staged_again_starts_afresh() {
    let mut w = World::new(config(1).linger(dur(50)));
    w.stage_ok(1, [1, 2]);
    let now = w.now;
    assert_eq!(w.e.hand_over_tenants(now, [1]), 2, "lingering: handed over");
    w.stage_ok(1, [3]);
    w.at(50);
    let b = w.poll_one();
    assert_eq!((b.tenant, b.items.clone(), b.attempt), (1, vec![3], 1));
    w.ok(b);
    assert_eq!(w.written_of(1), [3]);
    assert_eq!(w.c().handed_over, 2);
}

#[test]
fn s_l16_a_hand_over_that_settles_the_last_items_answers_the_shutdown() {
    let mut w = World::new(config(1));
    w.stage_ok(1, [1]);
    w.stage_ok(2, [2]);
    let a = w.poll_one();
    w.ok(a);
    // Tenant 2 is ready; the slot is free but nothing polled yet.
    let sd = w.shutdown(10_000);
    let now = w.now;
    assert_eq!(w.e.hand_over_tenants(now, [2]), 1);
    while let Some(e) = w.e.poll_event() {
        w.events.push(e);
    }
    let report = w.shutdown_done(sd).expect("answered");
    assert_eq!((report.handed_over, report.lost), (1, 0), "{report:?}");
    assert!(w.e.is_closed());
    assert!(w.poll().is_empty());
    assert_eq!(w.e.tenants(), 0, "the emptied ready tenant is forgotten");
}

#[test]
fn s_l16_only_the_tenants_named_are_touched_among_many() {
    let mut w = World::new(config(4));
    for t in 0..2_000u32 {
        w.stage_ok(t, [t]);
    }
    let lost: Vec<u32> = (0..2_000).filter(|t| t % 64 == 5).collect();
    let now = w.now;
    let handed = w.e.hand_over_tenants(now, lost.iter().copied());
    while let Some(e) = w.e.poll_event() {
        w.events.push(e);
    }
    assert_eq!(handed, lost.len() as u64);
    let events = handed_over(&w);
    assert_eq!(events.len(), lost.len(), "one event per tenant");
    assert!(events.iter().zip(&lost).all(|(e, t)| *e == (*t, 1)));
    assert_eq!(w.c().pending, 2_000 - lost.len() as u64);
    // Everything else is written, in staging order; nothing handed over.
    loop {
        let ws = w.poll();
        if ws.is_empty() {
            break;
        }
        for x in ws {
            w.ok(x);
        }
    }
    let written: Vec<u32> = w.written.keys().copied().collect();
    let want: Vec<u32> = (0..2_000).filter(|t| t % 64 != 5).collect();
    assert_eq!(written, want);
    assert_eq!(w.c().handed_over, lost.len() as u64);
    assert_eq!(w.e.tenants(), 0);
}
