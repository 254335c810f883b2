//! The driver's lifecycle and robustness: runtime flavours, staging from
//! many OS threads, endless panics, handle drops, concurrent shutdowns,
//! dropped answers, abandon of a hung shutdown, a runtime dropped under the
//! outbox, races of every call on a multi-thread runtime, build errors,
//! exact metrics. Rule ids refer to docs/contract.md.

mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use outbox::{
    BuildError, Config, ConfigError, LostReason, Outbox, Report, Staged, TenantId,
    DEFAULT_DROP_TIMEOUT,
};
use support::*;
use tokio::runtime::{Builder, Runtime};
use tokio::time::Instant;

fn current_thread() -> Runtime {
    support::rt::current()
}

async fn until_dead<T>(weak: &std::sync::Weak<T>) {
    for _ in 0..100_000 {
        if weak.strong_count() == 0 {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("the writer still holds the sink");
}

/// Flush and shutdown, awaited from a task on the runtime (so a blocked
/// worker would deadlock the one-worker flavour).
fn flush_and_shutdown_on(rt: Runtime, name: &str) {
    let sink = TestSink::new(name);
    let weak = sink.weak();
    let out = rt.block_on(async {
        tokio::spawn(async move {
            let o = Outbox::new(sink.clone(), Config::default()).unwrap();
            for i in 0..100 {
                let _ = o.stage(t(u128::from(i % 3)), i);
            }
            let flushed = o.flush(Duration::from_secs(30)).await;
            assert_eq!(
                flushed,
                Report {
                    written: 100,
                    ..Report::default()
                }
            );
            let _ = o.stage(t(9), 100);
            sink.set(t(9), Act::Hang);
            let start = Instant::now();
            let sd = o.shutdown(Duration::from_millis(20)).await;
            assert!(start.elapsed() >= Duration::from_millis(20));
            assert_eq!(sd.lost, 1);
            assert_eq!(sd.unwritten, [(t(9), vec![100])]);
            assert_eq!(o.pending(), 0);
            drop(o);
            sink.store()
        })
        .await
        .unwrap()
    });
    assert_eq!(out.values().map(Vec::len).sum::<usize>(), 100);
    // S-W16: the writer exits once the handles are gone.
    rt.block_on(until_dead(&weak));
    // On a multi-thread runtime the worker counts a task gone a moment
    // after its future (and the sink with it) is dropped: wait for that,
    // bounded. A writer that never exits still fails here.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while rt.metrics().num_alive_tasks() != 0 {
        assert!(std::time::Instant::now() < deadline, "no zombie task");
        std::thread::yield_now();
    }
}

#[test]
fn flush_and_shutdown_on_a_current_thread_runtime() {
    flush_and_shutdown_on(current_thread(), "ct");
}

#[test]
fn flush_and_shutdown_on_a_multi_thread_runtime_with_one_worker() {
    flush_and_shutdown_on(support::rt::multi_thread(1), "mt1");
}

/// S-W1, S-W3, S-W14: 8 OS threads (outside the runtime) stage at once;
/// every item is accounted, each thread's items stay in order per tenant.
async fn stage_from_eight_threads(o: Outbox<TestSink>, sink: TestSink) {
    const PER_THREAD: u32 = 5_000;
    std::thread::scope(|s| {
        for th in 0..8u32 {
            let o = o.clone();
            s.spawn(move || {
                for i in 0..PER_THREAD {
                    let item = th * PER_THREAD + i;
                    // Its own tenant, and one shared by every thread.
                    assert_eq!(o.stage(t(u128::from(th) + 1), item), Staged::Accepted);
                    assert_eq!(o.stage(t(0), item), Staged::Accepted);
                }
            });
        }
    });
    let c = o.counters();
    assert_eq!(c.staged, 80_000);
    assert!(c.balanced());
    let r = o.flush(Duration::from_secs(60)).await;
    assert_eq!(r.pending, 0);
    assert_eq!(o.counters().written, 80_000);
    let store = sink.store();
    for th in 0..8u32 {
        let own = &store[&t(u128::from(th) + 1)];
        assert_eq!(*own, ids(th * PER_THREAD..(th + 1) * PER_THREAD));
        // I1: in the shared tenant, each thread's items keep their order.
        let mine: Vec<u32> = store[&t(0)]
            .iter()
            .copied()
            .filter(|i| i / PER_THREAD == th)
            .collect();
        assert_eq!(mine, ids(th * PER_THREAD..(th + 1) * PER_THREAD));
    }
    assert_eq!(store[&t(0)].len(), 40_000);
}

#[tokio::test(start_paused = true)]
async fn staging_from_eight_os_threads_on_a_paused_clock() {
    let sink = TestSink::new("threads");
    let o = Outbox::new(sink.clone(), Config::default()).unwrap();
    stage_from_eight_threads(o, sink).await;
}

#[test]
fn staging_from_eight_os_threads_on_a_multi_thread_runtime() {
    let rt = support::rt::multi_thread(1);
    let sink = TestSink::new("threads-mt");
    let o = rt.block_on(async { Outbox::new(sink.clone(), Config::default()).unwrap() });
    rt.block_on(stage_from_eight_threads(o, sink));
}

/// S-W5, S-W13, S-W14: a sink that panics on every call, every way, for a
/// minute of virtual time; the writer lives, every item is accounted, and
/// once the sink heals everything is written in order.
#[test]
fn a_sink_that_panics_for_a_minute() {
    let (c, snap) = with_metrics(|| async {
        let sink = TestSink::new("panics");
        let o = Outbox::new(sink.clone(), Config::default()).unwrap();
        let kinds = [Act::Panic, Act::PanicCreate, Act::PanicDisplay];
        for (i, kind) in kinds.into_iter().enumerate() {
            sink.set(t(i as u128), kind);
        }
        let start = Instant::now();
        let mut n = 0u32;
        while start.elapsed() < Duration::from_secs(60) {
            for tenant in 0..3 {
                assert_eq!(o.stage(t(tenant), n), Staged::Accepted);
                n += 1;
            }
            tokio::time::sleep(Duration::from_millis(250)).await; // workload period
            let c = o.counters();
            assert!(c.balanced());
            assert_eq!(c.written, 0);
            assert_eq!(c.pending, u64::from(n));
        }
        let c = o.counters();
        assert!(c.failed_attempts >= 3 * 15, "{c:?}");
        // Every attempt failed; at most one per tenant is still in flight.
        assert!(c.attempts - c.failed_attempts <= 3, "{c:?}");
        assert!(sink.attempts().len() as u64 <= c.attempts);
        assert_eq!(c.writes, 0);
        // Heal: the writer is alive and writes everything, in order.
        for tenant in 0..3 {
            sink.set(t(tenant), Act::Ok);
        }
        let r = o.flush(Duration::from_secs(30)).await;
        assert_eq!((r.written, r.pending, r.lost), (u64::from(n), 0, 0));
        for (tenant, items) in sink.store() {
            assert!(items.windows(2).all(|w| w[0] < w[1]), "{tenant}");
        }
        o.counters()
    });
    assert_eq!(c.lost_total() + c.dropped_total(), 0);
    assert_metrics_match(&snapshot(&snap), "panics", &c);
}

/// S-W16: dropping every handle without a shutdown drains what the writer
/// holds (here: a hung write released later), then the writer exits.
#[tokio::test(start_paused = true)]
async fn dropping_every_handle_drains_then_the_writer_exits() {
    let sink = TestSink::new("drop");
    let weak = sink.weak();
    let baseline = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks();
    let o = Outbox::new(sink.clone(), Config::default()).unwrap();
    let o2 = o.clone();
    sink.script(t(1), [Act::Hang]);
    let _ = o.stage(t(1), 1);
    sink.until_attempts(t(1), 1).await;
    let _ = o2.stage(t(1), 2);
    let _ = o2.stage(t(2), 3);
    drop(o);
    drop(o2);
    // Still draining: T1's write hangs, 2 waits behind it.
    sink.until(|s| s.stored(t(2)) == [3]).await;
    assert!(weak.strong_count() > 1);
    sink.release();
    sink.until(|s| s.stored(t(1)) == [1, 2]).await;
    drop(sink);
    until_dead(&weak).await;
    assert_eq!(
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks(),
        baseline
    );
}

/// S-W16 with a sink that never answers: the drop's shutdown deadline
/// bounds the drain; what is left is counted lost under `deadline`.
#[test]
fn dropping_every_handle_with_a_hung_sink_gives_up_at_the_drop_deadline() {
    let (elapsed, snap) = with_metrics(|| async {
        let sink = TestSink::new("drop-hung");
        let weak = sink.weak();
        sink.set_all(Act::Hang);
        let o = Outbox::builder(sink.clone())
            .drop_timeout(Duration::from_secs(3))
            .build()
            .unwrap();
        for i in 0..5 {
            let _ = o.stage(t(1), i);
        }
        let start = Instant::now();
        drop(o);
        drop(sink);
        // Time passes only by the writer's own timer.
        let mut interval = tokio::time::interval(Duration::from_millis(100));
        while weak.strong_count() > 0 {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "the writer never exited"
            );
            interval.tick().await;
        }
        start.elapsed()
    });
    assert!(
        elapsed >= Duration::from_secs(3) && elapsed <= Duration::from_millis(3_100),
        "{elapsed:?}"
    );
    let m = snapshot(&snap);
    let mut c = outbox::Counters::default();
    c.staged = 5;
    c.set_lost(LostReason::Deadline, 5);
    c.attempts = 1;
    // S-W18: the hung attempt, cancelled at the drop deadline.
    c.failed_attempts = 1;
    c.set_failed(outbox::core::Failure::Cancelled, 1);
    assert_metrics_match(&m, "drop-hung", &c);
    assert_eq!(DEFAULT_DROP_TIMEOUT, Duration::from_secs(30));
}

/// S-W9: concurrent shutdowns; exactly one caller reports the loss, the
/// earlier deadline wins whichever caller brings it (a later one never
/// extends it), and a caller after the end gets zeros at once.
#[tokio::test(start_paused = true)]
async fn concurrent_shutdowns_report_the_loss_once_by_the_earlier_deadline() {
    for (first, second) in [(5, 1), (1, 5)] {
        let sink = TestSink::new("sd2");
        sink.set_all(Act::Hang);
        let o = Outbox::new(sink.clone(), Config::default()).unwrap();
        for i in 0..4 {
            let _ = o.stage(t(u128::from(i)), i);
        }
        let a = o.shutdown(Duration::from_secs(first));
        let b = o.shutdown(Duration::from_secs(second));
        let start = Instant::now();
        let (a, b) = tokio::join!(a, b);
        assert_eq!(
            start.elapsed(),
            Duration::from_secs(1),
            "deadlines {first} s then {second} s"
        );
        assert!(a.first && !b.first);
        assert_eq!((a.lost, b.lost), (4, 0));
        assert!(a.deadline_passed && b.deadline_passed);
        assert_eq!(
            a.unwritten,
            (0..4)
                .map(|i| (t(u128::from(i)), vec![i]))
                .collect::<Vec<_>>()
        );
        assert!(b.unwritten.is_empty());
        assert_eq!(o.counters().lost_total(), 4);
        // Later: zeros, at once.
        let c = o.shutdown(Duration::from_secs(5)).await;
        assert!(!c.first);
        assert_eq!(c.lost, 0);
    }
}

/// The `Answer` docs: dropping the future does not cancel the call.
#[tokio::test(start_paused = true)]
async fn a_dropped_answer_does_not_cancel_the_call() {
    let sink = TestSink::new("dropped-answer");
    let o = Outbox::new(sink.clone(), Config::default()).unwrap();
    sink.set(t(1), Act::Fail);
    let _ = o.stage(t(1), 1);
    drop(o.shutdown(Duration::from_millis(500)));
    assert_eq!(o.stage(t(1), 2), Staged::ShuttingDown, "the fence is up");
    let report = o.settle(Duration::from_secs(5)).await;
    assert_eq!(report.pending, 0);
    let c = o.counters();
    assert_eq!(c.lost(LostReason::Deadline), 1, "{c:?}");
    assert!(o.is_shutting_down());
}

/// The `Answer` docs: dropping a flush, a settle or a shutdown only stops
/// waiting; the writes go on and the shutdown still fences.
#[tokio::test(start_paused = true)]
async fn dropped_answers_change_nothing() {
    let sink = TestSink::new("drop-answer");
    sink.set_all(Act::Slow(Duration::from_secs(1)));
    let o = Outbox::new(sink.clone(), Config::default()).unwrap();
    for i in 0..5 {
        let _ = o.stage(t(u128::from(i)), i);
    }
    drop(o.flush(Duration::from_secs(10)));
    drop(o.settle(Duration::from_secs(10)));
    drop(o.shutdown(Duration::from_millis(1500)));
    assert_eq!(o.stage(t(9), 9), Staged::ShuttingDown);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(o.pending(), 0);
    let c = o.counters();
    assert_eq!(c.written, 5);
    assert!(c.balanced());
}

#[tokio::test(start_paused = true)]
async fn a_hung_sink_with_duration_max_shutdown_is_ended_by_abandon() {
    // S-A7 after S-W9: a shutdown that would wait "forever" for a hung
    // write (no write timeout) is ended by abandon; its caller is answered
    // and nothing stays pending.
    let sink = TestSink::new("hang-abandon");
    sink.set_all(Act::Hang);
    let o = Outbox::new(sink.clone(), Config::default()).unwrap();
    let _ = o.stage(t(1), 1);
    let _ = o.stage(t(2), 2);
    sink.until(|s| s.attempts().len() == 2).await;
    let _ = o.stage(t(1), 3); // waits behind the hung write
    let shutdown = o.shutdown(Duration::MAX);
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert_eq!(o.pending(), 3, "still draining after an hour");
    let held = o.abandon();
    assert_eq!(
        held,
        Vec::<(TenantId, Vec<u32>)>::new(),
        "held go to the shutdown"
    );
    let r = tokio::time::timeout(Duration::from_secs(1), shutdown)
        .await
        .expect("the shutdown is answered once abandon cancelled the hung writes");
    assert!(r.first);
    assert_eq!(r.lost, 3);
    let dead: usize = r.unwritten.iter().map(|r| r.items.len()).sum();
    assert_eq!(dead, 3, "{:?}", r.unwritten);
    assert_eq!(
        r.unwritten,
        [(t(1), vec![1]), (t(1), vec![3]), (t(2), vec![2])]
    );
    let c = o.counters();
    assert_eq!(c.lost(LostReason::Abandoned), 3);
    assert!(c.balanced());
    assert_eq!(o.pending(), 0);
}

#[test]
fn build_errors_are_typed() {
    // Outside a runtime.
    let err = Outbox::new(TestSink::new("x"), Config::default()).unwrap_err();
    assert!(matches!(err, BuildError::NoRuntime), "{err}");
    // A byte limit without a weigher.
    let rt = current_thread();
    let config = Config::builder().max_batch_bytes(5).build().unwrap();
    let err = rt
        .block_on(async { Outbox::new(TestSink::new("x"), config) })
        .unwrap_err();
    assert!(
        matches!(err, BuildError::Config(ConfigError::WeigherRequired { .. })),
        "{err}"
    );
    // A runtime without a timer.
    let no_timer = Builder::new_current_thread().build().unwrap();
    let err = Outbox::builder(TestSink::new("x"))
        .runtime(no_timer.handle().clone())
        .build()
        .unwrap_err();
    assert!(matches!(err, BuildError::NoTimer), "{err}");
    // A handle that outlived its runtime.
    let gone = current_thread();
    let handle = gone.handle().clone();
    drop(gone);
    let err = Outbox::builder(TestSink::new("x"))
        .runtime(handle)
        .build()
        .unwrap_err();
    assert!(matches!(err, BuildError::RuntimeShutDown), "{err}");
    assert!(err.to_string().contains("shut down"), "{err}");
    // Given a runtime handle, it builds from outside the runtime.
    let o = Outbox::builder(TestSink::new("x"))
        .runtime(rt.handle().clone())
        .build()
        .unwrap();
    let _ = o.stage(t(1), 1);
    assert_eq!(rt.block_on(o.flush(Duration::from_secs(5))).written, 1);
}

/// An outbox on `rt` whose sink hangs every write, with item 1 of tenant 1
/// in flight.
fn with_a_hung_write(rt: &Runtime, name: &str) -> (Outbox<TestSink>, TestSink) {
    let sink = TestSink::new(name);
    sink.set_all(Act::Hang);
    let o = rt.block_on(async {
        let o = Outbox::new(sink.clone(), Config::default()).unwrap();
        let _ = o.stage(t(1), 1);
        sink.until_attempts(t(1), 1).await;
        o
    });
    (o, sink)
}

/// Drops `rt` (a current-thread runtime: its tasks drop on this thread)
/// and returns what was logged meanwhile.
fn logs_of_dropping(rt: Runtime) -> Vec<capture::Logged> {
    let capture = capture::Capture::default();
    tracing::subscriber::with_default(capture.clone(), || drop(rt));
    let logs = capture.0.lock().unwrap().clone();
    logs
}

/// When the runtime is gone, the writer's drop gives up what is pending
/// (counted lost under `abandoned`, S-W14) and answers every waiting
/// caller; later waits answer at once.
#[test]
fn a_runtime_dropped_under_the_writer_accounts_for_everything() {
    let rt = current_thread();
    let (o, _sink) = with_a_hung_write(&rt, "gone");
    let _ = o.stage(t(1), 2);
    let waiting = o.flush(Duration::from_secs(3600));
    let logs = logs_of_dropping(rt);
    let gone: Vec<_> = logs
        .iter()
        .filter(|l| l.message.contains("writer task was dropped"))
        .collect();
    assert_eq!(gone.len(), 1, "{logs:?}");
    assert_eq!(gone[0].level, Some(tracing::Level::ERROR));
    assert_eq!(gone[0].field("items"), Some("2"), "both pending items");
    assert_eq!(gone[0].field("reason"), Some("abandoned"));
    assert_eq!(gone[0].field("outbox"), Some("gone"));
    let c = o.counters();
    assert_eq!(c.lost(LostReason::Abandoned), 2);
    assert_eq!(c.pending, 0);
    let other = current_thread();
    assert_eq!(
        other.block_on(waiting),
        Report {
            lost: 2,
            ..Report::default()
        }
    );
    let r = other.block_on(o.settle(Duration::from_secs(3600)));
    assert_eq!((r.pending, r.deadline_passed), (0, true));
    assert_eq!(o.stage(t(1), 3), Staged::ShuttingDown);
    assert!(o.counters().balanced());
}

/// A runtime dropped under an idle writer loses nothing, so it logs no
/// loss (S-A6: a log line names a real loss).
#[test]
fn a_runtime_dropped_under_an_idle_writer_logs_no_loss() {
    let rt = current_thread();
    let sink = TestSink::new("idle");
    let o = rt.block_on(async {
        let o = Outbox::new(sink.clone(), Config::default()).unwrap();
        let _ = o.stage(t(1), 1);
        assert_eq!(o.flush(Duration::from_secs(5)).await.written, 1);
        o
    });
    let logs = logs_of_dropping(rt);
    assert!(
        logs.iter().all(|l| l.level != Some(tracing::Level::ERROR)),
        "{logs:?}"
    );
    assert_eq!(o.counters().lost_total(), 0);
    assert_eq!(sink.stored(t(1)), [1]);

    // Everything was already given up by `abandon` (S-A7), a write still
    // in flight: the runtime's drop adds no loss, so no line either.
    let rt = current_thread();
    let (o, _sink) = with_a_hung_write(&rt, "abandoned");
    let _ = o.stage(t(1), 2);
    assert_eq!(o.abandon(), [(t(1), vec![2])]);
    assert_eq!(o.counters().lost(LostReason::Abandoned), 2);
    let logs = logs_of_dropping(rt);
    assert!(
        logs.iter()
            .all(|l| !l.message.contains("writer task was dropped")),
        "{logs:?}"
    );
    assert_eq!(o.counters().lost(LostReason::Abandoned), 2);
    assert!(o.counters().balanced());
}

/// The outbox keeps time on its own runtime's clock whoever calls it: a
/// stage from a second runtime whose (paused) clock is an hour ahead, or
/// from a plain thread while the outbox's clock is an hour ahead of the
/// wall clock, still lingers the full `linger` on the outbox's clock.
#[test]
fn staging_from_another_clock_lingers_on_the_outboxs_clock() {
    fn paused() -> Runtime {
        support::rt::paused()
    }
    const LINGER: Duration = Duration::from_secs(10);
    let config = || Config::builder().linger(LINGER).build().unwrap();

    // Case 1: a foreign runtime, an hour ahead.
    let rt = paused();
    let ahead = paused();
    ahead.block_on(tokio::time::advance(Duration::from_secs(3600)));
    let sink = TestSink::new("foreign");
    let o = rt.block_on(async { Outbox::new(sink.clone(), config()).unwrap() });
    ahead.block_on(async { assert_eq!(o.stage(t(1), 1), Staged::Accepted) });
    rt.block_on(async {
        tokio::time::advance(LINGER + Duration::from_secs(1)).await;
        // Yields, not a timed wait: the clock must not move on its own.
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert_eq!(sink.stored(t(1)), [1], "written after its linger");
    });

    // Case 2: no runtime at all, the outbox's clock an hour ahead of the
    // wall clock.
    let rt = paused();
    let sink = TestSink::new("plain");
    let o = rt.block_on(async {
        let o = Outbox::new(sink.clone(), config()).unwrap();
        // The writer's first look at the clock is at 0; it then sleeps
        // with nothing to do while the clock moves on.
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        tokio::time::advance(Duration::from_secs(3600)).await;
        o
    });
    std::thread::scope(|s| {
        s.spawn(|| assert_eq!(o.stage(t(1), 1), Staged::Accepted));
    });
    rt.block_on(async {
        // Not before the full linger on the outbox's clock...
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert!(sink.attempts().is_empty(), "wrote before its linger");
        tokio::time::advance(LINGER - Duration::from_secs(1)).await;
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert!(sink.attempts().is_empty(), "wrote before its linger");
        // ...and right after it.
        tokio::time::advance(Duration::from_secs(2)).await;
        sink.until(|s| s.stored(t(1)) == [1]).await;
    });
}

/// A stage from a thread-local destructor that runs after tokio's own
/// thread locals are gone (no runtime context can be entered there) is
/// still taken, on the wall clock, and written.
#[test]
fn staging_from_a_thread_local_destructor_is_taken() {
    struct StageOnDrop(Option<Outbox<TestSink>>);
    impl Drop for StageOnDrop {
        fn drop(&mut self) {
            if let Some(o) = self.0.take() {
                let staged = o.stage(t(1), 7);
                let gone = tokio::runtime::Handle::try_current()
                    .is_err_and(|e| e.is_thread_local_destroyed());
                *RESULT.lock().unwrap() = Some((staged, gone));
            }
        }
    }
    thread_local! {
        static HOLDER: std::cell::RefCell<StageOnDrop> =
            const { std::cell::RefCell::new(StageOnDrop(None)) };
    }
    static RESULT: std::sync::Mutex<Option<(Staged, bool)>> = std::sync::Mutex::new(None);

    let rt = current_thread();
    let sink = TestSink::new("tls");
    // With a linger, a stage reads the clock.
    let config = Config::builder()
        .linger(Duration::from_millis(1))
        .build()
        .unwrap();
    let o = rt.block_on(async { Outbox::new(sink.clone(), config).unwrap() });
    let for_thread = o.clone();
    std::thread::spawn(move || {
        // Our destructor registers first, tokio's context second; they
        // run in reverse, so ours runs after tokio's context is gone.
        HOLDER.with(|h| h.borrow_mut().0 = Some(for_thread));
        let _ = tokio::runtime::Handle::try_current();
    })
    .join()
    .unwrap();
    let (staged, gone) = RESULT.lock().unwrap().take().expect("the destructor ran");
    assert!(
        gone,
        "tokio's thread locals were still alive; the test proves nothing"
    );
    assert_eq!(staged, Staged::Accepted);
    assert_eq!(rt.block_on(o.flush(Duration::from_secs(5))).written, 1);
    assert_eq!(sink.stored(t(1)), [7]);
}

/// Captures tracing events as (level, message, fields) on this thread.
mod capture {
    use std::fmt::Debug;
    use std::sync::{Arc, Mutex};

    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id, Record};
    use tracing::{Event, Level, Metadata, Subscriber};

    #[derive(Clone, Debug, Default)]
    pub struct Logged {
        pub level: Option<Level>,
        pub message: String,
        pub fields: Vec<(String, String)>,
    }

    impl Logged {
        pub fn field(&self, name: &str) -> Option<&str> {
            self.fields
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        }
    }

    impl Visit for Logged {
        fn record_str(&mut self, field: &Field, value: &str) {
            self.fields
                .push((field.name().to_owned(), value.to_owned()));
        }
        fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
            let v = format!("{value:?}");
            if field.name() == "message" {
                self.message = v;
            } else {
                self.fields.push((field.name().to_owned(), v));
            }
        }
    }

    #[derive(Clone, Default)]
    pub struct Capture(pub Arc<Mutex<Vec<Logged>>>);

    impl Subscriber for Capture {
        fn enabled(&self, _: &Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &Attributes<'_>) -> Id {
            Id::from_u64(1)
        }
        fn record(&self, _: &Id, _: &Record<'_>) {}
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, event: &Event<'_>) {
            let mut logged = Logged {
                level: Some(*event.metadata().level()),
                ..Logged::default()
            };
            event.record(&mut logged);
            self.0.lock().unwrap().push(logged);
        }
        fn enter(&self, _: &Id) {}
        fn exit(&self, _: &Id) {}
    }
}

/// S-A6: drops and losses are logged for the first, then every 1,000th
/// per reason, while the counters stay exact; failed attempts are logged
/// with tenant, items, attempt, backoff and reason (S-W11).
#[test]
fn drops_are_logged_rate_limited_and_failures_with_their_context() {
    let capture = capture::Capture::default();
    let rt = support::rt::paused();
    let counters = tracing::subscriber::with_default(capture.clone(), || {
        rt.block_on(async {
            let sink = TestSink::new("logs");
            sink.set(t(1), Act::Hang);
            sink.script(t(2), [Act::Fail]);
            let config = Config::builder().capacity(2).build().unwrap();
            let o = Outbox::new(sink.clone(), config).unwrap();
            let _ = o.stage(t(2), 0);
            assert_eq!(o.settle(Duration::from_secs(1)).await.pending, 0);
            assert_eq!(sink.attempts_of(t(2)).len(), 2);
            for i in 1..=2_502 {
                let _ = o.stage(t(1), i);
            }
            let _ = o.settle(Duration::ZERO).await;
            o.counters()
        })
    });
    let logs = capture.0.lock().unwrap().clone();
    let dropped: Vec<_> = logs
        .iter()
        .filter(|l| l.message.contains("items dropped"))
        .collect();
    // 2,500 drops: logged at the 1st, 1,000th and 2,000th.
    assert_eq!(counters.dropped_total(), 2_500);
    assert_eq!(dropped.len(), 3, "{dropped:?}");
    assert!(dropped
        .iter()
        .all(|l| l.field("reason") == Some("buffer_full")));
    let failed: Vec<_> = logs
        .iter()
        .filter(|l| l.message.contains("write attempt failed"))
        .collect();
    assert_eq!(failed.len(), 1);
    let f = failed[0];
    assert_eq!(f.level, Some(tracing::Level::WARN));
    assert_eq!(f.field("tenant"), Some(t(2).to_string().as_str()));
    assert_eq!(f.field("items"), Some("1"));
    assert_eq!(f.field("attempt"), Some("1"));
    assert_eq!(f.field("backoff_ms"), Some("50.0"));
    assert_eq!(f.field("outbox"), Some("logs"), "logs name their outbox");
    assert!(dropped.iter().all(|l| l.field("outbox") == Some("logs")));
    assert!(
        f.field("error").is_some_and(|e| e.contains("failing")),
        "{f:?}"
    );
}

/// A runtime dropped before the writer ever ran leaves nobody waiting,
/// and a shutdown under way still gets its dead letters.
#[test]
fn a_writer_dropped_unpolled_still_answers_waits() {
    let rt = current_thread();
    let o =
        rt.block_on(async { Outbox::new(TestSink::new("unpolled"), Config::default()).unwrap() });
    let _ = o.stage(t(1), 1);
    let waiting = o.shutdown(Duration::from_secs(3600));
    drop(rt);
    let r = current_thread().block_on(waiting);
    assert!(r.first);
    assert_eq!(
        r.report(),
        Report {
            lost: 1,
            ..Report::default()
        }
    );
    assert_eq!(r.unwritten, [(t(1), vec![1])]);
    assert_eq!(o.counters().lost(LostReason::Abandoned), 1);
}

#[test]
fn staging_from_a_plain_thread_after_the_runtime_is_gone() {
    // README: dropping the runtime first gives up what is pending (lost
    // under `abandoned`); later calls from any thread are refused/answered.
    let sink = TestSink::new("rt-gone");
    sink.set_all(Act::Hang);
    let rt = support::rt::multi_thread(1);
    let config = Config::builder()
        .linger(Duration::from_millis(5))
        .build()
        .unwrap();
    let o = rt.block_on(async {
        let o = Outbox::new(sink.clone(), config).unwrap();
        for i in 0..4 {
            let _ = o.stage(t(u128::from(i % 2)), i);
        }
        o
    });
    drop(rt);
    let o2 = o.clone();
    std::thread::spawn(move || {
        assert_eq!(o2.stage(t(1), 99), Staged::ShuttingDown);
        let c = o2.counters();
        assert_eq!(c.lost(LostReason::Shutdown), 1);
        assert_eq!(c.pending, 0);
        assert!(c.balanced(), "{c:?}");
        // Answers come at once, without a runtime to drive them.
        let r = futures_block_on(o2.flush(Duration::from_secs(1)));
        assert!(r.deadline_passed);
        let r = futures_block_on(o2.shutdown(Duration::from_secs(1)));
        assert_eq!(r.pending, 0);
        assert!(o2.abandon().is_empty());
    })
    .join()
    .unwrap();
    let c = o.counters();
    assert_eq!(c.lost(LostReason::Abandoned), 4);
    assert!(c.balanced());
}

/// Polls `f` to completion on this thread, without a runtime.
fn futures_block_on<F: std::future::Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    for _ in 0..1000 {
        if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::yield_now();
    }
    panic!("the answer never came without a runtime");
}

/// S-W14, I1: stages from OS threads racing flushes, settles, two
/// shutdowns and an abandon on a multi-thread runtime; every round ends
/// balanced, in order, with nothing pending.
#[test]
fn concurrent_stage_flush_shutdown_abandon_stay_balanced() {
    for round in 0..20u64 {
        let rt = support::rt::multi_thread(2);
        rt.block_on(async move {
            let sink = TestSink::new("race");
            if round % 3 == 0 {
                sink.set(t(3), Act::Hang);
            }
            if round % 3 == 1 {
                sink.set(t(2), Act::Fail);
            }
            let o = Outbox::new(
                sink.clone(),
                Config::builder()
                    .concurrency(2)
                    .max_batch(3)
                    .initial_backoff(Duration::from_millis(1))
                    .max_backoff(Duration::from_millis(2))
                    .build()
                    .unwrap(),
            )
            .unwrap();
            let stop = Arc::new(AtomicBool::new(false));
            let staged = Arc::new(AtomicU64::new(0));
            let mut stagers = Vec::new();
            for th in 0..2u32 {
                let (o, stop, staged) = (o.clone(), stop.clone(), staged.clone());
                stagers.push(std::thread::spawn(move || {
                    let mut i = 0u32;
                    while !stop.load(Ordering::Relaxed) && i < 200_000 {
                        let _ = o.stage(t(u128::from(i % 5)), th * 1_000_000 + i);
                        staged.fetch_add(1, Ordering::Relaxed);
                        i += 1;
                    }
                }));
            }
            let mut answers = Vec::new();
            for k in 0..8 {
                let o = o.clone();
                answers.push(tokio::spawn(async move {
                    let r = o.flush(Duration::from_millis(50)).await;
                    let s = o.settle(Duration::from_millis(20)).await;
                    (k, r, s)
                }));
            }
            tokio::task::yield_now().await;
            let sd1 = o.shutdown(Duration::from_millis(200));
            let o2 = o.clone();
            let ab = std::thread::spawn(move || {
                if round % 2 == 0 {
                    o2.abandon()
                } else {
                    Vec::new()
                }
            });
            let sd2 = o.shutdown(Duration::from_millis(100));
            let (r1, r2) =
                tokio::time::timeout(Duration::from_secs(20), async { tokio::join!(sd1, sd2) })
                    .await
                    .expect("shutdowns answered");
            stop.store(true, Ordering::Relaxed);
            for s in stagers {
                s.join().unwrap();
            }
            let _held = ab.join().unwrap();
            for a in answers {
                let _ = tokio::time::timeout(Duration::from_secs(20), a)
                    .await
                    .expect("flush/settle answered")
                    .unwrap();
            }
            assert!(r1.first && !r2.first, "round {round}");
            assert_eq!(r1.pending, 0);
            let c = o.counters();
            assert_eq!(c.pending, 0, "round {round}: {c:?}");
            assert_eq!(o.pending(), 0);
            assert!(c.balanced(), "round {round}: {c:?}");
            assert_eq!(c.staged, staged.load(Ordering::Relaxed));
            // I1: per tenant, stored in order, no duplicates.
            for (tenant, items) in sink.store() {
                for th in 0..2u32 {
                    let mine: Vec<u32> = items
                        .iter()
                        .copied()
                        .filter(|i| i / 1_000_000 == th)
                        .collect();
                    assert!(mine.windows(2).all(|w| w[0] < w[1]), "{tenant}: order");
                }
            }
            // Every item counted written is stored. A write given up (by
            // abandon or the deadline) whose sink had already committed is
            // stored yet counted lost: see
            // `s_b6_a_given_up_write_that_came_back_written_is_not_a_dead_letter`
            // (tests/core_flush_settle_shutdown.rs).
            let stored: u64 = sink.store().values().map(|v| v.len() as u64).sum();
            let given_up = c.lost(LostReason::Abandoned) + c.lost(LostReason::Deadline);
            assert!(
                stored >= c.written && stored <= c.written + given_up,
                "round {round}: stored {stored}, {c:?}"
            );
        });
    }
}

#[test]
fn the_handle_and_answers_are_send_sync_and_clone() {
    fn send_sync_clone<T: Send + Sync + Clone + 'static>() {}
    fn send<T: Send + 'static>() {}
    send_sync_clone::<Outbox<TestSink>>();
    send::<outbox::Answer<Report>>();
    send::<outbox::Answer<outbox::ShutdownReport<outbox::TenantId, u32>>>();
}
