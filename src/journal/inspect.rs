//! Looking inside a journal directory without starting the service
//! (issue 25, S-J13): its segments, the items pending per tenant, the
//! damage and where it is, the disk use. Read only: nothing is cut,
//! sealed or deleted. On a directory another process holds (a running
//! outbox), the read is a snapshot that tolerates a growing tail and
//! segments deleted while it reads, and says so.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File};
use std::io;
use std::path::Path;

use super::format::{self, HEADER_LEN};
use super::recover::read_segment;
use super::storage::LOCK_FILE;
use super::{JournalError, OtherRecord};
use crate::codec::Codec;
use crate::core::journal::{self as core, Head, Limits, Seq};
use crate::sink::BoxError;

/// One segment file as the inspector found it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentInfo {
    /// Its file name.
    pub name: String,
    /// Its id.
    pub id: u64,
    /// Its size in bytes.
    pub bytes: u64,
    /// What its header says: `valid`, `short`, `damaged`, `version`
    /// (another format version) or `foreign`.
    pub header: &'static str,
    /// Its first sequence number, from an intact header.
    pub first: Option<Seq>,
    /// The format version of an intact header, or the other one it names.
    pub version: Option<u16>,
    /// Its seal record's end, if it has one.
    pub sealed: Option<Seq>,
    /// The codec version and item type its schema record names (S-J14;
    /// none in a segment of the previous format version, or when the
    /// record is damaged).
    pub schema: Option<(u32, String)>,
    /// The codec versions its item records carry, each once, ascending.
    pub item_versions: Vec<u32>,
    /// Readable item records.
    pub items: usize,
    /// Done marks.
    pub marks: usize,
    /// Damaged byte ranges `[start, end)` between or after valid records
    /// (the last segment's tail aside, see [`Inspection::torn_bytes`]).
    pub damaged: Vec<(u64, u64)>,
}

/// What [`inspect`] found.
#[derive(Clone, Debug)]
pub struct Inspection<K, I> {
    /// Another process held the directory: a snapshot of a running
    /// journal (its tail may have grown, segments may have gone).
    pub live: bool,
    /// The segment files, in id order.
    pub segments: Vec<SegmentInfo>,
    /// The items a recovery would stage again, in staging order:
    /// `(sequence, tenant, item)`.
    pub pending: Vec<(Seq, K, I)>,
    /// Items in a segment's range that cannot be read back or decoded and
    /// are not known done: a recovery counts them lost (D4).
    pub unreadable: u64,
    /// The pending items of another codec version than `codec`'s, as
    /// their bytes, in staging order: a recovery by an outbox of this
    /// codec refuses them (S-J14).
    pub other: Vec<(Seq, OtherRecord)>,
    /// Readable items already marked done.
    pub done: u64,
    /// Bytes past the last valid record of the last segment: a torn write
    /// a recovery cuts (or, live, a commit still being written).
    pub torn_bytes: u64,
    /// Bytes of every segment file.
    pub bytes: u64,
}

impl<K: Ord, I> Inspection<K, I> {
    /// Whether nothing is damaged: every header intact, no damaged range,
    /// no unreadable item.
    pub fn is_clean(&self) -> bool {
        self.unreadable == 0
            && self
                .segments
                .iter()
                .all(|s| s.header == "valid" && s.damaged.is_empty())
    }

    /// Pending items per tenant.
    pub fn per_tenant(&self) -> BTreeMap<&K, usize> {
        let mut per = BTreeMap::new();
        for (_, tenant, _) in &self.pending {
            *per.entry(tenant).or_default() += 1;
        }
        per
    }
}

/// A codec that decodes tenants and items as their bytes: for looking at
/// a journal without the service's types (the `outbox-inspect` tool shows
/// them as hex). It encodes bytes as they are.
#[derive(Clone, Copy, Debug, Default)]
pub struct RawBytes;

impl Codec<Vec<u8>, Vec<u8>> for RawBytes {
    fn encode_tenant(&self, tenant: &Vec<u8>, out: &mut Vec<u8>) -> Result<(), BoxError> {
        out.extend_from_slice(tenant);
        Ok(())
    }
    fn decode_tenant(&self, bytes: &[u8]) -> Result<Vec<u8>, BoxError> {
        Ok(bytes.to_vec())
    }
    fn encode_item(&self, item: &Vec<u8>, out: &mut Vec<u8>) -> Result<(), BoxError> {
        out.extend_from_slice(item);
        Ok(())
    }
    fn decode_item(&self, bytes: &[u8]) -> Result<Vec<u8>, BoxError> {
        Ok(bytes.to_vec())
    }
}

fn io_err<'a>(op: &'static str, file: &'a str) -> impl FnOnce(io::Error) -> JournalError + 'a {
    move |source| JournalError::Io {
        op,
        file: file.to_owned(),
        source,
    }
}

/// Takes the directory's lock if it is free, for the time of the read (so
/// that no outbox opens it meanwhile); `None` when another process holds
/// it. A directory without a lock file is not locked.
fn try_lock(dir: &Path) -> Result<Option<Option<File>>, JournalError> {
    let path = dir.join(LOCK_FILE);
    let file = match File::options().write(true).open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Some(None)),
        Err(e) => return Err(io_err("lock", LOCK_FILE)(e)),
    };
    match fs4::FileExt::try_lock(&file) {
        Ok(()) => Ok(Some(Some(file))),
        Err(fs4::TryLockError::WouldBlock) => Ok(None),
        Err(fs4::TryLockError::Error(e)) => Err(io_err("lock", LOCK_FILE)(e)),
    }
}

fn head_name(head: Head) -> (&'static str, Option<Seq>, Option<u16>) {
    match head {
        Head::Valid { first, v1, .. } => {
            let version = if v1 { format::V1 } else { format::VERSION };
            ("valid", Some(first), Some(version))
        }
        Head::Short => ("short", None, None),
        Head::Damaged => ("damaged", None, None),
        Head::Version(v) => ("version", None, Some(v)),
        Head::Foreign => ("foreign", None, None),
    }
}

/// Reads the journal in `dir` through `codec`, read only (S-J13): what a
/// recovery would stage again and count lost, and where the damage is.
/// Items of another codec version than `codec`'s are not decoded: they
/// are shown as their bytes ([`Inspection::other`], S-J14).
///
/// # Errors
/// [`JournalError::Foreign`] for a file that is not the journal's;
/// [`JournalError::Io`] when the directory or a file cannot be read (a
/// segment deleted during a live read is skipped).
pub fn inspect<K, I, C>(dir: impl AsRef<Path>, codec: &C) -> Result<Inspection<K, I>, JournalError>
where
    K: Ord + std::hash::Hash + Clone,
    C: Codec<K, I> + ?Sized,
{
    let dir = dir.as_ref();
    let shown = dir.display().to_string();
    let lock = try_lock(dir)?;
    let live = lock.is_none();
    let mut names = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_err("list", &shown))? {
        let entry = entry.map_err(io_err("list", &shown))?;
        names.push(entry.file_name().to_string_lossy().into_owned());
    }
    let ids = core::segment_ids(
        names.into_iter().map(|n| {
            let id = format::parse_segment_name(&n);
            (n, id)
        }),
        LOCK_FILE,
    )
    .map_err(|file| JournalError::Foreign { file })?;
    let mut segments = Vec::new();
    let mut files = Vec::new();
    let mut raws = Vec::new();
    for id in ids {
        let name = format::segment_name(id);
        let bytes = match fs::read(dir.join(&name)) {
            Ok(b) => b,
            // Deleted since the listing: a running journal freed it.
            Err(e) if live && e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_err("read", &name)(e)),
        };
        segments.push(describe(id, name, &bytes));
        let read = read_segment(id, &bytes, codec, Some(codec.version()), true);
        raws.extend(read.other);
        files.push(read.file);
    }
    drop(lock);
    let torn_bytes = segments.last_mut().map_or(0, |s| {
        // The last segment's damaged tail is a torn write (or, live, one
        // being written), not damage.
        let tail = s
            .damaged
            .last()
            .filter(|r| r.1 == s.bytes)
            .map_or(0, |r| r.1 - r.0);
        if tail > 0 {
            s.damaged.pop();
        }
        tail
    });
    let bytes = segments.iter().map(|s| s.bytes).sum();
    let (pending, unreadable, done, other) = match core::plan(files, format::SEAL_LEN as u64) {
        Ok(plan) => {
            let limits = Limits {
                segment_bytes: u64::MAX,
                max_bytes: None,
            };
            let refused: BTreeSet<Seq> = plan.other.iter().copied().collect();
            raws.retain(|(seq, _)| refused.contains(seq));
            raws.sort_by_key(|(seq, _)| *seq);
            // Nothing is judged poisoned here: every pending item is shown.
            let (r, _) = plan.finish(limits, HEADER_LEN as u64, u32::MAX);
            (r.items, r.unreadable, r.done, raws)
        }
        // Another format version: nothing can be read back.
        Err(_) => (Vec::new(), 0, 0, Vec::new()),
    };
    Ok(Inspection {
        live,
        segments,
        pending,
        unreadable,
        other,
        done,
        torn_bytes,
        bytes,
    })
}

/// A segment file's header, records and damaged ranges.
fn describe(id: u64, name: String, bytes: &[u8]) -> SegmentInfo {
    let (header, first, version) = head_name(format::read_header(bytes));
    let scan = format::scan(bytes, HEADER_LEN.min(bytes.len()));
    let mut damaged: Vec<(u64, u64)> = scan
        .skipped
        .iter()
        .map(|r| (r.start as u64, r.end as u64))
        .collect();
    if scan.valid_end < bytes.len() {
        damaged.push((scan.valid_end as u64, bytes.len() as u64));
    }
    let (mut items, mut marks, mut sealed, mut schema) = (0, 0, None, None);
    let mut versions = BTreeSet::new();
    for record in &scan.records {
        match record {
            format::Record::Item { stamp, .. } => {
                items += 1;
                versions.insert(stamp.version);
            }
            format::Record::Done(seqs) => marks += seqs.len(),
            format::Record::Seal(end) => sealed = Some(*end),
            format::Record::Schema { version, name } => schema = Some((*version, name.clone())),
            // The journal's lives (S-J17): read at recovery, not shown.
            format::Record::Attempts { .. }
            | format::Record::Life { .. }
            | format::Record::Clean(_)
            | format::Record::Ended { .. } => {}
        }
    }
    SegmentInfo {
        name,
        id,
        bytes: bytes.len() as u64,
        header,
        first,
        version,
        sealed,
        schema,
        item_versions: versions.into_iter().collect(),
        items,
        marks,
        damaged,
    }
}
