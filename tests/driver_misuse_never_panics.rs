//! Misuse a newcomer would try, through the public API only, with a sink
//! of its own, on tokio's paused clock: extreme and zero config values,
//! items whose `Drop` panics, dropped handles, many tenants, a journal on a
//! file, a locked directory, a failing disk. Each test asserts what must
//! happen instead of a panic, a hang or an uncounted loss. Rule ids refer
//! to docs/contract.md. (The scenarios of docs/scenarios.md are in
//! tests/driver_scenarios.rs.)

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox::core::Failure;
use outbox::{Config, DropReason, LostReason, Outbox, Sink, Staged, WriteError, Written};
use tokio::sync::watch;
use tokio::time::Instant;

const MS: Duration = Duration::from_millis(1);
const SEC: Duration = Duration::from_secs(1);

// ----- a scriptable sink ---------------------------------------------------

/// How the sink answers a tenant's next write.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Act {
    Ok,
    /// A retryable error.
    Fail,
    /// A terminal rejection.
    Reject,
    /// Never answers until the tenant's act changes, then acts on the new one.
    Hang,
    /// Panics inside the write, then the tenant's act becomes `Ok`.
    PanicOnce,
    /// Takes this long, then succeeds.
    Slow(Duration),
}

#[derive(Clone, Debug)]
struct Attempt {
    tenant: u64,
    at: Instant,
}

#[derive(Default)]
struct State {
    acts: BTreeMap<u64, Act>,
    attempts: Vec<Attempt>,
    /// Per tenant, in write order; an item id already stored is not stored
    /// again (the idempotency duty of a sink).
    stored: BTreeMap<u64, Vec<u32>>,
    in_flight: usize,
    max_in_flight: usize,
}

#[derive(Clone)]
struct Script {
    name: &'static str,
    state: Arc<Mutex<State>>,
    version: Arc<watch::Sender<u64>>,
}

impl Script {
    fn new(name: &'static str) -> Self {
        Script {
            name,
            state: Arc::default(),
            version: Arc::new(watch::channel(0).0),
        }
    }
    fn bump(&self) {
        self.version.send_modify(|v| *v += 1);
    }
    fn set(&self, tenant: u64, act: Act) {
        self.state.lock().unwrap().acts.insert(tenant, act);
        self.bump();
    }
    fn act(&self, tenant: u64) -> Act {
        *self
            .state
            .lock()
            .unwrap()
            .acts
            .get(&tenant)
            .unwrap_or(&Act::Ok)
    }
    fn attempts(&self) -> Vec<Attempt> {
        self.state.lock().unwrap().attempts.clone()
    }
    fn stored(&self, tenant: u64) -> Vec<u32> {
        self.state
            .lock()
            .unwrap()
            .stored
            .get(&tenant)
            .cloned()
            .unwrap_or_default()
    }
    /// Waits (virtual time runs meanwhile) until `pred` holds.
    async fn until(&self, pred: impl Fn(&State) -> bool) {
        let mut rx = self.version.subscribe();
        loop {
            if pred(&self.state.lock().unwrap()) {
                return;
            }
            rx.changed().await.unwrap();
        }
    }
    async fn until_attempts(&self, tenant: u64, n: usize) {
        self.until(|s| s.attempts.iter().filter(|a| a.tenant == tenant).count() >= n)
            .await;
    }
    fn store(&self, tenant: u64, items: &[u32]) {
        let mut s = self.state.lock().unwrap();
        let row = s.stored.entry(tenant).or_default();
        for &i in items {
            if !row.contains(&i) {
                row.push(i);
            }
        }
    }
}

/// Decrements `in_flight` however the write ends (cancelled included).
struct InFlight(Script);
impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.state.lock().unwrap().in_flight -= 1;
        self.0.bump();
    }
}

impl Sink for Script {
    type Tenant = u64;
    type Item = u32;
    fn name(&self) -> &str {
        self.name
    }
    async fn write(&self, tenant: &u64, items: &[u32]) -> Result<Written, WriteError> {
        let tenant = *tenant;
        {
            let mut s = self.state.lock().unwrap();
            s.attempts.push(Attempt {
                tenant,
                at: Instant::now(),
            });
            s.in_flight += 1;
            s.max_in_flight = s.max_in_flight.max(s.in_flight);
        }
        let _guard = InFlight(self.clone());
        self.bump();
        let mut rx = self.version.subscribe();
        loop {
            match self.act(tenant) {
                Act::Ok => {
                    self.store(tenant, items);
                    return Ok(Written::ALL);
                }
                Act::Fail => return Err(WriteError::retryable("scripted failure")),
                Act::Reject => return Err(WriteError::terminal("scripted rejection")),
                Act::Hang => {
                    let _ = rx.changed().await;
                }
                Act::PanicOnce => {
                    self.set(tenant, Act::Ok);
                    panic!("scripted sink panic");
                }
                Act::Slow(d) => {
                    tokio::time::sleep(d).await;
                    self.store(tenant, items);
                    return Ok(Written::ALL);
                }
            }
        }
    }
}

fn build(sink: &Script, config: Config) -> Outbox<Script> {
    Outbox::new(sink.clone(), config).expect("outbox builds")
}

fn stage_all<S: Sink<Tenant = u64, Item = u32>>(
    o: &Outbox<S>,
    tenant: u64,
    items: impl IntoIterator<Item = u32>,
) {
    for i in items {
        assert_eq!(o.stage(tenant, i), Staged::Accepted, "item {i}");
    }
}

/// S-W14, checked on every snapshot the tests take.
fn assert_balanced(o: &Outbox<Script>) {
    let c = o.counters();
    assert!(c.balanced(), "S-W14 broken: {c:?}");
    assert_eq!(c.pending, o.pending());
}

// ----- abuse ------------------------------------------------------------------

/// `stage_wait` documents `StageError::TimedOut` for a timeout that passes;
/// a timeout too large for the clock must not panic in library code.
#[tokio::test(start_paused = true)]
async fn abuse_stage_wait_with_a_huge_timeout_does_not_panic() {
    let sink = Script::new("a-wait");
    let o = build(&sink, Config::builder().capacity(1).build().unwrap());
    sink.set(1, Act::Hang);
    stage_all(&o, 1, [1]); // in flight, and the capacity is full
    sink.until_attempts(1, 1).await;
    assert_eq!(o.stage(1, 9), Staged::Dropped(DropReason::BufferFull));
    let waiter = {
        let o = o.clone();
        tokio::spawn(async move { o.stage_wait(1, 2, Duration::MAX).await })
    };
    tokio::time::sleep(SEC).await;
    sink.set(1, Act::Ok);
    assert_eq!(waiter.await.expect("stage_wait panicked"), Ok(()));
    assert_eq!(o.settle(SEC).await.pending, 0);
    assert_eq!(sink.stored(1), [1, 2]);
}

/// Zero and inverted values are rejected by `build`, naming the field, or
/// normalised as documented (concurrency, max_slices_per_write).
#[test]
fn abuse_zero_and_inverted_config_values() {
    let named = |b: outbox::ConfigBuilder, field: &str| {
        let e = b.build().unwrap_err();
        assert!(e.to_string().contains(field), "{e} does not name {field}");
    };
    named(Config::builder().capacity(0), "capacity");
    named(Config::builder().max_batch(0), "max_batch");
    named(Config::builder().tenant_capacity(0), "tenant_capacity");
    named(Config::builder().max_group_items(0), "max_group_items");
    named(
        Config::builder().initial_backoff(Duration::ZERO),
        "initial_backoff",
    );
    named(
        Config::builder().initial_backoff(2 * SEC).max_backoff(SEC),
        "max_backoff",
    );
    named(Config::builder().jitter(f64::NAN), "jitter");
    named(Config::builder().jitter(-0.0 - 1e-9), "jitter");
    let c = Config::builder()
        .concurrency(0)
        .max_slices_per_write(0)
        .build()
        .unwrap();
    assert_eq!((c.concurrency(), c.max_slices_per_write()), (1, 1));
    // A byte limit without a weigher is refused when the outbox is built.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _in = rt.enter();
    let config = Config::builder().capacity_bytes(10).build().unwrap();
    let e = Outbox::new(Script::new("a-w"), config).unwrap_err();
    assert!(e.to_string().contains("capacity_bytes"), "{e}");
}

/// Built outside a runtime, or on one without a timer: a clear error.
#[test]
fn abuse_build_without_a_usable_runtime() {
    let e = Outbox::new(Script::new("a-rt"), Config::default()).unwrap_err();
    assert!(matches!(e, outbox::BuildError::NoRuntime), "{e:?}");
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let e = Outbox::builder(Script::new("a-rt"))
        .runtime(rt.handle().clone())
        .build()
        .unwrap_err();
    assert!(matches!(e, outbox::BuildError::NoTimer), "{e:?}");
}

/// The runtime goes away under a live outbox: stages are still answered
/// and counted, flush answers at once, nothing panics.
#[test]
fn abuse_runtime_dropped_under_a_live_outbox() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let sink = Script::new("a-rtgone");
    sink.set(1, Act::Hang);
    let o = Outbox::builder(sink.clone())
        .runtime(rt.handle().clone())
        .build()
        .unwrap();
    assert_eq!(o.stage(1, 1), Staged::Accepted);
    drop(rt);
    let staged = o.stage(1, 2);
    assert_ne!(
        staged,
        Staged::Accepted,
        "accepted with no writer to write it"
    );
    let c = o.counters();
    assert_eq!(c.pending, 0, "{c:?}");
    assert!(c.balanced(), "{c:?}");
    assert_eq!(c.lost(LostReason::Abandoned), 1, "{c:?}");
    let r = futures_lite_block_on(o.flush(SEC));
    assert!(r.deadline_passed);
}

/// `stage_wait` awaited where there is no runtime (a plain executor on a
/// thread of its own) or one without timers: its timeout is the outbox's
/// runtime's timer, so it waits and answers, and never panics.
#[test]
fn abuse_stage_wait_awaited_outside_any_runtime_with_timers() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_time()
        .build()
        .unwrap();
    let sink = Script::new("a-plain");
    sink.set(1, Act::Hang);
    let o = Outbox::builder(sink.clone())
        .config(Config::builder().capacity(1).build().unwrap())
        .runtime(rt.handle().clone())
        .build()
        .unwrap();
    let on_plain = |o: &Outbox<Script>, item, timeout| {
        let o = o.clone();
        std::thread::spawn(move || plain_block_on(o.stage_wait(1, item, timeout)))
            .join()
            .expect("no panic")
    };
    assert_eq!(on_plain(&o, 1, SEC), Ok(()), "room: accepted at once");
    match on_plain(&o, 2, 50 * MS) {
        Err(outbox::StageError::TimedOut(2)) => {}
        other => panic!("full, with a hanging write: {other:?}"),
    }
    let no_timers = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    match no_timers.block_on(o.stage_wait(1, 3, 50 * MS)) {
        Err(outbox::StageError::TimedOut(3)) => {}
        other => panic!("in a runtime without timers: {other:?}"),
    }
    sink.set(1, Act::Ok);
    let r = plain_block_on(o.settle(10 * SEC));
    assert_eq!(r.pending, 0, "{r:?}");
    let c = o.counters();
    assert_eq!((c.written, c.pending), (1, 0), "{c:?}");
    assert!(c.balanced(), "{c:?}");
}

/// An executor with no runtime at all: polls on this thread, parks
/// between wake-ups.
fn plain_block_on<F: std::future::Future>(f: F) -> F::Output {
    use std::sync::Arc;
    use std::task::{Context, Poll, Wake, Waker};
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        match f.as_mut().poll(&mut cx) {
            Poll::Ready(out) => return out,
            Poll::Pending => std::thread::park(),
        }
    }
}

/// A tiny executor for a future that needs no runtime (an `Answer`).
fn futures_lite_block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(f)
}

/// A sink that tells when the outbox has dropped it (its writer exited).
struct Released(Script, #[allow(dead_code)] tokio::sync::oneshot::Sender<()>);
impl Sink for Released {
    type Tenant = u64;
    type Item = u32;
    fn name(&self) -> &str {
        self.0.name()
    }
    fn write(
        &self,
        tenant: &u64,
        items: &[u32],
    ) -> impl std::future::Future<Output = Result<Written, WriteError>> + Send {
        self.0.write(tenant, items)
    }
}

/// Every handle dropped without a shutdown: the writer drains what is
/// pending within `drop_timeout` (S-W16) and exits, releasing the sink.
#[tokio::test(start_paused = true)]
async fn abuse_drop_every_handle_without_shutdown() {
    let sink = Script::new("a-drop");
    sink.set(1, Act::Slow(100 * MS));
    sink.set(2, Act::Fail);
    let (tx, released) = tokio::sync::oneshot::channel();
    let o = Outbox::builder(Released(sink.clone(), tx))
        .drop_timeout(5 * SEC)
        .build()
        .unwrap();
    stage_all(&o, 1, 0..10);
    stage_all(&o, 2, [7]);
    let clone = o.clone();
    drop(o);
    drop(clone);
    let t0 = Instant::now();
    assert!(
        released.await.is_err(),
        "the sink is dropped, never sent on"
    );
    let took = t0.elapsed();
    // T2 keeps failing: the writer gives up at the drop timeout.
    assert!(took >= 5 * SEC && took <= 5 * SEC + 10 * MS, "{took:?}");
    assert_eq!(sink.stored(1), (0..10).collect::<Vec<_>>());
    assert!(sink.stored(2).is_empty());
    assert_eq!(sink.state.lock().unwrap().in_flight, 0);
}

/// After a shutdown: every way in is refused and counted (stage) or handed
/// back (try_stage, stage_wait); flush answers at once; a second shutdown
/// reports zeros and `first == false`.
#[tokio::test(start_paused = true)]
async fn abuse_everything_after_shutdown() {
    let sink = Script::new("a-after");
    let o = build(&sink, Config::default());
    stage_all(&o, 1, [1]);
    let r = o.shutdown(SEC).await;
    assert!(r.first);
    assert_eq!(r.written, 1);
    assert_eq!(o.stage(1, 2), Staged::ShuttingDown);
    assert!(matches!(
        o.try_stage(1, 3),
        Err(outbox::StageError::ShuttingDown(3))
    ));
    assert!(matches!(
        o.stage_wait(1, 4, SEC).await,
        Err(outbox::StageError::ShuttingDown(4))
    ));
    let t0 = Instant::now();
    let f = o.flush(10 * SEC).await;
    assert_eq!(t0.elapsed(), Duration::ZERO);
    assert_eq!((f.pending, f.written), (0, 0));
    let again = o.shutdown(SEC).await;
    assert!(!again.first);
    assert_eq!((again.written, again.lost), (0, 0));
    let c = o.counters();
    assert_eq!(c.lost(LostReason::Shutdown), 1, "only `stage` counts");
    assert_eq!(c.staged, 2);
    assert_balanced(&o);
    assert!(o.abandon().is_empty());
}

/// 200,000 tenants with one item each, then 200,000 more with two: all
/// written, per tenant in order, counters balanced.
#[tokio::test(start_paused = true)]
async fn abuse_many_tenants() {
    let sink = Script::new("a-many");
    let o = build(&sink, Config::builder().concurrency(64).build().unwrap());
    for t in 0..200_000u64 {
        assert_eq!(o.stage(t, 1), Staged::Accepted);
    }
    for t in 0..200_000u64 {
        assert_eq!(o.stage(t, 2), Staged::Accepted);
    }
    let r = o.settle(600 * SEC).await;
    assert_eq!(r.pending, 0);
    let c = o.counters();
    assert_eq!(c.written, 400_000);
    assert_balanced(&o);
    let s = sink.state.lock().unwrap();
    assert_eq!(s.stored.len(), 200_000);
    assert!(s.stored.values().all(|v| v == &[1, 2]));
    assert!(s.max_in_flight <= 64);
}

/// A sink that claims to have discarded more items than it was given.
#[derive(Clone)]
struct Overclaim;
impl Sink for Overclaim {
    type Tenant = u64;
    type Item = u32;
    fn name(&self) -> &str {
        "a-overclaim"
    }
    async fn write(&self, _: &u64, _: &[u32]) -> Result<Written, WriteError> {
        Ok(Written::discarding(usize::MAX))
    }
}

#[tokio::test(start_paused = true)]
async fn abuse_sink_discards_more_than_it_was_given() {
    let o = Outbox::new(Overclaim, Config::default()).unwrap();
    for i in 0..3 {
        assert_eq!(o.stage(1, i), Staged::Accepted);
    }
    assert_eq!(o.settle(SEC).await.pending, 0);
    let c = o.counters();
    assert_eq!((c.written, c.lost(LostReason::Discarded)), (0, 3));
    assert!(c.balanced(), "{c:?}");
}

/// A group-taking sink that answers with the wrong number of outcomes.
#[derive(Clone, Default)]
struct BadGroups(Arc<Mutex<Vec<(u64, u32)>>>, Arc<Mutex<u32>>);
impl Sink for BadGroups {
    type Tenant = u64;
    type Item = u32;
    fn name(&self) -> &str {
        "a-badgroups"
    }
    async fn write(&self, t: &u64, items: &[u32]) -> Result<Written, WriteError> {
        self.0
            .lock()
            .unwrap()
            .extend(items.iter().map(|i| (*t, *i)));
        Ok(Written::ALL)
    }
    fn takes_groups(&self) -> bool {
        true
    }
    fn write_group(
        &self,
        slices: &[outbox::Slice<u64, u32>],
    ) -> impl std::future::Future<Output = Vec<Result<Written, WriteError>>> + Send {
        let call = {
            let mut n = self.1.lock().unwrap();
            *n += 1;
            *n
        };
        let mut written = self.0.lock().unwrap();
        // Odd calls: one outcome too few (the last slice is not written).
        // Even calls: one too many.
        let take = if call % 2 == 1 {
            slices.len().saturating_sub(1)
        } else {
            slices.len()
        };
        let mut out = Vec::new();
        for s in &slices[..take] {
            written.extend(s.items.iter().map(|i| (s.tenant, *i)));
            out.push(Ok(Written::ALL));
        }
        if call % 2 == 0 {
            out.push(Ok(Written::ALL));
        }
        async move { out }
    }
}

#[tokio::test(start_paused = true)]
async fn abuse_group_sink_returns_the_wrong_number_of_outcomes() {
    let sink = BadGroups::default();
    let config = Config::builder().max_slices_per_write(8).build().unwrap();
    let o = Outbox::new(sink.clone(), config).unwrap();
    for t in 0..20u64 {
        assert_eq!(o.stage(t, t as u32), Staged::Accepted);
    }
    let r = o.settle(60 * SEC).await;
    assert_eq!(r.pending, 0);
    let c = o.counters();
    assert_eq!(c.written, 20);
    assert!(c.balanced(), "{c:?}");
    let mut got = sink.0.lock().unwrap().clone();
    got.sort();
    got.dedup();
    assert_eq!(got.len(), 20);
}

/// An item whose `Drop` panics, every time.
struct Boom(u32, Arc<std::sync::atomic::AtomicU64>);
impl Drop for Boom {
    fn drop(&mut self) {
        self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        panic!("Drop of item {} panicked", self.0);
    }
}

#[derive(Clone, Default)]
struct BoomSink(Arc<Mutex<Vec<u32>>>);
impl Sink for BoomSink {
    type Tenant = u64;
    type Item = Boom;
    fn name(&self) -> &str {
        "a-boom"
    }
    async fn write(&self, _: &u64, items: &[Boom]) -> Result<Written, WriteError> {
        self.0.lock().unwrap().extend(items.iter().map(|b| b.0));
        Ok(Written::ALL)
    }
}

/// Items whose `Drop` panics, dropped by the outbox one at a time: after
/// a write of one item, at a full capacity, after the shutdown fence.
/// Every panic is contained, `stage` never panics, the writer keeps
/// writing, the counts balance.
#[tokio::test(start_paused = true)]
async fn abuse_item_whose_drop_panics_dropped_alone() {
    let drops = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let boom = |i| Boom(i, Arc::clone(&drops));
    let sink = BoomSink::default();
    let config = Config::builder().capacity(1).build().unwrap();
    let o = Outbox::new(sink.clone(), config).unwrap();
    assert_eq!(o.stage(1, boom(1)), Staged::Accepted);
    // Full: the item is dropped inside `stage`.
    assert_eq!(o.stage(1, boom(2)), Staged::Dropped(DropReason::BufferFull));
    assert_eq!(o.settle(SEC).await.pending, 0);
    // Written items are dropped by the writer: it survives each.
    for i in 3..7 {
        assert_eq!(o.stage(2, boom(i)), Staged::Accepted);
        assert_eq!(o.settle(SEC).await.pending, 0);
    }
    let r = o.shutdown(SEC).await;
    assert_eq!(r.lost, 0);
    assert_eq!(o.stage(1, boom(9)), Staged::ShuttingDown);
    assert_eq!(*sink.0.lock().unwrap(), [1, 3, 4, 5, 6]);
    let c = o.counters();
    assert_eq!((c.written, c.dropped_total(), c.lost_total()), (5, 1, 1));
    assert!(c.balanced(), "{c:?}");
    assert_eq!(drops.load(std::sync::atomic::Ordering::SeqCst), 7);
}

/// The README promises containment of "an item whose `Drop` panics"; two
/// such items written in one batch abort the whole process.
#[tokio::test(start_paused = true)]
async fn abuse_items_whose_drop_panics_written_in_one_batch() {
    let drops = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let sink = BoomSink::default();
    let o = Outbox::new(sink.clone(), Config::default()).unwrap();
    assert_eq!(o.stage(1, Boom(1, Arc::clone(&drops))), Staged::Accepted);
    assert_eq!(o.stage(1, Boom(2, Arc::clone(&drops))), Staged::Accepted);
    assert_eq!(o.settle(SEC).await.pending, 0);
    assert_eq!(*sink.0.lock().unwrap(), [1, 2]);
    assert_eq!(drops.load(std::sync::atomic::Ordering::SeqCst), 2);
    assert_eq!(o.stage(1, Boom(3, Arc::clone(&drops))), Staged::Accepted);
    assert_eq!(o.settle(SEC).await.pending, 0);
}

/// The journal refuses a directory it cannot use, with a clear error, and
/// a second outbox on a directory in use (S-J6, S-J7).
#[cfg(feature = "journal")]
mod journal_abuse {
    use super::*;
    use outbox::journal::JournalConfig;

    fn tmp(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("newcomer-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let _ = std::fs::remove_file(&d);
        d
    }

    fn journaled(
        sink: &Script,
        dir: &std::path::Path,
    ) -> Result<Outbox<Script>, outbox::BuildError> {
        Outbox::builder(sink.clone())
            .journal(JournalConfig::new(dir))
            .build()
    }

    #[tokio::test]
    async fn abuse_journal_dir_is_a_file() {
        let path = tmp("file");
        std::fs::write(&path, b"not a directory").unwrap();
        let e = journaled(&Script::new("j-file"), &path).unwrap_err();
        assert!(matches!(e, outbox::BuildError::Journal(_)), "{e:?}");
        assert!(
            e.to_string().contains("is not a directory"),
            "the cause named: {e}"
        );
        let below = path.join("sub");
        let e = journaled(&Script::new("j-below"), &below).unwrap_err();
        assert!(matches!(e, outbox::BuildError::Journal(_)), "{e:?}");
        std::fs::remove_file(&path).unwrap();
    }

    #[tokio::test]
    async fn abuse_journal_foreign_file_and_second_outbox() {
        let dir = tmp("two");
        let sink = Script::new("j-two");
        let first = journaled(&sink, &dir).unwrap();
        let e = journaled(&sink, &dir).unwrap_err();
        assert!(
            matches!(
                e,
                outbox::BuildError::Journal(outbox::journal::JournalError::Locked(_))
            ),
            "{e:?}"
        );
        assert_eq!(first.stage(1, 1), Staged::Accepted);
        first.sync().await.unwrap();
        assert_eq!(first.shutdown(SEC).await.lost, 0);
        let closed = first.closed();
        drop(first);
        // Free again once the first outbox's journal task has closed.
        closed.await;
        let second = journaled(&sink, &dir).expect("free once closed");
        assert_eq!(second.counters().recovered, 0);
        drop(second.shutdown(SEC).await);
        let closed = second.closed();
        drop(second);
        closed.await;
        std::fs::write(dir.join("notes.txt"), b"mine").unwrap();
        let e = journaled(&sink, &dir).unwrap_err();
        assert!(e.to_string().contains("notes.txt"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Shut down, drop every handle, open the same directory again as soon
    /// as `closed` answers (a service reconfiguring itself in-process).
    #[tokio::test]
    async fn abuse_journal_reopen_right_after_shutdown() {
        let dir = tmp("reopen");
        let sink = Script::new("j-reopen");
        let first = journaled(&sink, &dir).unwrap();
        assert_eq!(first.stage(1, 1), Staged::Accepted);
        assert_eq!(first.shutdown(SEC).await.lost, 0);
        let closed = first.closed();
        drop(first);
        closed.await;
        let second = journaled(&sink, &dir).expect("the directory is free once closed");
        drop(second.shutdown(SEC).await);
        drop(second);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The runtime dies under a journaled outbox (the nearest thing to a
    /// crash in-process): every item an answered `sync` covered is staged
    /// again by the next outbox on the directory, counted `recovered`, and
    /// written once, in order (D1, D2, D4).
    #[test]
    fn abuse_journal_runtime_dropped_then_recovered() {
        let dir = tmp("rtdrop");
        let sink = Script::new("j-rt");
        sink.set(1, Act::Hang);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let o = rt.block_on(async {
            let o = journaled(&sink, &dir).unwrap();
            stage_all(&o, 1, 1..=10);
            o.sync().await.unwrap();
            o
        });
        drop(rt);
        assert_eq!(o.pending(), 0, "abandoned with the runtime");
        assert_eq!(o.counters().lost(LostReason::Abandoned), 10);
        drop(o);
        sink.set(1, Act::Ok);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let o = journaled(&sink, &dir).expect("the dead runtime's lock is gone");
            let c = o.counters();
            assert_eq!((c.recovered, c.pending), (10, 10), "{c:?}");
            assert_eq!(o.settle(10 * SEC).await.pending, 0);
            assert_eq!(sink.stored(1), (1..=10).collect::<Vec<_>>());
            assert_eq!(o.shutdown(SEC).await.lost, 0);
        });
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The disk fails for good at close: the journal's task gives up after
    /// a few retries, so `closed` answers and the lock is released (S-J5,
    /// S-J6); the items it could not mark done come back at the next start
    /// (written twice at worst, S-J3), none is lost.
    #[tokio::test(start_paused = true)]
    async fn abuse_journal_closed_with_a_disk_that_stays_failed() {
        let disk = outbox::journal::MemStorage::new();
        let sink = Script::new("j-closefail");
        let config = || {
            JournalConfig::with_storage(disk.clone())
                .sync_interval(MS)
                .retry_interval(20 * MS)
        };
        let o = Outbox::builder(sink.clone())
            .journal(config())
            .build()
            .unwrap();
        stage_all(&o, 1, 1..=10);
        disk.fail(Some(std::io::ErrorKind::StorageFull));
        assert_eq!(o.shutdown(SEC).await.lost, 0);
        let closed = o.closed();
        drop(o);
        tokio::time::timeout(10 * SEC, closed)
            .await
            .expect("closed() answers with a failed disk");
        disk.fail(None);
        let again = Outbox::builder(sink.clone()).journal(config()).build();
        let again = again.expect("the lock is released");
        assert_eq!(again.settle(SEC).await.pending, 0);
        // Unsynced when the disk failed: maybe on no disk (S-J5), never twice.
        assert_eq!(sink.stored(1), (1..=10).collect::<Vec<_>>(), "once each");
        drop(again.shutdown(SEC).await);
    }

    /// A journal whose commit fails, with `retry_interval(Duration::MAX)`:
    /// the sync answers `Failed`, nothing panics, the outbox goes on
    /// writing from memory (S-J5), and a later sync answers too.
    #[tokio::test]
    async fn abuse_journal_huge_retry_interval_on_a_failing_disk() {
        let disk = outbox::journal::MemStorage::new();
        let sink = Script::new("j-retry");
        let o = Outbox::builder(sink.clone())
            .journal(JournalConfig::with_storage(disk.clone()).retry_interval(Duration::MAX))
            .build()
            .unwrap();
        disk.fail(Some(std::io::ErrorKind::StorageFull));
        assert_eq!(o.stage(1, 1), Staged::Accepted);
        let r = tokio::time::timeout(5 * SEC, o.sync()).await;
        assert!(matches!(r, Ok(Err(_))), "{r:?}");
        assert_eq!(o.stage(1, 2), Staged::Accepted);
        let r = tokio::time::timeout(5 * SEC, o.sync()).await;
        assert!(matches!(r, Ok(Err(_))), "a second sync: {r:?}");
        assert_eq!(o.settle(5 * SEC).await.pending, 0);
        assert_eq!(sink.stored(1), [1, 2]);
        let r = tokio::time::timeout(10 * SEC, o.shutdown(SEC)).await;
        assert!(r.is_ok(), "the shutdown answers");
    }

    /// `sync` after a shutdown, and after the last handle's drop, answers
    /// (it never hangs); a stage after the shutdown is refused and leaves
    /// nothing to recover.
    #[tokio::test]
    async fn abuse_journal_sync_after_shutdown_answers() {
        let disk = outbox::journal::MemStorage::new();
        let sink = Script::new("j-after");
        let o = Outbox::builder(sink.clone())
            .journal(JournalConfig::with_storage(disk.clone()))
            .build()
            .unwrap();
        stage_all(&o, 1, [1, 2]);
        o.sync().await.unwrap();
        assert_eq!(o.shutdown(5 * SEC).await.lost, 0);
        assert_eq!(o.stage(1, 3), Staged::ShuttingDown);
        let r = tokio::time::timeout(5 * SEC, o.sync()).await;
        assert!(r.is_ok(), "sync after shutdown hangs");
        let late = o.sync();
        let closed = o.closed();
        drop(o);
        let r = tokio::time::timeout(5 * SEC, late).await;
        assert!(r.is_ok(), "sync after the last drop hangs");
        // Nothing to recover on the same disk (its lock is freed once the
        // journal's task has closed).
        closed.await;
        let again = Outbox::builder(sink.clone())
            .journal(JournalConfig::with_storage(disk.clone()))
            .build()
            .expect("free once closed");
        assert_eq!(again.counters().recovered, 0);
        assert_eq!(sink.stored(1), [1, 2]);
        drop(again.shutdown(SEC).await);
    }

    /// A zero `max_bytes` is a build error naming it (S-J10), never a
    /// journal that drops every stage.
    #[tokio::test]
    async fn abuse_journal_max_bytes_zero() {
        let dir = tmp("zero");
        let sink = Script::new("j-zero");
        let built = Outbox::builder(sink.clone())
            .journal(JournalConfig::new(&dir).max_bytes(Some(0)))
            .build();
        let Err(e) = built else {
            panic!("a zero max_bytes built");
        };
        assert!(e.to_string().contains("max_bytes (0)"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// A weigher that answers absurd weights (0 and `u64::MAX`, and one that
/// panics): no overflow panic in a debug build, the byte capacity holds,
/// the counts balance.
#[tokio::test(start_paused = true)]
async fn abuse_weigher_answers_absurd_weights() {
    let sink = Script::new("a-weigh");
    sink.set(1, Act::Hang);
    let config = Config::builder()
        .capacity_bytes(1_000)
        .max_batch_bytes(100)
        .build()
        .unwrap();
    let o = Outbox::builder(sink.clone())
        .config(config)
        .weigher(|i: &u32| match i % 3 {
            0 => 0,
            1 => u64::MAX,
            _ => panic!("weigher panicked on {i}"),
        })
        .build()
        .unwrap();
    let mut accepted = 0;
    for i in 0..30u32 {
        if o.stage(1 + u64::from(i % 2), i) == Staged::Accepted {
            accepted += 1;
        }
    }
    // A u64::MAX item cannot fit in 1,000 bytes.
    assert!(accepted < 30);
    assert!(o.counters().dropped(DropReason::BufferFull) > 0);
    assert_balanced(&o);
    sink.set(1, Act::Ok);
    assert_eq!(o.settle(60 * SEC).await.pending, 0);
    assert_balanced(&o);
    assert_eq!(o.counters().written, accepted);
}

/// Dead letters that cannot be handed out (a callback that panics, a full
/// or closed channel) are counted in `health().dead_letters_dropped`, and
/// the items stay counted lost.
#[tokio::test(start_paused = true)]
async fn abuse_dead_letters_that_cannot_be_handed_out() {
    let sink = Script::new("a-dead");
    sink.set(1, Act::Reject);
    let config = Config::builder().build().unwrap();
    let o = Outbox::builder(sink.clone())
        .config(config)
        .dead_letters(outbox::DeadLetters::callback(|l| {
            panic!("dead-letter callback panicked on {:?}", l.items)
        }))
        .build()
        .unwrap();
    stage_all(&o, 1, [1, 2]);
    assert_eq!(o.settle(SEC).await.pending, 0);
    stage_all(&o, 1, [3]);
    assert_eq!(o.settle(SEC).await.pending, 0);
    assert_eq!(o.health().dead_letters_dropped, 2);
    assert_eq!(o.counters().lost(LostReason::Terminal), 3);
    assert_balanced(&o);

    let sink = Script::new("a-dead-ch");
    sink.set(1, Act::Reject);
    let (letters, rx) = outbox::DeadLetters::channel(0);
    let o = Outbox::builder(sink.clone())
        .dead_letters(letters)
        .build()
        .unwrap();
    stage_all(&o, 1, [1]);
    assert_eq!(o.settle(SEC).await.pending, 0);
    stage_all(&o, 1, [2]);
    assert_eq!(o.settle(SEC).await.pending, 0);
    // Capacity 0 is taken as 1: the first letter is held, the second is not.
    assert_eq!(o.health().dead_letters_dropped, 1);
    drop(rx);
    stage_all(&o, 1, [3]);
    assert_eq!(o.settle(SEC).await.pending, 0);
    assert_eq!(o.health().dead_letters_dropped, 2);
    assert_eq!(o.counters().lost(LostReason::Terminal), 3);
}

/// `try_stage` on a full outbox hands the item back and counts nothing.
#[tokio::test(start_paused = true)]
async fn abuse_try_stage_refusal_is_not_counted() {
    let sink = Script::new("a-try");
    sink.set(1, Act::Hang);
    let o = build(&sink, Config::builder().capacity(1).build().unwrap());
    assert_eq!(o.try_stage(1, 1), Ok(()));
    sink.until_attempts(1, 1).await;
    let before = o.counters();
    match o.try_stage(1, 2) {
        Err(outbox::StageError::Full {
            reason: DropReason::BufferFull,
            item: 2,
        }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(o.counters(), before);
    let r = o.stage_wait(1, 3, SEC).await;
    assert!(matches!(r, Err(outbox::StageError::TimedOut(3))), "{r:?}");
    assert_eq!(o.counters(), before);
}

/// Stages from plain threads outside the runtime, while the runtime's
/// own tasks stage too: every item written, per tenant in order.
#[test]
fn abuse_stage_from_many_threads_outside_the_runtime() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let sink = Script::new("a-threads");
    let o = Outbox::builder(sink.clone())
        .runtime(rt.handle().clone())
        .build()
        .unwrap();
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let o = o.clone();
            std::thread::spawn(move || {
                for i in 0..5_000u32 {
                    assert_eq!(o.stage(t, i), Staged::Accepted);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let r = rt.block_on(o.settle(60 * SEC));
    assert_eq!(r.pending, 0);
    for t in 0..4 {
        assert_eq!(sink.stored(t), (0..5_000).collect::<Vec<_>>());
    }
    let r = rt.block_on(o.shutdown(SEC));
    assert_eq!(r.lost, 0);
}

/// An item whose `Drop` stages into the same outbox (the README: "Items
/// are never dropped under the outbox's lock, so an item's `Drop` may call
/// the outbox"): dropped at a full capacity, after the fence, after a
/// write. No deadlock, no panic, everything counted.
mod reentrant_drop {
    use super::*;
    use std::sync::OnceLock;

    static OUTBOX: OnceLock<Outbox<ReSink>> = OnceLock::new();

    /// Item `n`'s drop stages `n + 1000` once (ids below 1000 only).
    struct Re(u32);
    impl Drop for Re {
        fn drop(&mut self) {
            if self.0 < 1000 {
                if let Some(o) = OUTBOX.get() {
                    let _ = o.stage(1, Re(self.0 + 1000));
                }
            }
        }
    }

    #[derive(Clone, Default)]
    struct ReSink(Arc<Mutex<Vec<u32>>>);
    impl Sink for ReSink {
        type Tenant = u64;
        type Item = Re;
        fn name(&self) -> &str {
            "a-reentrant"
        }
        async fn write(&self, _: &u64, items: &[Re]) -> Result<Written, WriteError> {
            self.0.lock().unwrap().extend(items.iter().map(|r| r.0));
            Ok(Written::ALL)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn abuse_item_drop_calls_the_outbox() {
        let sink = ReSink::default();
        let config = Config::builder().capacity(2).build().unwrap();
        let o = Outbox::new(sink.clone(), config).unwrap();
        assert!(OUTBOX.set(o.clone()).is_ok());
        assert_eq!(o.stage(1, Re(1)), Staged::Accepted);
        assert_eq!(o.stage(1, Re(2)), Staged::Accepted);
        // Dropped at the capacity: its drop stages 1003, also dropped.
        assert_eq!(o.stage(1, Re(3)), Staged::Dropped(DropReason::BufferFull));
        // 1 and 2 are written, then dropped: they stage 1001 and 1002.
        assert_eq!(o.settle(SEC).await.pending, 0);
        assert_eq!(o.settle(SEC).await.pending, 0);
        let r = o.shutdown(SEC).await;
        assert_eq!(r.lost, 0);
        // Refused after the fence: its drop is refused too.
        assert_eq!(o.stage(1, Re(4)), Staged::ShuttingDown);
        let mut got = sink.0.lock().unwrap().clone();
        got.sort();
        assert_eq!(got, [1, 2, 1001, 1002]);
        let c = o.counters();
        assert!(c.balanced(), "{c:?}");
        assert_eq!(c.staged, 8);
        assert_eq!(c.lost(LostReason::Shutdown), 2);
        assert_eq!(c.dropped(DropReason::BufferFull), 2);
    }
}

/// Two shutdowns, the second with an earlier deadline: it tightens the
/// first; the first caller gets the accounting, the second zeros. An
/// abandon while the shutdown is still to answer hands its items to the
/// shutdown's report, not to its own caller (each item handed back once).
#[tokio::test(start_paused = true)]
async fn abuse_second_shutdown_tightens_and_abandon_defers_to_it() {
    let sink = Script::new("a-shut2");
    sink.set(1, Act::Hang);
    sink.set(2, Act::Fail);
    let o = build(&sink, Config::default());
    stage_all(&o, 1, [1]);
    stage_all(&o, 2, [2, 3]);
    sink.until_attempts(1, 1).await;
    let t0 = Instant::now();
    let first = o.shutdown(10 * SEC);
    let second = o.shutdown(SEC);
    let (a, b) = tokio::join!(first, second);
    let took = t0.elapsed();
    assert!(took >= SEC && took <= SEC + MS, "{took:?}");
    assert!(a.first && !b.first);
    assert_eq!((a.lost, b.lost), (3, 0));
    assert!(b.unwritten.is_empty());
    assert_eq!(a.unwritten.iter().map(|r| r.items.len()).sum::<usize>(), 3);

    let sink = Script::new("a-shut3");
    sink.set(1, Act::Fail);
    let o = build(&sink, Config::default());
    stage_all(&o, 1, [1, 2]);
    sink.until_attempts(1, 1).await;
    let shutdown = o.shutdown(10 * SEC);
    assert!(o.abandon().is_empty());
    let r = shutdown.await;
    assert_eq!(r.lost, 2);
    assert_eq!(r.unwritten, [(1, vec![1, 2])]);
    let c = o.counters();
    assert_eq!(c.lost_total(), 2, "{c:?}");
    assert_balanced(&o);
}

/// The breaker (S-R1, S-R2, I10, I11): after `failures` failed attempts in
/// a row, only probes start, spaced by the doubling probe interval; once
/// the sink answers, it closes and every tenant drains.
#[tokio::test(start_paused = true)]
async fn abuse_breaker_holds_back_a_failing_sink_then_closes() {
    let sink = Script::new("a-breaker");
    let config = Config::builder()
        .initial_backoff(10 * MS)
        .max_backoff(10 * MS)
        .breaker(
            outbox::BreakerConfig::new()
                .failures(3)
                .probe_interval(SEC)
                .max_probe_interval(4 * SEC),
        )
        .build()
        .unwrap();
    let o = build(&sink, config);
    for t in 1..=5 {
        sink.set(t, Act::Fail);
        stage_all(&o, t, [t as u32]);
    }
    // Three failures open it.
    sink.until(|s| s.attempts.len() >= 3).await;
    let opened = Instant::now();
    tokio::time::sleep(20 * SEC).await;
    let during: Vec<_> = sink
        .attempts()
        .into_iter()
        .filter(|a| a.at > opened)
        .collect();
    // Probes at about 1, 2, 4, 4, 4, 4 s apart: 5 or 6 in 20 s, never
    // closer than one probe interval.
    assert!((4..=7).contains(&during.len()), "{} attempts", during.len());
    for w in during.windows(2) {
        assert!(w[1].at - w[0].at >= SEC, "{:?}", w[1].at - w[0].at);
    }
    assert!(!matches!(o.health().breaker, outbox::BreakerState::Closed));
    for t in 1..=5 {
        sink.set(t, Act::Ok);
    }
    let r = o.settle(10 * SEC).await;
    assert_eq!(r.pending, 0);
    assert_eq!(o.health().breaker, outbox::BreakerState::Closed);
    for t in 1..=5u64 {
        assert_eq!(sink.stored(t), [t as u32]);
    }
}

/// The largest counts every knob takes, and the smallest durations: no
/// overflow, no huge allocation, the outbox writes as usual.
#[tokio::test(start_paused = true)]
async fn abuse_extreme_counts_and_tiny_durations() {
    let sink = Script::new("a-max");
    let config = Config::builder()
        .concurrency(usize::MAX)
        .capacity(usize::MAX)
        .tenant_capacity(usize::MAX)
        .max_batch(usize::MAX)
        .max_slices_per_write(usize::MAX)
        .max_group_items(usize::MAX)
        .max_attempts(u32::MAX)
        .initial_backoff(Duration::from_nanos(1))
        .max_backoff(Duration::from_nanos(1))
        .jitter(1.0)
        .linger(Duration::from_nanos(1))
        .write_timeout(Duration::from_nanos(1_000_000))
        .seed(u64::MAX)
        .build()
        .unwrap();
    let o = build(&sink, config);
    for t in 0..10u64 {
        sink.set(t, if t % 2 == 0 { Act::PanicOnce } else { Act::Ok });
        stage_all(&o, t, 0..10);
    }
    let r = o.settle(60 * SEC).await;
    assert_eq!(r.pending, 0);
    for t in 0..10 {
        assert_eq!(sink.stored(t), (0..10).collect::<Vec<_>>());
    }
    assert_eq!(o.counters().failed(Failure::Panic), 5);
    assert_balanced(&o);
}

/// An error whose `Display` or `Drop` panics.
#[derive(Debug)]
struct Nasty {
    display_panics: bool,
}

impl std::fmt::Display for Nasty {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        assert!(!self.display_panics, "the error panics as it is rendered");
        f.write_str("nasty")
    }
}

impl std::error::Error for Nasty {}

impl Drop for Nasty {
    fn drop(&mut self) {
        if !self.display_panics && !std::thread::panicking() {
            panic!("the error panics as it is dropped");
        }
    }
}

/// Rejects every write terminally with a [`Nasty`] error; counts calls.
#[derive(Clone)]
struct RejectsNastily {
    display_panics: bool,
    calls: Arc<Mutex<u32>>,
}

impl Sink for RejectsNastily {
    type Tenant = u64;
    type Item = u32;
    fn name(&self) -> &str {
        "rejects-nastily"
    }
    async fn write(&self, _: &u64, _: &[u32]) -> Result<Written, WriteError> {
        *self.calls.lock().unwrap() += 1;
        Err(WriteError::terminal(Nasty {
            display_panics: self.display_panics,
        }))
    }
}

/// S-A5: a terminal rejection is never retried, even when its error panics
/// as it is rendered for the log or dropped (newcomer finding: it was
/// taken for a panicked attempt and retried for ever).
#[tokio::test(start_paused = true)]
async fn abuse_a_terminal_error_that_panics_when_rendered_or_dropped_stays_terminal() {
    for display_panics in [true, false] {
        let sink = RejectsNastily {
            display_panics,
            calls: Arc::default(),
        };
        let o = Outbox::new(sink.clone(), Config::default()).unwrap();
        assert_eq!(o.stage(1, 1), Staged::Accepted);
        let r = o.flush(60 * SEC).await;
        let c = o.counters();
        assert_eq!(
            (
                r.lost,
                c.lost(LostReason::Terminal),
                *sink.calls.lock().unwrap()
            ),
            (1, 1, 1),
            "display_panics {display_panics}: {c:?}"
        );
        assert_eq!(c.failed(Failure::Panic), 0, "{c:?}");
        assert!(c.balanced(), "{c:?}");
        o.shutdown(SEC).await;
    }
}

/// A dead-letter channel larger than tokio's channel can hold is taken as
/// the largest one (its doc), not a panic in library code.
#[test]
fn abuse_dead_letter_channel_of_the_largest_capacity() {
    let (_letters, rx) = outbox::DeadLetters::<u64, u32>::channel(usize::MAX);
    assert_eq!(rx.max_capacity(), tokio::sync::Semaphore::MAX_PERMITS);
    let (_letters, rx) = outbox::DeadLetters::<u64, u32>::channel(0);
    assert_eq!(rx.max_capacity(), 1);
}
