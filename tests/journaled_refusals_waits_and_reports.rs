//! A journaled outbox tried as a newcomer would, against the contract's
//! promises, each asserting what docs/contract.md says. The refusal order
//! past the shutdown fence (S-W21, S-R5) with a journal, a quota and a
//! codec that refuses; the waiting stage (S-R5); the flush, settle and
//! shutdown reports (S-A4, S-W10, S-W9, S-B6, S-J16); a journal at tiny
//! bounds (S-J10); run-time dead letters (S-R4, I13) and their done marks
//! (S-J3). Tokio's paused clock: "at once" is "before the clock moved".
//! Rule ids refer to docs/contract.md.
#![cfg(all(feature = "journal", feature = "testkit"))]

mod support;

use std::time::Duration;

use outbox::journal::{JournalConfig, MemStorage};
use outbox::{
    Config, DeadLetters, DeadReason, DropReason, ErrorPolicy, LostReason, Outbox, StageError,
    Staged, Unwritten,
};
use support::codec::Picky;
use support::{t, Act, TestSink, MS};
use tokio::time::Instant;

const S: Duration = Duration::from_secs(1);

/// Nothing pending, `lost` items lost under `reason`, every item counted
/// once (S-W14).
fn all_settled(outbox: &Outbox<TestSink>, reason: LostReason, lost: u64) {
    let c = outbox.counters();
    assert_eq!((c.lost(reason), c.pending), (lost, 0), "{c:?}");
    assert!(c.balanced(), "{c:?}");
}

/// An in-memory journal whose IO runs inline (the paused clock decides).
fn mem_journal() -> JournalConfig {
    JournalConfig::with_storage(MemStorage::new()).inline_io(true)
}

/// Items from 1,000 on cannot be encoded; from 2,000 on the codec panics.
fn refusing_codec() -> Picky {
    Picky {
        refuse: |i| (1_000..2_000).contains(&i),
        panic: |i| i >= 2_000,
        pad: |_| 0,
    }
}

fn journaled(sink: &TestSink, config: outbox::ConfigBuilder) -> Outbox<TestSink> {
    Outbox::builder(sink.clone())
        .config(config.build().unwrap())
        .journal_with_codec(mem_journal(), refusing_codec())
        .build()
        .unwrap()
}

// ----- S-W21 / S-R5: the fence outranks every other refusal ---------------

#[test]
fn s_w21_the_fence_outranks_encode_failed_on_every_call() {
    // S-W21: the fence comes before the journal's encoding: past it, an
    // item the codec refuses (or panics on) is refused as `shutdown`.
    support::rt::paused().block_on(async {
        let sink = TestSink::new("probe");
        let outbox = journaled(&sink, Config::builder().tenant_capacity(4));
        // Before the fence, the codec's refusal is the answer.
        assert_eq!(
            outbox.stage(t(2), 1_000),
            Staged::Dropped(DropReason::EncodeFailed)
        );
        sink.script(t(1), [Act::Hang]);
        assert_eq!(outbox.stage(t(1), 1), Staged::Accepted);
        tokio::task::yield_now().await;
        let shutdown = outbox.shutdown(10 * S);
        assert!(outbox.is_shutting_down());

        for item in [1_001, 2_001] {
            match outbox.try_stage(t(2), item) {
                Err(StageError::ShuttingDown(back)) => assert_eq!(back, item),
                other => panic!("try_stage {item}: {other:?}"),
            }
        }
        assert_eq!(outbox.stage(t(2), 1_002), Staged::ShuttingDown);
        assert_eq!(outbox.stage(t(2), 2_002), Staged::ShuttingDown);
        let start = Instant::now();
        match outbox.stage_wait(t(2), 1_003, 5 * S).await {
            Err(StageError::ShuttingDown(1_003)) => {}
            other => panic!("stage_wait: {other:?}"),
        }
        assert_eq!(Instant::now(), start, "stage_wait answered at once");
        let outcomes = outbox.stage_many_outcomes([(t(2), 1_004), (t(3), 2_004), (t(3), 5)]);
        assert_eq!(outcomes, [Staged::ShuttingDown; 3]);

        let c = outbox.counters();
        assert_eq!(c.lost(LostReason::Shutdown), 5, "{c:?}");
        assert_eq!(
            c.dropped(DropReason::EncodeFailed),
            1,
            "only the pre-fence one"
        );
        assert!(c.balanced(), "{c:?}");
        sink.release();
        let report = shutdown.await;
        assert_eq!((report.written, report.lost), (1, 0));
        assert_eq!(sink.stored(t(1)), [1]);
    });
}

#[test]
fn s_w21_the_fence_outranks_a_full_tenant_quota_with_a_journal() {
    support::rt::paused().block_on(async {
        let sink = TestSink::new("probe");
        let outbox = journaled(&sink, Config::builder().tenant_capacity(2));
        sink.script(t(1), [Act::Hang]);
        assert_eq!(outbox.stage(t(1), 1), Staged::Accepted);
        tokio::task::yield_now().await;
        assert_eq!(outbox.stage(t(1), 2), Staged::Accepted);
        assert_eq!(
            outbox.stage(t(1), 3),
            Staged::Dropped(DropReason::TenantFull)
        );
        // A waiter for room in tenant 1's quota, then the fence.
        let waiting = {
            let outbox = outbox.clone();
            tokio::spawn(async move { outbox.stage_wait(t(1), 4, 5 * S).await })
        };
        tokio::time::sleep(100 * MS).await;
        assert!(!waiting.is_finished(), "the quota is full: it waits");
        let fence = Instant::now();
        let shutdown = outbox.shutdown(10 * S);
        match waiting.await.unwrap() {
            Err(StageError::ShuttingDown(4)) => {}
            other => panic!("waiting stage_wait: {other:?}"),
        }
        assert_eq!(Instant::now(), fence, "answered at the fence");

        match outbox.try_stage(t(1), 5) {
            Err(StageError::ShuttingDown(5)) => {}
            other => panic!("try_stage: {other:?}"),
        }
        match outbox.stage_wait(t(1), 6, 5 * S).await {
            Err(StageError::ShuttingDown(6)) => {}
            other => panic!("stage_wait: {other:?}"),
        }
        assert_eq!(Instant::now(), fence, "no time passed");
        assert_eq!(outbox.stage(t(1), 7), Staged::ShuttingDown);
        let c = outbox.counters();
        assert_eq!(c.lost(LostReason::Shutdown), 1, "{c:?}");
        assert_eq!(c.dropped(DropReason::TenantFull), 1, "{c:?}");
        assert_eq!(c.pending, 2);
        assert!(c.balanced(), "{c:?}");
        sink.release();
        let report = shutdown.await;
        assert_eq!((report.written, report.lost, report.pending), (2, 0, 0));
        assert_eq!(sink.stored(t(1)), [1, 2]);
    });
}

#[test]
fn s_w21_the_fence_outranks_a_full_byte_capacity_with_a_journal() {
    // buffer_full from `capacity_bytes` (S-B5) instead of a count.
    support::rt::paused().block_on(async {
        let sink = TestSink::new("probe");
        let config = Config::builder().capacity_bytes(10).tenant_capacity(100);
        let outbox = Outbox::builder(sink.clone())
            .config(config.build().unwrap())
            .weigher(|_| 5)
            .journal_with_codec(mem_journal(), refusing_codec())
            .build()
            .unwrap();
        sink.script(t(1), [Act::Hang]);
        assert_eq!(outbox.stage(t(1), 1), Staged::Accepted);
        assert_eq!(outbox.stage(t(1), 2), Staged::Accepted);
        assert_eq!(
            outbox.stage(t(2), 3),
            Staged::Dropped(DropReason::BufferFull)
        );
        tokio::task::yield_now().await;
        let shutdown = outbox.shutdown(10 * S);
        match outbox.try_stage(t(2), 4) {
            Err(StageError::ShuttingDown(4)) => {}
            other => panic!("try_stage: {other:?}"),
        }
        assert_eq!(outbox.stage(t(2), 5), Staged::ShuttingDown);
        let c = outbox.counters();
        assert_eq!(
            (
                c.lost(LostReason::Shutdown),
                c.dropped(DropReason::BufferFull)
            ),
            (1, 1),
            "{c:?}"
        );
        sink.release();
        assert_eq!(shutdown.await.written, 2);
    });
}

// ----- S-R5: the waiting stage --------------------------------------------

#[test]
fn s_r5_stage_wait_is_accepted_once_room_frees() {
    support::rt::paused().block_on(async {
        let sink = TestSink::new("probe");
        let outbox = journaled(&sink, Config::builder().tenant_capacity(1));
        sink.script(t(1), [Act::Hang]);
        assert_eq!(outbox.stage(t(1), 1), Staged::Accepted);
        let waiting = {
            let outbox = outbox.clone();
            tokio::spawn(async move { outbox.stage_wait(t(1), 2, 5 * S).await })
        };
        tokio::time::sleep(100 * MS).await;
        assert!(!waiting.is_finished());
        sink.release();
        assert!(matches!(waiting.await.unwrap(), Ok(())));
        let report = outbox.flush(5 * S).await;
        assert_eq!(report.pending, 0, "{report:?}");
        assert_eq!(sink.stored(t(1)), [1, 2]);
        let c = outbox.counters();
        assert_eq!((c.staged, c.written), (2, 2), "{c:?}");
        assert_eq!(c.dropped(DropReason::TenantFull), 0, "nothing counted");
    });
}

#[test]
fn s_r5_stage_wait_times_out_uncounted() {
    support::rt::paused().block_on(async {
        let sink = TestSink::new("probe");
        let outbox = journaled(&sink, Config::builder().tenant_capacity(1));
        sink.script(t(1), [Act::Hang]);
        assert_eq!(outbox.stage(t(1), 1), Staged::Accepted);
        let start = Instant::now();
        match outbox.stage_wait(t(1), 2, 5 * S).await {
            Err(StageError::TimedOut(2)) => {}
            other => panic!("{other:?}"),
        }
        assert_eq!(Instant::now() - start, 5 * S);
        let c = outbox.counters();
        assert_eq!(c.staged, 1, "{c:?}");
        assert_eq!(c.dropped(DropReason::TenantFull), 0, "{c:?}");
        sink.release();
    });
}

#[test]
fn s_r5_stage_wait_hands_an_unencodable_item_back_at_once_even_when_full() {
    // S-W21: the journal's encoding comes before the quota; S-R5: no
    // settling makes it encodable, so it comes back at once, uncounted.
    support::rt::paused().block_on(async {
        let sink = TestSink::new("probe");
        let outbox = journaled(&sink, Config::builder().tenant_capacity(1));
        sink.script(t(1), [Act::Hang]);
        assert_eq!(outbox.stage(t(1), 1), Staged::Accepted);
        let start = Instant::now();
        for item in [1_000, 2_000] {
            match outbox.stage_wait(t(1), item, 5 * S).await {
                Err(StageError::EncodeFailed(back)) => assert_eq!(back, item),
                other => panic!("{item}: {other:?}"),
            }
            match outbox.try_stage(t(1), item) {
                Err(StageError::EncodeFailed(back)) => assert_eq!(back, item),
                other => panic!("{item}: {other:?}"),
            }
        }
        assert_eq!(Instant::now(), start);
        assert_eq!(outbox.counters().dropped(DropReason::EncodeFailed), 0);
        sink.release();
    });
}

// ----- S-A4, S-W10: flush and settle reports ------------------------------

#[test]
fn s_a4_flush_reports_the_healthy_written_and_the_failing_pending() {
    support::rt::paused().block_on(async {
        let sink = TestSink::new("probe");
        let config = Config::builder().concurrency(2).build().unwrap();
        let outbox = Outbox::new(sink.clone(), config).unwrap();
        sink.set(t(1), Act::Fail);
        for i in [1, 2] {
            let _ = outbox.stage(t(1), i);
        }
        for i in [3, 4, 5] {
            let _ = outbox.stage(t(2), i);
        }
        let start = Instant::now();
        let report = outbox.flush(S).await;
        assert_eq!(Instant::now() - start, S, "answered at its deadline");
        assert_eq!(
            (
                report.written,
                report.pending,
                report.lost,
                report.dropped,
                report.deadline_passed
            ),
            (3, 2, 0, 0, true),
            "{report:?}"
        );
        // Healed: the next flush covers the two still pending.
        sink.set(t(1), Act::Ok);
        let report = outbox.flush(60 * S).await;
        assert_eq!(
            (report.written, report.pending, report.deadline_passed),
            (2, 0, false),
            "{report:?}"
        );
        assert_eq!(sink.stored(t(1)), [1, 2]);
    });
}

#[test]
fn s_a4_concurrent_flushes_each_get_a_truthful_report() {
    support::rt::paused().block_on(async {
        let sink = TestSink::new("probe");
        let config = Config::builder()
            .linger(Duration::from_secs(60))
            .max_batch(100)
            .build()
            .unwrap();
        let outbox = Outbox::new(sink.clone(), config).unwrap();
        for i in 0..3 {
            let _ = outbox.stage(t(1), i);
        }
        let first = outbox.flush(10 * S);
        for i in 3..5 {
            let _ = outbox.stage(t(1), i);
        }
        let second = outbox.flush(10 * S);
        let start = Instant::now();
        let (a, b) = tokio::join!(first, second);
        assert!(Instant::now() - start < 60 * S, "flush skipped the linger");
        assert_eq!((a.written, a.pending, a.deadline_passed), (3, 0, false));
        assert_eq!((b.written, b.pending, b.deadline_passed), (5, 0, false));
        assert_eq!(sink.stored(t(1)), [0, 1, 2, 3, 4]);
    });
}

#[test]
fn s_w10_settle_reports_pending_and_leaves_the_outbox_open() {
    support::rt::paused().block_on(async {
        let sink = TestSink::new("probe");
        let outbox = Outbox::new(sink.clone(), Config::default()).unwrap();
        sink.set(t(1), Act::Fail);
        let _ = outbox.stage(t(1), 1);
        let _ = outbox.stage(t(2), 2);
        let report = outbox.settle(S).await;
        assert_eq!(
            (report.pending, report.deadline_passed),
            (1, true),
            "{report:?}"
        );
        assert!(!outbox.is_shutting_down());
        assert_eq!(outbox.stage(t(2), 3), Staged::Accepted);
        let report = outbox.settle(S).await;
        assert_eq!(report.pending, 1, "{report:?}");
        assert_eq!(sink.stored(t(2)), [2, 3]);
    });
}

#[test]
fn s_w15_flush_and_settle_after_a_shutdown_answer_at_once() {
    support::rt::paused().block_on(async {
        let sink = TestSink::new("probe");
        let outbox = Outbox::new(sink.clone(), Config::default()).unwrap();
        let _ = outbox.stage(t(1), 1);
        let report = outbox.shutdown(S).await;
        assert_eq!((report.written, report.lost), (1, 0));
        let start = Instant::now();
        let f = outbox.flush(5 * S).await;
        let s = outbox.settle(5 * S).await;
        assert_eq!(Instant::now(), start);
        assert_eq!((f.pending, f.deadline_passed), (0, false), "{f:?}");
        assert_eq!((s.pending, s.deadline_passed), (0, false), "{s:?}");
    });
}

// ----- S-W9, S-B6, S-J16: shutdown's report and its dead letters ----------

#[test]
fn s_j16_shutdown_unwritten_runs_say_what_was_attempted() {
    support::rt::paused().block_on(async {
        let sink = TestSink::new("probe");
        let config = Config::builder()
            .concurrency(4)
            .initial_backoff(Duration::from_secs(60))
            .max_backoff(Duration::from_secs(60))
            .build()
            .unwrap();
        let outbox = Outbox::new(sink.clone(), config).unwrap();
        // Tenant 1: a failed slice waiting for its retry, and a backlog.
        sink.set(t(1), Act::Fail);
        let _ = outbox.stage(t(1), 1);
        let _ = outbox.stage(t(1), 2);
        sink.until_attempts(t(1), 1).await;
        let _ = outbox.stage(t(1), 3);
        // Tenant 2: a write in flight. Tenant 3: in flight, and a backlog.
        sink.set(t(2), Act::Hang);
        sink.set(t(3), Act::Hang);
        let _ = outbox.stage(t(2), 4);
        let _ = outbox.stage(t(3), 5);
        sink.until_attempts(t(3), 1).await;
        sink.until_attempts(t(2), 1).await;
        let _ = outbox.stage(t(3), 6);
        let start = Instant::now();
        let report = outbox.shutdown(200 * MS).await;
        assert_eq!(Instant::now() - start, 200 * MS);
        assert_eq!(
            (
                report.written,
                report.lost,
                report.pending,
                report.deadline_passed,
                report.first
            ),
            (0, 6, 0, true, true),
            "{report:?}"
        );
        let run = |tenant, items: Vec<u32>, attempted| (t(tenant), items, attempted);
        let runs: Vec<_> = report
            .unwritten
            .into_iter()
            .map(|u: Unwritten<_, _>| (u.tenant, u.items, u.attempted))
            .collect();
        assert_eq!(
            runs,
            [
                run(1, vec![1, 2], true),
                run(1, vec![3], false),
                run(2, vec![4], true),
                run(3, vec![5], true),
                run(3, vec![6], false),
            ]
        );
        all_settled(&outbox, LostReason::Deadline, 6);
    });
}

#[test]
fn scenario_9_shutdown_fences_admission() {
    support::rt::paused().block_on(async {
        let sink = TestSink::new("probe");
        let outbox = Outbox::new(sink.clone(), Config::default()).unwrap();
        sink.script(t(1), [Act::Hang]);
        let _ = outbox.stage(t(1), 1);
        sink.until_attempts(t(1), 1).await;
        let _ = outbox.stage(t(1), 2);
        let shutdown = outbox.shutdown(10 * S);
        assert_eq!(outbox.stage(t(1), 3), Staged::ShuttingDown);
        let c = outbox.counters();
        assert_eq!((c.lost(LostReason::Shutdown), c.pending), (1, 2), "{c:?}");
        sink.release();
        let report = shutdown.await;
        assert_eq!((report.lost, report.written), (0, 2), "{report:?}");
        assert_eq!(sink.stored(t(1)), [1, 2]);
    });
}

#[test]
fn s_w9_concurrent_shutdowns_report_the_loss_once() {
    support::rt::paused().block_on(async {
        let sink = TestSink::new("probe");
        let outbox = Outbox::new(sink.clone(), Config::default()).unwrap();
        sink.set(t(1), Act::Hang);
        let _ = outbox.stage(t(1), 1);
        let _ = outbox.stage(t(2), 2);
        sink.set(t(2), Act::Hang);
        let (a, b) = tokio::join!(outbox.shutdown(200 * MS), outbox.shutdown(10 * S));
        assert_eq!(a.lost + b.lost, 2, "{a:?} {b:?}");
        assert!(a.first ^ b.first, "{a:?} {b:?}");
        assert_eq!(a.unwritten.len() + b.unwritten.len(), 2);
        assert_eq!(outbox.counters().lost(LostReason::Deadline), 2);
    });
}

#[test]
fn s_a7_abandon_hands_back_held_items_not_the_one_in_flight() {
    support::rt::paused().block_on(async {
        let sink = TestSink::new("probe");
        let config = Config::builder()
            .initial_backoff(Duration::from_secs(60))
            .max_backoff(Duration::from_secs(60))
            .build()
            .unwrap();
        let outbox = Outbox::new(sink.clone(), config).unwrap();
        sink.set(t(1), Act::Fail);
        let _ = outbox.stage(t(1), 1);
        sink.until_attempts(t(1), 1).await;
        let _ = outbox.stage(t(1), 2);
        sink.set(t(2), Act::Hang);
        let _ = outbox.stage(t(2), 3);
        sink.until_attempts(t(2), 1).await;
        let back = outbox.abandon();
        assert_eq!(
            support::parts(back),
            [(t(1), vec![1]), (t(1), vec![2])],
            "the in-flight write of tenant 2 stays with the sink"
        );
        all_settled(&outbox, LostReason::Abandoned, 3);
    });
}

// ----- S-J10: a journal at tiny bounds ------------------------------------

#[test]
fn s_j10_max_bytes_below_512_is_a_build_error_naming_the_value() {
    support::rt::paused().block_on(async {
        for max in [0_u64, 1, 100, 511] {
            let sink = TestSink::new("probe");
            let built = Outbox::builder(sink)
                .journal(mem_journal().max_bytes(Some(max)))
                .build();
            match built {
                Err(e) => assert!(e.to_string().contains(&max.to_string()), "{max}: {e}"),
                Ok(_) => panic!("max_bytes {max} was accepted"),
            }
        }
    });
}

/// Stages one item per round to three tenants in turn and settles (then,
/// if `syncs`, syncs twice: the marks, then the deletions they allow), 150
/// rounds: each must be accepted and written.
async fn steady_load(outbox: &Outbox<TestSink>, sink: &TestSink, what: &str, syncs: bool) {
    for round in 0..150_u32 {
        let tenant = t(u128::from(round % 3));
        assert_eq!(
            outbox.stage(tenant, round),
            Staged::Accepted,
            "{what}: round {round}: {:?}",
            outbox.counters()
        );
        let report = outbox.settle(5 * S).await;
        assert_eq!(report.pending, 0, "{what}: round {round}: {report:?}");
        if syncs {
            for _ in 0..2 {
                assert_eq!(outbox.sync().await, Ok(()));
            }
        } else {
            // No `sync`: the room comes back at the group commits that
            // follow the settle, within a few `sync_interval`s (S-J10).
            tokio::time::sleep(20 * MS).await;
        }
    }
    let written: usize = sink.store().values().map(Vec::len).sum();
    assert_eq!(written, 150, "{what}");
}

/// Every tiny bound in a grid that the build accepts runs the steady load.
async fn tiny_bounds(syncs: bool) {
    let mut accepted = 0;
    for max in [512_u64, 600, 768, 1_024, 1_536, 2_048, 4_096] {
        for segment in [
            None,
            Some(128),
            Some(160),
            Some(256),
            Some(400),
            Some(1_024),
        ] {
            let mut journal = mem_journal().max_bytes(Some(max));
            if let Some(s) = segment {
                journal = journal.segment_bytes(s);
            }
            let sink = TestSink::new("probe");
            let built = Outbox::builder(sink.clone()).journal(journal).build();
            let Ok(outbox) = built else { continue };
            accepted += 1;
            let what = format!("max {max}, segment {segment:?}");
            steady_load(&outbox, &sink, &what, syncs).await;
            outbox.shutdown(S).await;
        }
    }
    assert!(accepted > 0, "no tiny bound was accepted");
}

#[test]
fn s_j10_every_accepted_tiny_bound_keeps_accepting_with_settles_and_syncs() {
    support::rt::paused().block_on(tiny_bounds(true));
}

/// A service that settles (a flush at the end of a job) and never calls
/// `sync`: the room of what it settled comes back with the group commits
/// after the settle, not at its answer (S-J10, S-J2).
#[test]
fn s_j10_every_accepted_tiny_bound_keeps_accepting_with_settles_and_the_commits_after_them() {
    support::rt::paused().block_on(tiny_bounds(false));
}

// ----- S-R4, I13: run-time dead letters -----------------------------------

#[test]
fn s_r4_dead_letters_carry_reason_order_and_attempted() {
    support::rt::paused().block_on(async {
        let sink = TestSink::new("probe");
        let (letters, mut rx) = DeadLetters::channel(64);
        let config = Config::builder()
            .concurrency(1)
            .max_attempts(3)
            .initial_backoff(10 * MS)
            .max_item_age(S)
            .build()
            .unwrap();
        let outbox = Outbox::builder(sink.clone())
            .config(config)
            .dead_letters(letters)
            .build()
            .unwrap();
        // Tenant 1: rejected terminally. Tenant 2: retries run out.
        sink.script(t(1), [Act::Terminal]);
        let _ = outbox.stage(t(1), 1);
        let _ = outbox.stage(t(1), 2);
        sink.set(t(2), Act::Fail);
        let _ = outbox.stage(t(2), 3);
        let report = outbox.flush(10 * S).await;
        assert_eq!(report.lost, 3, "{report:?}");
        // Tenant 4 holds the one slot; tenant 3 expires before its first write.
        sink.set(t(4), Act::Hang);
        let _ = outbox.stage(t(4), 4);
        sink.until_attempts(t(4), 1).await;
        let _ = outbox.stage(t(3), 5);
        tokio::time::sleep(2 * S).await;
        let mut got = Vec::new();
        while let Ok(l) = rx.try_recv() {
            got.push((l.tenant, l.items, l.reason, l.attempted));
        }
        assert!(
            got.contains(&(t(1), vec![1, 2], DeadReason::Terminal, true)),
            "{got:?}"
        );
        assert!(
            got.contains(&(t(2), vec![3], DeadReason::RetriesExhausted, true)),
            "{got:?}"
        );
        assert!(
            got.contains(&(t(3), vec![5], DeadReason::Expired, false)),
            "{got:?}"
        );
        assert_eq!(sink.attempts_of(t(2)).len(), 3);
        assert!(sink.attempts_of(t(3)).is_empty());
        let c = outbox.counters();
        assert_eq!(c.lost(LostReason::Terminal), 2);
        assert_eq!(c.lost(LostReason::RetriesExhausted), 1);
        assert_eq!(c.lost(LostReason::Expired), 1);
        // I13: every item handed out is a counted loss, each once.
        let handed: usize = got.iter().map(|l| l.1.len()).sum();
        assert_eq!(handed, 4, "{got:?}");
        assert_eq!(outbox.health().dead_letters_dropped, 0);
        sink.release();
    });
}

#[test]
fn s_r4_the_drop_policy_hands_its_items_out_under_sink_error() {
    support::rt::paused().block_on(async {
        let sink = TestSink::new("probe");
        let (letters, mut rx) = DeadLetters::channel(1);
        let config = Config::builder().error_policy(ErrorPolicy::Drop);
        let outbox = Outbox::builder(sink.clone())
            .config(config.build().unwrap())
            .dead_letters(letters)
            .build()
            .unwrap();
        sink.set(t(1), Act::Fail);
        let _ = outbox.stage(t(1), 1);
        let _ = outbox.flush(S).await;
        let _ = outbox.stage(t(1), 2);
        let report = outbox.flush(S).await;
        assert_eq!((report.dropped, report.pending), (1, 0), "{report:?}");
        let l = rx.try_recv().expect("one letter");
        assert_eq!(
            (l.tenant, l.items, l.reason, l.attempted),
            (t(1), vec![1], DeadReason::SinkError, true)
        );
        // The second found the channel full: dropped and counted.
        assert_eq!(outbox.health().dead_letters_dropped, 1);
        assert_eq!(outbox.counters().dropped(DropReason::SinkError), 2);
    });
}

#[test]
fn s_j3_a_dead_lettered_item_is_done_in_the_journal() {
    // S-J3: items lost are marked done; a crash after the mark is synced
    // stages nothing again.
    let disk = MemStorage::new();
    let sink = TestSink::new("probe");
    support::rt::current().block_on(async {
        let (letters, mut rx) = DeadLetters::channel(8);
        let outbox = Outbox::builder(sink.clone())
            .dead_letters(letters)
            .journal(JournalConfig::with_storage(disk.clone()).sync_interval(MS))
            .build()
            .unwrap();
        sink.script(t(1), [Act::Terminal]);
        let _ = outbox.stage(t(1), 1);
        let report = outbox.flush(5 * S).await;
        assert_eq!(report.lost, 1, "{report:?}");
        assert_eq!(rx.recv().await.unwrap().items, [1]);
        let _ = outbox.stage(t(1), 2);
        assert_eq!(outbox.flush(5 * S).await.written, 1);
        assert_eq!(outbox.sync().await, Ok(()));
        std::mem::forget(outbox);
    });
    disk.crash();
    let sink = TestSink::new("after");
    support::rt::current().block_on(async {
        let outbox = Outbox::builder(sink.clone())
            .journal(JournalConfig::with_storage(disk.clone()).sync_interval(MS))
            .build()
            .unwrap();
        let c = outbox.counters();
        assert_eq!(c.recovered, 0, "{c:?}");
        outbox.shutdown(S).await;
    });
}

// ----- S-J14: codec versions ----------------------------------------------

#[test]
fn s_j14_only_undone_items_of_another_version_are_refused_in_staging_order() {
    use std::sync::{Arc, Mutex};

    use outbox::journal::{JournalError, OtherRecord, OtherVersion, Postcard, Versioned};
    use outbox::BuildError;

    let disk = MemStorage::new();
    let journal = || {
        JournalConfig::with_storage(disk.clone())
            .sync_interval(MS)
            .segment_bytes(512)
    };
    // Life 1, codec version 1: tenant 2's items are written, tenant 1's and
    // tenant 3's hang; several segments roll.
    let sink = TestSink::new("v1");
    sink.set(t(1), Act::Hang);
    sink.set(t(3), Act::Hang);
    support::rt::current().block_on(async {
        let o = Outbox::builder(sink.clone())
            .journal_with_codec(journal(), Versioned::new(Postcard, 1))
            .build()
            .unwrap();
        for i in 0..40 {
            assert_eq!(o.stage(t(1 + u128::from(i % 2)), i), Staged::Accepted);
        }
        o.sync().await.unwrap();
        sink.until(|s| s.stored(t(2)).len() == 20).await;
        // A later record's commit carries the done marks taken before it.
        assert_eq!(o.stage(t(3), 99), Staged::Accepted);
        o.sync().await.unwrap();
        std::mem::forget(o);
    });
    disk.crash();
    let odd: Vec<u32> = (0..40).filter(|i| i % 2 == 1).collect();
    assert_eq!(sink.stored(t(2)), odd);

    // Version 2, `Fail`: a build error naming the versions and the count.
    support::rt::current().block_on(async {
        let built = Outbox::builder(TestSink::new("fail"))
            .journal_with_codec(
                journal().other_version(OtherVersion::Fail),
                Versioned::new(Postcard, 2),
            )
            .build();
        match built {
            Err(BuildError::Journal(JournalError::OtherVersion { .. })) => {}
            Err(other) => panic!("{other:?}"),
            Ok(_) => panic!("built over another version's items"),
        }
    });

    // Version 2, `Hand`: exactly the 21 items not done, in staging order.
    let handed: Arc<Mutex<Vec<OtherRecord>>> = Arc::default();
    let seen = Arc::clone(&handed);
    let after = TestSink::new("v2");
    support::rt::current().block_on(async {
        let o = Outbox::builder(after.clone())
            .journal_with_codec(
                journal().other_version(OtherVersion::hand(move |r| seen.lock().unwrap().push(r))),
                Versioned::new(Postcard, 2),
            )
            .build()
            .unwrap();
        let c = o.counters();
        assert_eq!(c.lost(LostReason::OtherVersion), 21, "{c:?}");
        assert_eq!(c.pending, 0, "{c:?}");
        assert!(c.balanced(), "{c:?}");
        o.shutdown(S).await;
    });
    let handed = handed.lock().unwrap().clone();
    let items: Vec<(outbox::TenantId, u32)> = handed
        .iter()
        .map(|r| {
            assert_eq!(r.version, 1);
            (
                postcard::from_bytes(&r.tenant).unwrap(),
                postcard::from_bytes(&r.item).unwrap(),
            )
        })
        .collect();
    let mut want: Vec<(outbox::TenantId, u32)> =
        (0..40).filter(|i| i % 2 == 0).map(|i| (t(1), i)).collect();
    want.push((t(3), 99));
    assert_eq!(items, want);
    assert!(after.store().is_empty(), "nothing of version 1 was decoded");
}

#[test]
fn s_r5_stage_wait_gets_journal_room_once_the_items_holding_it_settle() {
    // S-R5: `stage_wait` waits only for room; a full journal (S-J4) has
    // room again once the items holding it are written and their segment
    // goes (S-J2). The wait must end in an acceptance, not a timeout.
    support::rt::paused().block_on(async {
        let sink = TestSink::new("probe");
        let journal = mem_journal().max_bytes(Some(4_096));
        let codec = Picky {
            refuse: |_| false,
            panic: |_| false,
            pad: |_| 200,
        };
        let outbox = Outbox::builder(sink.clone())
            .journal_with_codec(journal, codec)
            .build()
            .unwrap();
        sink.set(t(1), Act::Hang);
        let mut accepted = 0;
        for i in 0..100 {
            match outbox.stage(t(1), i) {
                Staged::Accepted => accepted += 1,
                Staged::Dropped(DropReason::JournalFull) => break,
                other => panic!("{i}: {other:?}"),
            }
        }
        assert!((1..100).contains(&accepted), "{accepted} accepted");
        let waiting = {
            let outbox = outbox.clone();
            tokio::spawn(async move { outbox.stage_wait(t(2), 500, 30 * S).await })
        };
        tokio::time::sleep(100 * MS).await;
        assert!(!waiting.is_finished(), "the journal is full: it waits");
        sink.set(t(1), Act::Ok);
        sink.release();
        let start = Instant::now();
        match waiting.await.unwrap() {
            Ok(()) => {}
            other => {
                // Was there room? A plain `try_stage` answers.
                let room = outbox.try_stage(t(2), 501);
                panic!(
                    "after {:?}: {other:?}; try_stage then: {room:?}; {:?}",
                    Instant::now() - start,
                    outbox.counters()
                )
            }
        }
        let report = outbox.flush(5 * S).await;
        assert_eq!(report.pending, 0, "{report:?}");
        assert_eq!(sink.stored(t(2)), [500]);
    });
}

#[test]
fn s_j3_a_shutdowns_dead_letters_are_done_and_d6_leaves_one_empty_segment() {
    // S-J3: the items a shutdown hands back are the caller's: marked done,
    // never staged again. D6: after the last handle drops, the directory
    // holds the lock file and one empty segment (its header and schema
    // record).
    let disk = MemStorage::new();
    let sink = TestSink::new("probe");
    support::rt::current().block_on(async {
        let outbox = Outbox::builder(sink.clone())
            .journal(JournalConfig::with_storage(disk.clone()).sync_interval(MS))
            .build()
            .unwrap();
        sink.set(t(1), Act::Hang);
        for i in 0..5 {
            let _ = outbox.stage(t(1), i);
        }
        let _ = outbox.stage(t(2), 9);
        let report = outbox.shutdown(200 * MS).await;
        assert_eq!((report.written, report.lost), (1, 5), "{report:?}");
        let back: usize = report.unwritten.iter().map(|u| u.items.len()).sum();
        assert_eq!(back, 5);
        let closed = outbox.closed();
        drop(outbox);
        sink.release();
        closed.await;
    });
    let files = disk.files();
    let segments: Vec<_> = files
        .iter()
        .filter(|(n, _)| n.starts_with("segment-"))
        .collect();
    assert_eq!(segments.len(), 1, "{:?}", files.keys().collect::<Vec<_>>());
    // Its 32-byte header and the schema record of `u32` (S-J14).
    assert_eq!(
        segments[0].1.len(),
        48,
        "{:?}: {:02x?}",
        segments[0].0,
        segments[0].1
    );
    disk.crash();
    let again = TestSink::new("after");
    support::rt::current().block_on(async {
        let outbox = Outbox::builder(again.clone())
            .journal(JournalConfig::with_storage(disk.clone()).sync_interval(MS))
            .build()
            .unwrap();
        assert_eq!(outbox.counters().recovered, 0, "{:?}", outbox.counters());
        outbox.shutdown(S).await;
    });
}

// ----- S-W20: what the caller's iterator does lands before the run --------

#[test]
fn s_w20_a_shutdown_begun_inside_the_iterator_refuses_the_whole_run() {
    support::rt::paused().block_on(async {
        let sink = TestSink::new("probe");
        let outbox = journaled(&sink, Config::builder().tenant_capacity(8));
        let inner = outbox.clone();
        let run = (0..3_u32).map(move |i| {
            if i == 1 {
                drop(inner.shutdown(S));
            }
            (t(1), i)
        });
        let outcomes = outbox.stage_many_outcomes(run);
        assert_eq!(outcomes, [Staged::ShuttingDown; 3]);
        all_settled(&outbox, LostReason::Shutdown, 3);
    });
}

#[test]
fn s_w20_a_panicking_iterator_stages_what_it_yielded_then_panics() {
    support::rt::paused().block_on(async {
        let sink = TestSink::new("probe");
        let outbox = journaled(&sink, Config::builder().tenant_capacity(8));
        let run = (0..5_u32).map(|i| {
            assert!(i < 3, "review probe: the caller's iterator panics");
            (t(1), i)
        });
        let caught =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| outbox.stage_many(run)));
        assert!(
            caught.is_err(),
            "the iterator's panic goes on to the caller"
        );
        let c = outbox.counters();
        assert_eq!((c.staged, c.pending), (3, 3), "{c:?}");
        let report = outbox.flush(5 * S).await;
        assert_eq!(report.written, 3, "{report:?}");
        assert_eq!(sink.stored(t(1)), [0, 1, 2]);
    });
}

// ----- S-J5, S-W15: a journal that is down --------------------------------

#[test]
fn s_j5_a_journal_that_is_down_writes_items_and_a_shutdown_answers_by_its_deadline() {
    support::rt::paused().block_on(async {
        let disk = MemStorage::new();
        let sink = TestSink::new("probe");
        let journal = JournalConfig::with_storage(disk.clone())
            .inline_io(true)
            .retry_interval(100 * MS);
        let outbox = Outbox::builder(sink.clone())
            .journal(journal)
            .build()
            .unwrap();
        disk.fail(Some(std::io::ErrorKind::Other));
        for i in 0..4 {
            assert_eq!(outbox.stage(t(1), i), Staged::Accepted);
        }
        assert!(outbox.sync().await.is_err(), "S-J5: sync says so");
        let report = outbox.flush(5 * S).await;
        assert_eq!(report.pending, 0, "{report:?}");
        assert_eq!(outbox.counters().written, 4);
        sink.set(t(2), Act::Hang);
        assert_eq!(outbox.stage(t(2), 9), Staged::Accepted);
        let start = Instant::now();
        let report = outbox.shutdown(2 * S).await;
        let took = Instant::now() - start;
        assert!(took <= 2 * S, "answered after {took:?}");
        assert_eq!((report.lost, report.pending), (1, 0), "{report:?}");
        assert_eq!(sink.stored(t(1)), [0, 1, 2, 3]);
    });
}

#[test]
fn s_r5_a_waiting_stage_answers_when_the_outbox_is_abandoned() {
    // An abandon gives up at once (S-A7) and fences like a shutdown: a
    // stage waiting for room must not sit out its whole timeout.
    support::rt::paused().block_on(async {
        let sink = TestSink::new("probe");
        let outbox = journaled(&sink, Config::builder().tenant_capacity(1));
        sink.set(t(1), Act::Hang);
        assert_eq!(outbox.stage(t(1), 1), Staged::Accepted);
        let waiting = {
            let outbox = outbox.clone();
            tokio::spawn(async move { outbox.stage_wait(t(1), 2, 60 * S).await })
        };
        tokio::time::sleep(100 * MS).await;
        let at = Instant::now();
        let _ = outbox.abandon();
        match waiting.await.unwrap() {
            Err(StageError::ShuttingDown(2)) => {}
            other => panic!("{other:?}"),
        }
        assert_eq!(Instant::now(), at, "answered at the abandon");
    });
}
