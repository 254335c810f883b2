//! Carries the journal machine's batches to a [`Storage`]: the ops in
//! order, each as its doc says (S-J2, S-J5, S-J7). The committer decides
//! nothing: what to write, sync, clear or delete, and what a failure
//! means, is the machine's ([`crate::core::journal`]).

use std::io;

use super::format::{self, Schema, SEAL_LEN};
use super::storage::Storage;
use crate::core::journal::{Batch, Executed, Op, SegmentId};

/// Carries batches to a [`Storage`] (already locked by the recovery).
#[derive(Debug)]
pub struct Committer<S> {
    storage: S,
    /// What every new segment starts with (S-J14).
    schema: Schema,
}

/// A deletion where a missing file is deleted.
fn delete(storage: &mut impl Storage, id: SegmentId) -> io::Result<()> {
    match storage.delete(&format::segment_name(id)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

impl<S: Storage> Committer<S> {
    /// A committer on `storage`, heading new segments with `schema`.
    pub fn new(storage: S, schema: Schema) -> Self {
        Committer { storage, schema }
    }

    /// The storage.
    #[cfg(feature = "testkit")]
    pub fn storage(&mut self) -> &mut S {
        &mut self.storage
    }

    /// Carries out `batch` (computing the item records' checksums in
    /// place: carrying a batch out twice writes the same bytes) and says
    /// how far it went.
    pub fn commit(&mut self, batch: &mut Batch) -> Executed {
        let mut done = Executed::default();
        // Segments a seal found missing: nothing to sync either.
        let mut missing = Vec::new();
        for op in &mut batch.ops {
            let result = match op {
                Op::Remove(id) => {
                    if delete(&mut self.storage, *id).is_err() {
                        done.unremoved.push(*id);
                    }
                    Ok(())
                }
                Op::Clear { id, first } => self.clear(*id, *first),
                Op::Create { id, first } => self.create(*id, *first),
                Op::Append { id, bytes } => {
                    // The checksums are computed here, on the commit's
                    // thread, not under the lock `stage` takes (S-J1).
                    format::seal_records(bytes);
                    self.storage.append(&format::segment_name(*id), bytes)
                }
                Op::Marks { id, seqs } => {
                    let mut b = Vec::with_capacity(format::done_len(seqs.len()));
                    format::done(&mut b, seqs);
                    self.storage.append(&format::segment_name(*id), &b)
                }
                Op::Note { id, note } => {
                    let mut b = Vec::new();
                    format::note(&mut b, note);
                    self.storage.append(&format::segment_name(*id), &b)
                }
                Op::Seal { id, end } => self.seal(*id, *end, &mut missing),
                Op::Sync(id) if missing.contains(id) => Ok(()),
                Op::Sync(id) => self.storage.sync(&format::segment_name(*id)),
                Op::Delete(id) => delete(&mut self.storage, *id),
            };
            if let Err(e) = result {
                done.error = Some(e);
                return done;
            }
            done.done += 1;
        }
        done
    }

    /// Creates segment `id` with a durable header and schema record
    /// (first sequence `first`), on its own before any record.
    fn create(&mut self, id: SegmentId, first: u64) -> io::Result<()> {
        let name = format::segment_name(id);
        self.storage.create(&name)?;
        self.storage.append(&name, &self.schema.head(id, first))?;
        self.storage.sync(&name)
    }

    /// Deletes a segment whose creation failed or, where deletion is
    /// refused, writes its header again in place (S-J7).
    fn clear(&mut self, id: SegmentId, first: u64) -> io::Result<()> {
        if delete(&mut self.storage, id).is_ok() {
            return Ok(());
        }
        let name = format::segment_name(id);
        self.storage
            .truncate(&name, 0)
            .and_then(|()| self.storage.append(&name, &self.schema.head(id, first)))
            .and_then(|()| self.storage.sync(&name))
            .map_err(|_| io::Error::other("a segment whose creation failed cannot be deleted"))
    }

    /// Appends a seal record; a segment that is not on disk (never
    /// created) has no range to end.
    fn seal(&mut self, id: SegmentId, end: u64, missing: &mut Vec<SegmentId>) -> io::Result<()> {
        let mut b = Vec::with_capacity(SEAL_LEN);
        format::seal(&mut b, end);
        match self.storage.append(&format::segment_name(id), &b) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                missing.push(id);
                Ok(())
            }
            other => other,
        }
    }
}
