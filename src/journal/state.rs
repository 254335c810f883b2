//! The journal's in-memory side (S-J1..S-J5): the ledger and the bytes
//! waiting for the next group commit, kept under the outbox's lock; and
//! the [`Committer`] that carries a [`Batch`] to the [`Storage`] off that
//! lock.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io;

use super::format::{self, Unsealed, HEADER_LEN, SEAL_LEN};
use super::storage::Storage;
use crate::core::journal::{Ledger, MarkSizes, SegmentId, Seq};

/// One step of a group commit, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Create segment `id` and write its header (first sequence `first`).
    Create {
        /// The segment.
        id: SegmentId,
        /// Its first sequence number.
        first: Seq,
    },
    /// Append `bytes` (records) to segment `id`.
    Append {
        /// The segment.
        id: SegmentId,
        /// Framed records; item records without their checksums, which
        /// the [`Committer`] computes as it writes them.
        bytes: Vec<u8>,
    },
    /// Append a seal record (`end`) to segment `id`; nothing if the
    /// segment is not on disk.
    Seal {
        /// The segment.
        id: SegmentId,
        /// Every item of the segment is below this sequence number.
        end: Seq,
    },
    /// Delete segment `id` (after every append of the batch is synced).
    Delete(SegmentId),
    /// Delete segment `id` first, before anything else the batch does
    /// (whatever fails next): a failed resume's
    /// segment, which holds no item and only done marks that the batch
    /// writes again (lost in a crash before then, they stage their items
    /// again, S-J3), so that an outage does not leave a file per retry
    /// (S-J5). A failure does not fail the batch: the deletion waits
    /// like a [`Delete`](Op::Delete).
    Discard(SegmentId),
}

impl Op {
    /// The segment the op writes to, if it writes.
    fn writes(&self) -> Option<SegmentId> {
        match self {
            Op::Create { id, .. } | Op::Append { id, .. } | Op::Seal { id, .. } => Some(*id),
            Op::Delete(_) | Op::Discard(_) => None,
        }
    }
}

/// What one group commit carries to the disk.
#[derive(Debug, Default)]
pub struct Batch {
    /// The steps, in order; deletions last.
    pub ops: Vec<Op>,
    /// Every item with a smaller sequence number is in this batch or an
    /// earlier one: once it is synced, they are all durable.
    pub upto: Seq,
}

impl Batch {
    /// Whether there is nothing to do.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Bytes appended by the batch (headers included).
    pub fn bytes(&self) -> usize {
        self.ops
            .iter()
            .map(|op| match op {
                Op::Create { .. } => HEADER_LEN,
                Op::Append { bytes, .. } => bytes.len(),
                Op::Seal { .. } => SEAL_LEN,
                Op::Delete(_) | Op::Discard(_) => 0,
            })
            .sum()
    }
}

/// The journal's state under the outbox's lock: the [`Ledger`] and the
/// records waiting for the next commit. Every method is O(1) or
/// O(log n) per item and does no IO.
#[derive(Debug)]
pub struct JournalState<K> {
    ledger: Ledger<K>,
    ops: Vec<Op>,
    buffered: usize,
    /// Every item below this sequence number is durable (or was in a
    /// failed commit, and is counted undurable).
    synced: Seq,
    /// Whether commits fail: stages are unjournaled until a retry works.
    down: bool,
    /// Segments written by the commit in flight (to seal after a fault).
    in_flight: BTreeSet<SegmentId>,
    /// Where the ranges of the segments a failed commit wrote end: what
    /// was synced before it.
    failed_end: Seq,
    /// Done marks and deletions of the commit in flight, and of failed
    /// commits still to redo once the journal resumes: the ledger counted
    /// them already, the disk may not have them (S-J5).
    taken_marks: Vec<Seq>,
    taken_deletes: Vec<SegmentId>,
    redo_marks: Vec<Seq>,
    redo_deletes: Vec<SegmentId>,
    /// The segment the last resume opened, while its commit is in flight
    /// or failed. When it failed, the ledger forgets it and the next
    /// resume discards it first (S-J5), so a long outage neither counts a
    /// segment and its marks against `max_bytes` per retry nor leaves a
    /// file per retry.
    resume_segment: Option<SegmentId>,
    /// An empty record buffer a finished commit handed back
    /// ([`recycle`](Self::recycle)), for the next append to fill.
    spare: Vec<u8>,
}

impl<K: Ord + std::hash::Hash + Clone> JournalState<K> {
    /// The state around `ledger`, whose current segment is still to be
    /// created (the first commit creates it).
    pub fn new(ledger: Ledger<K>) -> Self {
        let first = ledger.next_seq();
        let id = ledger.current();
        JournalState {
            ops: vec![Op::Create { id, first }],
            buffered: HEADER_LEN,
            synced: first,
            down: false,
            in_flight: BTreeSet::new(),
            failed_end: first,
            taken_marks: Vec::new(),
            taken_deletes: Vec::new(),
            redo_marks: Vec::new(),
            redo_deletes: Vec::new(),
            resume_segment: None,
            spare: Vec::new(),
            ledger,
        }
    }

    /// The bookkeeping.
    pub fn ledger(&self) -> &Ledger<K> {
        &self.ledger
    }

    /// Whether commits are failing (S-J5).
    pub fn is_down(&self) -> bool {
        self.down
    }

    /// Whether a failed commit left done marks or deletions that only a
    /// resume writes (S-J5): work left, though nothing is buffered.
    pub fn has_redo(&self) -> bool {
        !self.redo_marks.is_empty() || !self.redo_deletes.is_empty()
    }

    /// Bytes waiting for the next commit.
    pub fn buffered(&self) -> usize {
        self.buffered
    }

    /// Every item below this sequence number is durable or undurable
    /// (counted in [`Ledger::undurable`]).
    pub fn synced(&self) -> Seq {
        self.synced
    }

    /// The sequence number the next item gets: a sync barrier taken now
    /// waits until [`synced`](Self::synced) reaches it.
    pub fn barrier(&self) -> Seq {
        self.ledger.next_seq()
    }

    /// Whether an item record of `len` bytes may be appended under
    /// `max_bytes` (S-J4).
    pub fn fits(&self, len: usize) -> bool {
        self.ledger.fits(len as u64, HEADER_LEN as u64)
    }

    /// Takes an accepted item: journaled in the buffer, or, while the
    /// journal is down, only placed in its tenant's order (S-J5). Returns
    /// whether it was journaled.
    pub fn append<'a>(&mut self, tenant: K, item: impl Into<Unsealed<'a>>) -> bool {
        let item = item.into();
        let len = item.len();
        // Past `max_bytes` only if the caller did not check `fits`.
        if self.down || !self.fits(len) {
            self.ledger.unjournaled(tenant);
            return false;
        }
        let step = self
            .ledger
            .append(tenant, len as u64, HEADER_LEN as u64)
            .expect("refused only past `max_bytes`, which `fits` checked");
        if let Some(id) = step.roll {
            self.ops.push(Op::Seal {
                id: id - 1,
                end: step.seq,
            });
            self.ops.push(Op::Create {
                id,
                first: step.seq,
            });
            self.buffered += HEADER_LEN + SEAL_LEN;
        }
        self.buffered += len;
        let id = self.ledger.current();
        match self.ops.last_mut() {
            Some(Op::Append { id: last, bytes }) if *last == id => {
                item.frame_unsealed(step.seq, bytes)
            }
            _ => {
                let mut bytes = self.fresh(len);
                item.frame_unsealed(step.seq, &mut bytes);
                self.ops.push(Op::Append { id, bytes });
            }
        }
        true
    }

    /// An empty buffer for the records of a new append: the spare one a
    /// finished commit handed back, if any (so that in steady state two
    /// buffers take turns, one filling while the other is written, and
    /// staging neither allocates nor grows a buffer).
    fn fresh(&mut self, len: usize) -> Vec<u8> {
        let mut bytes = std::mem::take(&mut self.spare);
        bytes.clear();
        bytes.reserve(len.max(4_096));
        bytes
    }

    /// A commit of `batch` is done: its largest record buffer is kept,
    /// emptied, for the next batch to fill, unless its capacity is over
    /// `max_capacity` bytes (a burst is not held on to).
    pub fn recycle(&mut self, batch: Batch, max_capacity: usize) {
        let largest = batch
            .ops
            .into_iter()
            .filter_map(|op| match op {
                Op::Append { bytes, .. } => Some(bytes),
                _ => None,
            })
            .filter(|b| b.capacity() <= max_capacity)
            .max_by_key(Vec::capacity);
        if let Some(bytes) = largest {
            if bytes.capacity() > self.spare.capacity() {
                self.spare = bytes;
            }
        }
    }

    /// Appends records to segment `id` in the buffer.
    fn push(&mut self, id: SegmentId, bytes: Vec<u8>) {
        self.buffered += bytes.len();
        match self.ops.last_mut() {
            Some(Op::Append { id: last, bytes: b }) if *last == id => b.extend_from_slice(&bytes),
            _ => self.ops.push(Op::Append { id, bytes }),
        }
    }

    /// The oldest `n` pending items of `tenant` are done.
    pub fn settle(&mut self, tenant: &K, n: u64) {
        self.ledger.settle(tenant, n);
    }

    /// Every pending item is done (shutdown deadline, abandon).
    pub fn settle_all(&mut self) {
        self.ledger.settle_all();
    }

    /// Takes what the next commit writes: the buffered records, the done
    /// marks, then the segments that can go. Empty while the journal is
    /// down (see [`resume`](Self::resume)).
    pub fn take_batch(&mut self) -> Batch {
        self.take_batch_then(false)
    }

    /// Like [`take_batch`](Self::take_batch); with `roll_if_idle`, and no
    /// journaled item pending once the marks are taken, the batch also
    /// starts a fresh segment so that every older one goes (D6: a clean
    /// shutdown leaves one empty segment).
    pub fn take_batch_then(&mut self, roll_if_idle: bool) -> Batch {
        if self.down {
            return Batch::default();
        }
        let first_segment = self.ledger.current();
        let runs = self.ledger.take_mark_runs(MarkSizes {
            header: HEADER_LEN as u64,
            record: format::DONE_OVERHEAD as u64,
            mark: format::MARK_LEN as u64,
            per_record: format::MARKS_PER_RECORD,
        });
        let mut marks = Vec::new();
        // The ledger has rolled through every run already: each run's
        // segment is the one its own roll (or an earlier run's) opened.
        let mut segment = first_segment;
        for run in runs {
            if let Some(id) = run.roll {
                self.rolled(segment, id);
                segment = id;
            }
            let mut b =
                Vec::with_capacity(format::DONE_OVERHEAD + run.seqs.len() * format::MARK_LEN);
            format::done(&mut b, &run.seqs);
            debug_assert_eq!(
                b.len(),
                format::DONE_OVERHEAD + run.seqs.len() * format::MARK_LEN
            );
            self.push(segment, b);
            marks.extend(run.seqs);
        }
        if roll_if_idle && self.ledger.live() == 0 {
            self.roll();
        }
        let mut ops = std::mem::take(&mut self.ops);
        self.buffered = 0;
        self.taken_deletes.clear();
        while let Some(id) = self.ledger.poll_delete() {
            ops.push(Op::Delete(id));
            self.taken_deletes.push(id);
        }
        self.taken_marks = marks;
        self.in_flight = ops.iter().filter_map(Op::writes).collect();
        Batch {
            ops,
            upto: self.ledger.next_seq(),
        }
    }

    /// The commit of a batch taken with `upto` is done: durable, or it
    /// failed and the journal is down (its unsynced items are undurable
    /// now, S-J5). Returns how many items became undurable.
    pub fn committed(&mut self, upto: Seq, ok: bool) -> u64 {
        if ok {
            self.synced = self.synced.max(upto);
            self.in_flight.clear();
            if self.down {
                // The resume carried the redo, and the deletion of the
                // segments of failed resumes.
                self.redo_marks.clear();
                self.redo_deletes.clear();
                self.resume_segment = None;
            }
            self.taken_marks.clear();
            self.taken_deletes.clear();
            self.down = false;
            return 0;
        }
        if !self.down {
            // The first failure of an incident: the segments written since
            // hold nothing promised past this.
            self.failed_end = self.synced;
            // Its marks and deletions are redone by the resume.
            self.redo_marks.append(&mut self.taken_marks);
            self.redo_deletes.append(&mut self.taken_deletes);
        }
        self.down = true;
        // Every item the buffer held since is on no disk either.
        self.ops.clear();
        self.buffered = 0;
        let lost = self.ledger.incident(self.synced);
        self.synced = self.ledger.next_seq();
        lost
    }

    /// Starts a fresh segment now.
    fn roll(&mut self) {
        let old = self.ledger.current();
        let id = self.ledger.roll(HEADER_LEN as u64);
        self.rolled(old, id);
    }

    /// The ledger rolled from segment `old` to `id` with no item between:
    /// seal the one, create the other.
    fn rolled(&mut self, old: SegmentId, id: SegmentId) {
        let end = self.ledger.next_seq();
        self.ops.push(Op::Seal { id: old, end });
        self.ops.push(Op::Create { id, first: end });
        self.buffered += HEADER_LEN + SEAL_LEN;
    }

    /// After a fault: the batch that retries the journal, sealing the
    /// segments the failed commit wrote (their range ends at what was
    /// synced), opening a new segment, and redoing the failed commit's
    /// done marks and deletions. If it commits, the journal is up
    /// again; if not, call `committed(_, false)` and retry later.
    pub fn resume(&mut self) -> Batch {
        let end = self.failed_end;
        let id = self.ledger.roll(HEADER_LEN as u64);
        // The last resume failed: its segment is replaced by this one, and
        // goes first, so at most one is left on disk while the outage
        // lasts.
        let discard = self
            .resume_segment
            .replace(id)
            .filter(|prev| self.ledger.abandon(*prev));
        let mut ops: Vec<Op> = discard.map(Op::Discard).into_iter().collect();
        ops.extend(
            std::mem::take(&mut self.in_flight)
                .into_iter()
                .filter(|s| Some(*s) != discard)
                .map(|id| Op::Seal { id, end }),
        );
        ops.push(Op::Create {
            id,
            first: self.ledger.next_seq(),
        });
        if !self.redo_marks.is_empty() {
            let mut b = Vec::with_capacity(format::done_len(self.redo_marks.len()));
            format::done(&mut b, &self.redo_marks);
            self.ledger.add_bytes(b.len() as u64);
            self.ledger.remark(&self.redo_marks);
            ops.push(Op::Append { id, bytes: b });
        }
        ops.extend(self.redo_deletes.iter().map(|d| Op::Delete(*d)));
        self.in_flight = ops.iter().filter_map(Op::writes).collect();
        Batch {
            ops,
            upto: self.ledger.next_seq(),
        }
    }
}

/// Carries batches to a [`Storage`]: appends in order, then one sync per
/// segment written, then deletions (S-J2: a segment goes only after the
/// marks that free it are durable).
///
/// A deletion that fails does not fail the commit: the batch is durable,
/// and a file left behind costs disk space, not items. Deletions wait in
/// the order the ledger gave them, each tried again after every later
/// commit; none is tried before those ahead of it are done, so a segment
/// holding the done marks of another never goes while that other's file
/// is still there (S-J2).
///
/// A new segment's header is written and synced on its own, before any
/// record goes in (S-J7): a disk may keep a later write of a file and lose
/// an earlier unsynced one, and a segment whose header is lost while its
/// records survive could not be told from a foreign file. A segment whose
/// creation failed is deleted before anything else is written.
#[derive(Debug)]
pub struct Committer<S> {
    storage: S,
    /// Segments whose creation failed (their header may be missing or
    /// torn) and whose deletion has not worked yet, with their first
    /// sequence numbers.
    unheaded: BTreeMap<SegmentId, Seq>,
    /// Deletions not done yet, in the ledger's order.
    undeleted: VecDeque<SegmentId>,
}

impl<S: Storage> Committer<S> {
    /// A committer on `storage` (already locked by the recovery).
    pub fn new(storage: S) -> Self {
        Committer {
            storage,
            unheaded: BTreeMap::new(),
            undeleted: VecDeque::new(),
        }
    }

    /// Creates segment `id` with a durable header (first sequence
    /// `first`). On failure the segment is remembered as unheaded and its
    /// deletion tried at once.
    fn create(&mut self, id: SegmentId, first: Seq) -> io::Result<()> {
        let name = format::segment_name(id);
        let made = self.storage.create(&name).and_then(|()| {
            self.storage.append(&name, &format::header(id, first))?;
            self.storage.sync(&name)
        });
        if made.is_err() {
            self.unheaded.insert(id, first);
            self.delete_unheaded();
        }
        made
    }

    /// Deletes every segment whose creation failed, or, where deletion is
    /// refused (a lost permission), writes its header again in place, so
    /// that no file without a header stays before a later segment (S-J7);
    /// `false` while one can be neither.
    fn delete_unheaded(&mut self) -> bool {
        while let Some((&id, &first)) = self.unheaded.first_key_value() {
            let name = format::segment_name(id);
            match self.storage.delete(&name) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    let headed = self
                        .storage
                        .truncate(&name, 0)
                        .and_then(|()| self.storage.append(&name, &format::header(id, first)))
                        .and_then(|()| self.storage.sync(&name));
                    if headed.is_err() {
                        return false;
                    }
                }
                _ => {}
            }
            self.unheaded.remove(&id);
        }
        true
    }

    /// The storage.
    pub fn storage(&mut self) -> &mut S {
        &mut self.storage
    }

    /// Segments whose deletion has not worked yet (their files are still
    /// on disk; the ledger counts them gone).
    pub fn undeleted(&self) -> usize {
        self.undeleted.len()
    }

    /// Tries the waiting deletions in order, up to the first that fails.
    fn delete_in_order(&mut self) {
        while let Some(&id) = self.undeleted.front() {
            match self.storage.delete(&format::segment_name(id)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return,
                _ => {
                    self.undeleted.pop_front();
                }
            }
        }
    }

    /// Writes and syncs `batch`.
    ///
    /// # Errors
    /// The first IO error of a creation, an append or a sync; what came
    /// before it may or may not be on disk. A deletion that fails is no
    /// error: it waits (see [`undeleted`](Self::undeleted)).
    pub fn commit(&mut self, batch: &mut Batch) -> io::Result<()> {
        // Failed resumes' segments go first, whatever fails next.
        for op in &batch.ops {
            if let Op::Discard(id) = op {
                match self.storage.delete(&format::segment_name(*id)) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => {
                        self.undeleted.push_back(*id);
                    }
                    _ => {}
                }
            }
        }
        if !self.delete_unheaded() {
            return Err(io::Error::other(
                "a segment whose creation failed cannot be deleted",
            ));
        }
        let mut written = BTreeSet::new();
        for op in &mut batch.ops {
            match op {
                Op::Create { id, first } => self.create(*id, *first)?,
                Op::Append { id, bytes } => {
                    // The checksums are computed here, on the commit's
                    // thread, not under the lock `stage` takes (S-J1), in
                    // place: sealing twice (a batch committed again) gives
                    // the same bytes.
                    format::seal_records(bytes);
                    self.storage.append(&format::segment_name(*id), bytes)?;
                    written.insert(*id);
                }
                Op::Seal { id, end } => {
                    let mut b = Vec::with_capacity(SEAL_LEN);
                    format::seal(&mut b, *end);
                    match self.storage.append(&format::segment_name(*id), &b) {
                        Ok(()) => {
                            written.insert(*id);
                        }
                        // Never created (a commit failed before): no range
                        // to end.
                        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                        Err(e) => return Err(e),
                    }
                }
                Op::Delete(_) | Op::Discard(_) => {}
            }
        }
        for id in &written {
            self.storage.sync(&format::segment_name(*id))?;
        }
        self.undeleted
            .extend(batch.ops.iter().filter_map(|op| match op {
                Op::Delete(id) => Some(*id),
                _ => None,
            }));
        self.delete_in_order();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::journal::Limits;
    use crate::journal::format::EncodedItem;

    fn item() -> EncodedItem {
        EncodedItem::new::<()>(
            |b| {
                b.push(1);
                Ok(())
            },
            |b| {
                b.extend_from_slice(&[7; 16]);
                Ok(())
            },
        )
        .expect("encodes")
    }

    #[test]
    fn marks_spread_over_several_segments_go_to_segments_created_before() {
        // Crash seed 2323's fix cuts a settle's marks over new segments;
        // each append must come after its segment's creation, in the
        // segment its own run opened (a NotFound on disk otherwise).
        let limits = Limits {
            segment_bytes: 200,
            max_bytes: None,
        };
        let mut state = JournalState::new(Ledger::new(limits, 1, 1, HEADER_LEN as u64));
        for _ in 0..40 {
            assert!(state.append(1u32, &item()));
        }
        state.take_batch();
        state.committed(41, true);
        state.settle(&1, 40);
        let batch = state.take_batch();
        let mut created = BTreeSet::new();
        let mut rolls = 0;
        let mut marked = 0;
        for op in &batch.ops {
            match op {
                Op::Create { id, .. } => {
                    created.insert(*id);
                    rolls += 1;
                }
                Op::Append { id, bytes } => {
                    assert!(created.contains(id), "append to {id} before its creation");
                    assert!(bytes.len() <= 200, "a run of {} bytes", bytes.len());
                    marked += (bytes.len() - format::DONE_OVERHEAD) / format::MARK_LEN;
                }
                Op::Seal { .. } | Op::Delete(_) | Op::Discard(_) => {}
            }
        }
        assert!(rolls >= 2, "{:?}", batch.ops);
        assert_eq!(marked, 40);
    }
}
