//! What the lease policy reports for `health()` and the metrics (S-L24,
//! S-L29).

use std::time::Duration;

use super::super::time::Time;
use super::event::StopCause;

/// The lease policy's counters, since it was built (S-L29). Each only
/// grows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LeaseCounters {
    /// Heartbeats answered.
    pub heartbeats: u64,
    /// Heartbeats failed, unknown or unanswered.
    pub heartbeat_failures: u64,
    /// Renewal statements answered.
    pub renewals: u64,
    /// Renewal statements failed, unknown or unanswered.
    pub renewal_failures: u64,
    /// Leases whose renewal the store refused.
    pub renewals_refused: u64,
    /// Acquire statements sent.
    pub acquires: u64,
    /// Leases granted by them.
    pub acquired: u64,
    /// Epoch installs that failed (retried), unknown or unanswered.
    pub install_failures: u64,
    /// Leases released by a release statement (late grants included).
    pub releases: u64,
    /// Partitions let go after having been writable: [`LeaseEvent::Released`](super::LeaseEvent::Released)s.
    pub handovers: u64,
    /// Writes reported `stale_epoch`.
    pub stale_epoch_writes: u64,
    /// Partitions stopped after having been writable, by cause (indexed as
    /// [`stopped`](Self::stopped) reads them).
    pub(crate) stops: [u64; 6],
}

impl LeaseCounters {
    /// Partitions stopped under `cause` after having been writable.
    pub fn stopped(&self, cause: StopCause) -> u64 {
        self.stops[cause.index()]
    }

    /// Partitions lost (S-L15): stopped under any cause but a rebalance or
    /// a shutdown.
    pub fn lost(&self) -> u64 {
        StopCause::ALL
            .iter()
            .filter(|c| c.is_loss())
            .map(|&c| self.stopped(c))
            .sum()
    }
}

/// Where the instance stands in its fleet, in one word (S-L24).
///
/// Non-exhaustive: new states may come (a match needs a `_` arm).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaseState {
    /// No heartbeat answered yet: it does not know the fleet.
    Joining,
    /// A member without a share: more members than partitions (S-L18).
    Standby,
    /// Every partition of its share is writable.
    Owning,
    /// Part of its share is not writable yet: being acquired, installed,
    /// or still held by its last owner (a rebalance in progress).
    Acquiring,
    /// The store is not answering: no request has succeeded since `since`.
    /// Each lease stops at its deadline (S-L24); nothing is acquired until
    /// the store is back.
    StoreUnreachable {
        /// When the first request of this run of failures was sent.
        since: Time,
    },
    /// Shutting down: releasing what it holds.
    ShuttingDown,
    /// Shut down: it holds nothing and sends nothing.
    ShutDown,
}

/// The lease policy's health snapshot (S-L24), from
/// [`LeasePolicy::health`](super::LeasePolicy::health).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseHealth {
    /// The summary.
    pub state: LeaseState,
    /// Members in the latest heartbeat's view (this one included).
    pub members: usize,
    /// Partitions the plan gives this instance.
    pub share: usize,
    /// Partitions writable now.
    pub writable: usize,
    /// Partitions being acquired or installed.
    pub acquiring: usize,
    /// Partitions stopped and not yet released.
    pub stopping: usize,
    /// Writes in flight, across partitions.
    pub writes_in_flight: usize,
    /// The least time left before a writable lease's deadline: the lease
    /// deadline margin. `None` with nothing writable.
    pub margin: Option<Duration>,
    /// When the last renewal that succeeded was sent.
    pub last_renewed: Option<Time>,
    /// Renewal statements failed in a row.
    pub renewal_failures: u32,
    /// Why the last partition lost was lost, and when (S-L15).
    pub last_loss: Option<(StopCause, Time)>,
    /// The counters.
    pub counters: LeaseCounters,
}
