//! The journal's part of a stage (S-J1, S-J4, S-J8), one step for a
//! single stage and a run (S-W20) alike: the items are encoded on the
//! caller's thread, outside every lock, into a run of records the thread
//! reuses; each record's room is checked and the record appended under
//! the journal's lock, taken inside the outbox's or alone. Its own
//! module, outside the driver: the journal's append step, which decides
//! nothing the core's journal machine does not and does no IO (the
//! commit task does).

use std::cell::Cell;
use std::sync::{Mutex, MutexGuard, PoisonError};

use metrics::Counter;
use tokio::sync::Notify;

use super::format::{EncodedRun, Stamp};
use super::Codec;
use super::WallClock;
use crate::contain;
use crate::core::journal::Machine;
use crate::core::Append;

/// The journal's state behind its lock: the core's journal machine,
/// whose sync callers are `W`s.
pub(crate) struct Inner<K, W> {
    /// Every decision: the core's journal machine.
    pub(crate) state: Machine<K, W>,
    /// Items unjournaled since the incident began (for its log line).
    pub(crate) unjournaled_in_incident: u64,
}

/// The journal as a stage sees it: its lock, the codec and the wakes of
/// its commit task.
pub(crate) struct Staging<K, I, W> {
    pub(crate) inner: Mutex<Inner<K, W>>,
    codec: Box<dyn Codec<K, I>>,
    /// What each record carries besides its item: the codec's version
    /// (S-J14).
    stamp: Stamp,
    /// The wall clock records are stamped with (S-R3).
    wall: WallClock,
    /// Commit now: `sync_bytes` reached, a sync caller, closing.
    pub(crate) now: Notify,
    /// Something was buffered: commit within `sync_interval`.
    pub(crate) soon: Notify,
    /// A commit ended: its done marks and deleted segments may have given
    /// room back, so callers waiting for room try again (S-R5).
    pub(crate) room: Notify,
    sync_bytes: usize,
    max_buffered: usize,
    /// Items accepted while the journal is down (S-J5).
    pub(crate) unjournaled: Counter,
}

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
/// ([`Staging::appending`], D2): one lock and at most one wake of the
/// commit task for a stage or a whole
/// [`stage_many`](crate::Outbox::stage_many) (S-W20).
pub(crate) struct Appender<'a, K, I, W> {
    journal: &'a Staging<K, I, W>,
    g: MutexGuard<'a, Inner<K, W>>,
    /// The records of the stage or the run, by the indexes
    /// [`Staging::encode_into`] gave.
    run: Option<&'a Run>,
    appended: bool,
}

impl<K: Ord + std::hash::Hash + Clone, I, W> Append<K> for Appender<'_, K, I, W> {
    /// The room check and the append of record `i` of the run, in one
    /// step: `decide` is told whether `max_bytes` leaves room on disk for
    /// it (S-J4) and `max_buffered_bytes` in memory (S-B8), after what was
    /// appended, and names the tenant to append it under, if the item is
    /// taken. While the journal is down, an append only keeps its place
    /// (S-J5).
    fn append_if<R>(&mut self, i: usize, decide: impl FnOnce(bool) -> (Option<K>, R)) -> R {
        let Some(record) = self.run.and_then(|run| run.records.get(i)) else {
            // No such record: never given by `encode_into`.
            return decide(false).1;
        };
        let buffered = self.g.state.buffered().saturating_add(record.len());
        let room = self.g.state.fits(record.len()) && buffered <= self.journal.max_buffered;
        let (tenant, decided) = decide(room);
        if let Some(tenant) = tenant {
            self.appended = true;
            if !self.g.state.append(tenant, record) {
                self.g.unjournaled_in_incident += 1;
                self.journal.unjournaled.increment(1);
            }
        }
        decided
    }
}

impl<K, I, W> Staging<K, I, W>
where
    K: Ord + std::hash::Hash + Clone + Send + 'static,
    I: Send + 'static,
{
    /// The stage's side of a journal over `state`, encoding with `codec`
    /// (records stamped `stamp` and the `wall` clock's time), waking its
    /// commit task at once when `sync_bytes` are buffered, refusing past
    /// `max_buffered` bytes in memory (S-B8).
    pub(crate) fn new(
        state: Machine<K, W>,
        codec: Box<dyn Codec<K, I>>,
        (stamp, wall): (Stamp, WallClock),
        (sync_bytes, max_buffered): (usize, usize),
        unjournaled: Counter,
    ) -> Self {
        Staging {
            inner: Mutex::new(Inner {
                state,
                unjournaled_in_incident: 0,
            }),
            codec,
            stamp,
            wall,
            now: Notify::new(),
            soon: Notify::new(),
            room: Notify::new(),
            sync_bytes,
            max_buffered,
            unjournaled,
        }
    }

    /// Locks the journal's state; a poisoned lock is taken as is (the
    /// machine has no panics on valid input).
    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner<K, W>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

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
                staged_ms: self.wall.unix_ms(),
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
    #[inline]
    pub(crate) fn recycle_run(run: Option<Run>) {
        let Some(run) = run else {
            return;
        };
        if run.records.held_bytes() <= SCRATCH_KEEP {
            let records = run.records;
            // Gone only while the thread exits: the run is dropped then.
            let _ = SCRATCH.try_with(|s| s.set(records));
        }
    }

    /// Runs `f` under the journal's lock, for a run of
    /// [`append_if`](Append::append_if) calls over the records of `run`
    /// (under the outbox's lock, or alone: nothing else is locked under
    /// it, S-W19); then, if anything was appended, wakes the commit task:
    /// at once when `sync_bytes` are buffered, else on its interval if
    /// this run was the first to append to an empty buffer (S-J1).
    pub(crate) fn appending<R>(
        &self,
        run: Option<&Run>,
        f: impl FnOnce(&mut Appender<'_, K, I, W>) -> R,
    ) -> R {
        let g = self.lock();
        let was_empty = g.state.buffered() == 0;
        let mut appender = Appender {
            journal: self,
            g,
            run,
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

    /// Resolves after the next commit ends (S-R5): register it before
    /// trying for room, as [`Notify::notified`] says, and try again when
    /// it resolves.
    pub(crate) fn room_freed(&self) -> tokio::sync::futures::Notified<'_> {
        self.room.notified()
    }
}
