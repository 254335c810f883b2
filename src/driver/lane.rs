//! The request path's hand-off channel (S-W19), as small per item as the
//! config allows.
//!
//! An item waits here between its stage and the engine's intake; a stalled
//! writer (a starved runtime) leaves every admitted item here, so its size
//! per item is the outbox's memory per item then. The weight and the stamp
//! travel only when something reads them before the intake: the weight
//! when `capacity_bytes` reserves bytes on the request path (the intake
//! must count what was reserved), the stamp when a linger or a
//! `max_item_age` reads the staging time (S-A3, S-R3). Otherwise a
//! hand-off is the tenant and the item alone, and the engine weighs the
//! item as it takes it in (weighers are pure, S-B5).
//!
//! Both lanes are tokio's unbounded channel: a lock-free list the crate
//! already depends on, whose `close` is the shutdown fence (a send either
//! lands before it, and is received, or fails), and whose receiver wakes
//! the writer only when it is waiting for it.

use std::task::{Context, Poll};

use tokio::sync::mpsc::error::{SendError, TryRecvError};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use crate::core::{Handoff, Time};

/// The sending side, one per outbox, used by every stage.
pub(crate) enum LaneTx<K, I> {
    /// The tenant and the item only.
    Plain(UnboundedSender<(K, I)>),
    /// With the weight and the stamp.
    Full(UnboundedSender<Handoff<K, I>>),
}

/// The receiving side, held under the state's lock.
pub(crate) enum LaneRx<K, I> {
    Plain(UnboundedReceiver<(K, I)>),
    Full(UnboundedReceiver<Handoff<K, I>>),
}

/// A hand-off channel: `full` when the weight or the stamp must travel.
pub(crate) fn lane<K, I>(full: bool) -> (LaneTx<K, I>, LaneRx<K, I>) {
    if full {
        let (tx, rx) = unbounded_channel();
        (LaneTx::Full(tx), LaneRx::Full(rx))
    } else {
        let (tx, rx) = unbounded_channel();
        (LaneTx::Plain(tx), LaneRx::Plain(rx))
    }
}

fn plain<K, I>((tenant, item): (K, I)) -> Handoff<K, I> {
    Handoff {
        tenant,
        item,
        weight: None,
        at: None,
    }
}

impl<K, I> LaneTx<K, I> {
    /// Sends one admitted item; hands it back once the lane is closed (the
    /// fence is up, S-W9). `weight` and `at` are dropped on a plain lane.
    pub(crate) fn send(
        &self,
        tenant: K,
        item: I,
        weight: u64,
        at: Option<Time>,
    ) -> Result<(), (K, I)> {
        match self {
            LaneTx::Plain(tx) => tx.send((tenant, item)).map_err(|SendError(h)| h),
            LaneTx::Full(tx) => tx
                .send(Handoff {
                    tenant,
                    item,
                    weight: Some(weight),
                    at,
                })
                .map_err(|SendError(h)| (h.tenant, h.item)),
        }
    }

    /// Whether the weight and the stamp travel.
    pub(crate) fn is_full(&self) -> bool {
        matches!(self, LaneTx::Full(_))
    }

    /// Whether the lane is closed: the fence is up (S-W9).
    pub(crate) fn is_closed(&self) -> bool {
        match self {
            LaneTx::Plain(tx) => tx.is_closed(),
            LaneTx::Full(tx) => tx.is_closed(),
        }
    }
}

impl<K, I> LaneRx<K, I> {
    /// Closes the lane: every later send fails (S-W9).
    pub(crate) fn close(&mut self) {
        match self {
            LaneRx::Plain(rx) => rx.close(),
            LaneRx::Full(rx) => rx.close(),
        }
    }

    /// Hand-offs queued now.
    pub(crate) fn len(&self) -> usize {
        match self {
            LaneRx::Plain(rx) => rx.len(),
            LaneRx::Full(rx) => rx.len(),
        }
    }

    /// The next hand-off, if one is queued.
    pub(crate) fn try_recv(&mut self) -> Result<Handoff<K, I>, TryRecvError> {
        match self {
            LaneRx::Plain(rx) => rx.try_recv().map(plain),
            LaneRx::Full(rx) => rx.try_recv(),
        }
    }

    /// Polls for the next hand-off; `None` once closed and empty.
    pub(crate) fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Handoff<K, I>>> {
        match self {
            LaneRx::Plain(rx) => rx.poll_recv(cx).map(|h| h.map(plain)),
            LaneRx::Full(rx) => rx.poll_recv(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_hand_off_is_the_tenant_and_the_item_alone() {
        // The point of the plain lane: what a stalled writer holds per item.
        assert_eq!(std::mem::size_of::<(u64, u64)>(), 16);
        let (tx, mut rx) = lane::<u64, u64>(false);
        tx.send(1, 2, 99, Some(Time::ZERO)).unwrap();
        let h = rx.try_recv().unwrap();
        assert_eq!((h.tenant, h.item, h.weight, h.at), (1, 2, None, None));
        rx.close();
        assert!(tx.is_closed());
        assert_eq!(tx.send(3, 4, 0, None), Err((3, 4)));
    }

    #[test]
    fn a_full_hand_off_carries_the_weight_and_the_stamp() {
        let (tx, mut rx) = lane::<u64, u64>(true);
        tx.send(1, 2, 99, Some(Time::ZERO)).unwrap();
        assert_eq!(rx.len(), 1);
        let h = rx.try_recv().unwrap();
        assert_eq!((h.weight, h.at), (Some(99), Some(Time::ZERO)));
    }
}
