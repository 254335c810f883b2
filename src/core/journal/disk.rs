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
        for op in &batch.ops[..tried] {
            match op {
                Op::Create { id, .. } => created.push(*id),
                Op::Remove(id) if !done.unremoved.contains(id) => deleted.push(*id),
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
        }
    }
}
