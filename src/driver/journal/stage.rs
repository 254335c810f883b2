//! The journal's part of a stage (S-J1, S-J4, S-J8), one step for a
//! single stage and a run (S-W20) alike: the items are encoded on the
//! caller's thread, outside every lock, into a run of records the thread
//! reuses; each record's room is checked and the record appended under
//! the journal's lock, taken inside the outbox's or alone.

use std::cell::Cell;
use std::sync::MutexGuard;

use super::{wall_ms, Inner, Journal};
use crate::driver::contain;
use crate::journal::format::{EncodedRun, Stamp, Unsealed};

thread_local! {
    /// The run a stage encodes its records into on this thread, reused
    /// from one stage to the next (a stage allocates nothing for its
    /// record).
    static SCRATCH: Cell<EncodedRun> = const { Cell::new(EncodedRun::new()) };
}

/// A scratch run grown past this by a large item or a long run is let go,
/// so that a thread does not hold on to a burst.
const SCRATCH_KEEP: usize = 64 << 10;

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
    /// Encodes `item` of `tenant` as one more record of `run` (outside any
    /// lock; a panic in the codec is contained): its index in the run, or
    /// `None` when the codec failed or the record would be too large.
    pub(crate) fn encode_into(&self, run: &mut EncodedRun, tenant: &K, item: &I) -> Option<usize> {
        let codec = &*self.codec;
        // The codec's version and the wall clock's time (S-J14, S-R3).
        let stamp = Stamp {
            staged_ms: wall_ms(&self.wall),
            ..self.stamp
        };
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

    /// An empty run for [`encode_into`](Self::encode_into), in this
    /// thread's reused buffers: hand it back with
    /// [`recycle_run`](Self::recycle_run).
    pub(crate) fn new_run(&self) -> EncodedRun {
        let mut run = SCRATCH.try_with(Cell::take).unwrap_or_default();
        run.clear();
        run
    }

    /// Hands the buffers of a [`new_run`](Self::new_run) back to this
    /// thread, unless they grew past what a thread keeps.
    pub(crate) fn recycle_run(run: EncodedRun) {
        if run.held_bytes() <= SCRATCH_KEEP {
            // Gone only while the thread exits: the run is dropped then.
            let _ = SCRATCH.try_with(|s| s.set(run));
        }
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
