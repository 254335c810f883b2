//! What the crash world knows across the application's lives (the
//! process's memory dies with each crash; this does not): which life staged
//! each item, which items an answered `sync` covered, what each recovery
//! reported, and which items of earlier lives each life wrote.

use std::collections::{BTreeMap, BTreeSet};

use outbox::core::Time;

use super::check::s_j17::Cuts;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Attempt marks a failed commit left (S-J17), `(journal life, sequence
/// number)` to item.
pub type UnstartedMarks = BTreeMap<(u64, u64), u64>;

/// The ledger (see the module docs).
#[derive(Debug, Default)]
pub struct Ledger {
    /// The current life: 1 for the first start, +1 per restart.
    pub life: u32,
    /// The first item id staged in the current life.
    pub life_start: u64,
    /// Per item id (the book's order): the life that staged it.
    pub item_life: Vec<u32>,
    /// Items covered by a `sync` that answered `Ok` (D1).
    pub synced: BTreeSet<u64>,
    /// Items of earlier lives the sink was handed in the current life:
    /// the journal must have recovered them (D4).
    pub replayed: BTreeSet<u64>,
    /// Per life whose journal opened: (life, recovered, counted lost as
    /// unreadable at recovery).
    pub recoveries: Vec<(u32, u64, u64)>,
    /// Crashes so far.
    pub crashes: u32,
    /// Items counted lost as unreadable over every life (D4).
    pub unreadable: u64,
    /// The poison items: the app crashes at any write of one (S-J17).
    pub poison: BTreeSet<u64>,
    /// A poison item's write just started: the world crashes the app.
    pub poison_hit: Option<u64>,
    /// Items handed to the sink in the current life.
    pub handed: BTreeSet<u64>,
    /// Per item, the crashes that may have cut its attempts (S-J17).
    pub cuts: Cuts,
    /// Per crash not counted in `cuts` yet: the attempt marks its process
    /// left in a commit that failed, `(journal life, sequence number)` to
    /// item, of items the sink was not handed in that life, and the
    /// poison item whose write it was. Each counts against its item once
    /// the next life finds the mark on disk (S-J17: the journal counts
    /// it; the attempt never started).
    pub unstarted: Vec<(UnstartedMarks, Option<u64>)>,
    /// Items dead-lettered `poisoned`.
    pub poisoned: BTreeSet<u64>,
    /// The codec version the current life builds or runs with (S-J14).
    pub version: u32,
    /// Per life whose outbox built: the codec version it ran with.
    pub versions: BTreeMap<u32, u32>,
    /// Items a recovery of another codec version may have refused (each
    /// one a `Hand` recovery handed over; every pending one of another
    /// version when a `Refuse` recovery counted any): their segments may
    /// be gone, so D1 spares them.
    pub refused: BTreeSet<u64>,
    /// Lives that ran another codec version than the life before.
    pub version_changes: u64,
    /// Items counted lost under `other_version`, over every life.
    pub other_version: u64,
    /// Builds that failed with `JournalError::OtherVersion` (`Fail`).
    pub version_fails: u64,
    /// When the current life's outbox built (its recovery read the wall
    /// clock then, S-R3).
    pub recovered_at: Option<Time>,
    /// Items dead-lettered `expired` (S-R3), over every life.
    pub expired: BTreeSet<u64>,
    /// Items with an attempt mark on disk when the current life's
    /// recovery read the journal (S-J16).
    pub marked_at_recovery: BTreeSet<u64>,
}

impl Ledger {
    /// The codec version item `id` was staged with: its life's.
    pub fn version_of(&self, id: u64) -> Option<u32> {
        let life = self.item_life.get(usize::try_from(id).ok()?)?;
        self.versions.get(life).copied()
    }
}

/// The ledger, shared by the world, the app and the sink.
pub type SharedLedger = Arc<Mutex<Ledger>>;

/// Locks the ledger.
pub fn lock(l: &SharedLedger) -> MutexGuard<'_, Ledger> {
    l.lock().unwrap_or_else(PoisonError::into_inner)
}
