//! S-W18: every attempt ends in exactly one counted outcome, written or
//! failed by kind, in the counters and in the exported metrics (issue 10,
//! input 3), through the tokio driver on tokio's paused clock.

mod support;

use std::time::Duration;

use outbox::core::Failure;
use outbox::{Config, LostReason, Outbox, Staged, TenantId};
use support::*;

fn stage_all(o: &Outbox<TestSink>, tenant: TenantId, items: impl IntoIterator<Item = u32>) {
    for i in items {
        assert_eq!(o.stage(tenant, i), Staged::Accepted);
    }
}

/// Issue 10, input 3: one item, a sink that never answers,
/// `shutdown(100 ms)`. The attempt cancelled at the deadline is counted
/// failed (kind `cancelled`), exported with its kind, and sampled by the
/// latency histogram.
#[test]
fn an_attempt_cancelled_at_the_shutdown_deadline_is_counted_failed() {
    let (counters, snap) = with_metrics(|| async {
        let sink = TestSink::new("w18-hang");
        sink.set_all(Act::Hang);
        let o = Outbox::new(sink.clone(), Config::default()).unwrap();
        stage_all(&o, t(1), [1]);
        sink.until_attempts(t(1), 1).await;
        let r = o.shutdown(100 * MS).await;
        assert!(r.deadline_passed);
        assert_eq!(r.lost, 1);
        assert_eq!(r.unwritten, [(t(1), vec![1])], "handed back (S-B6)");
        o.counters()
    });
    assert_eq!(
        (
            counters.attempts,
            counters.writes,
            counters.failed_attempts,
            counters.failed(Failure::Cancelled),
            counters.lost(LostReason::Deadline),
        ),
        (1, 0, 1, 1, 1)
    );
    assert_eq!(counters.attempts, counters.attempts_ended());
    let m = snapshot(&snap);
    assert_metrics_match(&m, "w18-hang", &counters);
    assert_eq!(latency_samples(&m, "w18-hang"), 1, "the cancelled attempt");
}

/// S-W18 over every kind the driver reports: errors, a panic, a timeout,
/// a terminal rejection, a write; at the quiet point the attempts equal
/// the writes plus the failures, in the counters, the metrics and the
/// histogram's sample count.
#[test]
fn attempts_equal_writes_plus_failures_by_kind_at_a_quiet_point() {
    let (counters, snap) = with_metrics(|| async {
        let sink = TestSink::new("w18-kinds");
        let config = Config::builder()
            .write_timeout(Duration::from_millis(50))
            .initial_backoff(Duration::from_millis(1))
            .build()
            .unwrap();
        let o = Outbox::new(sink.clone(), config).unwrap();
        sink.script(t(1), [Act::Fail, Act::Panic, Act::Hang, Act::Ok]);
        sink.script(t(2), [Act::Terminal]);
        stage_all(&o, t(1), [1, 2]);
        stage_all(&o, t(2), [3]);
        let r = o.settle(Duration::from_secs(10)).await;
        assert_eq!(r.pending, 0);
        assert_eq!(sink.stored(t(1)), [1, 2]);
        o.counters()
    });
    let kinds: Vec<(Failure, u64)> = Failure::ALL
        .into_iter()
        .map(|k| (k, counters.failed(k)))
        .filter(|(_, n)| *n > 0)
        .collect();
    assert_eq!(
        kinds,
        [
            (Failure::Error, 1),
            (Failure::Panic, 1),
            (Failure::Timeout, 1),
            (Failure::Rejected, 1)
        ]
    );
    assert_eq!((counters.attempts, counters.writes), (5, 1));
    assert_eq!(counters.attempts, counters.attempts_ended());
    let m = snapshot(&snap);
    assert_metrics_match(&m, "w18-kinds", &counters);
    assert_eq!(latency_samples(&m, "w18-kinds"), 5, "one per attempt");
}

/// S-W18 when the runtime is dropped under a write in flight: its task is
/// lost with the runtime, and the attempt is counted failed (`task_lost`),
/// exported with its kind and sampled by the histogram, like any other.
#[test]
fn an_attempt_in_flight_when_the_runtime_is_dropped_is_counted_failed() {
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let rt = support::rt::paused();
    let (o, sink) = {
        let _in = rt.enter();
        let sink = TestSink::new("w18-rt");
        sink.set_all(Act::Hang);
        let o = metrics::with_local_recorder(&recorder, || {
            Outbox::new(sink.clone(), Config::default()).unwrap()
        });
        (o, sink)
    };
    let _ = o.stage(t(1), 1);
    rt.block_on(sink.until_attempts(t(1), 1));
    drop(rt);
    let c = o.counters();
    assert_eq!(
        (
            c.attempts,
            c.writes,
            c.failed_attempts,
            c.failed(Failure::TaskLost),
            c.lost(LostReason::Abandoned),
        ),
        (1, 0, 1, 1, 1)
    );
    let m = snapshot(&snap);
    assert_metrics_match(&m, "w18-rt", &c);
    assert_eq!(latency_samples(&m, "w18-rt"), 1);
}

/// S-W18 for an abandon under a hung write, the runtime alive: the write
/// is cancelled, and once the writer has handed it back (a quiet point)
/// the attempt is counted failed as `cancelled`, in the counters, the
/// metrics and the histogram, and its item counted lost once (abandoned).
#[test]
fn an_attempt_cancelled_by_an_abandon_is_counted_failed() {
    let (counters, snap) = with_metrics(|| async {
        let sink = TestSink::new("w18-abandon");
        sink.set_all(Act::Hang);
        let o = Outbox::new(sink.clone(), Config::default()).unwrap();
        stage_all(&o, t(1), [1, 2]);
        sink.until_attempts(t(1), 1).await;
        let _ = o.stage(t(2), 3);
        let held = o.abandon();
        // The in-flight write is given up (counted lost, not handed back
        // here); what was only pending is handed back.
        assert_eq!(held, [(t(2), vec![3])]);
        // Let the writer hand the cancelled write back (virtual time).
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(o.pending(), 0);
        o.counters()
    });
    assert_eq!(
        (
            counters.attempts,
            counters.writes,
            counters.failed_attempts,
            counters.failed(Failure::Cancelled),
            counters.lost(LostReason::Abandoned),
        ),
        (1, 0, 1, 1, 3)
    );
    assert_eq!(counters.attempts, counters.attempts_ended());
    assert!(counters.balanced());
    let m = snapshot(&snap);
    assert_metrics_match(&m, "w18-abandon", &counters);
    assert_eq!(
        latency_samples(&m, "w18-abandon"),
        1,
        "the cancelled attempt"
    );
}
