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
    w.finish(a, Outcome::Failed(Failure::StaleEpoch));
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

/// Found by the property below (S-B8, S-R3): a ready tenant whose last
/// item expired by its age timer, when that settle answered the shutdown
/// and closed the engine, stayed in the tenant table for good.
#[test]
fn s_b8_a_ready_tenant_emptied_as_the_engine_closes_is_forgotten() {
    let mut w = World::new(config(1).max_item_age(dur(70)));
    w.stage_ok(0, [0, 1]);
    let sd = w.shutdown(71);
    let a = w.poll_one();
    w.ok(a);
    w.at(71);
    let report = w.shutdown_done(sd).expect("answered");
    assert_eq!((report.written, report.lost), (1, 1), "{report:?}");
    assert!(w.e.is_closed());
    assert_eq!(w.e.tenants(), 0);
}

mod property {
    //! S-L16 as a property: under random stages, writes (in groups),
    //! outcomes, timers, flushes and settles, a tenant handed over never
    //! has an item staged before the hand-over in a write started after
    //! it; a tenant's writes stay in staging order; the counters balance
    //! after every input (S-W14); every flush and settle answers for
    //! exactly the items it covered; in the end nothing is pending. With
    //! and without a linger, a `max_item_age`, a breaker, dead letters,
    //! before and after a shutdown.

    use std::collections::BTreeMap;

    use outbox::core::{
        BreakerConfig, Config, Engine, Event, Failure, Outcome, Time, WaitId, Write,
    };
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Op {
        Stage { tenant: u32, count: u32 },
        Poll,
        Finish { pick: usize, outcome: u8 },
        HandOver { mask: u8 },
        Advance { ms: u64 },
        Flush,
        Settle,
        Shutdown { ms: u64 },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u32..5, 1u32..4).prop_map(|(tenant, count)| Op::Stage { tenant, count }),
            4 => Just(Op::Poll),
            4 => (any::<usize>(), 0u8..6).prop_map(|(pick, outcome)| Op::Finish { pick, outcome }),
            2 => (1u8..32).prop_map(|mask| Op::HandOver { mask }),
            2 => (0u64..60).prop_map(|ms| Op::Advance { ms }),
            1 => Just(Op::Flush),
            1 => Just(Op::Settle),
            1 => (0u64..100).prop_map(|ms| Op::Shutdown { ms }),
        ]
    }

    fn config(concurrency: usize, batch: usize, slices: usize, extras: u8) -> Config {
        let linger = extras & 1 != 0;
        let mut b = Config::builder()
            .concurrency(concurrency)
            .max_batch(batch)
            .max_slices_per_write(slices)
            .linger(std::time::Duration::from_millis(if linger {
                20
            } else {
                0
            }))
            .initial_backoff(std::time::Duration::from_millis(10))
            .max_backoff(std::time::Duration::from_millis(40))
            .max_attempts(4)
            .dead_letters(extras & 8 != 0);
        if extras & 2 != 0 {
            b = b.max_item_age(std::time::Duration::from_millis(70));
        }
        if extras & 4 != 0 {
            b = b.breaker(
                BreakerConfig::new()
                    .failures(2)
                    .probe_interval(std::time::Duration::from_millis(5))
                    .max_probe_interval(std::time::Duration::from_millis(20)),
            );
        }
        b.build().unwrap()
    }

    fn outcome(n: u8) -> Option<Outcome> {
        match n {
            0 | 1 => Some(Outcome::WRITTEN),
            2 => Some(Outcome::Failed(Failure::Error)),
            3 => Some(Outcome::Failed(Failure::Rejected)),
            4 => Some(Outcome::Failed(Failure::StaleEpoch)),
            _ => None, // the task is lost
        }
    }

    struct Run {
        e: Engine<u32, u32>,
        now: Time,
        next_item: u32,
        in_flight: Vec<Write<u32, u32>>,
        /// Per tenant, the first item staged after its last hand-over.
        handed_before: BTreeMap<u32, u32>,
        /// Per tenant, the last item of a write started.
        last_started: BTreeMap<u32, u32>,
        /// Open waits and the items each covers.
        waits: BTreeMap<WaitId, u64>,
        handed_events: u64,
    }

    impl Run {
        fn drain(&mut self) -> Result<(), TestCaseError> {
            while let Some(ev) = self.e.poll_event() {
                match ev {
                    Event::HandedOver { items, .. } => self.handed_events += items,
                    Event::WaitDone { id, report } => {
                        let covered = self.waits.remove(&id).expect("an open wait");
                        let sum = report.written
                            + report.dropped
                            + report.lost
                            + report.handed_over
                            + report.pending;
                        prop_assert_eq!(sum, covered, "the wait's report: {:?}", report);
                    }
                    _ => {}
                }
            }
            drop(self.e.take_released());
            let c = self.e.counters();
            prop_assert!(c.balanced(), "S-W14: {:?}", c);
            prop_assert_eq!(c.handed_over, self.handed_events);
            Ok(())
        }

        fn poll(&mut self) -> Result<(), TestCaseError> {
            while let Some(group) = self.e.poll_group(self.now) {
                for w in group {
                    let first = *w.items.first().expect("a slice has items");
                    if let Some(&from) = self.handed_before.get(&w.tenant) {
                        prop_assert!(
                            first >= from,
                            "tenant {} handed over before item {}, yet {:?} started",
                            w.tenant,
                            from,
                            w.items
                        );
                    }
                    if w.attempt == 1 {
                        if let Some(&last) = self.last_started.get(&w.tenant) {
                            prop_assert!(first > last, "order: {:?} after {}", w.items, last);
                        }
                        self.last_started
                            .insert(w.tenant, *w.items.last().expect("items"));
                    }
                    self.in_flight.push(w);
                }
            }
            Ok(())
        }

        fn apply(&mut self, op: Op) -> Result<(), TestCaseError> {
            match op {
                Op::Stage { tenant, count } => {
                    for _ in 0..count {
                        let _ = self.e.stage(self.now, tenant, self.next_item);
                        self.next_item += 1;
                    }
                }
                Op::Poll => self.poll()?,
                Op::Finish { pick, outcome: o } => {
                    if !self.in_flight.is_empty() {
                        let w = self.in_flight.swap_remove(pick % self.in_flight.len());
                        match outcome(o) {
                            Some(o) => drop(self.e.finish(self.now, w, o).expect("in flight")),
                            None => prop_assert!(self.e.finish_lost(self.now, w.id)),
                        }
                    }
                }
                Op::HandOver { mask } => {
                    let tenants: Vec<u32> = (0..5).filter(|t| mask & (1 << t) != 0).collect();
                    for &t in &tenants {
                        self.handed_before.insert(t, self.next_item);
                    }
                    self.e.hand_over_tenants(self.now, tenants);
                }
                Op::Advance { ms } => {
                    self.now = self.now + std::time::Duration::from_millis(ms);
                    self.e.handle_timeout(self.now);
                }
                Op::Shutdown { ms } => {
                    let deadline = self.now + std::time::Duration::from_millis(ms);
                    let _ = self.e.shutdown(self.now, deadline);
                }
                Op::Flush | Op::Settle => {
                    let deadline = self.now + std::time::Duration::from_secs(3600);
                    let covered = self.e.counters().pending;
                    let id = if matches!(op, Op::Flush) {
                        self.e.flush(self.now, deadline)
                    } else {
                        self.e.settle(self.now, deadline)
                    };
                    self.waits.insert(id, covered);
                }
            }
            self.drain()
        }

        /// Writes everything left, to the end: nothing pending, nothing
        /// in flight, and no tenant held (a ready tenant a hand-over
        /// emptied is passed over by the next poll that may start a
        /// write: with the breaker open, at its probe).
        fn finish_all(&mut self) -> Result<(), TestCaseError> {
            for _ in 0..1_000 {
                self.poll()?;
                let idle = self.in_flight.is_empty() && self.e.counters().pending == 0;
                if idle && self.e.tenants() == 0 {
                    return Ok(());
                }
                while let Some(w) = self.in_flight.pop() {
                    drop(
                        self.e
                            .finish(self.now, w, Outcome::WRITTEN)
                            .expect("in flight"),
                    );
                }
                self.drain()?;
                match self.e.poll_timeout() {
                    Some(at) => {
                        self.now = self.now.max(at);
                        self.e.handle_timeout(self.now);
                        self.drain()?;
                    }
                    None => prop_assert!(!idle, "a tenant held with nothing to wake it"),
                }
            }
            prop_assert_eq!(self.e.counters().pending, 0, "nothing left pending");
            Ok(())
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]
        #[test]
        fn s_l16_nothing_waiting_at_a_hand_over_is_written_after_it(
            concurrency in 1usize..4,
            batch in 1usize..4,
            slices in 1usize..4,
            extras in 0u8..16,
            ops in proptest::collection::vec(op(), 1..120),
        ) {
            let mut run = Run {
                e: Engine::new(config(concurrency, batch, slices, extras))
                    .unwrap()
                    .with_outbox_table(),
                now: Time::ZERO,
                next_item: 0,
                in_flight: Vec::new(),
                handed_before: BTreeMap::new(),
                last_started: BTreeMap::new(),
                waits: BTreeMap::new(),
                handed_events: 0,
            };
            for op in ops {
                run.apply(op)?;
            }
            run.finish_all()?;
            prop_assert!(run.waits.is_empty(), "every wait answered: {:?}", run.waits);
            prop_assert_eq!(run.e.tenants(), 0);
        }
    }
}

#[test]
fn s_l16_another_tenants_write_that_fails_meanwhile_is_retried_as_ever() {
    // Tenant 1 is handed over with its write out; tenant 2's write fails
    // before tenant 1's comes back: it is not tenant 1's hand-over.
    let mut w = World::new(config(2));
    w.stage_ok(1, [1]);
    w.stage_ok(2, [2, 3]);
    let mut ws = w.poll();
    assert_eq!(ws.len(), 2);
    let first = ws.remove(0);
    let second = ws.remove(0);
    let (one, two) = if first.tenant == 1 {
        (first, second)
    } else {
        (second, first)
    };
    let now = w.now;
    assert_eq!(w.e.hand_over_tenants(now, [1]), 0, "behind its write");
    w.fail(two);
    assert_eq!(handed_over(&w), []);
    assert_eq!((w.c().handed_over, w.c().pending), (0, 3));
    w.ok(one);
    w.at(7_200_000);
    let retry = w.poll_one();
    assert_eq!(
        (retry.tenant, retry.items.as_slice(), retry.attempt),
        (2, &[2][..], 2)
    );
    w.ok(retry);
    assert_eq!(w.c().handed_over, 0);
}

#[test]
fn s_l16_a_write_out_with_nothing_behind_it_ends_as_written_with_no_hand_over() {
    // Nothing waited behind the write: its tenant hands nothing over, and
    // no event says it handed over none.
    let mut w = World::new(config(1));
    w.stage_ok(1, [1]);
    let a = w.poll_one();
    let now = w.now;
    assert_eq!(w.e.hand_over_tenants(now, [1]), 0);
    w.ok(a);
    assert_eq!(handed_over(&w), []);
    assert_eq!((w.c().written, w.c().handed_over), (1, 0));
    assert_eq!(w.e.tenants(), 0);
}
