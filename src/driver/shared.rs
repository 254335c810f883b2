//! The state the handles and the writer share: the engine and the callers
//! waiting for a flush, settle or shutdown, behind one short-held lock
//! (S-C3, S-W15); and the request path's hand-off to it, which takes no
//! lock (S-W19).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use std::task::{Context, Poll};

use tokio::runtime::Handle;
use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;

use super::contain;
use super::journal::Journal;
use crate::core::{Admission, Engine, Report, ShutdownReport, Time, WaitId};
use crate::handoff::{lane, LaneRx, LaneTx};
use crate::sink::Sink;
use crate::telemetry::Export;

/// A caller waiting for its answer.
pub(crate) enum Waiter<K, I> {
    /// A flush or settle, with its deadline.
    Report(oneshot::Sender<Report>, Time),
    /// A shutdown.
    Shutdown(oneshot::Sender<ShutdownReport<K, I>>),
}

/// The waiter of an outbox over the sink `S`.
pub(crate) type SinkWaiter<S> = Waiter<<S as Sink>::Tenant, <S as Sink>::Item>;

pub(crate) struct State<K, I> {
    pub(crate) engine: Engine<K, I>,
    /// Callers waiting, by the engine's wait id. A `BTreeMap`, so anything
    /// done for all of them happens in one order every run.
    pub(crate) waiters: BTreeMap<WaitId, Waiter<K, I>>,
    /// Every `Outbox` handle is gone: the writer drains and exits (S-W16).
    pub(crate) handles_gone: bool,
    /// The writer task is gone (its runtime shut down): nobody will answer
    /// a new wait, so it is answered at once.
    pub(crate) writer_gone: bool,
    /// The counters and the pending gauge, exported after every input.
    export: Export,
    /// The request path's stages on their way to the engine (S-W19): taken
    /// in by whoever holds the lock, before anything else it does.
    pub(crate) handoffs: LaneRx<K, I>,
    /// The engine's pending items and bytes as the admission counts them:
    /// the difference to the engine's own is given back (or added) after
    /// every input.
    pub(crate) admitted: (u64, u64),
}

/// An item's weight on the request path: the same contained weigher the
/// engine holds, clamped as the engine clamps (S-B5).
pub(crate) type SharedWeigher<I> = Arc<dyn Fn(&I) -> u64 + Send + Sync>;

pub(crate) struct Shared<S: Sink> {
    state: Mutex<State<S::Tenant, S::Item>>,
    /// The request path's hand-off (S-W19, see [`crate::handoff`]).
    pub(crate) handoff: LaneTx<S::Tenant, S::Item>,
    /// Admission by reservation against `capacity` and `capacity_bytes`.
    pub(crate) admission: Admission,
    /// Stages are decided under the lock (a `tenant_capacity` needs the
    /// tenant's count; a journal appends in the engine's order), not on the
    /// request path.
    pub(crate) locked_stage: bool,
    /// Items are stamped on the request path: the engine reads their time
    /// (a linger or a `max_item_age`, S-A3, S-R3).
    pub(crate) stamps: bool,
    /// The weigher, contained, for the request path.
    pub(crate) weigher: Option<SharedWeigher<S::Item>>,
    /// Wakes the writer after an input (a stage, a control call).
    pub(crate) wake: Notify,
    /// Wakes the callers waiting for capacity (S-R5) when items settled
    /// or a shutdown began.
    pub(crate) capacity: Notify,
    /// The health gauges (S-R6).
    pub(crate) gauges: super::health::Gauges,
    pub(crate) sink: Arc<S>,
    /// Where run-time dead letters go (S-R4), if anywhere.
    pub(crate) dead_letters: Option<super::DeadLetters<S::Tenant, S::Item>>,
    /// Dead letters that could not be handed out (channel full or closed,
    /// callback panicked), or had nowhere to go.
    pub(crate) dead_letters_dropped: std::sync::atomic::AtomicU64,
    /// The runtime the writer runs on; its clock is the outbox's clock.
    runtime: Handle,
    /// The writer's and the journal's tasks: [`Outbox::closed`] waits for
    /// both to exit (the journal's releases the directory's lock).
    ///
    /// [`Outbox::closed`]: crate::Outbox::closed
    pub(crate) tasks: tokio_util::task::TaskTracker,
    /// The origin of the engine's [`Time`], less its head start: the
    /// engine's clock reads [`head_start`] at `origin`.
    origin: Instant,
    /// See [`head_start`].
    head_start: Duration,
    /// The write-ahead journal, if configured (D1-D6). Its lock is taken
    /// inside the state's, or alone by a stage (which takes no other lock
    /// under it, S-W19); never the other way round.
    /// Always `None` without the `journal` feature.
    pub(crate) journal: Option<Arc<Journal<S::Tenant, S::Item>>>,
    /// With an outbox table, which rows the engine's outcomes end (S-T31).
    #[cfg(feature = "table")]
    pub(crate) relay_feed: Option<Arc<super::table::feed::Feed<S::Tenant>>>,
}

/// Where the engine's clock starts at build (S-R3): just past
/// `max_item_age` (at most a century), so that an item staged in an
/// earlier life, given to the engine with its age (at most this), keeps it
/// rather than being stamped at the clock's zero; one past the limit stays
/// past it (by a nanosecond: clamped to the limit itself, it would not be
/// "longer ago than" the limit until the clock moved, and a write starting
/// at the recovery's instant would write it).
pub(crate) fn head_start(config: &crate::Config) -> Duration {
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 86_400);
    config.max_item_age().map_or(Duration::ZERO, |a| {
        a.min(CENTURY).saturating_add(Duration::from_nanos(1))
    })
}

impl<S: Sink> Shared<S> {
    pub(crate) fn new(
        engine: Engine<S::Tenant, S::Item>,
        weigher: Option<SharedWeigher<S::Item>>,
        export: Export,
        sink: Arc<S>,
        runtime: Handle,
    ) -> Self {
        let origin = {
            let _in = runtime.enter();
            Instant::now()
        };
        let config = engine.config();
        let head = head_start(config);
        let admission = Admission::new(config);
        // A recovery's items are pending already (D4).
        let admitted = (engine.pending(), engine.pending_bytes());
        admission.add(admitted.0, admitted.1);
        let locked_stage = config.tenant_capacity().is_some();
        let stamps = !config.linger().is_zero() || config.max_item_age().is_some();
        // The weight travels when bytes are reserved on the request path,
        // the stamp when the engine reads it.
        let (handoff, handoffs) = lane(stamps || config.capacity_bytes().is_some());
        Shared {
            state: Mutex::new(State {
                engine,
                waiters: BTreeMap::new(),
                handles_gone: false,
                writer_gone: false,
                export,
                handoffs,
                admitted,
            }),
            handoff,
            admission,
            locked_stage,
            stamps,
            weigher,
            wake: Notify::new(),
            capacity: Notify::new(),
            gauges: super::health::Gauges::register(sink.name()),
            sink,
            dead_letters: None,
            dead_letters_dropped: std::sync::atomic::AtomicU64::new(0),
            runtime,
            tasks: tokio_util::task::TaskTracker::new(),
            origin,
            head_start: head,
            journal: None,
            #[cfg(feature = "table")]
            relay_feed: None,
        }
    }

    /// Runs one engine input under the lock and exports the counters.
    /// The hand-offs staged so far are taken in first (S-W19), so the input
    /// comes after every stage that returned before it; the writer is woken
    /// if they need it.
    /// Items the engine let go of (refused, dropped, given up) are dropped
    /// after the lock: an item's `Drop` is application code, which may be
    /// slow, read the outbox or panic (S-W13); a panic there is swallowed,
    /// the item being already counted.
    pub(crate) fn engine_input<R>(&self, f: impl FnOnce(&mut State<S::Tenant, S::Item>) -> R) -> R {
        let (out, wake) = self.input(f);
        if wake {
            self.wake();
        }
        out
    }

    /// [`engine_input`](Self::engine_input) for a caller that drains the
    /// engine in the same input: also says whether the hand-offs taken
    /// in need a drain.
    pub(crate) fn input<R>(
        &self,
        f: impl FnOnce(&mut State<S::Tenant, S::Item>) -> R,
    ) -> (R, bool) {
        self.input_taking(usize::MAX, f)
    }

    /// [`input`](Self::input) taking in at most `most` hand-offs, the
    /// oldest (the writer's round: [`WRITER_INTAKE`](crate::handoff::WRITER_INTAKE),
    /// S-W19).
    pub(crate) fn input_taking<R>(
        &self,
        most: usize,
        f: impl FnOnce(&mut State<S::Tenant, S::Item>) -> R,
    ) -> (R, bool) {
        // As `lock`: the engine is never left half-changed by a panic.
        let mut st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let State {
            engine,
            handoffs,
            admitted,
            ..
        } = &mut *st;
        let wake = handoffs.take_in((engine, &self.admission, admitted), false, most);
        let out = f(&mut st);
        let State {
            engine,
            admitted,
            export,
            ..
        } = &mut *st;
        // What settled in the engine gives its reservations back (S-A1,
        // S-B5).
        (self.admission).follow(admitted, engine.pending(), engine.pending_bytes());
        // The counters after every step (I3), the ages of the items
        // settled (S-R7).
        export.export(engine.counters());
        export.ages(engine.drain_item_ages());
        let released = engine.take_released();
        drop(st);
        if !released.is_empty() {
            contain::drop_each(released);
        }
        (out, wake)
    }

    /// Moves the hand-offs staged so far into the engine, in their order
    /// (S-W19); with `fence`, closes the hand-off first (S-W9), see
    /// [`LaneRx::take_in`]. Returns whether the writer must drain.
    pub(crate) fn take_in(&self, st: &mut State<S::Tenant, S::Item>, fence: bool) -> bool {
        let State {
            engine,
            handoffs,
            admitted,
            ..
        } = st;
        handoffs.take_in((engine, &self.admission, admitted), fence, usize::MAX)
    }

    /// The writer's wait for a hand-off: ready when one came (kept for the
    /// next input to take in first), pending otherwise, the writer's task
    /// then woken by the next stage (S-W19). Pending for good once the
    /// hand-off is closed and empty: the fence was taken in.
    pub(crate) fn poll_handoff(&self, cx: &mut Context<'_>) -> Poll<()> {
        self.lock().handoffs.poll_recv(cx)
    }

    /// Locks the state. The engine is never left half-changed by a panic
    /// (it has none on valid input), so a poisoned lock is taken as is.
    pub(crate) fn lock(&self) -> MutexGuard<'_, State<S::Tenant, S::Item>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` in the outbox's runtime's context (its clock, its timer),
    /// entering it unless the caller runs in it already.
    pub(crate) fn on_runtime<T>(&self, f: impl FnOnce() -> T) -> T {
        match Handle::try_current() {
            Ok(current) if current.id() == self.runtime.id() => f(),
            _ => {
                let _in = self.runtime.enter();
                f()
            }
        }
    }

    /// Now on the runtime's clock (tokio's paused clock in tests), from any
    /// thread, in the runtime or not.
    pub(crate) fn now(&self) -> Time {
        let at = match Handle::try_current() {
            Err(e) if e.is_thread_local_destroyed() => Instant::from_std(std::time::Instant::now()),
            _ => self.on_runtime(Instant::now),
        };
        let elapsed = at.saturating_duration_since(self.origin);
        Time::from_elapsed(elapsed.saturating_add(self.head_start))
    }

    /// The instant of a [`Time`] on this clock (a "never" far away, not
    /// an overflow).
    pub(crate) fn instant(&self, at: Time) -> Instant {
        super::deadline(self.origin, at.elapsed().saturating_sub(self.head_start))
    }

    /// Wakes the writer.
    pub(crate) fn wake(&self) {
        self.wake.notify_one();
    }

    pub(crate) fn runtime(&self) -> &Handle {
        &self.runtime
    }
}
