//! The request path's hand-off queue (S-W19), as small per item as the
//! config allows: a queue with a fence, from the stages to the engine's
//! intake. Its own module, outside the driver: a data structure that
//! decides nothing and does no IO.
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
//! The queue is a buffer under a lock held for one push or one exchange
//! of buffers, never for the writer's work: a stage pushes its item; the
//! intake ([`LaneRx::take_in`]) exchanges the whole buffer for an empty
//! one and takes the items in with the lock released. The fence is a
//! flag set under the same lock, so a stage either lands before it, and
//! is taken in, or is handed back. The writer's round takes in at most
//! [`WRITER_INTAKE`] (the rest waits in the intake's buffer, first in
//! line), so a stream of stages faster than the intake cannot hold one
//! poll of the writer's task for ever. Why not a lock-free channel: tokio's
//! unbounded channel cost a stage five atomic read-modify-writes, on
//! lines the writer's intake touched too, so a stage cost up to twice as
//! much while the writer kept up as while it lagged (docs/benchmarks.md);
//! here a stage costs one lock and one unlock, and the buffer the intake
//! hands back is reused, not allocated again.

use std::collections::VecDeque;
use std::hash::Hash;
use std::mem;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

use crate::core::{Admission, Engine, Handoff, Time};

/// The sending side, one per outbox, used by every stage.
pub(crate) enum LaneTx<K, I> {
    /// The tenant and the item only.
    Plain(Arc<Queue<(K, I)>>),
    /// With the weight and the stamp.
    Full(Arc<Queue<Handoff<K, I>>>),
}

/// The receiving side, held under the state's lock.
pub(crate) struct LaneRx<K, I> {
    rx: Rx<K, I>,
}

/// The queue, with the buffer the intake exchanges for it: empty between
/// intakes, but for what a bounded intake left (the oldest hand-offs).
enum Rx<K, I> {
    Plain(Arc<Queue<(K, I)>>, VecDeque<(K, I)>),
    Full(Arc<Queue<Handoff<K, I>>>, VecDeque<Handoff<K, I>>),
}

/// A queue of hand-offs: the stages push under its lock, the intake
/// exchanges its buffer for an empty one under the same lock.
pub(crate) struct Queue<M> {
    inner: Mutex<Inner<M>>,
    /// The fence, readable without the lock (set under it, once).
    closed: AtomicBool,
}

struct Inner<M> {
    items: Vec<M>,
    closed: bool,
    /// The writer, while it waits for a stage: the next push wakes it.
    waiting: Option<Waker>,
}

/// The most bytes of room a buffer keeps between intakes: a burst leaves
/// no large buffer behind (the queue holds at most two of them then,
/// whatever the burst), a steady stream reuses its buffers.
pub(crate) const SPARE_BYTES: usize = 64 << 10;

/// The most hand-offs the writer's drain round takes in (S-W19): a round
/// stays short when stages come faster than the intake takes them in, so
/// the writer yields to its runtime between rounds (and a runtime shut
/// down under a stream of stages stops it); the rest waits, in order,
/// for the next round. Every other holder of the engine takes all.
pub(crate) const WRITER_INTAKE: usize = 16_384;

/// Where [`LaneRx::take_in`] puts what it receives: the engine, the
/// admission whose reservations the items hold, and the engine's share of
/// them (items, bytes).
pub(crate) type To<'a, K, I> = (&'a mut Engine<K, I>, &'a Admission, &'a mut (u64, u64));

/// A hand-off queue: `full` when the weight or the stamp must travel.
pub(crate) fn lane<K, I>(full: bool) -> (LaneTx<K, I>, LaneRx<K, I>) {
    if full {
        let q = Arc::new(Queue::new());
        (
            LaneTx::Full(Arc::clone(&q)),
            LaneRx {
                rx: Rx::Full(q, VecDeque::new()),
            },
        )
    } else {
        let q = Arc::new(Queue::new());
        (
            LaneTx::Plain(Arc::clone(&q)),
            LaneRx {
                rx: Rx::Plain(q, VecDeque::new()),
            },
        )
    }
}

impl<M> Queue<M> {
    fn new() -> Self {
        Queue {
            inner: Mutex::new(Inner {
                items: Vec::new(),
                closed: false,
                waiting: None,
            }),
            closed: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner<M>> {
        // Nothing under this lock panics (a failed allocation aborts), so
        // a poisoned lock is taken as is.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `m`, waking the writer if it waits; hands `m` back once the
    /// fence is up.
    #[inline]
    fn push(&self, m: M) -> Result<(), M> {
        let mut q = self.lock();
        if q.closed {
            return Err(m);
        }
        q.items.push(m);
        let waiting = q.waiting.take();
        drop(q);
        if let Some(w) = waiting {
            w.wake();
        }
        Ok(())
    }

    /// Exchanges the queue for `spare` (empty); with `fence`, closes it first.
    fn take(&self, spare: &mut Vec<M>, fence: bool) {
        let mut q = self.lock();
        if fence {
            q.closed = true;
            self.closed.store(true, Ordering::Release);
        }
        mem::swap(&mut q.items, spare);
    }

    /// Ready when something is queued; else the next push wakes `cx`'s
    /// waker (never once the fence is up: nothing more can come).
    fn poll_wait(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut q = self.lock();
        if !q.items.is_empty() {
            return Poll::Ready(());
        }
        if !q.closed && !q.waiting.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            q.waiting = Some(cx.waker().clone());
        }
        Poll::Pending
    }
}

impl<K, I> LaneTx<K, I> {
    /// Sends one admitted item; hands it back once the lane is closed (the
    /// fence is up, S-W9). `weight` and `at` are dropped on a plain lane.
    // Inlined: the request path's one send (issue 24's instruction count).
    #[inline]
    pub(crate) fn send(
        &self,
        tenant: K,
        item: I,
        weight: u64,
        at: Option<Time>,
    ) -> Result<(), (K, I)> {
        match self {
            LaneTx::Plain(q) => q.push((tenant, item)),
            LaneTx::Full(q) => q
                .push(Handoff {
                    tenant,
                    item,
                    weight: Some(weight),
                    at,
                    refusal: None,
                })
                .map_err(|h| (h.tenant, h.item)),
        }
    }

    /// Whether the lane is closed: the fence is up (S-W9).
    #[inline]
    pub(crate) fn is_closed(&self) -> bool {
        match self {
            LaneTx::Plain(q) => q.closed.load(Ordering::Acquire),
            LaneTx::Full(q) => q.closed.load(Ordering::Acquire),
        }
    }
}

impl<K: Ord + Hash + Clone, I> LaneRx<K, I> {
    /// Moves the hand-offs staged so far into the engine's intake, in
    /// their order (S-W19). With `fence`, closes the lane first and takes
    /// in every stage that got past it (S-W9): call it right before the
    /// engine's fence goes up, in the same hold of the lock, so no stage is
    /// told `Accepted` and then refused. Without it, takes at most `most`
    /// (the oldest; [`WRITER_INTAKE`] for the writer's round, `usize::MAX`
    /// for every other holder): the rest waits, in order, for the next
    /// call. Returns whether the writer must drain.
    pub(crate) fn take_in(&mut self, to: To<'_, K, I>, fence: bool, most: usize) -> bool {
        let most = if fence { usize::MAX } else { most };
        match &mut self.rx {
            Rx::Plain(q, buf) => take_from(q, buf, Handoff::plain, to, fence, most),
            Rx::Full(q, buf) => take_from(q, buf, std::convert::identity, to, fence, most),
        }
    }
}

impl<K, I> LaneRx<K, I> {
    /// Waits for a hand-off: ready when one is queued (for the next
    /// [`take_in`](Self::take_in)); pending for good once the lane is
    /// closed and empty. The writer's call: the next stage wakes it.
    pub(crate) fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        match &self.rx {
            Rx::Plain(_, buf) if !buf.is_empty() => Poll::Ready(()),
            Rx::Full(_, buf) if !buf.is_empty() => Poll::Ready(()),
            Rx::Plain(q, _) => q.poll_wait(cx),
            Rx::Full(q, _) => q.poll_wait(cx),
        }
    }
}

/// [`LaneRx::take_in`] on one kind of queue, whose messages `into` makes
/// hand-offs, through `buf`: first what the last bounded intake left,
/// then, if `most` leaves room, the whole queue at once by one exchange,
/// in its order; what lands during the intake waits for the next (a
/// stream of stages cannot keep the engine's lock held). Checks (in debug
/// builds) that the engine took in what was reserved.
fn take_from<K: Ord + Hash + Clone, I, M>(
    q: &Queue<M>,
    buf: &mut VecDeque<M>,
    into: fn(M) -> Handoff<K, I>,
    (engine, admission, held): To<'_, K, I>,
    fence: bool,
    most: usize,
) -> bool {
    let mut intake = |buf: &mut VecDeque<M>, n: usize| {
        let (mut reserved, mut weighed) = ((0u64, 0u64), true);
        let count = |h: &Handoff<K, I>| {
            reserved.0 += 1;
            reserved.1 = reserved.1.saturating_add(h.weight.unwrap_or(0));
            weighed &= h.weight.is_some();
        };
        let i = admission.intake(engine, held, buf.drain(..n).map(into).inspect(count));
        let took = (
            i.accepted + i.refused,
            i.accepted_bytes.saturating_add(i.refused_bytes),
        );
        debug_assert_eq!(reserved.0, took.0);
        debug_assert!(!weighed || reserved.1 == took.1);
        i.wake
    };
    let (mut wake, mut room) = (false, most);
    if !buf.is_empty() {
        let n = buf.len().min(room);
        wake |= intake(buf, n);
        room -= n;
        if !buf.is_empty() {
            return wake;
        }
    }
    if room == 0 && !fence {
        return wake;
    }
    // Empty: an exchange that keeps the buffers' room (both conversions
    // take no copy), but no burst's room: bounded rounds that emptied a
    // burst's buffer would hand it to the queue, kept while idle.
    let size = mem::size_of::<M>().max(1);
    if buf.capacity().saturating_mul(size) > SPARE_BYTES {
        buf.shrink_to(SPARE_BYTES / size);
    }
    let mut spare = Vec::from(mem::take(buf));
    q.take(&mut spare, fence);
    *buf = VecDeque::from(spare);
    let n = buf.len().min(room);
    if n > 0 {
        wake |= intake(buf, n);
    }
    if buf.is_empty() && buf.capacity().saturating_mul(size) > SPARE_BYTES {
        buf.shrink_to(SPARE_BYTES / size);
    }
    wake
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::*;
    use crate::core::Config;

    /// A fresh engine, its admission and the engine's share of it.
    fn engine() -> (Engine<u64, u64>, Admission, (u64, u64)) {
        let engine = Engine::new(Config::default()).unwrap();
        let admission = Admission::new(engine.config());
        (engine, admission, (0, 0))
    }

    #[test]
    fn a_plain_hand_off_is_the_tenant_and_the_item_alone() {
        // The point of the plain lane: what a stalled writer holds per item.
        assert_eq!(std::mem::size_of::<(u64, u64)>(), 16);
        let h = Handoff::plain((1u64, 2u64));
        assert_eq!((h.tenant, h.item, h.weight, h.at), (1, 2, None, None));
    }

    #[test]
    fn the_fence_takes_in_what_got_past_it_and_hands_later_items_back() {
        for full in [false, true] {
            let (tx, mut rx) = lane::<u64, u64>(full);
            let (mut e, a, mut held) = engine();
            tx.send(1, 2, 0, Some(Time::ZERO)).unwrap();
            rx.take_in((&mut e, &a, &mut held), true, usize::MAX);
            assert_eq!((e.pending(), held.0), (1, 1), "full {full}");
            assert!(tx.is_closed());
            assert_eq!(tx.send(3, 4, 0, None), Err((3, 4)));
        }
    }

    #[test]
    fn take_in_takes_everything_queued_however_much() {
        for full in [false, true] {
            let (tx, mut rx) = lane::<u64, u64>(full);
            let (mut e, a, mut held) = engine();
            assert!(
                !rx.take_in((&mut e, &a, &mut held), false, usize::MAX),
                "nothing queued"
            );
            let mut n = 0;
            // Past the room a spare buffer keeps, then within it again.
            for round in [SPARE_BYTES as u64 / 4, 10] {
                for i in 0..round {
                    tx.send(i % 3, i, 1, None).unwrap();
                }
                n += round;
                rx.take_in((&mut e, &a, &mut held), false, usize::MAX);
                assert_eq!((e.pending(), held.0), (n, n), "full {full}");
            }
        }
    }

    /// An engine whose weigher stages another item (tenant 9) into `tx`
    /// for each item it weighs, `cap` in all: sends that land while the
    /// intake runs. (Weighers are pure, S-B5; this one stands in for the
    /// other threads' stages.)
    fn restaging(tx: Arc<LaneTx<u64, u64>>, cap: u64) -> Engine<u64, u64> {
        let sent = AtomicUsize::new(0);
        let weigher = move |_: &u64| {
            if (sent.fetch_add(1, Ordering::SeqCst) as u64) < cap {
                tx.send(9, 0, 1, None).unwrap();
            }
            1
        };
        Engine::with_weigher(Config::default(), weigher).unwrap()
    }

    #[test]
    fn take_in_takes_what_was_queued_at_its_call_not_what_lands_during_it() {
        // S-W19: a stream of new stages cannot keep the lock held; what
        // lands during an intake waits for the next. (The weigher's sends
        // also prove the queue's lock is not held during the intake: they
        // would deadlock.)
        let n = 300;
        let (tx, mut rx) = lane::<u64, u64>(false);
        let tx = Arc::new(tx);
        let mut e = restaging(Arc::clone(&tx), 10 * n);
        let (a, mut held) = (Admission::new(e.config()), (0, 0));
        for i in 0..n {
            tx.send(i % 7, i, 1, None).unwrap();
        }
        rx.take_in((&mut e, &a, &mut held), false, usize::MAX);
        assert_eq!((e.pending(), held.0), (n, n));
        // The next intake takes what landed during this one.
        rx.take_in((&mut e, &a, &mut held), false, usize::MAX);
        assert_eq!((e.pending(), held.0), (2 * n, 2 * n));
    }

    #[test]
    fn a_bounded_intake_takes_the_oldest_and_leaves_the_rest_first_in_line() {
        // The writer's round (S-W19): at most `most`, the oldest; what it
        // leaves is taken in before anything queued after it, and keeps
        // the writer's wait ready; an unbounded holder takes everything.
        let (tx, mut rx) = lane::<u64, u64>(false);
        let (mut e, a, mut held) = engine();
        for i in 0..10 {
            tx.send(1, i, 1, None).unwrap();
        }
        rx.take_in((&mut e, &a, &mut held), false, 4);
        assert_eq!(e.pending(), 4);
        let mut cx = Context::from_waker(Waker::noop());
        assert!(rx.poll_recv(&mut cx).is_ready(), "six left: ready");
        for i in 10..13 {
            tx.send(1, i, 1, None).unwrap();
        }
        rx.take_in((&mut e, &a, &mut held), false, 4);
        assert_eq!(e.pending(), 8, "the oldest four of what is left");
        rx.take_in((&mut e, &a, &mut held), false, 4);
        assert_eq!(e.pending(), 12, "the last two left, then two queued");
        rx.take_in((&mut e, &a, &mut held), false, usize::MAX);
        assert_eq!((e.pending(), held.0), (13, 13));
        assert!(rx.poll_recv(&mut cx).is_pending(), "nothing left");
        // In staging order: the tenant's items come out 0, 1, 2, ...
        let w = e.poll_write(Time::ZERO).expect("a write");
        assert_eq!(w.items, (0..13).collect::<Vec<u64>>());
    }

    #[test]
    fn a_fenced_intake_takes_what_a_bounded_one_left_and_the_queue() {
        let (tx, mut rx) = lane::<u64, u64>(true);
        let (mut e, a, mut held) = engine();
        for i in 0..10 {
            tx.send(2, i, 1, None).unwrap();
        }
        rx.take_in((&mut e, &a, &mut held), false, 3);
        tx.send(2, 10, 1, None).unwrap();
        rx.take_in((&mut e, &a, &mut held), true, 3);
        assert_eq!((e.pending(), held.0), (11, 11), "the fence takes all");
        assert_eq!(tx.send(2, 11, 1, None), Err((2, 11)));
    }

    #[test]
    fn a_burst_leaves_no_large_buffer_behind() {
        let (tx, mut rx) = lane::<u64, u64>(false);
        let (mut e, a, mut held) = engine();
        for i in 0..SPARE_BYTES as u64 {
            tx.send(i % 5, i, 1, None).unwrap();
        }
        rx.take_in((&mut e, &a, &mut held), false, usize::MAX);
        let Rx::Plain(_, buf) = &rx.rx else {
            unreachable!("a plain lane")
        };
        let kept = buf.capacity() * mem::size_of::<(u64, u64)>();
        assert!(
            kept <= SPARE_BYTES,
            "the burst's buffer shrunk: {kept} bytes"
        );
        // A small intake's buffer is kept for the stages to reuse.
        for i in 0..10 {
            tx.send(1, i, 1, None).unwrap();
        }
        rx.take_in((&mut e, &a, &mut held), false, usize::MAX);
        let Rx::Plain(_, buf) = &rx.rx else {
            unreachable!("a plain lane")
        };
        assert!(buf.capacity() >= 10, "kept: {}", buf.capacity());
    }

    #[test]
    fn a_burst_taken_in_by_bounded_rounds_leaves_no_large_buffer_behind() {
        // A review's find: the round that took the last of a burst's
        // leftovers handed the burst's emptied buffer to the queue, which
        // kept it (4 MiB here) while the outbox sat idle.
        let (tx, mut rx) = lane::<u64, u64>(false);
        let (mut e, a, mut held) = engine();
        let n = 200_000u64;
        for i in 0..n {
            tx.send(i % 5, i, 1, None).unwrap();
        }
        while held.0 < n {
            rx.take_in((&mut e, &a, &mut held), false, WRITER_INTAKE);
        }
        let Rx::Plain(q, buf) = &rx.rx else {
            unreachable!("a plain lane")
        };
        let size = mem::size_of::<(u64, u64)>();
        let (queued, spare) = (q.lock().items.capacity() * size, buf.capacity() * size);
        assert!(
            queued <= SPARE_BYTES && spare <= SPARE_BYTES,
            "queue {queued} B, spare {spare} B"
        );
    }

    #[test]
    fn every_stage_racing_the_fence_is_taken_in_or_handed_back() {
        // S-W9 across threads: a send either lands before the fence and
        // is taken in by the fenced intake, or is handed back; none is
        // lost and none is both.
        for full in [false, true] {
            let (tx, mut rx) = lane::<u64, u64>(full);
            let tx = Arc::new(tx);
            let (mut e, a, mut held) = engine();
            let senders: Vec<_> = (0..3u64)
                .map(|t| {
                    let tx = Arc::clone(&tx);
                    std::thread::spawn(move || {
                        let mut accepted = 0u64;
                        for i in 0..20_000u64 {
                            match tx.send(t, i, 1, None) {
                                Ok(()) => accepted += 1,
                                Err(back) => {
                                    assert_eq!(back, (t, i), "the item handed back");
                                    assert!(tx.is_closed());
                                }
                            }
                        }
                        accepted
                    })
                })
                .collect();
            // Some intakes while they send, then the fence.
            for _ in 0..50 {
                rx.take_in((&mut e, &a, &mut held), false, usize::MAX);
            }
            rx.take_in((&mut e, &a, &mut held), true, usize::MAX);
            let accepted: u64 = senders.into_iter().map(|s| s.join().unwrap()).sum();
            // Nothing lands after the fenced intake.
            assert!(!rx.take_in((&mut e, &a, &mut held), false, usize::MAX));
            assert_eq!((e.pending(), held.0), (accepted, accepted), "full {full}");
        }
    }

    #[test]
    fn items_that_reach_an_engine_past_its_fence_are_counted_lost() {
        // The engine's fence up, the lane's not yet (S-W9): what the
        // intake takes is refused there, counted lost under `shutdown`,
        // and nothing of it is held.
        for full in [false, true] {
            let (tx, mut rx) = lane::<u64, u64>(full);
            let (mut e, a, mut held) = engine();
            tx.send(1, 1, 0, None).unwrap();
            rx.take_in((&mut e, &a, &mut held), false, usize::MAX);
            let _ = e.shutdown(Time::ZERO, Time::ZERO);
            for i in 0..3 {
                tx.send(2, i, 0, None).unwrap();
            }
            rx.take_in((&mut e, &a, &mut held), false, usize::MAX);
            let lost = e.counters().lost(crate::core::LostReason::Shutdown);
            assert_eq!((lost, held.0), (3, 1), "full {full}");
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
    fn a_stage_wakes_the_writer_once_per_wait() {
        // The writer's waker is kept only while it waits (it found nothing
        // queued): the next stage wakes it, later ones do not; once the
        // fence is up and the queue empty, it is never kept (nothing more
        // can come).
        let writer = Arc::new(Counting(AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&writer));
        let (tx, mut rx) = lane::<u64, u64>(false);
        let (mut e, a, mut held) = engine();
        let mut cx = Context::from_waker(&waker);
        assert!(rx.poll_recv(&mut cx).is_pending(), "the writer waits");
        tx.send(1, 2, 0, None).unwrap();
        assert!(rx.poll_recv(&mut cx).is_ready(), "queued for the intake");
        tx.send(1, 3, 0, None).unwrap();
        rx.take_in((&mut e, &a, &mut held), false, usize::MAX);
        assert_eq!(e.pending(), 2, "both queued ones");
        assert!(rx.poll_recv(&mut cx).is_pending(), "the writer waits again");
        assert!(!rx.take_in((&mut e, &a, &mut held), false, usize::MAX));
        tx.send(1, 4, 0, None).unwrap();
        tx.send(1, 5, 0, None).unwrap();
        assert_eq!(writer.0.load(Ordering::SeqCst), 2, "once per wait");
        rx.take_in((&mut e, &a, &mut held), true, usize::MAX);
        assert!(rx.poll_recv(&mut cx).is_pending(), "closed and empty");
        assert_eq!(tx.send(1, 6, 0, None), Err((1, 6)));
        assert_eq!(
            writer.0.load(Ordering::SeqCst),
            2,
            "no wake after the fence"
        );
    }
}
