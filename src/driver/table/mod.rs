//! The outbox table's driver side (feature `table`, S-T30..S-T36): the
//! lease task ([`lease`]) and the relay task ([`relay`]), spawned by
//! [`OutboxBuilder::table`](crate::OutboxBuilder::table), and the
//! bookkeeping that ties the engine's outcomes back to rows ([`feed`]).

pub(crate) mod feed;
pub(crate) mod gate;
pub(crate) mod health;
pub(crate) mod lease;
pub(crate) mod metrics;
pub(crate) mod relay;

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use crate::codec::{Codec, Postcard};
use crate::core::lease::{LeaseConfig, LeaseConfigBuilder, LeasePolicy};
use crate::core::relay::{Relay, RelayConfig};
use crate::core::Config;
use crate::driver::shared::Shared;
use crate::driver::BuildError;
use crate::sink::Sink;
use crate::table::{check, Relayed, Store};

use feed::{Feed, Phase};
use lease::{LeaseTask, Owned};
use relay::RelayTask;

/// How an outbox built with an outbox table relays it (S-T30): the
/// instance's name in the lease table, the codec its rows were staged
/// with, the wake-up, and the relay's and the lease policy's settings.
///
/// ```
/// use outbox::table::TableRelay;
/// use std::time::Duration;
/// let relay: TableRelay<u64, String> = TableRelay::new("billing-1")
///     .poll_interval(Duration::from_millis(200));
/// ```
pub struct TableRelay<K, I> {
    pub(crate) codec: Arc<dyn Codec<K, I>>,
    pub(crate) relay: RelayConfig,
    pub(crate) lease: Arc<dyn Fn(LeaseConfigBuilder) -> LeaseConfigBuilder + Send + Sync>,
    pub(crate) listen: bool,
    pub(crate) lease_clock: Option<gate::LeaseClock>,
}

impl<K, I> fmt::Debug for TableRelay<K, I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TableRelay")
            .field("relay", &self.relay)
            .field("listen", &self.listen)
            .finish_non_exhaustive()
    }
}

impl<K, I> TableRelay<K, I>
where
    K: serde::Serialize + serde::de::DeserializeOwned,
    I: serde::Serialize + serde::de::DeserializeOwned,
    Postcard: Codec<K, I>,
{
    /// The defaults for the instance `instance` (its name in the lease and
    /// heartbeat tables; unique per live process, stable across its
    /// restarts, S-L3), with the default codec: rows staged by an
    /// [`OutboxTable`](crate::table::OutboxTable) with its default codec.
    pub fn new(instance: impl Into<String>) -> Self {
        TableRelay::with_codec(instance, Postcard)
    }
}

impl<K, I> TableRelay<K, I> {
    /// Like [`new`](Self::new), decoding rows with `codec` (the one the
    /// rows were staged with). The versions it decodes default to the
    /// codec's own, [`Codec::version`] (S-T19); [`versions`](Self::versions)
    /// sets others.
    pub fn with_codec(instance: impl Into<String>, codec: impl Codec<K, I>) -> Self {
        let mut relay = RelayConfig::new(instance);
        relay.known_versions = BTreeSet::from([codec.version()]);
        TableRelay {
            codec: Arc::new(codec),
            relay,
            lease: Arc::new(|b| b),
            listen: true,
            lease_clock: None,
        }
    }

    /// How long the relay waits for a wake-up before it reads anyway
    /// (default 1 s; not zero, checked at build).
    pub fn poll_interval(mut self, every: Duration) -> Self {
        self.relay.poll_interval = every;
        self
    }

    /// Whether the relay listens for the stagers' notifications on a
    /// connection of its own (default `true`; S-T15); `false`: polling
    /// only, every `poll_interval`.
    pub fn listen(mut self, listen: bool) -> Self {
        self.listen = listen;
        self
    }

    /// Rows per page read, at most (default 1,000; at least 64 per ready
    /// partition): see [`RelayConfig::page_rows`](crate::core::relay::RelayConfig::page_rows).
    pub fn page_rows(mut self, rows: u32) -> Self {
        self.relay.page_rows = rows;
        self
    }

    /// Crashed attempts after which a row is dead-lettered as `poisoned`
    /// (default 3; 0 is taken as 1, as the journal's, S-T18).
    pub fn max_crash_attempts(mut self, attempts: u32) -> Self {
        self.relay.max_crash_attempts = attempts.max(1);
        self
    }

    /// The codec versions this relay decodes, and those declared retired
    /// (S-T19; defaults: the codec's own version, and none).
    pub fn versions(
        mut self,
        known: impl IntoIterator<Item = u32>,
        retired: impl IntoIterator<Item = u32>,
    ) -> Self {
        self.relay.known_versions = known.into_iter().collect();
        self.relay.retired_versions = retired.into_iter().collect();
        self
    }

    /// Adjusts the lease policy's settings (ttl, renewal, heartbeat, ...;
    /// S-L25); P comes from the table, and the instance id from
    /// [`new`](Self::new).
    pub fn lease(
        mut self,
        f: impl Fn(LeaseConfigBuilder) -> LeaseConfigBuilder + Send + Sync + 'static,
    ) -> Self {
        self.lease = Arc::new(f);
        self
    }

    /// The planted reader that skips late-committing rows (S-T6): for the
    /// crate's tests, which must see it fail.
    #[cfg(feature = "testkit")]
    pub fn planted_id_above_last_seen(mut self) -> Self {
        self.relay.order = crate::core::relay::ReadOrder::IdAboveLastSeen;
        self
    }

    /// The lease policy's clock as a function of the time elapsed on the
    /// runtime's clock (non-decreasing): for the simulation, which skews
    /// each host's lease clock against the store's within
    /// `max_clock_drift` (S-L7).
    #[cfg(feature = "testkit")]
    pub fn lease_clock(
        mut self,
        clock: impl Fn(Duration) -> Duration + Send + Sync + 'static,
    ) -> Self {
        self.lease_clock = Some(Arc::new(clock));
        self
    }

    /// The relay's configuration with the outbox's capacities as its
    /// read-ahead (S-T8, S-T9): never more rows held than `capacity`, nor
    /// more of one tenant than `tenant_capacity`.
    pub(crate) fn relay_config(&self, config: &Config) -> RelayConfig {
        let mut relay = self.relay.clone();
        if let Some(capacity) = config.capacity() {
            let rows = u32::try_from(capacity).unwrap_or(u32::MAX).max(1);
            let rows = rows.min(relay.read_ahead);
            relay = relay.read_ahead(rows);
        }
        if let Some(tenant) = config.tenant_capacity() {
            let rows = u32::try_from(tenant).unwrap_or(u32::MAX).max(1);
            relay.tenant_share = rows.min(relay.read_ahead);
        }
        relay
    }
}

/// The relay side of an outbox: what the builder spawns, after the
/// engine is built.
pub(crate) type Spawn<S> = Box<dyn FnOnce(&Arc<Shared<S>>) + Send>;

/// The spawner and the feed the writer reports to.
pub(crate) type Relaying<S> = (Spawn<S>, Arc<Feed<<S as Sink>::Tenant>>);

/// The spawner of the lease and relay tasks of `store` for an outbox
/// over `S`, and the feed the writer reports the engine's events to.
pub(crate) fn spawner<S, St, I>(
    store: St,
    options: TableRelay<S::Tenant, I>,
    config: &Config,
) -> Result<Relaying<S>, BuildError>
where
    S: Sink<Item = Relayed<I>>,
    St: Store,
    I: Send + 'static,
{
    let relay = Relay::new(options.relay_config(config)).map_err(BuildError::Relay)?;
    check_lease(&options)?;
    let (ends_tx, ends) = mpsc::unbounded_channel();
    let (notes_tx, notes) = mpsc::unbounded_channel();
    let (phase_tx, phase) = watch::channel(Phase::Open);
    let gate = Arc::new(gate::Gate::new(options.lease_clock.clone()));
    let noted = health::TableWatch::new(options.listen);
    let feed = Arc::new(Feed::new(
        ends_tx,
        notes_tx,
        phase_tx,
        Arc::clone(&gate),
        noted,
    ));
    let feed_out = Arc::clone(&feed);
    let spawn = move |shared: &Arc<Shared<S>>| {
        let store = Arc::new(store);
        let (owned_tx, owned) = watch::channel(Owned::new());
        let (stale, stale_rx) = mpsc::unbounded_channel();
        let (stop_leases, stop_rx) = watch::channel(false);
        let instance = options.relay.owner.clone();
        let lease = Arc::clone(&options.lease);
        let name = shared.sink.name().to_owned();
        let noted = Arc::clone(&feed);
        let every = options.relay.poll_interval;
        let leases = {
            let store = Arc::clone(&store);
            async move {
                // S-W16, S-T33: a relay that stops before the table's
                // schema was ever read (the store unreachable, the table
                // missing) stops the wait for it too, so the outbox closes.
                let mut stop = stop_rx.clone();
                let config = tokio::select! {
                    biased;
                    _ = stop.wait_for(|stopped| *stopped) => return,
                    config = lease_config(&*store, &instance, &*lease, &name, &noted.watch, every) => config,
                };
                let Some(config) = config else {
                    return;
                };
                let policy = LeasePolicy::new(config, gate.now());
                LeaseTask::new(store, gate, policy, owned_tx, stale_rx, stop_rx)
                    .run()
                    .await;
            }
        };
        let task = RelayTask {
            metrics: metrics::RelayMetrics::register(shared.sink.name()),
            shared: Arc::clone(shared),
            store,
            codec: options.codec,
            relay,
            feed,
            owned,
            ends,
            notes,
            stale,
            _stop_leases: stop_leases,
            phase,
            listen: options.listen,
        };
        drop(shared.tasks.spawn_on(leases, shared.runtime()));
        drop(shared.tasks.spawn_on(task.run(), shared.runtime()));
    };
    Ok((Box::new(spawn), feed_out))
}

/// The lease settings, checked at build (S-L6, S-L22, S-L25): every rule
/// but P's bound, which waits for the table's schema (the smallest P, 1,
/// stands in for it here).
fn check_lease<K, I>(options: &TableRelay<K, I>) -> Result<(), BuildError> {
    let builder = LeaseConfig::builder(options.relay.owner.clone()).partitions(1);
    match (options.lease)(builder).partitions(1).build() {
        Ok(_) => Ok(()),
        Err(e) => Err(BuildError::Lease(e)),
    }
}

/// Reads the table's schema until this crate accepts it (noted for
/// `health()`, S-T36) and builds the lease policy's configuration with its
/// P. A schema refused (S-T3) is read again every `every` (the relay's
/// `poll_interval`): once the migrations ran, the relay starts without a
/// restart. `None`, logged, for settings the lease policy refuses.
async fn lease_config<St: Store>(
    store: &St,
    instance: &str,
    lease: &(dyn Fn(LeaseConfigBuilder) -> LeaseConfigBuilder + Send + Sync),
    name: &str,
    noted: &health::TableWatch,
    every: Duration,
) -> Option<LeaseConfig> {
    let mut logged = false;
    let schema = loop {
        let schema = read_schema(store, name, noted).await;
        let Err(e) = check(&schema) else {
            break schema;
        };
        noted.schema(health::SchemaState::Refused {
            version: schema.version,
            min_reader: schema.min_reader,
        });
        if !logged {
            tracing::error!(outbox = %name, error = %e, "outbox table: the relay refuses this schema; it reads it again every poll_interval and starts once it accepts it");
            logged = true;
        }
        tokio::time::sleep(every).await;
    };
    noted.schema(health::SchemaState::Accepted {
        version: schema.version,
    });
    let builder = LeaseConfig::builder(instance).partitions(schema.partitions);
    match lease(builder).build() {
        Ok(config) => Some(config),
        Err(e) => {
            tracing::error!(outbox = %name, error = %e, "outbox table: the lease settings are refused; the relay does not start");
            None
        }
    }
}

/// Reads the table's schema, again while the store is unreachable or the
/// table missing (backing off up to 5 s), noting why for `health()`.
async fn read_schema<St: Store>(
    store: &St,
    name: &str,
    noted: &health::TableWatch,
) -> crate::table::SchemaInfo {
    let mut wait = Duration::from_millis(100);
    loop {
        match store.schema().await {
            Ok(schema) => return schema,
            Err(e) => {
                // 42P01: undefined table.
                let missing = e.sqlstate() == Some("42P01");
                noted.schema(if missing {
                    health::SchemaState::Missing
                } else {
                    health::SchemaState::Unreadable
                });
                tracing::warn!(outbox = %name, error = %e, "outbox table: cannot read the schema; trying again");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(5));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::TableRelay;
    use crate::codec::{Postcard, Versioned};
    use crate::table::OutboxTable;

    /// S-T3, S-T19: a versioned codec's version is the one rows are
    /// stamped with and the one a relay on that codec decodes; the
    /// handle's and the relay's own settings still override it.
    #[test]
    fn a_versioned_codec_gives_its_version_to_the_rows_and_the_relay() {
        let codec = || Versioned::new(Postcard, 2);
        let table: OutboxTable<u64, u64, _> =
            OutboxTable::with_codec("versioned", codec()).expect("a valid name");
        assert_eq!(table.version(), 2);
        assert_eq!(table.codec_version(7).version(), 7);
        let plain: OutboxTable<u64, u64> = OutboxTable::new("plain").expect("a valid name");
        assert_eq!(plain.version(), 0);
        let relay: TableRelay<u64, u64> = TableRelay::with_codec("i1", codec());
        assert_eq!(relay.relay.known_versions, [2].into());
        let relay = relay.versions([1, 2], [0]);
        assert_eq!(relay.relay.known_versions, [1, 2].into());
        let plain: TableRelay<u64, u64> = TableRelay::new("i1");
        assert_eq!(plain.relay.known_versions, [0].into());
    }
}
