//! The operations every harness speaks: the model test, the fuzz target and
//! the simulation's fast world feed the same `Op`s, so a failure found by
//! one replays in the others (DESIGN "The same operation type").

use std::time::Duration;

use arbitrary::Arbitrary;

use crate::core::{BreakerConfig, Config, ErrorPolicy, Failure, Outcome};

/// How a harness finishes a write it picked.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpOutcome {
    /// Committed in full.
    Written,
    /// Committed, `n` (clamped to the slice) consumed without writing (S-W12).
    Discard(u8),
    /// A retryable sink error.
    Failed,
    /// A panic in the sink.
    Panicked,
    /// The write timeout (S-B3).
    TimedOut,
    /// A terminal rejection (S-A5).
    Rejected,
    /// Cancelled by the driver.
    Cancelled,
}

impl From<OpOutcome> for Outcome {
    /// The engine's outcome of a write finished so.
    fn from(outcome: OpOutcome) -> Outcome {
        match outcome {
            OpOutcome::Written => Outcome::WRITTEN,
            OpOutcome::Discard(n) => Outcome::Written {
                discarded: usize::from(n),
            },
            OpOutcome::Failed => Outcome::Failed(Failure::Error),
            OpOutcome::Panicked => Outcome::Failed(Failure::Panic),
            OpOutcome::TimedOut => Outcome::Failed(Failure::Timeout),
            OpOutcome::Rejected => Outcome::Failed(Failure::Rejected),
            OpOutcome::Cancelled => Outcome::Failed(Failure::Cancelled),
        }
    }
}

/// One input to the engine, in a form a fuzzer or a seeded RNG can draw.
/// Tenants are small indexes (taken modulo the harness's tenant count) and
/// items are numbered by the harness, so every sequence is valid.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// Stage `count % 8 + 1` items to `tenant`.
    Stage {
        /// Tenant index.
        tenant: u8,
        /// Items to stage, minus one, modulo 8.
        count: u8,
    },
    /// Start every write the engine hands out.
    Poll,
    /// Finish the write in flight at index `pick % in_flight`.
    Finish {
        /// Which write.
        pick: u8,
        /// With what.
        outcome: OpOutcome,
    },
    /// The task of the picked write is lost (S-W13).
    FinishLost {
        /// Which write.
        pick: u8,
    },
    /// Let `ms` milliseconds pass.
    Advance {
        /// Milliseconds.
        ms: u16,
    },
    /// Jump to the engine's next timeout, if any.
    AdvanceToTimeout,
    /// Flush, the deadline `timeout_ms` from now (S-A4).
    Flush {
        /// Milliseconds from now to the deadline.
        timeout_ms: u16,
    },
    /// Settle, the deadline `timeout_ms` from now (S-W10).
    Settle {
        /// Milliseconds from now to the deadline.
        timeout_ms: u16,
    },
    /// Shut down, the deadline `timeout_ms` from now (S-W9).
    Shutdown {
        /// Milliseconds from now to the deadline.
        timeout_ms: u16,
    },
    /// Give up everything (S-A7).
    Abandon,
}

/// Every config knob in its valid range, drawn by a fuzzer or an RNG.
/// The default (all zeros) is the default config, concurrency 1, initial
/// backoff 1 ms.
#[derive(Arbitrary, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ConfigDraw {
    /// Concurrency, modulo 5 (0 is normalised to 1).
    pub concurrency: u8,
    /// Capacity in items (0: unbounded).
    pub capacity: u8,
    /// Per-tenant capacity (0: none).
    pub tenant_capacity: u8,
    /// Max batch in items (0: whole backlog).
    pub max_batch: u8,
    /// Max batch in bytes, each item weighing `item % 7 + 1` (0: none).
    pub max_batch_bytes: u8,
    /// Capacity in bytes (0: none).
    pub capacity_bytes: u8,
    /// Linger in ms, modulo 100.
    pub linger_ms: u8,
    /// Initial backoff in ms, 1 + this modulo 100.
    pub initial_backoff_ms: u8,
    /// Extra max backoff over initial, in ms × 10.
    pub max_backoff_extra: u8,
    /// Jitter in percent, modulo 101.
    pub jitter_pct: u8,
    /// Max attempts (0: unlimited).
    pub max_attempts: u8,
    /// Max retry duration in ms × 10 (0: unlimited).
    pub max_retry_10ms: u8,
    /// Drop policy instead of retry.
    pub drop_policy: bool,
    /// Write timeout in ms × 10 (0: none).
    pub write_timeout_10ms: u8,
    /// Jitter seed.
    pub seed: u64,
    /// Fan-in (S-F1): slices per write, modulo 5 (0 is normalised to 1).
    /// Not drawn by `arbitrary` (so older fuzz inputs decode as before);
    /// the fuzz target reads it after a format byte.
    #[arbitrary(default)]
    pub max_slices: u8,
    /// Fan-in (S-F2): items per group at most (0: no cap). Not drawn by
    /// `arbitrary`, like `max_slices`.
    #[arbitrary(default)]
    pub max_group_items: u8,
    /// The breaker (S-R1): failed attempts in a row that open it, 1 + this
    /// modulo 4 (0: no breaker). Not drawn by `arbitrary`, like
    /// `max_slices`.
    #[arbitrary(default)]
    pub breaker_failures: u8,
    /// The breaker's first probe interval (S-R2) in ms, 1 + this modulo 200.
    #[arbitrary(default)]
    pub probe_interval_ms: u8,
    /// The probe interval's cap over the first, in ms × 10.
    #[arbitrary(default)]
    pub max_probe_extra_10ms: u8,
    /// `max_item_age` (S-R3) over the linger, in ms × 5 (0: no age limit).
    #[arbitrary(default)]
    pub max_item_age_5ms: u8,
    /// Run-time dead letters (S-R4).
    #[arbitrary(default)]
    pub dead_letters: bool,
}

impl ConfigDraw {
    /// The config this draw stands for; always valid.
    pub fn config(&self) -> Config {
        let nz = |v: u8| (v != 0).then_some(v);
        let initial = Duration::from_millis(1 + u64::from(self.initial_backoff_ms % 100));
        let mut b = Config::builder()
            .concurrency(usize::from(self.concurrency % 5))
            .linger(Duration::from_millis(u64::from(self.linger_ms % 100)))
            .initial_backoff(initial)
            .max_backoff(initial + Duration::from_millis(10 * u64::from(self.max_backoff_extra)))
            .jitter(f64::from(self.jitter_pct % 101) / 100.0)
            .seed(self.seed)
            .error_policy(if self.drop_policy {
                ErrorPolicy::Drop
            } else {
                ErrorPolicy::Retry
            });
        if let Some(v) = nz(self.capacity) {
            b = b.capacity(usize::from(v));
        }
        if let Some(v) = nz(self.tenant_capacity) {
            b = b.tenant_capacity(usize::from(v));
        }
        if let Some(v) = nz(self.max_batch) {
            b = b.max_batch(usize::from(v % 16).max(1));
        }
        if let Some(v) = nz(self.max_batch_bytes) {
            b = b.max_batch_bytes(u64::from(v % 32).max(1));
        }
        if let Some(v) = nz(self.capacity_bytes) {
            b = b.capacity_bytes(u64::from(v) * 4);
        }
        if let Some(v) = nz(self.max_attempts) {
            b = b.max_attempts(u32::from(v % 6).max(1));
        }
        if let Some(v) = nz(self.max_retry_10ms) {
            b = b.max_retry_duration(Duration::from_millis(10 * u64::from(v)));
        }
        if let Some(v) = nz(self.write_timeout_10ms) {
            b = b.write_timeout(Duration::from_millis(10 * u64::from(v)));
        }
        b = b.max_slices_per_write(usize::from(self.max_slices % 5));
        if let Some(v) = nz(self.max_group_items) {
            b = b.max_group_items(usize::from(v));
        }
        if self.breaker_failures != 0 {
            let first = Duration::from_millis(1 + u64::from(self.probe_interval_ms % 200));
            b = b.breaker(
                BreakerConfig::new()
                    .failures(1 + u32::from(self.breaker_failures % 4))
                    .probe_interval(first)
                    .max_probe_interval(
                        first + Duration::from_millis(10 * u64::from(self.max_probe_extra_10ms)),
                    ),
            );
        }
        if let Some(v) = nz(self.max_item_age_5ms) {
            // Never below the linger (ConfigError::LingerAboveItemAge).
            let linger = Duration::from_millis(u64::from(self.linger_ms % 100));
            b = b.max_item_age(linger + Duration::from_millis(5 * u64::from(v)));
        }
        b.dead_letters(self.dead_letters)
            .build()
            .expect("every draw is in range")
    }

    /// Whether items are weighed (a byte limit is set).
    pub fn weighs(&self) -> bool {
        self.max_batch_bytes != 0 || self.capacity_bytes != 0
    }
}

/// The weight the harness gives item `id`, in bytes (1..=7).
pub fn weight_of(id: u64) -> u64 {
    id % 7 + 1
}
