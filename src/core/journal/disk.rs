//! Work the disk owes the journal (S-J2, S-J5, S-J7): deletions that
//! failed and wait, in the ledger's order, and segments whose creation
//! failed, to delete (or head again) before anything else is written.
//! Every batch the machine hands out carries them, in the order the
//! rules need: removals of failed resumes' segments, then the clearing of
//! failed creations, then the writes, their syncs, and the deletions.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::batch::{Batch, Executed, Op};
use super::ledger::{SegmentId, Seq};

/// The disk's waiting work.
#[derive(Debug, Default)]
pub(super) struct Disk {
    /// Segments whose creation failed (their header may be missing or
    /// torn) and that are not cleared yet, with their first sequence
    /// numbers.
    unheaded: BTreeMap<SegmentId, Seq>,
    /// Deletions not done yet, in the ledger's order: none is tried before
    /// those ahead of it are done, so a segment holding the done marks of
    /// another never goes while that other's file is still there (S-J2).
    undeleted: VecDeque<SegmentId>,
}

/// How a batch went, as [`Disk::report`] reads it.
#[derive(Debug)]
pub(super) struct Outcome {
    /// The writes are durable (a deletion may have failed after them).
    pub(super) ok: bool,
    /// Segments whose files the batch deleted.
    pub(super) deleted: Vec<SegmentId>,
    /// Segments whose creation the batch tried.
    pub(super) created: Vec<SegmentId>,
    /// Segments whose seal record was written.
    pub(super) sealed: Vec<SegmentId>,
}

impl Disk {
    /// Segments whose deletion waits (their files are still on disk; the
    /// ledger counts them gone).
    pub(super) fn undeleted(&self) -> usize {
        self.undeleted.len()
    }

    /// The batch the disk runs for `body` (a commit's or a resume's ops):
    /// removals first, then the clearing of failed creations, the writes,
    /// one sync per segment written, the waiting deletions and the
    /// body's own, in that order.
    pub(super) fn wrap(&self, body: Batch) -> Batch {
        let Batch { ops: body, upto } = body;
        if body.is_empty() && self.unheaded.is_empty() && self.undeleted.is_empty() {
            return Batch { ops: body, upto };
        }
        let mut removes = Vec::new();
        let mut writes = Vec::with_capacity(body.len());
        let mut deletes = Vec::new();
        for op in body {
            match op {
                Op::Remove(_) => removes.push(op),
                Op::Delete(_) => deletes.push(op),
                _ => writes.push(op),
            }
        }
        let written: BTreeSet<SegmentId> = writes
            .iter()
            .filter_map(|op| match op {
                Op::Append { id, .. }
                | Op::Marks { id, .. }
                | Op::Note { id, .. }
                | Op::Seal { id, .. } => Some(*id),
                _ => None,
            })
            .collect();
        let mut ops = removes;
        ops.extend(
            self.unheaded
                .iter()
                .map(|(&id, &first)| Op::Clear { id, first }),
        );
        ops.extend(writes);
        ops.extend(written.into_iter().map(Op::Sync));
        ops.extend(self.undeleted.iter().map(|&id| Op::Delete(id)));
        ops.extend(deletes);
        Batch { ops, upto }
    }

    /// Reads what the driver did with `batch` into the waiting work: the
    /// failed creation to clear, the cleared ones, the removals and
    /// deletions that failed and wait.
    pub(super) fn report(&mut self, batch: &Batch, done: &Executed) -> Outcome {
        let failed = done.error.as_ref().and(batch.ops.get(done.done));
        for op in &batch.ops[..done.done.min(batch.ops.len())] {
            if let Op::Clear { id, .. } = op {
                self.unheaded.remove(id);
            }
        }
        if let Some(Op::Create { id, first }) = failed {
            self.unheaded.insert(*id, *first);
        }
        let ok = matches!(failed, None | Some(Op::Delete(_)));
        let tried = (done.done + 1).min(batch.ops.len());
        let mut created = Vec::new();
        let mut deleted = Vec::new();
        let mut sealed = Vec::new();
        for (i, op) in batch.ops[..tried].iter().enumerate() {
            match op {
                Op::Create { id, .. } => created.push(*id),
                Op::Remove(id) if !done.unremoved.contains(id) => deleted.push(*id),
                // A seal that failed wrote nothing (a torn one is cut at
                // recovery).
                Op::Seal { id, .. } if i < done.done => sealed.push(*id),
                _ => {}
            }
        }
        if ok {
            // The batch carried every waiting deletion: those from the
            // first that failed wait again, in order.
            let from = if failed.is_some() {
                done.done
            } else {
                batch.ops.len()
            };
            deleted.extend(batch.ops[..from].iter().filter_map(|op| match op {
                Op::Delete(id) => Some(*id),
                _ => None,
            }));
            self.undeleted = batch.ops[from..]
                .iter()
                .filter_map(|op| match op {
                    Op::Delete(id) => Some(*id),
                    _ => None,
                })
                .collect();
        }
        self.undeleted.extend(done.unremoved.iter().copied());
        Outcome {
            ok,
            deleted,
            created,
            sealed,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io;

    use super::*;

    fn failed_at(done: usize) -> Executed {
        Executed {
            done,
            error: Some(io::Error::other("injected")),
            unremoved: Vec::new(),
        }
    }

    /// S-J5, S-J2: deletions that fail wait, counted, in the ledger's
    /// order, and every later batch carries them until they are done; a
    /// disk that owes nothing hands a body with nothing to do back empty,
    /// so the driver skips the IO.
    #[test]
    fn s_j5_failed_deletions_wait_in_order_until_a_batch_does_them() {
        let mut disk = Disk::default();
        assert!(disk.wrap(Batch::default()).is_empty(), "nothing owed");
        let body = Batch {
            ops: vec![
                Op::Delete(1),
                Op::Append {
                    id: 3,
                    bytes: vec![7],
                },
                Op::Delete(2),
            ],
            upto: 5,
        };
        let batch = disk.wrap(body);
        let append = Op::Append {
            id: 3,
            bytes: vec![7],
        };
        assert_eq!(
            batch.ops,
            [append, Op::Sync(3), Op::Delete(1), Op::Delete(2)]
        );
        // The first deletion fails: the writes are durable, both wait.
        let out = disk.report(&batch, &failed_at(2));
        assert!(out.ok);
        assert!(out.deleted.is_empty());
        assert_eq!(disk.undeleted(), 2);

        let waiting = disk.wrap(Batch::default());
        assert!(!waiting.is_empty(), "the owed deletions make a batch");
        assert_eq!(waiting.ops, [Op::Delete(1), Op::Delete(2)]);
        let out = disk.report(&waiting, &Executed::all(&waiting));
        assert!(out.ok);
        assert_eq!(out.deleted, [1, 2]);
        assert_eq!(disk.undeleted(), 0);
        assert!(disk.wrap(Batch::default()).is_empty(), "nothing owed again");
    }

    /// S-J5, S-J7: a failed resume's segment is removed before anything
    /// else the batch does, the clearing of a failed creation included,
    /// and a creation that failed counts as tried (its file may be on
    /// disk, torn), so that the segment is cleared before the next write.
    #[test]
    fn s_j5_removals_go_first_and_a_failed_creation_is_tried_and_cleared() {
        let mut disk = Disk::default();
        let batch = disk.wrap(Batch {
            ops: vec![Op::Seal { id: 1, end: 5 }, Op::Create { id: 2, first: 5 }],
            upto: 5,
        });
        assert_eq!(
            batch.ops,
            [
                Op::Seal { id: 1, end: 5 },
                Op::Create { id: 2, first: 5 },
                Op::Sync(1)
            ]
        );
        let out = disk.report(&batch, &failed_at(0));
        assert!(!out.ok);
        assert!(out.sealed.is_empty(), "the seal failed: nothing written");
        let out = disk.report(&batch, &failed_at(1));
        assert!(!out.ok);
        assert_eq!(out.created, [2], "the failed creation was tried");
        assert_eq!(out.sealed, [1], "the seal before it was written");

        let batch = disk.wrap(Batch {
            ops: vec![
                Op::Remove(4),
                Op::Create { id: 6, first: 5 },
                Op::Marks {
                    id: 6,
                    seqs: vec![3],
                },
            ],
            upto: 5,
        });
        assert_eq!(
            batch.ops,
            [
                Op::Remove(4),
                Op::Clear { id: 2, first: 5 },
                Op::Create { id: 6, first: 5 },
                Op::Marks {
                    id: 6,
                    seqs: vec![3]
                },
                Op::Sync(6)
            ]
        );
        let done = Executed::all(&batch);
        assert_eq!(done.done, batch.ops.len(), "every op carried out");
        let out = disk.report(&batch, &done);
        assert!(out.ok);
        assert_eq!(out.created, [6]);
        assert_eq!(out.deleted, [4]);
        assert!(disk.wrap(Batch::default()).is_empty(), "segment 2 cleared");
    }

    /// S-J5: a failed resume's segment whose removal fails is not counted
    /// deleted (its file is on disk still, S-J10 counts its bytes): its
    /// deletion waits like a failed deletion, and the next batch does it.
    #[test]
    fn s_j5_a_removal_that_fails_waits_and_is_not_counted_deleted() {
        let mut disk = Disk::default();
        let batch = disk.wrap(Batch {
            ops: vec![Op::Remove(4), Op::Remove(5), Op::Create { id: 6, first: 3 }],
            upto: 3,
        });
        let done = Executed {
            unremoved: vec![4],
            ..Executed::all(&batch)
        };
        let out = disk.report(&batch, &done);
        assert!(out.ok, "a failed removal does not stop the batch");
        assert_eq!(out.deleted, [5]);
        assert_eq!(disk.undeleted(), 1);
        let waiting = disk.wrap(Batch::default());
        assert_eq!(waiting.ops, [Op::Delete(4)]);
        let out = disk.report(&waiting, &Executed::all(&waiting));
        assert_eq!(out.deleted, [4]);
        assert_eq!(disk.undeleted(), 0);
    }
}
