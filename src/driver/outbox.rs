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
    Config, ConfigError, Counters, DropReason, Engine, Report, ShutdownReport, Staged, Time,
    WaitId, Weigher,
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
        }
    }
}

impl std::error::Error for BuildError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BuildError::Config(e) => Some(e),
            #[cfg(feature = "journal")]
            BuildError::Journal(e) => Some(e),
            _ => None,
        }
    }
}

impl From<ConfigError> for BuildError {
    fn from(e: ConfigError) -> Self {
        BuildError::Config(e)
    }
}

/// Why [`Outbox::try_stage`] or [`Outbox::stage_wait`] did not stage an
/// item; each hands the item back, uncounted (S-R5).
///
/// Non-exhaustive: new causes may come (a match needs a `_` arm).
#[derive(Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StageError<I> {
    /// A capacity is full (`buffer_full`, `tenant_full`, or with a journal
    /// `journal_full`), as [`stage`](Outbox::stage) would have dropped it
    /// under this reason.
    Full {
        /// The capacity that is full.
        reason: crate::DropReason,
        /// The item, handed back.
        item: I,
    },
    /// A shutdown began (S-W9): nothing will be accepted any more.
    ShuttingDown(I),
    /// [`stage_wait`](Outbox::stage_wait)'s timeout passed with no room.
    TimedOut(I),
    /// The journal could not encode the item (S-J8).
    Unencodable(I),
}

impl<I> StageError<I> {
    /// The item handed back.
    pub fn into_item(self) -> I {
        match self {
            StageError::Full { item, .. }
            | StageError::ShuttingDown(item)
            | StageError::TimedOut(item)
            | StageError::Unencodable(item) => item,
        }
    }
}

impl<I> fmt::Display for StageError<I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StageError::Full { reason, .. } => write!(f, "outbox: no room ({})", reason.as_str()),
            StageError::ShuttingDown(_) => f.write_str("outbox: shutting down"),
            StageError::TimedOut(_) => f.write_str("outbox: no room before the timeout"),
            StageError::Unencodable(_) => f.write_str("outbox: the journal cannot encode the item"),
        }
    }
}

impl<I: fmt::Debug> std::error::Error for StageError<I> {}

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
}

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
    for (tenant, item) in items {
        let _ = engine.recover(Time::ZERO, tenant, item);
    }
    engine.recover_unreadable(r.unreadable);
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

    /// Stages `item` for `tenant` (S-W1): never waits, never fails, never
    /// panics. Costs a channel send, plus an atomic reservation when a
    /// capacity is set, whatever the number of tenants: the engine takes
    /// the item in later, before any write, flush, settle, shutdown or
    /// counter read (S-W19); with a `tenant_capacity` the engine decides
    /// under its lock instead. The item is accepted on return, or, as the
    /// result says,
    /// dropped by a capacity limit (S-A1, S-B5, S-B7: `buffer_full`,
    /// `tenant_full`) or refused after a shutdown began (S-W9: lost under
    /// `shutdown`). With a journal, also dropped when the item cannot be
    /// encoded (S-J8: `encode_failed`) or the journal is full (S-J4:
    /// `journal_full`); the disk is never waited for (S-J1). Every outcome
    /// is counted; the caller need not look.
    pub fn stage(&self, tenant: S::Tenant, item: S::Item) -> Staged {
        let shared = self.shared();
        if shared.locked_stage {
            #[cfg(feature = "journal")]
            if let Some(journal) = &shared.journal {
                return self.stage_journaled_locked(journal, tenant, item);
            }
            let weight = shared.weigh(&item);
            return self.stage_locked(tenant, item, weight);
        }
        #[cfg(feature = "journal")]
        if let Some(journal) = &shared.journal {
            return self.stage_journaled(journal, tenant, item);
        }
        // S-W19: admission by reservation, then a hand-off to the engine's
        // intake; no lock, no tenant lookup.
        let weight = shared.weigh(&item);
        if let Err(reason) = shared.admission.reserve(weight) {
            return self.refuse(tenant, item, reason);
        }
        match shared.hand_off_item(tenant, item, weight, shared.stamp()) {
            Ok(()) => Staged::Accepted,
            Err((tenant, item)) => self.stage_after_fence(tenant, item, weight),
        }
    }

    /// A stage refused on the request path for `reason`. Counted at once,
    /// under the lock, in O(1) (no tenant lookup), its event coalescing
    /// with a queued one (S-B8): a producer outrunning a stalled writer
    /// queues nothing. The fence comes before a capacity (S-W9), a
    /// journal's refusal before the fence (S-J4, S-J8), as the engine
    /// decides them. The item is dropped after the lock (S-W13).
    fn refuse(&self, tenant: S::Tenant, item: S::Item, reason: DropReason) -> Staged {
        let shared = self.shared();
        let (staged, item) = shared.engine_input(|st| {
            if reason == DropReason::BufferFull && st.engine.is_shutting_down() {
                let now = st.engine.now();
                (st.engine.stage_lazy(|| now, tenant, item).staged, None)
            } else {
                let now = st.engine.now();
                (st.engine.refuse(now, tenant, reason), Some(item))
            }
        });
        if let Some(item) = item {
            contain::drop_quietly(item);
        }
        // Its event is drained by the writer.
        shared.wake();
        staged
    }

    /// A stage decided under the lock, by the engine itself: with a
    /// `tenant_capacity` (S-B7), or past the fence. The item was weighed
    /// (`weight`) before the lock; the clock is read under it, and only if
    /// the engine needs it; the writer is woken only if the engine says it
    /// has new work.
    fn stage_locked(&self, tenant: S::Tenant, item: S::Item, weight: u64) -> Staged {
        let shared = self.shared();
        let stage = shared.engine_input(|st| {
            st.engine
                .stage_lazy_weighed(|| shared.now(), tenant, item, weight)
        });
        if stage.wake {
            shared.wake();
        }
        stage.staged
    }

    /// A hand-off that found the fence up (S-W9): the engine, whose fence
    /// went up with the close, under the lock, refuses the item; its
    /// reservation is given back.
    fn stage_after_fence(&self, tenant: S::Tenant, item: S::Item, weight: u64) -> Staged {
        let staged = self.stage_locked(tenant, item, weight);
        // The input re-counted whatever the engine kept pending.
        self.shared().admission.release(1, weight);
        staged
    }

    /// [`stage`](Self::stage) with a journal (S-W19, S-J1): the item is
    /// encoded here, outside any lock; under the journal's own lock (not
    /// the engine's) the journal's room is checked, the item handed off
    /// and its record appended, so the journal gets each tenant's records
    /// in the order the engine gets its items (D2). The disk is written by
    /// the journal's own task.
    #[cfg(feature = "journal")]
    fn stage_journaled(
        &self,
        journal: &super::journal::Journal<S::Tenant, S::Item>,
        tenant: S::Tenant,
        item: S::Item,
    ) -> Staged {
        let Ok(record) = journal.encode(&tenant, &item) else {
            return self.refuse(tenant, item, DropReason::EncodeFailed);
        };
        let handed = self.hand_off_journaled(journal, &record, tenant, item);
        super::journal::Journal::<S::Tenant, S::Item>::recycle(record);
        match handed {
            Ok(()) => Staged::Accepted,
            Err(Held::Full(reason, tenant, item)) => self.refuse(tenant, item, reason),
            Err(Held::Fenced(tenant, item, weight)) => self.stage_after_fence(tenant, item, weight),
        }
    }

    /// The journal's part of a stage: its room (S-J4), the reservation
    /// (S-A1, S-B5), the hand-off and the append, under the journal's lock
    /// (see [`stage_journaled`](Self::stage_journaled)).
    #[cfg(feature = "journal")]
    fn hand_off_journaled(
        &self,
        journal: &super::journal::Journal<S::Tenant, S::Item>,
        record: &crate::journal::format::EncodedItem,
        tenant: S::Tenant,
        item: S::Item,
    ) -> Result<(), Held<S::Tenant, S::Item>> {
        let shared = self.shared();
        // Application code and the clock, before the journal's lock.
        let weight = shared.weigh(&item);
        let at = shared.stamp();
        let Ok(admitted) = journal.admit(record) else {
            return Err(Held::Full(DropReason::JournalFull, tenant, item));
        };
        if let Err(reason) = shared.admission.reserve(weight) {
            return Err(Held::Full(reason, tenant, item));
        }
        let key = tenant.clone();
        match shared.hand_off_item(tenant, item, weight, at) {
            Ok(()) => {
                admitted.append(key, record);
                Ok(())
            }
            // Not appended: the engine refuses it (S-W9).
            Err((tenant, item)) => Err(Held::Fenced(tenant, item, weight)),
        }
    }

    /// [`stage`](Self::stage) with a journal and a `tenant_capacity`: the
    /// engine decides under its lock, then the record is appended to the
    /// journal's buffer under the journal's lock, taken inside the
    /// engine's.
    #[cfg(feature = "journal")]
    fn stage_journaled_locked(
        &self,
        journal: &super::journal::Journal<S::Tenant, S::Item>,
        tenant: S::Tenant,
        item: S::Item,
    ) -> Staged {
        let shared = self.shared();
        let (staged, drain, refused) = match journal.encode(&tenant, &item) {
            Err(_) => {
                let now = shared.now();
                let staged = shared
                    .engine_input(|st| st.engine.refuse(now, tenant, DropReason::EncodeFailed));
                (staged, true, Some(item))
            }
            Ok(record) => {
                // Application code before the locks.
                let weight = shared.weigh(&item);
                let staged = shared.engine_input(|st| {
                    let Ok(admitted) = journal.admit(&record) else {
                        let now = shared.now();
                        let staged = st.engine.refuse(now, tenant, DropReason::JournalFull);
                        return (staged, true, Some(item));
                    };
                    let key = tenant.clone();
                    let stage = st
                        .engine
                        .stage_lazy_weighed(|| shared.now(), tenant, item, weight);
                    if stage.staged == Staged::Accepted {
                        admitted.append(key, &record);
                    }
                    (stage.staged, stage.wake, None)
                });
                super::journal::Journal::<S::Tenant, S::Item>::recycle(record);
                staged
            }
        };
        // An item's `Drop` is application code: after the lock (S-W13).
        if let Some(item) = refused {
            contain::drop_quietly(item);
        }
        if drain {
            shared.wake();
        }
        staged
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

    /// Stages `item` if there is room, else hands it back (S-R5): like
    /// [`stage`](Self::stage), never waits, but a refusal (a full
    /// capacity, a shutdown under way, with a journal an item it cannot
    /// encode or a full journal) is not counted anywhere: the caller still
    /// holds the item and decides.
    ///
    /// # Errors
    /// [`StageError::Full`], [`StageError::ShuttingDown`],
    /// [`StageError::Unencodable`], each with the item.
    pub fn try_stage(&self, tenant: S::Tenant, item: S::Item) -> Result<(), StageError<S::Item>> {
        let shared = self.shared();
        if !shared.locked_stage {
            return self.try_hand_off(tenant, item);
        }
        let now = shared.now();
        // The weigher is application code: it runs here, before the
        // engine's lock, as for `stage` (S-B5).
        let weight = shared.weigh(&item);
        #[cfg(feature = "journal")]
        if let Some(journal) = &shared.journal {
            let Ok(record) = journal.encode(&tenant, &item) else {
                return Err(StageError::Unencodable(item));
            };
            let wake = shared.engine_input(|st| {
                let Ok(admitted) = journal.admit(&record) else {
                    return Err(StageError::Full {
                        reason: crate::DropReason::JournalFull,
                        item,
                    });
                };
                let key = tenant.clone();
                let wake = st
                    .engine
                    .try_stage_weighed(now, tenant, item, weight)
                    .map_err(refusal)?;
                admitted.append(key, &record);
                Ok(wake)
            });
            super::journal::Journal::<S::Tenant, S::Item>::recycle(record);
            if wake? {
                shared.wake();
            }
            return Ok(());
        }
        let wake = shared.engine_input(|st| {
            st.engine
                .try_stage_weighed(now, tenant, item, weight)
                .map_err(refusal)
        })?;
        if wake {
            shared.wake();
        }
        Ok(())
    }

    /// [`try_stage`](Self::try_stage) on the request path (S-W19): as
    /// [`stage`](Self::stage), but a refusal is handed back uncounted.
    fn try_hand_off(&self, tenant: S::Tenant, item: S::Item) -> Result<(), StageError<S::Item>> {
        let shared = self.shared();
        // The fence first (S-W9): a full buffer must not hide it from a
        // waiting stage.
        if shared.is_fenced() {
            return Err(StageError::ShuttingDown(item));
        }
        #[cfg(feature = "journal")]
        if let Some(journal) = &shared.journal {
            let Ok(record) = journal.encode(&tenant, &item) else {
                return Err(StageError::Unencodable(item));
            };
            let handed = self.hand_off_journaled(journal, &record, tenant, item);
            super::journal::Journal::<S::Tenant, S::Item>::recycle(record);
            return handed.map_err(|held| self.hand_back(held));
        }
        let weight = shared.weigh(&item);
        if let Err(reason) = shared.admission.reserve(weight) {
            return Err(StageError::Full { reason, item });
        }
        shared
            .hand_off_item(tenant, item, weight, shared.stamp())
            .map_err(|(tenant, item)| self.hand_back(Held::Fenced(tenant, item, weight)))
    }

    /// The [`StageError`] of a stage held back on the request path, its
    /// reservation given back.
    fn hand_back(&self, held: Held<S::Tenant, S::Item>) -> StageError<S::Item> {
        match held {
            Held::Full(reason, _, item) => StageError::Full { reason, item },
            Held::Fenced(_, item, weight) => {
                self.shared().admission.release(1, weight);
                StageError::ShuttingDown(item)
            }
        }
    }

    /// Stages `item`, waiting up to `timeout` for room when a capacity is
    /// full (S-R5): for batch jobs that would rather wait than drop. Not
    /// for request paths, where [`stage`](Self::stage) never waits. Waits
    /// are woken when items settle; the item is tried again each time,
    /// with no place kept in a queue (a waiter may be overtaken).
    ///
    /// # Errors
    /// [`StageError::TimedOut`] when the timeout passes with no room;
    /// [`StageError::ShuttingDown`] at once when a shutdown begins, also
    /// while waiting; [`StageError::Unencodable`] with a journal that cannot
    /// encode it. Each hands the item back, uncounted.
    ///
    /// # Cancellation
    /// Cancel safe: dropping the future before it completes drops the
    /// item, which was never staged and is counted nowhere; an item
    /// accepted is accepted before the future completes, in the same poll,
    /// so a completed stage is never undone by a drop.
    pub async fn stage_wait(
        &self,
        tenant: S::Tenant,
        mut item: S::Item,
        timeout: Duration,
    ) -> Result<(), StageError<S::Item>> {
        let shared = self.shared();
        let deadline = super::deadline(tokio::time::Instant::now(), timeout);
        loop {
            // Registered before the try, so a wake between the two is not
            // missed.
            let notified = shared.capacity.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match self.try_stage(tenant.clone(), item) {
                Err(StageError::Full { item: back, .. }) => item = back,
                other => return other,
            }
            tokio::select! {
                biased;
                () = &mut notified => {}
                () = tokio::time::sleep_until(deadline) => {
                    return Err(StageError::TimedOut(item));
                }
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
    /// nothing: each item is handed back once.
    pub fn abandon(&self) -> Vec<(S::Tenant, Vec<S::Item>)> {
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

/// A stage the request path could not hand off.
enum Held<K, I> {
    /// A capacity (or the journal) is full, for this reason; nothing is
    /// reserved.
    #[cfg_attr(not(feature = "journal"), allow(dead_code))]
    Full(DropReason, K, I),
    /// The fence is up (S-W9); its reservation of this weight is still
    /// held.
    Fenced(K, I, u64),
}

/// The [`StageError`] of an engine's refusal.
fn refusal<I>((staged, item): (Staged, I)) -> StageError<I> {
    match staged {
        Staged::Dropped(reason) => StageError::Full { reason, item },
        _ => StageError::ShuttingDown(item),
    }
}
