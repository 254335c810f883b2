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

#[cfg(test)]
mod tests {
    use super::*;

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
