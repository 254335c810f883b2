//! S-J5 and S-J6, disk faults at run time and one process per journal:
//! a disk that fails and recovers, a disk that keeps failing while the
//! outbox closes, huge retry intervals, a failure during the first commit.
//! Paused clock, `inline_io` (the commit runs on the journal's task).
#![cfg(feature = "journal")]

mod support;

use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox::journal::MemStorage;
use outbox::{Outbox, Staged, SyncError};
use support::gated::{build, config, Gated};
use support::{t, Act, TestSink};
use tokio::time::Instant;

const S: Duration = Duration::from_secs(1);

/// What a [`flaky`] disk does.
#[derive(Default)]
struct Ctl {
    /// Every mutating call fails.
    fail_all: bool,
    /// Only `sync` fails.
    fail_sync: bool,
    /// Only `delete` fails.
    fail_delete: bool,
    /// Mutating calls that failed, with the (virtual) time.
    failures: Vec<(&'static str, Instant)>,
    /// Mutating calls that worked.
    worked: u64,
}

/// A `MemStorage` with faults per kind of call (as `Ctl` says), and a log
/// of them.
fn flaky(mem: &MemStorage) -> (Gated, Arc<Mutex<Ctl>>) {
    let ctl = Arc::new(Mutex::new(Ctl::default()));
    let c = Arc::clone(&ctl);
    let disk = Gated::new(
        mem,
        Arc::new(move |op, _, _, _| {
            let mut c = c.lock().unwrap();
            if c.fail_all || (op == "sync" && c.fail_sync) || (op == "delete" && c.fail_delete) {
                c.failures.push((op, Instant::now()));
                return Err(io::Error::other(format!("injected on {op}")));
            }
            c.worked += 1;
            Ok(())
        }),
    );
    (disk, ctl)
}

/// Items recovered by a fresh outbox on `mem` (whose sink hangs), then
/// abandoned.
fn recovered_on(mem: &MemStorage) -> u64 {
    let mem = mem.clone();
    std::thread::spawn(move || recovered_on_thread(&mem))
        .join()
        .unwrap()
}

fn recovered_on_thread(mem: &MemStorage) -> u64 {
    let sink = TestSink::new("probe");
    sink.set_all(Act::Hang);
    let rt = support::rt::current();
    rt.block_on(async {
        let o = build(&sink, mem.clone(), S);
        let n = o.counters().recovered;
        o.abandon();
        n
    })
}

fn failures_since(ctl: &Arc<Mutex<Ctl>>, since: Instant) -> Vec<Duration> {
    ctl.lock()
        .unwrap()
        .failures
        .iter()
        .filter(|(_, at)| *at >= since)
        .map(|(_, at)| *at - since)
        .collect()
}

/// Stage 3 items to T1, sync them (durable), then the disk fails and the
/// journal goes down; the sink writes them.
///
/// `marks_in_failed_commit`: the sink writes them before the first failed
/// commit, so their done marks are in that failed commit (the resume's
/// redo). Otherwise the failed commit carries a fresh item (T9) and the
/// three are written while the journal is down (marks the ledger holds).
async fn written_while_down(
    sink: &TestSink,
    o: &Outbox<TestSink>,
    ctl: &Arc<Mutex<Ctl>>,
    marks_in_failed_commit: bool,
) {
    sink.set_all(Act::Hang);
    for i in 0..3 {
        assert_eq!(o.stage(t(1), i), Staged::Accepted);
    }
    assert_eq!(o.sync().await, Ok(()));
    ctl.lock().unwrap().fail_all = true;
    if marks_in_failed_commit {
        sink.set_all(Act::Ok);
        sink.release();
        assert_eq!(o.flush(5 * S).await.pending, 0);
        let r = o.sync().await;
        assert!(
            matches!(r, Err(SyncError::Failed(_)) | Err(SyncError::Down { .. })),
            "{r:?}"
        );
    } else {
        sink.set(t(9), Act::Hang);
        assert_eq!(o.stage(t(9), 100), Staged::Accepted);
        let r = o.sync().await;
        assert!(matches!(r, Err(SyncError::Failed(_))), "{r:?}");
        // Its write hangs before the release below lets it go (a write
        // started after it would hang for good).
        sink.until_attempts(t(9), 1).await;
        sink.set(t(1), Act::Ok);
        sink.release();
        sink.set_all(Act::Ok);
        assert_eq!(o.flush(5 * S).await.pending, 0);
    }
    assert_eq!(sink.stored(t(1)), [0, 1, 2]);
}

/// S-J5: "A journal that still fails while the outbox closes retries five
/// more times, each `retry_interval` after the last, then its task exits
/// and releases the directory's lock".
async fn close_on_a_failing_disk(marks_in_failed_commit: bool) {
    let mem = MemStorage::new();
    let (disk, ctl) = flaky(&mem);
    let sink = TestSink::new("close-failing");
    let o = build(&sink, disk, S);
    written_while_down(&sink, &o, &ctl, marks_in_failed_commit).await;
    let report = o.shutdown(S).await;
    let closed = o.closed();
    let began = Instant::now();
    drop(o);
    tokio::time::timeout(3600 * S, closed)
        .await
        .expect("closed() resolves: the journal gives up");
    let took = began.elapsed();
    let tries = failures_since(&ctl, began);
    // The lock is free: a rebuild works (the marks never written stage
    // the 3 items again: written twice at worst).
    ctl.lock().unwrap().fail_all = false;
    let again = recovered_on(&mem);
    eprintln!(
        "lost {}; closing took {took:?}; failed calls at {tries:?}; recovered at rebuild {again}",
        report.lost
    );
    assert!(
        tries.len() >= 6,
        "the first closing round plus five retries, one per retry_interval: \
         {} failed calls in {took:?}: {tries:?}",
        tries.len()
    );
}

#[tokio::test(start_paused = true)]
async fn s_j5_closing_retries_marks_taken_while_down() {
    close_on_a_failing_disk(false).await;
}

#[tokio::test(start_paused = true)]
async fn s_j5_closing_retries_marks_of_the_failed_commit() {
    close_on_a_failing_disk(true).await;
}

/// The same, with the disk healing during the closing retries (after the
/// second one): the marks should then be written, and nothing is staged
/// again at the next start.
#[tokio::test(start_paused = true)]
async fn s_j5_a_disk_that_heals_during_the_closing_retries_gets_the_marks() {
    let mem = MemStorage::new();
    let (disk, ctl) = flaky(&mem);
    let sink = TestSink::new("close-heals");
    let o = build(&sink, disk, S);
    written_while_down(&sink, &o, &ctl, true).await;
    o.shutdown(S).await;
    let closed = o.closed();
    drop(o);
    let heal = {
        let ctl = Arc::clone(&ctl);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(2_500)).await;
            ctl.lock().unwrap().fail_all = false;
        })
    };
    tokio::time::timeout(3600 * S, closed)
        .await
        .expect("closes");
    heal.abort();
    ctl.lock().unwrap().fail_all = false;
    assert_eq!(
        recovered_on(&mem),
        0,
        "the disk healed 2.5 s into a close that retries for 5 s: the marks \
         should have been written"
    );
}

/// S-J5/S-J6 with a huge `retry_interval`: "a disk that stays broken must
/// not hold the close, and the directory's lock, for ever" (faults.rs).
#[tokio::test(start_paused = true)]
async fn s_j6_a_huge_retry_interval_does_not_hold_the_lock_for_ever() {
    let mem = MemStorage::new();
    let (disk, ctl) = flaky(&mem);
    let sink = TestSink::new("close-huge");
    let o = build(&sink, disk, Duration::MAX);
    written_while_down(&sink, &o, &ctl, false).await;
    o.shutdown(S).await;
    let closed = o.closed();
    drop(o);
    let r = tokio::time::timeout(24 * 3600 * S, closed).await;
    assert!(
        r.is_ok(),
        "closed() still pending after a virtual day (retry_interval = Duration::MAX)"
    );
}

/// S-J5 during the very first commit (the one that creates the first
/// segment): sync says so; once the disk heals the journal resumes, a
/// later sync answers Ok, and a crash then keeps what it covered.
#[tokio::test(start_paused = true)]
async fn s_j5_a_failure_in_the_first_commit_then_a_crash() {
    let mem = MemStorage::new();
    let (disk, ctl) = flaky(&mem);
    ctl.lock().unwrap().fail_sync = true;
    let sink = TestSink::new("first");
    sink.set_all(Act::Hang);
    let o = build(&sink, disk, Duration::from_millis(100));
    for i in 0..3 {
        assert_eq!(o.stage(t(1), i), Staged::Accepted);
    }
    let r = o.sync().await;
    assert!(matches!(r, Err(SyncError::Failed(_))), "{r:?}");
    ctl.lock().unwrap().fail_sync = false;
    tokio::time::sleep(Duration::from_millis(150)).await;
    // Resumed? Stage more; 0..3 are in memory only, so sync says Down.
    for i in 3..6 {
        assert_eq!(o.stage(t(1), i), Staged::Accepted);
    }
    let r = o.sync().await;
    assert_eq!(r, Err(SyncError::Down { undurable: 3 }));
    // Now let the sink write them; sync must turn Ok.
    sink.set_all(Act::Ok);
    sink.release();
    assert_eq!(o.flush(5 * S).await.pending, 0);
    for i in 6..9 {
        assert_eq!(o.stage(t(1), i), Staged::Accepted);
    }
    sink.set_all(Act::Hang);
    // 6..9 are pending in a hanging write or waiting.
    let mut ok = false;
    for _ in 0..50 {
        if o.sync().await == Ok(()) {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ok, "sync never answered Ok after the heal");
    // Crash: what the Ok sync covered (6..9) comes back.
    std::mem::forget(o);
    mem.crash();
    let n = recovered_on(&mem);
    assert!(n >= 3, "recovered {n}, want at least 6, 7, 8");
}

/// S-J5: "the items of the failed commit and every item staged until the
/// journal works again are ... counted as unjournaled"
/// (`outbox_items_unjournaled_total`). Three items are in the commit that
/// fails; one more is staged while the journal is down.
#[test]
fn s_j5_items_of_the_failed_commit_are_counted_unjournaled() {
    let ((), snap) = support::with_metrics(|| async {
        let mem = MemStorage::new();
        let (disk, ctl) = flaky(&mem);
        let sink = TestSink::new("unjournaled");
        sink.set_all(Act::Hang);
        let o = build(&sink, disk, S);
        // Nothing committed yet but the empty first segment.
        assert_eq!(o.sync().await, Ok(()));
        ctl.lock().unwrap().fail_all = true;
        for i in 0..3 {
            assert_eq!(o.stage(t(1), i), Staged::Accepted);
        }
        assert!(matches!(o.sync().await, Err(SyncError::Failed(_))));
        assert_eq!(o.stage(t(1), 3), Staged::Accepted);
        assert_eq!(o.sync().await, Err(SyncError::Down { undurable: 4 }));
        o.abandon();
    });
    let m = support::snapshot(&snap);
    let got = match m.get(&(
        "outbox_items_unjournaled_total".to_owned(),
        "unjournaled".to_owned(),
        None,
    )) {
        Some(metrics_util::debugging::DebugValue::Counter(v)) => *v,
        other => panic!("{other:?}"),
    };
    assert_eq!(got, 4, "4 items on no disk (sync says undurable: 4)");
}

/// S-J5 ("items are accepted and written as usual but held in memory
/// only") against S-J4 (`max_bytes`): while the journal is down, every
/// failed retry rolls the ledger to a new segment (32 header bytes that are
/// never written), so a long outage fills `max_bytes` with phantom headers
/// and stages are dropped under `journal_full` though nothing goes to disk.
#[tokio::test(start_paused = true)]
async fn s_j5_a_long_outage_does_not_fill_max_bytes_with_phantom_segments() {
    let mem = MemStorage::new();
    let (disk, ctl) = flaky(&mem);
    let sink = TestSink::new("phantom");
    let o = Outbox::builder(sink.clone())
        .journal(config(disk, Duration::from_millis(1)).max_bytes(Some(64 << 10)))
        .build()
        .unwrap();
    assert_eq!(o.stage(t(1), 0), Staged::Accepted);
    assert_eq!(o.sync().await, Ok(()));
    ctl.lock().unwrap().fail_all = true;
    assert_eq!(o.stage(t(1), 1), Staged::Accepted);
    assert!(matches!(o.sync().await, Err(SyncError::Failed(_))));
    // A 10 s outage, retried every 1 ms; syncs keep kicking the task.
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let _ = o.sync().await;
    }
    let failed = ctl.lock().unwrap().failures.len();
    let r = o.stage(t(1), 2);
    eprintln!("{failed} failed storage calls; stage while down: {r:?}");
    ctl.lock().unwrap().fail_all = false;
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(o.flush(5 * S).await.pending, 0);
    let _ = o.sync().await;
    let after = o.stage(t(1), 3);
    eprintln!(
        "stage after the heal: {after:?}; files {:?}",
        mem.files().keys().collect::<Vec<_>>()
    );
    assert_eq!(after, Staged::Accepted, "after the heal");
    o.shutdown(S).await;
    assert_eq!(
        r,
        Staged::Accepted,
        "the journal is down: nothing goes to disk"
    );
}

/// The same with the default-sized knobs that matter: the failed commit
/// carried the done marks of 2,000 items; every failed retry re-adds their
/// bytes (about 16 KB) to the ledger, so a 1 MiB `max_bytes` is used up by
/// a one-minute outage retried every 100 ms, and stages are dropped.
#[tokio::test(start_paused = true)]
async fn s_j5_redo_marks_are_counted_again_at_every_failed_retry() {
    let mem = MemStorage::new();
    let (disk, ctl) = flaky(&mem);
    let sink = TestSink::new("redo");
    sink.set_all(Act::Hang);
    let o = Outbox::builder(sink.clone())
        .journal(config(disk, Duration::from_millis(100)).max_bytes(Some(1 << 20)))
        .build()
        .unwrap();
    for i in 0..2_000 {
        assert_eq!(o.stage(t(u128::from(i % 50)), i), Staged::Accepted);
    }
    assert_eq!(o.sync().await, Ok(()));
    ctl.lock().unwrap().fail_all = true;
    sink.set_all(Act::Ok);
    sink.release();
    assert_eq!(o.flush(5 * S).await.pending, 0);
    assert!(o.sync().await.is_err());
    for _ in 0..60 {
        tokio::time::sleep(S).await;
        let _ = o.sync().await;
    }
    let r = o.stage(t(1), 9_999);
    eprintln!(
        "{} failed storage calls; stage: {r:?}",
        ctl.lock().unwrap().failures.len()
    );
    o.abandon();
    assert_eq!(
        r,
        Staged::Accepted,
        "nothing is pending; the disk holds ~50 KB"
    );
}

/// Scenarios 6 and 16 with the journal on (a healthy disk): the shutdown
/// still answers at its deadline, with the right loss.
#[tokio::test(start_paused = true)]
async fn scenarios_06_and_16_with_a_journal() {
    let mem = MemStorage::new();
    let sink = TestSink::new("s16j");
    sink.set_all(Act::Hang);
    let o = build(&sink, mem.clone(), S);
    assert_eq!(o.stage(t(1), 1), Staged::Accepted);
    sink.until_attempts(t(1), 1).await;
    let began = Instant::now();
    let r = o.shutdown(Duration::from_millis(500)).await;
    let took = began.elapsed();
    assert_eq!(r.lost, 1);
    assert!(
        took >= Duration::from_millis(500) && took <= Duration::from_millis(520),
        "{took:?}"
    );
    assert_eq!(o.pending(), 0);
    let closed = o.closed();
    drop(o);
    tokio::time::timeout(10 * S, closed).await.expect("closes");
    assert_eq!(
        recovered_on(&mem),
        0,
        "handed back as dead letters, marked done"
    );

    let mem = MemStorage::new();
    let sink = TestSink::new("s06j");
    sink.set(t(1), Act::Fail);
    sink.set(t(2), Act::Hang);
    let o = build(&sink, mem.clone(), S);
    for i in [1, 2] {
        assert_eq!(o.stage(t(1), i), Staged::Accepted);
    }
    assert_eq!(o.stage(t(2), 3), Staged::Accepted);
    let began = Instant::now();
    let r = o.shutdown(Duration::from_millis(200)).await;
    assert_eq!(r.lost, 3);
    assert!(
        began.elapsed() <= Duration::from_millis(220),
        "{:?}",
        began.elapsed()
    );
    assert!(sink.store().is_empty());
    assert_eq!(o.pending(), 0);
}

/// A disk where only unlink fails (a lost permission on the directory):
/// writes and fdatasync still work, but a failed segment deletion takes
/// the whole journal down, and every resume redoes the deletion first, so
/// the journal never comes back while unlink fails: every later item is
/// held in memory only and `sync` answers an error.
#[tokio::test(start_paused = true)]
async fn a_disk_that_only_refuses_deletions_keeps_the_journal_down() {
    let mem = MemStorage::new();
    let (disk, ctl) = flaky(&mem);
    let sink = TestSink::new("nodelete");
    let o = build(&sink, disk, Duration::from_millis(100));
    ctl.lock().unwrap().fail_delete = true;
    // Enough items for several 4 KiB segments, all written (their
    // segments become deletable).
    for i in 0..1_000 {
        assert_eq!(o.stage(t(u128::from(i % 7)), i), Staged::Accepted);
    }
    assert_eq!(o.flush(5 * S).await.pending, 0);
    for _ in 0..20 {
        let _ = o.sync().await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    sink.set_all(Act::Hang);
    assert_eq!(o.stage(t(1), 5_000), Staged::Accepted);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let r = o.sync().await;
    let failed = ctl.lock().unwrap().failures.len();
    let files = mem.files().len();
    eprintln!("sync: {r:?}; {failed} failed deletes; {files} files on disk");
    o.abandon();
    assert_eq!(
        r,
        Ok(()),
        "appends and fdatasync work: the new item could be journaled"
    );
}
