//! Building an [`Outbox`]: its builder and why a build fails (S-A1,
//! S-W16, S-R4, S-F1). The journal's builder calls live with the journal
//! adapter (`journal::build`), the outbox table's with the relay.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;

use super::contain;
use super::shared::{Shared, SharedWeigher};
use super::writer::Writer;
use crate::core::{Config, ConfigError, Engine, Weigher};
use crate::sink::Sink;
use crate::telemetry;
use crate::Outbox;

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
    /// The outbox table's lease settings are refused (S-L6, S-L22,
    /// S-L25; the bound on P is checked when the relay reads the table's
    /// schema).
    #[cfg(feature = "table")]
    Lease(crate::core::lease::LeaseConfigError),
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
            #[cfg(feature = "table")]
            BuildError::Lease(e) => write!(f, "outbox table: the lease settings are refused: {e}"),
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
            #[cfg(feature = "table")]
            BuildError::Lease(e) => Some(e),
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
    /// The journal to open at build, if any (D1-D6).
    pub(super) journal: Option<super::journal::Setup<S::Tenant, S::Item>>,
    /// The outbox table's relay, made at build (S-T30).
    #[cfg(feature = "table")]
    table: Option<TableSetup<S>>,
}

/// Makes the outbox table's relay for the engine's configuration.
#[cfg(feature = "table")]
type TableSetup<S> =
    Box<dyn FnOnce(&Config) -> Result<super::table::Relaying<S>, BuildError> + Send>;

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
    /// sink, refused under a stale epoch without an outbox table, retries
    /// exhausted, dropped on a sink error, expired) to
    /// `dead_letters`, a callback or a bounded channel, with their tenant
    /// and reason, instead of dropping them (S-R4). Turns on
    /// [`ConfigBuilder::dead_letters`](crate::ConfigBuilder::dead_letters).
    /// Items given up by a shutdown deadline still come back in its
    /// [`ShutdownReport`](crate::ShutdownReport), and those of an abandon from
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
    pub fn build(mut self) -> Result<Outbox<S>, BuildError> {
        let runtime = self.writer_runtime()?;
        let (engine, weigher) = self.engine()?;
        let mut engine = engine;
        let opened = super::journal::open(self.journal, self.sink.name(), &mut engine)?;
        #[cfg(feature = "table")]
        let table = match self.table {
            Some(setup) => Some(setup(engine.config())?),
            None => None,
        };
        let sink = Arc::new(self.sink);
        let (export, log) = telemetry::register(sink.name());
        let mut shared = Shared::new(engine, weigher, export, sink, runtime);
        shared.dead_letters = self.dead_letters;
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
        super::journal::spawn(&shared, committer);
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
        Ok(Outbox::from_shared(shared))
    }

    /// The runtime the writer will run on, checked to have a timer.
    fn writer_runtime(&self) -> Result<Handle, BuildError> {
        let runtime = match &self.runtime {
            Some(rt) => rt.clone(),
            None => Handle::try_current().map_err(|_| BuildError::NoRuntime)?,
        };
        let has_timer = contain::call(|| {
            let _in = runtime.enter();
            drop(tokio::time::sleep(Duration::ZERO));
        });
        if has_timer.is_err() {
            return Err(BuildError::NoTimer);
        }
        Ok(runtime)
    }

    /// The engine of the builder's configuration, as the sink takes it
    /// (S-F1), and its weigher, contained, shared with the request path.
    #[allow(clippy::type_complexity)]
    fn engine(
        &mut self,
    ) -> Result<(Engine<S::Tenant, S::Item>, Option<SharedWeigher<S::Item>>), BuildError> {
        // S-F1: only a sink that takes groups is handed them; any other
        // writes one tenant's slice per call, as if the config said so.
        let mut config = if contain::call(|| self.sink.takes_groups()).unwrap_or(false) {
            self.config.clone()
        } else {
            self.config.clone().without_fan_in()
        };
        if self.dead_letters.is_some() {
            config.dead_letters = true;
        }
        // S-T32: an outbox table is the only way in.
        #[cfg(feature = "table")]
        if self.table.is_some() {
            config.table_only = true;
            config.outbox_table = true;
        }
        // One contained weigher, for the engine and the request path.
        let weigher = self.weigher.take().map(|weigher| {
            Arc::new(move |item: &S::Item| contain::call(|| weigher(item)).unwrap_or(0))
                as SharedWeigher<S::Item>
        });
        let engine = match &weigher {
            Some(weigher) => {
                let weigher = Arc::clone(weigher);
                Engine::with_weigher(config, move |item: &S::Item| weigher(item))?
            }
            None => Engine::new(config)?,
        };
        Ok((engine, weigher))
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
}
