//! The journal's part of a stage (S-J1, S-J4, S-J8), one step for a
//! single stage and a run (S-W20) alike: the items are encoded on the
//! caller's thread, outside every lock, into a run of records the thread
//! reuses; each record's room is checked and the record appended under
//! the journal's lock, taken inside the outbox's or alone.

use std::cell::Cell;
use std::sync::{MutexGuard, PoisonError};

use super::{Inner, Journal};
use crate::driver::contain;
use crate::journal::format::{EncodedRun, Stamp, Unsealed};

/// The records of one stage or one run (S-W20), encoded outside every
/// lock, and the wall-clock stamp they share (S-R3).
pub(crate) struct Run {
    records: EncodedRun,
    /// Read once, at the run's first record: a clock read per record cost
    /// a `stage_many` of `u64` items about a seventh of its time (a
    /// `clock_gettime` under a hypervisor is not free), and a run's items
    /// share one monotonic stamp already (S-W20).
    stamp: Stamp,
}

impl Run {
    /// The record of index `i`, as [`Journal::encode_into`] gave it.
    pub(crate) fn get(&self, i: usize) -> Option<Unsealed<'_>> {
        self.records.get(i)
    }
}

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
/// ([`Journal::appending`], D2): one lock and at most one wake of the
/// commit task for a stage or a whole
/// [`stage_many`](crate::Outbox::stage_many) (S-W20).
pub(crate) struct Appender<'a, K, I> {
    journal: &'a Journal<K, I>,
    g: MutexGuard<'a, Inner<K>>,
    appended: bool,
}

impl<K: Ord + std::hash::Hash + Clone, I> Appender<'_, K, I> {
    /// The room check and the append of one record, in one step: `decide`
    /// is told whether `max_bytes` leaves room on disk for `record` (S-J4)
    /// and `max_buffered_bytes` in memory (S-B8), after what was appended,
    /// and names the tenant to append it under, if the item is taken.
    /// While the journal is down, an append only keeps its place (S-J5).
    pub(crate) fn append_if<R>(
        &mut self,
        record: Unsealed<'_>,
        decide: impl FnOnce(bool) -> (Option<K>, R),
    ) -> R {
        let buffered = self.g.state.buffered().saturating_add(record.len());
        let room = self.g.state.fits(record.len()) && buffered <= self.journal.max_buffered;
        let (tenant, decided) = decide(room);
        if let Some(tenant) = tenant {
            self.appended = true;
            if !self.g.state.append(tenant, record) {
                self.g.unjournaled_in_incident += 1;
                self.journal.metrics.unjournaled.increment(1);
            }
        }
        decided
    }
}

impl<K, I> Journal<K, I>
where
    K: Ord + std::hash::Hash + Clone + Send + 'static,
    I: Send + 'static,
{
    /// Encodes `item` of `tenant` as one more record of `run` (outside any
    /// lock; a panic in the codec is contained): its index in the run, or
    /// `None` when the codec failed or the record would be too large. The
    /// first record takes this thread's reused buffers for `run`: hand
    /// them back with [`recycle_run`](Self::recycle_run).
    pub(crate) fn encode_into(&self, run: &mut Option<Run>, tenant: &K, item: &I) -> Option<usize> {
        let run = run.get_or_insert_with(|| {
            let mut records = SCRATCH.try_with(Cell::take).unwrap_or_default();
            records.clear();
            // The codec's version and the wall clock's time (S-J14, S-R3),
            // once for the whole run.
            let stamp = Stamp {
                staged_ms: crate::core::unix_ms((self.wall)()),
                ..self.stamp
            };
            Run { records, stamp }
        });
        let codec = &*self.codec;
        let (records, stamp) = (&mut run.records, run.stamp);
        let encoded = contain::call(|| {
            records.push(
                stamp,
                |b| codec.encode_tenant(tenant, b),
                |b| codec.encode_item(item, b),
            )
        });
        // A panic left at most a partial record past the last one, which
        // no index points at.
        encoded.ok()?.ok()
    }

    /// Hands the buffers of a run of [`encode_into`](Self::encode_into)
    /// back to this thread, unless they grew past what a thread keeps.
    pub(crate) fn recycle_run(run: Option<Run>) {
        let records = run.map(|r| r.records);
        if let Some(records) = records.filter(|r| r.held_bytes() <= SCRATCH_KEEP) {
            // Gone only while the thread exits: the run is dropped then.
            let _ = SCRATCH.try_with(|s| s.set(records));
        }
    }

    /// Runs `f` under the journal's lock, for a run of
    /// [`append_if`](Appender::append_if) calls (under the outbox's lock,
    /// or alone: nothing else is locked under it, S-W19); then, if
    /// anything was appended, wakes the commit task: at once when
    /// `sync_bytes` are buffered, else on its interval if this run was the
    /// first to append to an empty buffer (S-J1).
    pub(crate) fn appending<R>(&self, f: impl FnOnce(&mut Appender<'_, K, I>) -> R) -> R {
        let g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let was_empty = g.state.buffered() == 0;
        let mut appender = Appender {
            journal: self,
            g,
            appended: false,
        };
        let out = f(&mut appender);
        let buffered = appender.g.state.buffered();
        let appended = appender.appended;
        drop(appender);
        if appended && buffered >= self.sync_bytes {
            self.now.notify_one();
        } else if appended && was_empty {
            self.soon.notify_one();
        }
        out
    }
}
