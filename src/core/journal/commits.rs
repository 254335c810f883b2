//! What a round commits (S-J1..S-J5): the records waiting for the next
//! group commit, the done marks and deletions each batch carries, and
//! after a fault what a resume seals and redoes. Kept by the
//! [`Machine`](super::Machine), under the outbox's lock.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::Hash;

use super::batch::{Batch, Note, Op, Record, Sizes};
use super::ledger::{Ledger, SegmentId, Seq};

/// The records waiting for the next commit, and what failed commits left
/// to redo. Every method is O(1) or O(log n) per item and does no IO.
#[derive(Debug)]
pub(super) struct Commits<K> {
    pub(super) ledger: Ledger<K>,
    sizes: Sizes,
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
    pub(super) taken_deletes: Vec<SegmentId>,
    redo_marks: Vec<Seq>,
    redo_deletes: Vec<SegmentId>,
    /// The segment the last resume opened, while its commit is in flight
    /// or failed. When it failed, the ledger forgets it and the next
    /// resume removes it first (S-J5), so a long outage neither counts a
    /// segment and its marks against `max_bytes` per retry nor leaves a
    /// file per retry.
    resume_segment: Option<SegmentId>,
    /// The last resume's segment was created, or its creation tried: a
    /// file may be on disk, whose bytes count until it is removed.
    resume_created: bool,
    /// An empty record buffer a finished commit handed back, for the next
    /// append to fill.
    spare: Vec<u8>,
    /// Segments handed out for deletion whose files are not deleted yet,
    /// with their bytes, which still count against `max_bytes` (S-J10).
    doomed: BTreeMap<SegmentId, u64>,
    doomed_bytes: u64,
    /// This life's number: the first segment it creates (S-J17).
    life: SegmentId,
    /// The life record and the items it holds, until a commit carried it
    /// (a resume writes it again).
    life_note: Option<(Note, Vec<Seq>)>,
    /// The recovered items cut by a crash or more (S-J17): their attempt
    /// marks may use the lone reserve.
    suspects: BTreeSet<Seq>,
    /// Done marks of folded segments written again in the next commit
    /// (S-J17): redone by a resume if it fails.
    folded: Vec<Seq>,
    /// Segments the resume in flight seals again: each seal record it
    /// writes to them is counted once written (S-J10).
    resealing: Vec<SegmentId>,
}

impl<K: Ord + Hash + Clone> Commits<K> {
    /// The commits around `ledger`, whose current segment is still to be
    /// created (the first commit creates it).
    pub(super) fn new(ledger: Ledger<K>, sizes: Sizes) -> Self {
        let first = ledger.next_seq();
        let id = ledger.current();
        Commits {
            ops: vec![Op::Create { id, first }],
            buffered: sizes.header as usize,
            sizes,
            synced: first,
            down: false,
            in_flight: BTreeSet::new(),
            failed_end: first,
            taken_marks: Vec::new(),
            taken_deletes: Vec::new(),
            redo_marks: Vec::new(),
            redo_deletes: Vec::new(),
            resume_segment: None,
            resume_created: false,
            spare: Vec::new(),
            doomed: BTreeMap::new(),
            doomed_bytes: 0,
            life: id,
            life_note: None,
            suspects: BTreeSet::new(),
            folded: Vec::new(),
            resealing: Vec::new(),
            ledger,
        }
    }

    /// A recovery restored the items `recovered` (in sequence order), of
    /// which `counts` were cut by crashes: the first commit writes the life
    /// record, which keeps their segments' records of earlier lives from
    /// counting again (S-J17). Only if it fits under `max_bytes`.
    pub(super) fn start_life(&mut self, counts: Vec<(Seq, u32)>, recovered: Vec<Seq>) {
        if recovered.is_empty() {
            // No item pending: no count to carry on.
            self.ledger.release();
            return;
        }
        self.suspects = counts.iter().map(|&(seq, _)| seq).collect();
        let note = Note::Life {
            life: self.life,
            counts,
        };
        self.life_note = Some((note, recovered));
        let ops = self.ops.len();
        self.push_life();
        if let Some(Op::Note {
            note: Note::Life { counts, .. },
            ..
        }) = self.ops.get(ops)
        {
            self.buffered += self.sizes.life_len(counts.len()) as usize;
        }
    }

    /// Appends the life record to the current segment, if one waits:
    /// whole if it fits beside the lone reserve, else trimmed to its
    /// highest count (the earliest item of those) in the reserve, so the
    /// crashes of a lone suspect at the bound are still carried on
    /// (S-J17); the other counts start again from the marks of this life.
    fn push_life(&mut self) {
        let Some((Note::Life { life, counts }, seqs)) = &self.life_note else {
            return;
        };
        let len = self.sizes.life_len(counts.len());
        let note = if self.ledger.note_fits(len, self.doomed_bytes, false) {
            Note::Life {
                life: *life,
                counts: counts.clone(),
            }
        } else {
            // `max_by_key` keeps the last of equals: reversed, the earliest.
            let top = counts.iter().rev().max_by_key(|(_, n)| *n).copied();
            Note::Life {
                life: *life,
                counts: top.into_iter().collect(),
            }
        };
        let Note::Life { counts: kept, .. } = &note else {
            return;
        };
        let len = self.sizes.life_len(kept.len());
        if !self.ledger.note_fits(len, self.doomed_bytes, true) {
            return;
        }
        let id = self.ledger.current();
        self.ledger.add_bytes(len);
        self.ledger.remark(seqs);
        self.ops.push(Op::Note { id, note });
        // The counts go on in this record: the records of earlier lives
        // may go, and at the bound those in segments kept only for their
        // done marks do, the marks written again here.
        self.ledger.release();
        if self.ledger.in_reserve() {
            self.fold();
        }
    }

    /// Writes again in the current segment the done marks of the restored
    /// segments kept only for them, which then go (S-J17): the records of
    /// earlier lives they hold no longer take the standing reserve. On a
    /// journal that is down, the resume writes them with its redo.
    fn fold(&mut self) {
        let seqs = self.ledger.fold();
        if seqs.is_empty() {
            return;
        }
        if self.down {
            self.redo_marks.extend(seqs);
            return;
        }
        let id = self.ledger.current();
        self.ledger.add_bytes(self.sizes.done_len(seqs.len()));
        self.ledger.remark(&seqs);
        self.folded.extend_from_slice(&seqs);
        self.ops.push(Op::Marks { id, seqs });
    }

    /// An attempt of `tenant`'s oldest `n` items starts: whether attempt
    /// marks wait for the next commit (S-J17). Never while the journal is
    /// down.
    pub(super) fn attempt(&mut self, tenant: &K, n: u64) -> bool {
        let added = self.ledger.mark_attempt(tenant, n);
        if self.down {
            self.ledger.take_attempts();
            return false;
        }
        added > 0
    }

    /// The attempt of `tenant`'s oldest `n` items came back failed and
    /// waits for its retry: its end marks ride the next commit, none
    /// waits for them (S-J17). Dropped while the journal is down (the
    /// attempt then counts as cut).
    pub(super) fn ended(&mut self, tenant: &K, n: u64) {
        self.ledger.mark_ended(tenant, n);
        if self.down {
            self.ledger.take_ends();
        }
    }

    /// The attempt-end marks waiting, as a record in the current segment,
    /// before the attempt marks (a retry's mark follows its attempt's
    /// end), if it fits under `max_bytes` (else a crash counts those
    /// attempts as cut: the safe side).
    fn push_ends(&mut self) {
        let seqs = self.ledger.take_ends();
        if seqs.is_empty() {
            return;
        }
        let len = self.sizes.ended_len(seqs.len());
        if !self.ledger.note_fits(len, self.doomed_bytes, false) {
            return;
        }
        self.push_marks(len, seqs, |life, seqs| Note::Ended { life, seqs });
    }

    /// The attempt marks waiting, as a record in the current segment, if
    /// it fits under `max_bytes` beside the lone reserve; else one mark
    /// alone, in the reserve (S-J17): the first suspect's (a lone
    /// write's), else the earliest item's, so a crash at the bound still
    /// counts against an item of each write cut and a poison item's
    /// neighbours, written alone once suspected, leave it first in line;
    /// else a suspect's waits for the next commit while segments are on
    /// their way out ([`room_coming`](Self::room_coming)), and none is
    /// written otherwise: a crash then counts against nobody. A
    /// mark in the reserve leaves in it what the lives after need
    /// ([`lives_after`](Self::lives_after)): the marks of many writes at
    /// the bound took all of it, and the next recovery, its life record
    /// written nowhere, kept its restored segments for the whole life,
    /// refusing every item (crash seed 1000883); marks that left one
    /// life's start, in a segment held by items pending behind a poison
    /// item, left no later life room for the poison item's mark, so its
    /// crashes were never counted (crash seed 4150187).
    fn push_attempts(&mut self) {
        let mut seqs = self.ledger.take_attempts();
        if seqs.is_empty() {
            return;
        }
        let mut len = self.sizes.attempts_len(seqs.len());
        if !self.ledger.note_fits(len, self.doomed_bytes, false) {
            let first = seqs.first().copied();
            let Some(suspect) = seqs
                .iter()
                .find(|s| self.suspects.contains(s))
                .copied()
                .or(first)
            else {
                return;
            };
            seqs = vec![suspect];
            len = self.sizes.attempts_len(1);
            if !self
                .ledger
                .note_fits(len + self.lives_after(), self.doomed_bytes, true)
            {
                // A suspect's mark waits for the room segments on their
                // way out give back (the life before's, once this life's
                // record is written): its lone attempt waits with it.
                if self.suspects.contains(&suspect) && self.room_coming() {
                    self.ledger.defer_attempt(suspect);
                }
                return;
            }
        }
        self.push_marks(len, seqs, |life, seqs| Note::Attempts { life, seqs });
    }

    /// Whether segments are on their way out: deletable now, or deleted
    /// by a commit under way. Their bytes come back once their files go.
    fn room_coming(&self) -> bool {
        self.doomed_bytes > 0 || self.ledger.deletions_waiting()
    }

    /// What a mark in the reserve leaves in it: each life to come starts
    /// with a roll and a life record of one count and marks its lone
    /// attempt, and the life before keeps its segment until that record
    /// is written. Two such lives while the current segment holds pending
    /// items, which keep it (and the marks in it) beyond the next life.
    fn lives_after(&self) -> u64 {
        let life = self.sizes.header
            + self.sizes.seal
            + self.sizes.life_len(1)
            + self.sizes.attempts_len(1);
        let lives = if self.ledger.current_live() > 0 { 2 } else { 1 };
        lives * life
    }

    /// A record of marks (`len` bytes) in the current segment: its bytes
    /// counted, its items' marks noted where they now stand.
    fn push_marks(&mut self, len: u64, seqs: Vec<Seq>, note: fn(SegmentId, Vec<Seq>) -> Note) {
        let id = self.ledger.current();
        self.ledger.add_bytes(len);
        self.ledger.remark(&seqs);
        let note = note(self.life, seqs);
        self.ops.push(Op::Note { id, note });
    }

    /// A closing journal's last round: with items still pending whose
    /// attempts were marked, the record that no crash cut them (S-J17).
    fn push_clean(&mut self) {
        if !self.ledger.has_attempted() {
            return;
        }
        let len = self.sizes.clean_len();
        if !self.ledger.note_fits(len, self.doomed_bytes, true) {
            return;
        }
        let id = self.ledger.current();
        self.ledger.add_bytes(len);
        self.ops.push(Op::Note {
            id,
            note: Note::Clean { life: self.life },
        });
    }

    pub(super) fn is_down(&self) -> bool {
        self.down
    }

    /// Whether a failed commit left done marks or deletions that only a
    /// resume writes (S-J5).
    pub(super) fn has_redo(&self) -> bool {
        !self.redo_marks.is_empty() || !self.redo_deletes.is_empty()
    }

    pub(super) fn buffered(&self) -> usize {
        self.buffered
    }

    pub(super) fn fits(&self, len: usize) -> bool {
        self.ledger
            .fits(len as u64, self.sizes.header, self.doomed_bytes)
    }

    /// Bytes in the segment files: the ledger's and the doomed ones'.
    pub(super) fn disk_bytes(&self) -> u64 {
        self.ledger.bytes() + self.doomed_bytes
    }

    /// The creation of the segments `ids` was tried.
    pub(super) fn created(&mut self, ids: &[SegmentId]) {
        if self.resume_segment.is_some_and(|r| ids.contains(&r)) {
            self.resume_created = true;
        }
    }

    /// Seal records were written to the segments `ids`: those the resume
    /// sealed again count their bytes now (S-J10).
    pub(super) fn sealed(&mut self, ids: &[SegmentId]) {
        for id in std::mem::take(&mut self.resealing) {
            if ids.contains(&id) {
                self.ledger.resealed(id);
            }
        }
    }

    /// The files of `ids` are deleted.
    pub(super) fn deleted(&mut self, ids: &[SegmentId]) {
        for id in ids {
            if let Some(bytes) = self.doomed.remove(id) {
                self.doomed_bytes -= bytes;
            }
        }
    }

    /// Takes an accepted item: journaled in the buffer, or, while the
    /// journal is down, only placed in its tenant's order (S-J5). Returns
    /// whether it was journaled.
    pub(super) fn append(&mut self, tenant: K, item: impl Record) -> bool {
        let len = item.framed_len();
        // Past `max_bytes` only if the caller did not check `fits`.
        if self.down || !self.fits(len) {
            self.ledger.unjournaled(tenant);
            return false;
        }
        let step = self
            .ledger
            .append(tenant, len as u64, self.sizes.header)
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
            self.buffered += (self.sizes.header + self.sizes.seal) as usize;
        }
        self.buffered += len;
        let id = self.ledger.current();
        match self.ops.last_mut() {
            Some(Op::Append { id: last, bytes }) if *last == id => item.frame(step.seq, bytes),
            _ => {
                let mut bytes = self.fresh(len);
                item.frame(step.seq, &mut bytes);
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
    pub(super) fn recycle(&mut self, batch: Batch, max_capacity: usize) {
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

    /// Takes what the next commit writes: the buffered records, the done
    /// marks, then the segments that can go. With `roll_if_idle`, and no
    /// journaled item pending once the marks are taken, the batch also
    /// starts a fresh segment so that every older one goes (D6: a clean
    /// shutdown leaves one empty segment). Empty while the journal is
    /// down (see [`resume`](Self::resume)).
    pub(super) fn take_batch(&mut self, roll_if_idle: bool) -> Batch {
        if self.down {
            return Batch::default();
        }
        let first_segment = self.ledger.current();
        let runs = self.ledger.take_mark_runs(self.sizes.marks());
        let mut marks = Vec::new();
        // The ledger has rolled through every run already: each run's
        // segment is the one its own roll (or an earlier run's) opened.
        let mut segment = first_segment;
        for run in runs {
            if let Some(id) = run.roll {
                self.rolled(segment, id);
                segment = id;
            }
            marks.extend_from_slice(&run.seqs);
            self.ops.push(Op::Marks {
                id: segment,
                seqs: run.seqs,
            });
        }
        self.push_ends();
        self.push_attempts();
        if roll_if_idle && self.ledger.live() == 0 {
            self.roll();
        }
        if roll_if_idle {
            self.push_clean();
        }
        let mut ops = std::mem::take(&mut self.ops);
        self.buffered = 0;
        self.taken_deletes.clear();
        while let Some((id, bytes)) = self.ledger.poll_delete_sized() {
            ops.push(Op::Delete(id));
            self.taken_deletes.push(id);
            self.doomed.insert(id, bytes);
            self.doomed_bytes += bytes;
        }
        marks.append(&mut self.folded);
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
    pub(super) fn committed(&mut self, upto: Seq, ok: bool) -> u64 {
        if ok {
            self.synced = self.synced.max(upto);
            self.in_flight.clear();
            if self.down {
                // The resume carried the redo, and the removal of the
                // segments of failed resumes.
                self.redo_marks.clear();
                self.redo_deletes.clear();
                self.resume_segment = None;
            }
            self.taken_marks.clear();
            self.taken_deletes.clear();
            self.down = false;
            self.life_note = None;
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
        let id = self.ledger.roll(self.sizes.header);
        self.rolled(old, id);
    }

    /// The ledger rolled from segment `old` to `id` with no item between:
    /// seal the one, create the other. Only [`take_batch`](Self::take_batch)
    /// rolls so, and it empties the buffer count after: these bytes are
    /// not added to it.
    fn rolled(&mut self, old: SegmentId, id: SegmentId) {
        let end = self.ledger.next_seq();
        self.ops.push(Op::Seal { id: old, end });
        self.ops.push(Op::Create { id, first: end });
    }

    /// After a fault: the batch that retries the journal, removing the
    /// last failed resume's segment, sealing the segments the failed
    /// commit wrote (their range ends at what was synced), opening a new
    /// segment, and redoing the failed commit's done marks and deletions.
    /// If it commits, the journal is up again; if not, call
    /// `committed(_, false)` and retry later.
    pub(super) fn resume(&mut self) -> Batch {
        let end = self.failed_end;
        let old = self.ledger.current();
        let id = self.ledger.roll(self.sizes.header);
        // The last resume failed: its segment is replaced by this one, and
        // goes first, so at most one is left on disk while the outage
        // lasts.
        let mut discard = None;
        if let Some(prev) = self.resume_segment.replace(id) {
            if let Some(bytes) = self.ledger.abandon_sized(prev) {
                discard = Some(prev);
                if std::mem::take(&mut self.resume_created) {
                    self.doomed.insert(prev, bytes);
                    self.doomed_bytes += bytes;
                }
            }
        }
        let mut ops: Vec<Op> = discard.map(Op::Remove).into_iter().collect();
        self.resealing.clear();
        for s in std::mem::take(&mut self.in_flight) {
            if Some(s) == discard {
                continue;
            }
            // The roll counted the old current segment's seal. A segment
            // sealed already (by an earlier resume that failed) takes
            // another seal record: counted if this one writes it.
            if s != old && !self.ledger.seal(s) {
                self.resealing.push(s);
            }
            ops.push(Op::Seal { id: s, end });
        }
        ops.push(Op::Create {
            id,
            first: self.ledger.next_seq(),
        });
        // The life record, if no commit carried it yet.
        let before = std::mem::take(&mut self.ops);
        self.push_life();
        ops.append(&mut self.ops);
        self.ops = before;
        if !self.redo_marks.is_empty() {
            self.ledger
                .add_bytes(self.sizes.done_len(self.redo_marks.len()));
            self.ledger.remark(&self.redo_marks);
            ops.push(Op::Marks {
                id,
                seqs: self.redo_marks.clone(),
            });
        }
        ops.extend(self.redo_deletes.iter().map(|d| Op::Delete(*d)));
        self.in_flight = ops.iter().filter_map(Op::writes).collect();
        Batch {
            ops,
            upto: self.ledger.next_seq(),
        }
    }
}
