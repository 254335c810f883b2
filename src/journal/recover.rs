//! Reading a journal directory back at build (D2, D4, S-J7): every
//! segment scanned through damage, a torn tail cut, the last segment
//! sealed, and the items not known done handed back in staging order.

use std::io;

use super::format::{self, Header, Record, HEADER_LEN};
use super::storage::{Storage, LOCK_FILE};
use super::JournalError;
use crate::codec::Codec;
use crate::core::journal::{Ledger, Limits, Recovery, ScannedSegment, Seq};
use crate::driver::contain;

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

/// Locks the directory of `storage`, reads every segment back through
/// `codec`, cuts a torn tail and seals the last segment; returns what to
/// stage again. The new current segment is not created yet (the caller
/// does, through the ledger's `current()`).
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
    })?;
    let mut ids = Vec::new();
    for name in storage.list().map_err(io_err("list", "."))? {
        if name == LOCK_FILE {
            continue;
        }
        match format::parse_segment_name(&name) {
            Some(id) => ids.push(id),
            None => return Err(JournalError::Foreign { file: name }),
        }
    }
    ids.sort_unstable();
    let mut report = RecoveryReport::default();
    let mut files = Vec::with_capacity(ids.len());
    for (i, &id) in ids.iter().enumerate() {
        let name = format::segment_name(id);
        let bytes = storage.read(&name).map_err(io_err("read", &name))?;
        let header = format::read_header(&bytes);
        if i + 1 == ids.len() && format::torn_header(&bytes) {
            // A crash while creating it, before its header was durable: it
            // never held a record (a header is synced before any record
            // goes in, S-J7). Where deletion is refused (a lost
            // permission), it stays: the first commit creates the same
            // segment, finds it, and writes its header again in place
            // (S-J5).
            if let Err(e) = storage.delete(&name) {
                tracing::warn!(file = %name, error = %e, "journal recovery cannot delete a segment torn while it was created; its header is written again at the first commit");
            }
            report.empty_segments += 1;
            continue;
        }
        match header {
            Header::Foreign => return Err(JournalError::Foreign { file: name }),
            Header::Version(v) => {
                return Err(JournalError::Version {
                    file: name,
                    version: v,
                })
            }
            Header::Valid { id: inner, .. } if inner != id => {
                return Err(JournalError::Foreign { file: name })
            }
            Header::Short | Header::Damaged => report.damaged_headers += 1,
            Header::Valid { .. } => {}
        }
        files.push((id, header, bytes));
    }
    report.segments = files.len();
    let mut scanned: Vec<ScannedSegment<K, I>> = Vec::with_capacity(files.len());
    let mut cut = None;
    let last = files.len().checked_sub(1);
    for (i, (id, header, bytes)) in files.iter().enumerate() {
        let scan = format::scan(bytes, HEADER_LEN.min(bytes.len()));
        let tail = (bytes.len() - scan.valid_end) as u64;
        report.damaged_bytes += scan.skipped.iter().map(|r| r.len() as u64).sum::<u64>();
        let mut seg = ScannedSegment {
            id: *id,
            first: 0,
            end: None,
            items: Vec::new(),
            undecodable: Vec::new(),
            marks: Vec::new(),
            bytes: scan.valid_end as u64,
        };
        for record in scan.records {
            match record {
                Record::Item { seq, tenant, item } => {
                    // A codec that panics is an undecodable record (S-J7,
                    // S-J8): a panic here would fail every restart alike.
                    let decoded =
                        contain::call(|| (codec.decode_tenant(tenant), codec.decode_item(item)));
                    match decoded {
                        Ok((Ok(t), Ok(it))) => seg.items.push((seq, t, it)),
                        Ok(partial) => {
                            contain::drop_quietly(partial);
                            seg.undecodable.push(seq);
                        }
                        Err(contain::Panicked) => seg.undecodable.push(seq),
                    }
                }
                Record::Done(seqs) => seg.marks.extend(seqs),
                Record::Seal(end) => seg.end = Some(end),
            }
        }
        let lowest = seg
            .items
            .iter()
            .map(|x| x.0)
            .chain(seg.undecodable.iter().copied())
            .min();
        seg.first = match header {
            Header::Valid { first, .. } => *first,
            // A damaged header: the previous segment's end if it is the
            // one just before, else the lowest readable sequence number.
            _ => scanned
                .last()
                .filter(|p| p.id + 1 == *id)
                .and_then(|p| p.end)
                .or(lowest)
                .unwrap_or(1),
        };
        if Some(i) == last {
            if tail > 0 {
                report.torn_bytes = tail;
                cut = Some(scan.valid_end as u64);
            }
        } else {
            report.damaged_bytes += tail;
            seg.bytes = bytes.len() as u64;
        }
        scanned.push(seg);
    }
    // A segment's range ends where the next one's starts, when its seal is
    // unreadable and the next one is its direct successor.
    for i in 1..scanned.len() {
        let (before, after) = scanned.split_at_mut(i);
        let prev = before.last_mut().expect("i >= 1");
        if prev.end.is_none() && prev.id + 1 == after[0].id {
            prev.end = Some(after[0].first);
        }
    }
    if let Some(seg) = scanned.last_mut() {
        let name = format::segment_name(seg.id);
        if let Some(len) = cut {
            storage
                .truncate(&name, len)
                .map_err(io_err("truncate", &name))?;
        }
        if seg.end.is_none() {
            let end = seg
                .items
                .iter()
                .map(|x| x.0 + 1)
                .chain(seg.undecodable.iter().map(|s| s + 1))
                .chain(seg.marks.iter().map(|s| s + 1))
                .max()
                .unwrap_or(seg.first)
                .max(seg.first);
            let mut b = Vec::new();
            format::seal(&mut b, end);
            storage.append(&name, &b).map_err(io_err("seal", &name))?;
            storage.sync(&name).map_err(io_err("sync", &name))?;
            seg.end = Some(end);
            seg.bytes += b.len() as u64;
        }
    }
    let (recovery, ledger) = Recovery::new(scanned, limits, HEADER_LEN as u64);
    report.recovered = recovery.items.len() as u64;
    report.unreadable = recovery.unreadable;
    report.done = recovery.done;
    Ok(Recovered {
        report,
        items: recovery.items,
        ledger,
    })
}
