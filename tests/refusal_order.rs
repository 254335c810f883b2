//! S-W21, the refusal order: the shutdown fence outranks every other
//! refusal on every path. With a journal, a `tenant_capacity` and a full
//! journal, after a shutdown began, `try_stage` answers `ShuttingDown`
//! (not `Full { journal_full }`), `stage_wait(5 s)` answers `ShuttingDown`
//! at once, also when it was already waiting as the shutdown began, and
//! `stage` counts the item lost under `shutdown`. Tokio's paused clock:
//! "at once" is "before the clock moved".
//! Rule ids refer to docs/contract.md.
#![cfg(all(feature = "journal", feature = "testkit"))]

mod support;

use std::time::Duration;

use outbox::journal::{JournalConfig, MemStorage};
use outbox::{Config, DropReason, LostReason, Outbox, StageError, Staged};
use support::codec::Picky;
use support::{t, Act, TestSink};
use tokio::time::Instant;

const S: Duration = Duration::from_secs(1);

/// The case, on `paths`: a journal whose buffer holds no record of
/// an item above 100 (each gets 200 bytes of padding: the journal is
/// full for it), with or without a `tenant_capacity`; tenant 1's first
/// write hangs, so a shutdown stays under way.
fn build(sink: &TestSink, tenant_capacity: bool) -> Outbox<TestSink> {
    let mut config = Config::builder().capacity(64);
    if tenant_capacity {
        config = config.tenant_capacity(8);
    }
    let journal = JournalConfig::with_storage(MemStorage::new())
        .sync_bytes(64)
        .max_buffered_bytes(128)
        .inline_io(true);
    let codec = Picky {
        refuse: |_| false,
        panic: |_| false,
        pad: |i| if i > 100 { 200 } else { 0 },
    };
    Outbox::builder(sink.clone())
        .config(config.build().unwrap())
        .journal_with_codec(journal, codec)
        .build()
        .unwrap()
}

/// Stages item 1 (its write hangs), then begins a shutdown.
async fn shutting_down(sink: &TestSink, outbox: &Outbox<TestSink>) {
    sink.script(t(1), [Act::Hang]);
    assert_eq!(outbox.stage(t(1), 1), Staged::Accepted);
    tokio::task::yield_now().await;
    drop(outbox.shutdown(10 * S));
    assert!(outbox.is_shutting_down());
}

#[test]
fn s_w21_before_the_fence_a_full_journal_refuses() {
    // The journal is full for item 101 on both paths: the case below is
    // about the order, not a journal that has room.
    support::rt::paused().block_on(async {
        for quota in [false, true] {
            let sink = TestSink::new("refusal_order");
            let outbox = build(&sink, quota);
            match outbox.try_stage(t(2), 101) {
                Err(StageError::Full { reason, item }) => {
                    assert_eq!((reason, item), (DropReason::JournalFull, 101));
                }
                other => panic!("quota {quota}: {other:?}"),
            }
            assert_eq!(
                outbox.stage(t(2), 102),
                Staged::Dropped(DropReason::JournalFull)
            );
            assert_eq!(outbox.counters().dropped(DropReason::JournalFull), 1);
        }
    });
}

#[test]
fn s_w21_try_stage_answers_shutting_down_whatever_else_is_full() {
    support::rt::paused().block_on(async {
        for quota in [false, true] {
            let sink = TestSink::new("refusal_order");
            let outbox = build(&sink, quota);
            shutting_down(&sink, &outbox).await;
            for item in [101, 2] {
                match outbox.try_stage(t(2), item) {
                    Err(StageError::ShuttingDown(back)) => assert_eq!(back, item),
                    other => panic!("quota {quota}, item {item}: {other:?}"),
                }
            }
            let c = outbox.counters();
            assert_eq!(c.staged, 1, "a refusal handed back is not counted");
            sink.release();
        }
    });
}

#[test]
fn s_w21_stage_counts_a_refusal_past_the_fence_under_shutdown() {
    // The counter that moved: with a full journal past the fence, the item
    // is lost under `shutdown`, no longer dropped under `journal_full`.
    support::rt::paused().block_on(async {
        for quota in [false, true] {
            let sink = TestSink::new("refusal_order");
            let outbox = build(&sink, quota);
            shutting_down(&sink, &outbox).await;
            assert_eq!(outbox.stage(t(2), 101), Staged::ShuttingDown);
            let outcomes = outbox.stage_many_outcomes([(t(2), 102), (t(3), 3)]);
            assert_eq!(outcomes, [Staged::ShuttingDown, Staged::ShuttingDown]);
            let c = outbox.counters();
            assert_eq!(c.lost(LostReason::Shutdown), 3, "quota {quota}");
            assert_eq!(c.dropped(DropReason::JournalFull), 0, "quota {quota}");
            assert!(c.balanced(), "{c:?}");
            sink.release();
        }
    });
}

#[test]
fn s_w21_stage_wait_answers_shutting_down_at_once() {
    support::rt::paused().block_on(async {
        for quota in [false, true] {
            let sink = TestSink::new("refusal_order");
            let outbox = build(&sink, quota);
            shutting_down(&sink, &outbox).await;
            let start = Instant::now();
            match outbox.stage_wait(t(2), 101, 5 * S).await {
                Err(StageError::ShuttingDown(101)) => {}
                other => panic!("quota {quota}: {other:?}"),
            }
            assert_eq!(Instant::now(), start, "quota {quota}: no time passed");
            sink.release();
        }
    });
}

#[test]
fn s_w21_a_waiting_stage_answers_shutting_down_when_the_fence_goes_up() {
    support::rt::paused().block_on(async {
        for quota in [false, true] {
            let sink = TestSink::new("refusal_order");
            let outbox = build(&sink, quota);
            sink.script(t(1), [Act::Hang]);
            assert_eq!(outbox.stage(t(1), 1), Staged::Accepted);
            tokio::task::yield_now().await;
            let start = Instant::now();
            let waiting = {
                let outbox = outbox.clone();
                tokio::spawn(async move { outbox.stage_wait(t(2), 101, 5 * S).await })
            };
            // The waiter found the journal full and waits for room.
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert!(!waiting.is_finished(), "quota {quota}");
            let fence = Instant::now();
            drop(outbox.shutdown(10 * S));
            match waiting.await.unwrap() {
                Err(StageError::ShuttingDown(101)) => {}
                other => panic!("quota {quota}: {other:?}"),
            }
            assert_eq!(
                Instant::now(),
                fence,
                "quota {quota}: answered at the fence"
            );
            assert!(Instant::now() - start < 5 * S);
            sink.release();
        }
    });
}
