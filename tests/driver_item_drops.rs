//! Items the driver owns whose `Drop` misbehaves: panics after the write,
//! as unclaimed dead letters, after an abandon, when refused at stage time,
//! or reads the outbox while it is dropped. The driver drops items outside
//! its lock, contained, and keeps its writer (S-W13, S-B6). Rule ids refer
//! to docs/contract.md.

mod support;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use outbox::{Config, LostReason, Outbox, Report, Sink, Staged, TenantId, WriteError, Written};
use support::*;
use tokio::time::Instant;

/// An item whose `Drop` panics when `explode` is set.
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

/// A sink that records the ids it writes.
#[derive(Clone, Default)]
struct BoomSink(Arc<std::sync::Mutex<Vec<u32>>>);
impl Sink for BoomSink {
    type Tenant = TenantId;
    type Item = Boom;
    fn name(&self) -> &str {
        "boom"
    }
    async fn write(&self, _: &TenantId, items: &[Boom]) -> Result<Written, WriteError> {
        self.0.lock().unwrap().extend(items.iter().map(|b| b.id));
        Ok(Written::ALL)
    }
}

/// An item whose `Drop` panics once it has
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
    type Tenant = TenantId;
    type Item = Boom;
    fn name(&self) -> &str {
        "boom-hang"
    }
    async fn write(&self, _: &TenantId, _: &[Boom]) -> Result<Written, WriteError> {
        self.attempts.fetch_add(1, Ordering::SeqCst);
        std::future::pending().await
    }
}

fn boom(id: u32) -> Boom {
    Boom { id, explode: true }
}

/// The dead letters of a shutdown whose
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
    assert_eq!((c.lost(LostReason::Deadline), c.pending), (4, 0));
    // The writer lives: a flush on the closed outbox answers at once, in time.
    let f = o.flush(Duration::from_secs(1)).await;
    assert_eq!(f, Report::default(), "the writer died: {f:?}");
}

/// After `abandon`, the hung write's items
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
    assert_eq!(o.counters().lost(LostReason::Abandoned), 1);
}

/// An item refused at stage time is
/// dropped outside the lock, so a panicking `Drop` never escapes `stage`
/// (documented as never panicking) and the counters are still exported.
#[test]
fn a_refused_item_that_panics_in_drop_does_not_panic_stage() {
    quiet_sink_panics();
    let (counters, snap) = with_metrics(|| async {
        let o = Outbox::new(BoomSink::default(), Config::default()).unwrap();
        let _ = o.shutdown(Duration::from_secs(1)).await;
        let staged = catch_unwind(AssertUnwindSafe(|| o.stage(t(1), boom(1))));
        assert_eq!(staged.ok(), Some(Staged::ShuttingDown));
        o.counters()
    });
    assert_eq!(counters.lost(LostReason::Shutdown), 1);
    assert_metrics_match(&snapshot(&snap), "boom", &counters);
}

/// An item dropped at stage time whose
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
        type Tenant = TenantId;
        type Item = Reentrant;
        fn name(&self) -> &str {
            "reentrant"
        }
        async fn write(&self, _: &TenantId, _: &[Reentrant]) -> Result<Written, WriteError> {
            std::future::pending().await
        }
    }
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = support::rt::current();
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
            Staged::ShuttingDown
        )
    );
}
