//! The state the handles and the writer share: the engine and the callers
//! waiting for a flush, settle or shutdown, behind one short-held lock
//! (S-C3, S-W15).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::runtime::Handle;
use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;

use super::contain;
use crate::core::{Engine, Report, ShutdownReport, Time, WaitId};
use crate::sink::Sink;
use crate::telemetry::Export;

/// A caller waiting for its answer.
pub(crate) enum Waiter<K, I> {
    /// A flush or settle.
    Report(oneshot::Sender<Report>),
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
}

impl<K: Ord + std::hash::Hash + Clone, I> State<K, I> {
    /// Exports the engine's counters (I3: after every step).
    pub(crate) fn export(&mut self) {
        self.export.export(self.engine.counters());
    }
}

pub(crate) struct Shared<S: Sink> {
    state: Mutex<State<S::Tenant, S::Item>>,
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
    /// The origin of the engine's [`Time`].
    origin: Instant,
    /// The write-ahead journal, if configured (D1-D6). Its lock is taken
    /// inside the state's, never the other way round.
    #[cfg(feature = "journal")]
    pub(crate) journal: Option<Arc<super::journal::Journal<S::Tenant, S::Item>>>,
}

impl<S: Sink> Shared<S> {
    pub(crate) fn new(
        engine: Engine<S::Tenant, S::Item>,
        export: Export,
        sink: Arc<S>,
        runtime: Handle,
    ) -> Self {
        let origin = {
            let _in = runtime.enter();
            Instant::now()
        };
        Shared {
            state: Mutex::new(State {
                engine,
                waiters: BTreeMap::new(),
                handles_gone: false,
                writer_gone: false,
                export,
            }),
            wake: Notify::new(),
            capacity: Notify::new(),
            gauges: super::health::Gauges::register(sink.name()),
            sink,
            dead_letters: None,
            dead_letters_dropped: std::sync::atomic::AtomicU64::new(0),
            runtime,
            tasks: tokio_util::task::TaskTracker::new(),
            origin,
            #[cfg(feature = "journal")]
            journal: None,
        }
    }

    /// Runs one engine input under the lock and exports the counters.
    /// Items the engine let go of (refused, dropped, given up) are dropped
    /// after the lock: an item's `Drop` is application code, which may be
    /// slow, read the outbox or panic (S-W13); a panic there is swallowed,
    /// the item being already counted.
    pub(crate) fn engine_input<R>(&self, f: impl FnOnce(&mut State<S::Tenant, S::Item>) -> R) -> R {
        let mut st = self.lock();
        let out = f(&mut st);
        st.export();
        let released = st.engine.take_released();
        drop(st);
        if !released.is_empty() {
            contain::drop_each(released);
        }
        out
    }

    /// Locks the state. The engine is never left half-changed by a panic
    /// (it has none on valid input), so a poisoned lock is taken as is.
    pub(crate) fn lock(&self) -> MutexGuard<'_, State<S::Tenant, S::Item>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Now on the runtime's clock (tokio's paused clock in tests), from any
    /// thread, in the runtime or not.
    pub(crate) fn now(&self) -> Time {
        let at = match Handle::try_current() {
            Ok(current) if current.id() == self.runtime.id() => Instant::now(),
            Err(e) if e.is_thread_local_destroyed() => Instant::from_std(std::time::Instant::now()),
            _ => {
                let _in = self.runtime.enter();
                Instant::now()
            }
        };
        Time::from_elapsed(at.saturating_duration_since(self.origin))
    }

    /// The instant of a [`Time`] on this clock.
    pub(crate) fn instant(&self, at: Time) -> Instant {
        self.origin + at.elapsed()
    }

    /// Wakes the writer.
    pub(crate) fn wake(&self) {
        self.wake.notify_one();
    }

    pub(crate) fn runtime(&self) -> &Handle {
        &self.runtime
    }
}
