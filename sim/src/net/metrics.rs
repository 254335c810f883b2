//! A small metrics recorder for the application host (I3: the exported
//! metrics equal the driver's counters): every series the outbox registers
//! is kept by (name, `reason` label), counters and the gauge as atomics,
//! the latency histogram as a sample count.
//!
//! It is installed only while the outbox is built (`with_local_recorder`),
//! which is when the driver registers its handles (`telemetry`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use metrics::{
    Counter, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};
use outbox::core::{Counters, DropReason, LostReason};
use outbox::telemetry::names;

/// Counts histogram samples.
#[derive(Debug, Default)]
struct Samples(AtomicU64);

impl HistogramFn for Samples {
    fn record(&self, _value: f64) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// One registered series.
#[derive(Clone, Debug)]
enum Series {
    Counter(Arc<AtomicU64>),
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
        .find(|l| l.key() == names::LABEL_REASON)
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
            Series::Counter(c) => Some(c.load(Ordering::Relaxed)),
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

    /// Compares every exported series with `c` (I3, S-W11); the first
    /// mismatch, described.
    pub fn mismatch(&self, c: &Counters) -> Option<String> {
        let mut expect: Vec<(&str, Option<&str>, u64)> = vec![
            (names::ITEMS_WRITTEN, None, c.written),
            (names::WRITES, None, c.writes),
            (names::WRITE_FAILURES, None, c.failed_attempts),
        ];
        for r in LostReason::ALL {
            expect.push((names::EVENTS_LOST, Some(r.as_str()), c.lost_for(r)));
        }
        for r in DropReason::ALL {
            expect.push((names::ITEMS_DROPPED, Some(r.as_str()), c.dropped_for(r)));
        }
        for (name, reason, want) in expect {
            let got = self.counter(name, reason);
            if got != Some(want) {
                return Some(format!(
                    "metric {name}{{reason={}}} is {got:?}, the counters say {want}",
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
