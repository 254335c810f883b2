//! The driver running through an outage (S-R1..S-R6), on tokio's paused
//! clock: run-time dead letters (callback, panicking callback, bounded
//! channel), `try_stage`, the waiting stage (capacity freed, timeout,
//! cancellation, shutdown while waiting), the health snapshot. Rule ids
//! refer to docs/contract.md.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox::{
    BreakerConfig, BreakerState, Config, DeadLetter, DeadLetters, DeadReason, DropReason,
    LostReason, Outbox, StageError, Staged, TenantId,
};
use support::*;

const MS: Duration = Duration::from_millis(1);

type Letters = Arc<Mutex<Vec<(TenantId, Vec<u32>, DeadReason)>>>;

fn collect(letters: &Letters) -> DeadLetters<TenantId, u32> {
    let letters = Arc::clone(letters);
    DeadLetters::callback(move |dl: DeadLetter<TenantId, u32>| {
        letters
            .lock()
            .unwrap()
            .push((dl.tenant, dl.items, dl.reason));
    })
}

// ----- S-R4: run-time dead letters ------------------------------------------

#[tokio::test(start_paused = true)]
async fn s_r4_a_callback_gets_each_slice_given_up_with_its_reason() {
    let sink = TestSink::new("dl-callback");
    sink.set(t(1), Act::Terminal);
    sink.set(t(2), Act::Fail);
    let letters = Letters::default();
    let config = Config::builder()
        .max_attempts(2)
        .initial_backoff(MS)
        .build()
        .unwrap();
    let outbox = Outbox::builder(sink.clone())
        .config(config)
        .dead_letters(collect(&letters))
        .build()
        .unwrap();
    let _ = outbox.stage(t(1), 1);
    let _ = outbox.stage(t(2), 2);
    let _ = outbox.stage(t(3), 3);
    let r = outbox.flush(Duration::from_secs(5)).await;
    assert_eq!((r.written, r.lost), (1, 2));
    let mut got = letters.lock().unwrap().clone();
    got.sort();
    assert_eq!(
        got,
        [
            (t(1), vec![1], DeadReason::Terminal),
            (t(2), vec![2], DeadReason::RetriesExhausted),
        ]
    );
    let c = outbox.counters();
    assert_eq!(c.lost(LostReason::Terminal), 1);
    assert_eq!(c.lost(LostReason::RetriesExhausted), 1);
    assert_eq!(outbox.health().dead_letters_dropped, 0);
}

#[tokio::test(start_paused = true)]
async fn s_r4_a_panicking_callback_is_contained_and_counted() {
    let sink = TestSink::new("dl-panic");
    sink.set_all(Act::Terminal);
    let calls = Arc::new(Mutex::new(0));
    let seen = Arc::clone(&calls);
    let outbox = Outbox::builder(sink.clone())
        .dead_letters(DeadLetters::callback(move |_| {
            *seen.lock().unwrap() += 1;
            panic!("test sink: the dead-letter callback panics");
        }))
        .build()
        .unwrap();
    for i in 0..3 {
        let _ = outbox.stage(t(u128::from(i)), i);
        let _ = outbox.flush(Duration::from_secs(1)).await;
    }
    assert_eq!(
        *calls.lock().unwrap(),
        3,
        "called each time, the writer carries on"
    );
    assert_eq!(outbox.health().dead_letters_dropped, 3);
    assert_eq!(outbox.counters().lost(LostReason::Terminal), 3);
    sink.set_all(Act::Ok);
    let _ = outbox.stage(t(9), 9);
    let r = outbox.flush(Duration::from_secs(1)).await;
    assert_eq!(r.written, 1, "still writing");
}

#[tokio::test(start_paused = true)]
async fn s_r4_a_full_channel_drops_and_counts_never_waits() {
    let sink = TestSink::new("dl-channel");
    sink.set_all(Act::Fail);
    let (to, mut rx) = DeadLetters::channel(2);
    let config = Config::builder()
        .error_policy(outbox::ErrorPolicy::Drop)
        .build()
        .unwrap();
    let outbox = Outbox::builder(sink.clone())
        .config(config)
        .dead_letters(to)
        .build()
        .unwrap();
    for i in 0..5 {
        let _ = outbox.stage(t(u128::from(i)), i);
    }
    let r = outbox.flush(Duration::from_secs(1)).await;
    assert_eq!(r.dropped, 5);
    assert_eq!(outbox.counters().dropped(DropReason::SinkError), 5);
    let mut got = Vec::new();
    while let Ok(dl) = rx.try_recv() {
        assert_eq!(dl.reason, DeadReason::SinkError);
        got.extend(dl.items);
    }
    assert_eq!(got.len(), 2, "the channel holds two");
    assert_eq!(outbox.health().dead_letters_dropped, 3, "the rest counted");
}

#[tokio::test(start_paused = true)]
async fn s_r4_expired_items_are_dead_letters_too() {
    let sink = TestSink::new("dl-expired");
    sink.set(t(1), Act::Hang);
    let letters = Letters::default();
    let config = Config::builder()
        .concurrency(1)
        .max_item_age(Duration::from_millis(100))
        .build()
        .unwrap();
    let outbox = Outbox::builder(sink.clone())
        .config(config)
        .dead_letters(collect(&letters))
        .build()
        .unwrap();
    let _ = outbox.stage(t(1), 1);
    sink.until_attempts(t(1), 1).await;
    let _ = outbox.stage(t(2), 2);
    tokio::time::sleep(Duration::from_millis(150)).await;
    // Given up at its age deadline by the timer, while tenant 1's write
    // still holds the only slot (S-R3).
    assert_eq!(outbox.counters().lost(LostReason::Expired), 1);
    sink.release();
    let r = outbox.flush(Duration::from_secs(1)).await;
    assert_eq!(r.lost, 0, "given up before the flush");
    assert_eq!(
        letters.lock().unwrap().clone(),
        [(t(2), vec![2], DeadReason::Expired)]
    );
    assert!(sink.stored(t(2)).is_empty(), "never written (S-R3)");
}

// ----- S-R5: try_stage and the waiting stage ----------------------------------

fn bounded(name: &str, capacity: usize) -> (TestSink, Outbox<TestSink>) {
    let sink = TestSink::new(name);
    sink.set_all(Act::Hang);
    let config = Config::builder().capacity(capacity).build().unwrap();
    let outbox = Outbox::new(sink.clone(), config).unwrap();
    (sink, outbox)
}

/// Fills a capacity of 1 with an item whose write hangs, then spawns a
/// `stage_wait` of item 2 for tenant 2 (60 s timeout) behind it.
async fn wait_behind_a_hung_write(
    sink: &TestSink,
    outbox: &Outbox<TestSink>,
) -> tokio::task::JoinHandle<Result<(), StageError<u32>>> {
    let _ = outbox.stage(t(1), 1);
    sink.until_attempts(t(1), 1).await;
    let outbox = outbox.clone();
    tokio::spawn(async move { outbox.stage_wait(t(2), 2, Duration::from_secs(60)).await })
}

#[tokio::test(start_paused = true)]
async fn s_r5_try_stage_hands_a_refused_item_back_uncounted() {
    let (_sink, outbox) = bounded("try-stage", 1);
    assert_eq!(outbox.try_stage(t(1), 1), Ok(()));
    let before = outbox.counters();
    assert_eq!(
        outbox.try_stage(t(1), 2),
        Err(StageError::Full {
            reason: DropReason::BufferFull,
            item: 2
        })
    );
    assert_eq!(outbox.counters(), before, "nothing counted");
    drop(outbox.shutdown(Duration::ZERO));
    let err = outbox.try_stage(t(1), 3).unwrap_err();
    assert_eq!(err, StageError::ShuttingDown(3));
    assert_eq!(err.into_item(), 3);
}

#[tokio::test(start_paused = true)]
async fn s_r5_a_waiting_stage_goes_in_when_capacity_is_freed() {
    let (sink, outbox) = bounded("wait-freed", 1);
    let waiter = wait_behind_a_hung_write(&sink, &outbox).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!waiter.is_finished(), "waits while full");
    sink.release();
    assert_eq!(waiter.await.unwrap(), Ok(()));
    assert_eq!(outbox.counters().staged, 2);
}

#[tokio::test(start_paused = true)]
async fn s_r5_a_waiting_stage_times_out_with_its_item() {
    let (_sink, outbox) = bounded("wait-timeout", 1);
    let _ = outbox.stage(t(1), 1);
    let start = tokio::time::Instant::now();
    let r = outbox.stage_wait(t(2), 2, Duration::from_millis(250)).await;
    assert_eq!(r, Err(StageError::TimedOut(2)));
    assert_eq!(start.elapsed(), Duration::from_millis(250));
    assert_eq!(outbox.counters().staged, 1, "the item was not counted");
}

#[tokio::test(start_paused = true)]
async fn s_r5_a_cancelled_waiting_stage_leaves_nothing_behind() {
    let (sink, outbox) = bounded("wait-cancel", 1);
    let _ = outbox.stage(t(1), 1);
    let waiting = outbox.stage_wait(t(2), 2, Duration::from_secs(60));
    let r = tokio::time::timeout(Duration::from_millis(10), waiting).await;
    assert!(r.is_err(), "cancelled by the timeout around it");
    sink.release();
    let r = outbox.flush(Duration::from_secs(1)).await;
    assert_eq!(r.written, 1);
    let c = outbox.counters();
    assert_eq!((c.staged, c.written, c.pending), (1, 1, 0));
    assert!(sink.stored(t(2)).is_empty());
}

#[tokio::test(start_paused = true)]
async fn s_r5_a_shutdown_ends_a_waiting_stage_at_once() {
    let (sink, outbox) = bounded("wait-shutdown", 1);
    let waiter = wait_behind_a_hung_write(&sink, &outbox).await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    let shutdown = outbox.shutdown(Duration::from_secs(10));
    let start = tokio::time::Instant::now();
    assert_eq!(waiter.await.unwrap(), Err(StageError::ShuttingDown(2)));
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "not at the timeout"
    );
    sink.release();
    let report = shutdown.await;
    assert_eq!(report.written, 1);
    assert_eq!(outbox.stage(t(3), 3), Staged::ShuttingDown);
}

// ----- S-R6: the health snapshot -----------------------------------------------

#[tokio::test(start_paused = true)]
async fn s_r6_health_shows_the_breaker_the_failures_and_the_oldest_item() {
    let sink = TestSink::new("health");
    sink.set_all(Act::Fail);
    let config = Config::builder()
        .initial_backoff(MS * 10)
        .max_backoff(MS * 10)
        .max_item_age(Duration::from_secs(3600))
        .breaker(
            BreakerConfig::new()
                .failures(3)
                .probe_interval(Duration::from_secs(1))
                .max_probe_interval(Duration::from_secs(1)),
        )
        .build()
        .unwrap();
    let outbox = Outbox::new(sink.clone(), config).unwrap();
    let h = outbox.health();
    assert_eq!(h.breaker, BreakerState::Closed);
    assert_eq!((h.pending, h.tenants, h.in_flight), (0, 0, 0));
    assert_eq!((h.oldest_pending, h.since_last_written), (None, None));
    for i in 0..3 {
        let _ = outbox.stage(t(u128::from(i)), i);
    }
    sink.until(|s| s.attempts().len() >= 3).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let h = outbox.health();
    assert!(matches!(h.breaker, BreakerState::Open { .. }), "{h:?}");
    assert_eq!(h.consecutive_failures, 3);
    assert_eq!(sink.attempts().len(), 3, "nothing more while open");
    assert_eq!((h.pending, h.tenants, h.in_flight), (3, 3, 0));
    assert_eq!(h.oldest_pending, Some(Duration::from_millis(500)));
    // The sink returns: the probe at 1 s closes the breaker, all drain.
    sink.set_all(Act::Ok);
    let r = outbox.flush(Duration::from_secs(5)).await;
    assert_eq!(r.written, 3);
    let h = outbox.health();
    assert_eq!(h.breaker, BreakerState::Closed);
    assert_eq!(h.consecutive_failures, 0);
    assert_eq!(h.oldest_pending, None);
    assert!(h.since_last_written.is_some());
    assert_eq!(sink.attempts().len(), 6, "one probe, then the other two");
}

#[tokio::test(start_paused = true)]
async fn s_r3_items_are_given_up_at_their_age_while_the_breaker_is_open() {
    // The sink is down, the breaker open with its probe a minute away:
    // `pending` and the counters tell the truth at each item's age
    // deadline, not at the probe.
    let sink = TestSink::new("age-timer");
    sink.set_all(Act::Fail);
    let config = Config::builder()
        .max_item_age(Duration::from_secs(1))
        .breaker(
            BreakerConfig::new()
                .failures(1)
                .probe_interval(Duration::from_secs(60))
                .max_probe_interval(Duration::from_secs(60)),
        )
        .build()
        .unwrap();
    let outbox = Outbox::new(sink.clone(), config).unwrap();
    let _ = outbox.stage(t(1), 1);
    sink.until_attempts(t(1), 1).await;
    assert!(matches!(outbox.health().breaker, BreakerState::Open { .. }));
    tokio::time::sleep(Duration::from_millis(500)).await;
    for i in 2..5 {
        assert_eq!(outbox.stage(t(2), i), Staged::Accepted);
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    let c = outbox.counters();
    assert_eq!((c.lost(LostReason::Expired), c.pending), (1, 3), "{c:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let c = outbox.counters();
    assert_eq!((c.lost(LostReason::Expired), c.pending), (4, 0), "{c:?}");
    assert_eq!(sink.attempts().len(), 1, "no probe yet");
    assert!(matches!(outbox.health().breaker, BreakerState::Open { .. }));
}
