//! One partition's phase at this instance, and the bookkeeping of requests
//! in flight.

use super::super::time::Time;
use super::event::{PartitionState, StopCause};
use super::id::{Epoch, Partition};
use super::store::RequestId;

/// Where a partition this instance has business with stands. A partition
/// with none is idle (not in the map).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Phase {
    /// Its sink epoch is being read (S-L10).
    Floors { req: RequestId },
    /// Its acquire is to be sent (`req: None`) or on its way.
    Acquiring {
        req: Option<RequestId>,
        floor: Epoch,
    },
    /// Held; its epoch install is to be sent at `retry_at` (`req: None`)
    /// or on its way (S-L12).
    Installing {
        epoch: Epoch,
        deadline: Time,
        req: Option<RequestId>,
        retry_at: Time,
    },
    /// Held and installed: writes may start before `deadline`.
    Writable { epoch: Epoch, deadline: Time },
    /// No write starts; waiting for the writes in flight (S-L17).
    Stopping {
        epoch: Epoch,
        /// The lease's local deadline, while it is still renewed.
        deadline: Time,
        cause: StopCause,
        /// Whether a release statement is due once drained.
        release: bool,
        /// Whether the lease is still renewed while it drains (a rebalance
        /// or a shutdown, not a loss).
        renewing: bool,
        /// Whether it was writable (and so owes a `Released` event).
        announced: bool,
    },
    /// Its release is on its way.
    Releasing {
        epoch: Epoch,
        cause: StopCause,
        req: RequestId,
        announced: bool,
    },
}

impl Phase {
    /// The lease to renew, if it is held and renewed: its epoch and
    /// deadline.
    pub(super) fn renewable(&self, now: Time) -> Option<Epoch> {
        match *self {
            Phase::Installing {
                epoch, deadline, ..
            }
            | Phase::Writable { epoch, deadline }
            | Phase::Stopping {
                epoch,
                deadline,
                renewing: true,
                ..
            } if deadline > now => Some(epoch),
            _ => None,
        }
    }

    /// The epoch it is held under, if a lease was granted.
    pub(super) fn epoch(&self) -> Option<Epoch> {
        match *self {
            Phase::Floors { .. } | Phase::Acquiring { .. } => None,
            Phase::Installing { epoch, .. }
            | Phase::Writable { epoch, .. }
            | Phase::Stopping { epoch, .. }
            | Phase::Releasing { epoch, .. } => Some(epoch),
        }
    }

    /// The public view of it.
    pub(super) fn state(&self) -> PartitionState {
        match *self {
            Phase::Floors { .. } | Phase::Acquiring { .. } => PartitionState::Acquiring,
            Phase::Installing {
                epoch, deadline, ..
            } => PartitionState::Installing { epoch, deadline },
            Phase::Writable { epoch, deadline } => PartitionState::Writable { epoch, deadline },
            Phase::Stopping { epoch, cause, .. } | Phase::Releasing { epoch, cause, .. } => {
                PartitionState::Stopping { epoch, cause }
            }
        }
    }
}

/// A request handed out and not yet answered or given up.
#[derive(Clone, Debug)]
pub(super) struct Pending {
    /// When it was polled, taken as when it was sent (S-L4).
    pub(super) sent: Time,
    pub(super) kind: Kind,
}

/// What a request was, as far as its reply needs.
#[derive(Clone, Debug)]
pub(super) enum Kind {
    Heartbeat,
    Floors(Vec<Partition>),
    Acquire(Vec<Partition>),
    Renew(Vec<(Partition, Epoch)>),
    Install(Partition, Epoch),
    Release(Vec<(Partition, Epoch)>),
    Leave,
}

impl Kind {
    pub(super) fn name(&self) -> &'static str {
        match self {
            Kind::Heartbeat => "heartbeat",
            Kind::Floors(_) => "sink_epochs",
            Kind::Acquire(_) => "acquire",
            Kind::Renew(_) => "renew",
            Kind::Install(..) => "install",
            Kind::Release(_) => "release",
            Kind::Leave => "leave",
        }
    }
}
