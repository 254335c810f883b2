//! The journal's fault policy, sans IO (S-J5, S-J6): when a failed group
//! commit is tried again, which failure opens an incident (logged once),
//! and when a closing journal stops trying.
//!
//! The driver's commit task does the IO and reads the clock; it asks this
//! type what to do next, so the policy reads in one place and runs the same
//! under the simulation's disk as under a real one.

use std::time::Duration;

use crate::core::Time;

/// Failed rounds a closing journal tries again before it stops trying
/// (S-J5): a disk that stays broken must not hold the close, and the
/// directory's lock, for ever (S-J6).
pub const CLOSING_RETRIES: u32 = 5;

/// How far apart a closing journal's tries are at most: `retry_interval`,
/// but no more than this (1 s), so that a long interval (an hour, say)
/// does not hold a close for five of them.
pub const CLOSING_RETRY_CAP: Duration = Duration::from_secs(1);

/// What the commit task does after a round ([`Faults::next`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Not closing: wait for a reason to commit (a sync, `sync_bytes`
    /// reached, something buffered for `sync_interval`) or, while down,
    /// for [`Faults::retry_at`].
    Wait,
    /// Closing, and the journal works: run the next round at once.
    Again,
    /// Closing, and the last round failed: run the next round at this time.
    RetryAt(Time),
    /// Closing, and the journal failed [`CLOSING_RETRIES`] times more:
    /// stop. The marks not written stage their items again at the next
    /// start, written twice at worst (S-J3).
    GiveUp,
}

/// The journal's fault state: up, or down since an incident began, with
/// the time of its next try (S-J5).
#[derive(Clone, Debug)]
pub struct Faults {
    retry_interval: Duration,
    /// While down: when the next round may try again.
    retry_at: Option<Time>,
    /// While down: when the next round may try again if closing (no later
    /// than [`CLOSING_RETRY_CAP`] after the last failure).
    closing_retry_at: Option<Time>,
    /// Failed rounds since the close began, in total: a round that worked
    /// in between does not reset it, so a flapping disk cannot hold the
    /// close for ever either.
    closing_failures: u32,
}

impl Faults {
    /// An up journal that retries `retry_interval` after a failed commit
    /// (`JournalConfig` keeps it at 1 ms or more; zero would retry at the
    /// next round).
    pub fn new(retry_interval: Duration) -> Self {
        Faults {
            retry_interval,
            retry_at: None,
            closing_retry_at: None,
            closing_failures: 0,
        }
    }

    /// While down: when the next round may try again; `None` while up.
    pub fn retry_at(&self) -> Option<Time> {
        self.retry_at
    }

    /// Whether a round at `now` may try the disk: always while up or
    /// closing (a close does not wait out the interval of its first try),
    /// else once the retry time has come.
    pub fn may_try(&self, now: Time, closing: bool) -> bool {
        closing || self.retry_at.is_none_or(|at| now >= at)
    }

    /// A round failed at `now`: the next try is `retry_interval` later
    /// (while closing, at most [`CLOSING_RETRY_CAP`] later). Returns
    /// whether this failure opened an incident (the one to log).
    pub fn failed(&mut self, now: Time) -> bool {
        let opened = self.retry_at.is_none();
        self.retry_at = Some(now + self.retry_interval);
        self.closing_retry_at = Some(now + self.retry_interval.min(CLOSING_RETRY_CAP));
        opened
    }

    /// A round worked. Returns whether it closed an incident.
    pub fn worked(&mut self) -> bool {
        self.closing_retry_at = None;
        self.retry_at.take().is_some()
    }

    /// After a round: what the task does next, `closing` or not. Each call
    /// while closing and down counts one more failed try against
    /// [`CLOSING_RETRIES`].
    pub fn next(&mut self, closing: bool) -> Next {
        if !closing {
            return Next::Wait;
        }
        let Some(at) = self.closing_retry_at else {
            return Next::Again;
        };
        self.closing_failures += 1;
        if self.closing_failures > CLOSING_RETRIES {
            Next::GiveUp
        } else {
            Next::RetryAt(at)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INTERVAL: Duration = Duration::from_millis(100);

    #[test]
    fn a_failure_opens_an_incident_once_and_sets_the_next_try_one_interval_on() {
        let mut f = Faults::new(INTERVAL);
        assert!(f.may_try(Time::ZERO, false));
        assert!(f.failed(Time::from_millis(5)));
        assert_eq!(f.retry_at(), Some(Time::from_millis(105)));
        assert!(!f.may_try(Time::from_millis(104), false));
        assert!(f.may_try(Time::from_millis(105), false));
        // Still the same incident: not logged again; the time moves on.
        assert!(!f.failed(Time::from_millis(105)));
        assert_eq!(f.retry_at(), Some(Time::from_millis(205)));
        assert!(f.worked());
        assert_eq!(f.retry_at(), None);
        assert!(!f.worked(), "no incident left to close");
        assert!(f.failed(Time::from_millis(300)), "a new incident");
    }

    #[test]
    fn a_close_tries_at_once_then_gives_up_after_the_closing_retries() {
        let mut f = Faults::new(INTERVAL);
        assert_eq!(f.next(false), Next::Wait);
        assert_eq!(f.next(true), Next::Again, "up: the closing round runs now");
        f.failed(Time::ZERO);
        assert!(f.may_try(Time::ZERO, true), "a close does not wait");
        assert_eq!(f.next(false), Next::Wait, "not closing: no try counted");
        let mut now = Time::ZERO;
        for _ in 0..CLOSING_RETRIES {
            assert_eq!(f.next(true), Next::RetryAt(now + INTERVAL));
            now = now + INTERVAL;
            f.failed(now);
        }
        assert_eq!(f.next(true), Next::GiveUp);
    }

    #[test]
    fn a_close_retries_no_further_apart_than_the_cap() {
        let mut f = Faults::new(Duration::MAX);
        f.failed(Time::from_millis(7));
        assert_eq!(f.retry_at(), Some(Time::MAX), "not closing: the interval");
        assert_eq!(
            f.next(true),
            Next::RetryAt(Time::from_millis(7) + CLOSING_RETRY_CAP)
        );
    }

    #[test]
    fn a_close_whose_retry_works_finishes_normally() {
        let mut f = Faults::new(INTERVAL);
        f.failed(Time::ZERO);
        assert_eq!(f.next(true), Next::RetryAt(Time::from_millis(100)));
        assert!(f.worked());
        assert_eq!(f.next(true), Next::Again);
    }
}
