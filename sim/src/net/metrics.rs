//! A small metrics recorder for the application host (I3: the exported
//! metrics equal the driver's counters): every series the outbox registers
//! is kept by (name, `reason` or `kind` label), counters and the gauge as atomics,
//! the latency histogram as a sample count. Each counter also keeps the
//! virtual time it first counted something: once every handle is dropped
//! (S-W16) the metrics are all that is left to read, and the moment the
//! writer gave up at its drop deadline tells the end checks which attempts
//! ended after it.
//!
//! It is installed only while the outbox is built (`with_local_recorder`),
//! which is when the driver registers its handles (`telemetry`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use metrics::{
    Counter, CounterFn, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use outbox::core::{Counters, DropReason, Failure, LostReason, Time};
use outbox::telemetry::names;

use super::book;

/// Counts histogram samples.
#[derive(Debug, Default)]
struct Samples(AtomicU64);

impl HistogramFn for Samples {
    fn record(&self, _value: f64) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// A counter that remembers when it first counted something.
#[derive(Debug, Default)]
struct Tracked {
    value: AtomicU64,
    first: Mutex<Option<Time>>,
}

impl Tracked {
    fn mark(&self) {
        let mut first = self.first.lock().unwrap_or_else(PoisonError::into_inner);
        first.get_or_insert_with(book::now);
    }
}

impl CounterFn for Tracked {
    fn increment(&self, value: u64) {
        if value > 0 {
            self.mark();
        }
        self.value.fetch_add(value, Ordering::Relaxed);
    }

    fn absolute(&self, value: u64) {
        if value > 0 {
            self.mark();
        }
        self.value.fetch_max(value, Ordering::Relaxed);
    }
}

/// One registered series.
#[derive(Clone, Debug)]
enum Series {
    Counter(Arc<Tracked>),
    Gauge(Arc<AtomicU64>),
    Histogram(Arc<Samples>),
}

type SeriesKey = (String, Option<String>);

/// The recorder; cheap to clone, every clone sees the same series.
#[derive(Clone, Debug, Default)]
pub struct SimRecorder {
    series: Arc<Mutex<BTreeMap<SeriesKey, Series>>>,
}

fn key_of(key: &Key) -> SeriesKey {
    let reason = key
        .labels()
        .find(|l| l.key() == names::LABEL_REASON || l.key() == names::LABEL_KIND)
        .map(|l| l.value().to_string());
    (key.name().to_string(), reason)
}

impl SimRecorder {
    fn entry(&self, key: &Key, make: impl FnOnce() -> Series) -> Series {
        let mut s = self.series.lock().unwrap_or_else(PoisonError::into_inner);
        s.entry(key_of(key)).or_insert_with(make).clone()
    }

    fn counter(&self, name: &str, reason: Option<&str>) -> Option<u64> {
        let s = self.series.lock().unwrap_or_else(PoisonError::into_inner);
        match s.get(&(name.to_string(), reason.map(str::to_string)))? {
            Series::Counter(c) => Some(c.value.load(Ordering::Relaxed)),
            _ => None,
        }
    }

    /// When the counter `name{reason}` first counted something, if it has.
    pub fn first_counted(&self, name: &str, reason: Option<&str>) -> Option<Time> {
        let s = self.series.lock().unwrap_or_else(PoisonError::into_inner);
        match s.get(&(name.to_string(), reason.map(str::to_string)))? {
            Series::Counter(c) => *c.first.lock().unwrap_or_else(PoisonError::into_inner),
            _ => None,
        }
    }

    fn gauge(&self, name: &str) -> Option<f64> {
        let s = self.series.lock().unwrap_or_else(PoisonError::into_inner);
        match s.get(&(name.to_string(), None))? {
            Series::Gauge(g) => Some(f64::from_bits(g.load(Ordering::Relaxed))),
            _ => None,
        }
    }

    /// The latency histogram's sample count.
    pub fn latency_samples(&self) -> u64 {
        let s = self.series.lock().unwrap_or_else(PoisonError::into_inner);
        match s.get(&(names::WRITE_LATENCY.to_string(), None)) {
            Some(Series::Histogram(h)) => h.0.load(Ordering::Relaxed),
            _ => 0,
        }
    }

    /// The pending gauge's value (I8: zero after shutdown).
    pub fn pending_gauge(&self) -> Option<f64> {
        self.gauge(names::PENDING)
    }

    /// The counters as the exported metrics tell them, for when the outbox
    /// itself is gone (S-W16): `staged` is given (the metrics do not export
    /// it), `pending` is the gauge (a gauge that is not a count of items is
    /// an error).
    pub fn counters(&self, staged: u64) -> Result<Counters, String> {
        let get = |name: &str, reason: Option<&str>| self.counter(name, reason).unwrap_or(0);
        let gauge = self.gauge(names::PENDING);
        let pending = gauge.map_or(u64::MAX, |g| g as u64);
        if gauge != Some(pending as f64) {
            return Err(format!(
                "gauge {} is {gauge:?}, not a count of items",
                names::PENDING
            ));
        }
        let mut c = Counters::default();
        c.staged = staged;
        c.pending = pending;
        c.written = get(names::ITEMS_WRITTEN, None);
        c.writes = get(names::WRITES, None);
        c.attempts = get(names::ATTEMPTS, None);
        for k in Failure::ALL {
            let n = get(names::WRITE_FAILURES, Some(k.as_str()));
            c.set_failed(k, n);
            c.failed_attempts += n;
        }
        for r in LostReason::ALL {
            c.set_lost(r, get(names::EVENTS_LOST, Some(r.as_str())));
        }
        for r in DropReason::ALL {
            c.set_dropped(r, get(names::ITEMS_DROPPED, Some(r.as_str())));
        }
        Ok(c)
    }

    /// Compares every exported series with `c` (I3, S-W11); the first
    /// mismatch, described.
    pub fn mismatch(&self, c: &Counters) -> Option<String> {
        let mut expect: Vec<(&str, Option<&str>, u64)> = vec![
            (names::ITEMS_WRITTEN, None, c.written),
            (names::WRITES, None, c.writes),
            (names::ATTEMPTS, None, c.attempts),
        ];
        for k in Failure::ALL {
            expect.push((names::WRITE_FAILURES, Some(k.as_str()), c.failed(k)));
        }
        for r in LostReason::ALL {
            expect.push((names::EVENTS_LOST, Some(r.as_str()), c.lost(r)));
        }
        for r in DropReason::ALL {
            expect.push((names::ITEMS_DROPPED, Some(r.as_str()), c.dropped(r)));
        }
        for (name, reason, want) in expect {
            let got = self.counter(name, reason);
            if got != Some(want) {
                return Some(format!(
                    "metric {name}{{reason/kind={}}} is {got:?}, the counters say {want}",
                    reason.unwrap_or("-")
                ));
            }
        }
        let gauge = self.gauge(names::PENDING);
        if gauge != Some(c.pending as f64) {
            return Some(format!(
                "gauge {} is {gauge:?}, pending() is {}",
                names::PENDING,
                c.pending
            ));
        }
        None
    }
}

impl Recorder for SimRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        match self.entry(key, || Series::Counter(Arc::default())) {
            Series::Counter(c) => Counter::from_arc(c),
            _ => Counter::noop(),
        }
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        match self.entry(key, || Series::Gauge(Arc::default())) {
            Series::Gauge(g) => Gauge::from_arc(g),
            _ => Gauge::noop(),
        }
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        match self.entry(key, || Series::Histogram(Arc::default())) {
            Series::Histogram(h) => Histogram::from_arc(h),
            _ => Histogram::noop(),
        }
    }
}
