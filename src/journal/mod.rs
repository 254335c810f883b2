//! The optional write-ahead journal (feature `journal`; SPEC D1-D6,
//! S-J1..S-J8): pending items survive a crash of the process (`kill -9`,
//! an OOM kill, `panic = "abort"`, a power cut) and are staged again when
//! an outbox is built on the same directory. Off by default; turned on
//! with [`OutboxBuilder::journal`](crate::OutboxBuilder::journal).
//!
//! # What survives a crash
//! - Every item staged before a [`sync`](crate::Outbox::sync) that
//!   answered `Ok` is written after the restart, exactly once in a store
//!   that absorbs repeats (the [`Sink`](crate::Sink)'s idempotency duty)
//!   (D1), each tenant's items in staging order (D2). Nothing is written
//!   that was never staged (D3).
//! - Without a `sync`, an item is on disk within about
//!   [`sync_interval`](JournalConfig::sync_interval) (default 5 ms) of its
//!   stage: a crash in that window loses it, uncounted (the counters die
//!   with the process). This is the price of a `stage` that never waits
//!   for a disk (S-W1).
//! - Done marks are lazy: an item written just before a crash whose mark
//!   was not yet synced is staged again and written twice; the sink's
//!   idempotency absorbs the repeat (S-J3).
//! - Recovery (at build, before any new stage) counts every item it stages
//!   again under `recovered` ([`Counters::recovered`](crate::Counters),
//!   `outbox_items_recovered_total`); a record that cannot be read back
//!   (damaged, or not decodable) is counted lost under
//!   `journal_unreadable` (D4). The accounting identity holds with
//!   recovered items as input: `staged + recovered = written + pending +
//!   lost + dropped`.
//!
//! # Group commit
//! `stage` encodes the item with the [`Codec`] on the caller's thread,
//! outside the outbox's lock, into a buffer the thread reuses, and copies
//! the record into an in-memory buffer under it (no allocation per item).
//! The journal's own task computes the records' checksums, writes the
//! buffer and calls `fdatasync` (a group commit) `sync_interval` after
//! the first record of a round, at once when
//! [`sync_bytes`](JournalConfig::sync_bytes) are buffered or a `sync`
//! waits; meanwhile staging fills a second buffer, and the two take
//! turns. The IO runs on tokio's blocking pool, never on the caller's
//! thread and never under the outbox's lock (S-J1).
//!
//! # Disk use (D6)
//! Records go to segment files of about
//! [`segment_bytes`](JournalConfig::segment_bytes); a segment is deleted
//! once all its items are done (written, lost or dropped) and no other
//! segment's items depend on its done marks (S-J2). A clean shutdown
//! leaves one empty segment (32 bytes) once the last handle is dropped and
//! the writer exits; until then the segments its marks emptied may remain
//! (D6). [`max_bytes`](JournalConfig::max_bytes)
//! bounds the total: a stage that would pass it is dropped and counted
//! under `journal_full` (S-J4).
//!
//! # Faults at run time (S-J5)
//! When a group commit fails (disk full, EIO, a permission lost), the
//! journal stops: the error is logged once per incident and counted in
//! `outbox_journal_faults_total`; the items of the failed commit and every
//! item staged until the journal works again are still accepted and
//! written, but held in memory only, counted in
//! `outbox_items_unjournaled_total`; `sync` answers
//! [`SyncError::Down`](crate::SyncError::Down) while any of them is
//! pending. Every [`retry_interval`](JournalConfig::retry_interval)
//! (default 1 s) the journal seals the segments the failed commit touched
//! and opens a new one; once that works it journals again. Nothing
//! panics, nothing is lost silently: a crash during the incident loses the
//! unjournaled items, which `sync` said were not durable.
//!
//! # Damage (S-J7)
//! Every record carries a crc32c. At recovery a torn record at the end of
//! the last segment (a crash mid-write, never synced) is cut; a damaged
//! record elsewhere is skipped and its item, if not known done, counted
//! lost under `journal_unreadable`; a file that is not the journal's, or of
//! another format version, is a [`JournalError`] at build, never a guess.
//! A new segment's header is synced before any record goes in, and a
//! segment whose creation failed is deleted before anything else is
//! written, so a last segment holding at most a torn header is a crash
//! while creating it: deleted, and counted in the recovery's log line
//! (`empty_segments`).
//! Two processes on one directory: the second gets
//! [`JournalError::Locked`] (an advisory lock, S-J6).
//!
//! # Parts
//! The journal's decisions (sequence numbers, done marks, what a round
//! commits, which segment can go, faults and retries, what a recovery
//! stages again and counts lost) are one sans-IO machine in the core
//! (`core::journal`). This module holds what surrounds it: its settings
//! ([`JournalConfig`]) and errors ([`JournalError`]), the on-disk format,
//! the file IO (a small `Storage` trait, so that a simulated disk can
//! stand in for the real one), the reading of a directory back at build,
//! the carrying out of the machine's batches, and a stage's part (`stage`:
//! encoding on the caller's thread, the room check and the append under
//! the journal's lock). The commit task that runs the batches is the
//! driver's. With the feature `testkit` (for this
//! crate's tests and simulation, not a stable API) the internals are
//! public: `format`, `Storage`, `FsStorage`, `MemStorage`, `recover`,
//! `Committer`, and `outbox::core::journal`.

#[cfg(feature = "testkit")]
pub mod canary;
#[cfg(not(feature = "testkit"))]
pub(crate) mod canary;

mod committer;
mod config;
#[cfg(feature = "testkit")]
pub mod format;
#[cfg(not(feature = "testkit"))]
pub(crate) mod format;
mod inspect;
#[cfg(any(test, feature = "testkit"))]
mod memory;
mod recover;
pub(crate) mod stage;
mod storage;
mod wall;

use std::fmt;
use std::io;

pub use crate::codec::{Codec, Postcard, Versioned};
#[cfg(feature = "testkit")]
pub use committer::Committer;
#[cfg(not(feature = "testkit"))]
pub(crate) use committer::Committer;
pub use config::{
    JournalConfig, OtherRecord, OtherVersion, DEFAULT_MAX_BUFFERED_BYTES, DEFAULT_RETRY_INTERVAL,
    DEFAULT_SEGMENT_BYTES, DEFAULT_SYNC_BYTES, DEFAULT_SYNC_INTERVAL, MIN_MAX_BYTES,
    MIN_SEGMENT_BYTES,
};
pub use inspect::{inspect, Inspection, RawBytes, SegmentInfo};
#[cfg(any(test, feature = "testkit"))]
pub use memory::MemStorage;
#[cfg(feature = "testkit")]
pub use recover::{recover, recover_judging, recover_with, Recovered, RecoveryReport};
#[cfg(not(feature = "testkit"))]
pub(crate) use recover::{recover_judging, RecoveryReport};
#[cfg(all(test, not(feature = "testkit")))]
pub(crate) use storage::LOCK_FILE;
#[cfg(not(feature = "testkit"))]
pub(crate) use storage::{FsStorage, Storage};
#[cfg(feature = "testkit")]
pub use storage::{FsStorage, Storage, LOCK_FILE};
pub(crate) use wall::WallClock;

/// Why a journal could not be opened (at build) or used.
#[derive(Debug)]
#[non_exhaustive]
pub enum JournalError {
    /// Another process (or another outbox in this one) holds the
    /// directory's lock (S-J6).
    Locked(io::Error),
    /// A file in the directory is not one of the journal's: the journal
    /// refuses to guess (S-J7). Move it away.
    Foreign {
        /// Its name.
        file: String,
    },
    /// A segment written by another format version.
    Version {
        /// Its name.
        file: String,
        /// Its version.
        version: u16,
    },
    /// Items of another codec version than the outbox's are pending and
    /// [`OtherVersion::Fail`] was asked for (S-J14).
    OtherVersion {
        /// The first segment holding one.
        file: String,
        /// The codec version its first such item was written with.
        version: u32,
        /// The outbox codec's version.
        expected: u32,
        /// How many such items are pending.
        items: u64,
    },
    /// The configuration's sizes contradict each other (S-J10): an
    /// explicit `segment_bytes` above half of what `max_bytes` leaves
    /// beside the standing reserves (the current segment is never
    /// deleted, so the journal would stall at its bound), or `max_bytes`
    /// below [`MIN_MAX_BYTES`] or too small to hold two segments of
    /// [`MIN_SEGMENT_BYTES`] beside those reserves (`segment_bytes` is
    /// then `None`).
    Bounds {
        /// The segment size asked for, if it is the one at fault.
        segment_bytes: Option<u64>,
        /// The bound asked for.
        max_bytes: u64,
        /// The nearest value accepted, in bytes: the largest
        /// `segment_bytes` this `max_bytes` accepts when `segment_bytes`
        /// is at fault, else the smallest `max_bytes` accepted with the
        /// `segment_bytes` configured (or unset).
        limit: u64,
    },
    /// A file operation failed.
    Io {
        /// Which: `lock`, `list`, `read`, `create`, `append`, `sync`,
        /// `truncate`, `seal`, `delete`.
        op: &'static str,
        /// On which file (`.` for the directory).
        file: String,
        /// The cause.
        source: io::Error,
    },
}

impl fmt::Display for JournalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JournalError::Locked(e) => write!(f, "outbox journal: {e}"),
            JournalError::Foreign { file } => write!(
                f,
                "outbox journal: `{file}` is not a journal file; the directory must hold only the journal"
            ),
            JournalError::Version { file, version } => write!(
                f,
                "outbox journal: `{file}` has format version {version}, this build reads {}",
                format::VERSION
            ),
            JournalError::OtherVersion {
                file,
                version,
                expected,
                items,
            } => write!(
                f,
                "outbox journal: {items} pending items were written with codec version {version} \
                 (first in `{file}`), this outbox's codec is version {expected}; write them with \
                 the older build, or configure `other_version` to refuse or hand them over"
            ),
            JournalError::Bounds {
                segment_bytes: Some(segment),
                max_bytes,
                limit,
            } => write!(
                f,
                "outbox journal: segment_bytes ({segment}) is above half of what max_bytes \
                 ({max_bytes}) leaves beside the journal's standing reserves; a segment is deleted \
                 only once the journal has moved past it, so such a journal would stall at its \
                 bound: make segment_bytes at most {limit}, or leave it unset"
            ),
            JournalError::Bounds {
                segment_bytes: None,
                max_bytes,
                limit,
            } => write!(
                f,
                "outbox journal: max_bytes ({max_bytes}) is too small: the smallest accepted is \
                 {limit} bytes (at least {MIN_MAX_BYTES}, and room for two segments, of \
                 segment_bytes if set, else of {MIN_SEGMENT_BYTES} bytes, beside the journal's \
                 standing reserves)"
            ),
            JournalError::Io { op, file, source } => {
                write!(f, "outbox journal: {op} `{file}`: {source}")
            }
        }
    }
}

impl std::error::Error for JournalError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            JournalError::Locked(e) | JournalError::Io { source: e, .. } => Some(e),
            _ => None,
        }
    }
}
