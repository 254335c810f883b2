//! Shared by the bench binaries: sample recording (so each bench can print
//! its own medians and ratios next to criterion's report), the summary
//! line, and the sinks the benches write to.

#![allow(dead_code)] // each bench binary uses a different part

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::Bencher;
use outbox::{Sink, TenantId, WriteError, Written};
use tokio::runtime::Runtime;

/// Per-iteration times of every sample criterion took, by bench id, so the
/// bench can compute medians and ratios against a baseline of the same run.
#[derive(Default)]
pub struct Samples {
    by_id: RefCell<BTreeMap<String, Vec<f64>>>,
}

impl Samples {
    /// Times `routine(iters)` (which returns the time its `iters` runs took)
    /// under criterion and records each sample's time per iteration.
    pub fn iter_custom(
        &self,
        b: &mut Bencher<'_>,
        id: &str,
        mut routine: impl FnMut(u64) -> Duration,
    ) {
        b.iter_custom(|iters| {
            let d = routine(iters);
            self.by_id
                .borrow_mut()
                .entry(id.to_owned())
                .or_default()
                .push(d.as_secs_f64() / iters as f64);
            d
        });
    }

    /// The median time per iteration of `id`'s last `n` samples (criterion's
    /// warm-up calls come first and are left out), in seconds.
    pub fn median(&self, id: &str, n: usize) -> Option<f64> {
        let by_id = self.by_id.borrow();
        let all = by_id.get(id)?;
        let mut last: Vec<f64> = all[all.len().saturating_sub(n)..].to_vec();
        last.sort_by(f64::total_cmp);
        (!last.is_empty()).then(|| last[last.len() / 2])
    }
}

/// The runtime the benches drive an outbox on: one worker thread.
pub fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

/// Prints the one-line summary of a bench (`bench NAME ratio=… target=…`).
pub fn summary(name: &str, ratio: f64, target: &str, met: Option<bool>, extra: &str) {
    let verdict = match met {
        Some(true) => " met",
        Some(false) => " NOT MET",
        None => "",
    };
    println!("bench {name} ratio={ratio:.2} target={target}{verdict} {extra}");
}

/// Human units for a time in seconds.
pub fn fmt_secs(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.3}s")
    } else if s >= 1e-3 {
        format!("{:.2}ms", s * 1e3)
    } else if s >= 1e-6 {
        format!("{:.2}us", s * 1e6)
    } else {
        format!("{:.1}ns", s * 1e9)
    }
}

/// The tenant of index `i`.
pub fn tenant(i: u64) -> TenantId {
    TenantId::from_u128(0x0190_0000_0000_7000_8000_0000_0000_0000 | u128::from(i))
}

/// A sink that only counts the items it is given.
#[derive(Clone, Default)]
pub struct Counting {
    pub written: Arc<AtomicU64>,
}

impl Sink for Counting {
    type Tenant = TenantId;
    type Item = u64;
    fn name(&self) -> &str {
        "bench"
    }
    async fn write(&self, _: &TenantId, items: &[u64]) -> Result<Written, WriteError> {
        self.written
            .fetch_add(items.len() as u64, Ordering::Relaxed);
        Ok(Written::ALL)
    }
}

/// A sink that only counts and takes groups of slices in one call
/// (fan-in, S-F1).
#[derive(Clone, Default)]
pub struct GroupCounting {
    pub written: Arc<AtomicU64>,
}

impl Sink for GroupCounting {
    type Tenant = TenantId;
    type Item = u64;
    fn name(&self) -> &str {
        "bench-groups"
    }
    async fn write(&self, _: &TenantId, items: &[u64]) -> Result<Written, WriteError> {
        self.written
            .fetch_add(items.len() as u64, Ordering::Relaxed);
        Ok(Written::ALL)
    }
    fn takes_groups(&self) -> bool {
        true
    }
    async fn write_group(
        &self,
        slices: &[outbox::Slice<TenantId, u64>],
    ) -> Vec<Result<Written, WriteError>> {
        let n: usize = slices.iter().map(|s| s.items.len()).sum();
        self.written.fetch_add(n as u64, Ordering::Relaxed);
        slices.iter().map(|_| Ok(Written::ALL)).collect()
    }
}

/// A sink that counts and always fails the tenants `failing` says.
#[derive(Clone)]
pub struct Failing {
    pub written: Arc<AtomicU64>,
    pub attempts: Arc<AtomicU64>,
    pub failing: fn(TenantId) -> bool,
}

impl Sink for Failing {
    type Tenant = TenantId;
    type Item = u64;
    fn name(&self) -> &str {
        "bench-failing"
    }
    async fn write(&self, tenant: &TenantId, items: &[u64]) -> Result<Written, WriteError> {
        self.attempts.fetch_add(1, Ordering::Relaxed);
        if (self.failing)(*tenant) {
            return Err(WriteError::retryable("always failing"));
        }
        self.written
            .fetch_add(items.len() as u64, Ordering::Relaxed);
        Ok(Written::ALL)
    }
}

/// A sink that is down (every write fails, retryably) while `down` is set,
/// and counts attempts and written items, and when the first write
/// succeeded.
#[derive(Clone, Default)]
pub struct Outage {
    pub written: Arc<AtomicU64>,
    pub attempts: Arc<AtomicU64>,
    pub down: Arc<std::sync::atomic::AtomicBool>,
    pub first_written: Arc<std::sync::OnceLock<Instant>>,
}

impl Sink for Outage {
    type Tenant = TenantId;
    type Item = u64;
    fn name(&self) -> &str {
        "bench-outage"
    }
    async fn write(&self, _: &TenantId, items: &[u64]) -> Result<Written, WriteError> {
        self.attempts.fetch_add(1, Ordering::Relaxed);
        if self.down.load(Ordering::Relaxed) {
            return Err(WriteError::retryable("down"));
        }
        self.first_written.get_or_init(Instant::now);
        self.written
            .fetch_add(items.len() as u64, Ordering::Relaxed);
        Ok(Written::ALL)
    }
}

/// This process's CPU time (user + system, every thread).
pub fn process_cpu() -> Duration {
    // SAFETY: `getrusage` only writes the struct it is given.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    tv(usage.ru_utime) + tv(usage.ru_stime)
}
