//! The `Outbox` handle (S-W1, S-A4, S-W10, S-W9, S-B6, S-A7, S-W16):
//! control calls and reads; the staging calls live in `stage` and
//! `stage_many`, construction in `build`.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;

use super::answer::Answer;
use super::shared::{Shared, SinkWaiter, State, Waiter};
use crate::core::{Counters, Report, ShutdownReport, Time, Unwritten, WaitId};
use crate::sink::Sink;

/// The outbox: stage items from the request path; one writer task writes
/// them per tenant, in order, through the [`Sink`].
///
/// Cheap to clone (`Send + Sync`); every clone is the same outbox. When the
/// last clone is dropped without a [`shutdown`](Self::shutdown), the writer
/// shuts down by itself with the builder's
/// [`drop_timeout`](crate::OutboxBuilder::drop_timeout) (default 30 s), then
/// exits (S-W16). Dropping the runtime drops the writer: items still
/// pending then cannot be written any more and are counted lost under
/// `abandoned` (S-A7, S-W14), waiting callers are answered, and later
/// stages are refused; shut down first to give them a chance.
///
/// Every method but the constructors may be called from any thread, in
/// the runtime or not; none blocks beyond a short lock, none panics.
pub struct Outbox<S: Sink> {
    pub(super) handle: Arc<HandleRef<S>>,
}

/// Counts the handles: its drop is the last handle's (S-W16).
pub(super) struct HandleRef<S: Sink> {
    pub(super) shared: Arc<Shared<S>>,
}

impl<S: Sink> Drop for HandleRef<S> {
    fn drop(&mut self) {
        self.shared.lock().handles_gone = true;
        self.shared.wake();
    }
}

impl<S: Sink> Clone for Outbox<S> {
    fn clone(&self) -> Self {
        Outbox {
            handle: Arc::clone(&self.handle),
        }
    }
}

impl<S: Sink> fmt::Debug for Outbox<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.shared().lock();
        f.debug_struct("Outbox")
            .field("sink", &self.shared().sink.name())
            .field("engine", &st.engine)
            .finish()
    }
}

impl<S: Sink> Outbox<S> {
    /// The handle of a built outbox's shared state.
    pub(super) fn from_shared(shared: Arc<Shared<S>>) -> Self {
        Outbox {
            handle: Arc::new(HandleRef { shared }),
        }
    }

    pub(super) fn shared(&self) -> &Shared<S> {
        &self.handle.shared
    }

    /// A snapshot of how the outbox is doing (S-R6): the breaker, the run
    /// of failures, the last successful write, the oldest pending item's
    /// age, writes in flight, tenants held; with an outbox table, its
    /// listener's state and the last horizon the relay read, with that
    /// reading's age (S-T36). Also refreshes the health gauges. Does no
    /// IO (the relay reads the horizon on its own schedule); costs
    /// O(tenants) under the lock: for a health endpoint, not for every
    /// request.
    pub fn health(&self) -> crate::Health {
        let shared = self.shared();
        let now = shared.now();
        let dropped = shared
            .dead_letters_dropped
            .load(std::sync::atomic::Ordering::Relaxed);
        #[allow(unused_mut)] // Set below with the feature `table`.
        let mut health = shared.engine_input(|st| crate::Health::of(&st.engine, now, dropped));
        #[cfg(feature = "table")]
        {
            health.table = shared.relay_feed.as_ref().map(|f| f.watch.snapshot(now));
        }
        shared.gauges.set(&health);
        health
    }

    /// Resolves once the outbox is closed for good: every handle dropped,
    /// the writer exited (after its drain, S-W16), and with a journal its
    /// task exited and released the directory's lock (S-J6), so that a new
    /// outbox may be built on the same directory at once. Take the future,
    /// then drop the handles:
    ///
    /// ```no_run
    /// # async fn f<S: outbox::Sink>(outbox: outbox::Outbox<S>) {
    /// let report = outbox.shutdown(std::time::Duration::from_secs(5)).await;
    /// let closed = outbox.closed();
    /// drop(outbox);
    /// closed.await;
    /// # }
    /// ```
    ///
    /// Never resolves while a handle lives (it would wait on itself). Also
    /// resolves when the runtime shut down and dropped the tasks.
    ///
    /// # Cancellation
    /// Cancel safe: the future only watches; dropping it changes nothing.
    pub fn closed(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let tasks = self.shared().tasks.clone();
        async move { tasks.wait().await }
    }

    /// Items accepted and not yet written, lost or dropped (S-W14); the
    /// `outbox_pending` gauge shows the same once the writer is at rest.
    pub fn pending(&self) -> u64 {
        self.shared().engine_input(|st| st.engine.pending())
    }

    /// A snapshot of the engine's counters (S-W14): staged, pending,
    /// written, lost and dropped by reason, writes, attempts, failures.
    pub fn counters(&self) -> Counters {
        self.shared()
            .engine_input(|st| st.engine.counters().clone())
    }

    /// The sink's name: the `outbox` label of the metrics.
    pub fn name(&self) -> &str {
        self.shared().sink.name()
    }

    /// Whether a shutdown (or abandon) has begun: new items are refused.
    pub fn is_shutting_down(&self) -> bool {
        self.shared().lock().engine.is_shutting_down()
    }

    /// Sends everything staged before this call at once, lingering batches
    /// included, and answers when those items are settled or at the
    /// deadline, the call's time plus `timeout` (S-A4, S-W15). The
    /// [`Report`] says how many of them were written, dropped and lost, how
    /// many are still pending, and whether the deadline passed. Never overtakes earlier items; concurrent
    /// flushes each get their own truthful answer. Items staged after the
    /// call are not waited for. With an outbox table, it covers the rows
    /// already in the engine, and answers once those written or given up
    /// are removed from the table too, at the latest at the deadline
    /// (S-W10, S-A4 restated for the table).
    ///
    /// Takes effect at the call; see [`Answer`] for what dropping the
    /// future does. A runtime that is gone answers at once with the
    /// deadline passed.
    pub fn flush(&self, timeout: Duration) -> Answer<Report> {
        self.wait(
            |tx, now| Waiter::Report(tx, now + timeout),
            |st, now| st.engine.flush(now, now + timeout),
        )
    }

    /// Waits until everything staged before this call is settled, or until
    /// the deadline, the call's time plus `timeout`, without sending lingering batches early and
    /// without closing anything (S-W10). [`Report::pending`] is how many of
    /// those items are still pending (0 when everything settled). With
    /// an outbox table, as [`flush`](Self::flush): the covered rows are
    /// out of the table when it answers before its deadline.
    ///
    /// Takes effect at the call; see [`Answer`] for cancellation.
    pub fn settle(&self, timeout: Duration) -> Answer<Report> {
        self.wait(
            |tx, now| Waiter::Report(tx, now + timeout),
            |st, now| st.engine.settle(now, now + timeout),
        )
    }

    /// Shuts the outbox down (S-W9, S-B6). The fence goes up during this
    /// call, before the returned future is first polled: every later
    /// [`stage`](Self::stage) is refused and counted lost under `shutdown`.
    /// Items staged before drain, with retries, until the deadline, the
    /// call's time plus `timeout`; then the writes in flight are cancelled and every unwritten item is counted
    /// lost under `deadline` and handed back in
    /// [`ShutdownReport::unwritten`], except the items of a cancelled
    /// write that comes back committed (it may have committed before the
    /// cancel reached it): those stay counted lost and are not handed
    /// back (S-B6). After the answer nothing is pending
    /// and no write starts (I8). With a journal, the answer comes once the
    /// done marks are on disk (S-J3), or at the deadline if the disk is
    /// slower (S-W15: marks not yet on disk then stage their items again
    /// at the next start, written twice at worst); the journal is left
    /// holding one empty segment once the last handle is dropped (D6).
    ///
    /// Called more than once (or concurrently), the first call's report
    /// carries the accounting and the others report zeros
    /// ([`ShutdownReport::first`]); a later call whose deadline comes
    /// earlier tightens the shutdown's.
    ///
    /// # Cancellation
    /// Dropping the future does not stop the shutdown; only its report is
    /// discarded, dead letters included (they stay counted lost).
    pub fn shutdown(&self, timeout: Duration) -> Answer<ShutdownReport<S::Tenant, S::Item>> {
        let shared = self.shared();
        self.wait(
            |tx, _| Waiter::Shutdown(tx),
            |st, now| {
                // The hand-off closes with the engine's fence (S-W9, S-W19).
                if shared.take_in(st, true) {
                    shared.wake();
                }
                st.engine.shutdown(now, now + timeout)
            },
        )
    }

    /// Gives up at once (S-A7): everything pending is counted lost under
    /// `abandoned`, writes in flight are cancelled, waiting callers are
    /// answered, and nothing is accepted any more. Returns the items the
    /// engine held, per tenant in staging order (those in flight are not
    /// among them). While a shutdown is still to answer, they go to its
    /// dead letters instead ([`ShutdownReport::unwritten`]) and this returns
    /// nothing: each item is handed back once. Each run says whether an
    /// attempt of it started ([`Unwritten::attempted`], S-J16): such items
    /// may already be in the store, so a replay of them must be idempotent.
    pub fn abandon(&self) -> Vec<Unwritten<S::Tenant, S::Item>> {
        let shared = self.shared();
        let now = shared.now();
        let held = shared.engine_input(|st| {
            // The hand-off closes with the engine's fence (S-W19).
            let _ = shared.take_in(st, true);
            st.engine.abandon(now)
        });
        shared.wake();
        held
    }

    /// Starts a flush, settle or shutdown under the lock and hands the
    /// caller its [`Answer`].
    fn wait<T>(
        &self,
        waiter: impl FnOnce(oneshot::Sender<T>, Time) -> SinkWaiter<S>,
        start: impl FnOnce(&mut State<S::Tenant, S::Item>, Time) -> WaitId,
    ) -> Answer<T> {
        let shared = self.shared();
        let (tx, rx) = oneshot::channel();
        let now = shared.now();
        shared.engine_input(|st| {
            let id = start(st, now);
            if st.writer_gone {
                // Abandoned when the writer went: nothing is pending, and
                // nobody will answer. Dropping the sender gives the caller
                // what its `Answer` gives when the writer is gone.
                while st.engine.poll_event().is_some() {}
                drop(tx);
            } else {
                st.waiters.insert(id, waiter(tx, now));
            }
        });
        shared.wake();
        Answer::new(rx)
    }
}
