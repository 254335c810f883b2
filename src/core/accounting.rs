//! Exact accounting: where every staged item is (S-W14, S-A6).

use std::fmt;

use super::write::Failure;

/// Why items were lost: accepted, then given up (contract: "lost").
///
/// Non-exhaustive: new reasons will come (a match needs a `_` arm).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
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
    /// Staged longer ago than `max_item_age` when its write would start
    /// (S-R3).
    Expired,
    /// A journal record of another codec version than the recovering
    /// outbox's, refused at recovery, never decoded (S-J14).
    OtherVersion,
    /// The sink refused the write under a stale epoch
    /// ([`WriteError::stale_epoch`](crate::WriteError::stale_epoch)) on an
    /// outbox without an outbox table, where nothing can take the items
    /// over: a terminal failure of the write (S-E7).
    StaleEpoch,
    /// A journaled item whose writes were cut by a crash of the process
    /// `max_crash_attempts` times, dead-lettered at recovery without
    /// another write (S-J17, the outbox table's S-T18).
    Poisoned,
}

impl LostReason {
    /// Every reason, in a fixed order; the array grows with new reasons.
    pub const ALL: [LostReason; 12] = [
        LostReason::Shutdown,
        LostReason::Deadline,
        LostReason::Abandoned,
        LostReason::JoinFailed,
        LostReason::Terminal,
        LostReason::RetriesExhausted,
        LostReason::Discarded,
        LostReason::JournalUnreadable,
        LostReason::Expired,
        LostReason::OtherVersion,
        LostReason::StaleEpoch,
        LostReason::Poisoned,
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
            LostReason::Expired => "expired",
            LostReason::OtherVersion => "other_version",
            LostReason::StaleEpoch => "stale_epoch",
            LostReason::Poisoned => "poisoned",
        }
    }

    pub(crate) const fn index(self) -> usize {
        self as usize
    }
}

/// Why items were dropped: refused or discarded by a configured policy.
///
/// Non-exhaustive: new reasons will come (a match needs a `_` arm).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
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
    /// A stage on an outbox built with an outbox table, which takes items
    /// only from the table (S-T32).
    TableOnly,
}

impl DropReason {
    /// Every reason, in a fixed order; the array grows with new reasons.
    pub const ALL: [DropReason; 6] = [
        DropReason::BufferFull,
        DropReason::TenantFull,
        DropReason::SinkError,
        DropReason::EncodeFailed,
        DropReason::JournalFull,
        DropReason::TableOnly,
    ];

    /// The `reason` label of `outbox_items_dropped_total`.
    pub const fn as_str(self) -> &'static str {
        match self {
            DropReason::BufferFull => "buffer_full",
            DropReason::TenantFull => "tenant_full",
            DropReason::SinkError => "sink_error",
            DropReason::EncodeFailed => "encode_failed",
            DropReason::JournalFull => "journal_full",
            DropReason::TableOnly => "table_only",
        }
    }

    pub(crate) const fn index(self) -> usize {
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
/// dropped_total() + handed_over` at every instant; every count but `pending` only
/// grows.
///
/// S-W18: every attempt ends in exactly one counted outcome, so
/// `attempts == writes + failed_attempts + (attempts in flight)` at every
/// instant, and `attempts == writes + failed_attempts` at every quiet point
/// (nothing in flight); `failed_attempts` is the sum of
/// [`failed`](Self::failed) over every kind.
///
/// The totals are fields; the counts by reason or kind are read through
/// [`lost`](Self::lost), [`dropped`](Self::dropped) and
/// [`failed`](Self::failed), so new reasons (and new fields: the struct is
/// non-exhaustive) break no caller. A snapshot is a plain value:
/// [`Counters::default`] and the setters build one by hand (expected values
/// in tests, counters rebuilt from exported metrics) without touching any
/// engine.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Counters {
    /// Items offered to `stage`, accepted or not.
    pub staged: u64,
    /// Items taken in already durable (S-W14): those a journal recovery
    /// found pending (D4), staged again or counted lost under
    /// `journal_unreadable`, and the rows an outbox table's relay read.
    /// 0 with neither.
    pub recovered: u64,
    /// Items accepted and not yet written, lost or dropped.
    pub pending: u64,
    /// Items written by a successful write.
    pub written: u64,
    /// Items handed over to another instance after a write came back
    /// under a stale epoch (S-E7): neither written nor lost; the outbox
    /// table still holds them for the partition's next owner.
    pub handed_over: u64,
    /// Attempts that ended written (batches), a write the engine had given
    /// up but that committed anyway included (S-W18).
    pub writes: u64,
    /// Attempts started (first tries and retries).
    pub attempts: u64,
    /// Attempts that ended failed, of any kind (S-W11, S-W18).
    pub failed_attempts: u64,
    /// Failed attempts by kind, indexed like [`Failure::ALL`]: read with
    /// [`failed`](Self::failed) (S-W18).
    pub(crate) failed: [u64; Failure::ALL.len()],
    /// Items lost, indexed like [`LostReason::ALL`]: read with [`lost`](Self::lost).
    pub(crate) lost: [u64; LostReason::ALL.len()],
    /// Items dropped, indexed like [`DropReason::ALL`]: read with [`dropped`](Self::dropped).
    pub(crate) dropped: [u64; DropReason::ALL.len()],
}

/// The counts by kind under their labels (the metrics' `reason` and
/// `kind` values), not as bare arrays.
impl std::fmt::Debug for Counters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        struct ByLabel<'a>(&'a [(&'static str, u64)]);
        impl std::fmt::Debug for ByLabel<'_> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_map()
                    .entries(self.0.iter().map(|(k, v)| (k, v)))
                    .finish()
            }
        }
        // Every field named: a new one fails to compile here until shown.
        let Counters {
            staged,
            recovered,
            pending,
            written,
            handed_over,
            writes,
            attempts,
            failed_attempts,
            failed: _,
            lost: _,
            dropped: _,
        } = self;
        let failed = Failure::ALL.map(|k| (k.as_str(), self.failed(k)));
        let lost = LostReason::ALL.map(|r| (r.as_str(), self.lost(r)));
        let dropped = DropReason::ALL.map(|r| (r.as_str(), self.dropped(r)));
        f.debug_struct("Counters")
            .field("staged", staged)
            .field("recovered", recovered)
            .field("pending", pending)
            .field("written", written)
            .field("handed_over", handed_over)
            .field("writes", writes)
            .field("attempts", attempts)
            .field("failed_attempts", failed_attempts)
            .field("failed", &ByLabel(&failed))
            .field("lost", &ByLabel(&lost))
            .field("dropped", &ByLabel(&dropped))
            .finish()
    }
}

impl Counters {
    /// Items lost for `reason`.
    pub fn lost(&self, reason: LostReason) -> u64 {
        self.lost[reason.index()]
    }
    /// Items dropped for `reason`.
    pub fn dropped(&self, reason: DropReason) -> u64 {
        self.dropped[reason.index()]
    }
    /// Sets the items lost for `reason` (a snapshot built by hand; the
    /// engine's own counters are never written through this).
    pub fn set_lost(&mut self, reason: LostReason, items: u64) {
        self.lost[reason.index()] = items;
    }
    /// Sets the items dropped for `reason` (a snapshot built by hand).
    pub fn set_dropped(&mut self, reason: DropReason, items: u64) {
        self.dropped[reason.index()] = items;
    }
    /// Items lost for any reason.
    pub fn lost_total(&self) -> u64 {
        self.lost.iter().sum()
    }
    /// Items dropped for any reason.
    pub fn dropped_total(&self) -> u64 {
        self.dropped.iter().sum()
    }
    /// Failed attempts of `kind` (S-W18).
    pub fn failed(&self, kind: Failure) -> u64 {
        self.failed[kind.index()]
    }
    /// Sets the failed attempts of `kind` (a snapshot built by hand); the
    /// total `failed_attempts` is a field of its own, set apart.
    pub fn set_failed(&mut self, kind: Failure, attempts: u64) {
        self.failed[kind.index()] = attempts;
    }
    /// Attempts that have ended, written or failed (S-W18): equal to
    /// `attempts` whenever nothing is in flight.
    pub fn attempts_ended(&self) -> u64 {
        self.writes + self.failed_attempts
    }
    /// Whether S-W14 holds: every staged item is in exactly one state.
    pub fn balanced(&self) -> bool {
        self.staged + self.recovered
            == self.written
                + self.pending
                + self.lost_total()
                + self.dropped_total()
                + self.handed_over
    }

    /// Counts `n` lost items; returns whether this occurrence should be
    /// logged (S-A6: the first, then every 1,000th per reason).
    pub(crate) fn add_lost(&mut self, reason: LostReason, n: u64) -> bool {
        let slot = &mut self.lost[reason.index()];
        let before = *slot;
        *slot += n;
        log_due(before, *slot)
    }

    /// Counts one failed attempt of `kind` (S-W18).
    pub(crate) fn add_failed(&mut self, kind: Failure) {
        self.failed_attempts += 1;
        self.failed[kind.index()] += 1;
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
    fn counters_debug_names_each_count_by_its_label() {
        let mut c = Counters {
            staged: 7,
            ..Counters::default()
        };
        c.lost[1] = 3;
        c.dropped[0] = 2;
        c.failed[0] = 5;
        let text = format!("{c:?}");
        assert!(text.starts_with("Counters { staged: 7,"), "{text}");
        let lost = format!("\"{}\": 3", LostReason::ALL[1].as_str());
        let dropped = format!("\"{}\": 2", DropReason::ALL[0].as_str());
        let failed = format!("\"{}\": 5", Failure::ALL[0].as_str());
        for label in [lost, dropped, failed] {
            assert!(text.contains(&label), "{label} in {text}");
        }
        assert!(!text.contains("[0, "), "no bare arrays: {text}");
    }

    #[test]
    fn logging_is_rate_limited_per_reason() {
        // S-A6: the first, then every 1,000th.
        let mut c = Counters::default();
        let logged: Vec<u64> = (1..=3_000)
            .filter(|_| c.add_dropped(DropReason::BufferFull, 1))
            .collect();
        assert_eq!(logged.len(), 4, "1st, 1000th, 2000th, 3000th");
        assert_eq!(c.dropped(DropReason::BufferFull), 3_000);
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
                "journal_unreadable",
                "expired",
                "other_version",
                "stale_epoch",
                "poisoned",
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
