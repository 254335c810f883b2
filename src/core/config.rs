//! Configuration, built and validated in one place.

use std::fmt;
use std::time::Duration;

use super::breaker::BreakerConfig;

/// What to do with a batch whose attempt failed (S-A5).
///
/// Non-exhaustive: new policies may come (a match needs a `_` arm).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorPolicy {
    /// Retry the identical slice after a backoff, forever unless
    /// `max_attempts` / `max_retry_duration` say otherwise (S-W5, S-W7, S-B2).
    #[default]
    Retry,
    /// Count the batch dropped under [`DropReason::SinkError`](crate::core::DropReason::SinkError)
    /// and move on; never retried.
    Drop,
}

/// A configuration value that makes no sense. Each variant names the field.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum ConfigError {
    /// The field was set to zero where zero means nothing useful
    /// (a zero `capacity` would drop every item, a zero `max_batch` would
    /// never write, a zero `initial_backoff` would retry in a hot loop).
    Zero {
        /// The field's name, as the builder spells it.
        field: &'static str,
    },
    /// `max_backoff` is below `initial_backoff`.
    BackoffInverted {
        /// The configured `initial_backoff`.
        initial: Duration,
        /// The configured `max_backoff`.
        max: Duration,
    },
    /// `jitter` is not a fraction in `0.0..=1.0`.
    JitterOutOfRange {
        /// The value given.
        jitter: f64,
    },
    /// The breaker's `max_probe_interval` is below its `probe_interval`
    /// (S-R2).
    ProbeIntervalInverted {
        /// The configured `probe_interval`.
        initial: Duration,
        /// The configured `max_probe_interval`.
        max: Duration,
    },
    /// `linger` is above `max_item_age` (S-A3, S-R3): every item of a
    /// partial batch would expire while it lingers.
    LingerAboveItemAge {
        /// The configured `linger`.
        linger: Duration,
        /// The configured `max_item_age`.
        max_item_age: Duration,
    },
    /// A byte limit (`max_batch_bytes` or `capacity_bytes`) is set but the
    /// engine was built without a weigher to measure items.
    WeigherRequired {
        /// The byte limit that needs the weigher.
        field: &'static str,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Zero { field } => write!(f, "outbox config: `{field}` must not be zero"),
            ConfigError::BackoffInverted { initial, max } => write!(
                f,
                "outbox config: `max_backoff` ({max:?}) is below `initial_backoff` ({initial:?})"
            ),
            ConfigError::ProbeIntervalInverted { initial, max } => write!(
                f,
                "outbox config: breaker `max_probe_interval` ({max:?}) is below `probe_interval` ({initial:?})"
            ),
            ConfigError::JitterOutOfRange { jitter } => write!(
                f,
                "outbox config: `jitter` must be a fraction in 0.0..=1.0, got {jitter}"
            ),
            ConfigError::LingerAboveItemAge {
                linger,
                max_item_age,
            } => write!(
                f,
                "outbox config: `linger` ({linger:?}) must not be above `max_item_age` ({max_item_age:?}), or every partial batch expires while it lingers"
            ),
            ConfigError::WeigherRequired { field } => write!(
                f,
                "outbox config: `{field}` is set, so the engine needs an item weigher"
            ),
        }
    }
}

impl std::error::Error for ConfigError {}

/// The engine's configuration. Build it with [`Config::builder`]; every
/// value in a `Config` has been validated, so the engine never has to.
///
/// Defaults: unbounded, each write takes the tenant's whole backlog, no
/// linger, backoff 50 ms doubling to 5 s, retry forever, no write timeout,
/// concurrency 8, no breaker, no item age limit.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub(crate) concurrency: usize,
    pub(crate) capacity: Option<usize>,
    pub(crate) capacity_bytes: Option<u64>,
    pub(crate) tenant_capacity: Option<usize>,
    pub(crate) max_batch: Option<usize>,
    pub(crate) max_batch_bytes: Option<u64>,
    pub(crate) linger: Duration,
    pub(crate) initial_backoff: Duration,
    pub(crate) max_backoff: Duration,
    /// Jitter as parts per million of the backoff (0..=1_000_000).
    pub(crate) jitter_ppm: u32,
    pub(crate) max_attempts: Option<u32>,
    pub(crate) max_retry_duration: Option<Duration>,
    pub(crate) error_policy: ErrorPolicy,
    pub(crate) write_timeout: Option<Duration>,
    pub(crate) breaker: Option<BreakerConfig>,
    pub(crate) max_item_age: Option<Duration>,
    pub(crate) dead_letters: bool,
    /// The engine takes items only through its durable input (an outbox
    /// with an outbox table, S-T32): every other stage is refused.
    pub(crate) table_only: bool,
    /// An outbox table holds every item until it is removed from it: a
    /// write refused under a stale epoch hands its tenant over (S-E7).
    /// Without, a stale epoch is a terminal failure of the write.
    pub(crate) outbox_table: bool,
    pub(crate) seed: u64,
    /// Slices of distinct tenants per write at most (S-F1); at least 1.
    pub(crate) max_slices_per_write: usize,
    /// Items per group at most (S-F2); `None`: no cap beyond the slices'.
    pub(crate) max_group_items: Option<usize>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            concurrency: 8,
            capacity: None,
            capacity_bytes: None,
            tenant_capacity: None,
            max_batch: None,
            max_batch_bytes: None,
            linger: Duration::ZERO,
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(5),
            jitter_ppm: 0,
            max_attempts: None,
            max_retry_duration: None,
            error_policy: ErrorPolicy::Retry,
            write_timeout: None,
            breaker: None,
            max_item_age: None,
            dead_letters: false,
            table_only: false,
            outbox_table: false,
            seed: 0,
            max_slices_per_write: 1,
            max_group_items: None,
        }
    }
}

impl Config {
    /// Checks what the config asks of the engine beside it: a byte limit
    /// (`max_batch_bytes`, `capacity_bytes`) needs a weigher (S-B5). The
    /// other rules are checked by [`ConfigBuilder::build`]; this one, by
    /// the engine's constructors, which know whether there is a weigher.
    pub(crate) fn check_weigher(&self, has_weigher: bool) -> Result<(), ConfigError> {
        if has_weigher {
            return Ok(());
        }
        let field = if self.max_batch_bytes.is_some() {
            "max_batch_bytes"
        } else if self.capacity_bytes.is_some() {
            "capacity_bytes"
        } else {
            return Ok(());
        };
        Err(ConfigError::WeigherRequired { field })
    }

    /// The same config with one slice per write (S-F1: for a sink that
    /// does not take groups).
    pub(crate) fn without_fan_in(self) -> Self {
        Config {
            max_slices_per_write: 1,
            ..self
        }
    }

    /// A builder starting from the defaults.
    pub fn builder() -> ConfigBuilder {
        ConfigBuilder {
            config: Config::default(),
            jitter: 0.0,
        }
    }

    /// Writes in flight at once, across all tenants (S-W3); at least 1.
    pub fn concurrency(&self) -> usize {
        self.concurrency
    }
    /// Items pending at most before new ones are dropped (S-A1); `None` is unbounded (S-W2).
    pub fn capacity(&self) -> Option<usize> {
        self.capacity
    }
    /// Bytes pending at most, as the weigher measures them (S-B5).
    pub fn capacity_bytes(&self) -> Option<u64> {
        self.capacity_bytes
    }
    /// Items pending at most per tenant (S-B7).
    pub fn tenant_capacity(&self) -> Option<usize> {
        self.tenant_capacity
    }
    /// Items per write at most (S-W4); `None` takes the whole backlog.
    pub fn max_batch(&self) -> Option<usize> {
        self.max_batch
    }
    /// Bytes per write at most (S-B5); a larger item is written alone.
    pub fn max_batch_bytes(&self) -> Option<u64> {
        self.max_batch_bytes
    }
    /// How long a partial batch waits for company (S-A3).
    pub fn linger(&self) -> Duration {
        self.linger
    }
    /// The wait before the first retry (S-W7).
    pub fn initial_backoff(&self) -> Duration {
        self.initial_backoff
    }
    /// The cap on the doubling backoff (S-W7).
    pub fn max_backoff(&self) -> Duration {
        self.max_backoff
    }
    /// Jitter as a fraction of the backoff that may be taken off it (S-B2).
    pub fn jitter(&self) -> f64 {
        f64::from(self.jitter_ppm) / 1_000_000.0
    }
    /// Attempts of one write at most before its slice is lost (S-B2).
    pub fn max_attempts(&self) -> Option<u32> {
        self.max_attempts
    }
    /// How long one write may keep failing, from its first attempt, before
    /// its slice is lost (S-B2).
    pub fn max_retry_duration(&self) -> Option<Duration> {
        self.max_retry_duration
    }
    /// What a failed attempt leads to (S-A5).
    pub fn error_policy(&self) -> ErrorPolicy {
        self.error_policy
    }
    /// How long one attempt may run before it is cancelled as failed (S-B3).
    pub fn write_timeout(&self) -> Option<Duration> {
        self.write_timeout
    }
    /// The sink-wide breaker's settings, if it is on (S-R1).
    pub fn breaker(&self) -> Option<BreakerConfig> {
        self.breaker
    }
    /// How long after staging an item may still be written (S-R3).
    pub fn max_item_age(&self) -> Option<Duration> {
        self.max_item_age
    }
    /// Whether items given up while running are handed out as
    /// [`Event::DeadLetter`](super::Event::DeadLetter)s (S-R4).
    pub fn dead_letters(&self) -> bool {
        self.dead_letters
    }
    /// The seed of the jitter generator (S-B2, S-B4).
    pub fn seed(&self) -> u64 {
        self.seed
    }
    /// Slices of distinct tenants one write may carry at most (S-F1);
    /// 1 (the default) writes one tenant's slice per call.
    pub fn max_slices_per_write(&self) -> usize {
        self.max_slices_per_write
    }
    /// Items a group of slices may carry at most (S-F2); a single slice
    /// larger than this still goes, alone. `None` (the default): no cap.
    pub fn max_group_items(&self) -> Option<usize> {
        self.max_group_items
    }
}

/// Builds a [`Config`]; [`ConfigBuilder::build`] validates it.
#[derive(Clone, Debug)]
pub struct ConfigBuilder {
    config: Config,
    jitter: f64,
}

impl ConfigBuilder {
    /// Writes in flight at once across all tenants (S-W3). `0` is
    /// normalised to `1`, as the contract says (S-W3). Default 8.
    pub fn concurrency(mut self, writes: usize) -> Self {
        self.config.concurrency = writes.max(1);
        self
    }
    /// Bounded mode: at most `items` pending; a further item is dropped under
    /// `buffer_full` (S-A1). Zero is rejected by `build`.
    pub fn capacity(mut self, items: usize) -> Self {
        self.config.capacity = Some(items);
        self
    }
    /// At most `bytes` pending, as the weigher measures items (S-B5); an item
    /// that would exceed it is dropped under `buffer_full`. Zero is rejected.
    pub fn capacity_bytes(mut self, bytes: u64) -> Self {
        self.config.capacity_bytes = Some(bytes);
        self
    }
    /// At most `items` pending per tenant; a further item of that tenant is
    /// dropped under `tenant_full` (S-B7). Zero is rejected.
    pub fn tenant_capacity(mut self, items: usize) -> Self {
        self.config.tenant_capacity = Some(items);
        self
    }
    /// At most `items` per write (S-W4). Zero is rejected.
    pub fn max_batch(mut self, items: usize) -> Self {
        self.config.max_batch = Some(items);
        self
    }
    /// At most `bytes` per write (S-B5); an item larger than this is written
    /// alone. Zero is rejected.
    pub fn max_batch_bytes(mut self, bytes: u64) -> Self {
        self.config.max_batch_bytes = Some(bytes);
        self
    }
    /// Linger (S-A3): a partial batch waits this long after its oldest item.
    /// Zero (the default) sends at once.
    pub fn linger(mut self, linger: Duration) -> Self {
        self.config.linger = linger;
        self
    }
    /// First retry wait (S-W7), default 50 ms. Zero is rejected.
    pub fn initial_backoff(mut self, backoff: Duration) -> Self {
        self.config.initial_backoff = backoff;
        self
    }
    /// Backoff cap (S-W7), default 5 s. Below `initial_backoff` is rejected.
    pub fn max_backoff(mut self, backoff: Duration) -> Self {
        self.config.max_backoff = backoff;
        self
    }
    /// Jitter (S-B2): each backoff is shortened by a uniformly drawn share of
    /// up to `fraction` of it, so a wait never exceeds `max_backoff`.
    /// `0.0..=1.0`; anything else (NaN included) is rejected. Default 0.
    pub fn jitter(mut self, fraction: f64) -> Self {
        self.jitter = fraction;
        self
    }
    /// Give a write up after this many failed attempts; its slice is lost
    /// under `retries_exhausted` (S-B2). Zero is rejected.
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.config.max_attempts = Some(attempts);
        self
    }
    /// Give a write up when an attempt fails this long after its first
    /// attempt started; its slice is lost under `retries_exhausted` (S-B2).
    /// Zero is rejected.
    pub fn max_retry_duration(mut self, duration: Duration) -> Self {
        self.config.max_retry_duration = Some(duration);
        self
    }
    /// What a failed attempt leads to (S-A5). Default [`ErrorPolicy::Retry`].
    pub fn error_policy(mut self, policy: ErrorPolicy) -> Self {
        self.config.error_policy = policy;
        self
    }
    /// Cancel an attempt that runs longer than this and treat it as failed
    /// (S-B3). Zero is rejected.
    pub fn write_timeout(mut self, timeout: Duration) -> Self {
        self.config.write_timeout = Some(timeout);
        self
    }
    /// Turns on the sink-wide breaker (S-R1, S-R2): after
    /// [`failures`](BreakerConfig::failures) failed attempts in a row across
    /// all tenants, no write starts but one probe per probe interval, until
    /// an attempt succeeds. Off by default. `build` rejects a zero
    /// `failures` or `probe_interval` and a `max_probe_interval` below
    /// `probe_interval`.
    pub fn breaker(mut self, breaker: BreakerConfig) -> Self {
        self.config.breaker = Some(breaker);
        self
    }
    /// An item staged longer ago than this is not written: when its write
    /// would start (first attempt or retry) it is counted lost under
    /// `expired` instead (S-R3). For data worthless late. Unlike
    /// `max_retry_duration`, which runs from a write's first attempt, this
    /// runs from the item's stage, so it also bounds time spent waiting,
    /// lingering and held by the breaker. Off by default; zero is rejected,
    /// and so is a value below `linger`
    /// ([`ConfigError::LingerAboveItemAge`]).
    pub fn max_item_age(mut self, age: Duration) -> Self {
        self.config.max_item_age = Some(age);
        self
    }
    /// Hand out items given up while running (terminal, retries exhausted,
    /// dropped on a sink error, expired) as
    /// [`Event::DeadLetter`](super::Event::DeadLetter)s instead of
    /// returning them to be dropped (S-R4). Off by default; the driver
    /// turns it on when given a dead-letter hand-off.
    pub fn dead_letters(mut self, on: bool) -> Self {
        self.config.dead_letters = on;
        self
    }
    /// Seed of the jitter generator (S-B2): the same seed draws the same
    /// jitter on every machine and release. Default 0.
    pub fn seed(mut self, seed: u64) -> Self {
        self.config.seed = seed;
        self
    }

    /// Fan-in (S-F1): one write may carry the slices of up to `slices`
    /// distinct ready tenants, each keeping its own identity, order,
    /// backoff and outcome; `concurrency` then bounds groups in flight.
    /// `0` is normalised to `1`. Default 1: one tenant's slice per write.
    /// The driver hands groups only to a sink that takes them
    /// ([`Sink::takes_groups`](crate::Sink::takes_groups), through
    /// [`Sink::write_group`](crate::Sink::write_group)); with any other
    /// sink it is taken as 1. Engine drivers ask with
    /// [`Engine::poll_group`](super::Engine::poll_group).
    pub fn max_slices_per_write(mut self, slices: usize) -> Self {
        self.config.max_slices_per_write = slices.max(1);
        self
    }
    /// Fan-in (S-F2): a group takes no further slice once it would carry
    /// more than `items` items (its first slice always goes, whatever its
    /// size). Zero is rejected. Default: no cap.
    pub fn max_group_items(mut self, items: usize) -> Self {
        self.config.max_group_items = Some(items);
        self
    }

    /// Validates and returns the configuration.
    ///
    /// # Errors
    /// [`ConfigError`] naming the first field that makes no sense.
    pub fn build(self) -> Result<Config, ConfigError> {
        let c = self.config;
        let zero = |field| Err(ConfigError::Zero { field });
        if c.capacity == Some(0) {
            return zero("capacity");
        }
        if c.capacity_bytes == Some(0) {
            return zero("capacity_bytes");
        }
        if c.tenant_capacity == Some(0) {
            return zero("tenant_capacity");
        }
        if c.max_batch == Some(0) {
            return zero("max_batch");
        }
        if c.max_batch_bytes == Some(0) {
            return zero("max_batch_bytes");
        }
        if c.max_group_items == Some(0) {
            return zero("max_group_items");
        }
        if c.initial_backoff.is_zero() {
            return zero("initial_backoff");
        }
        if c.max_attempts == Some(0) {
            return zero("max_attempts");
        }
        if c.max_retry_duration == Some(Duration::ZERO) {
            return zero("max_retry_duration");
        }
        if c.write_timeout == Some(Duration::ZERO) {
            return zero("write_timeout");
        }
        if c.max_item_age == Some(Duration::ZERO) {
            return zero("max_item_age");
        }
        if let Some(age) = c.max_item_age {
            if c.linger > age {
                return Err(ConfigError::LingerAboveItemAge {
                    linger: c.linger,
                    max_item_age: age,
                });
            }
        }
        if let Some(b) = c.breaker {
            if b.failures == 0 {
                return zero("breaker.failures");
            }
            if b.probe_interval.is_zero() {
                return zero("breaker.probe_interval");
            }
            if b.max_probe_interval < b.probe_interval {
                return Err(ConfigError::ProbeIntervalInverted {
                    initial: b.probe_interval,
                    max: b.max_probe_interval,
                });
            }
        }
        if c.max_backoff < c.initial_backoff {
            return Err(ConfigError::BackoffInverted {
                initial: c.initial_backoff,
                max: c.max_backoff,
            });
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            return Err(ConfigError::JitterOutOfRange {
                jitter: self.jitter,
            });
        }
        // Exact for every fraction a user would write; the product is in
        // 0..=1e6, so the cast cannot truncate.
        let jitter_ppm = (self.jitter * 1_000_000.0).round() as u32;
        Ok(Config { jitter_ppm, ..c })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_equal_the_reference_outbox() {
        let c = Config::builder().build().unwrap();
        assert_eq!(c, Config::default());
        assert_eq!(c.capacity(), None);
        assert_eq!(c.max_batch(), None);
        assert_eq!(c.linger(), Duration::ZERO);
        assert_eq!(c.initial_backoff(), Duration::from_millis(50));
        assert_eq!(c.max_backoff(), Duration::from_secs(5));
        assert_eq!(c.max_attempts(), None);
        assert_eq!(c.write_timeout(), None);
        assert_eq!(c.error_policy(), ErrorPolicy::Retry);
    }

    #[test]
    fn zero_values_are_rejected_naming_the_field() {
        let cases: Vec<(ConfigBuilder, &str)> = vec![
            (Config::builder().capacity(0), "capacity"),
            (Config::builder().capacity_bytes(0), "capacity_bytes"),
            (Config::builder().tenant_capacity(0), "tenant_capacity"),
            (Config::builder().max_batch(0), "max_batch"),
            (Config::builder().max_batch_bytes(0), "max_batch_bytes"),
            (
                Config::builder().initial_backoff(Duration::ZERO),
                "initial_backoff",
            ),
            (Config::builder().max_attempts(0), "max_attempts"),
            (
                Config::builder().max_retry_duration(Duration::ZERO),
                "max_retry_duration",
            ),
            (
                Config::builder().write_timeout(Duration::ZERO),
                "write_timeout",
            ),
            (
                Config::builder().max_item_age(Duration::ZERO),
                "max_item_age",
            ),
            (
                Config::builder().breaker(BreakerConfig::new().failures(0)),
                "breaker.failures",
            ),
            (
                Config::builder().breaker(BreakerConfig::new().probe_interval(Duration::ZERO)),
                "breaker.probe_interval",
            ),
        ];
        for (builder, field) in cases {
            let err = builder.build().unwrap_err();
            assert_eq!(err, ConfigError::Zero { field });
            assert!(err.to_string().contains(field));
        }
    }

    #[test]
    fn every_knob_reads_back_as_set() {
        let c = Config::builder()
            .concurrency(3)
            .capacity(100)
            .capacity_bytes(4096)
            .tenant_capacity(10)
            .max_batch(50)
            .max_batch_bytes(1024)
            .linger(Duration::from_millis(7))
            .initial_backoff(Duration::from_millis(20))
            .max_backoff(Duration::from_secs(2))
            .jitter(0.5)
            .max_attempts(4)
            .max_retry_duration(Duration::from_secs(30))
            .error_policy(ErrorPolicy::Drop)
            .write_timeout(Duration::from_secs(3))
            .seed(42)
            .build()
            .unwrap();
        assert_eq!(c.concurrency(), 3);
        assert_eq!(c.capacity(), Some(100));
        assert_eq!(c.capacity_bytes(), Some(4096));
        assert_eq!(c.tenant_capacity(), Some(10));
        assert_eq!(c.max_batch(), Some(50));
        assert_eq!(c.max_batch_bytes(), Some(1024));
        assert_eq!(c.linger(), Duration::from_millis(7));
        assert_eq!(c.initial_backoff(), Duration::from_millis(20));
        assert_eq!(c.max_backoff(), Duration::from_secs(2));
        assert_eq!(c.jitter(), 0.5);
        assert_eq!(c.max_attempts(), Some(4));
        assert_eq!(c.max_retry_duration(), Some(Duration::from_secs(30)));
        assert_eq!(c.error_policy(), ErrorPolicy::Drop);
        assert_eq!(c.write_timeout(), Some(Duration::from_secs(3)));
        assert_eq!(c.seed(), 42);
    }

    #[test]
    fn concurrency_zero_is_normalised_to_one() {
        // S-W3: "concurrency 0 is treated as 1".
        let c = Config::builder().concurrency(0).build().unwrap();
        assert_eq!(c.concurrency(), 1);
    }

    #[test]
    fn inverted_backoff_is_rejected() {
        let err = Config::builder()
            .initial_backoff(Duration::from_secs(2))
            .max_backoff(Duration::from_secs(1))
            .build()
            .unwrap_err();
        assert!(matches!(err, ConfigError::BackoffInverted { .. }));
        assert!(err.to_string().contains("max_backoff"));
    }

    #[test]
    fn a_linger_above_the_item_age_is_rejected() {
        // Every partial batch would expire while it lingers (S-A3, S-R3).
        for linger in [101, 1000] {
            let err = Config::builder()
                .linger(Duration::from_millis(linger))
                .max_item_age(Duration::from_millis(100))
                .build()
                .unwrap_err();
            assert!(matches!(err, ConfigError::LingerAboveItemAge { .. }));
            assert!(err.to_string().contains("max_item_age"));
        }
        let ok = Config::builder()
            .linger(Duration::from_millis(100))
            .max_item_age(Duration::from_millis(100))
            .build();
        assert!(ok.is_ok());
    }

    #[test]
    fn inverted_probe_interval_is_rejected() {
        let err = Config::builder()
            .breaker(
                BreakerConfig::new()
                    .probe_interval(Duration::from_secs(2))
                    .max_probe_interval(Duration::from_secs(1)),
            )
            .build()
            .unwrap_err();
        assert!(matches!(err, ConfigError::ProbeIntervalInverted { .. }));
        assert!(err.to_string().contains("max_probe_interval"));
        let ok = BreakerConfig::new().failures(5);
        let c = Config::builder().breaker(ok).build().unwrap();
        assert_eq!(c.breaker(), Some(ok));
    }

    #[test]
    fn jitter_outside_a_fraction_is_rejected() {
        for bad in [-0.1, 1.5, f64::NAN, f64::INFINITY] {
            let err = Config::builder().jitter(bad).build().unwrap_err();
            assert!(matches!(err, ConfigError::JitterOutOfRange { .. }));
        }
        let c = Config::builder().jitter(0.25).build().unwrap();
        assert_eq!(c.jitter(), 0.25);
    }
}
