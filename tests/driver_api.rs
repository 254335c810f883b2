//! The driver's small public surface: errors, names, debug output, the
//! fence flag and the pending gauge right after a stage (S-W11, S-W9).

mod support;

use std::time::Duration;

use metrics_util::debugging::DebuggingRecorder;
use outbox::telemetry::names::{OLDEST_PENDING, PENDING, TENANTS, WRITES_IN_FLIGHT};
use outbox::{BuildError, Config, ConfigError, Outbox};
use support::{gauge, snapshot, t, Act, TestSink};

#[test]
fn build_errors_render_and_chain_their_cause() {
    let err = BuildError::Config(ConfigError::Zero { field: "capacity" });
    assert!(err.to_string().contains("capacity"), "{err}");
    let source = std::error::Error::source(&err).expect("the config error is the cause");
    assert!(source.to_string().contains("capacity"));
    assert!(!BuildError::NoRuntime.to_string().is_empty());
    assert!(std::error::Error::source(&BuildError::NoRuntime).is_none());
}

/// A sink's error keeps its cause reachable through the standard error
/// chain, so reporters that walk `source()` show it (S-A5).
#[test]
fn write_errors_render_their_kind_and_chain_their_cause() {
    use outbox::{ErrorKind, WriteError};
    let cause = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "peer reset");
    let err = WriteError::retryable(cause);
    assert_eq!(err.kind(), ErrorKind::Retryable);
    assert!(!err.is_terminal());
    assert_eq!(err.to_string(), "retryable write error: peer reset");
    let source = std::error::Error::source(&err).expect("the cause is the source");
    assert_eq!(source.to_string(), "peer reset");
    assert!(source.downcast_ref::<std::io::Error>().is_some());
    assert_eq!(err.cause().to_string(), "peer reset");
    let err = WriteError::terminal("bad row");
    assert!(err.is_terminal());
    assert_eq!(err.to_string(), "terminal write error: bad row");
}

#[test]
fn an_outbox_names_itself_and_says_when_the_fence_is_up() {
    support::rt::paused().block_on(async {
        let builder = Outbox::builder(TestSink::new("api-name"));
        assert!(format!("{builder:?}").contains("OutboxBuilder"));
        let o = builder.build().unwrap();
        assert_eq!(o.name(), "api-name");
        assert!(format!("{o:?}").contains("api-name"), "{o:?}");
        assert!(!o.is_shutting_down());
        let answer = o.shutdown(Duration::from_secs(1));
        assert!(format!("{answer:?}").contains("Answer"));
        assert!(o.is_shutting_down(), "the fence is up at the call (S-W9)");
        let _ = answer.await;
    });
}

#[test]
fn the_pending_gauge_is_exact_once_the_stages_are_taken_in() {
    // S-W11/I3, S-W19: a stage is counted when it is taken in; any call
    // that reads the counters takes in what was staged before it, and
    // exports under the lock; the writer need not run.
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let rt = support::rt::paused();
    metrics::with_local_recorder(&recorder, || {
        rt.block_on(async {
            let o = Outbox::new(TestSink::new("api-gauge"), Config::default()).unwrap();
            let _ = o.stage(t(1), 1);
            let _ = o.stage(t(2), 2);
            // No await since the stages: the writer has not run.
            assert_eq!(o.pending(), 2);
            assert_eq!(gauge(&snapshot(&snap), PENDING, "api-gauge"), 2.0);
            assert_eq!(o.settle(Duration::from_secs(1)).await.pending, 0);
            assert_eq!(gauge(&snapshot(&snap), PENDING, "api-gauge"), 0.0);
        })
    });
}

#[test]
fn the_health_gauges_are_current_once_the_work_stops() {
    // The health gauges are refreshed at most once a second while there
    // is work; as it stops they are refreshed once more, so a dashboard
    // never shows writes in flight, tenants or an old pending item long
    // after the outbox went quiet (review: an idle outbox kept its last
    // busy values for good, and its exit too).
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let rt = support::rt::paused();
    metrics::with_local_recorder(&recorder, || {
        rt.block_on(async {
            let sink = TestSink::new("api-quiet");
            sink.set_all(Act::Hang);
            let o = Outbox::new(sink.clone(), Config::default()).unwrap();
            for tenant in 1..=3 {
                let _ = o.stage(t(tenant), tenant as u32);
                sink.until_attempts(t(tenant), 1).await;
            }
            let busy = |name| gauge(&snapshot(&snap), name, "api-quiet");
            assert!(busy(WRITES_IN_FLIGHT) > 0.0, "exported while busy");
            sink.set_all(Act::Ok);
            sink.release();
            assert_eq!(o.settle(Duration::from_secs(1)).await.pending, 0);
            tokio::time::sleep(Duration::from_secs(30)).await;
            let h = o.health();
            assert_eq!((h.tenants, h.in_flight, h.oldest_pending), (0, 0, None));
            for name in [TENANTS, WRITES_IN_FLIGHT, OLDEST_PENDING] {
                assert_eq!(busy(name), 0.0, "{name} after 30 s of quiet");
            }
            // Busy again, then shut down: the exit exports too.
            let _ = o.stage(t(4), 4);
            tokio::task::yield_now().await;
            let report = o.shutdown(Duration::from_secs(1)).await;
            assert_eq!(report.pending, 0);
            for name in [TENANTS, WRITES_IN_FLIGHT, OLDEST_PENDING] {
                assert_eq!(busy(name), 0.0, "{name} after the shutdown");
            }
        })
    });
}

// ----- the tenant key is the user's type ------------------------------------

/// Drives an outbox keyed by `K` through the paths a key takes: three
/// tenants staged interleaved, one failing once (its retry carries the same
/// key), a flush, then a shutdown whose dead letters come back under their
/// keys, ordered by the key's `Ord` (S-W3, S-W5, S-B6).
async fn a_key_round_trips<K: outbox::TenantKey>(keys: [K; 3]) {
    use outbox::Staged;
    use support::{Act, KeyedSink};
    let sink = KeyedSink::<K>::new("keyed");
    sink.script(keys[1].clone(), [Act::Fail]);
    let o = Outbox::new(sink.clone(), Config::default()).unwrap();
    for i in 0..6u32 {
        let k = keys[(i % 3) as usize].clone();
        assert_eq!(o.stage(k, i), Staged::Accepted);
    }
    let report = o.flush(Duration::from_secs(10)).await;
    assert_eq!((report.written, report.pending), (6, 0));
    for (n, k) in keys.iter().enumerate() {
        let n = n as u32;
        assert_eq!(sink.stored(k.clone()), [n, n + 3], "{k:?}");
    }
    assert_eq!(sink.attempts_of(keys[1].clone()).len(), 2, "one retry");

    // Dead letters: every tenant hangs, so everything comes back.
    sink.set_all(Act::Hang);
    for (i, k) in keys.iter().rev().enumerate() {
        assert_eq!(o.stage(k.clone(), 10 + i as u32), Staged::Accepted);
    }
    let report = o.shutdown(Duration::from_secs(1)).await;
    let mut want: Vec<(K, Vec<u32>)> = keys
        .iter()
        .rev()
        .enumerate()
        .map(|(i, k)| (k.clone(), vec![10 + i as u32]))
        .collect();
    want.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(report.unwritten, want);
    assert_eq!(o.counters().pending, 0);
}

#[tokio::test(start_paused = true)]
async fn an_outbox_keyed_by_u64_writes_and_hands_back_by_key() {
    a_key_round_trips([7u64, u64::MAX, 0]).await;
}

#[tokio::test(start_paused = true)]
async fn an_outbox_keyed_by_string_writes_and_hands_back_by_key() {
    a_key_round_trips(["acme".to_owned(), "acme.eu 2".to_owned(), String::new()]).await;
}

#[tokio::test(start_paused = true)]
async fn an_outbox_keyed_by_arc_str_writes_and_hands_back_by_key() {
    use std::sync::Arc;
    a_key_round_trips([Arc::<str>::from("b"), Arc::from("a"), Arc::from("c")]).await;
}
