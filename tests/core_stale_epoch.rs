//! A write that comes back under a stale epoch (S-E7, S-W18's
//! `stale_epoch` kind), on the engine alone with a hand-driven clock. On an
//! engine relaying an outbox table: not retried, not lost, its tenant
//! handed over whole; flush and settle answer with the items as handed
//! over; the breaker does not count it. Without an outbox table (nothing
//! can take the items over): a terminal failure, its items lost under
//! `stale_epoch` and dead-lettered, never handed over into nowhere. The
//! world checks S-W14 (with `handed_over` as a place) after every step.

mod core_world;

use core_world::{dur, World};
use outbox::core::{
    AfterFailure, BreakerConfig, BreakerState, Config, DeadReason, Event, Failure, LostReason,
    Outcome, Report,
};

#[test]
fn s_e7_a_stale_write_hands_its_tenant_over_neither_retried_nor_lost() {
    let mut w = World::table(Config::builder().concurrency(4).max_batch(2));
    w.stage_ok(1, [1, 2]);
    w.stage_ok(2, [20]);
    let ws = w.poll();
    assert_eq!(ws.len(), 2);
    let mut ws = ws.into_iter();
    let (stale, other) = (ws.next().unwrap(), ws.next().unwrap());
    assert_eq!(stale.tenant, 1);
    // Tenant 1 keeps staging while its write is out.
    w.stage_ok(1, [3, 4, 5]);
    w.finish(stale, Outcome::Failed(Failure::StaleEpoch));
    let c = w.c().clone();
    assert_eq!(c.handed_over, 5, "the write's 2 and the 3 waiting");
    assert_eq!((c.lost_total(), c.dropped_total(), c.written), (0, 0, 0));
    assert_eq!(c.failed(Failure::StaleEpoch), 1);
    assert_eq!(c.failed_attempts, 1);
    assert_eq!(c.pending, 1, "tenant 2's item only");
    assert!(
        w.poll().is_empty(),
        "nothing of tenant 1 is retried or written"
    );
    let failed: Vec<_> = w
        .events
        .iter()
        .filter_map(|e| match e {
            Event::AttemptFailed {
                tenant: 1,
                failure,
                next,
                items,
                ..
            } => Some((*failure, *next, *items)),
            _ => None,
        })
        .collect();
    assert_eq!(failed, [(Failure::StaleEpoch, AfterFailure::HandedOver, 2)]);
    assert_eq!(
        w.count_events(|e| matches!(
            e,
            Event::HandedOver {
                tenant: 1,
                items: 5
            }
        )),
        1
    );
    assert_eq!(
        w.count_events(|e| matches!(e, Event::Lost { .. } | Event::DeadLetter(_))),
        0
    );
    // Other tenants go on as before.
    w.ok(other);
    assert_eq!(w.written_of(2), [20]);
    assert_eq!(w.e.tenants(), 0, "the handed-over tenant is forgotten");
    let c = w.c();
    assert_eq!(c.attempts, c.writes + c.failed_attempts, "S-W18");
}

#[test]
fn s_e7_flush_and_settle_answer_with_the_items_handed_over() {
    let mut w = World::table(Config::builder().concurrency(1).max_batch(1));
    w.stage_ok(1, [1, 2, 3]);
    let first = w.poll_one();
    let settle = w.settle(10_000);
    let flush = w.flush(10_000);
    w.finish(first, Outcome::Failed(Failure::StaleEpoch));
    let want = Report {
        handed_over: 3,
        ..Report::default()
    };
    assert_eq!(w.wait_done(settle), Some(want));
    assert_eq!(w.wait_done(flush), Some(want));
}

#[test]
fn s_e7_a_stale_epoch_is_an_answer_the_breaker_does_not_count() {
    let breaker = BreakerConfig::new()
        .failures(1)
        .probe_interval(dur(100))
        .max_probe_interval(dur(400));
    let mut w = World::table(Config::builder().concurrency(1).breaker(breaker));
    w.stage_ok(1, [1]);
    w.stage_ok(2, [2]);
    let a = w.poll_one();
    w.finish(a, Outcome::Failed(Failure::StaleEpoch));
    assert_eq!(w.e.breaker(), BreakerState::Closed);
    let b = w.poll_one();
    assert_eq!(b.tenant, 2, "the next write starts at once");
    w.fail(b);
    assert!(
        matches!(w.e.breaker(), BreakerState::Open { .. }),
        "a real failure still opens it"
    );
}

#[test]
fn s_e7_a_tenant_staged_again_after_a_hand_over_starts_afresh() {
    // The engine knows no partitions: what stops a lost partition's new
    // writes is the lease policy's refusal (S-L8, S-L16); the engine only
    // keeps a tenant's order by never writing what waited behind the
    // stale write.
    let mut w = World::table(Config::builder().concurrency(1));
    w.stage_ok(1, [1]);
    let a = w.poll_one();
    w.finish(a, Outcome::Failed(Failure::StaleEpoch));
    w.stage_ok(1, [7]);
    let b = w.poll_one();
    assert_eq!((b.tenant, b.items.clone(), b.attempt), (1, vec![7], 1));
    w.ok(b);
    assert_eq!(w.written_of(1), [7]);
    assert_eq!(w.c().handed_over, 1);
}

#[test]
fn s_e7_a_given_up_write_that_comes_back_stale_stays_counted_lost() {
    let mut w = World::table(Config::builder().concurrency(1));
    w.stage_ok(1, [1, 2]);
    let a = w.poll_one();
    let sd = w.shutdown(100);
    w.at(100);
    w.finish(a, Outcome::Failed(Failure::StaleEpoch));
    let report = w.shutdown_done(sd).expect("answered");
    assert_eq!((report.lost, report.handed_over), (2, 0));
    assert_eq!(
        w.c().failed(Failure::StaleEpoch),
        1,
        "the attempt still ends once"
    );
    assert_eq!(w.c().handed_over, 0);
}

#[test]
fn s_e7_without_an_outbox_table_a_stale_write_is_a_terminal_loss_never_handed_over() {
    let mut w = World::new(
        Config::builder()
            .concurrency(4)
            .max_batch(2)
            .dead_letters(true),
    );
    w.stage_ok(1, [1, 2]);
    w.stage_ok(2, [20]);
    let mut ws = w.poll().into_iter();
    let (stale, other) = (ws.next().unwrap(), ws.next().unwrap());
    assert_eq!(stale.tenant, 1);
    w.stage_ok(1, [3]);
    let settle = w.settle(10_000);
    w.finish(stale, Outcome::Failed(Failure::StaleEpoch));
    let c = w.c().clone();
    assert_eq!(c.handed_over, 0, "no outbox table holds them");
    assert_eq!(c.lost(LostReason::StaleEpoch), 2, "{c:?}");
    assert_eq!(c.failed(Failure::StaleEpoch), 1);
    let failed: Vec<_> = w
        .events
        .iter()
        .filter_map(|e| match e {
            Event::AttemptFailed {
                tenant: 1,
                failure,
                next,
                ..
            } => Some((*failure, *next)),
            _ => None,
        })
        .collect();
    assert_eq!(failed, [(Failure::StaleEpoch, AfterFailure::Lost)]);
    let dead: Vec<_> = w
        .events
        .iter()
        .filter_map(|e| match e {
            Event::DeadLetter(d) => Some((d.tenant, d.items.clone(), d.reason, d.attempted)),
            _ => None,
        })
        .collect();
    assert_eq!(dead, [(1, vec![1, 2], DeadReason::StaleEpoch, true)]);
    assert_eq!(w.count_events(|e| matches!(e, Event::HandedOver { .. })), 0);
    // Never retried; the tenant goes on with what it staged after, as
    // after a terminal rejection.
    let next = w.poll_one();
    assert_eq!((next.tenant, next.items.clone()), (1, vec![3]));
    w.ok(next);
    w.ok(other);
    assert_eq!(w.written_of(1), [3]);
    let want = Report {
        written: 2,
        lost: 2,
        ..Report::default()
    };
    assert_eq!(w.wait_done(settle), Some(want));
    assert_eq!(DeadReason::StaleEpoch.lost(), Some(LostReason::StaleEpoch));
    assert_eq!(LostReason::StaleEpoch.as_str(), "stale_epoch");
}
