//! The journal's part of a stage (S-J1, S-J4, S-J8): the item is encoded
//! on the caller's thread, outside every lock, into a buffer the thread
//! reuses; its room is checked and its record appended under the
//! journal's lock, taken inside the outbox's.

use std::cell::Cell;
use std::sync::MutexGuard;

use super::{Inner, Journal, Refusal};
use crate::driver::contain;
use crate::journal::format::{EncodeFailure, EncodedItem, EncodedRun, Unsealed};

thread_local! {
    /// The buffer `stage` encodes records into on this thread, reused from
    /// one stage to the next (a stage allocates nothing for its record).
    static SCRATCH: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// A scratch buffer grown past this by a large item is let go, so that a
/// thread does not hold on to a burst.
const SCRATCH_KEEP: usize = 64 << 10;

fn keep_scratch(buffer: Vec<u8>) {
    if buffer.capacity() <= SCRATCH_KEEP {
        // Gone only while the thread exits: the buffer is dropped then.
        let _ = SCRATCH.try_with(|s| s.set(buffer));
    }
}

/// The journal's lock held from a stage's room check to its append
/// ([`Journal::appender`], D2): one lock and at most one wake of the
/// commit task for a stage or a whole
/// [`stage_many`](crate::Outbox::stage_many) (S-W20).
pub(crate) struct Appender<'a, K, I> {
    journal: &'a Journal<K, I>,
    g: MutexGuard<'a, Inner<K>>,
    was_empty: bool,
    appended: bool,
}

impl<K: Ord + std::hash::Hash + Clone, I> Appender<'_, K, I> {
    /// Whether `max_bytes` leaves room on disk for `record` (S-J4), and
    /// `max_buffered_bytes` in memory (S-B8), after what was appended.
    pub(crate) fn fits(&self, record: Unsealed<'_>) -> bool {
        let buffered = self.g.state.buffered().saturating_add(record.len());
        self.g.state.fits(record.len()) && buffered <= self.journal.max_buffered
    }

    /// Under the outbox's lock, for an item the engine takes: appends its
    /// record to the buffer (or, while the journal is down, only keeps
    /// its place, S-J5).
    pub(crate) fn append(&mut self, tenant: K, record: Unsealed<'_>) {
        self.appended = true;
        if !self.g.state.append(tenant, record) {
            self.g.unjournaled_in_incident += 1;
            self.journal.metrics.unjournaled.increment(1);
        }
    }

    /// Lets the lock go, then, if anything was appended, wakes the commit
    /// task: at once when `sync_bytes` are buffered, else on its interval
    /// if this run was the first to append to an empty buffer (S-J1).
    pub(crate) fn finish(self) {
        let Appender {
            journal,
            g,
            was_empty,
            appended,
        } = self;
        let buffered = g.state.buffered();
        drop(g);
        if !appended {
            return;
        }
        if buffered >= journal.sync_bytes {
            journal.now.notify_one();
        } else if was_empty {
            journal.soon.notify_one();
        }
    }
}

impl<K, I> Journal<K, I>
where
    K: Ord + std::hash::Hash + Clone + Send + 'static,
    I: Send + 'static,
{
    /// Encodes `item` of `tenant` into a record (outside any lock; a panic
    /// in the codec is contained), in this thread's reused buffer: hand
    /// the record back with [`recycle`](Self::recycle) once appended.
    pub(crate) fn encode(&self, tenant: &K, item: &I) -> Result<EncodedItem, Refusal> {
        let codec = &*self.codec;
        let stamp = self.stamp_now();
        let buffer = SCRATCH.try_with(Cell::take).unwrap_or_default();
        let encoded = contain::call(|| {
            EncodedItem::new_in(
                buffer,
                stamp,
                |b| codec.encode_tenant(tenant, b),
                |b| codec.encode_item(item, b),
            )
        });
        match encoded {
            Ok(Ok(record)) => Ok(record),
            Ok(Err((EncodeFailure::Codec(_) | EncodeFailure::TooLarge, buffer))) => {
                keep_scratch(buffer);
                Err(Refusal::EncodeFailed)
            }
            Err(_) => Err(Refusal::EncodeFailed),
        }
    }

    /// Encodes `item` of `tenant` as one more record of `run` (outside any
    /// lock; a panic in the codec is contained): its index in the run, or
    /// `None` when the codec failed or the record would be too large.
    pub(crate) fn encode_into(&self, run: &mut EncodedRun, tenant: &K, item: &I) -> Option<usize> {
        let codec = &*self.codec;
        let stamp = self.stamp_now();
        let encoded = contain::call(|| {
            run.push(
                stamp,
                |b| codec.encode_tenant(tenant, b),
                |b| codec.encode_item(item, b),
            )
        });
        // A panic left at most a partial record past the last one, which
        // no index points at.
        encoded.ok()?.ok()
    }

    /// A run for [`encode_into`](Self::encode_into), in this thread's
    /// reused buffer: hand it back with [`recycle_run`](Self::recycle_run).
    pub(crate) fn new_run(&self) -> EncodedRun {
        EncodedRun::new_in(SCRATCH.try_with(Cell::take).unwrap_or_default())
    }

    /// Hands the buffer of a [`new_run`](Self::new_run) back to this thread.
    pub(crate) fn recycle_run(run: EncodedRun) {
        keep_scratch(run.into_buffer());
    }

    /// Hands the buffer of a record [`encode`](Self::encode) made back to
    /// this thread, for its next stage.
    pub(crate) fn recycle(record: EncodedItem) {
        keep_scratch(record.into_buffer());
    }

    /// Under the outbox's lock: the journal's lock, for a run of
    /// [`fits`](Appender::fits) and [`append`](Appender::append) calls
    /// ended by [`finish`](Appender::finish).
    pub(crate) fn appender(&self) -> Appender<'_, K, I> {
        let g = self.lock();
        let was_empty = g.state.buffered() == 0;
        Appender {
            journal: self,
            g,
            was_empty,
            appended: false,
        }
    }
}
