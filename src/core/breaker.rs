//! The sink-wide breaker (S-R1, S-R2): after a run of failed attempts
//! across tenants, no new attempt starts but one probe per probe interval;
//! any attempt the sink answers (committed, or rejected as terminal) closes
//! it.
//!
//! Per-tenant backoff (S-W7) spaces one tenant's retries; with thousands of
//! tenants some tenant is always due, so a sink that is down still sees a
//! steady stream of attempts. The breaker is the sink-wide answer. It only
//! gates *when* the next write may start: which write starts is still the
//! schedule's (S-B1), so tenants keep their order and their own backoff.

use std::fmt;
use std::time::Duration;

use super::canary;
use super::time::Time;
use super::write::{Failure, WriteId};

/// The breaker's settings (S-R1). Off unless set with
/// [`ConfigBuilder::breaker`](super::ConfigBuilder::breaker).
///
/// Defaults: opens after 20 failed attempts in a row, probes every second,
/// the interval doubling after each failed probe up to 30 s.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BreakerConfig {
    pub(crate) failures: u32,
    pub(crate) probe_interval: Duration,
    pub(crate) max_probe_interval: Duration,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            failures: 20,
            probe_interval: Duration::from_secs(1),
            max_probe_interval: Duration::from_secs(30),
        }
    }
}

impl BreakerConfig {
    /// The defaults (see the type's doc).
    pub fn new() -> Self {
        Self::default()
    }

    /// Open after this many failed attempts in a row, across all tenants
    /// (S-R1). A failed attempt is one that ended in a retryable error, a
    /// panic, a timeout or a lost task; a committed write or a terminal
    /// rejection (the sink answered) resets the run; a cancelled attempt
    /// counts neither way. Zero is rejected by
    /// [`ConfigBuilder::build`](super::ConfigBuilder::build).
    pub fn failures(mut self, failures: u32) -> Self {
        self.failures = failures;
        self
    }

    /// While open, one probe may start this long after the breaker opened
    /// or the last probe failed (S-R2). Zero is rejected.
    pub fn probe_interval(mut self, interval: Duration) -> Self {
        self.probe_interval = interval;
        self
    }

    /// Each failed probe doubles the interval before the next, up to this
    /// (S-R2). Below `probe_interval` is rejected.
    pub fn max_probe_interval(mut self, interval: Duration) -> Self {
        self.max_probe_interval = interval;
        self
    }

    /// Failed attempts in a row that open the breaker.
    pub fn failures_to_open(&self) -> u32 {
        self.failures
    }

    /// The first probe interval.
    pub fn first_probe_interval(&self) -> Duration {
        self.probe_interval
    }

    /// The cap on the probe interval.
    pub fn probe_interval_cap(&self) -> Duration {
        self.max_probe_interval
    }
}

/// Where the breaker stands, as [`Engine::breaker`](super::Engine::breaker)
/// reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BreakerState {
    /// Writes start as the schedule allows.
    Closed,
    /// No write starts until `next_probe`, then one probe.
    Open {
        /// When the next probe may start.
        next_probe: Time,
    },
    /// A probe is in flight; nothing else starts until it ends.
    Probing {
        /// The probe.
        probe: WriteId,
    },
}

impl fmt::Display for BreakerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BreakerState::Closed => "closed",
            BreakerState::Open { .. } => "open",
            BreakerState::Probing { .. } => "probing",
        })
    }
}

/// What an attempt's end says about the sink.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    /// The sink answered.
    Up,
    /// The sink failed.
    Down,
    /// Nothing (cancelled by us).
    Moot,
}

fn verdict(failure: Option<Failure>) -> Verdict {
    match failure {
        // The sink answered (a stale epoch too: S-E7).
        None | Some(Failure::Rejected | Failure::StaleEpoch) => Verdict::Up,
        Some(Failure::Cancelled) => Verdict::Moot,
        // Canary (issue 26): a timeout counted neither way.
        Some(Failure::Timeout) if canary::on(canary::BREAKER_TIMEOUT) => Verdict::Moot,
        Some(_) => Verdict::Down,
    }
}

/// The breaker's state machine. Without a config it is always closed and
/// costs a branch per write.
#[derive(Clone, Debug)]
pub(crate) struct Breaker {
    config: Option<BreakerConfig>,
    /// Failed attempts in a row while closed.
    failures: u32,
    /// `Some` while open.
    open: Option<Open>,
}

#[derive(Clone, Copy, Debug)]
struct Open {
    /// The current probe interval.
    interval: Duration,
    next_probe: Time,
    probe: Option<WriteId>,
}

impl Breaker {
    pub(crate) fn new(config: Option<BreakerConfig>) -> Self {
        Breaker {
            config,
            failures: 0,
            open: None,
        }
    }

    pub(crate) fn state(&self) -> BreakerState {
        match self.open {
            None => BreakerState::Closed,
            Some(Open {
                probe: Some(probe), ..
            }) => BreakerState::Probing { probe },
            Some(Open { next_probe, .. }) => BreakerState::Open { next_probe },
        }
    }

    /// Failed attempts in a row (frozen while open: only a probe's
    /// verdict counts then).
    pub(crate) fn consecutive_failures(&self) -> u32 {
        self.failures
    }

    /// Whether a write may start at `now`.
    pub(crate) fn may_start(&self, now: Time) -> bool {
        match self.open {
            None => true,
            Some(o) => o.probe.is_none() && o.next_probe <= now,
        }
    }

    /// When a probe may start, if the breaker waits for one.
    pub(crate) fn next_probe(&self) -> Option<Time> {
        self.open
            .filter(|o| o.probe.is_none())
            .map(|o| o.next_probe)
    }

    /// Write `id` started; while open it is the probe. Returns whether it is.
    pub(crate) fn started(&mut self, id: WriteId) -> bool {
        match self.open.as_mut() {
            Some(o) => {
                debug_assert!(o.probe.is_none());
                o.probe = Some(id);
                true
            }
            None => false,
        }
    }

    /// Write `id`'s attempt ended with `outcome` at `now`.
    pub(crate) fn ended(&mut self, id: WriteId, outcome: Option<Failure>, now: Time) {
        let verdict = verdict(outcome);
        let Some(config) = self.config else {
            // Off: the count is still kept, for the health snapshot.
            match verdict {
                Verdict::Up => self.failures = 0,
                Verdict::Down => self.failures = self.failures.saturating_add(1),
                Verdict::Moot => {}
            }
            return;
        };
        match self.open.as_mut() {
            None => match verdict {
                Verdict::Up => self.failures = 0,
                Verdict::Down => {
                    self.failures = self.failures.saturating_add(1);
                    if self.failures >= config.failures {
                        self.open = Some(Open {
                            interval: config.probe_interval,
                            next_probe: now + config.probe_interval,
                            probe: None,
                        });
                    }
                }
                Verdict::Moot => {}
            },
            Some(o) => {
                let is_probe = o.probe == Some(id);
                match verdict {
                    // Any answer from the sink closes: a write started
                    // before the breaker opened may be the first to see
                    // it back.
                    Verdict::Up => {
                        self.open = None;
                        self.failures = 0;
                    }
                    Verdict::Down if is_probe => {
                        o.interval = (o.interval * 2).min(config.max_probe_interval);
                        o.next_probe = now + o.interval;
                        o.probe = None;
                    }
                    Verdict::Moot if is_probe => {
                        o.next_probe = now + o.interval;
                        o.probe = None;
                    }
                    Verdict::Down | Verdict::Moot => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn cfg() -> BreakerConfig {
        BreakerConfig::new()
            .failures(3)
            .probe_interval(100 * MS)
            .max_probe_interval(300 * MS)
    }

    #[test]
    fn off_never_opens() {
        let mut b = Breaker::new(None);
        for i in 0..100 {
            b.ended(WriteId(i), Some(Failure::Error), Time::ZERO);
        }
        assert!(b.may_start(Time::ZERO));
        assert_eq!(b.state(), BreakerState::Closed);
        assert_eq!(
            b.consecutive_failures(),
            100,
            "counted for the health snapshot"
        );
    }

    #[test]
    fn opens_after_a_run_of_failures_and_a_success_resets_the_run() {
        // S-R1.
        let mut b = Breaker::new(Some(cfg()));
        let t = Time::from_millis(10);
        b.ended(WriteId(1), Some(Failure::Error), t);
        b.ended(WriteId(2), Some(Failure::Timeout), t);
        b.ended(WriteId(3), Some(Failure::Rejected), t);
        assert_eq!(b.consecutive_failures(), 0, "a rejection is an answer");
        b.ended(WriteId(4), Some(Failure::Cancelled), t);
        b.ended(WriteId(5), Some(Failure::Panic), t);
        b.ended(WriteId(6), Some(Failure::Error), t);
        assert!(b.may_start(t));
        b.ended(WriteId(7), Some(Failure::TaskLost), t);
        assert_eq!(
            b.state(),
            BreakerState::Open {
                next_probe: Time::from_millis(110)
            }
        );
        assert!(!b.may_start(Time::from_millis(109)));
        assert!(b.may_start(Time::from_millis(110)));
    }

    #[test]
    fn one_probe_at_a_time_backing_off_to_the_cap_and_a_success_closes() {
        // S-R2.
        let mut b = Breaker::new(Some(cfg()));
        for i in 0..3 {
            b.ended(WriteId(i), Some(Failure::Error), Time::ZERO);
        }
        let mut now = Time::from_millis(100);
        for (n, want) in [(10, 200), (11, 300), (12, 300)] {
            assert!(b.may_start(now));
            assert!(b.started(WriteId(n)));
            assert!(!b.may_start(now), "one probe at a time");
            assert_eq!(b.next_probe(), None);
            // A late failure of an older write changes nothing.
            b.ended(WriteId(0), Some(Failure::Error), now);
            b.ended(WriteId(n), Some(Failure::Error), now);
            assert_eq!(b.next_probe(), Some(now + want * MS));
            now = now + want * MS;
        }
        assert!(b.started(WriteId(20)));
        b.ended(WriteId(20), None, now);
        assert_eq!(b.state(), BreakerState::Closed);
        assert!(!b.started(WriteId(21)), "closed: no probe");
    }

    #[test]
    fn a_cancelled_write_that_is_not_the_probe_leaves_the_probe_alone() {
        // S-R2: one probe at a time. A write started before the breaker
        // opened may be cancelled while the probe is in flight; that says
        // nothing about the sink and must not free the probe's place.
        let mut b = Breaker::new(Some(cfg()));
        for i in 0..3 {
            b.ended(WriteId(i), Some(Failure::Error), Time::ZERO);
        }
        let now = Time::from_millis(100);
        assert!(b.started(WriteId(9)));
        b.ended(WriteId(5), Some(Failure::Cancelled), now);
        assert_eq!(b.state(), BreakerState::Probing { probe: WriteId(9) });
        assert!(!b.may_start(now + 1000 * MS), "still one probe at a time");
        b.ended(WriteId(9), Some(Failure::Error), now);
        assert_eq!(b.next_probe(), Some(now + 200 * MS));
    }

    #[test]
    fn the_state_reads_as_its_metric_label() {
        // The health snapshot and the logs print these words.
        assert_eq!(BreakerState::Closed.to_string(), "closed");
        let open = BreakerState::Open {
            next_probe: Time::ZERO,
        };
        assert_eq!(open.to_string(), "open");
        let probing = BreakerState::Probing { probe: WriteId(1) };
        assert_eq!(probing.to_string(), "probing");
    }

    #[test]
    fn a_cancelled_probe_waits_one_interval_more() {
        let mut b = Breaker::new(Some(cfg()));
        for i in 0..3 {
            b.ended(WriteId(i), Some(Failure::Error), Time::ZERO);
        }
        let now = Time::from_millis(100);
        b.started(WriteId(9));
        b.ended(WriteId(9), Some(Failure::Cancelled), now);
        assert_eq!(b.next_probe(), Some(Time::from_millis(200)));
    }
}
