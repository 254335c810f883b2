//! The store interface over PostgreSQL: tokio-postgres and a deadpool
//! pool for every call, and a connection of its own for the listener.

mod dead;
mod epoch;
mod lease;
mod listen;
mod read;
mod write;

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Object, Pool, PoolError};

pub use epoch::PgEpochTx;
pub use listen::PgListener;

use super::names::TableNames;
use super::store::{
    Acquire, Acquired, DeadRow, Horizon, Installed, LeaseKey, LeaseRow, Member, SchemaInfo,
    SinkEpoch, Store,
};
use crate::core::lease::Holder;
use crate::core::relay::{
    Fence, Fenced, InFlight, Page, PageRequest, Recorded, Removal, Removed, StoreError,
    StoreErrorKind,
};
use crate::sinks::postgres::epochs::EpochSql;

/// Default [`PgStore::lock_timeout`]: 3 s, above
/// [`DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT`], so a takeover's first install
/// outlasts a paused sink transaction (S-E5).
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(3);
/// Default [`PgStore::idle_in_transaction_timeout`]: 2 s.
pub const DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(2);

/// The [`Store`] over PostgreSQL (S-T24). Cheap to clone.
#[derive(Clone)]
pub struct PgStore {
    pool: Pool,
    listen: tokio_postgres::Config,
    names: Arc<TableNames>,
    epochs: Arc<EpochSql>,
    lock_timeout: Duration,
    idle_timeout: Duration,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("table", &self.names.name())
            .field("lock_timeout", &self.lock_timeout)
            .field("idle_in_transaction_timeout", &self.idle_timeout)
            .finish_non_exhaustive()
    }
}

impl PgStore {
    /// A store for the outbox `names` through `pool`, whose listener
    /// connects with `listen` (a connection of its own, never through
    /// pgbouncer in transaction mode: docs/table.md).
    pub fn new(pool: Pool, listen: tokio_postgres::Config, names: TableNames) -> Self {
        PgStore {
            pool,
            listen,
            epochs: Arc::new(EpochSql::new(&names.sink_epoch)),
            names: Arc::new(names),
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT,
        }
    }

    /// How long an epoch install waits for sink transactions' shared locks
    /// (`lock_timeout`; default [`DEFAULT_LOCK_TIMEOUT`], at least 1 ms):
    /// keep it well under the lease ttl.
    pub fn lock_timeout(mut self, timeout: Duration) -> Self {
        self.lock_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// How long a sink transaction may sit idle before the server ends it
    /// (`idle_in_transaction_session_timeout`; default
    /// [`DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT`], at least 1 ms): a paused
    /// zombie delays a takeover by at most this (S-T23).
    pub fn idle_in_transaction_timeout(mut self, timeout: Duration) -> Self {
        self.idle_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// The names of the outbox's tables.
    pub fn names(&self) -> &TableNames {
        &self.names
    }

    /// The pool.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    async fn client(&self) -> Result<Object, StoreError> {
        self.pool.get().await.map_err(pool_error)
    }
}

/// A client error as a [`StoreError`]: no SQLSTATE means the connection
/// failed (the outcome is unknown).
pub(crate) fn error(e: tokio_postgres::Error) -> StoreError {
    let code = e.code().map(|c| c.code().to_owned());
    let kind = match code.as_deref() {
        None => StoreErrorKind::Unknown,
        Some("55P03") => StoreErrorKind::LockTimeout,
        Some(c) if c.starts_with("40") => StoreErrorKind::Conflict,
        Some(_) => StoreErrorKind::Refused,
    };
    StoreError::new(kind, code, crate::sinks::postgres::PostgresError(e))
}

fn pool_error(e: PoolError) -> StoreError {
    match e {
        PoolError::Backend(e) => error(e),
        other => StoreError::new(StoreErrorKind::Unavailable, None, other),
    }
}

/// A duration as whole microseconds for SQL (saturating).
pub(crate) fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// Microseconds from SQL as a duration (negative as zero).
pub(crate) fn from_micros(us: i64) -> Duration {
    Duration::from_micros(u64::try_from(us).unwrap_or(0))
}

/// `u64` epochs and xids travel as `bigint`.
pub(crate) fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

pub(crate) fn to_u64(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// The fence's first `(partition, epoch)`, for calls on one partition.
fn single(fence: &Fence) -> Result<(u32, u64), StoreError> {
    fence.epochs.first().copied().ok_or_else(|| {
        StoreError::new(
            StoreErrorKind::Refused,
            None,
            "a fenced call on one partition needs its epoch in the fence",
        )
    })
}

impl Store for PgStore {
    type Listener = PgListener;
    type EpochTx = PgEpochTx;

    async fn schema(&self) -> Result<SchemaInfo, StoreError> {
        let client = self.client().await?;
        super::schema::read_schema(&**client, &self.names).await
    }

    async fn horizon(&self) -> Result<Horizon, StoreError> {
        read::horizon(self).await
    }

    async fn read_page(&self, request: &PageRequest) -> Result<Page, StoreError> {
        read::read_page(self, request).await
    }

    async fn remove(&self, fence: &Fence, removal: &Removal) -> Result<Removed, StoreError> {
        write::remove(self, fence, removal).await
    }

    async fn record_attempts(
        &self,
        fence: &Fence,
        records: &[InFlight],
    ) -> Result<Recorded, StoreError> {
        write::record_attempts(self, fence, records).await
    }

    async fn record_crashes(
        &self,
        fence: &Fence,
        partition: u32,
    ) -> Result<Fenced<u64>, StoreError> {
        write::record_crashes(self, fence, partition).await
    }

    async fn notify(&self) -> Result<(), StoreError> {
        let client = self.client().await?;
        client
            .execute("SELECT pg_notify($1, '')", &[&self.names.channel_name()])
            .await
            .map_err(error)?;
        Ok(())
    }

    async fn listen(&self) -> Result<PgListener, StoreError> {
        PgListener::connect(&self.listen, &self.names).await
    }

    async fn acquire(&self, request: &Acquire) -> Result<Acquired, StoreError> {
        lease::acquire(self, request).await
    }

    async fn renew(&self, lease: &LeaseKey, ttl: Duration) -> Result<bool, StoreError> {
        lease::renew(self, lease, ttl).await
    }

    async fn release(&self, lease: &LeaseKey) -> Result<bool, StoreError> {
        lease::release(self, lease).await
    }

    async fn leases(&self) -> Result<Vec<LeaseRow>, StoreError> {
        lease::leases(self).await
    }

    async fn heartbeat(&self, instance: &str, ttl: Duration) -> Result<(), StoreError> {
        lease::heartbeat(self, instance, ttl).await
    }

    async fn leave(&self, instance: &str) -> Result<(), StoreError> {
        lease::leave(self, instance).await
    }

    async fn members(&self) -> Result<Vec<Member>, StoreError> {
        lease::members(self).await
    }

    async fn sink_epochs(&self) -> Result<Vec<SinkEpoch>, StoreError> {
        epoch::sink_epochs(self).await
    }

    async fn install_epoch(
        &self,
        partition: u32,
        epoch: u64,
        holder: &Holder,
    ) -> Result<Installed, StoreError> {
        epoch::install(self, partition, epoch, holder).await
    }

    async fn begin_epoch_tx(&self) -> Result<PgEpochTx, StoreError> {
        PgEpochTx::begin(self).await
    }

    async fn dead_letters(&self, limit: u32) -> Result<Vec<DeadRow>, StoreError> {
        dead::dead_letters(self, limit).await
    }

    async fn redrive(&self, ids: &[i64]) -> Result<u64, StoreError> {
        dead::redrive(self, ids).await
    }

    async fn purge_dead(&self, older_than: Duration) -> Result<u64, StoreError> {
        dead::purge(self, older_than).await
    }
}
