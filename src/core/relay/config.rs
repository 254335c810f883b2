//! The relay's settings, validated.

use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

use super::types::ReadOrder;

/// Default [`RelayConfig::read_ahead`]: 10,000 rows.
pub const DEFAULT_READ_AHEAD: u32 = 10_000;
/// Default [`RelayConfig::page_rows`]: 1,000 rows.
pub const DEFAULT_PAGE_ROWS: u32 = 1_000;
/// Default [`RelayConfig::poll_interval`]: 1 s.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// Default [`RelayConfig::max_crash_attempts`]: 3 (S-T18).
pub const DEFAULT_MAX_CRASH_ATTEMPTS: u32 = 3;

/// How the relay reads, holds and removes rows. Build with
/// [`RelayConfig::new`] and the setters; [`Relay::new`](super::Relay::new)
/// validates it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RelayConfig {
    /// The instance owning the leases the relay's writes are fenced by.
    pub owner: String,
    /// Rows read and not yet removed from the table, in all (default
    /// [`DEFAULT_READ_AHEAD`]; at least 1): back-pressure on reading, never
    /// a drop (S-T8).
    pub read_ahead: u32,
    /// Rows of one tenant read and not yet removed (default: a tenth of
    /// `read_ahead`, at least 1; at most `read_ahead`): the tenant's share
    /// of the read-ahead (S-T9).
    pub tenant_share: u32,
    /// Rows per page read, at most (default [`DEFAULT_PAGE_ROWS`]; at
    /// least 1): a read asks each ready partition for an equal share of
    /// the read-ahead's room up to `page_rows`, at least 64 rows each (so
    /// a read of many partitions may bring more). Pages this size let the
    /// first writes start while the next page is read, where one read of
    /// the whole read-ahead held them back until it came (S-T7).
    pub page_rows: u32,
    /// How long the relay waits for a wake-up before it reads anyway
    /// (default [`DEFAULT_POLL_INTERVAL`]; not zero).
    pub poll_interval: Duration,
    /// The first wait after a failed store call, doubling up to
    /// `max_retry_backoff` (defaults 100 ms and 5 s; not zero, not
    /// inverted).
    pub retry_backoff: Duration,
    /// See `retry_backoff`.
    pub max_retry_backoff: Duration,
    /// Crashed attempts after which a row is dead-lettered as `poisoned`
    /// (default [`DEFAULT_MAX_CRASH_ATTEMPTS`]; 0 is taken as 1, as the
    /// journal's, S-T18).
    pub max_crash_attempts: u32,
    /// Codec versions this relay can decode (default `{0}`; not empty).
    pub known_versions: BTreeSet<u32>,
    /// Codec versions declared retired: their rows are dead-lettered
    /// (S-T19). A version both known and retired is refused.
    pub retired_versions: BTreeSet<u32>,
    /// How pages are read (always [`ReadOrder::Watermark`] outside tests).
    pub order: ReadOrder,
}

impl RelayConfig {
    /// The defaults, for the instance `owner`.
    pub fn new(owner: impl Into<String>) -> Self {
        RelayConfig {
            owner: owner.into(),
            read_ahead: DEFAULT_READ_AHEAD,
            tenant_share: DEFAULT_READ_AHEAD / 10,
            page_rows: DEFAULT_PAGE_ROWS,
            poll_interval: DEFAULT_POLL_INTERVAL,
            retry_backoff: Duration::from_millis(100),
            max_retry_backoff: Duration::from_secs(5),
            max_crash_attempts: DEFAULT_MAX_CRASH_ATTEMPTS,
            known_versions: BTreeSet::from([0]),
            retired_versions: BTreeSet::new(),
            order: ReadOrder::Watermark,
        }
    }

    /// Sets `read_ahead` and `tenant_share` to a tenth of it (at least 1).
    pub fn read_ahead(mut self, rows: u32) -> Self {
        self.read_ahead = rows;
        self.tenant_share = (rows / 10).max(1);
        self
    }

    /// Sets `tenant_share`.
    pub fn tenant_share(mut self, rows: u32) -> Self {
        self.tenant_share = rows;
        self
    }

    /// Sets `page_rows`.
    pub fn page_rows(mut self, rows: u32) -> Self {
        self.page_rows = rows;
        self
    }

    /// Sets `poll_interval`.
    pub fn poll_interval(mut self, every: Duration) -> Self {
        self.poll_interval = every;
        self
    }

    /// Sets `max_crash_attempts` (0 is taken as 1, S-T18).
    pub fn max_crash_attempts(mut self, attempts: u32) -> Self {
        self.max_crash_attempts = attempts.max(1);
        self
    }

    /// `max_crash_attempts` as the relay applies it: at least 1, whatever
    /// the field holds (S-T18).
    pub(crate) fn crash_limit(&self) -> u32 {
        self.max_crash_attempts.max(1)
    }

    /// Sets the codec versions this relay decodes.
    pub fn known_versions(mut self, versions: impl IntoIterator<Item = u32>) -> Self {
        self.known_versions = versions.into_iter().collect();
        self
    }

    /// Sets the codec versions declared retired.
    pub fn retired_versions(mut self, versions: impl IntoIterator<Item = u32>) -> Self {
        self.retired_versions = versions.into_iter().collect();
        self
    }

    /// Sets how pages are read.
    pub fn order(mut self, order: ReadOrder) -> Self {
        self.order = order;
        self
    }

    pub(crate) fn validate(&self) -> Result<(), RelayConfigError> {
        use RelayConfigError as E;
        if self.owner.is_empty() {
            return Err(E::EmptyOwner);
        }
        if self.read_ahead == 0 || self.tenant_share == 0 || self.page_rows == 0 {
            return Err(E::Zero);
        }
        if self.tenant_share > self.read_ahead {
            return Err(E::ShareAboveReadAhead);
        }
        if self.poll_interval.is_zero() || self.retry_backoff.is_zero() {
            return Err(E::Zero);
        }
        if self.max_retry_backoff < self.retry_backoff {
            return Err(E::InvertedBackoff);
        }
        if self.known_versions.is_empty() {
            return Err(E::NoKnownVersion);
        }
        if let Some(v) = self
            .known_versions
            .intersection(&self.retired_versions)
            .next()
        {
            return Err(E::KnownAndRetired(*v));
        }
        Ok(())
    }
}

/// A [`RelayConfig`] the relay refuses.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RelayConfigError {
    /// `owner` is empty.
    EmptyOwner,
    /// A count or duration that must be positive is zero.
    Zero,
    /// `tenant_share` is above `read_ahead`.
    ShareAboveReadAhead,
    /// `max_retry_backoff` is below `retry_backoff`.
    InvertedBackoff,
    /// `known_versions` is empty.
    NoKnownVersion,
    /// This version is both known and retired.
    KnownAndRetired(u32),
}

impl fmt::Display for RelayConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RelayConfigError::EmptyOwner => f.write_str("the relay's owner is empty"),
            RelayConfigError::Zero => f.write_str(
                "read_ahead, tenant_share, page_rows, poll_interval and retry_backoff \
                 must be positive",
            ),
            RelayConfigError::ShareAboveReadAhead => {
                f.write_str("tenant_share is above read_ahead")
            }
            RelayConfigError::InvertedBackoff => {
                f.write_str("max_retry_backoff is below retry_backoff")
            }
            RelayConfigError::NoKnownVersion => f.write_str("no codec version is known"),
            RelayConfigError::KnownAndRetired(v) => {
                write!(f, "codec version {v} is both known and retired")
            }
        }
    }
}

impl std::error::Error for RelayConfigError {}
