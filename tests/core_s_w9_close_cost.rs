//! S-W9: the work a shutdown does after its deadline is bounded: one sort
//! of the held tenants' keys and constant work per tenant beside moving
//! its items. Measured without a clock: the allocations the engine makes
//! while giving everything up at the deadline (each tenant's backlog
//! becomes its run in place, the waits settle in bulk, the tenant table is
//! rebuilt once), counted by this binary's allocator on this thread.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use outbox::core::{Config, Engine, Event, Failure, LostReason, Outcome, Time};

struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|n| n.set(n.get() + 1));
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCS.try_with(|n| n.set(n.get() + 1));
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocs() -> u64 {
    ALLOCS.with(Cell::get)
}

/// `tenants` tenants with `per` items each, `concurrency` writes hanging,
/// a settle and a shutdown open; the deadline passes. Returns the
/// allocations made while the engine gave everything up.
fn close(tenants: u64, per: u32, max_item_age: bool) -> u64 {
    let mut b = Config::builder().concurrency(8).max_batch(1);
    if max_item_age {
        b = b.max_item_age(std::time::Duration::from_secs(3_600));
    }
    let mut e: Engine<u64, u32> = Engine::new(b.build().unwrap()).unwrap();
    for i in 0..per {
        for t in 0..tenants {
            let _ = e.stage(Time::ZERO, t, i);
        }
    }
    let mut hanging = Vec::new();
    while let Some(w) = e.poll_write(Time::ZERO) {
        hanging.push(w);
    }
    let settle = e.settle(Time::ZERO, Time::from_millis(5_000));
    let shutdown = e.shutdown(Time::ZERO, Time::from_millis(1_000));
    while e.poll_event().is_some() {}
    let before = allocs();
    e.handle_timeout(Time::from_millis(1_000));
    let spent = allocs() - before;
    // What it did is right: everything lost under `deadline`, the settle
    // answered, the shutdown once the cancelled writes came back, with
    // every tenant's run.
    let mut settled = None;
    while let Some(ev) = e.poll_event() {
        if let Event::WaitDone { id, report } = ev {
            assert_eq!(id, settle);
            settled = Some(report);
        }
    }
    let n = tenants * u64::from(per);
    let r = settled.expect("the settle is answered at the deadline");
    assert_eq!((r.lost, r.written, r.pending), (n, 0, 0));
    assert_eq!(e.counters().lost(LostReason::Deadline), n);
    for w in hanging {
        let _ = e.finish(
            Time::from_millis(1_000),
            w,
            Outcome::Failed(Failure::Cancelled),
        );
    }
    let mut report = None;
    while let Some(ev) = e.poll_event() {
        if let Event::ShutdownDone { id, report: r } = ev {
            assert_eq!(id, shutdown);
            report = Some(r);
        }
    }
    let report = report.expect("the shutdown is answered");
    assert_eq!(report.lost, n);
    let items: usize = report.unwritten.iter().map(|u| u.items.len()).sum();
    assert_eq!(items as u64, n);
    // One run a tenant, and a second for the 8 in flight with a backlog.
    let extra = if per > 1 { 8 } else { 0 };
    assert_eq!(report.unwritten.len() as u64, tenants + extra);
    assert!(report
        .unwritten
        .windows(2)
        .all(|w| w[0].tenant <= w[1].tenant));
    assert_eq!(e.tenants(), 0, "every tenant forgotten");
    spent
}

#[test]
fn s_w9_giving_up_at_the_deadline_allocates_nothing_per_tenant() {
    for (tenants, per, aged) in [(20_000, 1, false), (20_000, 3, true), (2_000, 1, false)] {
        let spent = close(tenants, per, aged);
        // A handful of growing vectors (keys, runs, events) and one
        // index: logarithmic in the tenants, where one allocation per
        // tenant (or per item) would be 2,000 at least.
        assert!(
            spent < 200,
            "{tenants} tenants x {per}: {spent} allocations at the deadline"
        );
    }
}
