//! The fleet world's book: what the stagers committed and rolled back,
//! what the datastore accepted and under which epoch, the faults injected,
//! the first broken rule, and the trace hash (S-B4 determinism).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use outbox::table::model::{Model, SessionId};
use outbox::testkit::Violation;

/// What became of one staged row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// Its transaction is still open.
    Open,
    /// Committed.
    Committed,
    /// Rolled back (or its session ended without a commit).
    RolledBack,
}

/// One staged row, by its id in the outbox table.
#[derive(Clone, Debug)]
pub struct StagedRow {
    /// The tenant.
    pub tenant: u64,
    /// Its partition.
    pub partition: u32,
    /// The datastore refuses it (a terminal rejection).
    pub poison: bool,
    /// The book's sequence number at its transaction's begin.
    pub begin: u64,
    /// The sequence number at its commit.
    pub commit: u64,
    /// What became of it.
    pub fate: Fate,
}

/// The book, shared by every host and the world loop.
#[derive(Debug, Default)]
pub struct Book {
    /// A counter ordering every event of the run.
    pub seq: u64,
    /// Every staged row, by id.
    pub rows: BTreeMap<i64, StagedRow>,
    /// The first acceptance of each row at the datastore: its sequence
    /// number, host and epoch.
    pub delivered: BTreeMap<i64, (u64, usize, u64)>,
    /// The latest acceptance of each row at the datastore (its first or
    /// a repeat): its sequence number and epoch.
    pub last_accept: BTreeMap<i64, (u64, u64)>,
    /// The sequence number at which each dead-lettered row's move took
    /// effect at the store.
    pub dead_moved: BTreeMap<i64, u64>,
    /// Repeats the datastore absorbed (a row accepted again).
    pub repeats: u64,
    /// The store's clock at each row's first acceptance.
    pub accepted_at: BTreeMap<i64, Duration>,
    /// Writes the datastore accepted (one transaction each).
    pub accepted_writes: u64,
    /// Rows of writes the datastore refused (a dead letter's cause), with
    /// the sequence number of the last refusal.
    pub rejected: BTreeMap<i64, u64>,
    /// Faults and controls, by kind.
    pub faults: BTreeMap<&'static str, u64>,
    /// The first broken rule.
    pub failure: Option<Violation>,
    /// One line per event, with a trace.
    pub trace: Option<Vec<String>>,
    /// Every event, with a trace (the picture's input).
    pub events: Option<Vec<super::lanes::Event>>,
    hash: u64,
    /// Every stager transaction still open, by its begin's sequence
    /// number: its host, session and rows (a crash ends them in this
    /// order, not in the order the host's tasks happen to drop).
    pub open: BTreeMap<u64, (usize, SessionId, Vec<i64>)>,
    /// The store's clock now (the world sets it each step).
    pub now: Duration,
    /// World steps so far.
    pub step: u64,
}

/// The book behind a lock.
pub type SharedBook = Arc<Mutex<Book>>;

/// Locks the book; a panic under the lock leaves it usable.
pub fn lock(book: &SharedBook) -> MutexGuard<'_, Book> {
    book.lock().unwrap_or_else(|e| e.into_inner())
}

impl Book {
    /// A book keeping a trace when `trace`.
    pub fn new(trace: bool) -> Book {
        Book {
            trace: trace.then(Vec::new),
            events: trace.then(Vec::new),
            hash: 0xcbf2_9ce4_8422_2325,
            ..Book::default()
        }
    }

    /// The next sequence number.
    pub fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// Records an event: folded into the trace hash; a line with a trace.
    pub fn note(&mut self, what: &'static str, a: u64, b: u64, c: u64) {
        for x in [what.len() as u64, a, b, c, self.now.as_nanos() as u64] {
            for byte in x.to_le_bytes() {
                self.hash ^= u64::from(byte);
                self.hash = self.hash.wrapping_mul(0x0100_0000_01b3);
            }
        }
        for (i, byte) in what.bytes().enumerate() {
            self.hash ^= u64::from(byte) << (i % 8);
        }
        if let Some(events) = self.events.as_mut() {
            events.push((self.now, what, a, b, c));
        }
        if let Some(trace) = self.trace.as_mut() {
            trace.push(format!(
                "{:>10.3}s {what} {a} {b} {c}",
                self.now.as_secs_f64()
            ));
        }
    }

    /// Counts a fault or control.
    pub fn count(&mut self, kind: &'static str) {
        *self.faults.entry(kind).or_default() += 1;
    }

    /// Keeps the first broken rule.
    pub fn fail(&mut self, rule: &'static str, detail: String) {
        if self.failure.is_none() {
            self.note("violation", 0, 0, 0);
            let step = crate::world::step_index(self.step);
            self.failure = Some(Violation { rule, detail, step });
        }
    }

    /// Ends the open transaction `key`: its rows committed or rolled
    /// back. Nothing if it has ended already.
    pub fn end_tx(&mut self, key: u64, committed: bool) {
        let Some((_, _, ids)) = self.open.remove(&key) else {
            return;
        };
        let seq = self.next_seq();
        for id in &ids {
            if let Some(row) = self.rows.get_mut(id) {
                row.fate = if committed {
                    Fate::Committed
                } else {
                    Fate::RolledBack
                };
                row.commit = seq;
            }
        }
        self.note(
            if committed { "commit" } else { "rollback" },
            ids.len() as u64,
            key,
            0,
        );
    }

    /// The open transactions of `host`, oldest first.
    pub fn open_of(&self, host: usize) -> Vec<(u64, SessionId)> {
        self.open
            .iter()
            .filter(|(_, (h, _, _))| *h == host)
            .map(|(k, (_, s, _))| (*k, *s))
            .collect()
    }

    /// Every open transaction, oldest first.
    pub fn open_all(&self) -> Vec<(u64, SessionId)> {
        self.open.iter().map(|(k, (_, s, _))| (*k, *s)).collect()
    }

    /// Rolls back `open` (keys and sessions from [`Book::open_of`] or
    /// [`Book::open_all`]) in `model` and ends each here, oldest first:
    /// in the simulation's order, not in the order the hosts' tasks drop.
    pub fn roll_back(&mut self, model: &Model, open: Vec<(u64, SessionId)>) {
        for (key, session) in open {
            model.rollback(session);
            self.end_tx(key, false);
        }
    }

    /// The trace hash.
    pub fn hash(&self) -> u64 {
        self.hash
    }
}
