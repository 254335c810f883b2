//! Reading a journal directory back at build (D2, D4, S-J7): the file IO
//! of a recovery. The lock is taken, every segment read and decoded, and
//! the core's plan ([`crate::core::journal::plan`]) decides what to
//! refuse, cut, seal, delete and stage again; this module carries the
//! steps out.

use std::io;

use super::format::{self, Record, HEADER_LEN};
use super::storage::{Storage, LOCK_FILE};
use super::JournalError;
use crate::codec::Codec;
use crate::contain;
use crate::core::journal::{self as core, Ledger, Limits, Refused, SegmentFile, Seq, Step};

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
    /// The bookkeeping, with a fresh current segment to create.
    pub ledger: Ledger<K>,
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

/// Reads segment `id`'s file into what the plan needs: its header, its
/// records decoded through `codec` (a codec that panics is an undecodable
/// record, S-J7, S-J8: a panic here would fail every restart alike).
pub(super) fn read_segment<K, I, C>(id: u64, bytes: &[u8], codec: &C) -> SegmentFile<K, I>
where
    C: Codec<K, I> + ?Sized,
{
    let scan = format::scan(bytes, HEADER_LEN.min(bytes.len()));
    let mut file = SegmentFile {
        id,
        head: format::read_header(bytes),
        torn: format::torn_header(bytes),
        len: bytes.len() as u64,
        valid_end: scan.valid_end as u64,
        skipped: scan.skipped.iter().map(|r| r.len() as u64).sum(),
        items: Vec::new(),
        undecodable: Vec::new(),
        marks: Vec::new(),
        seal: None,
    };
    for record in scan.records {
        match record {
            Record::Item { seq, tenant, item } => {
                let decoded =
                    contain::call(|| (codec.decode_tenant(tenant), codec.decode_item(item)));
                match decoded {
                    Ok((Ok(t), Ok(it))) => file.items.push((seq, t, it)),
                    Ok(partial) => {
                        contain::drop_quietly(partial);
                        file.undecodable.push(seq);
                    }
                    Err(contain::Panicked) => file.undecodable.push(seq),
                }
            }
            Record::Done(seqs) => file.marks.extend(seqs),
            Record::Seal(end) => file.seal = Some(end),
        }
    }
    file
}

/// The plan's refusal as a build error.
fn refused(r: Refused) -> JournalError {
    match r {
        Refused::Foreign(id) => JournalError::Foreign {
            file: format::segment_name(id),
        },
        Refused::Version { id, version } => JournalError::Version {
            file: format::segment_name(id),
            version,
        },
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
/// is not created yet (the first commit does).
///
/// # Errors
/// [`JournalError::Locked`] when another process holds the directory;
/// [`JournalError::Foreign`] for a file that is not the journal's;
/// [`JournalError::Version`] for a segment of another format version;
/// [`JournalError::Io`] when a file cannot be listed, read, cut or sealed.
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
    let mut files = Vec::with_capacity(ids.len());
    for id in ids {
        let name = format::segment_name(id);
        let bytes = storage.read(&name).map_err(io_err("read", &name))?;
        files.push(read_segment(id, &bytes, codec));
    }
    let plan = core::plan(files, format::SEAL_LEN as u64).map_err(refused)?;
    carry_out(storage, &plan.steps)?;
    let found = plan.found.clone();
    let (recovery, ledger) = plan.finish(limits, HEADER_LEN as u64);
    let report = RecoveryReport {
        segments: found.segments,
        recovered: recovery.items.len() as u64,
        unreadable: recovery.unreadable,
        done: recovery.done,
        torn_bytes: found.torn_bytes,
        damaged_bytes: found.damaged_bytes,
        damaged_headers: found.damaged_headers,
        empty_segments: found.empty_segments,
    };
    Ok(Recovered {
        report,
        items: recovery.items,
        ledger,
    })
}
