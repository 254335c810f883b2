//! The driver's small public surface: errors, names, debug output, the
//! fence flag and the pending gauge right after a stage (S-W11, S-W9).

mod support;

use std::time::Duration;

use metrics_util::debugging::DebuggingRecorder;
use outbox::telemetry::names::PENDING;
use outbox::{BuildError, Config, ConfigError, Outbox};
use support::{gauge, snapshot, t, TestSink};

fn paused() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap()
}

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
    paused().block_on(async {
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
fn the_pending_gauge_is_exact_right_after_a_stage() {
    // S-W11/I3: each stage exports under the lock; the writer need not run.
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let rt = paused();
    metrics::with_local_recorder(&recorder, || {
        rt.block_on(async {
            let o = Outbox::new(TestSink::new("api-gauge"), Config::default()).unwrap();
            let _ = o.stage(t(1), 1);
            let _ = o.stage(t(2), 2);
            // No await since the stages: only their own export ran.
            assert_eq!(gauge(&snapshot(&snap), PENDING, "api-gauge"), 2.0);
            assert_eq!(o.settle(Duration::from_secs(1)).await.pending, 0);
            assert_eq!(gauge(&snapshot(&snap), PENDING, "api-gauge"), 0.0);
        })
    });
}
