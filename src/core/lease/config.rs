//! The lease policy's configuration, built and validated in one place
//! (S-L25).

use std::fmt;
use std::time::Duration;

use super::id::{BadInstanceId, InstanceId};

/// The most partitions an outbox table may have (as the table allows).
pub const MAX_PARTITIONS: u32 = 65_536;

/// A lease configuration value that makes no sense (S-L25). Each variant
/// names the fields.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaseConfigError {
    /// The instance id is not usable.
    InstanceId(BadInstanceId),
    /// The field is zero, where zero means nothing useful.
    Zero {
        /// The field's name, as the builder spells it.
        field: &'static str,
    },
    /// `partitions` is above [`MAX_PARTITIONS`].
    TooManyPartitions {
        /// The value given.
        partitions: u32,
    },
    /// `renew_every + max_clock_drift` is at or above half of `lease_ttl`:
    /// a lease would not survive one failed renewal with its margin
    /// (S-L6).
    RenewalTooSlow {
        /// The configured `renew_every`.
        renew_every: Duration,
        /// The configured `max_clock_drift`.
        max_clock_drift: Duration,
        /// The configured `lease_ttl`.
        lease_ttl: Duration,
    },
    /// `heartbeat_every + acquire_poll` is above `renew_every`: a joining
    /// instance could not own its share within two renewal periods
    /// (S-L22).
    JoinTooSlow {
        /// The configured `heartbeat_every`.
        heartbeat_every: Duration,
        /// The configured `acquire_poll`.
        acquire_poll: Duration,
        /// The configured `renew_every`.
        renew_every: Duration,
    },
    /// `rejoin_grace` is below two heartbeat periods: one late heartbeat
    /// would drop a live instance from the members and rebalance (S-L3).
    RejoinGraceTooShort {
        /// The configured `rejoin_grace`.
        rejoin_grace: Duration,
        /// The configured `heartbeat_every`.
        heartbeat_every: Duration,
    },
    /// `rejoin_grace` is above `lease_ttl`: a dead owner's partitions
    /// would wait for it beyond the takeover bound (S-L23).
    RejoinGraceAboveTtl {
        /// The configured `rejoin_grace`.
        rejoin_grace: Duration,
        /// The configured `lease_ttl`.
        lease_ttl: Duration,
    },
}

impl fmt::Display for LeaseConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LeaseConfigError::InstanceId(e) => e.fmt(f),
            LeaseConfigError::Zero { field } => {
                write!(f, "lease config: `{field}` must not be zero")
            }
            LeaseConfigError::TooManyPartitions { partitions } => write!(
                f,
                "lease config: `partitions` is {partitions}, at most {MAX_PARTITIONS} are allowed"
            ),
            LeaseConfigError::RenewalTooSlow {
                renew_every,
                max_clock_drift,
                lease_ttl,
            } => write!(
                f,
                "lease config: `renew_every` ({renew_every:?}) plus `max_clock_drift` ({max_clock_drift:?}) must be below half of `lease_ttl` ({lease_ttl:?})"
            ),
            LeaseConfigError::JoinTooSlow {
                heartbeat_every,
                acquire_poll,
                renew_every,
            } => write!(
                f,
                "lease config: `heartbeat_every` ({heartbeat_every:?}) plus `acquire_poll` ({acquire_poll:?}) must not be above `renew_every` ({renew_every:?})"
            ),
            LeaseConfigError::RejoinGraceTooShort {
                rejoin_grace,
                heartbeat_every,
            } => write!(
                f,
                "lease config: `rejoin_grace` ({rejoin_grace:?}) must be at least twice `heartbeat_every` ({heartbeat_every:?})"
            ),
            LeaseConfigError::RejoinGraceAboveTtl {
                rejoin_grace,
                lease_ttl,
            } => write!(
                f,
                "lease config: `rejoin_grace` ({rejoin_grace:?}) must not be above `lease_ttl` ({lease_ttl:?})"
            ),
        }
    }
}

impl std::error::Error for LeaseConfigError {}

/// The lease policy's configuration (S-L25). Build it with
/// [`LeaseConfig::builder`]; every value in a `LeaseConfig` has been
/// validated.
///
/// Defaults: 64 partitions, `lease_ttl` 10 s, `renew_every` 2 s,
/// `max_clock_drift` 1 s, `acquire_poll` 1 s, `heartbeat_every` 1 s,
/// `rejoin_grace` 10 s, incarnation 0, no `write_timeout`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseConfig {
    pub(crate) instance_id: InstanceId,
    pub(crate) incarnation: u64,
    pub(crate) partitions: u32,
    pub(crate) lease_ttl: Duration,
    pub(crate) renew_every: Duration,
    pub(crate) max_clock_drift: Duration,
    pub(crate) acquire_poll: Duration,
    pub(crate) heartbeat_every: Duration,
    pub(crate) rejoin_grace: Duration,
    pub(crate) write_timeout: Option<Duration>,
}

impl LeaseConfig {
    /// A builder for the instance named `instance_id`, starting from the
    /// defaults (see the type's doc). The id is checked by
    /// [`LeaseConfigBuilder::build`] ([`InstanceId::new`]'s rules).
    pub fn builder(instance_id: impl Into<String>) -> LeaseConfigBuilder {
        LeaseConfigBuilder {
            instance_id: instance_id.into(),
            incarnation: 0,
            partitions: 64,
            lease_ttl: Duration::from_secs(10),
            renew_every: Duration::from_secs(2),
            max_clock_drift: Duration::from_secs(1),
            acquire_poll: Duration::from_secs(1),
            heartbeat_every: Duration::from_secs(1),
            rejoin_grace: Duration::from_secs(10),
            write_timeout: None,
        }
    }

    /// This instance's name in the lease and heartbeat tables (S-L3).
    pub fn instance_id(&self) -> &InstanceId {
        &self.instance_id
    }
    /// This run of the instance (S-L11).
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }
    /// The outbox table's partitions, P (S-L1).
    pub fn partitions(&self) -> u32 {
        self.partitions
    }
    /// How long a lease lasts after the store set its expiry (S-L5).
    pub fn lease_ttl(&self) -> Duration {
        self.lease_ttl
    }
    /// The renewal period (S-L6).
    pub fn renew_every(&self) -> Duration {
        self.renew_every
    }
    /// The margin taken off every lease's deadline (S-L4, S-L7).
    pub fn max_clock_drift(&self) -> Duration {
        self.max_clock_drift
    }
    /// How often a wanted partition that is not held is tried (S-L10).
    pub fn acquire_poll(&self) -> Duration {
        self.acquire_poll
    }
    /// The heartbeat period (S-L3).
    pub fn heartbeat_every(&self) -> Duration {
        self.heartbeat_every
    }
    /// How long a member stays one after its last heartbeat (S-L3, S-L21).
    pub fn rejoin_grace(&self) -> Duration {
        self.rejoin_grace
    }
    /// A write in flight this old no longer holds up a release (S-L17).
    pub fn write_timeout(&self) -> Option<Duration> {
        self.write_timeout
    }
    /// How long a request is waited for before the policy gives up on its
    /// reply: one renewal period (S-L2).
    pub fn request_timeout(&self) -> Duration {
        self.renew_every
    }
    /// How long after its request was sent a granted or renewed lease is
    /// trusted: `lease_ttl - max_clock_drift` (S-L4).
    pub(crate) fn lifetime(&self) -> Duration {
        if crate::core::canary::on(crate::core::canary::NO_DRIFT_MARGIN) {
            return self.lease_ttl;
        }
        self.lease_ttl.saturating_sub(self.max_clock_drift)
    }
}

/// Builds a [`LeaseConfig`]; [`LeaseConfigBuilder::build`] validates it
/// (S-L25).
#[derive(Clone, Debug)]
pub struct LeaseConfigBuilder {
    instance_id: String,
    incarnation: u64,
    partitions: u32,
    lease_ttl: Duration,
    renew_every: Duration,
    max_clock_drift: Duration,
    acquire_poll: Duration,
    heartbeat_every: Duration,
    rejoin_grace: Duration,
    write_timeout: Option<Duration>,
}

impl LeaseConfigBuilder {
    /// This run of the instance: a value no earlier run of the same
    /// `instance_id` used (the driver draws it from the operating system's
    /// randomness at start; a simulation from its seed). It makes the
    /// sink's epoch install exclusive to one run (S-L11). Default 0.
    pub fn incarnation(mut self, incarnation: u64) -> Self {
        self.incarnation = incarnation;
        self
    }
    /// The outbox table's partitions, P: it must equal the P the table
    /// was created with. 1 to [`MAX_PARTITIONS`]; zero and more are
    /// rejected. Default 64.
    pub fn partitions(mut self, partitions: u32) -> Self {
        self.partitions = partitions;
        self
    }
    /// How long a lease lasts after the store last set its expiry from its
    /// own clock (S-L5). Default 10 s. Zero is rejected.
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }
    /// The renewal period (S-L6): every held lease is renewed this long
    /// after the last renewal was sent. Default 2 s. Zero is rejected, and
    /// so is a value that with `max_clock_drift` reaches half the ttl.
    pub fn renew_every(mut self, period: Duration) -> Self {
        self.renew_every = period;
        self
    }
    /// What the store's clock may gain on this instance's monotonic clock
    /// over one ttl (S-L7): its rate error over a ttl, plus a step of it,
    /// plus the offset between the database's failover hosts. Taken off
    /// every lease's deadline. Default 1 s. Zero is rejected: no clock is
    /// exact.
    pub fn max_clock_drift(mut self, drift: Duration) -> Self {
        self.max_clock_drift = drift;
        self
    }
    /// How often a partition the plan gives this instance, and that it does
    /// not hold, is tried (S-L10); a change of plan tries at once. Default
    /// 1 s. Zero is rejected.
    pub fn acquire_poll(mut self, period: Duration) -> Self {
        self.acquire_poll = period;
        self
    }
    /// The heartbeat period (S-L3): each heartbeat also reads the members
    /// and the lease table's owners, from which the plan is made. Default
    /// 1 s. Zero is rejected; with `acquire_poll` it must fit in
    /// `renew_every`.
    pub fn heartbeat_every(mut self, period: Duration) -> Self {
        self.heartbeat_every = period;
        self
    }
    /// How long an instance stays a member after its last heartbeat
    /// (S-L3): one that restarts under the same id within it gets its
    /// partitions back without a rebalance (S-L21). At least twice
    /// `heartbeat_every`, at most `lease_ttl`. Default 10 s.
    pub fn rejoin_grace(mut self, grace: Duration) -> Self {
        self.rejoin_grace = grace;
        self
    }
    /// The engine's `write_timeout`: a write in flight that started this
    /// long ago no longer holds up its partition's release (S-L17). Unset
    /// (the default), a release waits for every write in flight to end.
    /// Zero is rejected.
    pub fn write_timeout(mut self, timeout: Duration) -> Self {
        self.write_timeout = Some(timeout);
        self
    }

    /// Validates and returns the configuration (S-L25).
    ///
    /// # Errors
    /// [`LeaseConfigError`] naming the first field, or pair of fields,
    /// that makes no sense.
    pub fn build(self) -> Result<LeaseConfig, LeaseConfigError> {
        let instance_id =
            InstanceId::new(self.instance_id.clone()).map_err(LeaseConfigError::InstanceId)?;
        let zero = |field| Err(LeaseConfigError::Zero { field });
        if self.partitions == 0 {
            return zero("partitions");
        }
        if self.partitions > MAX_PARTITIONS {
            return Err(LeaseConfigError::TooManyPartitions {
                partitions: self.partitions,
            });
        }
        for (value, field) in [
            (self.lease_ttl, "lease_ttl"),
            (self.renew_every, "renew_every"),
            (self.max_clock_drift, "max_clock_drift"),
            (self.acquire_poll, "acquire_poll"),
            (self.heartbeat_every, "heartbeat_every"),
            (self.rejoin_grace, "rejoin_grace"),
            (self.write_timeout.unwrap_or(Duration::MAX), "write_timeout"),
        ] {
            if value.is_zero() {
                return zero(field);
            }
        }
        self.check_periods()?;
        Ok(LeaseConfig {
            instance_id,
            incarnation: self.incarnation,
            partitions: self.partitions,
            lease_ttl: self.lease_ttl,
            renew_every: self.renew_every,
            max_clock_drift: self.max_clock_drift,
            acquire_poll: self.acquire_poll,
            heartbeat_every: self.heartbeat_every,
            rejoin_grace: self.rejoin_grace,
            write_timeout: self.write_timeout,
        })
    }

    /// The rules between periods (S-L6, S-L22, S-L3, S-L23).
    fn check_periods(&self) -> Result<(), LeaseConfigError> {
        let twice = |d: Duration| d.saturating_mul(2);
        if twice(self.renew_every.saturating_add(self.max_clock_drift)) >= self.lease_ttl {
            return Err(LeaseConfigError::RenewalTooSlow {
                renew_every: self.renew_every,
                max_clock_drift: self.max_clock_drift,
                lease_ttl: self.lease_ttl,
            });
        }
        if self.heartbeat_every.saturating_add(self.acquire_poll) > self.renew_every {
            return Err(LeaseConfigError::JoinTooSlow {
                heartbeat_every: self.heartbeat_every,
                acquire_poll: self.acquire_poll,
                renew_every: self.renew_every,
            });
        }
        if self.rejoin_grace < twice(self.heartbeat_every) {
            return Err(LeaseConfigError::RejoinGraceTooShort {
                rejoin_grace: self.rejoin_grace,
                heartbeat_every: self.heartbeat_every,
            });
        }
        if self.rejoin_grace > self.lease_ttl {
            return Err(LeaseConfigError::RejoinGraceAboveTtl {
                rejoin_grace: self.rejoin_grace,
                lease_ttl: self.lease_ttl,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn defaults_are_valid_and_read_back() {
        let c = LeaseConfig::builder("relay-0").build().unwrap();
        assert_eq!(c.instance_id().as_str(), "relay-0");
        assert_eq!(c.partitions(), 64);
        assert_eq!(c.lease_ttl(), 10_000 * MS);
        assert_eq!(c.renew_every(), 2_000 * MS);
        assert_eq!(c.max_clock_drift(), 1_000 * MS);
        assert_eq!(c.acquire_poll(), 1_000 * MS);
        assert_eq!(c.heartbeat_every(), 1_000 * MS);
        assert_eq!(c.rejoin_grace(), 10_000 * MS);
        assert_eq!(c.write_timeout(), None);
        assert_eq!(c.incarnation(), 0);
        assert_eq!(c.request_timeout(), c.renew_every());
        assert_eq!(c.lifetime(), 9_000 * MS);
    }

    #[test]
    fn every_knob_reads_back_as_set() {
        let c = LeaseConfig::builder("a")
            .incarnation(7)
            .partitions(3)
            .lease_ttl(1_000 * MS)
            .renew_every(200 * MS)
            .max_clock_drift(100 * MS)
            .acquire_poll(50 * MS)
            .heartbeat_every(100 * MS)
            .rejoin_grace(600 * MS)
            .write_timeout(300 * MS)
            .build()
            .unwrap();
        assert_eq!(
            (
                c.incarnation(),
                c.partitions(),
                c.lease_ttl(),
                c.renew_every()
            ),
            (7, 3, 1_000 * MS, 200 * MS)
        );
        assert_eq!(
            (c.max_clock_drift(), c.acquire_poll(), c.heartbeat_every()),
            (100 * MS, 50 * MS, 100 * MS)
        );
        assert_eq!(c.rejoin_grace(), 600 * MS);
        assert_eq!(c.write_timeout(), Some(300 * MS));
    }

    #[test]
    fn zero_values_are_rejected_naming_the_field() {
        let b = || LeaseConfig::builder("a");
        let cases = [
            (b().partitions(0), "partitions"),
            (b().lease_ttl(Duration::ZERO), "lease_ttl"),
            (b().renew_every(Duration::ZERO), "renew_every"),
            (b().max_clock_drift(Duration::ZERO), "max_clock_drift"),
            (b().acquire_poll(Duration::ZERO), "acquire_poll"),
            (b().heartbeat_every(Duration::ZERO), "heartbeat_every"),
            (b().rejoin_grace(Duration::ZERO), "rejoin_grace"),
            (b().write_timeout(Duration::ZERO), "write_timeout"),
        ];
        for (builder, field) in cases {
            let err = builder.build().unwrap_err();
            assert_eq!(err, LeaseConfigError::Zero { field });
            assert!(err.to_string().contains(field), "{err}");
        }
    }

    #[test]
    fn a_bad_instance_id_or_partition_count_is_rejected() {
        let err = LeaseConfig::builder("").build().unwrap_err();
        assert_eq!(err, LeaseConfigError::InstanceId(BadInstanceId::Empty));
        let err = LeaseConfig::builder("a")
            .partitions(MAX_PARTITIONS + 1)
            .build()
            .unwrap_err();
        assert!(matches!(err, LeaseConfigError::TooManyPartitions { .. }));
        assert!(err.to_string().contains("partitions"));
        assert!(LeaseConfig::builder("a")
            .partitions(MAX_PARTITIONS)
            .build()
            .is_ok());
    }

    #[test]
    fn a_renewal_period_plus_drift_at_half_the_ttl_is_rejected() {
        // S-L6: 2 s + 1 s is 3 s, not below half of 6 s.
        let err = LeaseConfig::builder("a")
            .lease_ttl(6_000 * MS)
            .rejoin_grace(6_000 * MS)
            .build()
            .unwrap_err();
        assert!(matches!(err, LeaseConfigError::RenewalTooSlow { .. }));
        assert!(err.to_string().contains("half of `lease_ttl`"), "{err}");
        // Just below half is fine.
        assert!(LeaseConfig::builder("a")
            .lease_ttl(6_001 * MS)
            .rejoin_grace(6_000 * MS)
            .build()
            .is_ok());
        // A drift at or above the ttl (inverted) is caught by the same rule.
        let err = LeaseConfig::builder("a")
            .max_clock_drift(20_000 * MS)
            .build()
            .unwrap_err();
        assert!(matches!(err, LeaseConfigError::RenewalTooSlow { .. }));
        // Huge values saturate instead of overflowing.
        let err = LeaseConfig::builder("a")
            .renew_every(Duration::MAX)
            .build()
            .unwrap_err();
        assert!(matches!(err, LeaseConfigError::RenewalTooSlow { .. }));
    }

    #[test]
    fn heartbeat_and_acquire_poll_must_fit_in_a_renewal_period() {
        let err = LeaseConfig::builder("a")
            .heartbeat_every(1_500 * MS)
            .rejoin_grace(3_000 * MS)
            .build()
            .unwrap_err();
        assert!(matches!(err, LeaseConfigError::JoinTooSlow { .. }));
        assert!(err.to_string().contains("acquire_poll"), "{err}");
        // A heartbeat slower than the renewal (inverted) is caught too.
        let err = LeaseConfig::builder("a")
            .heartbeat_every(3_000 * MS)
            .build()
            .unwrap_err();
        assert!(matches!(err, LeaseConfigError::JoinTooSlow { .. }));
    }

    #[test]
    fn the_rejoin_grace_lies_between_two_heartbeats_and_the_ttl() {
        let err = LeaseConfig::builder("a")
            .rejoin_grace(1_999 * MS)
            .build()
            .unwrap_err();
        assert!(matches!(err, LeaseConfigError::RejoinGraceTooShort { .. }));
        assert!(err.to_string().contains("twice"), "{err}");
        let err = LeaseConfig::builder("a")
            .rejoin_grace(10_001 * MS)
            .build()
            .unwrap_err();
        assert!(matches!(err, LeaseConfigError::RejoinGraceAboveTtl { .. }));
        assert!(err.to_string().contains("lease_ttl"), "{err}");
        assert!(LeaseConfig::builder("a")
            .rejoin_grace(2_000 * MS)
            .build()
            .is_ok());
    }
}
