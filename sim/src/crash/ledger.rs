//! What the crash world knows across the application's lives (the
//! process's memory dies with each crash; this does not): which life staged
//! each item, which items an answered `sync` covered, what each recovery
//! reported, and which items of earlier lives each life wrote.

use std::collections::BTreeSet;

use super::check::s_j17::Cuts;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

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
    /// Items dead-lettered `poisoned`.
    pub poisoned: BTreeSet<u64>,
}

/// The ledger, shared by the world, the app and the sink.
pub type SharedLedger = Arc<Mutex<Ledger>>;

/// Locks the ledger.
pub fn lock(l: &SharedLedger) -> MutexGuard<'_, Ledger> {
    l.lock().unwrap_or_else(PoisonError::into_inner)
}
