//! Test support: a scriptable sink, a metrics recorder, helpers.
#![allow(dead_code)] // each test binary uses a different part

#[cfg(feature = "journal")]
pub mod codec;
#[cfg(feature = "journal")]
pub mod gated;
#[cfg(feature = "journal")]
pub mod hand;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, Once, Weak};
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use outbox::core::Failure;
use outbox::{Counters, DropReason, LostReason, Sink, TenantId, TenantKey, WriteError, Written};
use tokio::sync::watch;
use tokio::time::Instant;

pub const MS: Duration = Duration::from_millis(1);

pub fn t(n: u128) -> TenantId {
    TenantId::from_u128(n)
}

/// What the sink does on one attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Act {
    /// Commit at once.
    Ok,
    /// A retryable error at once.
    Fail,
    /// A terminal error at once.
    Terminal,
    /// Wait until `release()`, then commit.
    Hang,
    /// Panic when polled.
    Panic,
    /// Panic while creating the future.
    PanicCreate,
    /// A retryable error whose `Display` panics.
    PanicDisplay,
    /// Sleep this long, then commit.
    Slow(Duration),
    /// Commit, then never answer (a lost reply).
    CommitThenHang,
    /// Commit all but the last `n` items, reporting them discarded.
    Discard(usize),
}

/// One attempt the sink saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attempt<K = TenantId> {
    pub tenant: K,
    pub items: Vec<u32>,
    /// Virtual time since the sink was made.
    pub at: Duration,
    pub act: Act,
}

struct Script<K> {
    queued: BTreeMap<K, VecDeque<Act>>,
    default: BTreeMap<K, Act>,
    fallback: Option<Act>,
    attempts: Vec<Attempt<K>>,
    /// Committed slices (the idempotency key is the slice).
    committed: BTreeSet<(K, Vec<u32>)>,
    store: BTreeMap<K, Vec<u32>>,
}

impl<K> Default for Script<K> {
    fn default() -> Self {
        Script {
            queued: BTreeMap::new(),
            default: BTreeMap::new(),
            fallback: None,
            attempts: Vec::new(),
            committed: BTreeSet::new(),
            store: BTreeMap::new(),
        }
    }
}

struct Inner<K> {
    name: String,
    origin: Instant,
    script: Mutex<Script<K>>,
    /// Bumped on every attempt and commit.
    changed: watch::Sender<u64>,
    /// Bumped by `release`.
    released: watch::Sender<u64>,
}

/// A scriptable sink keyed by `K`; clones share state.
pub struct KeyedSink<K>(Arc<Inner<K>>);

impl<K> Clone for KeyedSink<K> {
    fn clone(&self) -> Self {
        KeyedSink(Arc::clone(&self.0))
    }
}

/// The scriptable sink keyed by [`TenantId`], as most tests use it.
pub type TestSink = KeyedSink<TenantId>;

#[derive(Debug)]
struct BadDisplay;
impl fmt::Display for BadDisplay {
    fn fmt(&self, _: &mut fmt::Formatter<'_>) -> fmt::Result {
        panic!("test sink: Display panics");
    }
}
impl std::error::Error for BadDisplay {}

/// Hides the panics the test sink raises on purpose; others print as usual.
pub fn quiet_sink_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let p = info.payload();
            let msg = p
                .downcast_ref::<&str>()
                .copied()
                .or_else(|| p.downcast_ref::<String>().map(String::as_str));
            if !msg.is_some_and(|m| m.starts_with("test sink:")) {
                default(info);
            }
        }));
    });
}

impl<K: TenantKey> KeyedSink<K> {
    pub fn new(name: &str) -> Self {
        quiet_sink_panics();
        KeyedSink(Arc::new(Inner {
            name: name.to_owned(),
            origin: Instant::now(),
            script: Mutex::new(Script::default()),
            changed: watch::Sender::new(0),
            released: watch::Sender::new(0),
        }))
    }

    /// A weak reference: dead once every clone (the outbox's too) is gone.
    pub fn weak(&self) -> Weak<impl Sized> {
        Arc::downgrade(&self.0)
    }

    /// What `tenant` does from now on, once its queued acts are used up.
    pub fn set(&self, tenant: K, act: Act) {
        self.0.script.lock().unwrap().default.insert(tenant, act);
    }

    /// What every tenant without its own setting does.
    pub fn set_all(&self, act: Act) {
        self.0.script.lock().unwrap().fallback = Some(act);
    }

    /// `tenant`'s next attempts do these, in order.
    pub fn script(&self, tenant: K, acts: impl IntoIterator<Item = Act>) {
        self.0
            .script
            .lock()
            .unwrap()
            .queued
            .entry(tenant)
            .or_default()
            .extend(acts);
    }

    /// Lets every `Hang` in progress commit.
    pub fn release(&self) {
        let _script = self.0.script.lock().unwrap();
        self.0.released.send_modify(|g| *g += 1);
    }

    pub fn attempts(&self) -> Vec<Attempt<K>> {
        self.0.script.lock().unwrap().attempts.clone()
    }

    pub fn attempts_of(&self, tenant: K) -> Vec<Attempt<K>> {
        self.attempts()
            .into_iter()
            .filter(|a| a.tenant == tenant)
            .collect()
    }

    /// Each tenant's committed items, each committed slice once.
    pub fn store(&self) -> BTreeMap<K, Vec<u32>> {
        self.0.script.lock().unwrap().store.clone()
    }

    pub fn stored(&self, tenant: K) -> Vec<u32> {
        self.store().remove(&tenant).unwrap_or_default()
    }

    /// Waits (on sink activity, not on time) until `cond` holds.
    /// Fails (rather than hangs) if nothing satisfies it within an hour
    /// of virtual time.
    pub async fn until(&self, mut cond: impl FnMut(&Self) -> bool) {
        let mut rx = self.0.changed.subscribe();
        let wait = async {
            while !cond(self) {
                rx.changed().await.expect("sender lives in self");
            }
        };
        tokio::time::timeout(Duration::from_secs(3600), wait)
            .await
            .expect("the sink never reached the awaited state");
    }

    /// Waits until `tenant` has seen `n` attempts.
    pub async fn until_attempts(&self, tenant: K, n: usize) {
        self.until(|s| s.attempts_of(tenant.clone()).len() >= n)
            .await;
    }

    fn commit(&self, tenant: K, items: Vec<u32>) {
        let mut s = self.0.script.lock().unwrap();
        if s.committed.insert((tenant.clone(), items.clone())) {
            s.store.entry(tenant).or_default().extend(items);
        }
        drop(s);
        self.0.changed.send_modify(|g| *g += 1);
    }
}

impl<K: TenantKey> Sink for KeyedSink<K> {
    type Tenant = K;
    type Item = u32;

    fn name(&self) -> &str {
        &self.0.name
    }

    fn write(
        &self,
        tenant: &K,
        items: &[u32],
    ) -> impl Future<Output = Result<Written, WriteError>> + Send {
        // The release generation and the act in one hold of the script's
        // lock, which `release` takes too: a `release` that comes between
        // a `set_all` and this write's reading of a `Hang` still releases
        // it, and one before a later `Hang` does not.
        let mut released = self.0.released.subscribe();
        let (act, gen) = {
            let mut s = self.0.script.lock().unwrap();
            let gen = *released.borrow_and_update();
            let act = s
                .queued
                .get_mut(tenant)
                .and_then(VecDeque::pop_front)
                .or_else(|| s.default.get(tenant).copied())
                .or(s.fallback)
                .unwrap_or(Act::Ok);
            s.attempts.push(Attempt {
                tenant: tenant.clone(),
                items: items.to_vec(),
                at: Instant::now() - self.0.origin,
                act,
            });
            (act, gen)
        };
        self.0.changed.send_modify(|g| *g += 1);
        if act == Act::PanicCreate {
            panic!("test sink: panic creating the write");
        }
        let items = items.to_vec();
        let tenant = tenant.clone();
        let this = self.clone();
        async move {
            match act {
                Act::Ok => {}
                Act::Fail => return Err(WriteError::retryable("test sink: failing")),
                Act::Terminal => return Err(WriteError::terminal("test sink: bad data")),
                Act::Hang => {
                    let _ = released.wait_for(|g| *g > gen).await;
                }
                Act::Panic => panic!("test sink: panic in the write"),
                Act::PanicCreate => unreachable!(),
                Act::PanicDisplay => return Err(WriteError::retryable(BadDisplay)),
                Act::Slow(d) => tokio::time::sleep(d).await,
                Act::CommitThenHang => {
                    this.commit(tenant, items);
                    std::future::pending::<()>().await;
                    unreachable!()
                }
                Act::Discard(n) => {
                    let keep = items.len().saturating_sub(n);
                    this.commit(tenant, items[..keep].to_vec());
                    return Ok(Written::discarding(n));
                }
            }
            this.commit(tenant, items);
            Ok(Written::ALL)
        }
    }
}

/// Items and ids.
pub fn ids(r: std::ops::Range<u32>) -> Vec<u32> {
    r.collect()
}

// ----- metrics ------------------------------------------------------------

/// A metrics snapshot: (name, outbox label, reason or kind label) -> value.
pub type Metrics = BTreeMap<(String, String, Option<String>), DebugValue>;

pub fn snapshot(s: &Snapshotter) -> Metrics {
    s.snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let key = key.key();
            let label = |name: &str| {
                key.labels()
                    .find(|l| l.key() == name)
                    .map(|l| l.value().to_owned())
            };
            (
                (
                    key.name().to_owned(),
                    label("outbox").expect("every series has the outbox label"),
                    label("reason")
                        .or_else(|| label("kind"))
                        .or_else(|| label("outcome")),
                ),
                value,
            )
        })
        .collect()
}

/// Runs `f` on a paused current-thread runtime with a local metrics
/// recorder; returns its output and the recorder's snapshotter.
pub fn with_metrics<F: Future>(f: impl FnOnce() -> F) -> (F::Output, Snapshotter) {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    let out = metrics::with_local_recorder(&recorder, || rt.block_on(f()));
    (out, snapshotter)
}

fn counter(m: &Metrics, name: &str, outbox: &str, reason: Option<&str>) -> u64 {
    match m.get(&(
        name.to_owned(),
        outbox.to_owned(),
        reason.map(str::to_owned),
    )) {
        Some(DebugValue::Counter(v)) => *v,
        other => panic!("{name}{{outbox={outbox}, reason={reason:?}}}: {other:?}"),
    }
}

pub fn gauge(m: &Metrics, name: &str, outbox: &str) -> f64 {
    match m.get(&(name.to_owned(), outbox.to_owned(), None)) {
        Some(DebugValue::Gauge(v)) => v.into_inner(),
        other => panic!("{name}{{outbox={outbox}}}: {other:?}"),
    }
}

/// I3 / S-W11: every metric of `outbox` equals the engine's counters.
pub fn assert_metrics_match(m: &Metrics, outbox: &str, c: &Counters) {
    assert_eq!(
        counter(m, "outbox_items_written_total", outbox, None),
        c.written
    );
    assert_eq!(counter(m, "outbox_writes_total", outbox, None), c.writes);
    assert_eq!(
        counter(m, "outbox_attempts_total", outbox, None),
        c.attempts
    );
    for k in Failure::ALL {
        assert_eq!(
            counter(m, "outbox_write_failures_total", outbox, Some(k.as_str())),
            c.failed(k),
            "failed {}",
            k.as_str()
        );
    }
    for r in LostReason::ALL {
        assert_eq!(
            counter(m, "outbox_events_lost_total", outbox, Some(r.as_str())),
            c.lost(r),
            "lost {r}"
        );
    }
    for r in DropReason::ALL {
        assert_eq!(
            counter(m, "outbox_items_dropped_total", outbox, Some(r.as_str())),
            c.dropped(r),
            "dropped {r}"
        );
    }
    assert_eq!(gauge(m, "outbox_pending", outbox), c.pending as f64);
    assert_eq!(
        counter(m, "outbox_items_recovered_total", outbox, None),
        c.recovered
    );
    assert_eq!(
        counter(m, "outbox_items_handed_over_total", outbox, None),
        c.handed_over
    );
    assert!(c.balanced(), "S-W14: {c:?}");
}

/// The number of latency samples recorded for `outbox`.
pub fn latency_samples(m: &Metrics, outbox: &str) -> usize {
    match m.get(&(
        "outbox_write_latency_seconds".to_owned(),
        outbox.to_owned(),
        None,
    )) {
        Some(DebugValue::Histogram(v)) => v.len(),
        None => 0,
        other => panic!("histogram: {other:?}"),
    }
}

/// The samples of `outbox_item_age_seconds{outbox, outcome}` (S-R7), in
/// seconds, in the order recorded; empty when the series has none.
pub fn item_ages(m: &Metrics, outbox: &str, outcome: &str) -> Vec<f64> {
    match m.get(&(
        "outbox_item_age_seconds".to_owned(),
        outbox.to_owned(),
        Some(outcome.to_owned()),
    )) {
        Some(DebugValue::Histogram(v)) => v.iter().map(|x| x.into_inner()).collect(),
        None => Vec::new(),
        other => panic!("histogram: {other:?}"),
    }
}

/// Spends the calling task's cooperative budget without yielding: receives
/// from a channel until tokio refuses (S-W19's fallback: an intake polled
/// then receives nothing in chunks). Asserts that the budget is spent.
#[allow(dead_code)] // not every test binary spends a budget
pub async fn spend_coop_budget() {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<u32>();
    for i in 0..1_000 {
        tx.send(i).unwrap();
    }
    std::future::poll_fn(|cx| {
        while rx.poll_recv(cx).is_ready() {}
        std::task::Poll::Ready(())
    })
    .await;
    assert!(!tokio::task::coop::has_budget_remaining());
}

/// The runtimes the driver tests run on: one set-up for every test
/// binary instead of a copy in each.
pub mod rt {
    use tokio::runtime::{Builder, Runtime};

    /// A current-thread runtime on tokio's paused clock: time moves only
    /// when every task waits, so timers decide, never thread timing.
    pub fn paused() -> Runtime {
        Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap()
    }

    /// A current-thread runtime on the real clock (tests that touch a
    /// disk, a child process or a service).
    pub fn current() -> Runtime {
        Builder::new_current_thread().enable_all().build().unwrap()
    }

    /// A multi-thread runtime of `workers` workers: the tests that race
    /// OS threads against the writer.
    pub fn multi_thread(workers: usize) -> Runtime {
        Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_all()
            .build()
            .unwrap()
    }
}

/// A multi-thread runtime of 2 workers: the tests that race OS threads
/// against the writer.
pub fn multi_thread() -> tokio::runtime::Runtime {
    rt::multi_thread(2)
}

/// Abandoned or unwritten runs as `(tenant, items)` pairs, for comparing
/// contents where the `attempted` flag is not what a test checks.
pub fn parts<K, I>(runs: Vec<outbox::Unwritten<K, I>>) -> Vec<(K, Vec<I>)> {
    runs.into_iter()
        .map(outbox::Unwritten::into_parts)
        .collect()
}
