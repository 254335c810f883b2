//! Every scenario of `docs/scenarios.md`, run through the tokio driver on
//! tokio's paused clock. Rule ids refer to docs/contract.md.

mod support;

use std::time::Duration;

use outbox::{Config, DropReason, ErrorPolicy, LostReason, Outbox, Report, Staged, TenantId};
use support::*;
use tokio::time::Instant;

fn outbox(sink: &TestSink, config: Config) -> Outbox<TestSink> {
    Outbox::new(sink.clone(), config).unwrap()
}

fn default_outbox(sink: &TestSink) -> Outbox<TestSink> {
    outbox(sink, Config::default())
}

fn slices(attempts: &[Attempt]) -> Vec<Vec<u32>> {
    attempts.iter().map(|a| a.items.clone()).collect()
}

/// `d` within one timer tick (1 ms) per timer on the path, never early.
fn assert_near(d: Duration, expected: Duration, ticks: u32) {
    assert!(
        d >= expected && d <= expected + MS * ticks,
        "{d:?} is not {expected:?} (+{ticks} ms)"
    );
}

fn stage_all(o: &Outbox<TestSink>, tenant: TenantId, items: impl IntoIterator<Item = u32>) {
    for i in items {
        assert_eq!(o.stage(tenant, i), Staged::Accepted);
    }
}

// ----- retries, order, isolation and shutdown (scenarios 1-9) -----------

#[tokio::test(start_paused = true)]
async fn scenario_01_failed_write_retried_in_order() {
    let sink = TestSink::new("s01");
    let o = default_outbox(&sink);
    sink.set(t(1), Act::Fail);
    stage_all(&o, t(1), [1, 2]);
    sink.until_attempts(t(1), 2).await;
    stage_all(&o, t(1), [3]);
    sink.set(t(1), Act::Ok); // heal
    let r = o.settle(Duration::from_secs(60)).await;
    assert_eq!(r.pending, 0);
    // S-W5, S-W6: the retry is the identical slice; 3 waits for it.
    assert_eq!(sink.stored(t(1)), [1, 2, 3]);
    assert_eq!(
        slices(&sink.attempts_of(t(1))),
        [vec![1, 2], vec![1, 2], vec![1, 2], vec![3]]
    );
    assert_eq!(o.pending(), 0);
    let c = o.counters();
    assert_eq!((c.written, c.failed_attempts, c.writes), (3, 2, 2));
}

#[tokio::test(start_paused = true)]
async fn scenario_02_identical_retry_slice() {
    let sink = TestSink::new("s02");
    let o = default_outbox(&sink);
    sink.set(t(1), Act::Fail);
    stage_all(&o, t(1), [1, 2]);
    sink.until_attempts(t(1), 1).await;
    stage_all(&o, t(1), [3]);
    sink.until_attempts(t(1), 2).await;
    sink.set(t(1), Act::Ok);
    assert_eq!(o.settle(Duration::from_secs(60)).await.pending, 0);
    let attempts = sink.attempts_of(t(1));
    let (last, before) = attempts.split_last().unwrap();
    // S-W5 / I2: every attempt before the last is exactly [1, 2].
    assert!(before.iter().all(|a| a.items == [1, 2]), "{attempts:?}");
    assert!(before.len() >= 3);
    assert_eq!(last.items, [3]);
    // S-W7 / I7: the retries waited 50 ms, then 100 ms.
    assert_near(before[1].at - before[0].at, 50 * MS, 1);
    assert_near(before[2].at - before[1].at, 100 * MS, 1);
}

#[tokio::test(start_paused = true)]
async fn scenario_03_failing_tenant_does_not_delay_another() {
    let sink = TestSink::new("s03");
    let o = outbox(&sink, Config::builder().concurrency(1).build().unwrap());
    sink.set(t(1), Act::Fail);
    stage_all(&o, t(1), [1]);
    sink.until_attempts(t(1), 1).await;
    let staged_at = Instant::now();
    stage_all(&o, t(2), [2]);
    sink.until(|s| s.stored(t(2)) == [2]).await;
    // S-W8: T2 went at once, before T1's first retry (50 ms).
    assert_eq!(staged_at.elapsed(), Duration::ZERO);
    sink.until_attempts(t(1), 4).await;
    assert_eq!(o.pending(), 1);
    assert!(sink.stored(t(1)).is_empty());
    let t2 = sink.attempts_of(t(2));
    assert_eq!(t2.len(), 1);
    assert!(t2[0].at < sink.attempts_of(t(1))[1].at);
}

#[tokio::test(start_paused = true)]
async fn scenario_04_no_count_limit() {
    // S-W2: unbounded by default.
    let sink = TestSink::new("s04");
    let o = default_outbox(&sink);
    let n = 50_000u32;
    stage_all(&o, t(1), 0..n);
    assert_eq!(o.pending(), u64::from(n));
    let r = o.flush(Duration::from_secs(60)).await;
    assert_eq!(
        r,
        Report {
            written: u64::from(n),
            ..Report::default()
        }
    );
    assert_eq!(sink.stored(t(1)), ids(0..n));
    assert_eq!(o.counters().dropped_total(), 0);
}

#[tokio::test(start_paused = true)]
async fn scenario_05_shutdown_keeps_retrying_until_the_deadline() {
    let sink = TestSink::new("s05");
    let o = default_outbox(&sink);
    sink.set(t(1), Act::Fail);
    stage_all(&o, t(1), [1]);
    let shutdown = o.shutdown(Duration::from_secs(10));
    // S-W9: the fence is up before the future is polled.
    assert!(o.is_shutting_down());
    sink.until_attempts(t(1), 2).await;
    sink.set(t(1), Act::Ok);
    let r = shutdown.await;
    assert!(r.first);
    assert_eq!(
        r.report(),
        Report {
            written: 1,
            ..Report::default()
        }
    );
    assert!(r.unwritten.is_empty());
    assert_eq!(sink.stored(t(1)), [1]);
    assert_eq!(o.stage(t(1), 2), Staged::ShuttingDown);
    assert_eq!(o.pending(), 0);
    assert_eq!(o.counters().lost(LostReason::Shutdown), 1);
}

#[test]
fn scenario_06_shutdown_counts_what_is_unwritten_at_the_deadline() {
    let (counters, snap) = with_metrics(|| async {
        let sink = TestSink::new("s06");
        let o = default_outbox(&sink);
        sink.set(t(1), Act::Fail);
        sink.set(t(2), Act::Hang);
        stage_all(&o, t(1), [1, 2]);
        stage_all(&o, t(2), [3]);
        let start = Instant::now();
        let r = o.shutdown(200 * MS).await;
        assert_near(start.elapsed(), 200 * MS, 1);
        assert_eq!(
            r.report(),
            Report {
                lost: 3,
                deadline_passed: true,
                ..Report::default()
            }
        );
        // S-B6: the dead letters, in staging order.
        assert_eq!(r.unwritten, [(t(1), vec![1, 2]), (t(2), vec![3])]);
        assert!(sink.store().is_empty(), "nothing written");
        assert_eq!(o.pending(), 0);
        o.counters()
    });
    assert_eq!(counters.lost(LostReason::Deadline), 3);
    assert_eq!(counters.lost_total(), 3);
    let m = snapshot(&snap);
    assert_metrics_match(&m, "s06", &counters); // gauge 0, lost 3
}

/// Scenarios 7, 8 and 19: a first write that panics (or whose error
/// panics in `Display`) is a failed attempt, retried; the writer survives.
fn panicking_first_write(act: Act, name: &str) {
    let (counters, snap) = with_metrics(|| async {
        let sink = TestSink::new(name);
        let o = default_outbox(&sink);
        sink.script(t(1), [act]);
        stage_all(&o, t(1), [1]);
        sink.until_attempts(t(1), 1).await;
        stage_all(&o, t(1), [2]);
        let r = o.flush(Duration::from_secs(10)).await;
        assert_eq!((r.written, r.pending, r.lost), (2, 0, 0));
        assert_eq!(sink.stored(t(1)), [1, 2]);
        // S-W5: the retry carried exactly the slice that panicked.
        assert_eq!(slices(&sink.attempts_of(t(1))), [vec![1], vec![1], vec![2]]);
        o.counters()
    });
    assert_eq!(counters.failed_attempts, 1);
    // S-W5: a panic creating or polling the write, or rendering its
    // error, fails the attempt as a panic, not as the error it carried.
    assert_eq!(counters.failed(outbox::core::Failure::Panic), 1, "{name}");
    assert_eq!(counters.lost_total(), 0);
    let m = snapshot(&snap);
    assert_metrics_match(&m, name, &counters);
    assert_eq!(latency_samples(&m, name), 3, "one per attempt");
}

#[test]
fn scenario_07_panicking_write_is_retried() {
    panicking_first_write(Act::Panic, "s07-poll");
    panicking_first_write(Act::PanicCreate, "s07-create");
}

#[test]
fn scenario_08_sink_error_whose_display_panics() {
    panicking_first_write(Act::PanicDisplay, "s08");
}

#[tokio::test(start_paused = true)]
async fn scenario_09_shutdown_fences_admission() {
    let sink = TestSink::new("s09");
    let o = default_outbox(&sink);
    sink.script(t(1), [Act::Hang]);
    stage_all(&o, t(1), [1]);
    sink.until_attempts(t(1), 1).await;
    stage_all(&o, t(1), [2]);
    let shutdown = o.shutdown(Duration::from_secs(10));
    // S-W9: refused and counted lost at once.
    assert_eq!(o.stage(t(1), 3), Staged::ShuttingDown);
    assert_eq!(o.counters().lost(LostReason::Shutdown), 1);
    assert_eq!(o.pending(), 2);
    sink.release();
    let r = shutdown.await;
    assert_eq!(
        r.report(),
        Report {
            written: 2,
            ..Report::default()
        }
    );
    assert_eq!(sink.stored(t(1)), [1, 2]);
    assert_eq!(o.pending(), 0);
}

// ----- batching and bounded mode (scenarios 10-15) -----------------------

#[tokio::test(start_paused = true)]
async fn scenario_10_batches_not_one_by_one() {
    let sink = TestSink::new("s10");
    let config = Config::builder()
        .capacity(64)
        .max_batch(8)
        .linger(5 * MS)
        .build()
        .unwrap();
    let o = outbox(&sink, config);
    stage_all(&o, t(1), 0..8);
    let r = o.settle(Duration::from_secs(1)).await;
    assert_eq!((r.written, r.dropped), (8, 0));
    // S-W4, S-A3: one full batch, sent at once, not after the linger.
    let a = sink.attempts();
    assert_eq!(slices(&a), [ids(0..8)]);
    assert_eq!(a[0].at, Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn scenario_11_partial_batch_goes_on_the_linger() {
    let sink = TestSink::new("s11");
    let config = Config::builder()
        .max_batch(500)
        .linger(20 * MS)
        .build()
        .unwrap();
    let o = outbox(&sink, config);
    stage_all(&o, t(1), [1]);
    // S-W10: settle does not cut the linger short.
    let r = o.settle(Duration::from_secs(1)).await;
    assert_eq!(r.written, 1);
    let a = sink.attempts();
    assert_eq!(slices(&a), [vec![1]]);
    assert_near(a[0].at, 20 * MS, 1);
}

#[tokio::test(start_paused = true)]
async fn scenario_12_stalled_sink_drops_instead_of_blocking() {
    let sink = TestSink::new("s12");
    sink.set_all(Act::Hang);
    let config = Config::builder().capacity(4).max_batch(1).build().unwrap();
    let o = outbox(&sink, config);
    // S-A1: `stage` never waits; it is a plain function, so that holds by
    // its type. What can fail is what it decides while the sink hangs.
    let staged: Vec<Staged> = (0..32).map(|i| o.stage(t(1), i)).collect();
    sink.until_attempts(t(1), 1).await;
    // More while the sink is blocked and the writer has run.
    let more: Vec<Staged> = (32..40).map(|i| o.stage(t(1), i)).collect();
    assert_eq!(&staged[..4], [Staged::Accepted; 4]);
    assert!(staged[4..]
        .iter()
        .chain(&more)
        .all(|s| *s == Staged::Dropped(DropReason::BufferFull)));
    let c = o.counters();
    assert_eq!(c.dropped(DropReason::BufferFull), 36);
    assert_eq!(c.pending, 4);
    assert!(sink.store().is_empty(), "nothing written yet");
    assert!(c.balanced());
    let r = o.shutdown(100 * MS).await;
    assert_eq!(r.lost, 4);
}

#[tokio::test(start_paused = true)]
async fn scenario_13_flush_writes_a_partial_batch_early() {
    let sink = TestSink::new("s13");
    let config = Config::builder()
        .linger(Duration::from_secs(60))
        .build()
        .unwrap();
    let o = outbox(&sink, config);
    stage_all(&o, t(1), [1, 2]);
    let start = Instant::now();
    let r = o.flush(Duration::from_secs(1)).await;
    // S-A4: at once, not after the linger.
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(
        r,
        Report {
            written: 2,
            ..Report::default()
        }
    );
    assert_eq!(sink.stored(t(1)), [1, 2]);
}

#[tokio::test(start_paused = true)]
async fn scenario_14_flush_on_a_failing_sink_drop_policy() {
    let sink = TestSink::new("s14");
    sink.set_all(Act::Fail);
    let config = Config::builder()
        .error_policy(ErrorPolicy::Drop)
        .build()
        .unwrap();
    let o = outbox(&sink, config);
    stage_all(&o, t(1), [1]);
    let r = o.flush(Duration::from_secs(1)).await;
    // S-A5: dropped under sink_error, not retried.
    assert_eq!(
        r,
        Report {
            dropped: 1,
            ..Report::default()
        }
    );
    assert_eq!(o.counters().dropped(DropReason::SinkError), 1);
    assert_eq!(sink.attempts().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn scenario_15_abandon_counts_every_queued_item() {
    let sink = TestSink::new("s15");
    let weak = sink.weak();
    let o = default_outbox(&sink);
    sink.set(t(1), Act::Hang);
    sink.set(t(2), Act::Fail);
    stage_all(&o, t(1), [1]);
    stage_all(&o, t(2), [2, 3]);
    sink.until(|s| s.attempts().len() >= 2).await;
    stage_all(&o, t(2), [4]); // waits behind the backing-off retry
    let flush = o.flush(Duration::from_secs(60));
    // S-A7: everything pending is lost at once; held items come back.
    let held = o.abandon();
    assert_eq!(held, [(t(2), vec![2, 3]), (t(2), vec![4])]);
    let c = o.counters();
    assert_eq!(c.lost(LostReason::Abandoned), 4);
    assert_eq!(c.pending, 0);
    assert_eq!(
        flush.await,
        Report {
            lost: 4,
            ..Report::default()
        }
    );
    assert_eq!(o.stage(t(3), 5), Staged::ShuttingDown);
    let r = o.shutdown(Duration::from_secs(1)).await;
    assert_eq!(r.report(), Report::default(), "nothing left to report");
    assert!(sink.store().is_empty());
    // The hung write was cancelled: the writer exits once the handle goes.
    drop(o);
    drop(sink);
    until_dead(&weak).await;
}

// ----- failures seen in other systems ------------------------------------

#[tokio::test(start_paused = true)]
async fn scenario_16_shutdown_deadline_with_a_hung_in_flight_write() {
    let sink = TestSink::new("s16");
    sink.set_all(Act::Hang);
    let o = default_outbox(&sink);
    stage_all(&o, t(1), [1]);
    let start = Instant::now();
    let r = o.shutdown(500 * MS).await;
    // S-W15: the deadline bounds the wait for an in-flight write.
    assert_near(start.elapsed(), 500 * MS, 1);
    assert_eq!(
        r.report(),
        Report {
            lost: 1,
            deadline_passed: true,
            ..Report::default()
        }
    );
    assert_eq!(r.unwritten, [(t(1), vec![1])]);
    assert_eq!(o.pending(), 0);
}

#[tokio::test(start_paused = true)]
async fn scenario_17_reordering_on_retry() {
    let sink = TestSink::new("s17");
    let o = default_outbox(&sink);
    sink.script(t(1), [Act::Fail]);
    stage_all(&o, t(1), [1, 2]); // batch A
    sink.until_attempts(t(1), 1).await;
    stage_all(&o, t(1), [3]); // batch B, during A's backoff
    assert_eq!(o.settle(Duration::from_secs(1)).await.pending, 0);
    let a = sink.attempts_of(t(1));
    assert_eq!(slices(&a), [vec![1, 2], vec![1, 2], vec![3]]);
    // S-W6 / I7: B started only after A's retry, which waited its backoff.
    assert_near(a[1].at - a[0].at, 50 * MS, 1);
    assert!(a[2].at >= a[1].at);
    assert_eq!(sink.stored(t(1)), [1, 2, 3]);
}

#[tokio::test(start_paused = true)]
async fn scenario_18_unknown_outcome() {
    let sink = TestSink::new("s18");
    let config = Config::builder()
        .write_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let o = outbox(&sink, config);
    sink.script(t(1), [Act::CommitThenHang]);
    stage_all(&o, t(1), [1, 2]);
    assert_eq!(o.settle(Duration::from_secs(10)).await.pending, 0);
    let a = sink.attempts_of(t(1));
    // S-W5, S-B3: the retry after the timeout carries the same slice...
    assert_eq!(slices(&a), [vec![1, 2], vec![1, 2]]);
    assert_near(a[1].at, Duration::from_secs(1) + 50 * MS, 2);
    // ...so the idempotent store keeps one copy.
    assert_eq!(sink.stored(t(1)), [1, 2]);
    let c = o.counters();
    assert_eq!((c.written, c.failed_attempts), (2, 1));
}

#[tokio::test(start_paused = true)]
async fn scenario_19_exporter_panic_must_not_kill_the_worker() {
    let sink = TestSink::new("s19");
    let o = default_outbox(&sink);
    sink.script(t(1), [Act::Panic]);
    stage_all(&o, t(1), [0]);
    sink.until_attempts(t(1), 1).await;
    for i in 1..100u32 {
        let _ = o.stage(t(u128::from(i % 7)), i);
    }
    let r = o.flush(Duration::from_secs(10)).await;
    assert_eq!((r.written, r.pending), (100, 0));
    let total: usize = sink.store().values().map(Vec::len).sum();
    assert_eq!(total, 100);
    for (tenant, items) in sink.store() {
        assert!(items.windows(2).all(|w| w[0] < w[1]), "{tenant}: {items:?}");
    }
    assert_eq!(o.counters().failed_attempts, 1);
}

#[tokio::test(start_paused = true)]
async fn scenario_20_eager_batches_under_load() {
    let sink = TestSink::new("s20");
    let config = Config::builder()
        .capacity(2_048)
        .max_batch(512)
        .linger(Duration::from_secs(5))
        .build()
        .unwrap();
    let o = outbox(&sink, config);
    for chunk in 0..(10_000 / 250) {
        for i in 0..250 {
            let _ = o.stage(t(1), chunk * 250 + i);
        }
        tokio::task::yield_now().await;
    }
    let r = o.settle(Duration::from_secs(30)).await;
    assert_eq!(r.pending, 0);
    let c = o.counters();
    assert_eq!(c.written + c.dropped_total(), 10_000);
    let a = sink.attempts();
    let (last, full) = a.split_last().unwrap();
    // S-A3: full batches go at once, not one per linger.
    for w in full {
        assert_eq!(w.items.len(), 512);
        assert_eq!(w.at, Duration::ZERO);
    }
    assert!(last.items.len() <= 512);
    assert!(
        full.len() >= 10_000 / 512 - 1,
        "{} full batches",
        full.len()
    );
    // Staging order kept.
    let stored = sink.stored(t(1));
    assert!(stored.windows(2).all(|w| w[0] < w[1]));
}

#[tokio::test(start_paused = true)]
async fn scenario_21_one_tenants_flood_vs_anothers_trickle() {
    let sink = TestSink::new("s21");
    sink.set(t(1), Act::Fail);
    let config = Config::builder().tenant_capacity(10).build().unwrap();
    let o = outbox(&sink, config);
    let mut others = Vec::new();
    for i in 0..200u32 {
        let _ = o.stage(t(1), i);
        if i % 10 == 0 {
            let tenant = t(2 + u128::from(i / 10 % 4));
            others.push(o.stage(tenant, 1_000 + i));
        }
        tokio::task::yield_now().await;
    }
    // S-B7: T1 fills its own quota only.
    assert!(others.iter().all(|s| *s == Staged::Accepted));
    let c = o.counters();
    assert_eq!(c.dropped(DropReason::TenantFull), 190);
    assert_eq!(c.dropped(DropReason::BufferFull), 0);
    let r = o.settle(Duration::from_secs(1)).await;
    assert_eq!(r.pending, 10, "only T1's quota is left");
    for n in 2..=5 {
        assert_eq!(sink.stored(t(n)).len(), 5);
    }
}

#[tokio::test(start_paused = true)]
async fn scenario_22_concurrency_slots_are_not_held_by_waiting_tenants() {
    for concurrency in [5, 1] {
        let sink = TestSink::new("s22");
        sink.set(t(1), Act::Slow(100 * MS));
        let config = Config::builder()
            .concurrency(concurrency)
            .max_batch(1)
            .build()
            .unwrap();
        let o = outbox(&sink, config);
        stage_all(&o, t(1), 0..20);
        sink.until_attempts(t(1), 1).await;
        let staged_at = Instant::now();
        stage_all(&o, t(2), [100]);
        sink.until_attempts(t(2), 1).await;
        let waited = staged_at.elapsed();
        // S-W3, S-W8, S-B1: T1 holds one slot at most; with one slot in
        // all, T2 waits for T1's write in flight and no more.
        if concurrency == 5 {
            assert_eq!(waited, Duration::ZERO);
        } else {
            assert_near(waited, 100 * MS, 1);
            let order: Vec<TenantId> = sink.attempts().iter().map(|a| a.tenant).collect();
            assert_eq!(order[..2], [t(1), t(2)], "T2 went before T1's next batch");
        }
        let _ = o.abandon();
    }
}

#[test]
fn scenario_23_every_drop_path_is_counted() {
    let ((a, b), snap) = with_metrics(|| async {
        // Outbox A: capacity, terminal, retries exhausted, deadline, late
        // stage, discarded. Outbox B: the drop policy.
        let sink = TestSink::new("s23a");
        sink.set(t(1), Act::Terminal);
        sink.set(t(2), Act::Fail);
        sink.set(t(3), Act::Hang);
        sink.set(t(4), Act::Discard(1));
        let config = Config::builder()
            .capacity(8)
            .max_attempts(2)
            .build()
            .unwrap();
        let o = outbox(&sink, config);
        let sink_b = TestSink::new("s23b");
        sink_b.set_all(Act::Fail);
        let config_b = Config::builder()
            .error_policy(ErrorPolicy::Drop)
            .build()
            .unwrap();
        let ob = outbox(&sink_b, config_b);
        let check = |o: &Outbox<TestSink>| {
            // S-W14: accepted = written + pending + lost + dropped.
            let c = o.counters();
            assert!(c.balanced(), "{c:?}");
        };
        for (n, tenant) in (0..).zip([1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3]) {
            let _ = o.stage(t(tenant), n);
            let _ = ob.stage(t(tenant), n);
            check(&o);
            check(&ob);
        }
        for _ in 0..3 {
            tokio::task::yield_now().await;
            check(&o);
            check(&ob);
        }
        let _ = o.settle(Duration::from_secs(1)).await;
        check(&o);
        let _ = ob.flush(Duration::from_secs(1)).await;
        check(&ob);
        let pending_at_fence = o.pending();
        let r = o.shutdown(Duration::from_secs(1)).await;
        check(&o);
        let r = r.report();
        assert_eq!(r.written + r.dropped + r.lost + r.pending, pending_at_fence);
        assert_eq!(o.stage(t(5), 99), Staged::ShuttingDown);
        check(&o);
        (o.counters(), ob.counters())
    });
    // Every path was taken.
    assert!(a.dropped(DropReason::BufferFull) > 0);
    assert!(a.lost(LostReason::Terminal) > 0);
    assert!(a.lost(LostReason::RetriesExhausted) > 0);
    assert!(a.lost(LostReason::Deadline) > 0);
    assert_eq!(a.lost(LostReason::Shutdown), 1);
    assert!(a.lost(LostReason::Discarded) > 0);
    assert_eq!(b.dropped(DropReason::SinkError), 11);
    let m = snapshot(&snap);
    assert_metrics_match(&m, "s23a", &a);
    assert_metrics_match(&m, "s23b", &b);
}

#[tokio::test(start_paused = true)]
async fn scenario_24_shutdown_with_every_tenant_in_backoff() {
    let sink = TestSink::new("s24");
    sink.set_all(Act::Fail);
    let config = Config::builder()
        .initial_backoff(Duration::from_secs(1))
        .max_backoff(Duration::from_secs(60))
        .build()
        .unwrap();
    let o = outbox(&sink, config);
    let mut n = 0;
    for tenant in 1..=5u128 {
        for _ in 0..tenant {
            let _ = o.stage(t(tenant), n);
            n += 1;
        }
    }
    sink.until(|s| s.attempts().len() >= 5).await;
    let start = Instant::now();
    let r = o.shutdown(Duration::from_secs(2)).await;
    // S-W15: a backoff does not hold the shutdown past its deadline.
    assert_near(start.elapsed(), Duration::from_secs(2), 1);
    assert_eq!(r.lost, 15);
    assert_eq!(o.counters().lost(LostReason::Deadline), 15);
    let dead: usize = r.unwritten.iter().map(|r| r.items.len()).sum();
    assert_eq!(dead, 15);
    assert_eq!(o.pending(), 0);
}

#[tokio::test(start_paused = true)]
async fn scenario_25_retries_exhausted() {
    let sink = TestSink::new("s25");
    sink.set_all(Act::Fail);
    let config = Config::builder().max_attempts(3).build().unwrap();
    let o = outbox(&sink, config);
    stage_all(&o, t(1), 0..4);
    let r = o.settle(Duration::from_secs(60)).await;
    // S-B2: lost by exactly the batch size.
    assert_eq!(
        r,
        Report {
            lost: 4,
            ..Report::default()
        }
    );
    let c = o.counters();
    assert_eq!(c.lost(LostReason::RetriesExhausted), 4);
    assert_eq!(c.lost_total(), 4);
    assert_eq!(c.failed_attempts, 3);
    assert_eq!(slices(&sink.attempts()), vec![ids(0..4); 3]);
}

#[tokio::test(start_paused = true)]
async fn scenario_26_periodic_flush_under_load() {
    let sink = TestSink::new("s26");
    sink.set_all(Act::Slow(200 * MS));
    let o = default_outbox(&sink);
    let mut flushes = Vec::new();
    let mut n = 0u32;
    // 20 periods of load, then 20 of flushes alone while the sink catches up.
    for period in 0..40 {
        if period < 20 {
            for tenant in 1..=3 {
                let _ = o.stage(t(tenant), n);
                n += 1;
            }
        }
        let pending_at_call = o.pending();
        let staged_before = n;
        let answer = o.flush(100 * MS);
        let start = Instant::now();
        let s = sink.clone();
        flushes.push(tokio::spawn(async move {
            let r = answer.await;
            let stored: usize = s.store().values().map(Vec::len).sum();
            (r, start.elapsed(), pending_at_call, staged_before, stored)
        }));
        tokio::time::sleep(50 * MS).await; // the workload's period
    }
    let (mut finished, mut late) = (0, 0);
    for f in flushes {
        let (r, took, pending_at_call, staged_before, stored) = f.await.unwrap();
        // S-A4, S-W15: by its deadline, and truthful.
        assert!(took <= 100 * MS + MS, "{took:?}");
        assert_eq!(r.written + r.dropped + r.lost + r.pending, pending_at_call);
        if r.deadline_passed {
            late += 1;
            assert!(r.pending > 0 && took >= 100 * MS, "{r:?}");
        } else {
            finished += 1;
            assert_eq!(r.pending, 0);
            assert!(
                stored >= staged_before as usize,
                "{r:?}: {stored} < {staged_before}"
            );
        }
    }
    assert_eq!(o.settle(Duration::from_secs(10)).await.pending, 0);
    assert_eq!(sink.store().values().map(Vec::len).sum::<usize>(), 60);
    // Under load no flush can finish in 100 ms (each write takes 200 ms);
    // once the load stops they do. Both answers were checked above.
    assert!(finished > 0 && late > 0, "{finished} finished, {late} late");
}

#[tokio::test(start_paused = true)]
async fn scenario_27_write_timeout() {
    let sink = TestSink::new("s27");
    let weak = sink.weak();
    sink.script(t(1), [Act::Slow(Duration::from_secs(35))]);
    let config = Config::builder()
        .write_timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let o = outbox(&sink, config);
    stage_all(&o, t(1), [1, 2]);
    assert_eq!(o.settle(Duration::from_secs(120)).await.pending, 0);
    let a = sink.attempts_of(t(1));
    // S-B3: cancelled at 30 s, retried (after 50 ms) with the same slice.
    assert_eq!(slices(&a), [vec![1, 2], vec![1, 2]]);
    assert_near(a[1].at, Duration::from_secs(30) + 50 * MS, 2);
    assert_eq!(sink.stored(t(1)), [1, 2]);
    assert_eq!(o.counters().failed_attempts, 1);
    // The timed-out write's future was dropped at 30 s, not leaked with
    // the sink it holds: once the outbox and the sink are gone, nothing
    // holds the sink.
    let _ = o.shutdown(Duration::from_secs(1)).await;
    drop(o);
    drop(sink);
    until_dead(&weak).await;
}

#[tokio::test(start_paused = true)]
async fn scenario_28_backoff_cap() {
    for jitter in [0.0, 0.5] {
        let sink = TestSink::new("s28");
        sink.script(t(1), [Act::Fail; 14]);
        let config = Config::builder().jitter(jitter).seed(7).build().unwrap();
        let o = outbox(&sink, config);
        stage_all(&o, t(1), [1]);
        assert_eq!(o.settle(Duration::from_secs(120)).await.pending, 0);
        let a = sink.attempts_of(t(1));
        assert_eq!(a.len(), 15);
        let mut base = 50 * MS;
        for w in a.windows(2) {
            let gap = w[1].at - w[0].at;
            // S-W7: 50 ms doubling, capped at 5 s; jitter only shortens.
            assert!(gap <= Duration::from_secs(5) + MS, "{gap:?}");
            if jitter == 0.0 {
                assert_near(gap, base, 1);
            } else {
                assert!(gap >= base / 2 && gap <= base + MS, "{gap:?} vs {base:?}");
            }
            base = (base * 2).min(Duration::from_secs(5));
        }
    }
}

async fn until_dead<T>(weak: &std::sync::Weak<T>) {
    for _ in 0..10_000 {
        if weak.strong_count() == 0 {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("the writer still holds the sink");
}

// ----- variants of the scenarios in other shapes -------------------------------

const SEC: Duration = Duration::from_secs(1);

/// Scenario 20 with truly fast staging (no yield between stages): the
/// capacity fills, the rest is dropped, and the full batches still go at
/// once, not one per 5 s linger.
#[tokio::test(start_paused = true)]
async fn scenario_20_staged_without_a_yield_fills_the_capacity_and_full_batches_still_go_at_once() {
    let sink = TestSink::new("rv-s20a");
    let config = Config::builder()
        .capacity(2_048)
        .max_batch(512)
        .linger(5 * SEC)
        .build()
        .unwrap();
    let o = Outbox::new(sink.clone(), config).unwrap();
    for i in 0..10_000 {
        let _ = o.stage(t(1), i);
    }
    let start = Instant::now();
    let r = o.settle(30 * SEC).await;
    assert_eq!(r.pending, 0);
    let c = o.counters();
    assert_eq!(c.written + c.dropped_total(), 10_000, "{c:?}");
    assert_eq!(c.dropped(DropReason::BufferFull), 10_000 - 2_048);
    assert_eq!(
        start.elapsed(),
        Duration::ZERO,
        "a full batch waited for the linger"
    );
    for a in sink.attempts() {
        assert_eq!(a.items.len(), 512);
        assert_eq!(a.at, Duration::ZERO);
    }
}

/// Scenario 20 with a yield every 100 stages: partial batches may wait
/// for the linger, but every full batch goes at once; staging order kept.
#[tokio::test(start_paused = true)]
async fn scenario_20_staged_in_chunks_sends_full_batches_at_once_and_one_partial_at_most() {
    let sink = TestSink::new("rv-s20b");
    let config = Config::builder()
        .capacity(2_048)
        .max_batch(512)
        .linger(5 * SEC)
        .build()
        .unwrap();
    let o = Outbox::new(sink.clone(), config).unwrap();
    for chunk in 0..100u32 {
        for i in 0..100 {
            let _ = o.stage(t(1), chunk * 100 + i);
        }
        tokio::task::yield_now().await;
    }
    let r = o.settle(30 * SEC).await;
    assert_eq!(r.pending, 0);
    let c = o.counters();
    assert_eq!(c.written + c.dropped_total(), 10_000);
    let a = sink.attempts();
    let full: Vec<_> = a.iter().filter(|w| w.items.len() == 512).collect();
    let partial: Vec<_> = a.iter().filter(|w| w.items.len() != 512).collect();
    assert!(full.iter().all(|w| w.at == Duration::ZERO));
    assert!(partial.len() <= 1, "more than the last batch was partial");
    let stored = sink.stored(t(1));
    assert!(stored.windows(2).all(|w| w[0] < w[1]));
}

/// Scenario 25 step by step: max_batch 2, max_attempts 3, five items.
/// Each exhausted batch grows the lost counter by exactly its size, at the
/// moment its third attempt fails.
#[tokio::test(start_paused = true)]
async fn scenario_25_lost_grows_by_exactly_each_batch_at_its_last_attempt() {
    let sink = TestSink::new("rv-s25");
    sink.set_all(Act::Fail);
    let config = Config::builder()
        .max_attempts(3)
        .max_batch(2)
        .build()
        .unwrap();
    let o = Outbox::new(sink.clone(), config).unwrap();
    for i in 0..5 {
        assert_eq!(o.stage(t(1), i), Staged::Accepted);
    }
    let mut seen = Vec::new();
    for n in [3usize, 6, 9] {
        sink.until_attempts(t(1), n).await;
        // The failure is joined by the writer after the attempt's record.
        tokio::task::yield_now().await;
        let _ = o.flush(Duration::ZERO).await;
        seen.push(o.counters().lost(LostReason::RetriesExhausted));
    }
    let _ = o.settle(10 * SEC).await;
    assert_eq!(seen, [2, 4, 5], "lost after each batch's third failure");
    let slices: Vec<Vec<u32>> = sink.attempts().iter().map(|a| a.items.clone()).collect();
    assert_eq!(
        slices,
        [
            vec![0, 1],
            vec![0, 1],
            vec![0, 1],
            vec![2, 3],
            vec![2, 3],
            vec![2, 3],
            vec![4],
            vec![4],
            vec![4]
        ]
    );
}

/// Scenario 17 with B staged right after A's first failure and a longer
/// backoff: B never starts while A waits, and B is never merged into A's
/// retry (the retry is the identical slice).
#[tokio::test(start_paused = true)]
async fn scenario_17_a_flush_during_the_backoff_starts_nothing_and_b_waits_for_a() {
    let sink = TestSink::new("rv-s17");
    sink.script(t(1), [Act::Fail, Act::Fail]);
    let config = Config::builder()
        .initial_backoff(SEC)
        .max_backoff(10 * SEC)
        .concurrency(8)
        .build()
        .unwrap();
    let o = Outbox::new(sink.clone(), config).unwrap();
    assert_eq!(o.stage(t(1), 1), Staged::Accepted);
    sink.until_attempts(t(1), 1).await;
    for i in 2..10 {
        assert_eq!(o.stage(t(1), i), Staged::Accepted);
    }
    // A flush during the backoff must not start B either (S-W6).
    let f = o.flush(SEC / 2).await;
    assert!(f.deadline_passed);
    assert_eq!(
        sink.attempts_of(t(1)).len(),
        1,
        "something started during the backoff"
    );
    assert_eq!(o.settle(60 * SEC).await.pending, 0);
    let a = sink.attempts_of(t(1));
    let slices: Vec<Vec<u32>> = a.iter().map(|a| a.items.clone()).collect();
    assert_eq!(
        slices,
        [vec![1], vec![1], vec![1], (2..10).collect::<Vec<_>>()]
    );
    assert_eq!(sink.stored(t(1)), (1..10).collect::<Vec<_>>());
}

/// Scenario 21 with a global capacity as well: T1 failing fills its own
/// quota; the global buffer keeps room for T2..T5, who never see a drop.
#[tokio::test(start_paused = true)]
async fn scenario_21_with_a_global_capacity_too_the_trickle_sees_no_drop() {
    let sink = TestSink::new("rv-s21");
    sink.set(t(1), Act::Fail);
    let config = Config::builder()
        .tenant_capacity(10)
        .capacity(20)
        .build()
        .unwrap();
    let o = Outbox::new(sink.clone(), config).unwrap();
    let mut others = Vec::new();
    for i in 0..500u32 {
        let _ = o.stage(t(1), i);
        if i % 5 == 0 {
            others.push(o.stage(t(2 + u128::from(i / 5 % 4)), i));
        }
        if i % 50 == 0 {
            tokio::task::yield_now().await;
        }
    }
    let dropped = others.iter().filter(|s| **s != Staged::Accepted).count();
    let c = o.counters();
    assert_eq!(dropped, 0, "T2..T5 dropped {dropped}: {c:?}");
    let _ = o.abandon();
}

/// Scenario 9 with `stage_many` and `try_stage` at the fence.
#[tokio::test(start_paused = true)]
async fn scenario_09_the_fence_holds_for_stage_many_and_try_stage() {
    let sink = TestSink::new("rv-s09");
    sink.script(t(1), [Act::Hang]);
    let o = Outbox::new(sink.clone(), Config::default()).unwrap();
    assert_eq!(o.stage(t(1), 1), Staged::Accepted);
    sink.until_attempts(t(1), 1).await;
    assert_eq!(o.stage(t(1), 2), Staged::Accepted);
    let shutdown = o.shutdown(10 * SEC);
    let tally = o.stage_many([(t(1), 3), (t(2), 4)]);
    assert_eq!(tally.shutting_down, 2, "{tally:?}");
    assert!(o.try_stage(t(1), 5).is_err());
    assert_eq!(
        o.counters().lost(LostReason::Shutdown),
        2,
        "try_stage is uncounted"
    );
    assert_eq!(o.pending(), 2);
    sink.release();
    let r = shutdown.await;
    assert_eq!((r.written, r.lost), (2, 0), "{:?}", r.report());
    assert_eq!(sink.stored(t(1)), [1, 2]);
}

/// Scenario 16 through the drop path (S-W16): every handle dropped with a
/// hung write; the writer gives up at drop_timeout and releases the sink.
#[tokio::test(start_paused = true)]
async fn scenario_16_dropped_handles_give_a_hung_write_up_at_drop_timeout() {
    let sink = TestSink::new("rv-s16");
    sink.set_all(Act::Hang);
    let weak = sink.weak();
    let o = Outbox::builder(sink.clone())
        .drop_timeout(500 * MS)
        .build()
        .unwrap();
    assert_eq!(o.stage(t(1), 1), Staged::Accepted);
    let closed = o.closed();
    let start = Instant::now();
    drop(o);
    closed.await;
    let took = start.elapsed();
    assert!(took >= 500 * MS && took <= 502 * MS, "{took:?}");
    drop(sink);
    assert_eq!(weak.strong_count(), 0, "the writer still holds the sink");
}

/// S-W8 with the optional breaker on: T1 alone fails and opens the
/// sink-wide breaker; healthy T2 waits for the next probe, no longer (the
/// exception S-W8 states).
#[tokio::test(start_paused = true)]
async fn scenario_03_with_the_breaker_open_a_healthy_tenant_waits_for_the_probe() {
    let sink = TestSink::new("rv-s03b");
    sink.set(t(1), Act::Fail);
    let config = Config::builder()
        .breaker(
            outbox::BreakerConfig::new()
                .failures(3)
                .probe_interval(5 * SEC)
                .max_probe_interval(60 * SEC),
        )
        .build()
        .unwrap();
    let o = Outbox::new(sink.clone(), config).unwrap();
    assert_eq!(o.stage(t(1), 1), Staged::Accepted);
    sink.until_attempts(t(1), 3).await;
    tokio::task::yield_now().await;
    let staged_at = Instant::now();
    assert_eq!(o.stage(t(2), 2), Staged::Accepted);
    sink.until(|s| s.stored(t(2)) == [2]).await;
    // S-W8's exception (S-R1): the open breaker holds every tenant until
    // its probe, at most one probe interval; T2 is the probe.
    let waited = staged_at.elapsed();
    assert!(
        waited > Duration::ZERO && waited <= 5 * SEC,
        "T2 waited {waited:?}"
    );
    let _ = o.abandon();
}

/// Scenario 13 with a zero timeout: flush(0) answers at once (deadline
/// passed), but it still sends the lingering batch at once (S-A4); the
/// items must not wait for the 60 s linger.
#[tokio::test(start_paused = true)]
async fn scenario_13_a_flush_with_a_zero_timeout_still_sends_the_lingering_batch() {
    let sink = TestSink::new("rv-s13");
    let config = Config::builder().linger(60 * SEC).build().unwrap();
    let o = Outbox::new(sink.clone(), config).unwrap();
    for i in 0..2 {
        assert_eq!(o.stage(t(1), i), Staged::Accepted);
    }
    let r = o.flush(Duration::ZERO).await;
    assert!(r.deadline_passed && r.pending == 2, "{r:?}");
    let start = Instant::now();
    sink.until(|s| s.stored(t(1)).len() == 2).await;
    assert!(
        start.elapsed() < SEC,
        "written after {:?}: the flush's release was undone",
        start.elapsed()
    );
}

/// A linger equal to `max_item_age` is accepted (only a longer one is
/// rejected): the lingering partial batch is written at its linger, not
/// expired (S-R3).
#[tokio::test(start_paused = true)]
async fn a_linger_equal_to_the_item_age_writes_the_partial_batch() {
    let sink = TestSink::new("rv-age");
    let config = Config::builder()
        .linger(100 * MS)
        .max_item_age(100 * MS)
        .build()
        .unwrap();
    let o = Outbox::new(sink.clone(), config).unwrap();
    assert_eq!(o.stage(t(1), 1), Staged::Accepted);
    let r = o.settle(SEC).await;
    assert_eq!(o.counters().lost(LostReason::Expired), 0);
    assert_eq!(
        r.written, 1,
        "the partial batch expired while lingering: {r:?}"
    );
}
