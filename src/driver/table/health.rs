//! What [`Outbox::health`](crate::Outbox::health) reports of an outbox
//! table (S-T36): the relay task reads [`Store::horizon`] on a schedule of
//! its own and notes the listener's state here; `health()` only reads
//! what was noted, under a short lock, and does no IO.
//!
//! [`Store::horizon`]: crate::table::Store::horizon

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use crate::core::Time;
use crate::table::Horizon;

/// How often the relay reads the horizon at most and at least: its
/// `poll_interval`, clamped to this range.
pub(crate) const HORIZON_EVERY: (Duration, Duration) =
    (Duration::from_secs(1), Duration::from_secs(10));

/// How long one horizon read may take before it counts as failed.
pub(crate) const HORIZON_TIMEOUT: Duration = Duration::from_secs(5);

/// The relay's notification listener (S-T15, S-T34).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ListenerState {
    /// Its connection is open: a stager's notification wakes the relay at
    /// once.
    Listening,
    /// Listening is configured but no connection is open (the first one
    /// still connecting, or one lost and being opened again every second):
    /// the relay reads every `poll_interval` meanwhile, and at once when
    /// the listener is back.
    Away,
    /// Built with [`TableRelay::listen(false)`](crate::table::TableRelay::listen):
    /// the relay reads every `poll_interval`, never woken.
    PollingOnly,
}

/// What the relay found of the outbox table's schema, which it reads
/// before anything else (S-T3, S-T36). Until it is
/// [`Accepted`](Self::Accepted) the relay reads nothing and nothing is
/// relayed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SchemaState {
    /// Not read yet: the relay is starting.
    Unread,
    /// The database answered that the table is not there (SQLSTATE
    /// `42P01`, undefined table: its migrations were never applied, or the
    /// name is another's). The relay reads again, backing off up to 5 s,
    /// and starts once the table is there.
    Missing,
    /// The read failed otherwise (the database unreachable, or another
    /// error): read again, as for [`Missing`](Self::Missing).
    Unreadable,
    /// This crate refuses the table's schema (S-T3): a version below the
    /// oldest it reads (run the migrations), or one that needs a newer
    /// crate. The relay does not start meanwhile (an outbox of a crate
    /// that knows the version relays the rows); it reads the schema again
    /// every `poll_interval` and starts once it accepts it, without a
    /// restart.
    Refused {
        /// The table's schema version (0: no migration recorded).
        version: u32,
        /// The oldest crate schema version that may read it.
        min_reader: u32,
    },
    /// Read and accepted: the relay runs.
    Accepted {
        /// The table's schema version.
        version: u32,
    },
}

/// The outbox table's part of [`Health`](crate::Health) (S-T36): what the
/// relay found of the table's schema, the listener's state and the last
/// [`Horizon`] the relay read.
///
/// The relay reads the horizon every `poll_interval`, but at most once a
/// second and at least every 10 s (one read at a time, each given at most
/// 5 s); a failed read keeps the last value, which then grows older
/// (`horizon_age`) while `horizon_failures` counts the failures.
///
/// Non-exhaustive: fields may be added.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TableHealth {
    /// The table's schema as the relay found it: missing or refused, the
    /// relay relays nothing (S-T3).
    pub schema: SchemaState,
    /// The listener's state.
    pub listener: ListenerState,
    /// The last horizon read: the age of the oldest open transaction that
    /// holds delivery back (S-T7) and the relay's lag (the oldest row's
    /// age), both as they were at the read, on the database's clock.
    /// `None` until a read succeeded.
    pub horizon: Option<Horizon>,
    /// How long ago, on the outbox's clock, `horizon` was read; `None`
    /// with no `horizon`. The ages in it are now about this much older.
    pub horizon_age: Option<Duration>,
    /// Horizon reads failed (an error or past their 5 s) since the last
    /// that succeeded.
    pub horizon_failures: u32,
    /// Rows of partitions this instance lost that the engine still holds
    /// (a write of them in flight): such a partition, gained again, is
    /// read only once they ended (S-T39). The wait lasts as long as that
    /// write: bounded by `write_timeout` when one is set, else by the
    /// sink's answer alone, so a count that stays up names a write that
    /// hangs.
    pub orphans: usize,
}

/// Where the relay task notes what [`TableHealth`] reports.
pub(crate) struct TableWatch {
    inner: Mutex<Noted>,
}

struct Noted {
    schema: SchemaState,
    listener: ListenerState,
    horizon: Option<(Horizon, Time)>,
    failures: u32,
    orphans: usize,
}

impl TableWatch {
    /// Nothing read yet; the listener away when one is configured.
    pub(crate) fn new(listen: bool) -> Self {
        let listener = if listen {
            ListenerState::Away
        } else {
            ListenerState::PollingOnly
        };
        TableWatch {
            inner: Mutex::new(Noted {
                schema: SchemaState::Unread,
                listener,
                horizon: None,
                failures: 0,
                orphans: 0,
            }),
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut Noted) -> R) -> R {
        f(&mut self.inner.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// The listener's connection opened (`true`) or was lost (`false`);
    /// nothing changes for polling only.
    pub(crate) fn listening(&self, open: bool) {
        self.with(|n| {
            if n.listener != ListenerState::PollingOnly {
                n.listener = if open {
                    ListenerState::Listening
                } else {
                    ListenerState::Away
                };
            }
        });
    }

    /// The relay's latest read of the table's schema found `state`.
    pub(crate) fn schema(&self, state: SchemaState) {
        self.with(|n| n.schema = state);
    }

    /// The relay holds `n` orphans (S-T39).
    pub(crate) fn orphans(&self, n: usize) {
        self.with(|o| o.orphans = n);
    }

    /// A horizon read at `at` answered `read` (`None`: it failed).
    pub(crate) fn horizon(&self, at: Time, read: Option<Horizon>) {
        self.with(|n| match read {
            Some(h) => {
                n.horizon = Some((h, at));
                n.failures = 0;
            }
            None => n.failures = n.failures.saturating_add(1),
        });
    }

    /// What health reports at `now`.
    pub(crate) fn snapshot(&self, now: Time) -> TableHealth {
        self.with(|n| TableHealth {
            schema: n.schema,
            listener: n.listener,
            horizon: n.horizon.map(|(h, _)| h),
            horizon_age: n.horizon.map(|(_, at)| now.saturating_since(at)),
            horizon_failures: n.failures,
            orphans: n.orphans,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_read_keeps_the_last_value_with_its_age() {
        let w = TableWatch::new(true);
        let t = |s| Time::ZERO + Duration::from_secs(s);
        assert_eq!(w.snapshot(t(0)).listener, ListenerState::Away);
        assert_eq!(w.snapshot(t(0)).schema, SchemaState::Unread);
        w.schema(SchemaState::Missing);
        assert_eq!(w.snapshot(t(0)).schema, SchemaState::Missing);
        let h = Horizon {
            oldest_transaction: None,
            lag: Some(Duration::from_secs(3)),
        };
        w.horizon(t(10), Some(h));
        w.listening(true);
        w.horizon(t(12), None);
        let s = w.snapshot(t(15));
        assert_eq!(s.horizon, Some(h));
        assert_eq!(s.horizon_age, Some(Duration::from_secs(5)));
        assert_eq!(s.horizon_failures, 1);
        assert_eq!(s.listener, ListenerState::Listening);
        assert_eq!(s.orphans, 0);
        w.orphans(2);
        assert_eq!(w.snapshot(t(15)).orphans, 2);
        let p = TableWatch::new(false);
        p.listening(true);
        assert_eq!(p.snapshot(t(0)).listener, ListenerState::PollingOnly);
    }
}
