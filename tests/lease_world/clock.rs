//! Clocks: the world's real time, the store's clock, and each instance's
//! monotonic clock skewed in rate and stepped (within `max_clock_drift`,
//! S-L7).

use outbox::core::Time;

/// A piecewise linear clock: `local(t) = base_local + (t - base_real) *
/// (1e6 + ppm) / 1e6`, rebased at each step. A step may go backwards; the
/// policy reading it never sees time run backwards (it keeps the latest).
#[derive(Clone, Debug)]
pub struct Clock {
    base_real: i128,
    base_local: i128,
    ppm: i128,
}

impl Clock {
    pub fn new(real: Time, local: i128, ppm: i64) -> Clock {
        Clock {
            base_real: real.as_nanos() as i128,
            base_local: local,
            ppm: i128::from(ppm),
        }
    }

    pub fn exact() -> Clock {
        Clock::new(Time::ZERO, 0, 0)
    }

    /// The clock's reading at real time `t`, in nanoseconds (may be
    /// negative after a step back near the origin).
    pub fn raw(&self, t: Time) -> i128 {
        let dt = t.as_nanos() as i128 - self.base_real;
        self.base_local + dt * (1_000_000 + self.ppm) / 1_000_000
    }

    /// The reading as a policy `Time` (clamped at zero).
    pub fn local(&self, t: Time) -> Time {
        Time::from_nanos(self.raw(t).max(0) as u64)
    }

    /// The earliest real time at or after `now` at which the clock reads
    /// `target` or later.
    pub fn real_at(&self, now: Time, target: Time) -> Time {
        let want = target.as_nanos() as i128 - self.base_local;
        let dt = (want * 1_000_000 + (1_000_000 + self.ppm) - 1) / (1_000_000 + self.ppm);
        let t = (self.base_real + dt.max(0)).max(now.as_nanos() as i128);
        let mut t = Time::from_nanos(t as u64);
        // Integer rounding: step up to the first tick that reads `target`.
        while self.raw(t) < target.as_nanos() as i128 {
            t = Time::from_nanos(t.as_nanos() + 1);
        }
        t
    }

    /// Steps the clock by `delta` nanoseconds at real time `t`.
    pub fn step(&mut self, t: Time, delta: i128) {
        let here = self.raw(t);
        self.base_real = t.as_nanos() as i128;
        self.base_local = here + delta;
    }
}

#[test]
fn a_skewed_clock_inverts() {
    let mut c = Clock::new(Time::from_millis(10), 5_000_000, -12_500);
    let t = Time::from_millis(1_010);
    assert_eq!(c.raw(t), 5_000_000 + 987_500_000);
    let target = Time::from_nanos(992_500_000);
    let at = c.real_at(Time::ZERO, target);
    assert!(c.raw(at) >= 992_500_000);
    assert!(c.raw(Time::from_nanos(at.as_nanos() - 1)) < 992_500_000);
    c.step(t, -25_000_000);
    assert_eq!(c.raw(t), 967_500_000);
}
