//! `backoff`: 1,000,000 items over 100,000 tenants, 10% of which always
//! fail.
//!
//! 1. The healthy items drain within 2x of the time all items take when
//!    nothing fails (same run, same tenants, concurrency 4 and 64).
//! 2. The writer's CPU per second while 10,000 tenants back off stays flat
//!    as the tenants the engine holds (T) grow 10x: T = 20,000 and 200,000,
//!    the tenants beyond the failing 10,000 each holding a lingering item
//!    (a map entry and a linger timer that never fires during the
//!    measurement). Process CPU time (`getrusage`) over a fixed real
//!    interval.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{fmt_secs, process_cpu, runtime, summary, tenant, Failing, Samples};
use criterion::{criterion_group, criterion_main, Criterion, SamplingMode};
use outbox::{Config, Outbox, TenantId};
use tokio::runtime::Runtime;

const ITEMS: u64 = 1_000_000;
const TENANTS: u64 = 100_000;
const CONCURRENCY: [usize; 2] = [4, 64];
const SAMPLES: usize = 10;

/// Tenants whose index ends in 0 always fail: 10%.
fn every_tenth(t: TenantId) -> bool {
    t.0.as_u128() % 10 == 0
}

fn never(_: TenantId) -> bool {
    false
}

fn sink(failing: fn(TenantId) -> bool) -> Failing {
    Failing {
        written: Arc::new(AtomicU64::new(0)),
        attempts: Arc::new(AtomicU64::new(0)),
        failing,
    }
}

/// Time until every healthy item is written.
fn drain_once(rt: &Runtime, concurrency: usize, failing: fn(TenantId) -> bool) -> Duration {
    rt.block_on(async {
        let sink = sink(failing);
        let written = Arc::clone(&sink.written);
        let config = Config::builder().concurrency(concurrency).build().unwrap();
        let outbox = Outbox::new(sink, config).unwrap();
        let healthy = (0..ITEMS).filter(|i| !failing(tenant(i % TENANTS))).count() as u64;
        let start = Instant::now();
        for i in 0..ITEMS {
            let _ = outbox.stage(tenant(i % TENANTS), i);
        }
        while written.load(Ordering::Relaxed) < healthy {
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        let took = start.elapsed();
        drop(outbox.abandon());
        took
    })
}

/// CPU seconds per second while `failing` tenants back off among `total`.
fn backoff_cpu(rt: &Runtime, failing: u64, total: u64, interval: Duration) -> (f64, f64) {
    let sink = sink(|_| true);
    let attempts = Arc::clone(&sink.attempts);
    let outbox = rt.block_on(async {
        let config = Config::builder()
            .concurrency(64)
            .linger(Duration::from_secs(3600))
            .initial_backoff(Duration::from_millis(200))
            .max_backoff(Duration::from_millis(200))
            .jitter(0.5)
            .build()
            .unwrap();
        Outbox::new(sink, config).unwrap()
    });
    {
        let _in = rt.enter();
        for i in 0..failing {
            let _ = outbox.stage(tenant(i), i);
        }
    }
    // The flush sends the failing tenants' items at once; they fail and
    // back off from then on. Its answer is not awaited.
    drop(outbox.flush(Duration::from_millis(1)));
    {
        let _in = rt.enter();
        for i in failing..total {
            // Linger for an hour: held, never written while measured.
            let _ = outbox.stage(tenant(i), i);
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    let (cpu0, n0, t0) = (
        process_cpu(),
        attempts.load(Ordering::Relaxed),
        Instant::now(),
    );
    std::thread::sleep(interval);
    let (cpu1, n1, t1) = (
        process_cpu(),
        attempts.load(Ordering::Relaxed),
        Instant::now(),
    );
    drop(outbox.abandon());
    let secs = (t1 - t0).as_secs_f64();
    ((cpu1 - cpu0).as_secs_f64() / secs, (n1 - n0) as f64 / secs)
}

fn backoff(c: &mut Criterion) {
    let samples = Samples::default();
    let rt = runtime();
    let mut group = c.benchmark_group("backoff");
    group
        .sample_size(SAMPLES)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(1))
        .measurement_time(Duration::from_secs(3));
    for concurrency in CONCURRENCY {
        for (name, failing) in [
            ("healthy", never as fn(_) -> _),
            ("10pct_failing", every_tenth),
        ] {
            let id = format!("c{concurrency}/{name}");
            group.bench_function(&id, |b| {
                samples.iter_custom(b, &id, |iters| {
                    (0..iters)
                        .map(|_| drain_once(&rt, concurrency, failing))
                        .sum()
                });
            });
        }
    }
    group.finish();

    let mut parts = Vec::new();
    let mut worst: f64 = 0.0;
    let mut met = true;
    for concurrency in CONCURRENCY {
        let (Some(base), Some(ours)) = (
            samples.median(&format!("c{concurrency}/healthy"), SAMPLES),
            samples.median(&format!("c{concurrency}/10pct_failing"), SAMPLES),
        ) else {
            continue;
        };
        let ratio = ours / base;
        worst = worst.max(ratio);
        met &= ratio <= 2.0;
        println!(
            "backoff drain concurrency {concurrency}: healthy items with 10% failing {} / all items, none failing {} = {ratio:.2}",
            fmt_secs(ours),
            fmt_secs(base)
        );
        parts.push(format!(
            "c{concurrency}: failing={} healthy={} ratio={ratio:.2}",
            fmt_secs(ours),
            fmt_secs(base)
        ));
    }
    if !parts.is_empty() {
        summary(
            "backoff_drain",
            worst,
            "<=2.0",
            Some(met),
            &parts.join(" | "),
        );
    }

    // The CPU part runs only when this bench is selected (not filtered out).
    if samples.median("c64/healthy", SAMPLES).is_none() {
        return;
    }
    let interval = Duration::from_secs(1);
    let mut cpu = [Vec::new(), Vec::new()];
    let mut rate = [Vec::new(), Vec::new()];
    for _ in 0..3 {
        for (k, total) in [20_000u64, 200_000].into_iter().enumerate() {
            let (c, r) = backoff_cpu(&rt, 10_000, total, interval);
            cpu[k].push(c);
            rate[k].push(r);
        }
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (small, large) = (med(&mut cpu[0]), med(&mut cpu[1]));
    let (rs, rl) = (med(&mut rate[0]), med(&mut rate[1]));
    let ratio = large / small;
    println!(
        "backoff cpu: 10,000 tenants backing off among 20,000: {small:.3} cpu-s/s ({rs:.0} attempts/s); among 200,000: {large:.3} cpu-s/s ({rl:.0} attempts/s); ratio {ratio:.2}"
    );
    summary(
        "backoff_cpu",
        ratio,
        "<=1.25",
        Some(ratio <= 1.25),
        &format!("t20000={small:.3}cpu-s/s t200000={large:.3}cpu-s/s attempts/s={rs:.0}/{rl:.0}"),
    );
}

criterion_group!(benches, backoff);
criterion_main!(benches);
