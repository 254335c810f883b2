//! `core`: `outbox::core::Engine` operations per second on the fast
//! world's op mix (sim/src/fast.rs: Zipf-skewed stage calls of 1..=8 items,
//! a poll after every input, writes finished mostly written and sometimes
//! failed, panicked, timed out or partly discarded, time moving in small
//! steps and to the engine's timers, an occasional flush or settle), driven
//! directly (not through the checking harness). The baseline moves the very
//! same items the same way (staged into a tenant's queue, cut into the
//! writes the engine cut, dropped when the engine settled them) through a
//! plain `BTreeMap<TenantId, VecDeque<u64>>`. No target: the ratio is what
//! the engine's policy costs over bare queueing.

mod common;

use std::collections::{BTreeMap, VecDeque};
use std::hint::black_box;
use std::time::{Duration, Instant};

use common::{fmt_secs, summary, tenant, Samples};
use criterion::{criterion_group, criterion_main, Criterion};
use outbox::core::{AfterFailure, Config, Engine, Event, Failure, Outcome, Time, Write};
use outbox::TenantId;

const STEPS: u64 = 100_000;
const TENANTS: u64 = 64;
const SAMPLES: usize = 20;

/// xorshift64*: a fixed, dependency-free op stream.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) % n
    }
}

/// One item movement, for the baseline.
enum Move {
    Stage(TenantId, u64),
    Cut(TenantId, usize, u64),
    Done(u64),
}

/// Runs the op mix for `STEPS` steps; returns the engine operations done
/// (inputs, items staged, writes handed out).
fn run_engine(mut record: Option<&mut Vec<Move>>) -> u64 {
    let config = Config::builder()
        .concurrency(8)
        .max_batch(64)
        .linger(Duration::from_millis(1))
        .initial_backoff(Duration::from_millis(5))
        .max_backoff(Duration::from_millis(200))
        .jitter(0.2)
        .write_timeout(Duration::from_secs(1))
        .seed(7)
        .build()
        .unwrap();
    let mut engine: Engine<TenantId, u64> = Engine::new(config).unwrap();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut now = Time::ZERO;
    let mut in_flight: VecDeque<Write<TenantId, u64>> = VecDeque::new();
    let mut item = 0u64;
    let mut ops = 0u64;
    for _ in 0..STEPS {
        match rng.below(100) {
            0..45 => {
                // Zipf-like: low tenants far more often.
                let spread = 1 + rng.below(TENANTS);
                let t = tenant(rng.below(spread));
                let n = 1 + rng.below(8);
                for _ in 0..n {
                    let _ = engine.stage(now, t, item);
                    item += 1;
                }
                ops += n;
                if let Some(r) = record.as_deref_mut() {
                    r.push(Move::Stage(t, n));
                }
            }
            45..80 => {
                if let Some(w) = in_flight.pop_front() {
                    let outcome = match rng.below(100) {
                        0..93 => Outcome::WRITTEN,
                        93..96 => Outcome::Failed(Failure::Error),
                        96..97 => Outcome::Failed(Failure::Panic),
                        97..98 => Outcome::Failed(Failure::Timeout),
                        _ => Outcome::Written { discarded: 1 },
                    };
                    engine.finish(now, w, outcome).unwrap();
                    ops += 1;
                }
            }
            80..97 => {
                now = now + Duration::from_micros(rng.below(2_000));
                engine.handle_timeout(now);
                ops += 1;
            }
            97..99 => {
                if let Some(at) = engine.poll_timeout() {
                    now = now.max(at);
                }
                engine.handle_timeout(now);
                ops += 1;
            }
            _ => {
                let deadline = now + Duration::from_millis(100);
                let _ = if rng.below(2) == 0 {
                    engine.flush(now, deadline)
                } else {
                    engine.settle(now, deadline)
                };
                ops += 1;
            }
        }
        while let Some(w) = engine.poll_write(now) {
            if let Some(r) = record.as_deref_mut() {
                if w.attempt == 1 {
                    r.push(Move::Cut(w.tenant, w.items.len(), w.id.0));
                }
            }
            in_flight.push_back(w);
            ops += 1;
        }
        while let Some(e) = engine.poll_event() {
            if let Some(r) = record.as_deref_mut() {
                match e {
                    Event::Written { id, .. } => r.push(Move::Done(id.0)),
                    Event::AttemptFailed { id, next, .. }
                        if !matches!(next, AfterFailure::RetryIn(_)) =>
                    {
                        r.push(Move::Done(id.0));
                    }
                    _ => {}
                }
            } else {
                black_box(e);
            }
        }
    }
    ops
}

/// The same item movement through a plain map of queues.
fn run_baseline(moves: &[Move]) {
    let mut queues: BTreeMap<TenantId, VecDeque<u64>> = BTreeMap::new();
    let mut writes: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    let mut item = 0u64;
    for m in moves {
        match *m {
            Move::Stage(t, n) => {
                let q = queues.entry(t).or_default();
                for _ in 0..n {
                    q.push_back(item);
                    item += 1;
                }
            }
            Move::Cut(t, n, id) => {
                let q = queues.get_mut(&t).expect("staged before cut");
                writes.insert(id, q.drain(..n).collect());
            }
            Move::Done(id) => {
                black_box(writes.remove(&id));
            }
        }
    }
    black_box((queues, writes));
}

fn core(c: &mut Criterion) {
    let samples = Samples::default();
    let mut moves = Vec::new();
    let ops = run_engine(Some(&mut moves));
    let mut group = c.benchmark_group("core");
    group
        .sample_size(SAMPLES)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(3));
    group.bench_function("btreemap_baseline", |b| {
        samples.iter_custom(b, "btreemap_baseline", |iters| {
            let start = Instant::now();
            for _ in 0..iters {
                run_baseline(&moves);
            }
            start.elapsed()
        });
    });
    group.bench_function("engine", |b| {
        samples.iter_custom(b, "engine", |iters| {
            let start = Instant::now();
            for _ in 0..iters {
                black_box(run_engine(None));
            }
            start.elapsed()
        });
    });
    group.finish();
    let (Some(base), Some(ours)) = (
        samples.median("btreemap_baseline", SAMPLES),
        samples.median("engine", SAMPLES),
    ) else {
        return;
    };
    let ratio = ours / base;
    let per_sec = ops as f64 / ours;
    println!(
        "core: {ops} engine operations ({STEPS} steps) in {}: {:.2} M ops/s; the same item movement through a BTreeMap<K, VecDeque<I>>: {} ({ratio:.2}x)",
        fmt_secs(ours),
        per_sec / 1e6,
        fmt_secs(base)
    );
    summary(
        "core",
        ratio,
        "report",
        None,
        &format!(
            "engine={} baseline={} ops={ops} ops/s={:.2}M",
            fmt_secs(ours),
            fmt_secs(base),
            per_sec / 1e6
        ),
    );
}

criterion_group!(benches, core);
criterion_main!(benches);
