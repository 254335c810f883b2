//! One tenant's state: its waiting backlog, the slice kept for a retry, and
//! where it stands in the schedule.

use std::collections::VecDeque;

use super::ages::{ItemAge, ItemOutcome};
use super::time::Time;
use super::wait::WaitMarks;
use super::write::WriteId;

/// The key of a timer entry: its instant, then a sequence number so that
/// timers due at the same instant fire in the order they were armed.
pub(crate) type TimerKey = (Time, u64);

/// Where a tenant stands. Exactly one place holds a tenant at a time: the
/// ready FIFO, the linger timers, the backoff timers, an in-flight write, or
/// none (idle).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Nothing to write, or nothing allowed to start.
    Idle,
    /// In the ready FIFO (S-B1).
    Ready,
    /// Waiting for company until the timer (S-A3).
    Lingering(TimerKey),
    /// A write of this tenant is in flight (S-W3: at most one).
    InFlight(WriteId),
    /// A failed slice waits for its backoff (S-W7).
    BackingOff(TimerKey),
}

/// A failed slice kept for its next attempt (S-W5): the same items, in the
/// same order, never merged with later arrivals.
#[derive(Debug)]
pub(crate) struct Retry<I> {
    pub(crate) id: WriteId,
    pub(crate) items: Vec<I>,
    pub(crate) bytes: u64,
    /// Attempts made so far (all failed).
    pub(crate) attempts: u32,
    /// When the first attempt started (S-B2 `max_retry_duration`).
    pub(crate) first_started: Time,
    /// When its oldest item was staged (S-R3 `max_item_age`).
    pub(crate) oldest: Time,
}

/// The staging times of a tenant's items (S-R3, S-R7): of its waiting
/// ones (the age limit's), and of every pending one, waiting, kept for a
/// retry or in flight (their ages as they settle, oldest first: a
/// tenant's items settle in staging order, S-W5). Boxed and absent until
/// the first stamp: without a `max_item_age` no tenant keeps any, and
/// empty queues inline would cost every tenant 64 bytes (S-B8).
// The box is the point: 8 bytes inline for the tenants that keep none.
#[derive(Debug, Default)]
pub(crate) struct Stamps(Option<Box<Queues>>);

#[derive(Debug, Default)]
pub(crate) struct Queues {
    waiting: VecDeque<Time>,
    pending: VecDeque<Time>,
}

impl Stamps {
    /// The oldest waiting item's stamp.
    pub(crate) fn front(&self) -> Option<Time> {
        self.0.as_ref().and_then(|q| q.waiting.front().copied())
    }

    /// The latest waiting item's stamp.
    pub(crate) fn back(&self) -> Option<Time> {
        self.0.as_ref().and_then(|q| q.waiting.back().copied())
    }

    /// A new pending item, waiting, staged `at`.
    pub(crate) fn push_back(&mut self, at: Time) {
        let q = self.0.get_or_insert_with(Box::default);
        q.waiting.push_back(at);
        q.pending.push_back(at);
    }

    /// How many waiting items' stamps are earlier than `cutoff` (they
    /// never decrease).
    pub(crate) fn before(&self, cutoff: Time) -> usize {
        self.0
            .as_ref()
            .map_or(0, |q| q.waiting.partition_point(|s| *s < cutoff))
    }

    /// The `n` oldest waiting items (all of them, if fewer) are waiting no
    /// more: cut into a write, or given up (then settled too).
    pub(crate) fn forget_oldest(&mut self, n: usize) {
        if let Some(q) = &mut self.0 {
            q.waiting.drain(..n.min(q.waiting.len()));
            super::shrink::deque(&mut q.waiting);
            self.drop_if_empty();
        }
    }

    /// No item is waiting any more.
    pub(crate) fn clear(&mut self) {
        if let Some(q) = &mut self.0 {
            q.waiting = VecDeque::new();
            self.drop_if_empty();
        }
    }

    /// The `n` oldest pending items settled, the `i`th as `how(i)`, at
    /// `now`: their ages go to `out` (S-R7). Fewer stamps than `n` (none
    /// kept) give fewer samples.
    pub(crate) fn take_ages(
        &mut self,
        n: usize,
        now: Time,
        how: impl Fn(usize) -> ItemOutcome,
        out: &mut Vec<ItemAge>,
    ) {
        let Some(q) = &mut self.0 else { return };
        for i in 0..n {
            let Some(at) = q.pending.pop_front() else {
                break;
            };
            out.push(ItemAge {
                outcome: how(i),
                age: now.saturating_since(at),
            });
        }
        super::shrink::deque(&mut q.pending);
        self.drop_if_empty();
    }

    fn drop_if_empty(&mut self) {
        if self
            .0
            .as_ref()
            .is_some_and(|q| q.waiting.is_empty() && q.pending.is_empty())
        {
            self.0 = None;
        }
    }
}

#[derive(Debug)]
pub(crate) struct Tenant<I> {
    /// Items waiting for a write, in staging order.
    pub(crate) items: VecDeque<I>,
    /// When each of `items` was staged, kept only with a `max_item_age`
    /// (S-R3); empty otherwise. Never decreasing.
    pub(crate) stamps: Stamps,
    /// Their weight in bytes (0 without a weigher).
    pub(crate) bytes: u64,
    /// When the linger clock of the waiting backlog started: the staging
    /// time of its oldest item, or, for items left behind when a full batch
    /// was cut, the time of the cut (S-A3).
    pub(crate) waiting_since: Time,
    /// Items of this tenant not yet settled: waiting, kept for a retry, or
    /// in flight (S-B7).
    pub(crate) pending: usize,
    /// Idle, lingering, ready, in flight or backing off.
    pub(crate) phase: Phase,
    /// A failed write's slice, kept whole for its retry (S-W5). Boxed:
    /// most tenants never hold one, and the tenant map stays small.
    pub(crate) retry: Option<Box<Retry<I>>>,
    /// Which waits cover which of its items (S-A4).
    pub(crate) wait_marks: WaitMarks,
    /// When its age timer is armed (S-R3): just past the age deadline of
    /// its oldest item, while no write of it is in flight.
    pub(crate) expiry: Option<Time>,
}

impl<I> Tenant<I> {
    pub(crate) fn new(now: Time) -> Self {
        Tenant {
            items: VecDeque::new(),
            stamps: Stamps::default(),
            bytes: 0,
            waiting_since: now,
            pending: 0,
            phase: Phase::Idle,
            retry: None,
            wait_marks: WaitMarks::default(),
            expiry: None,
        }
    }

    /// Nothing held and nothing scheduled: the tenant can be forgotten.
    pub(crate) fn is_empty(&self) -> bool {
        self.pending == 0 && self.phase == Phase::Idle
    }
}

impl<I> Tenant<I> {
    /// When the age timer is due (S-R3): just past the age deadline of the
    /// oldest item not in flight (its retry slice's or its backlog's);
    /// `None` when it holds none, or keeps no stamps.
    pub(crate) fn expiry_due(&self, age_ns: u64) -> Option<Time> {
        let retry = self.retry.as_ref().map(|r| r.oldest);
        let oldest = match (retry, self.stamps.front()) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b)?,
        };
        // Expired means staged before `now - age`: one nanosecond past.
        Some(Time::from_nanos(
            oldest.as_nanos().saturating_add(age_ns).saturating_add(1),
        ))
    }

    /// When the oldest waiting item was staged (`now` without stamps).
    pub(crate) fn oldest_waiting(&self, now: Time) -> Time {
        self.stamps.front().unwrap_or(now)
    }

    /// Takes the waiting items staged before `cutoff` (S-R3), oldest
    /// first, with their weight.
    pub(crate) fn take_staged_before(
        &mut self,
        cutoff: Time,
        weigh: impl Fn(&I) -> u64,
    ) -> (Vec<I>, u64) {
        let n = self.stamps.before(cutoff);
        let items = take_front(&mut self.items, n);
        self.stamps.forget_oldest(n);
        let bytes = items
            .iter()
            .fold(0u64, |sum, i| sum.saturating_add(weigh(i)));
        self.bytes = self.bytes.saturating_sub(bytes);
        (items, bytes)
    }

    /// Cuts the next batch from the waiting backlog (S-W4, S-B5): the whole
    /// backlog, or at most `max_items` items and `max_bytes` bytes; an item
    /// heavier than `max_bytes` goes alone. Items left behind restart the
    /// linger clock at `now` (S-A3). Returns (items, bytes).
    pub(crate) fn cut_batch(
        &mut self,
        max_items: Option<usize>,
        max_bytes: Option<u64>,
        weigh: impl Fn(&I) -> u64,
        now: Time,
    ) -> (Vec<I>, u64) {
        let mut n = max_items.map_or(self.items.len(), |m| m.min(self.items.len()));
        let mut bytes = 0u64;
        match max_bytes {
            Some(limit) => {
                let mut taken = 0;
                for item in self.items.iter().take(n) {
                    let w = weigh(item);
                    if taken > 0 && bytes.saturating_add(w) > limit {
                        break;
                    }
                    bytes = bytes.saturating_add(w);
                    taken += 1;
                }
                n = taken;
            }
            None => {
                bytes = self
                    .items
                    .iter()
                    .take(n)
                    .fold(0u64, |sum, i| sum.saturating_add(weigh(i)));
            }
        }
        let items = take_front(&mut self.items, n);
        self.stamps.forget_oldest(n);
        // Saturating: an impure weigher must not make the sums underflow.
        self.bytes = self.bytes.saturating_sub(bytes);
        if !self.items.is_empty() {
            self.waiting_since = now;
        }
        (items, bytes)
    }
}

/// The `n` oldest of `items`, in order. The whole backlog (the common cut:
/// a tenant's every waiting item) leaves with the queue's own buffer, so a
/// write costs no allocation and no copy of its items.
pub(crate) fn take_front<I>(items: &mut VecDeque<I>, n: usize) -> Vec<I> {
    if n >= items.len() {
        return Vec::from(std::mem::take(items));
    }
    let taken = items.drain(..n).collect();
    super::shrink::deque(items);
    taken
}
