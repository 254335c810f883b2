//! What crosses the boundary between the engine and its driver: writes
//! handed out, their outcomes, and the events the driver exports.

use std::fmt;
use std::time::Duration;

use super::accounting::{DropReason, LostReason};
use super::time::Time;

/// Identifies one write (one batch of one tenant) for its whole life,
/// across every attempt. Ids grow by one per write, from 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WriteId(pub u64);

impl fmt::Display for WriteId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "w{}", self.0)
    }
}

/// One attempt of one write, handed out by
/// [`Engine::poll_write`](super::Engine::poll_write).
///
/// The items are moved out of the engine (S-C2) and must come back with the
/// outcome through [`Engine::finish`](super::Engine::finish), untouched and
/// in order: a retry re-sends this very vector (S-W5, I2). If the task that
/// ran it cannot give them back, call
/// [`Engine::finish_lost`](super::Engine::finish_lost) instead (S-W13).
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Write<K, I> {
    /// The write's id, the same on every attempt.
    pub id: WriteId,
    /// The tenant every item belongs to.
    pub tenant: K,
    /// The slice to write, in staging order; never empty.
    pub items: Vec<I>,
    /// 1 for the first attempt, then 2, 3, … on retries.
    pub attempt: u32,
    /// When the driver must cancel this attempt and report
    /// [`Outcome::Failed`] with [`Failure::Timeout`] (S-B3); `None` without a
    /// `write_timeout`.
    pub deadline: Option<Time>,
}

/// How an attempt ended, as the driver reports it to
/// [`Engine::finish`](super::Engine::finish): written, or failed by one
/// [`Failure`] kind (S-W18: every attempt ends written or failed by exactly
/// one kind).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The sink committed the slice, but `discarded` of its items were
    /// consumed without being written and are counted lost under
    /// `discarded` (S-W12). `discarded` is clamped to the slice's length.
    Written {
        /// Items the sink consumed without writing (usually 0).
        discarded: usize,
    },
    /// The attempt failed; its [`Failure`] says how, and so what becomes
    /// of the slice (S-W5, S-A5, S-B3, S-W18, S-E7, S-W13).
    Failed(Failure),
}

impl Outcome {
    /// A write committed in full.
    pub const WRITTEN: Outcome = Outcome::Written { discarded: 0 };

    /// The kind of a failed outcome; `None` for [`Outcome::Written`].
    pub const fn failure(self) -> Option<Failure> {
        match self {
            Outcome::Written { .. } => None,
            Outcome::Failed(failure) => Some(failure),
        }
    }

    /// Items the store discarded: 0 unless written.
    pub(crate) const fn discarded(self) -> usize {
        match self {
            Outcome::Written { discarded } => discarded,
            Outcome::Failed(_) => 0,
        }
    }
}

/// The kind of a failed attempt: what the driver reports in
/// [`Outcome::Failed`], and what events, logs and the `kind` label of
/// `outbox_write_failures_total` name (S-W18: every attempt ends written
/// or failed by exactly one kind).
///
/// Non-exhaustive: new kinds may come (a match needs a `_` arm).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Failure {
    /// The sink returned a retryable error: retried, or dropped under the
    /// drop policy (S-W5, S-A5).
    Error,
    /// The sink panicked creating, polling or rendering the error of the
    /// write; handled as a retryable error (S-W5).
    Panic,
    /// The attempt outlived [`Write::deadline`] and was cancelled (S-B3).
    Timeout,
    /// The sink rejected the slice terminally: lost under `terminal`, never
    /// retried (S-A5).
    Rejected,
    /// Cancelled by the driver because the engine asked it to
    /// ([`Event::CancelInFlight`]): at a shutdown deadline (S-W9) or by an
    /// abandon (S-A7). Counts as one failed attempt (S-W18).
    Cancelled,
    /// The attempt's task ended without giving its items back (S-W13): what
    /// [`Engine::finish_lost`](super::Engine::finish_lost) records. Given
    /// to [`Engine::finish`](super::Engine::finish) with the items, it means
    /// the same: the slice is lost under `join_failed`, never retried, and
    /// its items are returned to be dropped.
    TaskLost,
    /// The sink refused the write because a newer epoch is installed for
    /// its partition (S-E7, S-L14): another instance owns it now. Never
    /// retried; the sink answered, so it does not count toward the breaker
    /// (S-R1). On an engine relaying an outbox table
    /// ([`Engine::with_outbox_table`](super::Engine::with_outbox_table)) not
    /// lost: the write's items and every item of its tenant still waiting
    /// leave the engine counted `handed_over` (the next owner delivers them
    /// from the outbox table), with an [`Event::HandedOver`]. Without an
    /// outbox table nothing can take them over: a terminal failure of the
    /// write, its items lost under `stale_epoch` (dead letter
    /// [`DeadReason::StaleEpoch`]), as a [`Rejected`](Self::Rejected) slice.
    StaleEpoch,
}

impl Failure {
    /// Every kind, in a fixed order (the index of
    /// [`Counters::failed`](super::Counters::failed)).
    pub const ALL: [Failure; 7] = [
        Failure::Error,
        Failure::Panic,
        Failure::Timeout,
        Failure::Rejected,
        Failure::Cancelled,
        Failure::TaskLost,
        Failure::StaleEpoch,
    ];

    /// The name used in logs and as the `kind` label: `error`, `panic`,
    /// `timeout`, `rejected`, `cancelled`, `task_lost`, `stale_epoch`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Failure::Error => "error",
            Failure::Panic => "panic",
            Failure::Timeout => "timeout",
            Failure::Rejected => "rejected",
            Failure::Cancelled => "cancelled",
            Failure::TaskLost => "task_lost",
            Failure::StaleEpoch => "stale_epoch",
        }
    }

    pub(crate) const fn index(self) -> usize {
        self as usize
    }
}

/// What became of a failed attempt's slice.
///
/// Non-exhaustive: new fates may come (a match needs a `_` arm).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AfterFailure {
    /// Retried after this wait (S-W7), identical slice (S-W5).
    RetryIn(Duration),
    /// Dropped under `sink_error` (S-A5, [`ErrorPolicy::Drop`](super::ErrorPolicy::Drop)).
    Dropped,
    /// Lost under `terminal`, `retries_exhausted` or `join_failed` (S-A5,
    /// S-B2, S-W13).
    Lost,
    /// The engine had given the write up (shutdown deadline S-W9, abandon
    /// S-A7) before this attempt came back: its items were already counted
    /// lost then, and go to the dead-letter hand-off (S-B6).
    GivenUp,
    /// Handed over under a stale epoch (S-E7): left in the outbox table
    /// for the partition's next owner, counted `handed_over`.
    HandedOver,
}

/// Why items were given up while the outbox runs, as a run-time dead
/// letter says it (S-R4). Each names the counter the items went to.
///
/// Non-exhaustive: new reasons may come (a match needs a `_` arm).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum DeadReason {
    /// Rejected terminally by the sink: lost under `terminal` (S-A5).
    Terminal,
    /// `max_attempts` or `max_retry_duration` ran out: lost under
    /// `retries_exhausted` (S-B2).
    RetriesExhausted,
    /// Failed under the `drop` error policy: dropped under `sink_error`
    /// (S-A5).
    SinkError,
    /// Older than `max_item_age`: lost under `expired` (S-R3).
    Expired,
    /// Refused by the sink under a stale epoch on an outbox without an
    /// outbox table (nothing can take it over): lost under `stale_epoch`
    /// (S-E7).
    StaleEpoch,
    /// Its writes were cut by a crash `max_crash_attempts` times: lost
    /// under `poisoned`, at a journal's recovery (S-J17).
    Poisoned,
}

impl DeadReason {
    /// Every reason, in a fixed order.
    pub const ALL: [DeadReason; 6] = [
        DeadReason::Terminal,
        DeadReason::RetriesExhausted,
        DeadReason::SinkError,
        DeadReason::Expired,
        DeadReason::StaleEpoch,
        DeadReason::Poisoned,
    ];

    /// The counter's reason label: `terminal`, `retries_exhausted`,
    /// `sink_error`, `expired`, `stale_epoch`, `poisoned`.
    pub const fn as_str(self) -> &'static str {
        match self {
            DeadReason::Terminal => "terminal",
            DeadReason::RetriesExhausted => "retries_exhausted",
            DeadReason::SinkError => "sink_error",
            DeadReason::Expired => "expired",
            DeadReason::StaleEpoch => "stale_epoch",
            DeadReason::Poisoned => "poisoned",
        }
    }

    /// The loss reason the items were counted under, if lost.
    pub const fn lost(self) -> Option<LostReason> {
        match self {
            DeadReason::Terminal => Some(LostReason::Terminal),
            DeadReason::RetriesExhausted => Some(LostReason::RetriesExhausted),
            DeadReason::Expired => Some(LostReason::Expired),
            DeadReason::StaleEpoch => Some(LostReason::StaleEpoch),
            DeadReason::Poisoned => Some(LostReason::Poisoned),
            DeadReason::SinkError => None,
        }
    }

    /// The drop reason the items were counted under, if dropped.
    pub const fn dropped(self) -> Option<DropReason> {
        match self {
            DeadReason::SinkError => Some(DropReason::SinkError),
            _ => None,
        }
    }

    /// Its place in [`ALL`](Self::ALL), for per-reason tallies.
    pub const fn index(self) -> usize {
        match self {
            DeadReason::Terminal => 0,
            DeadReason::RetriesExhausted => 1,
            DeadReason::SinkError => 2,
            DeadReason::Expired => 3,
            DeadReason::StaleEpoch => 4,
            DeadReason::Poisoned => 5,
        }
    }

    /// How many items `counters` hold under this reason's counter (I13:
    /// with dead letters on, as many as were handed out for it).
    pub fn counted(self, counters: &super::Counters) -> u64 {
        match (self.lost(), self.dropped()) {
            (Some(l), _) => counters.lost(l),
            (None, Some(d)) => counters.dropped(d),
            (None, None) => 0,
        }
    }
}

/// One tenant's items given up while the outbox runs, handed out instead
/// of dropped unseen (S-R4): a slice the sink rejected (or refused under a
/// stale epoch with no outbox table, S-E7), whose retries ran out or that
/// failed under the `drop` policy, or items that expired. They
/// are already counted (see [`DeadReason`]); this is the application's
/// copy to store, alert on or drop.
#[derive(Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct DeadLetter<K, I> {
    /// Whose items.
    pub tenant: K,
    /// The items, in staging order; never empty.
    pub items: Vec<I>,
    /// Why they were given up.
    pub reason: DeadReason,
    /// Whether an attempt to write these items started (S-J16): then the
    /// store may hold them (a write may commit and still fail, or time
    /// out), so a replay must be idempotent; `false`, none did (expired
    /// before their first write).
    pub attempted: bool,
}

/// One run of a shutdown's dead letters ([`ShutdownReport::unwritten`]):
/// one tenant's items, in staging order (S-B6, S-J16).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Unwritten<K, I> {
    /// Whose items.
    pub tenant: K,
    /// The items, in staging order; never empty.
    pub items: Vec<I>,
    /// Whether an attempt of this slice started: its write was in flight
    /// when the deadline cancelled it, or failed and waited for a retry,
    /// so the store may hold these items (a replay must be idempotent).
    /// `false` for a tenant's backlog, never tried.
    pub attempted: bool,
}

impl<K, I> Unwritten<K, I> {
    /// The tenant and the items, without the flag.
    pub fn into_parts(self) -> (K, Vec<I>) {
        (self.tenant, self.items)
    }
}

/// A run compares with a `(tenant, items)` pair on its tenant and items.
impl<K: PartialEq, I: PartialEq> PartialEq<(K, Vec<I>)> for Unwritten<K, I> {
    fn eq(&self, other: &(K, Vec<I>)) -> bool {
        self.tenant == other.0 && self.items == other.1
    }
}

/// Identifies a flush, settle or shutdown call until its report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WaitId(pub u64);

/// What became of the items a flush, settle or shutdown waited for: the
/// items pending when it was called (S-A4, S-W10, S-B6).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Report {
    /// Of those items, how many were written.
    pub written: u64,
    /// Of those items, how many were dropped (counted under a
    /// [`DropReason`]).
    pub dropped: u64,
    /// Of those items, how many were lost (counted under a
    /// [`LostReason`]).
    pub lost: u64,
    /// Of those items, how many were handed over to another instance
    /// (S-E7): left in the outbox table for the partition's next owner.
    pub handed_over: u64,
    /// How many are still pending (non-zero only when the deadline passed,
    /// and always zero for a shutdown).
    pub pending: u64,
    /// Whether the deadline passed before every item was settled.
    pub deadline_passed: bool,
}

/// The answer to a shutdown (S-W9, S-B6): the accounting of the items
/// pending at the fence, read directly (`report.lost`), and the dead
/// letters.
///
/// Only the first shutdown caller is given the accounting; a concurrent or
/// later caller gets zeros, so a loss is reported exactly once (S-W9).
/// Non-exhaustive: fields may be added.
#[derive(Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct ShutdownReport<K, I> {
    /// Of the items pending at the fence, how many were written.
    pub written: u64,
    /// Of those items, how many were dropped (counted under a
    /// [`DropReason`]).
    pub dropped: u64,
    /// Of those items, how many were lost (those unwritten at the deadline
    /// among them).
    pub lost: u64,
    /// Of those items, how many were handed over to another instance
    /// (S-E7).
    pub handed_over: u64,
    /// How many are still pending: always 0, a shutdown answers only when
    /// nothing is (I8).
    pub pending: u64,
    /// Whether the deadline passed before every item was settled.
    pub deadline_passed: bool,
    /// Whether this caller is the one that started the shutdown.
    pub first: bool,
    /// The dead-letter hand-off (S-B6): every item given up at the deadline,
    /// as runs of one tenant's items in staging order, ordered by tenant.
    /// A tenant may have two runs (its in-flight or retry slice, attempted,
    /// then its backlog, not), in that order; each says whether it was
    /// attempted (S-J16).
    /// These items are counted lost under `deadline`. A write in flight
    /// that comes back committed after the deadline cancelled it hands
    /// nothing back: its items stay counted lost (S-B6), so `lost` may
    /// exceed the items here.
    pub unwritten: Vec<Unwritten<K, I>>,
}

impl<K, I> ShutdownReport<K, I> {
    /// A report with the accounting `report`.
    pub(crate) fn new(report: Report, first: bool, unwritten: Vec<Unwritten<K, I>>) -> Self {
        let Report {
            written,
            dropped,
            lost,
            handed_over,
            pending,
            deadline_passed,
        } = report;
        ShutdownReport {
            written,
            dropped,
            lost,
            handed_over,
            pending,
            deadline_passed,
            first,
            unwritten,
        }
    }

    /// The accounting alone, in the shape of a flush's [`Report`].
    pub fn report(&self) -> Report {
        Report {
            written: self.written,
            dropped: self.dropped,
            lost: self.lost,
            handed_over: self.handed_over,
            pending: self.pending,
            deadline_passed: self.deadline_passed,
        }
    }
}

/// What the driver must export or act on, drained with
/// [`Engine::poll_event`](super::Engine::poll_event).
///
/// Non-exhaustive: new events will come (a match needs a `_` arm).
#[derive(Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Event<K, I> {
    /// Items refused or discarded by policy (S-A1, S-B7, S-A5).
    ///
    /// Refusals at stage time coalesce (S-B8): while a refusal's event is
    /// still queued, later refusals for the same reason add to its `items`
    /// instead of queueing one event each (`tenant` is the first one's,
    /// `log` whether any of them was due a log), so a producer that
    /// outruns a stalled driver leaves no per-item state behind.
    Dropped {
        /// The tenant of the (first) refused item.
        tenant: K,
        /// Items dropped: more than 1 when refusals coalesced.
        items: u64,
        /// The counter they went to.
        reason: DropReason,
        /// Whether to log this one (S-A6: the first, then every 1,000th).
        log: bool,
    },
    /// Items given up (S-W9, S-A7, S-W13, S-A5, S-B2, S-W12). Refusals
    /// after the shutdown fence (`shutdown`) coalesce as for
    /// [`Event::Dropped`].
    Lost {
        /// The tenant of the (first) item given up.
        tenant: K,
        /// Items lost: more than 1 when refusals coalesced, or for a slice.
        items: u64,
        /// The counter they went to.
        reason: LostReason,
        /// Whether to log this one (S-A6).
        log: bool,
    },
    /// A write committed: one per attempt that ended written (S-W18).
    Written {
        /// Which write.
        id: WriteId,
        /// Whose.
        tenant: K,
        /// Items in the slice (written plus discarded).
        items: u64,
        /// Which attempt succeeded.
        attempt: u32,
        /// From this attempt's start to its outcome.
        latency: Duration,
        /// The engine had given this write up (shutdown deadline, abandon)
        /// before it came back: its items stay counted lost, not written,
        /// and are not handed back (S-B6); the attempt counts as a write.
        given_up: bool,
    },
    /// An attempt failed: one per attempt that ended failed, whatever the
    /// kind, given-up writes and lost tasks included (S-W18).
    AttemptFailed {
        /// Which write.
        id: WriteId,
        /// Whose.
        tenant: K,
        /// Items in the slice.
        items: u64,
        /// Which attempt failed.
        attempt: u32,
        /// How it failed.
        failure: Failure,
        /// What happens to the slice now.
        next: AfterFailure,
        /// From this attempt's start to its outcome.
        latency: Duration,
    },
    /// A durable item's key ([`Durable::key`](super::Durable::key), S-W22)
    /// comes back: the item settled, written or not (dropped, lost or
    /// handed over, counted under its reason as any item). Queued in each
    /// tenant's staging order, with the event that counted the item
    /// (before or after it). Names the item exactly, whatever else
    /// settles: the outbox table's driver decides each row's removal by
    /// it (S-T31).
    KeyDone {
        /// The key the item was staged with.
        key: u64,
        /// Whether the item was written (`outcome` is `Written`).
        written: bool,
        /// How it settled: the reason it was counted under.
        outcome: super::ItemOutcome,
    },
    /// The driver must cancel every write in flight and finish each (failed
    /// by [`Failure::Cancelled`], or with whatever it got first). The engine
    /// has already counted their items lost (S-W9 deadline, S-A7).
    CancelInFlight,
    /// A write of `tenant` came back failed by [`Failure::StaleEpoch`]
    /// (S-E7): its
    /// items and every item of the tenant still waiting left the engine
    /// counted `handed_over`, not lost, not retried; the partition's next
    /// owner delivers them from the outbox table. Queued right after the
    /// write's [`Event::AttemptFailed`].
    HandedOver {
        /// Whose.
        tenant: K,
        /// Items handed over: the write's and the tenant's waiting ones.
        items: u64,
    },
    /// Items given up while running, handed out with
    /// [`Config::dead_letters`](super::Config::dead_letters) on (S-R4).
    /// Queued right after the [`Event::Lost`] or [`Event::Dropped`] that
    /// counted them.
    DeadLetter(DeadLetter<K, I>),
    /// A flush or settle is answered.
    WaitDone {
        /// Which call.
        id: WaitId,
        /// Its answer.
        report: Report,
    },
    /// A shutdown is answered; after this, nothing is pending and no write
    /// starts (I8).
    ShutdownDone {
        /// Which call.
        id: WaitId,
        /// Its answer.
        report: ShutdownReport<K, I>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_reasons_index_is_its_place_in_all() {
        for (ix, reason) in DeadReason::ALL.iter().enumerate() {
            assert_eq!(reason.index(), ix, "{reason:?}");
        }
    }

    #[test]
    fn failures_have_their_log_names() {
        let names = Failure::ALL.map(Failure::as_str);
        assert_eq!(
            names,
            [
                "error",
                "panic",
                "timeout",
                "rejected",
                "cancelled",
                "task_lost",
                "stale_epoch"
            ]
        );
        for (i, f) in Failure::ALL.iter().enumerate() {
            assert_eq!(f.index(), i);
        }
        assert_eq!(WriteId(7).to_string(), "w7");
    }
}
