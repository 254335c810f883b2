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
//!
//! The intake receives what is queued in chunks ([`LaneRx::recv_queued`]),
//! not one `try_recv` at a time: each receive updates the channel's
//! message count, an atomic every send updates too, so one update per
//! chunk instead of one per item keeps the stages' sends off a contended
//! cache line while the writer takes items in (on a 2-core machine a send
//! cost about 1.5x more with a `try_recv` per item).

use std::task::{Context, Poll, Waker};

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
pub(crate) struct LaneRx<K, I> {
    rx: Rx<K, I>,
    /// The waker of the last [`poll_recv`](LaneRx::poll_recv): the
    /// writer's. Receiving a chunk may leave a waker with the channel (it
    /// registers one when it first finds nothing), and it must be this one,
    /// or a later stage would wake nobody.
    waker: Option<Waker>,
}

/// The channel, with the buffer its chunks are received into.
enum Rx<K, I> {
    Plain(UnboundedReceiver<(K, I)>, Vec<(K, I)>),
    Full(UnboundedReceiver<Handoff<K, I>>, Vec<Handoff<K, I>>),
}

/// The most hand-offs [`LaneRx::recv_queued`] receives at once: what the
/// chunk buffer holds at most, so a burst leaves no large buffer behind.
pub(crate) const CHUNK: usize = 256;

/// A hand-off channel: `full` when the weight or the stamp must travel.
pub(crate) fn lane<K, I>(full: bool) -> (LaneTx<K, I>, LaneRx<K, I>) {
    if full {
        let (tx, rx) = unbounded_channel();
        let rx = Rx::Full(rx, Vec::new());
        (LaneTx::Full(tx), LaneRx { rx, waker: None })
    } else {
        let (tx, rx) = unbounded_channel();
        let rx = Rx::Plain(rx, Vec::new());
        (LaneTx::Plain(tx), LaneRx { rx, waker: None })
    }
}

/// A received chunk, drained in order.
pub(crate) enum Chunk<'a, K, I> {
    Plain(std::vec::Drain<'a, (K, I)>),
    Full(std::vec::Drain<'a, Handoff<K, I>>),
}

impl<K, I> Iterator for Chunk<'_, K, I> {
    type Item = Handoff<K, I>;

    fn next(&mut self) -> Option<Handoff<K, I>> {
        match self {
            Chunk::Plain(d) => d.next().map(plain),
            Chunk::Full(d) => d.next(),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        match self {
            Chunk::Plain(d) => d.size_hint(),
            Chunk::Full(d) => d.size_hint(),
        }
    }
}

impl<K, I> ExactSizeIterator for Chunk<'_, K, I> {}

fn plain<K, I>((tenant, item): (K, I)) -> Handoff<K, I> {
    Handoff {
        tenant,
        item,
        weight: None,
        at: None,
        refusal: None,
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
                    refusal: None,
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
        match &mut self.rx {
            Rx::Plain(rx, _) => rx.close(),
            Rx::Full(rx, _) => rx.close(),
        }
    }

    /// Hand-offs queued now.
    pub(crate) fn len(&self) -> usize {
        match &self.rx {
            Rx::Plain(rx, _) => rx.len(),
            Rx::Full(rx, _) => rx.len(),
        }
    }

    /// The next hand-off, if one is queued.
    pub(crate) fn try_recv(&mut self) -> Result<Handoff<K, I>, TryRecvError> {
        match &mut self.rx {
            Rx::Plain(rx, _) => rx.try_recv().map(plain),
            Rx::Full(rx, _) => rx.try_recv(),
        }
    }

    /// Receives up to `limit` (at most [`CHUNK`]) queued hand-offs at once,
    /// in order, without waiting; `None` if none can be received now (none
    /// is visible yet, or the calling task's budget is spent: then
    /// [`try_recv`](Self::try_recv) still works).
    ///
    /// It polls with the writer's waker, the one the channel would keep
    /// anyway (before the writer's first wait, with a no-op one: the
    /// writer registers its own when it first waits).
    pub(crate) fn recv_queued(&mut self, limit: usize) -> Option<Chunk<'_, K, I>> {
        let mut cx = Context::from_waker(self.waker.as_ref().unwrap_or(Waker::noop()));
        let limit = limit.min(CHUNK);
        match &mut self.rx {
            Rx::Plain(rx, buf) => {
                buf.clear();
                match rx.poll_recv_many(&mut cx, buf, limit) {
                    Poll::Ready(n) if n > 0 => Some(Chunk::Plain(buf.drain(..))),
                    _ => None,
                }
            }
            Rx::Full(rx, buf) => {
                buf.clear();
                match rx.poll_recv_many(&mut cx, buf, limit) {
                    Poll::Ready(n) if n > 0 => Some(Chunk::Full(buf.drain(..))),
                    _ => None,
                }
            }
        }
    }

    /// Polls for the next hand-off; `None` once closed and empty. The
    /// writer's call: its waker is kept for [`recv_queued`](Self::recv_queued).
    pub(crate) fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Handoff<K, I>>> {
        if !self.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            self.waker = Some(cx.waker().clone());
        }
        match &mut self.rx {
            Rx::Plain(rx, _) => rx.poll_recv(cx).map(|h| h.map(plain)),
            Rx::Full(rx, _) => rx.poll_recv(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

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
    fn a_chunk_is_what_is_queued_in_order_up_to_the_limit_and_chunk() {
        for full in [false, true] {
            let (tx, mut rx) = lane::<u64, u64>(full);
            assert!(rx.recv_queued(10).is_none(), "nothing queued");
            for i in 0..(CHUNK as u64 + 10) {
                tx.send(i % 3, i, 1, None).unwrap();
            }
            let mut items =
                |limit| -> Vec<u64> { rx.recv_queued(limit).unwrap().map(|h| h.item).collect() };
            assert_eq!(items(4), [0, 1, 2, 3], "full {full}: the limit");
            let (n, c) = (CHUNK as u64 + 10, CHUNK as u64);
            assert_eq!(items(usize::MAX), (4..4 + c).collect::<Vec<_>>(), "CHUNK");
            assert_eq!(items(usize::MAX), (4 + c..n).collect::<Vec<_>>());
            assert!(rx.recv_queued(1).is_none());
            assert_eq!(rx.len(), 0);
        }
    }

    /// Counts its wake-ups.
    struct Counting(AtomicUsize);

    impl std::task::Wake for Counting {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_chunk_that_finds_nothing_leaves_the_writers_waker_with_the_channel() {
        // The channel registers the polling waker when it finds nothing: a
        // no-op one there would leave the waiting writer asleep through
        // the next stages (a lost wake-up).
        let writer = Arc::new(Counting(AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&writer));
        let (tx, mut rx) = lane::<u64, u64>(false);
        let mut cx = Context::from_waker(&waker);
        assert!(rx.poll_recv(&mut cx).is_pending(), "the writer waits");
        assert!(rx.recv_queued(8).is_none(), "an intake finds nothing");
        tx.send(1, 2, 0, None).unwrap();
        assert_eq!(
            writer.0.load(Ordering::SeqCst),
            1,
            "the stage wakes the writer"
        );
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
