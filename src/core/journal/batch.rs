//! What a group commit carries to the disk ([`Batch`]), what the driver
//! reports back ([`Executed`]), and the record sizes the machine counts
//! with ([`Sizes`]): the machine's contract with the IO that carries out
//! its commits.

use std::io;

use super::ledger::{MarkSizes, SegmentId, Seq};

/// The bytes of the format's records, for the machine's accounting (the
/// format module of the journal gives them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sizes {
    /// A segment header.
    pub header: u64,
    /// A seal record.
    pub seal: u64,
    /// A done record's framing, besides its marks.
    pub done: u64,
    /// One done mark.
    pub mark: u64,
    /// Marks in one done record at most.
    pub marks_per_record: usize,
}

impl Sizes {
    /// The sizes the ledger cuts mark runs with.
    pub fn marks(&self) -> MarkSizes {
        MarkSizes {
            header: self.header,
            record: self.done,
            mark: self.mark,
            per_record: self.marks_per_record,
        }
    }

    /// Bytes of the attempt records that hold `n` attempt marks (S-J17):
    /// a done record's, and the life's number in each.
    pub fn attempts_len(&self, n: usize) -> u64 {
        let per = self.marks_per_record.max(1);
        n.div_ceil(per) as u64 * (self.done + LIFE_LEN) + n as u64 * self.mark
    }

    /// Bytes of the attempt-end records that hold `n` marks (S-J17): as
    /// many as [`attempts_len`](Self::attempts_len).
    pub fn ended_len(&self, n: usize) -> u64 {
        self.attempts_len(n)
    }

    /// Bytes of a life record counting `n` items' crashes (S-J17).
    pub fn life_len(&self, n: usize) -> u64 {
        let per = self.marks_per_record.max(1);
        n.div_ceil(per).max(1) as u64 * (self.done + LIFE_LEN) + n as u64 * (self.mark + 4)
    }

    /// Bytes of a clean-close record (S-J17).
    pub fn clean_len(&self) -> u64 {
        self.done + LIFE_LEN
    }

    /// Bytes a journal under `max_bytes` keeps free at all times for the
    /// records that count a lone suspect's crashes (S-J10, S-J17): items
    /// are refused before they touch it. It holds one life's start at the
    /// bound and what the life before left until its segment goes: two
    /// life records trimmed to one count, two rolls (a recovery seals the
    /// last segment and starts a new one each life), one lone attempt mark
    /// and a clean-close record. The one place the reserve is sized: a
    /// record that must count a lone attempt grows it here. A lone mark
    /// in it leaves two lives' starts and marks while its segment holds
    /// pending items (`Commits::lives_after`): with the roll the records
    /// that count a lone suspect may take from the standing reserve, that
    /// fits, as long as two marks take no more than a roll and a
    /// clean-close record.
    pub fn lone_reserve(&self) -> u64 {
        2 * (self.header + self.seal + self.life_len(1)) + self.attempts_len(1) + self.clean_len()
    }

    /// Bytes a journal under `max_bytes` keeps free at all times, whatever
    /// it holds (S-J10): the current segment's seal, two rolls, and the
    /// [`lone_reserve`](Self::lone_reserve). An explicit `segment_bytes`
    /// is at most half of what is left.
    pub fn standing(&self) -> u64 {
        self.seal + 2 * (self.header + self.seal) + self.lone_reserve()
    }

    /// Bytes of the done records that hold `n` marks.
    pub fn done_len(&self, n: usize) -> u64 {
        let per = self.marks_per_record.max(1);
        n.div_ceil(per) as u64 * self.done + n as u64 * self.mark
    }
}

/// Bytes of a life's number in the records that carry it (S-J17).
pub const LIFE_LEN: u64 = 8;

/// A record of the journal's lives (S-J17), which a recovery reads to
/// count the crashes that cut attempts. A life is numbered by the first
/// segment it created.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Note {
    /// The attempts of these items in this life start once this is on
    /// disk.
    Attempts {
        /// The life.
        life: u64,
        /// The items, in sequence order.
        seqs: Vec<Seq>,
    },
    /// A life starts after a recovery: the crashes counted so far of the
    /// items it recovered (only those with one or more).
    Life {
        /// The life.
        life: u64,
        /// `(item, crashes)`, in sequence order.
        counts: Vec<(Seq, u32)>,
    },
    /// The life closed cleanly: none of its attempts was cut by a crash.
    Clean {
        /// The life.
        life: u64,
    },
    /// The attempts of these items in this life came back failed and
    /// wait for a retry: a crash from now until an attempt mark of their
    /// next attempt cuts none of them.
    Ended {
        /// The life.
        life: u64,
        /// The items, in sequence order.
        seqs: Vec<Seq>,
    },
}

/// An item record the machine appends to a commit's buffer: framed by the
/// format, numbered by the machine.
pub trait Record {
    /// Bytes the framed record takes.
    fn framed_len(&self) -> usize;

    /// Appends the record with sequence number `seq` to `out` (its
    /// checksum is computed at commit, off the outbox's lock, S-J1).
    fn frame(&self, seq: Seq, out: &mut Vec<u8>);
}

/// One step of a group commit. The driver carries the ops out in order
/// and stops at the first that fails, except where an op says otherwise.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Delete segment `id` first, before anything else the batch does: a
    /// failed resume's segment, which holds no item and only done marks
    /// that the batch writes again (lost in a crash before then, they stage
    /// their items again, S-J3), so that an outage does not leave a file
    /// per retry (S-J5). A failure does not stop the batch: the driver
    /// reports it ([`Executed::unremoved`]) and the deletion waits like a
    /// [`Delete`](Op::Delete). A missing file is deleted.
    Remove(SegmentId),
    /// A segment whose creation failed (its header may be missing or
    /// torn): delete it or, where deletion is refused (a lost permission),
    /// write its header again in place, so that no file without a header
    /// stays before a later segment (S-J7). Before anything is written.
    Clear {
        /// The segment.
        id: SegmentId,
        /// Its first sequence number (for the header).
        first: Seq,
    },
    /// Create segment `id` and write and sync its header (first sequence
    /// `first`) on its own, before any record goes in (S-J7).
    Create {
        /// The segment.
        id: SegmentId,
        /// Its first sequence number.
        first: Seq,
    },
    /// Append item records to segment `id`.
    Append {
        /// The segment.
        id: SegmentId,
        /// Framed records without their checksums, which the driver
        /// computes as it writes them.
        bytes: Vec<u8>,
    },
    /// Append done records marking `seqs` to segment `id`.
    Marks {
        /// The segment.
        id: SegmentId,
        /// The marks, in sequence order.
        seqs: Vec<Seq>,
    },
    /// Append a seal record (`end`) to segment `id`; nothing if the
    /// segment is not on disk (never created: no range to end).
    Seal {
        /// The segment.
        id: SegmentId,
        /// Every item of the segment is below this sequence number.
        end: Seq,
    },
    /// Append a record of the journal's lives to segment `id` (S-J17).
    Note {
        /// The segment.
        id: SegmentId,
        /// The record.
        note: Note,
    },
    /// Make every byte appended to segment `id` durable (`fdatasync`).
    Sync(SegmentId),
    /// Delete segment `id` (after every write of the batch is synced:
    /// S-J2, a segment goes only after the marks that free it are
    /// durable). A failure ends the batch's deletions, not its commit:
    /// the ones left wait, in order. A missing file is deleted.
    Delete(SegmentId),
}

impl Op {
    /// The segment the op writes to, if it writes.
    pub(super) fn writes(&self) -> Option<SegmentId> {
        match self {
            Op::Create { id, .. }
            | Op::Append { id, .. }
            | Op::Marks { id, .. }
            | Op::Note { id, .. }
            | Op::Seal { id, .. } => Some(*id),
            Op::Remove(_) | Op::Clear { .. } | Op::Sync(_) | Op::Delete(_) => None,
        }
    }
}

/// What one group commit carries to the disk.
#[derive(Debug, Default)]
pub struct Batch {
    /// The steps, in order.
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
}

/// What the driver did with a [`Batch`].
#[derive(Debug, Default)]
pub struct Executed {
    /// The ops carried out, from the first: every op before this index
    /// worked (or, for a [`Remove`](Op::Remove), was tried); the op at it
    /// failed with `error`, and none after it ran.
    pub done: usize,
    /// The failure that stopped the batch, if any.
    pub error: Option<io::Error>,
    /// Segments of [`Remove`](Op::Remove) ops whose deletion failed.
    pub unremoved: Vec<SegmentId>,
}

impl Executed {
    /// Every op worked.
    pub fn all(batch: &Batch) -> Self {
        Executed {
            done: batch.ops.len(),
            error: None,
            unremoved: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// S-J10: the bound reserves exactly the bytes the done records of `n`
    /// marks take: a framing per record of at most `marks_per_record`
    /// marks, and each mark.
    #[test]
    fn s_j10_done_records_take_a_framing_per_record_and_each_mark() {
        let sizes = Sizes {
            header: 32,
            seal: 16,
            done: 10,
            mark: 3,
            marks_per_record: 4,
        };
        assert_eq!(sizes.done_len(0), 0);
        assert_eq!(sizes.done_len(1), 10 + 3);
        assert_eq!(sizes.done_len(4), 10 + 4 * 3);
        assert_eq!(sizes.done_len(5), 2 * 10 + 5 * 3);
        let one = Sizes {
            marks_per_record: 0,
            ..sizes
        };
        assert_eq!(one.done_len(2), 2 * 10 + 2 * 3, "0 taken as 1 a record");
    }
}
