//! The wall clock a journal record is stamped with and a recovery measures
//! ages on (S-R3): the system's, read at the kernel's tick, or a test's.
//!
//! A stage reads it once per record (once per run, S-W20), on the request
//! path. Linux's precise `CLOCK_REALTIME` reads the time-stamp counter,
//! whose ordering waits for the loads in flight before it: in a stage,
//! among the hand-off's and the journal's cache misses, a read cost about
//! as much as the rest the journal adds but its lock (issue 25).
//! `CLOCK_REALTIME_COARSE` reads the time the kernel kept at its last tick
//! (about 5 ns, no counter): usually late by less than a tick (1-10 ms),
//! more when ticks are delayed (10.6 ms seen on a loaded virtual machine
//! with 4 ms ticks). Stage and recovery read it alike, so a recovered
//! item's age may be off by about that either way, well under any
//! `max_item_age` worth setting. Elsewhere, the standard library's clock.

#[cfg(any(test, feature = "testkit"))]
use std::sync::Arc;
#[cfg(any(test, feature = "testkit", not(target_os = "linux")))]
use std::time::SystemTime;

/// The wall clock of records' staging times (S-R3).
#[derive(Clone)]
pub(crate) enum WallClock {
    /// The system's: coarse where the kernel offers it (module doc).
    System,
    /// A test's or a simulation's ([`JournalConfig::wall_clock`](super::JournalConfig::wall_clock)).
    #[cfg(any(test, feature = "testkit"))]
    Given(Arc<dyn Fn() -> SystemTime + Send + Sync>),
}

impl WallClock {
    /// Now, in milliseconds since the Unix epoch: 0 before it, saturated
    /// past `u64::MAX`.
    #[inline]
    pub(crate) fn unix_ms(&self) -> u64 {
        match self {
            WallClock::System => system_ms(),
            #[cfg(any(test, feature = "testkit"))]
            WallClock::Given(clock) => unix_ms(clock()),
        }
    }
}

/// The system's wall clock at the kernel's last tick (`CLOCK_REALTIME_COARSE`).
#[cfg(target_os = "linux")]
fn system_ms() -> u64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::RealtimeCoarse);
    // Negative only for a clock set before 1970: 0, as `unix_ms` gives.
    let (Ok(secs), Ok(nanos)) = (u64::try_from(now.tv_sec), u64::try_from(now.tv_nsec)) else {
        return 0;
    };
    secs.saturating_mul(1_000).saturating_add(nanos / 1_000_000)
}

/// The standard library's wall clock, where no coarse one is read.
#[cfg(not(target_os = "linux"))]
fn system_ms() -> u64 {
    unix_ms(SystemTime::now())
}

/// Milliseconds since the Unix epoch of a wall clock's reading `at` (0
/// before it: unknown), as a journal record carries its staging time
/// (S-R3).
#[cfg(any(test, feature = "testkit", not(target_os = "linux")))]
fn unix_ms(at: SystemTime) -> u64 {
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
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn the_system_clock_reads_the_standard_clock_late_by_at_most_a_tick() {
        for _ in 0..1_000 {
            let before = unix_ms(SystemTime::now());
            let ms = WallClock::System.unix_ms();
            let after = unix_ms(SystemTime::now());
            // Late by about a tick (at most 10 ms, `HZ` >= 100), more when
            // ticks are delayed on a loaded machine: 50 ms of slack.
            assert!(ms <= after, "{ms} is after {after}");
            assert!(ms + 50 >= before, "{ms} is more than 50 ms before {before}");
        }
    }

    #[test]
    fn a_given_clock_is_read_in_milliseconds() {
        let given = WallClock::Given(Arc::new(|| {
            UNIX_EPOCH + Duration::new(1_765_000_000, 987_654_321)
        }));
        assert_eq!(given.unix_ms(), 1_765_000_000_987);
        let early = WallClock::Given(Arc::new(|| UNIX_EPOCH - Duration::from_secs(5)));
        assert_eq!(early.unix_ms(), 0);
    }

    #[test]
    fn unix_ms_is_as_millis_saturated() {
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
}
