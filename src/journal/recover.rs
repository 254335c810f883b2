//! Reading a journal directory back at build (D2, D4, S-J7): the file IO
//! of a recovery. The lock is taken, every segment read and decoded, and
//! the core's plan ([`crate::core::journal::plan`]) decides what to
//! refuse, cut, seal, delete and stage again; this module carries the
//! steps out.

use std::collections::BTreeSet;
use std::io;

use super::format::{self, Record, Schema, HEADER_LEN};
use super::storage::{Storage, LOCK_FILE};
use super::{JournalError, OtherRecord, OtherVersion};
use crate::codec::Codec;
use crate::contain;
use crate::core::journal::{
    self as core, Ledger, Limits, SegmentFile, SegmentId, Seq, Step, Unrecognized,
};

/// What a recovery found and did: the counts an operator reads in the
/// build log and the metrics (D4).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Segment files read.
    pub segments: usize,
    /// Items staged again: journaled, not known done.
    pub recovered: u64,
    /// Items in a segment's known range that could not be read back or
    /// decoded, and are not known done: counted lost under
    /// `journal_unreadable`.
    pub unreadable: u64,
    /// Items of another codec version than the recovering one's, not
    /// known done: refused, counted lost under `other_version` (S-J14).
    pub other_version: u64,
    /// Readable items skipped because they are marked done.
    pub done: u64,
    /// Bytes cut from the end of the last segment: a record torn by a
    /// crash (never synced, so never promised, D1).
    pub torn_bytes: u64,
    /// Bytes skipped as damaged between or after valid records.
    pub damaged_bytes: u64,
    /// Segments with a damaged header (their records were still read).
    pub damaged_headers: usize,
    /// Segment files left by a crash while creating one (empty, or at
    /// most a torn header: a header is synced before any record goes in,
    /// S-J7), deleted.
    pub empty_segments: usize,
}

/// A recovery's result: the report, the items to stage again (in order),
/// and the ledger that tracks them.
pub struct Recovered<K, I> {
    /// The counts.
    pub report: RecoveryReport,
    /// Items not known done, in staging order: `(sequence, tenant, item)`.
    pub items: Vec<(Seq, K, I)>,
    /// When each of `items` was staged (same order, same length), in
    /// milliseconds since the Unix epoch on the staging process's wall
    /// clock; 0 when unknown (a record of the previous format, S-R3).
    pub staged_ms: Vec<u64>,
    /// The refused records of another codec version, in staging order,
    /// when [`OtherVersion::Hand`] asked for them (S-J14).
    pub other: Vec<OtherRecord>,
    /// The bookkeeping, with a fresh current segment to create.
    pub ledger: Ledger<K>,
    /// Items whose attempts crashes cut `max_crash_attempts` times, in
    /// staging order: not in `items`, marked done at the first commit, to
    /// be dead-lettered under `poisoned` (S-J17).
    pub poisoned: Vec<(Seq, K, I)>,
    /// `(sequence, crashes)` of the items of `items` that crashes cut
    /// (S-J17), for the new life's record.
    pub crashes: Vec<(Seq, u32)>,
    /// Per tenant, how many of its oldest recovered items go alone: up to
    /// its last suspect (S-J17).
    pub alone: Vec<(K, u64)>,
    /// Per tenant, how many of its oldest recovered items an earlier life
    /// attempted (S-J16).
    pub tried: Vec<(K, u64)>,
}

fn io_err<'a>(op: &'static str, file: &'a str) -> impl FnOnce(io::Error) -> JournalError + 'a {
    move |source| JournalError::Io {
        op,
        file: file.to_owned(),
        source,
    }
}

/// Takes the directory's lock (S-J6).
fn lock(storage: &mut (impl Storage + ?Sized)) -> Result<(), JournalError> {
    storage.lock().map_err(|e| {
        if e.kind() == io::ErrorKind::WouldBlock {
            JournalError::Locked(e)
        } else {
            JournalError::Io {
                op: "lock",
                file: LOCK_FILE.to_owned(),
                source: e,
            }
        }
    })
}

/// A segment file as [`read_segment`] read it.
pub(super) struct Read<K, I> {
    /// What the plan needs.
    pub(super) file: SegmentFile<K, I>,
    /// Its schema record, if readable (none in a version 1 segment).
    pub(super) schema: Option<Schema>,
    /// Its records of another codec version, raw, when asked for.
    pub(super) other: Vec<(Seq, OtherRecord)>,
    /// The first other codec version its items are of.
    pub(super) met: Option<u32>,
    /// The staging time of each decoded item, by sequence number (S-R3).
    pub(super) staged: Vec<(Seq, u64)>,
}

/// Reads segment `id`'s file into what the plan needs: its header, its
/// records decoded through `codec` (a codec that panics is an undecodable
/// record, S-J7, S-J8: a panic here would fail every restart alike). An
/// item of another codec version than `expect` is never decoded (S-J14);
/// `None` decodes every version (the inspector). With `raw`, those items
/// are kept as their bytes.
pub(super) fn read_segment<K, I, C>(
    id: u64,
    bytes: &[u8],
    codec: &C,
    expect: Option<u32>,
    raw: bool,
) -> Read<K, I>
where
    C: Codec<K, I> + ?Sized,
{
    let scan = format::scan(bytes, HEADER_LEN.min(bytes.len()));
    let mut read = Read {
        file: SegmentFile {
            valid_end: scan.valid_end as u64,
            skipped: scan.skipped.iter().map(|r| r.len() as u64).sum(),
            ..empty_file(id, bytes)
        },
        schema: None,
        other: Vec::new(),
        met: None,
        staged: Vec::new(),
    };
    let file = &mut read.file;
    for record in scan.records {
        match record {
            Record::Item {
                seq,
                stamp,
                tenant,
                item,
            } if expect.is_some_and(|v| v != stamp.version) => {
                file.other.push(seq);
                read.met = read.met.or(Some(stamp.version));
                if raw {
                    let record = OtherRecord {
                        version: stamp.version,
                        staged_ms: stamp.staged_ms,
                        tenant: tenant.to_vec(),
                        item: item.to_vec(),
                    };
                    read.other.push((seq, record));
                }
            }
            Record::Item {
                seq,
                stamp,
                tenant,
                item,
            } => {
                let decoded =
                    contain::call(|| (codec.decode_tenant(tenant), codec.decode_item(item)));
                match decoded {
                    Ok((Ok(t), Ok(it))) => {
                        file.items.push((seq, t, it));
                        read.staged.push((seq, stamp.staged_ms));
                    }
                    Ok(partial) => {
                        contain::drop_quietly(partial);
                        file.undecodable.push(seq);
                    }
                    Err(contain::Panicked) => file.undecodable.push(seq),
                }
            }
            Record::Done(seqs) => file.marks.extend(seqs),
            Record::Seal(end) => file.seal = Some(end),
            Record::Schema { version, name } => read.schema = Some(Schema::new(version, &name)),
            other => note_life(&mut file.lives, other),
        }
    }
    read
}

/// A record of the lives (S-J17): attempt and attempt-end marks, life
/// records, clean closes; any other record is not one of them.
fn note_life(lives: &mut core::Lives, record: Record<'_>) {
    match record {
        Record::Attempts { life, seqs } => {
            lives.attempts.extend(seqs.into_iter().map(|s| (life, s)));
        }
        Record::Life { life, counts } => lives.starts.push((life, counts)),
        Record::Clean(life) => lives.clean.push(life),
        Record::Ended { life, seqs } => {
            // After the attempt marks read so far (S-J17).
            let after = lives.attempts.len();
            lives
                .ends
                .extend(seqs.into_iter().map(|s| (after, life, s)));
        }
        Record::Item { .. } | Record::Done(_) | Record::Seal(_) | Record::Schema { .. } => {}
    }
}

/// A segment file of `id` with its header read from `bytes` and nothing
/// scanned yet.
fn empty_file<K, I>(id: u64, bytes: &[u8]) -> SegmentFile<K, I> {
    SegmentFile {
        id,
        head: format::read_header(bytes),
        torn: format::torn_header(bytes),
        len: bytes.len() as u64,
        valid_end: 0,
        skipped: 0,
        items: Vec::new(),
        undecodable: Vec::new(),
        other: Vec::new(),
        marks: Vec::new(),
        seal: None,
        lives: Default::default(),
    }
}

/// The plan's refusal as a build error.
fn unrecognized(r: Unrecognized) -> JournalError {
    match r {
        Unrecognized::Foreign(id) => JournalError::Foreign {
            file: format::segment_name(id),
        },
        Unrecognized::Version { id, version } => JournalError::Version {
            file: format::segment_name(id),
            version,
        },
    }
}

/// The build error of [`OtherVersion::Fail`]: the first segment holding
/// a pending item of another codec version (S-J14).
/// `met`: each segment with such items, the first version met in it and
/// their sequence numbers.
fn other_version_error(
    met: &[(SegmentId, u32, Vec<Seq>)],
    other: &[Seq],
    expected: u32,
) -> JournalError {
    let first = other.first().copied().unwrap_or(0);
    let seg = met.iter().find(|m| m.2.contains(&first));
    JournalError::OtherVersion {
        file: format::segment_name(seg.map_or(0, |m| m.0)),
        version: seg.map_or(0, |m| m.1),
        expected,
        items: other.len() as u64,
    }
}

/// Carries out a recovery's steps on the last segment.
fn carry_out(storage: &mut (impl Storage + ?Sized), steps: &[Step]) -> Result<(), JournalError> {
    for step in steps {
        match *step {
            Step::Delete(id) => {
                // Where deletion is refused (a lost permission), it stays:
                // the first commit creates the same segment, finds it,
                // and writes its header again in place (S-J5).
                let name = format::segment_name(id);
                if let Err(e) = storage.delete(&name) {
                    tracing::warn!(file = %name, error = %e, "journal recovery cannot delete a segment torn while it was created; its header is written again at the first commit");
                }
            }
            Step::Truncate { id, len } => {
                let name = format::segment_name(id);
                storage
                    .truncate(&name, len)
                    .map_err(io_err("truncate", &name))?;
            }
            Step::Seal { id, end } => {
                let name = format::segment_name(id);
                let mut b = Vec::new();
                format::seal(&mut b, end);
                storage.append(&name, &b).map_err(io_err("seal", &name))?;
                storage.sync(&name).map_err(io_err("sync", &name))?;
            }
        }
    }
    Ok(())
}

/// Locks the directory of `storage`, reads every segment back through
/// `codec`, and carries out the core's plan (a torn tail cut, the last
/// segment sealed); returns what to stage again. The new current segment
/// is not created yet (the first commit does). Items of another codec
/// version are refused and counted (S-J14, [`OtherVersion::Refuse`]).
///
/// # Errors
/// [`JournalError::Locked`] when another process holds the directory;
/// [`JournalError::Foreign`] for a file that is not the journal's;
/// [`JournalError::Version`] for a segment of another format version;
/// [`JournalError::Io`] when a file cannot be listed, read, cut or sealed.
#[cfg(any(test, feature = "testkit"))]
pub fn recover<K, I, C, S>(
    storage: &mut S,
    codec: &C,
    limits: Limits,
) -> Result<Recovered<K, I>, JournalError>
where
    K: Ord + std::hash::Hash + Clone,
    C: Codec<K, I> + ?Sized,
    S: Storage + ?Sized,
{
    recover_with(storage, codec, limits, &OtherVersion::Refuse)
}

/// [`recover`], with items of another codec version than `codec`'s
/// treated as `on_other` says (S-J14).
///
/// # Errors
/// As [`recover`]; [`JournalError::OtherVersion`] under
/// [`OtherVersion::Fail`] when an item of another codec version is not
/// known done (nothing on disk is changed then).
#[cfg_attr(not(any(test, feature = "testkit")), allow(dead_code))]
pub fn recover_with<K, I, C, S>(
    storage: &mut S,
    codec: &C,
    limits: Limits,
    on_other: &OtherVersion,
) -> Result<Recovered<K, I>, JournalError>
where
    K: Ord + std::hash::Hash + Clone,
    C: Codec<K, I> + ?Sized,
    S: Storage + ?Sized,
{
    let max = crate::core::relay::DEFAULT_MAX_CRASH_ATTEMPTS;
    recover_judging(storage, codec, limits, on_other, max)
}

/// [`recover_with`], poisoning the items whose attempts crashes cut
/// `max_crash_attempts` times (S-J17).
///
/// # Errors
/// As [`recover_with`].
pub fn recover_judging<K, I, C, S>(
    storage: &mut S,
    codec: &C,
    limits: Limits,
    on_other: &OtherVersion,
    max_crash_attempts: u32,
) -> Result<Recovered<K, I>, JournalError>
where
    K: Ord + std::hash::Hash + Clone,
    C: Codec<K, I> + ?Sized,
    S: Storage + ?Sized,
{
    lock(storage)?;
    let names = storage.list().map_err(io_err("list", "."))?;
    let ids = core::segment_ids(
        names.into_iter().map(|n| {
            let id = format::parse_segment_name(&n);
            (n, id)
        }),
        LOCK_FILE,
    )
    .map_err(|file| JournalError::Foreign { file })?;
    let expected = codec.version();
    let raw = matches!(on_other, OtherVersion::Hand(_));
    let mut reads = Vec::with_capacity(ids.len());
    for id in ids {
        let name = format::segment_name(id);
        let bytes = storage.read(&name).map_err(io_err("read", &name))?;
        reads.push(read_segment(id, &bytes, codec, Some(expected), raw));
    }
    let mut raws = Vec::new();
    let mut met = Vec::new();
    let mut staged = Vec::new();
    let mut files = Vec::with_capacity(reads.len());
    for r in reads {
        raws.extend(r.other);
        staged.extend(r.staged);
        if let Some(v) = r.met {
            met.push((r.file.id, v, r.file.other.clone()));
        }
        files.push(r.file);
    }
    let plan = core::plan(files, format::SEAL_LEN as u64).map_err(unrecognized)?;
    if !plan.other.is_empty() && matches!(on_other, OtherVersion::Fail) {
        return Err(other_version_error(&met, &plan.other, expected));
    }
    carry_out(storage, &plan.steps)?;
    let pending: BTreeSet<Seq> = plan.other.iter().copied().collect();
    let other = raws
        .into_iter()
        .filter(|(seq, _)| pending.contains(seq))
        .map(|(_, r)| r)
        .collect();
    let found = plan.found.clone();
    let header = codec_schema(codec).head_len() as u64;
    let (recovery, ledger) = plan.finish(limits, header, max_crash_attempts);
    let report = RecoveryReport {
        segments: found.segments,
        recovered: recovery.items.len() as u64,
        unreadable: recovery.unreadable,
        other_version: recovery.other,
        done: recovery.done,
        torn_bytes: found.torn_bytes,
        damaged_bytes: found.damaged_bytes,
        damaged_headers: found.damaged_headers,
        empty_segments: found.empty_segments,
    };
    let staged_ms = staging_times(staged, &recovery.items);
    Ok(Recovered {
        report,
        items: recovery.items,
        staged_ms,
        other,
        ledger,
        poisoned: recovery.poisoned,
        crashes: recovery.crashes,
        alone: recovery.alone,
        tried: recovery.tried,
    })
}

/// The staging time of each of `items`, from the `(sequence, time)` pairs
/// read (0 for an item none names).
fn staging_times<K, I>(mut staged: Vec<(Seq, u64)>, items: &[(Seq, K, I)]) -> Vec<u64> {
    staged.sort_unstable_by_key(|&(seq, _)| seq);
    items
        .iter()
        .map(|(seq, _, _)| {
            staged
                .binary_search_by_key(seq, |&(s, _)| s)
                .map_or(0, |i| staged[i].1)
        })
        .collect()
}

/// The schema `codec` writes (S-J14).
pub(crate) fn codec_schema<K, I, C: Codec<K, I> + ?Sized>(codec: &C) -> Schema {
    Schema::new(codec.version(), codec.item_type())
}
