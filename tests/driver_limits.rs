//! The driver at the extremes of its configuration and scale: durations of
//! `Duration::MAX`, byte limits smaller than any item, weighers returning 0
//! or `u64::MAX`, a sink discarding more than it got, and 100,000 tenants.
//! Bad or extreme input gives a clear error or a working outbox, never a
//! panic. Rule ids refer to docs/contract.md.

mod support;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use outbox::{
    Config, DropReason, LostReason, Outbox, Report, Sink, Staged, TenantId, WriteError, Written,
};
use support::*;

#[tokio::test(start_paused = true)]
async fn duration_max_everywhere_is_accepted_and_works() {
    // Years-long / Duration::MAX values: a clear error or a working outbox,
    // never a panic.
    let sink = TestSink::new("max");
    let config = Config::builder()
        .linger(Duration::MAX)
        .initial_backoff(Duration::MAX)
        .max_backoff(Duration::MAX)
        .write_timeout(Duration::MAX)
        .max_retry_duration(Duration::MAX)
        .max_item_age(Duration::MAX)
        .concurrency(usize::MAX)
        .capacity(usize::MAX)
        .tenant_capacity(usize::MAX)
        .max_batch(usize::MAX)
        .max_attempts(u32::MAX)
        .build()
        .unwrap();
    let o = Outbox::builder(sink.clone())
        .config(config)
        .drop_timeout(Duration::MAX)
        .build()
        .unwrap();
    for i in 0..10 {
        assert_eq!(o.stage(t(1), i), Staged::Accepted);
    }
    // The linger of ~584 years is cut short by the flush (S-A4).
    let r = o.flush(Duration::MAX).await;
    assert_eq!((r.written, r.pending, r.deadline_passed), (10, 0, false));
    assert_eq!(o.settle(Duration::MAX).await.pending, 0);
    let r = o.shutdown(Duration::MAX).await;
    assert_eq!(r.report(), Report::default());
    assert_eq!(sink.stored(t(1)), ids(0..10));
}

#[tokio::test(start_paused = true)]
async fn discarding_more_than_the_slice_is_clamped() {
    // S-W12: a sink saying it discarded more than it got.
    struct Over;
    impl Sink for Over {
        type Tenant = TenantId;
        type Item = u32;
        fn name(&self) -> &str {
            "over"
        }
        async fn write(&self, _: &TenantId, _: &[u32]) -> Result<Written, WriteError> {
            Ok(Written::discarding(usize::MAX))
        }
    }
    let o = Outbox::new(Over, Config::default()).unwrap();
    for i in 0..3 {
        let _ = o.stage(t(1), i);
    }
    let r = o.flush(Duration::from_secs(1)).await;
    assert_eq!((r.written, r.lost, r.pending), (0, 3, 0));
    let c = o.counters();
    assert_eq!(c.lost(LostReason::Discarded), 3);
    assert!(c.balanced());
}

/// S-B5: byte limits through the builder's weigher.
#[tokio::test(start_paused = true)]
async fn byte_limits_use_the_weigher() {
    let sink = TestSink::new("bytes-tiny");
    let config = Config::builder()
        .max_batch_bytes(10)
        .capacity_bytes(100)
        .build()
        .unwrap();
    let o = Outbox::builder(sink.clone())
        .config(config)
        .weigher(|i: &u32| u64::from(*i))
        .build()
        .unwrap();
    for i in [3, 3, 3, 3, 50, 1] {
        let _ = o.stage(t(1), i);
    }
    assert_eq!(o.stage(t(1), 40), Staged::Dropped(DropReason::BufferFull));
    assert_eq!(o.flush(Duration::from_secs(1)).await.written, 6);
    let batches: Vec<Vec<u32>> = sink.attempts().into_iter().map(|a| a.items).collect();
    assert_eq!(batches, [vec![3, 3, 3], vec![3], vec![50], vec![1]]);
}

#[tokio::test(start_paused = true)]
async fn max_batch_bytes_smaller_than_every_item_writes_each_alone() {
    // S-B5.
    let sink = TestSink::new("bytes");
    let config = Config::builder().max_batch_bytes(1).build().unwrap();
    let o = Outbox::builder(sink.clone())
        .config(config)
        .weigher(|i: &u32| 1_000 + u64::from(*i))
        .build()
        .unwrap();
    for i in 0..5 {
        let _ = o.stage(t(1), i);
    }
    assert_eq!(o.flush(Duration::from_secs(1)).await.written, 5);
    let a = sink.attempts();
    assert_eq!(a.len(), 5);
    assert!(a.iter().all(|a| a.items.len() == 1));
    assert_eq!(sink.stored(t(1)), ids(0..5));
}

/// S-B8: a weightless item counts 1 byte, so a byte capacity bounds the
/// count too (it once let zero-weight items grow without bound), and a
/// byte batch still never loops or stays empty.
#[tokio::test(start_paused = true)]
async fn weigher_returning_zero_counts_one_byte_an_item() {
    let sink = TestSink::new("w0");
    let config = Config::builder()
        .max_batch_bytes(4)
        .capacity_bytes(10)
        .build()
        .unwrap();
    let o = Outbox::builder(sink.clone())
        .config(config)
        .weigher(|_: &u32| 0)
        .build()
        .unwrap();
    for i in 0..1000 {
        let expected = if i < 10 {
            Staged::Accepted
        } else {
            Staged::Dropped(DropReason::BufferFull)
        };
        assert_eq!(o.stage(t(1), i), expected);
    }
    assert_eq!(o.flush(Duration::from_secs(1)).await.written, 10);
    assert_eq!(sink.stored(t(1)), ids(0..10));
    let sizes: Vec<usize> = sink.attempts().iter().map(|a| a.items.len()).collect();
    assert_eq!(sizes, [4, 4, 2], "4 bytes a batch, 1 an item");
}

/// S-B5: a weigher returning `u64::MAX` neither overflows the byte sums
/// nor panics the caller of `Outbox::stage` (documented "never panics"),
/// and `pending()` returns to 0 (the core's side:
/// `s_b5_a_huge_weight_neither_overflows_nor_panics`).
#[tokio::test(start_paused = true)]
async fn outbox_weigher_u64_max_does_not_panic_the_caller() {
    let sink = TestSink::new("wmax");
    let config = Config::builder().max_batch_bytes(10).build().unwrap();
    let o = Outbox::builder(sink.clone())
        .config(config)
        .weigher(|_: &u32| u64::MAX)
        .build()
        .unwrap();
    for i in 0..3 {
        let r = catch_unwind(AssertUnwindSafe(|| o.stage(t(1), i)));
        assert!(r.is_ok(), "stage #{i} panicked");
    }
    let r = o.flush(Duration::from_secs(1)).await;
    assert_eq!((r.written, r.pending), (3, 0));
    assert!(o.counters().balanced());
}

#[tokio::test(start_paused = true)]
async fn hundred_thousand_tenants_each_written_once() {
    let sink = TestSink::new("100k");
    let o = Outbox::new(
        sink.clone(),
        Config::builder().concurrency(64).build().unwrap(),
    )
    .unwrap();
    let n = 100_000u32;
    for i in 0..n {
        let _ = o.stage(t(u128::from(i)), i);
    }
    let r = o.flush(Duration::from_secs(600)).await;
    assert_eq!((r.written, r.pending), (u64::from(n), 0));
    let store = sink.store();
    assert_eq!(store.len(), n as usize);
    assert!(store.values().all(|v| v.len() == 1));
    let c = o.counters();
    assert_eq!(c.writes, u64::from(n));
    assert!(c.balanced());
}
