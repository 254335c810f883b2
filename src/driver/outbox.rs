//! The `Outbox` handle and its builder (S-W1, S-A1, S-A4, S-W10,
//! S-W9, S-B6, S-A7, S-W16).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::oneshot;

use super::answer::Answer;
use super::contain;
use super::shared::{Shared, SinkWaiter, State, Waiter};
use super::writer::Writer;
use crate::core::{
    Config, ConfigError, Counters, Engine, Report, ShutdownReport, Time, Unwritten, WaitId, Weigher,
};
use crate::sink::Sink;
use crate::telemetry;

/// The default timeout of the shutdown that starts when every handle is
/// dropped without one: 30 s from the last drop (S-W16).
pub const DEFAULT_DROP_TIMEOUT: Duration = Duration::from_secs(30);

/// Why an [`Outbox`] could not be built.
#[derive(Debug)]
#[non_exhaustive]
pub enum BuildError {
    /// The configuration does not make sense, e.g. a byte limit without a
    /// [`weigher`](OutboxBuilder::weigher).
    Config(ConfigError),
    /// Built outside a tokio runtime, and no
    /// [`runtime`](OutboxBuilder::runtime) handle was given.
    NoRuntime,
    /// The runtime has no timer (built without `enable_time`); the writer
    /// needs one for linger, backoff and deadlines.
    NoTimer,
    /// The runtime is shut down (a [`runtime`](OutboxBuilder::runtime)
    /// handle that outlived its runtime): the writer could not start.
    RuntimeShutDown,
    /// The journal could not be opened: its directory is unusable, locked
    /// by another process (S-J6), or holds a file that is not the
    /// journal's (S-J7).
    #[cfg(feature = "journal")]
    Journal(crate::journal::JournalError),
    /// The outbox table's relay settings are refused (S-T30).
    #[cfg(feature = "table")]
    Relay(crate::core::relay::RelayConfigError),
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::Config(e) => fmt::Display::fmt(e, f),
            BuildError::NoRuntime => f.write_str(
                "outbox: built outside a tokio runtime; build it inside one or pass `runtime(handle)`",
            ),
            BuildError::NoTimer => f.write_str(
                "outbox: the tokio runtime has no timer; build it with `enable_time()` (or `enable_all()`)",
            ),
            BuildError::RuntimeShutDown => f.write_str(
                "outbox: the tokio runtime is shut down; the writer task cannot run on it",
            ),
            #[cfg(feature = "journal")]
            BuildError::Journal(e) => fmt::Display::fmt(e, f),
            #[cfg(feature = "table")]
            BuildError::Relay(e) => fmt::Display::fmt(e, f),
        }
    }
}

impl std::error::Error for BuildError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BuildError::Config(e) => Some(e),
            #[cfg(feature = "journal")]
            BuildError::Journal(e) => Some(e),
            #[cfg(feature = "table")]
            BuildError::Relay(e) => Some(e),
            _ => None,
        }
    }
}

impl From<ConfigError> for BuildError {
    fn from(e: ConfigError) -> Self {
        BuildError::Config(e)
    }
}

/// Builds an [`Outbox`]: [`Outbox::builder`].
pub struct OutboxBuilder<S: Sink> {
    sink: S,
    config: Config,
    weigher: Option<Weigher<S::Item>>,
    drop_timeout: Duration,
    runtime: Option<Handle>,
    dead_letters: Option<super::DeadLetters<S::Tenant, S::Item>>,
    #[cfg(feature = "journal")]
    journal: Option<JournalSetup<S::Tenant, S::Item>>,
    /// The outbox table's relay, made at build (S-T30).
    #[cfg(feature = "table")]
    table: Option<TableSetup<S>>,
}

/// Makes the outbox table's relay for the engine's configuration.
#[cfg(feature = "table")]
type TableSetup<S> = Box<
    dyn FnOnce(&Config) -> Result<super::table::Relaying<S>, crate::core::relay::RelayConfigError>
        + Send,
>;

/// A journal to open at build: where, and with which codec.
#[cfg(feature = "journal")]
type JournalSetup<K, I> = (
    crate::journal::JournalConfig,
    Box<dyn crate::journal::Codec<K, I>>,
);

impl<S: Sink> fmt::Debug for OutboxBuilder<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutboxBuilder")
            .field("sink", &self.sink.name())
            .field("config", &self.config)
            .field("weigher", &self.weigher.is_some())
            .field("drop_timeout", &self.drop_timeout)
            .finish_non_exhaustive()
    }
}

impl<S: Sink> OutboxBuilder<S> {
    /// The engine's configuration (default: [`Config::default`]).
    pub fn config(mut self, config: Config) -> Self {
        self.config = config;
        self
    }

    /// Measures items in bytes for `max_batch_bytes` and `capacity_bytes`
    /// (S-B5). It must be pure: the same item always weighs the same. A
    /// panic in it is contained and the item weighs 1, the least weight
    /// (the engine clamps every weight, see [`Weigher`]).
    pub fn weigher(mut self, weigher: impl Fn(&S::Item) -> u64 + Send + Sync + 'static) -> Self {
        self.weigher = Some(Box::new(weigher));
        self
    }

    /// The timeout of the shutdown the writer starts by itself when every
    /// handle is dropped without a shutdown (S-W16): its deadline is the
    /// last drop plus `timeout`; default [`DEFAULT_DROP_TIMEOUT`] (30 s).
    /// What is unwritten at that deadline is counted lost under
    /// `deadline`, and logged.
    pub fn drop_timeout(mut self, timeout: Duration) -> Self {
        self.drop_timeout = timeout;
        self
    }

    /// Hands the items given up while the outbox runs (rejected by the
    /// sink, retries exhausted, dropped on a sink error, expired) to
    /// `dead_letters`, a callback or a bounded channel, with their tenant
    /// and reason, instead of dropping them (S-R4). Turns on
    /// [`ConfigBuilder::dead_letters`](crate::ConfigBuilder::dead_letters).
    /// Items given up by a shutdown deadline still come back in its
    /// [`ShutdownReport`], and those of an abandon from
    /// [`Outbox::abandon`]. Off by default.
    pub fn dead_letters(mut self, dead_letters: super::DeadLetters<S::Tenant, S::Item>) -> Self {
        self.dead_letters = Some(dead_letters);
        self
    }

    /// The runtime the writer runs on and whose clock the outbox reads.
    /// Default: the runtime `build` is called in.
    pub fn runtime(mut self, runtime: Handle) -> Self {
        self.runtime = Some(runtime);
        self
    }

    /// Journals every accepted item to disk, so that pending items survive
    /// a crash of the process and are staged again when an outbox is built
    /// on the same directory (feature `journal`; D1-D6). Items and tenants
    /// are encoded with [`Postcard`](crate::journal::Postcard) (serde); see
    /// [`journal_with_codec`](Self::journal_with_codec) for another
    /// encoding. Off by default.
    ///
    /// What survives: every item staged before a [`sync`](Outbox::sync)
    /// that answered `Ok` (D1); an item staged less than
    /// `sync_interval` before a crash may be lost uncounted. See the
    /// [`journal`](crate::journal) module.
    #[cfg(feature = "journal")]
    pub fn journal(self, config: crate::journal::JournalConfig) -> Self
    where
        S::Tenant: serde::Serialize + serde::de::DeserializeOwned,
        S::Item: serde::Serialize + serde::de::DeserializeOwned,
    {
        self.journal_with_codec(config, crate::journal::Postcard)
    }

    /// Like [`journal`](Self::journal), encoding with `codec`.
    #[cfg(feature = "journal")]
    pub fn journal_with_codec(
        mut self,
        config: crate::journal::JournalConfig,
        codec: impl crate::journal::Codec<S::Tenant, S::Item>,
    ) -> Self {
        self.journal = Some((config, Box::new(codec)));
        self
    }

    /// Relays the outbox table of `store` into the sink (feature `table`,
    /// S-T30..S-T36): the outbox then takes items only from the table,
    /// staged with [`OutboxTable`](crate::table::OutboxTable) in the
    /// caller's own transactions; [`Outbox::stage`] and its kin refuse
    /// every item (S-T32). The build spawns a lease task (ownership of the
    /// table's partitions, S-L1..S-L29) and a relay task, which the
    /// outbox's shutdown stops. The sink gets each item with its row id
    /// ([`Relayed`](crate::table::Relayed), S-T14). `capacity` and
    /// `tenant_capacity` bound the rows read ahead (back-pressure, never
    /// drops, S-T8).
    #[cfg(feature = "table")]
    pub fn table<St, I>(mut self, store: St, relay: crate::table::TableRelay<S::Tenant, I>) -> Self
    where
        S: Sink<Item = crate::table::Relayed<I>>,
        St: crate::table::Store,
        I: Send + 'static,
    {
        self.table = Some(Box::new(move |config: &Config| {
            super::table::spawner(store, relay, config)
        }));
        self
    }

    /// Builds the outbox and spawns its writer task on the runtime.
    ///
    /// Metric handles are registered now, with the recorder in force on
    /// this thread (see [`telemetry`](crate::telemetry)).
    ///
    /// # Errors
    /// [`BuildError::Config`] for a byte limit without a weigher;
    /// [`BuildError::NoRuntime`] outside a runtime without
    /// [`runtime`](Self::runtime); [`BuildError::NoTimer`] on a runtime
    /// without a timer; [`BuildError::RuntimeShutDown`] on a runtime that
    /// is shut down.
    pub fn build(self) -> Result<Outbox<S>, BuildError> {
        let runtime = match self.runtime {
            Some(rt) => rt,
            None => Handle::try_current().map_err(|_| BuildError::NoRuntime)?,
        };
        let has_timer = contain::call(|| {
            let _in = runtime.enter();
            drop(tokio::time::sleep(Duration::ZERO));
        });
        if has_timer.is_err() {
            return Err(BuildError::NoTimer);
        }
        // S-F1: only a sink that takes groups is handed them; any other
        // writes one tenant's slice per call, as if the config said so.
        let mut config = if contain::call(|| self.sink.takes_groups()).unwrap_or(false) {
            self.config
        } else {
            self.config.without_fan_in()
        };
        if self.dead_letters.is_some() {
            config.dead_letters = true;
        }
        // One contained weigher, for the engine and the request path.
        let weigher = self.weigher.map(|weigher| {
            Arc::new(move |item: &S::Item| contain::call(|| weigher(item)).unwrap_or(0))
                as super::shared::SharedWeigher<S::Item>
        });
        let engine = match &weigher {
            Some(weigher) => {
                let weigher = Arc::clone(weigher);
                Engine::with_weigher(config, move |item: &S::Item| weigher(item))?
            }
            None => Engine::new(config)?,
        };
        #[cfg(feature = "journal")]
        let mut engine = engine;
        #[cfg(feature = "journal")]
        let opened = match self.journal {
            Some((config, codec)) => {
                Some(open_journal(config, codec, self.sink.name(), &mut engine)?)
            }
            None => None,
        };
        #[cfg(feature = "table")]
        let table = match self.table {
            Some(setup) => Some(setup(engine.config()).map_err(BuildError::Relay)?),
            None => None,
        };
        let sink = Arc::new(self.sink);
        let (export, log) = telemetry::register(sink.name());
        #[allow(unused_mut)]
        let mut shared = Shared::new(engine, weigher, export, sink, runtime);
        shared.dead_letters = self.dead_letters;
        #[cfg(feature = "journal")]
        let committer = opened.map(|(journal, committer)| {
            shared.journal = Some(journal);
            committer
        });
        #[cfg(feature = "table")]
        if let Some((_, feed)) = &table {
            shared.relay_feed = Some(Arc::clone(feed));
        }
        let shared = Arc::new(shared);
        // The recovery's counts, exported before any stage (I3).
        shared.engine_input(|_| ());
        #[cfg(feature = "journal")]
        if let (Some(journal), Some(committer)) = (&shared.journal, committer) {
            drop(
                shared
                    .tasks
                    .spawn_on(Arc::clone(journal).run(committer), shared.runtime()),
            );
        }
        #[cfg(feature = "table")]
        if let Some((spawn, _)) = table {
            spawn(&shared);
        }
        let writer = Writer::new(Arc::clone(&shared), log, self.drop_timeout);
        drop(shared.tasks.spawn_on(writer.run(), shared.runtime()));
        // No task joins later: `closed` resolves once these two are gone.
        shared.tasks.close();
        // A shut-down runtime drops the task at once, and with it the
        // writer, whose drop marks it gone.
        if shared.lock().writer_gone {
            return Err(BuildError::RuntimeShutDown);
        }
        Ok(Outbox {
            handle: Arc::new(HandleRef { shared }),
        })
    }
}

/// An open journal and the committer its task runs.
#[cfg(feature = "journal")]
type OpenedJournal<K, I> = (
    Arc<super::journal::Journal<K, I>>,
    crate::journal::Committer<Box<dyn crate::journal::Storage>>,
);

/// Opens a journal and stages what it recovers into `engine`, per tenant
/// in staging order, before any new stage (D2, D4).
#[cfg(feature = "journal")]
fn open_journal<K: crate::TenantKey, I: Send + 'static>(
    config: crate::journal::JournalConfig,
    codec: Box<dyn crate::journal::Codec<K, I>>,
    name: &str,
    engine: &mut Engine<K, I>,
) -> Result<OpenedJournal<K, I>, BuildError> {
    let dir = config.dir.display().to_string();
    let opened = super::journal::Journal::open(config, codec, name).map_err(BuildError::Journal)?;
    let r = &opened.report;
    let mut items = opened.items;
    if crate::journal::canary::on(crate::journal::canary::REORDER) {
        items.reverse();
    }
    let durable = items
        .into_iter()
        .map(|(tenant, item)| crate::core::Durable {
            tenant,
            item,
            // The journal keeps no stamps: a recovered item is stamped now.
            age: Duration::ZERO,
            // The journal's marks count each tenant's items: no keys needed.
            key: None,
        });
    // Logged below, with the recovery's report.
    let _ = engine.stage_durable(Time::ZERO, durable, r.unreadable);
    engine.recover_other_version(r.other_version);
    if r.other_version > 0 {
        tracing::error!(
            outbox = name,
            dir = %dir,
            other_version = r.other_version,
            reason = crate::LostReason::OtherVersion.as_str(),
            "journal recovery refused items of another codec version; they are counted lost"
        );
    }
    if r.unreadable > 0 || r.damaged_bytes > 0 || r.damaged_headers > 0 {
        tracing::error!(
            outbox = name,
            dir = %dir,
            recovered = r.recovered,
            unreadable = r.unreadable,
            damaged_bytes = r.damaged_bytes,
            damaged_headers = r.damaged_headers,
            reason = crate::LostReason::JournalUnreadable.as_str(),
            "journal recovery found damaged records; their items are counted lost"
        );
    } else if r.segments > 0 {
        tracing::info!(
            outbox = name,
            dir = %dir,
            recovered = r.recovered,
            done = r.done,
            torn_bytes = r.torn_bytes,
            segments = r.segments,
            "journal recovered"
        );
    }
    Ok((opened.journal, opened.committer))
}

/// The outbox: stage items from the request path; one writer task writes
/// them per tenant, in order, through the [`Sink`].
///
/// Cheap to clone (`Send + Sync`); every clone is the same outbox. When the
/// last clone is dropped without a [`shutdown`](Self::shutdown), the writer
/// shuts down by itself with the builder's
/// [`drop_timeout`](OutboxBuilder::drop_timeout) (default 30 s), then
/// exits (S-W16). Dropping the runtime drops the writer: items still
/// pending then cannot be written any more and are counted lost under
/// `abandoned` (S-A7, S-W14), waiting callers are answered, and later
/// stages are refused; shut down first to give them a chance.
///
/// Every method but the constructors may be called from any thread, in
/// the runtime or not; none blocks beyond a short lock, none panics.
pub struct Outbox<S: Sink> {
    handle: Arc<HandleRef<S>>,
}

/// Counts the handles: its drop is the last handle's (S-W16).
struct HandleRef<S: Sink> {
    shared: Arc<Shared<S>>,
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
    /// A builder for an outbox writing to `sink`.
    pub fn builder(sink: S) -> OutboxBuilder<S> {
        OutboxBuilder {
            sink,
            config: Config::default(),
            weigher: None,
            drop_timeout: DEFAULT_DROP_TIMEOUT,
            runtime: None,
            dead_letters: None,
            #[cfg(feature = "journal")]
            journal: None,
            #[cfg(feature = "table")]
            table: None,
        }
    }

    /// An outbox writing to `sink` with `config`, on the current runtime.
    ///
    /// # Errors
    /// See [`OutboxBuilder::build`].
    pub fn new(sink: S, config: Config) -> Result<Self, BuildError> {
        Self::builder(sink).config(config).build()
    }

    pub(super) fn shared(&self) -> &Shared<S> {
        &self.handle.shared
    }

    /// A durability barrier (feature `journal`; D1): answers `Ok` once
    /// every item staged before the call, and every done mark recorded
    /// before it, is on disk (written, then `fdatasync`). The call takes
    /// effect at once; the future only waits for the answer. Costs one
    /// group commit, shared with every other caller in the same round.
    ///
    /// # Errors
    /// [`SyncError::NoJournal`](crate::SyncError::NoJournal) without a
    /// journal; `Failed` when the commit failed; `Down` while the journal
    /// is failing or pending items staged during a fault are in memory
    /// only (S-J5); `Closed` once the journal stopped.
    #[cfg(feature = "journal")]
    pub fn sync(
        &self,
    ) -> impl std::future::Future<Output = Result<(), crate::SyncError>> + Send + 'static {
        let journal = self.shared().journal.clone();
        let synced = journal.as_ref().map(|j| j.sync());
        async move {
            match synced {
                Some(synced) => synced.await,
                None => Err(crate::SyncError::NoJournal),
            }
        }
    }

    /// A snapshot of how the outbox is doing (S-R6): the breaker, the run
    /// of failures, the last successful write, the oldest pending item's
    /// age, writes in flight, tenants held. Also refreshes the health
    /// gauges. Costs O(tenants) under the lock: for a health endpoint, not
    /// for every request.
    pub fn health(&self) -> crate::Health {
        let shared = self.shared();
        let now = shared.now();
        let dropped = shared
            .dead_letters_dropped
            .load(std::sync::atomic::Ordering::Relaxed);
        let health = shared.engine_input(|st| crate::Health::of(&st.engine, now, dropped));
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
    /// call are not waited for.
    ///
    /// Takes effect at the call; see [`Answer`] for what dropping the
    /// future does. A runtime that is gone answers at once with the
    /// deadline passed.
    pub fn flush(&self, timeout: Duration) -> Answer<Report> {
        self.wait(Waiter::Report, |st, now| {
            st.engine.flush(now, now + timeout)
        })
    }

    /// Waits until everything staged before this call is settled, or until
    /// the deadline, the call's time plus `timeout`, without sending lingering batches early and
    /// without closing anything (S-W10). [`Report::pending`] is how many of
    /// those items are still pending (0 when everything settled).
    ///
    /// Takes effect at the call; see [`Answer`] for cancellation.
    pub fn settle(&self, timeout: Duration) -> Answer<Report> {
        self.wait(Waiter::Report, |st, now| {
            st.engine.settle(now, now + timeout)
        })
    }

    /// Shuts the outbox down (S-W9, S-B6). The fence goes up during this
    /// call, before the returned future is first polled: every later
    /// [`stage`](Self::stage) is refused and counted lost under `shutdown`.
    /// Items staged before drain, with retries, until the deadline, the
    /// call's time plus `timeout`; then the writes in flight are cancelled and every unwritten item is counted
    /// lost under `deadline` and handed back in
    /// [`ShutdownReport::unwritten`]. After the answer nothing is pending
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
        self.wait(Waiter::Shutdown, |st, now| {
            // The hand-off closes with the engine's fence (S-W9, S-W19).
            if shared.take_in(st, true) {
                shared.wake();
            }
            st.engine.shutdown(now, now + timeout)
        })
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
        waiter: fn(oneshot::Sender<T>) -> SinkWaiter<S>,
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
                st.waiters.insert(id, waiter(tx));
            }
        });
        shared.wake();
        Answer::new(rx)
    }
}
