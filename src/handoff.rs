//! The request path's hand-off queue (S-W19), as small per item as the
//! config allows: a lock-free queue with a fence, from the stages to the
//! engine's intake. Its own module, outside the driver: a data structure
//! that decides nothing and does no IO.
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
//! The intake receives what is queued in chunks ([`LaneRx::take_in`]),
//! not one `try_recv` at a time: each receive updates the channel's
//! message count, an atomic every send updates too, so one update per
//! chunk instead of one per item keeps the stages' sends off a contended
//! cache line while the writer takes items in (on a 2-core machine a send
//! cost about 1.5x more with a `try_recv` per item).

use std::future::Future;
use std::hash::Hash;
use std::task::{Context, Poll, Waker};

use tokio::sync::mpsc::error::{SendError, TryRecvError};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use crate::core::{Admission, Engine, Handoff, Intake, Time};

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
    /// A hand-off the writer received while waiting: taken in first.
    received: Option<Handoff<K, I>>,
}

/// The channel, with the buffer its chunks are received into.
enum Rx<K, I> {
    Plain(UnboundedReceiver<(K, I)>, Vec<(K, I)>),
    Full(UnboundedReceiver<Handoff<K, I>>, Vec<Handoff<K, I>>),
}

/// The most hand-offs received at once: what the chunk buffer holds at
/// most, so a burst leaves no large buffer behind.
pub(crate) const CHUNK: usize = 256;

/// Where [`LaneRx::take_in`] puts what it receives: the engine, the
/// admission whose reservations the items hold, and the engine's share of
/// them (items, bytes).
pub(crate) type To<'a, K, I> = (&'a mut Engine<K, I>, &'a Admission, &'a mut (u64, u64));

/// A hand-off channel: `full` when the weight or the stamp must travel.
pub(crate) fn lane<K, I>(full: bool) -> (LaneTx<K, I>, LaneRx<K, I>) {
    let (tx, rx) = if full {
        let (tx, rx) = unbounded_channel();
        (LaneTx::Full(tx), Rx::Full(rx, Vec::new()))
    } else {
        let (tx, rx) = unbounded_channel();
        (LaneTx::Plain(tx), Rx::Plain(rx, Vec::new()))
    };
    let rx = LaneRx {
        rx,
        waker: None,
        received: None,
    };
    (tx, rx)
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

    /// Whether the lane is closed: the fence is up (S-W9).
    pub(crate) fn is_closed(&self) -> bool {
        match self {
            LaneTx::Plain(tx) => tx.is_closed(),
            LaneTx::Full(tx) => tx.is_closed(),
        }
    }
}

impl<K: Ord + Hash + Clone, I> LaneRx<K, I> {
    /// Moves the hand-offs staged so far into the engine's intake, in
    /// their order (S-W19), the one the writer received first. With
    /// `fence`, closes the lane first and takes in every stage that got
    /// past it (S-W9): call it right before the engine's fence goes up, in
    /// the same hold of the lock, so no stage is told `Accepted` and then
    /// refused. Returns whether the writer must drain.
    ///
    /// It receives with the writer's waker, the one the channel would keep
    /// anyway (before the writer's first wait, with a no-op one: the
    /// writer registers its own when it first waits).
    pub(crate) fn take_in(&mut self, to: To<'_, K, I>, fence: bool) -> bool {
        let LaneRx {
            rx,
            waker,
            received,
        } = self;
        let mut cx = Context::from_waker(waker.as_ref().unwrap_or(Waker::noop()));
        match rx {
            Rx::Plain(rx, buf) => {
                take_from(rx, buf, Handoff::plain, &mut cx, received.take(), to, fence)
            }
            Rx::Full(rx, buf) => take_from(
                rx,
                buf,
                std::convert::identity,
                &mut cx,
                received.take(),
                to,
                fence,
            ),
        }
    }
}

impl<K, I> LaneRx<K, I> {
    /// Waits for a hand-off: ready when one came (kept for the next
    /// [`take_in`](Self::take_in) to take in first); pending for good once
    /// the lane is closed and empty. The writer's call: its waker is kept
    /// for `take_in`.
    pub(crate) fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.received.is_some() {
            return Poll::Ready(());
        }
        if !self.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            self.waker = Some(cx.waker().clone());
        }
        let polled = match &mut self.rx {
            Rx::Plain(rx, _) => rx.poll_recv(cx).map(|h| h.map(Handoff::plain)),
            Rx::Full(rx, _) => rx.poll_recv(cx),
        };
        match polled {
            Poll::Ready(Some(h)) => {
                self.received = Some(h);
                Poll::Ready(())
            }
            Poll::Ready(None) | Poll::Pending => Poll::Pending,
        }
    }
}

/// [`LaneRx::take_in`] on one kind of channel, whose messages `into`
/// makes hand-offs: `first`, then what is
/// queued in chunks (each at one update of the channel's count, see the
/// module doc), then one by one what a chunk could not receive. Checks
/// (in debug builds) that the engine took in what was reserved.
fn take_from<K: Ord + Hash + Clone, I, M>(
    rx: &mut UnboundedReceiver<M>,
    buf: &mut Vec<M>,
    into: fn(M) -> Handoff<K, I>,
    cx: &mut Context<'_>,
    first: Option<Handoff<K, I>>,
    (engine, admission, held): To<'_, K, I>,
    fence: bool,
) -> bool {
    if fence {
        rx.close();
    }
    // Without a fence, only what is queued now: a stage that returned
    // before this call is among it, and a stream of new stages cannot
    // keep the lock held.
    let mut left = if fence { usize::MAX } else { rx.len() };
    if first.is_none() && left == 0 {
        return false;
    }
    // (items, bytes) reserved, whether every item carried its weight (a
    // plain lane's are weighed at the intake: no bytes were reserved),
    // and (items, bytes) the intake took.
    let (mut reserved, mut weighed, mut took) = ((0u64, 0u64), true, (0u64, 0u64));
    let mut count = |h: &Handoff<K, I>| {
        reserved.0 += 1;
        reserved.1 = reserved.1.saturating_add(h.weight.unwrap_or(0));
        weighed &= h.weight.is_some();
    };
    let mut sum = |i: Intake| {
        took.0 += i.accepted + i.refused;
        took.1 = (took.1.saturating_add(i.accepted_bytes)).saturating_add(i.refused_bytes);
        i.wake
    };
    let mut wake = first.is_some_and(|h| {
        sum(admission.intake(engine, held, std::iter::once(h).inspect(&mut count)))
    });
    while !fence && left > 0 {
        buf.clear();
        match recv_chunk(rx, buf, left.min(CHUNK), cx) {
            // Nothing now: a send between its count and its push. The
            // rest one by one, as below.
            Poll::Ready(0) | Poll::Pending => break,
            Poll::Ready(n) => left -= n,
        }
        let chunk = buf.drain(..).map(into).inspect(&mut count);
        wake |= sum(admission.intake(engine, held, chunk));
    }
    if left > 0 {
        let tail = std::iter::from_fn(|| loop {
            if left == 0 {
                return None;
            }
            left -= 1;
            match rx.try_recv() {
                Ok(h) => return Some(h),
                // Closed: a stage is between the fence and its push,
                // which is a few instructions away (S-W9).
                Err(TryRecvError::Empty) if fence => std::thread::yield_now(),
                Err(_) => return None,
            }
        });
        let tail = tail.map(into).inspect(&mut count);
        wake |= sum(admission.intake(engine, held, tail));
    }
    debug_assert_eq!(reserved.0, took.0);
    debug_assert!(!weighed || reserved.1 == took.1);
    wake
}

/// Receives up to `n` queued messages into `buf`, outside the task's
/// cooperative budget: the intake takes what was queued when it began
/// (`n` is bounded by it), so the budget bounds nothing here, and once
/// the writer's joins had spent it, every chunk came back `Pending` and
/// the rest went one `try_recv` at a time, one update of the channel's
/// count each (at 100,000 tenants, 84% of a drain's items).
fn recv_chunk<M>(
    rx: &mut UnboundedReceiver<M>,
    buf: &mut Vec<M>,
    n: usize,
    cx: &mut Context<'_>,
) -> Poll<usize> {
    let recv = std::future::poll_fn(|cx| rx.poll_recv_many(cx, buf, n));
    std::pin::pin!(tokio::task::unconstrained(recv)).poll(cx)
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
            rx.take_in((&mut e, &a, &mut held), true);
            assert_eq!((e.pending(), held.0), (1, 1), "full {full}");
            assert!(tx.is_closed());
            assert_eq!(tx.send(3, 4, 0, None), Err((3, 4)));
        }
    }

    #[test]
    fn take_in_takes_everything_queued_past_a_chunk() {
        for full in [false, true] {
            let (tx, mut rx) = lane::<u64, u64>(full);
            let (mut e, a, mut held) = engine();
            assert!(
                !rx.take_in((&mut e, &a, &mut held), false),
                "nothing queued"
            );
            let n = CHUNK as u64 * 2 + 10;
            for i in 0..n {
                tx.send(i % 3, i, 1, None).unwrap();
            }
            rx.take_in((&mut e, &a, &mut held), false);
            assert_eq!((e.pending(), held.0), (n, n), "full {full}");
        }
    }

    /// Units of this task's coop budget left: receives from a channel
    /// longer than any budget until one is refused (spending them all).
    fn budget_left() -> usize {
        let (tx, mut rx) = unbounded_channel::<()>();
        for _ in 0..1_000 {
            tx.send(()).unwrap();
        }
        let mut cx = Context::from_waker(Waker::noop());
        let mut n = 0;
        while rx.poll_recv(&mut cx).is_ready() {
            n += 1;
        }
        n
    }

    /// `f`, run in one poll of a task on a runtime, so under its coop
    /// budget (outside a task nothing is counted).
    fn in_a_task<R>(f: impl FnOnce() -> R) -> R {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let mut f = Some(f);
        rt.block_on(std::future::poll_fn(|_| Poll::Ready(f.take().unwrap()())))
    }

    #[test]
    fn take_in_receives_a_queue_whole_outside_the_tasks_budget() {
        // The module's point: chunks of up to CHUNK, one update of the
        // channel's count each, whatever the writer's task has spent of
        // its budget (a spent budget sent every item through `try_recv`,
        // one update each); and none past what was queued. The intake
        // spends none of the budget: a receive under it would.
        let whole = in_a_task(budget_left);
        assert!(whole > 8, "a task's budget: {whole}");
        for spent in [false, true] {
            for full in [false, true] {
                for n in [1, CHUNK, CHUNK * 3 + 10] {
                    let (tx, mut rx) = lane::<u64, u64>(full);
                    let (mut e, a, mut held) = engine();
                    for i in 0..n as u64 {
                        tx.send(i % 7, i, 1, None).unwrap();
                    }
                    let (before, after) = in_a_task(|| {
                        let before = if spent { budget_left() } else { 0 };
                        rx.take_in((&mut e, &a, &mut held), false);
                        (before, budget_left())
                    });
                    let case = format!("spent {spent}, full {full}, {n} queued");
                    assert_eq!(e.pending(), n as u64, "{case}");
                    assert_eq!(before + after, whole, "{case}: the intake spent budget");
                }
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
        // lands during an intake waits for the next, whether the task's
        // budget is whole or spent (the intake receives outside it).
        for budget_spent in [false, true] {
            let n = CHUNK as u64 + 44;
            let (tx, mut rx) = lane::<u64, u64>(false);
            let tx = Arc::new(tx);
            let mut e = restaging(Arc::clone(&tx), 10 * n);
            let (a, mut held) = (Admission::new(e.config()), (0, 0));
            for i in 0..n {
                tx.send(i % 7, i, 1, None).unwrap();
            }
            in_a_task(|| {
                if budget_spent {
                    budget_left();
                }
                rx.take_in((&mut e, &a, &mut held), false);
            });
            assert_eq!(e.pending(), n, "budget spent {budget_spent}");
            assert_eq!(held.0, n, "budget spent {budget_spent}");
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
            rx.take_in((&mut e, &a, &mut held), false);
            let _ = e.shutdown(Time::ZERO, Time::ZERO);
            for i in 0..3 {
                tx.send(2, i, 0, None).unwrap();
            }
            rx.take_in((&mut e, &a, &mut held), false);
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
    fn an_intake_leaves_the_writers_waker_with_the_channel() {
        // The channel registers the polling waker when it finds nothing: a
        // no-op one there would leave the waiting writer asleep through
        // the next stages (a lost wake-up).
        let writer = Arc::new(Counting(AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&writer));
        let (tx, mut rx) = lane::<u64, u64>(false);
        let (mut e, a, mut held) = engine();
        let mut cx = Context::from_waker(&waker);
        assert!(rx.poll_recv(&mut cx).is_pending(), "the writer waits");
        tx.send(1, 2, 0, None).unwrap();
        assert!(rx.poll_recv(&mut cx).is_ready(), "kept for the intake");
        tx.send(1, 3, 0, None).unwrap();
        rx.take_in((&mut e, &a, &mut held), false);
        assert_eq!(e.pending(), 2, "the received one and the queued one");
        assert!(rx.poll_recv(&mut cx).is_pending(), "the writer waits again");
        assert!(!rx.take_in((&mut e, &a, &mut held), false));
        tx.send(1, 4, 0, None).unwrap();
        assert_eq!(writer.0.load(Ordering::SeqCst), 2, "each stage woke it");
    }
}
