//! The engine's clock: points in time given to it by whoever drives it.

use std::fmt;
use std::ops::{Add, Sub};
use std::time::Duration;

/// A point in time on the driver's clock, as a duration since an origin the
/// driver picks (the tokio driver uses the instant it started; the simulation
/// uses zero).
///
/// The core never reads a clock (S-C1): every operation takes a `Time`.
/// Only differences between `Time`s mean anything, so a run is reproducible
/// from its inputs. Resolution: nanoseconds; range: about 584 years.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Time(u64);

impl Time {
    /// The origin of the clock.
    pub const ZERO: Time = Time(0);
    /// The latest representable point; arithmetic saturates here.
    pub const MAX: Time = Time(u64::MAX);

    /// `nanos` nanoseconds after the origin.
    pub const fn from_nanos(nanos: u64) -> Time {
        Time(nanos)
    }

    /// `millis` milliseconds after the origin (saturating).
    pub const fn from_millis(millis: u64) -> Time {
        Time(millis.saturating_mul(1_000_000))
    }

    /// `elapsed` after the origin (saturating at [`Time::MAX`]).
    pub fn from_elapsed(elapsed: Duration) -> Time {
        Time(u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX))
    }

    /// Nanoseconds since the origin.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// The time since the origin.
    pub const fn elapsed(self) -> Duration {
        Duration::from_nanos(self.0)
    }

    /// How long after `earlier` this is; zero when `earlier` is later.
    pub fn saturating_since(self, earlier: Time) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl Add<Duration> for Time {
    type Output = Time;
    /// Saturates at [`Time::MAX`] (a deadline "never").
    fn add(self, rhs: Duration) -> Time {
        let nanos = u64::try_from(rhs.as_nanos()).unwrap_or(u64::MAX);
        Time(self.0.saturating_add(nanos))
    }
}

impl Sub<Time> for Time {
    type Output = Duration;
    /// Saturates at zero.
    fn sub(self, rhs: Time) -> Duration {
        self.saturating_since(rhs)
    }
}

impl fmt::Display for Time {
    /// Milliseconds with three decimals, e.g. `1250.000ms`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}.{:03}ms",
            self.0 / 1_000_000,
            (self.0 / 1_000) % 1_000
        )
    }
}

/// Milliseconds since the Unix epoch of a wall clock's reading `at` (0
/// before it: unknown), as a journal record carries its staging time
/// (S-R3). The reading is the caller's: the core never reads a clock.
#[cfg(feature = "journal")]
pub(crate) fn unix_ms(at: std::time::SystemTime) -> u64 {
    // `as_millis` without its 128-bit product: the same value, saturated.
    at.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| {
        d.as_secs()
            .saturating_mul(1_000)
            .saturating_add(u64::from(d.subsec_millis()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "journal")]
    #[test]
    fn unix_ms_is_as_millis_saturated() {
        use std::time::UNIX_EPOCH;
        let ms = |d: Duration| unix_ms(UNIX_EPOCH + d);
        assert_eq!(ms(Duration::ZERO), 0);
        assert_eq!(ms(Duration::new(1, 999_999_999)), 1_999);
        assert_eq!(
            ms(Duration::new(1_765_000_000, 123_456_789)),
            1_765_000_000_123
        );
        assert_eq!(unix_ms(UNIX_EPOCH - Duration::from_secs(1)), 0);
        // Past `u64::MAX` ms, where the clock can say it: saturated.
        let far = Duration::new(u64::MAX / 1_000, 999_000_000);
        let expected = u64::try_from(far.as_millis()).unwrap_or(u64::MAX);
        if let Some(at) = UNIX_EPOCH.checked_add(far) {
            assert_eq!(unix_ms(at), expected);
        }
    }

    #[test]
    fn arithmetic_saturates() {
        assert_eq!(Time::MAX + Duration::from_secs(1), Time::MAX);
        assert_eq!(Time::ZERO - Time::from_millis(5), Duration::ZERO);
        assert_eq!(
            Time::from_millis(7) - Time::from_millis(2),
            Duration::from_millis(5)
        );
        assert_eq!(Time::from_elapsed(Duration::MAX), Time::MAX);
        assert_eq!(Time::from_millis(1250).to_string(), "1250.000ms");
        assert_eq!(Time::from_millis(3).as_nanos(), 3_000_000);
        assert_eq!(Time::from_nanos(7).elapsed(), Duration::from_nanos(7));
    }
}
