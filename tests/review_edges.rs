//! Review: edge cases and races against the public API (`Outbox`,
//! `core::Engine`, `Sink`). Rule ids refer to docs/contract.md.

mod support;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use outbox::core::{Engine, Event, Outcome, Time};
use outbox::{Config, LostReason, Outbox, Report, Sink, Staged, TenantId, WriteError, Written};
use support::*;
use tokio::time::Instant;

// ----- config extremes ----------------------------------------------------

#[tokio::test(start_paused = true)]
async fn duration_max_everywhere_is_accepted_and_works() {
    // Years-long / Duration::MAX values: a clear error or a working outbox,
    // never a panic.
    let sink = TestSink::new("rev-max");
    let config = Config::builder()
        .linger(Duration::MAX)
        .initial_backoff(Duration::MAX)
        .max_backoff(Duration::MAX)
        .write_timeout(Duration::MAX)
        .max_retry_duration(Duration::MAX)
        .concurrency(usize::MAX)
        .capacity(usize::MAX)
        .tenant_capacity(usize::MAX)
        .max_batch(usize::MAX)
        .max_attempts(u32::MAX)
        .build()
        .unwrap();
    let o = Outbox::builder(sink.clone())
        .config(config)
        .drop_deadline(Duration::MAX)
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
    assert_eq!(r.report, Report::default());
    assert_eq!(sink.stored(t(1)), ids(0..10));
}

#[tokio::test(start_paused = true)]
async fn a_hung_sink_with_duration_max_shutdown_is_ended_by_abandon() {
    // S-A7 after S-W9: a shutdown that would wait "forever" for a hung
    // write (no write timeout) is ended by abandon; its caller is answered
    // and nothing stays pending.
    let sink = TestSink::new("rev-hang-abandon");
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
    assert_eq!(r.report.lost, 3);
    let dead: usize = r.unwritten.iter().map(|(_, v)| v.len()).sum();
    assert_eq!(dead, 3, "{:?}", r.unwritten);
    assert_eq!(
        r.unwritten,
        [(t(1), vec![1]), (t(1), vec![3]), (t(2), vec![2])]
    );
    let c = o.counters();
    assert_eq!(c.lost_for(LostReason::Abandoned), 3);
    assert!(c.balanced());
    assert_eq!(o.pending(), 0);
}

#[tokio::test(start_paused = true)]
async fn second_shutdown_with_earlier_deadline_tightens_later_one_does_not_extend() {
    // S-W9: one caller reports, the others report 0; the earlier deadline
    // wins either way round.
    for (first, second, expect) in [(10, 1, 1), (1, 10, 1)] {
        let sink = TestSink::new("rev-sd2");
        sink.set_all(Act::Hang);
        let o = Outbox::new(sink.clone(), Config::default()).unwrap();
        let _ = o.stage(t(1), 1);
        let start = Instant::now();
        let a = o.shutdown(Duration::from_secs(first));
        let b = o.shutdown(Duration::from_secs(second));
        let (a, b) = tokio::join!(a, b);
        assert!(a.first && !b.first);
        assert_eq!(start.elapsed(), Duration::from_secs(expect));
        assert_eq!((a.report.lost, b.report.lost), (1, 0));
        assert!(a.report.deadline_passed && b.report.deadline_passed);
        assert_eq!(a.unwritten, [(t(1), vec![1])]);
        assert!(b.unwritten.is_empty());
        // And a third, after the end: zeros at once.
        let c = o.shutdown(Duration::from_secs(5)).await;
        assert!(!c.first);
        assert_eq!(c.report.lost, 0);
    }
}

#[tokio::test(start_paused = true)]
async fn dropped_answers_change_nothing() {
    // Answer docs: dropping the future only stops waiting.
    let sink = TestSink::new("rev-drop-answer");
    sink.set_all(Act::Slow(Duration::from_secs(1)));
    let o = Outbox::new(sink.clone(), Config::default()).unwrap();
    for i in 0..5 {
        let _ = o.stage(t(u128::from(i)), i);
    }
    drop(o.flush(Duration::from_secs(10)));
    drop(o.settle(Duration::from_secs(10)));
    drop(o.shutdown(Duration::from_millis(1500)));
    assert_eq!(o.stage(t(9), 9), Staged::Refused);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(o.pending(), 0);
    let c = o.counters();
    assert_eq!(c.written, 5);
    assert!(c.balanced());
}

#[tokio::test(start_paused = true)]
async fn discarding_more_than_the_slice_is_clamped() {
    // S-W12: a sink saying it discarded more than it got.
    struct Over;
    impl Sink for Over {
        type Item = u32;
        fn name(&self) -> &str {
            "rev-over"
        }
        async fn write(&self, _: TenantId, _: &[u32]) -> Result<Written, WriteError> {
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
    assert_eq!(c.lost_for(LostReason::Discarded), 3);
    assert!(c.balanced());
}

#[tokio::test(start_paused = true)]
async fn max_batch_bytes_smaller_than_every_item_writes_each_alone() {
    // S-B5.
    let sink = TestSink::new("rev-bytes");
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

#[tokio::test(start_paused = true)]
async fn weigher_returning_zero_never_fills_a_byte_batch() {
    let sink = TestSink::new("rev-w0");
    let config = Config::builder()
        .max_batch_bytes(10)
        .capacity_bytes(10)
        .build()
        .unwrap();
    let o = Outbox::builder(sink.clone())
        .config(config)
        .weigher(|_: &u32| 0)
        .build()
        .unwrap();
    for i in 0..1000 {
        assert_eq!(o.stage(t(1), i), Staged::Accepted);
    }
    assert_eq!(o.flush(Duration::from_secs(1)).await.written, 1000);
    assert_eq!(sink.stored(t(1)), ids(0..1000));
}

/// BUG: a weigher returning `u64::MAX` (or any weights whose sum passes
/// `u64::MAX`) overflows `pending_bytes` / the tenant's `bytes` in
/// `Engine::stage` (plain `+=`): a panic in debug builds, a silent wrap in
/// release. S-B5 "no input can make the batcher loop or grow without bound";
/// `Outbox::stage` documents "never panics".
#[test]
fn engine_weigher_u64_max_does_not_overflow() {
    let config = Config::builder().max_batch_bytes(10).build().unwrap();
    let mut e: Engine<u32, u32> = Engine::with_weigher(config, |_| u64::MAX).unwrap();
    let staged = catch_unwind(AssertUnwindSafe(|| {
        (0..3)
            .map(|i| e.stage(Time::ZERO, 1, i))
            .collect::<Vec<_>>()
    }));
    let staged = staged.expect("Engine::stage panicked on a heavy item");
    assert!(staged.iter().all(|s| *s == Staged::Accepted));
    let w = e.poll_write(Time::ZERO).unwrap();
    assert_eq!(w.items, [0], "a heavy item goes alone");
}

/// BUG, as above through the driver: the panic reaches the caller of
/// `Outbox::stage` (documented "never panics"), after the engine already
/// counted the item pending, so `pending()` never returns to 0.
#[tokio::test(start_paused = true)]
async fn outbox_weigher_u64_max_does_not_panic_the_caller() {
    let sink = TestSink::new("rev-wmax");
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

// ----- time ---------------------------------------------------------------

#[test]
fn engine_time_going_backwards_is_taken_as_the_latest() {
    // Engine docs: a `now` earlier than one seen is taken as the latest.
    let mut e: Engine<u32, u32> = Engine::new(Config::default()).unwrap();
    let t10 = Time::from_millis(10_000);
    let _ = e.stage(t10, 1, 1);
    let w = e.poll_write(Time::ZERO).unwrap();
    e.finish(Time::from_millis(5), w, Outcome::Failed).unwrap();
    // Backoff 50 ms from 10 s, not from 5 ms or 0.
    assert_eq!(e.poll_timeout(), Some(Time::from_millis(10_050)));
    assert!(e.poll_write(Time::from_millis(10_049)).is_none());
    assert!(e.poll_write(Time::ZERO).is_none());
    let w = e.poll_write(Time::from_millis(10_050)).unwrap();
    assert_eq!(w.items, [1]);
    e.finish(Time::ZERO, w, Outcome::WRITTEN).unwrap();
    assert_eq!(e.pending(), 0);
    assert_eq!(e.now(), Time::from_millis(10_050));
}

#[test]
fn engine_time_max_and_deadline_max() {
    let mut e: Engine<u32, u32> = Engine::new(
        Config::builder()
            .linger(Duration::MAX)
            .write_timeout(Duration::MAX)
            .build()
            .unwrap(),
    )
    .unwrap();
    let _ = e.stage(Time::MAX, 1, 1);
    // Lingering until Time::MAX == now: it is due at once.
    let w = e.poll_write(Time::MAX).expect("due at Time::MAX");
    assert_eq!(w.deadline, Some(Time::MAX));
    e.finish(Time::MAX, w, Outcome::Failed).unwrap();
    // Backoff saturates at Time::MAX, and is due there.
    let w = e
        .poll_write(Time::MAX)
        .expect("retry due at saturated time");
    e.finish(Time::MAX, w, Outcome::WRITTEN).unwrap();
    let _ = e.shutdown(Time::MAX, Time::MAX);
    assert!(e.is_closed());
    assert_eq!(e.pending(), 0);
}

// ----- scale --------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn hundred_thousand_tenants_each_written_once() {
    let sink = TestSink::new("rev-100k");
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

// ----- runtime gone -------------------------------------------------------

#[test]
fn staging_from_a_plain_thread_after_the_runtime_is_gone() {
    // README: dropping the runtime first gives up what is pending (lost
    // under `abandoned`); later calls from any thread are refused/answered.
    let sink = TestSink::new("rev-rt-gone");
    sink.set_all(Act::Hang);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
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
        assert_eq!(o2.stage(t(1), 99), Staged::Refused);
        let c = o2.counters();
        assert_eq!(c.lost_for(LostReason::Shutdown), 1);
        assert_eq!(c.pending, 0);
        assert!(c.balanced(), "{c:?}");
        // Answers come at once, without a runtime to drive them.
        let r = futures_block_on(o2.flush(Duration::from_secs(1)));
        assert!(r.deadline_passed);
        let r = futures_block_on(o2.shutdown(Duration::from_secs(1)));
        assert_eq!(r.report.pending, 0);
        assert!(o2.abandon().is_empty());
    })
    .join()
    .unwrap();
    let c = o.counters();
    assert_eq!(c.lost_for(LostReason::Abandoned), 4);
    assert!(c.balanced());
}

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

// ----- races on a multi-thread runtime --------------------------------------

#[test]
fn concurrent_stage_flush_shutdown_abandon_stay_balanced() {
    for round in 0..20u64 {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let sink = TestSink::new("rev-race");
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
            assert_eq!(r1.report.pending, 0);
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
            // `a_given_up_write_that_came_back_written_is_still_a_dead_letter`.
            let stored: u64 = sink.store().values().map(|v| v.len() as u64).sum();
            let given_up = c.lost_for(LostReason::Abandoned) + c.lost_for(LostReason::Deadline);
            assert!(
                stored >= c.written && stored <= c.written + given_up,
                "round {round}: stored {stored}, {c:?}"
            );
        });
    }
}

/// Regression (found in review): a write the shutdown deadline gave up,
/// whose sink then answered `Written` (it committed before the cancellation
/// reached it), was handed back as a dead letter, so a service re-storing
/// dead letters would bill it twice. It stays counted lost (given up at the
/// deadline; counters never decrease) but is not handed back (S-B6).
#[test]
fn a_given_up_write_that_came_back_written_is_not_a_dead_letter() {
    let mut e: Engine<u32, u32> = Engine::new(Config::default()).unwrap();
    let _ = e.stage(Time::ZERO, 1, 7);
    let w = e.poll_write(Time::ZERO).unwrap();
    let sd = e.shutdown(Time::ZERO, Time::from_millis(100));
    e.handle_timeout(Time::from_millis(100)); // the deadline: given up
                                              // The sink had committed; its answer arrives just after.
    e.finish(Time::from_millis(101), w, Outcome::WRITTEN)
        .unwrap();
    let mut report = None;
    while let Some(ev) = e.poll_event() {
        if let Event::ShutdownDone { id, report: r } = ev {
            assert_eq!(id, sd);
            report = Some(r);
        }
    }
    let r = report.expect("answered once the write came back");
    assert!(
        r.unwritten.is_empty(),
        "the sink said it wrote item 7, yet it is handed back: {:?} (lost {})",
        r.unwritten,
        r.report.lost
    );
}

// ----- items whose Drop panics ----------------------------------------------

struct Boom {
    id: u32,
    explode: bool,
}
impl Drop for Boom {
    fn drop(&mut self) {
        if self.explode && !std::thread::panicking() {
            panic!("test sink: item drop");
        }
    }
}

#[derive(Clone, Default)]
struct BoomSink(Arc<std::sync::Mutex<Vec<u32>>>);
impl Sink for BoomSink {
    type Item = Boom;
    fn name(&self) -> &str {
        "rev-boom"
    }
    async fn write(&self, _: TenantId, items: &[Boom]) -> Result<Written, WriteError> {
        self.0.lock().unwrap().extend(items.iter().map(|b| b.id));
        Ok(Written::ALL)
    }
}

/// Regression (found in review): an item whose `Drop` panics once it has
/// been written used to kill the writer (it was dropped inside
/// `Engine::finish`, under the lock). The engine now hands finished items
/// back and the driver drops them outside the lock, contained (S-W13).
#[tokio::test(start_paused = true)]
async fn an_item_that_panics_in_drop_after_its_write() {
    quiet_sink_panics();
    let sink = BoomSink::default();
    let o = Outbox::new(sink.clone(), Config::default()).unwrap();
    let _ = o.stage(
        t(1),
        Boom {
            id: 1,
            explode: true,
        },
    );
    let r = o.flush(Duration::from_secs(1)).await;
    eprintln!("flush after a panicking drop: {r:?}");
    let staged = o.stage(
        t(2),
        Boom {
            id: 2,
            explode: false,
        },
    );
    let r2 = o.flush(Duration::from_secs(1)).await;
    eprintln!(
        "then: {staged:?} {r2:?} {:?} stored {:?}",
        o.counters(),
        sink.0.lock().unwrap()
    );
    assert_eq!(
        staged,
        Staged::Accepted,
        "one item's Drop panic closed the outbox"
    );
    assert_eq!(r2.written, 1);
}

/// A sink whose writes hang (counted in `attempts`) until released.
#[derive(Clone, Default)]
struct HangingBoomSink {
    attempts: Arc<AtomicU64>,
}
impl Sink for HangingBoomSink {
    type Item = Boom;
    fn name(&self) -> &str {
        "rev-boom-hang"
    }
    async fn write(&self, _: TenantId, _: &[Boom]) -> Result<Written, WriteError> {
        self.attempts.fetch_add(1, Ordering::SeqCst);
        std::future::pending().await
    }
}

fn boom(id: u32) -> Boom {
    Boom { id, explode: true }
}

/// Regression (second review, P2): the dead letters of a shutdown whose
/// answer was dropped used to be dropped inside the writer, uncontained;
/// an item whose `Drop` panics killed the writer, and later calls were
/// answered as if it were gone. Now they are dropped contained (S-W13,
/// S-B6: dropping the answer discards the report, nothing else).
#[tokio::test(start_paused = true)]
async fn unclaimed_dead_letters_that_panic_in_drop_keep_the_writer() {
    quiet_sink_panics();
    let sink = HangingBoomSink::default();
    let o = Outbox::new(sink.clone(), Config::default()).unwrap();
    for id in 0..3 {
        let _ = o.stage(t(1), boom(id));
    }
    while sink.attempts.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    let _ = o.stage(t(2), boom(9));
    drop(o.shutdown(Duration::from_millis(100)));
    let start = Instant::now();
    let joined = o.shutdown(Duration::from_secs(10)).await;
    assert!(!joined.first);
    assert_eq!(
        start.elapsed(),
        Duration::from_millis(100),
        "answered at the first deadline"
    );
    let c = o.counters();
    assert_eq!((c.lost_for(LostReason::Deadline), c.pending), (4, 0));
    // The writer lives: a flush on the closed outbox answers at once, in time.
    let f = o.flush(Duration::from_secs(1)).await;
    assert_eq!(f, Report::default(), "the writer died: {f:?}");
}

/// Regression (second review, P2): after `abandon`, the hung write's items
/// come back with no shutdown to hand them to; the engine used to drop
/// them under the lock inside the writer. Now they are released and
/// dropped after the lock, contained.
#[tokio::test(start_paused = true)]
async fn abandoned_in_flight_items_that_panic_in_drop_keep_the_writer() {
    quiet_sink_panics();
    let sink = HangingBoomSink::default();
    let o = Outbox::new(sink.clone(), Config::default()).unwrap();
    let _ = o.stage(t(1), boom(1));
    while sink.attempts.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    assert!(o.abandon().is_empty(), "the only item is in flight");
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    let f = o.flush(Duration::from_secs(1)).await;
    assert_eq!(f, Report::default(), "the writer died: {f:?}");
    assert_eq!(o.counters().lost_for(LostReason::Abandoned), 1);
}

/// Regression (second review, P3): an item refused at stage time is
/// dropped outside the lock, so a panicking `Drop` never escapes `stage`
/// (documented as never panicking) and the counters are still exported.
#[test]
fn a_refused_item_that_panics_in_drop_does_not_panic_stage() {
    quiet_sink_panics();
    let (counters, snap) = with_metrics(|| async {
        let o = Outbox::new(BoomSink::default(), Config::default()).unwrap();
        let _ = o.shutdown(Duration::from_secs(1)).await;
        let staged = catch_unwind(AssertUnwindSafe(|| o.stage(t(1), boom(1))));
        assert_eq!(staged.ok(), Some(Staged::Refused));
        o.counters()
    });
    assert_eq!(counters.lost_for(LostReason::Shutdown), 1);
    assert_metrics_match(&snapshot(&snap), "rev-boom", &counters);
}

/// Regression (second review, P3): an item dropped at stage time whose
/// `Drop` reads the outbox (a guard reporting `pending()`, say) used to
/// deadlock on the outbox's lock. The channel timeout only detects the
/// deadlock; nothing waits on time otherwise.
#[test]
fn an_item_dropped_at_stage_time_may_read_the_outbox() {
    use std::sync::OnceLock;
    struct Reentrant(Arc<OnceLock<Outbox<ReSink>>>);
    impl Drop for Reentrant {
        fn drop(&mut self) {
            if let Some(o) = self.0.get() {
                let _ = o.pending();
                let _ = o.counters();
            }
        }
    }
    struct ReSink;
    impl Sink for ReSink {
        type Item = Reentrant;
        fn name(&self) -> &str {
            "rev-reentrant"
        }
        async fn write(&self, _: TenantId, _: &[Reentrant]) -> Result<Written, WriteError> {
            std::future::pending().await
        }
    }
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _in = rt.enter();
        let cell = Arc::new(OnceLock::new());
        let config = Config::builder().capacity(1).build().unwrap();
        let o = Outbox::new(ReSink, config).unwrap();
        let _ = cell.set(o.clone());
        let first = o.stage(t(1), Reentrant(cell.clone()));
        let second = o.stage(t(1), Reentrant(cell.clone()));
        let _ = rt.block_on(o.shutdown(Duration::ZERO));
        let third = o.stage(t(1), Reentrant(cell.clone()));
        let _ = tx.send((first, second, third));
        // The cell holds a handle: break the cycle.
        drop(o);
        drop(cell);
    });
    let got = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("stage deadlocked dropping an item whose Drop reads the outbox");
    assert_eq!(
        got,
        (
            Staged::Accepted,
            Staged::Dropped(outbox::DropReason::BufferFull),
            Staged::Refused
        )
    );
}
