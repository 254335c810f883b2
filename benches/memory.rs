//! `memory`: bytes the outbox holds per pending item beyond the item itself
//! (target <= 16) and per tenant with a backlog (target <= 256), for
//! 1,000,000 items over 100,000 tenants, from a counting global
//! allocator. The two parts are separated by also staging 100,000 items
//! over 100,000 tenants (one item per tenant); 1,000,000 items over one
//! tenant is printed as a check of the per-item part.
//!
//! The items are staged on a current-thread runtime without yielding, so
//! the writer has not run yet: everything staged waits in the hand-off
//! (S-W19), as when the writer is starved, and is measured there; then a
//! read takes it into the engine, as the writer's next round would, and
//! it is measured again: pending, as when the sink is slower than the
//! callers. The targets apply to the engine's figures; the hand-off's are
//! printed beside them.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::{Duration, Instant};

use common::{fmt_secs, summary, tenant, Counting, Samples};
use criterion::{criterion_group, criterion_main, Criterion, SamplingMode};
use outbox::{Config, Outbox};

/// Counts the bytes currently allocated.
struct Counter;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is forwarded to `System`; the counter only observes.
unsafe impl GlobalAlloc for Counter {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        System.dealloc(ptr, layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        System.alloc_zeroed(layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static GLOBAL: Counter = Counter;

type Item = u64;
const ITEM: f64 = std::mem::size_of::<Item>() as f64;

/// Bytes held after staging `items` items round-robin over `tenants` into
/// a writer that has not run: (waiting in the hand-off, S-W19; then taken
/// into the engine, as the writer's next round or any read does).
fn held(items: u64, tenants: u64) -> (f64, f64) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _in = rt.enter();
    let outbox = Outbox::new(Counting::default(), Config::default()).unwrap();
    let before = LIVE.load(Ordering::Relaxed);
    for i in 0..items {
        let _ = outbox.stage(tenant(i % tenants), i);
    }
    let queued = LIVE.load(Ordering::Relaxed);
    assert_eq!(outbox.pending(), items, "the writer has not run");
    let taken_in = LIVE.load(Ordering::Relaxed);
    drop(outbox.abandon());
    ((queued - before) as f64, (taken_in - before) as f64)
}

/// Per pending item beyond the item, per tenant with a backlog, per item
/// of one tenant, from 1M/100k, 100k/100k and 1M/1 holdings.
fn parts(big: f64, one_each: f64, one_tenant: f64) -> (f64, f64, f64) {
    // big = 1e6 * (ITEM + a) + 1e5 * b; one_each = 1e5 * (ITEM + a) + 1e5 * b.
    let per_item = (big - one_each) / 900_000.0 - ITEM;
    let per_tenant = (one_each - 100_000.0 * (ITEM + per_item)) / 100_000.0;
    (per_item, per_tenant, one_tenant / 1_000_000.0 - ITEM)
}

fn memory(c: &mut Criterion) {
    // Criterion times the staging of the 1,000,000 items over 100,000
    // tenants into a paused outbox (for the record; no target).
    let samples = Samples::default();
    let mut group = c.benchmark_group("memory");
    group
        .sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(1))
        .measurement_time(Duration::from_secs(2));
    let id = "stage_1m_over_100k_paused";
    group.bench_function(id, |b| {
        samples.iter_custom(b, id, |iters| {
            (0..iters)
                .map(|_| {
                    let start = Instant::now();
                    held(1_000_000, 100_000);
                    start.elapsed()
                })
                .sum()
        });
    });
    group.finish();
    let Some(t) = samples.median(id, 10) else {
        return;
    };

    let big = held(1_000_000, 100_000);
    let one_each = held(100_000, 100_000);
    let one_tenant = held(1_000_000, 1);
    let (q_item, _, q_one) = parts(big.0, one_each.0, one_tenant.0);
    let (per_item, per_tenant, per_item_one_tenant) = parts(big.1, one_each.1, one_tenant.1);
    println!(
        "memory: 1,000,000 items over 100,000 tenants hold {:.1} MB in the engine ({:.1} MB while \
         waiting in the hand-off); 100,000 over 100,000: {:.1} MB; 1,000,000 over 1: {:.1} MB",
        big.1 / 1e6,
        big.0 / 1e6,
        one_each.1 / 1e6,
        one_tenant.1 / 1e6
    );
    println!(
        "memory: in the engine, per pending item beyond the item {per_item:.1} B (one tenant: \
         {per_item_one_tenant:.1} B), per tenant with a backlog {per_tenant:.1} B; waiting in the \
         hand-off for a stalled writer, {q_item:.1} B per item beyond it (one tenant: {q_one:.1} B); \
         staging 1M over 100k took {}",
        fmt_secs(t)
    );
    let met = per_item <= 16.0 && per_tenant <= 256.0;
    summary(
        "memory",
        (per_item / 16.0).max(per_tenant / 256.0),
        "item<=16B,tenant<=256B",
        Some(met),
        &format!(
            "per_item={per_item:.1}B per_tenant={per_tenant:.1}B total={:.1}MB handoff_per_item={q_item:.1}B",
            big.1 / 1e6
        ),
    );
}

criterion_group!(benches, memory);
criterion_main!(benches);
