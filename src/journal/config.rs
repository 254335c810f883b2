//! The journal's settings: [`JournalConfig`].

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use super::storage::Storage;
use super::wall::WallClock;

/// The default [`JournalConfig::sync_interval`]: 5 ms.
pub const DEFAULT_SYNC_INTERVAL: Duration = Duration::from_millis(5);
/// The default [`JournalConfig::sync_bytes`]: 1 MiB.
pub const DEFAULT_SYNC_BYTES: usize = 1 << 20;
/// The default [`JournalConfig::segment_bytes`] without
/// [`max_bytes`](JournalConfig::max_bytes): 16 MiB (with it, a quarter of
/// it, at most this).
pub use crate::core::journal::DEFAULT_SEGMENT_BYTES;
/// The smallest [`JournalConfig::max_bytes`]: 512 bytes (a build error
/// below, S-J10).
pub use crate::core::journal::MIN_MAX_BYTES;
/// The smallest segment size: 128 bytes (smaller values are raised to it).
pub use crate::core::journal::MIN_SEGMENT_BYTES;
/// The default [`JournalConfig::retry_interval`]: 1 s.
pub const DEFAULT_RETRY_INTERVAL: Duration = Duration::from_secs(1);
/// The default [`JournalConfig::max_buffered_bytes`]: 64 MiB.
pub const DEFAULT_MAX_BUFFERED_BYTES: usize = 64 << 20;

/// Where the journal lives and how it commits (D1-D6, S-J1..S-J8).
///
/// ```no_run
/// # use std::time::Duration;
/// use outbox::journal::JournalConfig;
/// let journal = JournalConfig::new("/var/lib/myservice/outbox")
///     .sync_interval(Duration::from_millis(2))
///     .max_bytes(Some(1 << 30));
/// ```
pub struct JournalConfig {
    pub(crate) dir: PathBuf,
    pub(crate) storage: Option<Box<dyn Storage>>,
    pub(crate) sync_interval: Duration,
    pub(crate) sync_bytes: usize,
    pub(crate) segment_bytes: Option<u64>,
    pub(crate) max_bytes: Option<u64>,
    pub(crate) retry_interval: Duration,
    pub(crate) max_buffered_bytes: usize,
    pub(crate) inline_io: bool,
    pub(crate) other_version: OtherVersion,
    pub(crate) wall_clock: WallClock,
    pub(crate) max_crash_attempts: u32,
}

/// What a recovery does with items of another codec version than the
/// recovering outbox's (S-J14): [`JournalConfig::other_version`]. They
/// are never decoded, so never misread.
#[non_exhaustive]
pub enum OtherVersion {
    /// Refuse them: counted lost under `other_version`, the rest
    /// recovered (the default).
    Refuse,
    /// Refuse them as [`Refuse`](Self::Refuse) does, and call the function
    /// with each one's bytes, in staging order, at build (before any stage),
    /// for a service to decode with the older type and write or keep
    /// elsewhere. A crash before the refused records' segments are deleted
    /// hands them again at the next build.
    Hand(Box<dyn Fn(OtherRecord) + Send + Sync>),
    /// Fail the build with
    /// [`JournalError::OtherVersion`](super::JournalError::OtherVersion)
    /// while any such item is not known done; nothing on disk is changed.
    Fail,
}

impl OtherVersion {
    /// [`OtherVersion::Hand`] with `f`.
    pub fn hand(f: impl Fn(OtherRecord) + Send + Sync + 'static) -> Self {
        OtherVersion::Hand(Box::new(f))
    }
}

impl fmt::Debug for OtherVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OtherVersion::Refuse => "Refuse",
            OtherVersion::Hand(_) => "Hand",
            OtherVersion::Fail => "Fail",
        })
    }
}

/// A journaled item of another codec version, as its bytes (S-J14).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct OtherRecord {
    /// The codec version it was written with.
    pub version: u32,
    /// When it was staged, in milliseconds since the Unix epoch (0 when
    /// unknown).
    pub staged_ms: u64,
    /// The tenant's bytes, as that codec encoded them.
    pub tenant: Vec<u8>,
    /// The item's bytes, as that codec encoded them.
    pub item: Vec<u8>,
}

impl fmt::Debug for JournalConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JournalConfig")
            .field("dir", &self.dir)
            .field("custom_storage", &self.storage.is_some())
            .field("sync_interval", &self.sync_interval)
            .field("sync_bytes", &self.sync_bytes)
            .field("segment_bytes", &self.segment_bytes)
            .field("max_bytes", &self.max_bytes)
            .field("retry_interval", &self.retry_interval)
            .field("max_buffered_bytes", &self.max_buffered_bytes)
            .field("inline_io", &self.inline_io)
            .field("other_version", &self.other_version)
            .field("max_crash_attempts", &self.max_crash_attempts)
            .finish()
    }
}

impl JournalConfig {
    /// A journal in directory `dir` (created with its parents if missing;
    /// it must hold nothing but the journal), with the defaults: group
    /// commit every 5 ms or 1 MiB, 16 MiB segments, no size bound, a
    /// failed journal retried every second.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        JournalConfig {
            dir: dir.into(),
            storage: None,
            sync_interval: DEFAULT_SYNC_INTERVAL,
            sync_bytes: DEFAULT_SYNC_BYTES,
            segment_bytes: None,
            max_bytes: None,
            retry_interval: DEFAULT_RETRY_INTERVAL,
            max_buffered_bytes: DEFAULT_MAX_BUFFERED_BYTES,
            inline_io: false,
            other_version: OtherVersion::Refuse,
            wall_clock: WallClock::System,
            max_crash_attempts: crate::core::relay::DEFAULT_MAX_CRASH_ATTEMPTS,
        }
    }

    /// A journal on another [`Storage`] than the directory's file system:
    /// a simulated disk, or [`MemStorage`](super::MemStorage) in tests
    /// (feature `testkit`). The directory is then only a name in logs.
    #[cfg(any(test, feature = "testkit"))]
    pub fn with_storage(storage: impl Storage) -> Self {
        JournalConfig {
            storage: Some(Box::new(storage)),
            ..JournalConfig::new("(custom storage)")
        }
    }

    /// The longest an accepted item waits in memory before its group
    /// commit (write, then `fdatasync`) starts: the window in which a
    /// crash loses it uncounted (D1). Default 5 ms. Zero: a commit starts
    /// as soon as the previous one ends and anything is buffered.
    pub fn sync_interval(mut self, interval: Duration) -> Self {
        self.sync_interval = interval;
        self
    }

    /// A commit starts early once this many bytes are buffered. Default
    /// 1 MiB; 0 is taken as 1 (every stage starts a commit when none runs).
    pub fn sync_bytes(mut self, bytes: usize) -> Self {
        self.sync_bytes = bytes.max(1);
        self
    }

    /// A new segment file starts once the current one holds this many
    /// bytes (S-J1); a segment is deleted once all its items are done
    /// (D6), so smaller segments give disk space back sooner. Default
    /// 16 MiB, or with [`max_bytes`](Self::max_bytes) a quarter of it (at
    /// most 16 MiB, and at most half of what the standing reserves leave:
    /// the current segment's seal, two rolls and the records that count a
    /// lone suspect's crashes, S-J17, a few hundred bytes); values under
    /// [`MIN_SEGMENT_BYTES`] (128 bytes) are raised to it. Above half of
    /// what `max_bytes` leaves beside those reserves, the build fails with
    /// [`JournalError::Bounds`](super::JournalError::Bounds) naming both
    /// (S-J10): the current segment is never deleted, so such a journal
    /// would stall at its bound.
    pub fn segment_bytes(mut self, bytes: u64) -> Self {
        self.segment_bytes = Some(bytes);
        self
    }

    /// The most bytes the journal's segment files may hold (S-J4, S-J10):
    /// every byte counts (records, done marks, seals, headers, segments
    /// whose deletion waits), and an item is admitted only if its record
    /// and the done mark that will free it fit, so a journal at its bound
    /// can always write the marks and seals that free it. An item that
    /// does not fit is dropped at stage, counted under `journal_full`.
    /// Default `None` (no bound); at least [`MIN_MAX_BYTES`] (512 bytes)
    /// and room for two segments of [`MIN_SEGMENT_BYTES`] beside the
    /// standing reserves, else the build fails with
    /// [`JournalError::Bounds`](super::JournalError::Bounds).
    pub fn max_bytes(mut self, bytes: Option<u64>) -> Self {
        self.max_bytes = bytes;
        self
    }

    /// The most bytes of records that may wait in memory for their group
    /// commit (S-B8: memory stays bounded when the disk is slower than the
    /// stages): a stage past it is dropped and counted under
    /// `journal_full`, like one past [`max_bytes`](Self::max_bytes).
    /// Default 64 MiB; values under [`sync_bytes`](Self::sync_bytes) are
    /// raised to it.
    pub fn max_buffered_bytes(mut self, bytes: usize) -> Self {
        self.max_buffered_bytes = bytes;
        self
    }

    /// Runs the storage calls on the journal's task itself rather than on
    /// tokio's blocking pool. For a simulated disk (turmoil's
    /// `unstable-fs`, whose files live in the simulated host's context and
    /// must be reached from its task, deterministically); on a real disk
    /// it blocks a runtime thread for every `fdatasync`. Default `false`
    /// (feature `testkit`).
    #[cfg(any(test, feature = "testkit"))]
    pub fn inline_io(mut self, inline: bool) -> Self {
        self.inline_io = inline;
        self
    }

    /// After a commit fails (disk full, EIO, a permission lost), how long
    /// until the journal tries again (S-J5). Default 1 s; zero is taken as
    /// 1 ms, and a value too large to add to the clock (`Duration::MAX`)
    /// as about 30 years.
    pub fn retry_interval(mut self, interval: Duration) -> Self {
        self.retry_interval = interval.max(Duration::from_millis(1));
        self
    }

    /// The wall clock each record is stamped with at stage, and against
    /// which a recovery measures a recovered item's age (S-R3): the
    /// system's by default (on Linux its coarse clock: the time at the
    /// kernel's last tick, usually within one, 1-10 ms). For tests and
    /// simulations that stage "long ago" without waiting (feature
    /// `testkit`); the outbox's own timers never read it.
    #[cfg(any(test, feature = "testkit"))]
    pub fn wall_clock(
        mut self,
        clock: impl Fn() -> std::time::SystemTime + Send + Sync + 'static,
    ) -> Self {
        self.wall_clock = WallClock::Given(std::sync::Arc::new(clock));
        self
    }

    /// What a recovery does with items of another codec version than the
    /// outbox's [`Codec::version`](crate::codec::Codec::version) (S-J14):
    /// refuse them (the default), refuse them and hand their bytes to a
    /// function, or fail the build. A journal of the previous format
    /// version holds items of version 0.
    pub fn other_version(mut self, on_other: OtherVersion) -> Self {
        self.other_version = on_other;
        self
    }

    /// Crashes of the process that cut an item's attempts after which a
    /// recovery dead-letters it under `poisoned` without another write
    /// (S-J17; the knob of the outbox table's relay, S-T18). Default 3;
    /// 0 is taken as 1. The suspects of a crash (items whose attempt it
    /// cut) are written alone, one item per write with nothing else in
    /// flight, so a crash during such a write counts against its item
    /// only.
    pub fn max_crash_attempts(mut self, attempts: u32) -> Self {
        self.max_crash_attempts = attempts.max(1);
        self
    }
}
