//! `stage`: the cost of `Outbox::stage` for one item, against a bare
//! `tokio::sync::mpsc::unbounded_channel` send of the same `(TenantId, item)`
//! pair (target ratio <= 1.5), on one thread and on two threads
//! contending. Both have a consumer draining concurrently on the runtime
//! (the writer task; a receiver task), and the callers run in the runtime's
//! context, as request handlers do.

mod common;

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use common::{fmt_secs, runtime, summary, tenant, Counting, Samples};
use criterion::{criterion_group, criterion_main, Criterion};
use outbox::{Config, Outbox, TenantId};
use tokio::runtime::Runtime;
use tokio::sync::mpsc;

const TENANTS: u64 = 1_000;
const SAMPLES: usize = 20;

/// Runs `op(i)` for `i` in `0..iters` on each of `threads` threads in the
/// runtime's context; returns the wall time (each thread does `iters`).
fn run_threads(
    rt: &Runtime,
    threads: usize,
    iters: u64,
    op: Arc<dyn Fn(u64) + Send + Sync>,
) -> Duration {
    if threads == 1 {
        let _in = rt.enter();
        let start = Instant::now();
        for i in 0..iters {
            op(i);
        }
        return start.elapsed();
    }
    let barrier = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads)
        .map(|k| {
            let (op, barrier, handle) =
                (Arc::clone(&op), Arc::clone(&barrier), rt.handle().clone());
            std::thread::spawn(move || {
                let _in = handle.enter();
                barrier.wait();
                for i in 0..iters {
                    op(i + k as u64 * 7);
                }
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    for h in handles {
        h.join().unwrap();
    }
    start.elapsed()
}

fn stage(c: &mut Criterion) {
    let samples = Samples::default();
    let rt = runtime();
    let mut group = c.benchmark_group("stage");
    group
        .sample_size(SAMPLES)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));

    for threads in [1usize, 2] {
        // Baseline: a bare unbounded channel, drained by a task.
        let id = format!("channel/{threads}t");
        group.bench_function(&id, |b| {
            let (tx, mut rx) = mpsc::unbounded_channel::<(TenantId, u64)>();
            let received = Arc::new(AtomicU64::new(0));
            let r = Arc::clone(&received);
            rt.spawn(async move {
                while let Some(x) = rx.recv().await {
                    black_box(x);
                    r.fetch_add(1, Ordering::Relaxed);
                }
            });
            let mut sent = 0u64;
            samples.iter_custom(b, &id, |iters| {
                let tx = tx.clone();
                let d = run_threads(
                    &rt,
                    threads,
                    iters,
                    Arc::new(move |i| {
                        let _ = tx.send((tenant(i % TENANTS), i));
                    }),
                );
                // Untimed: let the consumer catch up between samples.
                sent += iters * threads as u64;
                while received.load(Ordering::Relaxed) < sent {
                    std::thread::yield_now();
                }
                d
            });
        });

        let id = format!("outbox/{threads}t");
        group.bench_function(&id, |b| {
            let outbox =
                rt.block_on(async { Outbox::new(Counting::default(), Config::default()).unwrap() });
            samples.iter_custom(b, &id, |iters| {
                let o = outbox.clone();
                let d = run_threads(
                    &rt,
                    threads,
                    iters,
                    Arc::new(move |i| {
                        let _ = o.stage(tenant(i % TENANTS), i);
                    }),
                );
                let left = rt.block_on(outbox.settle(Duration::from_secs(60))).pending;
                assert_eq!(left, 0);
                d
            });
            rt.block_on(outbox.shutdown(Duration::from_secs(10)));
        });
    }
    group.finish();

    let mut all_met = true;
    let mut parts = Vec::new();
    let mut worst: f64 = 0.0;
    for threads in [1usize, 2] {
        let (Some(base), Some(ours)) = (
            samples.median(&format!("channel/{threads}t"), SAMPLES),
            samples.median(&format!("outbox/{threads}t"), SAMPLES),
        ) else {
            continue;
        };
        let ratio = ours / base;
        worst = worst.max(ratio);
        all_met &= ratio <= 1.5;
        println!(
            "stage {threads} thread(s): outbox {} / channel send {} per item = {ratio:.2}",
            fmt_secs(ours),
            fmt_secs(base)
        );
        parts.push(format!(
            "{threads}t: outbox={} channel={} ratio={ratio:.2}",
            fmt_secs(ours),
            fmt_secs(base)
        ));
    }
    if !parts.is_empty() {
        summary("stage", worst, "<=1.5", Some(all_met), &parts.join(" | "));
    }
}

criterion_group!(benches, stage);
criterion_main!(benches);
