//! Exact accounting: where every staged item is (S-W14, S-A6).

use std::fmt;

/// Why items were lost: accepted, then given up (contract: "lost").
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LostReason {
    /// Staged after the shutdown fence (S-W9).
    Shutdown,
    /// Still unwritten at the shutdown deadline (S-W9, S-B6).
    Deadline,
    /// Pending when [`abandon`](crate::core::Engine::abandon) was called (S-A7).
    Abandoned,
    /// A write task ended without giving its items back (S-W13).
    JoinFailed,
    /// The sink rejected the slice terminally (S-A5).
    Terminal,
    /// `max_attempts` or `max_retry_duration` ran out (S-B2).
    RetriesExhausted,
    /// The sink consumed items without writing them (S-W12).
    Discarded,
    /// A journal record that a recovery could not read back (damaged, or
    /// not decodable by the codec), its item not known done (D4).
    JournalUnreadable,
}

impl LostReason {
    /// Every reason, in a fixed order (the index of [`Counters::lost`]).
    pub const ALL: [LostReason; 8] = [
        LostReason::Shutdown,
        LostReason::Deadline,
        LostReason::Abandoned,
        LostReason::JoinFailed,
        LostReason::Terminal,
        LostReason::RetriesExhausted,
        LostReason::Discarded,
        LostReason::JournalUnreadable,
    ];

    /// The `reason` label of `outbox_events_lost_total`.
    pub const fn as_str(self) -> &'static str {
        match self {
            LostReason::Shutdown => "shutdown",
            LostReason::Deadline => "deadline",
            LostReason::Abandoned => "abandoned",
            LostReason::JoinFailed => "join_failed",
            LostReason::Terminal => "terminal",
            LostReason::RetriesExhausted => "retries_exhausted",
            LostReason::Discarded => "discarded",
            LostReason::JournalUnreadable => "journal_unreadable",
        }
    }

    const fn index(self) -> usize {
        self as usize
    }
}

/// Why items were dropped: refused or discarded by a configured policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DropReason {
    /// `capacity` or `capacity_bytes` was reached (S-A1, S-B5).
    BufferFull,
    /// The tenant's `tenant_capacity` was reached (S-B7).
    TenantFull,
    /// An attempt failed under [`ErrorPolicy::Drop`](crate::core::ErrorPolicy::Drop) (S-A5).
    SinkError,
    /// The journal's codec could not encode the item (an error, a panic,
    /// or a record over 64 MiB), refused at stage (S-J8).
    EncodeFailed,
    /// The journal's `max_bytes` was reached, refused at stage (S-J4).
    JournalFull,
}

impl DropReason {
    /// Every reason, in a fixed order (the index of [`Counters::dropped`]).
    pub const ALL: [DropReason; 5] = [
        DropReason::BufferFull,
        DropReason::TenantFull,
        DropReason::SinkError,
        DropReason::EncodeFailed,
        DropReason::JournalFull,
    ];

    /// The `reason` label of `outbox_items_dropped_total`.
    pub const fn as_str(self) -> &'static str {
        match self {
            DropReason::BufferFull => "buffer_full",
            DropReason::TenantFull => "tenant_full",
            DropReason::SinkError => "sink_error",
            DropReason::EncodeFailed => "encode_failed",
            DropReason::JournalFull => "journal_full",
        }
    }

    const fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for DropReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The engine's counters: a snapshot from [`Engine::counters`](crate::core::Engine::counters).
///
/// S-W14: `staged + recovered == written + pending + lost_total() +
/// dropped_total()` at every instant; every field but `pending` only
/// grows.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Counters {
    /// Items offered to `stage`, accepted or not.
    pub staged: u64,
    /// Items a journal recovery found pending (D4): staged again, or
    /// counted lost under `journal_unreadable`. 0 without a journal.
    pub recovered: u64,
    /// Items accepted and not yet written, lost or dropped.
    pub pending: u64,
    /// Items written by a successful write.
    pub written: u64,
    /// Successful writes (batches).
    pub writes: u64,
    /// Attempts started (first tries and retries).
    pub attempts: u64,
    /// Attempts that failed: sink error, panic, timeout, terminal rejection (S-W11).
    pub failed_attempts: u64,
    /// Items lost, indexed like [`LostReason::ALL`].
    pub lost: [u64; LostReason::ALL.len()],
    /// Items dropped, indexed like [`DropReason::ALL`].
    pub dropped: [u64; DropReason::ALL.len()],
}

impl Counters {
    /// Items lost for `reason`.
    pub fn lost_for(&self, reason: LostReason) -> u64 {
        self.lost[reason.index()]
    }
    /// Items dropped for `reason`.
    pub fn dropped_for(&self, reason: DropReason) -> u64 {
        self.dropped[reason.index()]
    }
    /// Items lost for any reason.
    pub fn lost_total(&self) -> u64 {
        self.lost.iter().sum()
    }
    /// Items dropped for any reason.
    pub fn dropped_total(&self) -> u64 {
        self.dropped.iter().sum()
    }
    /// Whether S-W14 holds: every staged item is in exactly one state.
    pub fn balanced(&self) -> bool {
        self.staged + self.recovered
            == self.written + self.pending + self.lost_total() + self.dropped_total()
    }

    /// Counts `n` lost items; returns whether this occurrence should be
    /// logged (S-A6: the first, then every 1,000th per reason).
    pub(crate) fn add_lost(&mut self, reason: LostReason, n: u64) -> bool {
        let slot = &mut self.lost[reason.index()];
        let before = *slot;
        *slot += n;
        log_due(before, *slot)
    }

    /// Counts `n` dropped items; returns whether to log (S-A6).
    pub(crate) fn add_dropped(&mut self, reason: DropReason, n: u64) -> bool {
        let slot = &mut self.dropped[reason.index()];
        let before = *slot;
        *slot += n;
        log_due(before, *slot)
    }
}

/// How often a drop or loss is logged per reason (S-A6).
pub const LOG_EVERY: u64 = 1_000;

/// Whether the count going from `before` to `after` crosses the 1st item or
/// a multiple of [`LOG_EVERY`] items (S-A6).
fn log_due(before: u64, after: u64) -> bool {
    after > before && (before == 0 || before / LOG_EVERY != after / LOG_EVERY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logging_is_rate_limited_per_reason() {
        // S-A6: the first, then every 1,000th.
        let mut c = Counters::default();
        let logged: Vec<u64> = (1..=3_000)
            .filter(|_| c.add_dropped(DropReason::BufferFull, 1))
            .collect();
        assert_eq!(logged.len(), 4, "1st, 1000th, 2000th, 3000th");
        assert_eq!(c.dropped_for(DropReason::BufferFull), 3_000);
        // Another reason has its own count.
        assert!(c.add_lost(LostReason::Terminal, 5));
        assert!(!c.add_lost(LostReason::Terminal, 5));
        assert!(c.add_lost(LostReason::Terminal, 990));
        assert_eq!(c.lost_total(), 1_000);
        assert!(
            !c.add_lost(LostReason::Terminal, 0),
            "nothing counted, nothing logged"
        );
        let mut fresh = Counters::default();
        assert!(
            !fresh.add_dropped(DropReason::SinkError, 0),
            "not even the first"
        );
    }

    #[test]
    fn balanced_says_whether_every_item_is_in_one_state() {
        // S-W14.
        let mut c = Counters {
            staged: 10,
            pending: 2,
            written: 5,
            ..Counters::default()
        };
        c.add_lost(LostReason::Deadline, 2);
        c.add_dropped(DropReason::BufferFull, 1);
        assert!(c.balanced());
        c.pending += 1;
        assert!(!c.balanced(), "an item counted twice");
        c.pending -= 2;
        assert!(!c.balanced(), "an item nowhere");
    }

    #[test]
    fn labels_are_the_spec_names() {
        let lost: Vec<_> = LostReason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(
            lost,
            [
                "shutdown",
                "deadline",
                "abandoned",
                "join_failed",
                "terminal",
                "retries_exhausted",
                "discarded",
                "journal_unreadable"
            ]
        );
        for (i, r) in LostReason::ALL.iter().enumerate() {
            assert_eq!(r.index(), i);
        }
        for (i, r) in DropReason::ALL.iter().enumerate() {
            assert_eq!(r.index(), i);
        }
        assert_eq!(DropReason::BufferFull.to_string(), "buffer_full");
        for r in LostReason::ALL {
            assert_eq!(r.to_string(), r.as_str());
        }
    }
}
