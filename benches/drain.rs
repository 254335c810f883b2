//! `drain`: stage 1,000,000 small items over 1, 1,000, 10,000 and 100,000
//! tenants into an outbox whose sink only counts, at concurrency 4 and 64,
//! and wait until `settle` returns 0. Target: the 100,000-tenant
//! time within 2x of the 1-tenant time at both concurrencies (S-C4: the
//! cost per write must not grow with the number of tenants).

mod common;

use std::time::{Duration, Instant};

use common::{fmt_secs, runtime, summary, tenant, Counting, Samples};
use criterion::{criterion_group, criterion_main, Criterion, SamplingMode};
use outbox::{Config, Outbox};
use tokio::runtime::Runtime;

const ITEMS: u64 = 1_000_000;
const TENANTS: [u64; 4] = [1, 1_000, 10_000, 100_000];
const CONCURRENCY: [usize; 2] = [4, 64];
const SAMPLES: usize = 10;

/// One drain: a fresh outbox, `ITEMS` items staged round-robin over
/// `tenants` from the runtime's context while the writer drains, then a
/// settle. Returns the time from the first stage to the settle's answer.
fn drain_once(rt: &Runtime, tenants: u64, concurrency: usize) -> Duration {
    rt.block_on(async {
        let sink = Counting::default();
        let written = sink.written.clone();
        let config = Config::builder().concurrency(concurrency).build().unwrap();
        let outbox = Outbox::new(sink, config).unwrap();
        let start = Instant::now();
        for i in 0..ITEMS {
            let _ = outbox.stage(tenant(i % tenants), i);
        }
        let report = outbox.settle(Duration::from_secs(600)).await;
        let took = start.elapsed();
        assert_eq!(report.pending, 0);
        assert_eq!(written.load(std::sync::atomic::Ordering::Relaxed), ITEMS);
        if std::env::var_os("DRAIN_VERBOSE").is_some() {
            let c = outbox.counters();
            eprintln!(
                "drain c{concurrency} t{tenants}: {} writes in {took:?}",
                c.writes
            );
        }
        outbox.shutdown(Duration::from_secs(10)).await;
        took
    })
}

fn drain(c: &mut Criterion) {
    let samples = Samples::default();
    let rt = runtime();
    let mut group = c.benchmark_group("drain");
    group
        .sample_size(SAMPLES)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(1))
        .measurement_time(Duration::from_secs(3));
    for concurrency in CONCURRENCY {
        for tenants in TENANTS {
            let id = format!("c{concurrency}/t{tenants}");
            group.bench_function(&id, |b| {
                samples.iter_custom(b, &id, |iters| {
                    (0..iters)
                        .map(|_| drain_once(&rt, tenants, concurrency))
                        .sum()
                });
            });
        }
    }
    group.finish();

    let mut met = true;
    let mut worst: f64 = 0.0;
    let mut parts = Vec::new();
    for concurrency in CONCURRENCY {
        let Some(one) = samples.median(&format!("c{concurrency}/t1"), SAMPLES) else {
            continue;
        };
        let mut line = format!("c{concurrency}:");
        for tenants in TENANTS {
            let Some(m) = samples.median(&format!("c{concurrency}/t{tenants}"), SAMPLES) else {
                continue;
            };
            let ratio = m / one;
            println!(
                "drain concurrency {concurrency}, {tenants} tenants: {} ({ratio:.2}x the 1-tenant time)",
                fmt_secs(m)
            );
            line.push_str(&format!(" t{tenants}={}", fmt_secs(m)));
            if tenants == 100_000 {
                worst = worst.max(ratio);
                met &= ratio <= 2.0;
                line.push_str(&format!(" ratio={ratio:.2}"));
            }
        }
        parts.push(line);
    }
    if !parts.is_empty() {
        summary("drain", worst, "<=2.0", Some(met), &parts.join(" | "));
    }
}

criterion_group!(benches, drain);
criterion_main!(benches);
