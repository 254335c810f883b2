//! `journal`: what the write-ahead journal costs (D1-D6), in one run:
//!
//! 1. `Outbox::stage` of one item with the journal on vs off (1 thread,
//!    the callers in the runtime's context; target ratio <= 3);
//! 2. sustained journal throughput: 200,000 items staged, then `sync`,
//!    vs writing the same bytes with `write` + `fdatasync` in batches of
//!    the journal's own average group commit (target: journal throughput
//!    >= 0.7x the raw one);
//! 3. recovery: building an outbox on a journal of 1,000,000 pending
//!    items (reported in items per second).
//!
//! The journal lives in a temporary directory on the machine's disk.

mod common;

use std::fs::OpenOptions;
use std::hint::black_box;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::{fmt_secs, runtime, summary, tenant, Counting, Samples};
use criterion::{criterion_group, criterion_main, Criterion};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use outbox::journal::JournalConfig;
use outbox::{Config, Outbox};

const TENANTS: u64 = 1_000;
const SAMPLES: usize = 20;
const SUSTAINED: u64 = 200_000;
const RECOVERY: u64 = 1_000_000;

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("outbox-bench-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn stage(c: &mut Criterion, samples: &Samples) {
    let rt = runtime();
    let mut group = c.benchmark_group("journal");
    group
        .sample_size(SAMPLES)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for on in [false, true] {
        let id = if on { "stage/journal" } else { "stage/memory" };
        let dir = temp("stage");
        group.bench_function(id, |b| {
            let outbox = rt.block_on(async {
                let builder = Outbox::builder(Counting::default()).config(Config::default());
                let builder = if on {
                    builder.journal(JournalConfig::new(&dir))
                } else {
                    builder
                };
                builder.build().unwrap()
            });
            samples.iter_custom(b, id, |iters| {
                let _in = rt.enter();
                let start = Instant::now();
                for i in 0..iters {
                    let _ = outbox.stage(tenant(i % TENANTS), i);
                }
                let d = start.elapsed();
                // Untimed: the writer and the journal catch up.
                let left = rt.block_on(outbox.settle(Duration::from_secs(60))).pending;
                assert_eq!(left, 0);
                d
            });
            rt.block_on(outbox.shutdown(Duration::from_secs(10)));
        });
        let _ = std::fs::remove_dir_all(&dir);
    }
    group.finish();
}

/// An outbox on `journal` that holds every item (its tenants linger an
/// hour for a batch that never fills): everything staged stays pending,
/// so the journal's bytes are all it wrote. Built in a runtime.
fn holding(journal: JournalConfig) -> Outbox<Counting> {
    let config = Config::builder()
        .concurrency(1)
        .linger(Duration::from_secs(3600))
        .max_batch(usize::MAX)
        .build()
        .unwrap();
    Outbox::builder(Counting::default())
        .config(config)
        .journal(journal)
        .build()
        .unwrap()
}

/// Stages `SUSTAINED` items and syncs; returns the time, the journal's
/// bytes written (segment file sizes before cleanup) and its commits.
fn sustained_journal() -> (Duration, u64, u64) {
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let dir = temp("sustained");
    let rt = runtime();
    let (d, bytes) = metrics::with_local_recorder(&recorder, || {
        rt.block_on(async {
            let outbox = holding(JournalConfig::new(&dir).segment_bytes(1 << 30));
            let start = Instant::now();
            for i in 0..SUSTAINED {
                let _ = outbox.stage(tenant(i % TENANTS), i);
            }
            outbox.sync().await.unwrap();
            let d = start.elapsed();
            let bytes: u64 = std::fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap().metadata().unwrap().len())
                .sum();
            outbox.abandon();
            (d, bytes)
        })
    });
    let commits = snap
        .snapshot()
        .into_vec()
        .into_iter()
        .find(|(k, ..)| k.key().name() == "outbox_journal_sync_seconds")
        .map_or(1, |(_, _, _, v)| match v {
            DebugValue::Histogram(h) => h.len() as u64,
            _ => 1,
        });
    drop(rt);
    let _ = std::fs::remove_dir_all(&dir);
    (d, bytes, commits.max(1))
}

/// Writes `bytes` in `batches` equal batches, `write` + `fdatasync` each.
fn sustained_raw(bytes: u64, batches: u64) -> Duration {
    let dir = temp("raw");
    std::fs::create_dir_all(&dir).unwrap();
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("raw"))
        .unwrap();
    let chunk = vec![7u8; (bytes / batches).max(1) as usize];
    let start = Instant::now();
    for _ in 0..batches {
        f.write_all(black_box(&chunk)).unwrap();
        f.sync_data().unwrap();
    }
    let d = start.elapsed();
    let _ = std::fs::remove_dir_all(&dir);
    d
}

/// Builds a journal of `RECOVERY` pending items (an outbox whose writes
/// never start, then dropped with its runtime: a crash after a sync) and
/// times building an outbox on it.
fn recovery() -> (Duration, u64) {
    let dir = temp("recovery");
    {
        let rt = runtime();
        rt.block_on(async {
            let outbox = holding(JournalConfig::new(&dir));
            for i in 0..RECOVERY {
                let _ = outbox.stage(tenant(i % TENANTS), i);
            }
            outbox.sync().await.unwrap();
            std::mem::forget(outbox);
        });
    }
    let rt = runtime();
    let (d, recovered) = rt.block_on(async {
        let start = Instant::now();
        let outbox = Outbox::builder(Counting::default())
            .journal(JournalConfig::new(&dir))
            .build()
            .unwrap();
        let d = start.elapsed();
        let recovered = outbox.counters().recovered;
        outbox.abandon();
        (d, recovered)
    });
    drop(rt);
    let _ = std::fs::remove_dir_all(&dir);
    (d, recovered)
}

fn journal(c: &mut Criterion) {
    let samples = Samples::default();
    stage(c, &samples);
    let mut all_met = true;
    let mut parts = Vec::new();
    let mut stage_ratio = f64::NAN;
    if let (Some(off), Some(on)) = (
        samples.median("stage/memory", SAMPLES),
        samples.median("stage/journal", SAMPLES),
    ) {
        stage_ratio = on / off;
        all_met &= stage_ratio <= 3.0;
        println!(
            "journal stage: on {} / off {} per item = {stage_ratio:.2} (target <= 3)",
            fmt_secs(on),
            fmt_secs(off)
        );
        parts.push(format!(
            "stage on={} off={} ratio={stage_ratio:.2}",
            fmt_secs(on),
            fmt_secs(off)
        ));
    }
    let (jd, bytes, commits) = sustained_journal();
    let rd = sustained_raw(bytes, commits);
    let throughput = rd.as_secs_f64() / jd.as_secs_f64();
    all_met &= throughput >= 0.7;
    println!(
        "journal sustained: {SUSTAINED} items, {bytes} bytes in {commits} commits: journal {} vs raw write+fdatasync {} = {throughput:.2}x (target >= 0.7)",
        fmt_secs(jd.as_secs_f64()),
        fmt_secs(rd.as_secs_f64())
    );
    parts.push(format!(
        "sustained={throughput:.2}x ({:.0} items/s)",
        SUSTAINED as f64 / jd.as_secs_f64()
    ));
    let (rd, recovered) = recovery();
    let rate = recovered as f64 / rd.as_secs_f64();
    println!(
        "journal recovery: {recovered} items in {} = {rate:.0} items/s",
        fmt_secs(rd.as_secs_f64())
    );
    parts.push(format!("recovery={rate:.0} items/s"));
    summary(
        "journal",
        stage_ratio,
        "<=3 and sustained>=0.7",
        Some(all_met),
        &parts.join(" | "),
    );
}

criterion_group!(benches, journal);
criterion_main!(benches);
