//! What the lease policy tells the driver and the engine to do, and why a
//! partition stops (S-L15, S-L16).

use std::fmt;

use super::super::time::Time;
use super::id::{Epoch, Partition};

/// Why a partition stopped (S-L15, S-L17).
///
/// Non-exhaustive: new causes may come (a match needs a `_` arm).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum StopCause {
    /// The plan gives the partition to another member (S-L18).
    Rebalance,
    /// This instance is shutting down (S-L28).
    Shutdown,
    /// Its local deadline passed before a renewal succeeded (S-L8), the
    /// store being unreachable or slow, or this instance paused.
    DeadlinePassed,
    /// The store refused its renewal: the lease lapsed or another instance
    /// took it over (S-L5).
    RenewalRefused,
    /// A write of it came back `stale_epoch`: a newer epoch is installed at
    /// the sink (S-L14).
    StaleEpoch,
    /// The sink already holds a newer epoch, or this one for another
    /// holder, when this instance came to install its own (S-L11).
    Superseded,
}

impl StopCause {
    /// Whether the partition was lost (S-L15), rather than given up by a
    /// rebalance or a shutdown.
    pub fn is_loss(self) -> bool {
        !matches!(self, StopCause::Rebalance | StopCause::Shutdown)
    }

    /// The cause's name, for logs and metrics: `rebalance`, `shutdown`,
    /// `deadline_passed`, `renewal_refused`, `stale_epoch`, `superseded`.
    pub fn name(self) -> &'static str {
        match self {
            StopCause::Rebalance => "rebalance",
            StopCause::Shutdown => "shutdown",
            StopCause::DeadlinePassed => "deadline_passed",
            StopCause::RenewalRefused => "renewal_refused",
            StopCause::StaleEpoch => "stale_epoch",
            StopCause::Superseded => "superseded",
        }
    }

    pub(crate) const ALL: [StopCause; 6] = [
        StopCause::Rebalance,
        StopCause::Shutdown,
        StopCause::DeadlinePassed,
        StopCause::RenewalRefused,
        StopCause::StaleEpoch,
        StopCause::Superseded,
    ];

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for StopCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What the driver and the engine must act on, from
/// [`LeasePolicy::poll_event`](super::LeasePolicy::poll_event). For each
/// partition they come in this order: `Writable`, then `Stopped`, then
/// `Released`; a partition that never became writable (its acquire or
/// install failed, or the plan moved first) has none.
///
/// Non-exhaustive: new events may come (a match needs a `_` arm).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaseEvent {
    /// The partition is this instance's under `epoch`, and the epoch is
    /// installed at the sink (S-L12): read its rows, and start its writes
    /// through [`begin_write`](super::LeasePolicy::begin_write), until it
    /// stops.
    Writable {
        /// The partition.
        partition: Partition,
        /// Its epoch.
        epoch: Epoch,
    },
    /// No write of the partition starts from now on (S-L16):
    /// [`begin_write`](super::LeasePolicy::begin_write) refuses it. The
    /// engine hands its waiting items over (they stay in the table for the
    /// next owner, counted `handed_over`); its writes in flight end as they
    /// end (written, or `stale_epoch` and handed over). Their grants go
    /// back to [`end_write`](super::LeasePolicy::end_write) as usual.
    Stopped {
        /// The partition.
        partition: Partition,
        /// The epoch it was held under.
        epoch: Epoch,
        /// Why.
        cause: StopCause,
    },
    /// The partition is let go (S-L17): its writes in flight have ended or
    /// passed `write_timeout`, and its release, if it needed one, was
    /// answered or given up on. It counts as one handover.
    Released {
        /// The partition.
        partition: Partition,
        /// The epoch it was held under.
        epoch: Epoch,
    },
}

/// Where one partition stands at this instance, from
/// [`LeasePolicy::partition`](super::LeasePolicy::partition).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PartitionState {
    /// Not held, nor being acquired.
    Idle,
    /// Being acquired: its sink epoch is being read, or its acquire is on
    /// its way.
    Acquiring,
    /// Held, its epoch not yet installed at the sink: nothing of it may be
    /// read or written (S-L12).
    Installing {
        /// The epoch the acquire took.
        epoch: Epoch,
        /// Its local deadline.
        deadline: Time,
    },
    /// Held and installed: writes may start until `deadline` (S-L8).
    Writable {
        /// The epoch.
        epoch: Epoch,
        /// The local deadline (S-L4).
        deadline: Time,
    },
    /// Stopped: waiting for its writes in flight before it is released
    /// (S-L17), or being released.
    Stopping {
        /// The epoch it was held under.
        epoch: Epoch,
        /// Why it stopped.
        cause: StopCause,
    },
}

/// Why [`begin_write`](super::LeasePolicy::begin_write) refused a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum NotWritable {
    /// This instance does not hold the partition, or is still acquiring
    /// it.
    NotHeld,
    /// Held, its epoch not installed at the sink yet (S-L12).
    Installing,
    /// Stopped (S-L16): no write starts for it until it is acquired
    /// again.
    Stopped(StopCause),
}

impl fmt::Display for NotWritable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotWritable::NotHeld => f.write_str("partition not held"),
            NotWritable::Installing => f.write_str("partition's epoch not installed yet"),
            NotWritable::Stopped(cause) => write!(f, "partition stopped ({cause})"),
        }
    }
}

impl std::error::Error for NotWritable {}
