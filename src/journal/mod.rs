//! The optional write-ahead journal (feature `journal`; SPEC D1-D6):
//! pending items survive a crash of the process (`kill -9`, OOM, abort)
//! and are staged again when the outbox is built on the same directory.
//!
//! - [`Storage`]: the file IO, behind a small trait so a simulated disk
//!   can stand in for the real one; [`FsStorage`] is `std::fs`.
//! - [`format`]: segment files of checksummed records, and the scanner
//!   that reads them back through damage.
//! - [`Codec`]: how tenants and items become bytes; [`Postcard`] for serde
//!   types.
//! - [`recover`]: reading a directory back at build.
//!
//! The decisions (sequence numbers, done marks, which segment can go, what
//! a recovery stages again and counts lost) are the core's:
//! [`crate::core::journal`].

mod codec;
mod config;
pub mod format;
mod memory;
mod recover;
mod state;
mod storage;

use std::fmt;
use std::io;

pub use codec::{Codec, Postcard};
pub use config::{
    JournalConfig, DEFAULT_RETRY_INTERVAL, DEFAULT_SEGMENT_BYTES, DEFAULT_SYNC_BYTES,
    DEFAULT_SYNC_INTERVAL, MIN_SEGMENT_BYTES,
};
pub use memory::MemStorage;
pub use recover::{recover, Recovered, RecoveryReport};
pub use state::{Batch, Committer, JournalState, Op};
pub use storage::{FsStorage, Storage, LOCK_FILE};

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
