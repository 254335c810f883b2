//! A PostgreSQL sink (feature `postgres`): one tenant's slice per
//! transaction, repeats absorbed by the key `(tenant, item_id)`.
//!
//! # Schema
//! [`PostgresSink::create_table`] creates (if missing) the table below, and
//! [`schema_sql`] returns the same statements to put in a migration
//! (shown for the default key, [`TenantId`]):
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS "outbox_items" (
//!     tenant     uuid        NOT NULL,
//!     item_id    uuid        NOT NULL,
//!     seq        bigint      GENERATED ALWAYS AS IDENTITY,
//!     payload    bytea       NOT NULL,
//!     written_at timestamptz NOT NULL DEFAULT now(),
//!     PRIMARY KEY (tenant, item_id)
//! );
//! CREATE INDEX IF NOT EXISTS "outbox_items_tenant_seq" ON "outbox_items" (tenant, seq);
//! ```
//!
//! - `tenant`, `item_id`: the idempotency key ([`Record::id`]); a repeat of
//!   a row already there is skipped by `ON CONFLICT (tenant, item_id) DO
//!   NOTHING`, so it keeps its first `seq` and `written_at`.
//! - `seq`: the order rows were first inserted in. Within a tenant it
//!   follows staging order (S-W3): a slice is inserted in slice order
//!   (`UNNEST … WITH ORDINALITY … ORDER BY`), and a tenant's next slice is
//!   only written after its previous one committed. Read a tenant's items
//!   in order with `ORDER BY seq`. Values have gaps (skipped repeats,
//!   rolled-back attempts) and are not comparable across tenants.
//! - `written_at`: the commit's transaction time (`now()`), UTC.
//!
//! # The tenant column
//! The sink's key `K` (`PostgresSink<R, K>`, [`TenantId`] by default)
//! chooses the type of the `tenant` column through [`PgTenant`]:
//!
//! | key | column | value |
//! | --- | --- | --- |
//! | [`TenantId`], [`Uuid`] | `uuid` | the UUID |
//! | `i64` | `bigint` | the number |
//! | `u64` | `bigint` | the number, if at most `i64::MAX`; above, the write is rejected terminally |
//! | `String`, `Arc<str>` | `text` | the text (a NUL character is refused by the server: SQLSTATE `22021`, terminal) |
//!
//! PostgreSQL has no unsigned 64-bit integer: a `u64` key above
//! `i64::MAX` (9,223,372,036,854,775,807) is never wrapped into a negative
//! number (two tenants could then share rows); the write fails as
//! terminal with an [`InvalidTenant`] cause before any I/O, and its items
//! are counted lost under `terminal`. If keys may be that large, use
//! `i64`, `String`, or a key type of your own implementing [`PgTenant`]
//! (e.g. `numeric`).
//!
//! The sink only ever inserts these three columns (`tenant`, `item_id`,
//! `payload`); an existing table with extra columns that have defaults
//! works as well.
//!
//! # Example
//! ```no_run
//! use std::time::Duration;
//! use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
//! use outbox::sinks::{postgres::PostgresSink, Envelope};
//! use outbox::{Sink, TenantId};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let config: tokio_postgres::Config = "postgres://postgres@127.0.0.1/test".parse()?;
//! let manager = Manager::from_config(
//!     config,
//!     tokio_postgres::NoTls,
//!     ManagerConfig { recycling_method: RecyclingMethod::Fast },
//! );
//! let pool = Pool::builder(manager)
//!     .runtime(Runtime::Tokio1)
//!     .wait_timeout(Some(Duration::from_secs(5)))
//!     .create_timeout(Some(Duration::from_secs(5)))
//!     .build()?;
//! // Tenants keyed by the service's own `i64` organisation ids: the
//! // `tenant` column is a `bigint`.
//! let sink = PostgresSink::<Envelope, i64>::new(pool.clone(), "usage_records")?;
//! sink.create_table().await?;
//! sink.write(&42, &[Envelope::new(b"{\"units\":3}".to_vec())]).await?;
//! // The default key, `TenantId`: a `uuid` column.
//! let by_uuid = PostgresSink::<Envelope>::new(pool, "usage_records_by_uuid")?;
//! by_uuid.create_table().await?;
//! by_uuid.write(&TenantId::new_v7(), &[Envelope::new(b"{}".to_vec())]).await?;
//! # Ok(())
//! # }
//! ```
//!
//! # A write
//! [`Sink::write`] takes a pooled connection and inserts the slice in
//! statements of at most [`max_rows_per_statement`] rows and about
//! [`max_bytes_per_statement`] bytes of payload (three parameters per
//! statement: the tenant, an array of ids, an array of payloads). A slice
//! that fits one statement (the usual case) is that one statement, atomic
//! on its own as an implicit transaction: one round trip, no `BEGIN` or
//! `COMMIT`. A larger slice takes several statements inside one explicit
//! transaction. Either way the slice is written all-or-nothing; an empty
//! slice touches no connection. If the future is dropped (a write timeout,
//! S-B3; the shutdown deadline, S-W9) the transaction is rolled back, or it
//! had already committed: either way a retry leaves one copy.
//!
//! Measured with `examples/usage_records.rs` (1,000,000 records over
//! 10,000 tenants, about 80 per write, 16 writes in flight, PostgreSQL 15 on
//! the same two cores): the server's CPU bounds the rate (about 9 to 10
//! CPU-seconds per million rows, mostly index maintenance of the two
//! B-trees, the `ON CONFLICT` check and WAL, against about 2.5 in the
//! client); dropping `BEGIN`/`COMMIT` for one-statement slices saved about
//! 6% of the server's CPU and 17% of the client's.
//!
//! A pool without timeouts waits for ever for a connection: configure
//! [`deadpool_postgres::Timeouts`] (`wait`, `create`) so an outage turns into
//! retryable errors instead of a hung write, and a `write_timeout` in the
//! outbox for a stalled server.
//!
//! # Fan-in
//! With [`max_slices_per_write`](crate::ConfigBuilder::max_slices_per_write)
//! above 1, [`Sink::write_group`] writes a group of several tenants'
//! slices with one multi-row statement (or several in one transaction,
//! past the per-statement limits) whose rows carry their tenant: one round
//! trip for many tenants (S-F1). Each slice still gets its own outcome
//! (S-F3): a slice that cannot be sent is rejected alone before any I/O,
//! and when the group's transaction fails terminally each slice is
//! written again alone, so bad data rejects only its own slice.
//!
//! # Epochs
//! Under partition leases (many instances relaying one outbox table) a
//! write carries its epoch ([`Sink::write_with_epoch`]). With
//! [`with_epochs`](PostgresSink::with_epochs) the sink keeps an epoch
//! table beside its own ([`epochs`]: one row per partition, the highest
//! epoch installed and its holder) and checks every such write (S-E1..S-E6):
//!
//! - A takeover calls [`install_epoch`](PostgresSink::install_epoch)
//!   before it writes anything of the partition (under `lock_timeout`);
//!   only an install updates the row.
//! - A write is one explicit transaction under `SET LOCAL
//!   idle_in_transaction_session_timeout`: the inserts, then, as the last
//!   statement before COMMIT, the check: `SELECT ... FOR SHARE` of its
//!   partitions' rows in partition order. Shared locks do not conflict, so
//!   writes never queue behind each other; an install waits for them.
//! - A write whose epoch is not the installed one commits nothing and
//!   fails with [`WriteError::stale_epoch`] (cause [`StaleEpoch`]); in a
//!   group only the stale partitions' slices fail, the others are written
//!   (S-F3). An outbox with an outbox table counts them handed over, never
//!   retried; one without counts them lost `stale_epoch` (S-E7).
//! - A zombie paused inside its transaction holds an install back at most
//!   the idle timeout (S-E5): keep both timeouts well under the lease ttl,
//!   and `lock_timeout` above the idle timeout so a takeover's first
//!   install succeeds.
//!
//! A checked write always takes `BEGIN` and `COMMIT` round trips (the
//! check must be the last statement of a transaction), one more than an
//! unchecked write of one statement. A write without an epoch is not
//! checked.
//!
//! # Errors
//! | cause | kind |
//! | --- | --- |
//! | SQLSTATE class `08` (connection exception), `40001` (serialization failure), `40P01` (deadlock), `40000`, `40003` | retryable |
//! | classes `53` (insufficient resources), `55` (object not in prerequisite state, lock not available), `57` (operator intervention: shutdown, query canceled), `58` (system error), `25` (e.g. read-only after a failover), `XX` | retryable |
//! | class `42` (undefined table, insufficient privilege: fixed by an operator, not by the data) and every other code not listed as terminal | retryable |
//! | class `22` (data exception), class `23` (integrity constraint violation: a `CHECK`, a foreign key, a unique key other than `(tenant, item_id)`), `40002`, class `54` (program limit exceeded), `P0001` (a trigger's `RAISE EXCEPTION`) | terminal |
//! | a client-side error without SQLSTATE: I/O, connection closed or refused, TLS, timeout | retryable |
//! | pool: wait/create/recycle timeout, a failed `post_create` hook | retryable |
//! | pool: closed, no runtime for its timeouts (configuration that never passes) | terminal |
//! | a payload over 1 GiB (the `bytea` limit), checked before any I/O | terminal |
//!
//! The conflict on `(tenant, item_id)` never surfaces: it is absorbed.
//! [`sqlstate_kind`] exposes the SQLSTATE table.
//!
//! [`max_rows_per_statement`]: PostgresSink::max_rows_per_statement
//! [`max_bytes_per_statement`]: PostgresSink::max_bytes_per_statement

mod checked;
pub mod epochs;

pub use checked::StaleEpoch;

use std::error::Error as StdError;
use std::fmt;
use std::marker::PhantomData;

use deadpool_postgres::{Pool, PoolError};

/// The pool crate this sink is built on, re-exported so the versions match.
pub use deadpool_postgres;
/// The client crate this sink is built on, re-exported so the versions match.
pub use tokio_postgres;
use uuid::Uuid;

use tokio_postgres::types::ToSql;

use crate::core::lease::Holder;
use crate::sink::{ErrorKind, Sink, Slice, WriteEpoch, WriteError, Written};
use crate::sinks::{InvalidTenant, Record};
use crate::tenant::{TenantId, TenantKey};
use epochs::{EpochSql, Installed, SinkEpoch};

/// A tenant key the PostgreSQL sink can write: the type of the `tenant`
/// column and the value bound for it (see [the tenant
/// column](self#the-tenant-column)). Implemented for [`TenantId`],
/// [`Uuid`], `i64`, `u64`, `String` and `Arc<str>`; implement it for a key
/// of your own.
pub trait PgTenant: TenantKey {
    /// The SQL type of the `tenant` column, e.g. `uuid`, `bigint`, `text`;
    /// spliced into the statements, so a fixed name only.
    const SQL_TYPE: &'static str;

    /// The value bound for the column.
    type Param<'a>: ToSql + Clone + Send + Sync
    where
        Self: 'a;

    /// The value of this key for the column.
    ///
    /// # Errors
    /// [`InvalidTenant`] for a key the column cannot hold (a `u64` above
    /// `i64::MAX`): the write is rejected terminally, before any I/O.
    fn param(&self) -> Result<Self::Param<'_>, InvalidTenant>;
}

impl PgTenant for TenantId {
    const SQL_TYPE: &'static str = "uuid";
    type Param<'a> = Uuid;
    fn param(&self) -> Result<Uuid, InvalidTenant> {
        Ok(self.0)
    }
}

impl PgTenant for Uuid {
    const SQL_TYPE: &'static str = "uuid";
    type Param<'a> = Uuid;
    fn param(&self) -> Result<Uuid, InvalidTenant> {
        Ok(*self)
    }
}

impl PgTenant for i64 {
    const SQL_TYPE: &'static str = "bigint";
    type Param<'a> = i64;
    fn param(&self) -> Result<i64, InvalidTenant> {
        Ok(*self)
    }
}

/// `bigint` is signed: a key above `i64::MAX` is refused, never wrapped.
impl PgTenant for u64 {
    const SQL_TYPE: &'static str = "bigint";
    type Param<'a> = i64;
    fn param(&self) -> Result<i64, InvalidTenant> {
        i64::try_from(*self).map_err(|_| {
            InvalidTenant::new(
                self,
                "a u64 key above i64::MAX does not fit a bigint column (PostgreSQL has no \
                 unsigned 64-bit type)",
            )
        })
    }
}

impl PgTenant for String {
    const SQL_TYPE: &'static str = "text";
    type Param<'a> = &'a str;
    fn param(&self) -> Result<&str, InvalidTenant> {
        Ok(self)
    }
}

impl PgTenant for std::sync::Arc<str> {
    const SQL_TYPE: &'static str = "text";
    type Param<'a> = &'a str;
    fn param(&self) -> Result<&str, InvalidTenant> {
        Ok(self)
    }
}

/// Default [`PostgresSink::max_rows_per_statement`]: 1,000 rows.
pub const DEFAULT_MAX_ROWS_PER_STATEMENT: usize = 1_000;

/// Default [`PostgresSink::max_bytes_per_statement`]: 8 MiB of payload.
pub const DEFAULT_MAX_BYTES_PER_STATEMENT: usize = 8 << 20;

/// The largest payload a `bytea` value holds: 1 GiB - 1 byte. A larger
/// payload is rejected as terminal before any I/O.
pub const MAX_PAYLOAD_BYTES: usize = (1 << 30) - 1;

/// The cap on [`PostgresSink::max_bytes_per_statement`]: 512 MiB, well
/// inside the protocol's 2 GiB per parameter.
const MAX_BYTES_PER_STATEMENT_CAP: usize = 512 << 20;

/// A PostgreSQL [`Sink`] for [`Record`]s of tenants keyed by `K` (see
/// [`PgTenant`]; [`TenantId`] by default): see the [module docs](self) for
/// the schema, the transaction and the error table.
pub struct PostgresSink<R, K = TenantId> {
    pool: Pool,
    name: String,
    table: QualifiedName,
    insert_sql: String,
    /// The group statement (S-F1): the tenant is a column of the arrays.
    group_sql: String,
    max_rows: usize,
    max_bytes: usize,
    /// The epoch table, when writes are checked by epoch (S-E1).
    epochs: Option<std::sync::Arc<EpochSql>>,
    lock_timeout: std::time::Duration,
    idle_timeout: std::time::Duration,
    _items: PhantomData<fn(R, K)>,
}

/// Default [`PostgresSink::lock_timeout`]: 3 s, above
/// [`DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT`], so a takeover's first install
/// outlasts a paused zombie (S-E5); both well under the default lease ttl
/// (10 s).
pub const DEFAULT_LOCK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);
/// Default [`PostgresSink::idle_in_transaction_timeout`]: 2 s.
pub const DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT: std::time::Duration =
    std::time::Duration::from_secs(2);

impl<R, K> fmt::Debug for PostgresSink<R, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresSink")
            .field("name", &self.name)
            .field("table", &self.table.quoted)
            .field("max_rows_per_statement", &self.max_rows)
            .field("max_bytes_per_statement", &self.max_bytes)
            .finish_non_exhaustive()
    }
}

impl<R: Record, K: PgTenant> PostgresSink<R, K> {
    /// A sink writing into `table` (`name` or `schema.name`, each part an
    /// unquoted SQL identifier: ASCII letters, digits, `_` and `$`, not
    /// starting with a digit, at most 63 bytes; it is quoted in every
    /// statement, so its case is kept) through `pool`. The sink's
    /// [name](Sink::name) is `postgres:` and the table.
    ///
    /// # Errors
    /// [`InvalidTableName`] for a name outside that grammar: the name is
    /// spliced into SQL, so nothing else is accepted.
    pub fn new(pool: Pool, table: &str) -> Result<Self, InvalidTableName> {
        let table = QualifiedName::parse(table)?;
        let insert_sql = format!(
            "INSERT INTO {t} (tenant, item_id, payload) \
             SELECT $1::{k}, u.item_id, u.payload \
             FROM UNNEST($2::uuid[], $3::bytea[]) WITH ORDINALITY AS u(item_id, payload, ord) \
             ORDER BY u.ord \
             ON CONFLICT (tenant, item_id) DO NOTHING",
            t = table.quoted,
            k = K::SQL_TYPE,
        );
        let group_sql = format!(
            "INSERT INTO {t} (tenant, item_id, payload) \
             SELECT u.tenant, u.item_id, u.payload \
             FROM UNNEST($1::{k}[], $2::uuid[], $3::bytea[]) \
             WITH ORDINALITY AS u(tenant, item_id, payload, ord) \
             ORDER BY u.ord \
             ON CONFLICT (tenant, item_id) DO NOTHING",
            t = table.quoted,
            k = K::SQL_TYPE,
        );
        Ok(PostgresSink {
            pool,
            name: format!("postgres:{}", table.plain),
            table,
            insert_sql,
            group_sql,
            max_rows: DEFAULT_MAX_ROWS_PER_STATEMENT,
            max_bytes: DEFAULT_MAX_BYTES_PER_STATEMENT,
            epochs: None,
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT,
            _items: PhantomData,
        })
    }

    /// Sets the sink's name (the `outbox` metric label, S-W11).
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// At most `rows` rows per `INSERT` statement (default
    /// [`DEFAULT_MAX_ROWS_PER_STATEMENT`]; 0 is treated as 1). A larger
    /// slice takes several statements in the same transaction.
    pub fn max_rows_per_statement(mut self, rows: usize) -> Self {
        self.max_rows = rows.max(1);
        self
    }

    /// About `bytes` bytes of payload per `INSERT` statement (default
    /// [`DEFAULT_MAX_BYTES_PER_STATEMENT`], at least 1, at most 512 MiB): a
    /// statement ends before the row that would pass it, and a row larger
    /// than the budget goes alone.
    pub fn max_bytes_per_statement(mut self, bytes: usize) -> Self {
        self.max_bytes = bytes.clamp(1, MAX_BYTES_PER_STATEMENT_CAP);
        self
    }

    /// Checks every write that carries an epoch ([`Sink::write_with_epoch`],
    /// [`Sink::write_group_with_epochs`]) against the epoch table
    /// `epoch_table` (same grammar as [`new`](Self::new)) in the same
    /// database (S-E1..S-E6): see [epochs](self#epochs). A write without an
    /// epoch (an outbox without leases) is not checked.
    ///
    /// # Errors
    /// [`InvalidTableName`] for a name outside the grammar.
    pub fn with_epochs(mut self, epoch_table: &str) -> Result<Self, InvalidTableName> {
        let t = QualifiedName::parse(epoch_table)?;
        self.epochs = Some(std::sync::Arc::new(EpochSql::new(&t.quoted)));
        Ok(self)
    }

    /// How long an epoch install waits for writes' shared locks (`SET
    /// LOCAL lock_timeout`; default [`DEFAULT_LOCK_TIMEOUT`], at least 1
    /// ms): keep it well under the lease ttl (S-E2, S-E5).
    pub fn lock_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.lock_timeout = timeout.max(std::time::Duration::from_millis(1));
        self
    }

    /// How long a write checked by epoch may sit idle inside its
    /// transaction before the server ends it (`SET LOCAL
    /// idle_in_transaction_session_timeout`; default
    /// [`DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT`], at least 1 ms): a paused
    /// zombie holds an install back at most this long (S-E5).
    pub fn idle_in_transaction_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.idle_timeout = timeout.max(std::time::Duration::from_millis(1));
        self
    }

    /// Installs `epoch` for `partition` for `holder` (a takeover, S-E2,
    /// S-E3): before the new owner writes anything of the partition. From
    /// its commit on, no write of an older epoch commits.
    ///
    /// # Errors
    /// Terminal if the sink has no epoch table ([`with_epochs`](Self::with_epochs));
    /// the pool's or the server's error otherwise, `55P03` (lock timeout)
    /// retryable.
    pub async fn install_epoch(
        &self,
        partition: u32,
        epoch: u64,
        holder: &Holder,
    ) -> Result<Installed, WriteError> {
        let epochs = self.epochs.as_ref().ok_or_else(no_epoch_table)?;
        let mut client = self.pool.get().await.map_err(pool_error)?;
        epochs
            .install(&mut client, partition, epoch, holder, self.lock_timeout)
            .await
            .map_err(pg_error)
    }

    /// The epoch table's rows, by partition: the floors an acquire reads
    /// (S-L10).
    ///
    /// # Errors
    /// As [`install_epoch`](Self::install_epoch).
    pub async fn sink_epochs(&self) -> Result<Vec<SinkEpoch>, WriteError> {
        let epochs = self.epochs.as_ref().ok_or_else(no_epoch_table)?;
        let client = self.pool.get().await.map_err(pool_error)?;
        epochs.read(&**client).await.map_err(pg_error)
    }

    /// The table, as written in SQL (quoted).
    pub fn table(&self) -> &str {
        &self.table.quoted
    }

    /// The pool the sink writes through.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Creates the table and its index if they do not exist (the
    /// statements of [`schema_sql`]), and the epoch table with
    /// [`with_epochs`](Self::with_epochs), in one transaction.
    ///
    /// # Errors
    /// The pool's or the server's error, as a [`WriteError`] classified as
    /// for a write.
    pub async fn create_table(&self) -> Result<(), WriteError> {
        let mut client = self.pool.get().await.map_err(pool_error)?;
        let tx = client.transaction().await.map_err(pg_error)?;
        tx.batch_execute(&schema_for(&self.table, K::SQL_TYPE))
            .await
            .map_err(pg_error)?;
        if let Some(epochs) = &self.epochs {
            tx.batch_execute(&epochs.schema()).await.map_err(pg_error)?;
        }
        tx.commit().await.map_err(pg_error)
    }

    async fn write_slice(&self, tenant: &K, items: &[R]) -> Result<Written, WriteError> {
        if items.is_empty() {
            return Ok(Written::ALL);
        }
        if let Some(item) = items.iter().find(|i| i.payload().len() > MAX_PAYLOAD_BYTES) {
            return Err(WriteError::terminal(PayloadTooLarge {
                item_id: item.id(),
                len: item.payload().len(),
            }));
        }
        let tenant = tenant.param().map_err(WriteError::terminal)?;
        let mut client = self.pool.get().await.map_err(pool_error)?;
        let n = chunk_len(items, self.max_rows, self.max_bytes);
        if n == items.len() {
            // One statement is atomic on its own (an implicit transaction):
            // no BEGIN and COMMIT round trips.
            let stmt = client
                .prepare_cached(&self.insert_sql)
                .await
                .map_err(pg_error)?;
            let ids: Vec<Uuid> = items.iter().map(Record::id).collect();
            let payloads: Vec<&[u8]> = items.iter().map(Record::payload).collect();
            client
                .execute(&stmt, &[&tenant, &ids, &payloads])
                .await
                .map_err(pg_error)?;
            return Ok(Written::ALL);
        }
        let tx = client.transaction().await.map_err(pg_error)?;
        let stmt = tx
            .prepare_cached(&self.insert_sql)
            .await
            .map_err(pg_error)?;
        let mut rest = items;
        while !rest.is_empty() {
            let n = chunk_len(rest, self.max_rows, self.max_bytes);
            let (chunk, tail) = rest.split_at(n);
            rest = tail;
            let ids: Vec<Uuid> = chunk.iter().map(Record::id).collect();
            let payloads: Vec<&[u8]> = chunk.iter().map(Record::payload).collect();
            tx.execute(&stmt, &[&tenant, &ids, &payloads])
                .await
                .map_err(pg_error)?;
        }
        tx.commit().await.map_err(pg_error)?;
        Ok(Written::ALL)
    }
}

impl<R: Record, K: PgTenant> PostgresSink<R, K> {
    /// Writes a group of slices (S-F1): one transaction, multi-row
    /// statements whose rows carry their tenant, in group then slice order
    /// (each tenant's rows keep staging order, S-W3). A slice that cannot
    /// be sent (a payload over the `bytea` limit, a tenant key that does
    /// not fit its column) is rejected alone before any I/O. If the
    /// group's transaction fails terminally (bad data in one slice), each
    /// slice is written again alone, so only the bad one is rejected
    /// (S-F3); a retryable failure fails every slice of the transaction.
    async fn write_slices(&self, slices: &[Slice<K, R>]) -> Vec<Result<Written, WriteError>> {
        let mut outcomes: Vec<Option<Result<Written, WriteError>>> =
            slices.iter().map(|_| None).collect();
        let mut tenants = Vec::new();
        let mut rows: Vec<&R> = Vec::new();
        let mut sent = Vec::new();
        for (i, slice) in slices.iter().enumerate() {
            if slice.items.is_empty() {
                outcomes[i] = Some(Ok(Written::ALL));
                continue;
            }
            if let Some(item) = slice
                .items
                .iter()
                .find(|i| i.payload().len() > MAX_PAYLOAD_BYTES)
            {
                outcomes[i] = Some(Err(WriteError::terminal(PayloadTooLarge {
                    item_id: item.id(),
                    len: item.payload().len(),
                })));
                continue;
            }
            match slice.tenant.param() {
                Ok(t) => {
                    for item in &slice.items {
                        tenants.push(t.clone());
                        rows.push(item);
                    }
                    sent.push(i);
                }
                Err(e) => outcomes[i] = Some(Err(WriteError::terminal(e))),
            }
        }
        if !sent.is_empty() {
            match self.insert_rows(&tenants, &rows).await {
                Ok(()) => {
                    for &i in &sent {
                        outcomes[i] = Some(Ok(Written::ALL));
                    }
                }
                Err(e) if e.is_terminal() && sent.len() > 1 => {
                    // Which slice is bad is unknown: each goes alone.
                    drop(e);
                    for &i in &sent {
                        let s = &slices[i];
                        outcomes[i] = Some(self.write_slice(&s.tenant, &s.items).await);
                    }
                }
                Err(e) => {
                    let text = e.to_string();
                    let kind = e.kind();
                    outcomes[sent[0]] = Some(Err(e));
                    for &i in &sent[1..] {
                        let again = GroupFailed(text.clone());
                        outcomes[i] = Some(Err(match kind {
                            ErrorKind::Terminal => WriteError::terminal(again),
                            _ => WriteError::retryable(again),
                        }));
                    }
                }
            }
        }
        outcomes
            .into_iter()
            .map(|o| o.unwrap_or(Ok(Written::ALL)))
            .collect()
    }

    /// Inserts `rows` (with their `tenants`) all-or-nothing: one statement
    /// if they fit one, else several in one transaction.
    async fn insert_rows(&self, tenants: &[K::Param<'_>], rows: &[&R]) -> Result<(), WriteError> {
        let mut client = self.pool.get().await.map_err(pool_error)?;
        let chunk = |rows: &[&R]| rows_in_statement(rows, self.max_rows, self.max_bytes);
        if chunk(rows) == rows.len() {
            let stmt = client
                .prepare_cached(&self.group_sql)
                .await
                .map_err(pg_error)?;
            let (ids, payloads) = columns(rows);
            client
                .execute(&stmt, &[&tenants, &ids, &payloads])
                .await
                .map_err(pg_error)?;
            return Ok(());
        }
        let tx = client.transaction().await.map_err(pg_error)?;
        let stmt = tx.prepare_cached(&self.group_sql).await.map_err(pg_error)?;
        let mut at = 0;
        while at < rows.len() {
            let n = chunk(&rows[at..]);
            let (ids, payloads) = columns(&rows[at..at + n]);
            let ts = &tenants[at..at + n];
            tx.execute(&stmt, &[&ts, &ids, &payloads])
                .await
                .map_err(pg_error)?;
            at += n;
        }
        tx.commit().await.map_err(pg_error)
    }
}

/// How many leading rows of `rows` go in one statement: at least 1, at
/// most `max_rows`, and no more payload than `max_bytes` unless the first
/// row alone is larger.
fn rows_in_statement<R: Record>(rows: &[&R], max_rows: usize, max_bytes: usize) -> usize {
    let mut bytes = 0usize;
    let mut n = 0usize;
    for r in rows.iter().take(max_rows) {
        let len = r.payload().len();
        if n > 0 && bytes.saturating_add(len) > max_bytes {
            break;
        }
        bytes = bytes.saturating_add(len);
        n += 1;
    }
    n.max(1)
}

/// The sink has no epoch table: a configuration that never passes.
fn no_epoch_table() -> WriteError {
    WriteError::terminal("the PostgreSQL sink has no epoch table: configure `with_epochs`")
}

/// The id and payload columns of `rows`.
fn columns<'a, R: Record>(rows: &[&'a R]) -> (Vec<Uuid>, Vec<&'a [u8]>) {
    (
        rows.iter().map(|r| r.id()).collect(),
        rows.iter().map(|r| r.payload()).collect(),
    )
}

/// A slice failed because its group's transaction failed (S-F4): the
/// group's error, as text (the first slice of the group carries it whole).
#[derive(Debug)]
pub struct GroupFailed(pub String);

impl fmt::Display for GroupFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the group's transaction failed: {}", self.0)
    }
}

impl StdError for GroupFailed {}

impl<R: Record, K: PgTenant> Sink for PostgresSink<R, K> {
    type Tenant = K;
    type Item = R;

    fn name(&self) -> &str {
        &self.name
    }

    fn write(
        &self,
        tenant: &K,
        items: &[R],
    ) -> impl std::future::Future<Output = Result<Written, WriteError>> + Send {
        self.write_slice(tenant, items)
    }

    /// Yes: see [`write_group`](Sink::write_group) (S-F1).
    fn takes_groups(&self) -> bool {
        true
    }

    /// One transaction for the group (S-F1); see
    /// [the module docs](self#fan-in).
    fn write_group(
        &self,
        slices: &[Slice<K, R>],
    ) -> impl std::future::Future<Output = Vec<Result<Written, WriteError>>> + Send {
        self.write_slices(slices)
    }

    /// With [`with_epochs`](PostgresSink::with_epochs): one transaction
    /// checked by `epoch` (S-E4); a stale epoch commits nothing and
    /// answers [`WriteError::stale_epoch`]. Without: [`write`](Sink::write).
    async fn write_with_epoch(
        &self,
        epoch: WriteEpoch,
        tenant: &K,
        items: &[R],
    ) -> Result<Written, WriteError> {
        let Some(epochs) = self.epochs.as_deref() else {
            return self.write_slice(tenant, items).await;
        };
        let mut out = self.write_checked(epochs, &[(tenant, items, epoch)]).await;
        out.pop().unwrap_or(Ok(Written::ALL))
    }

    /// With [`with_epochs`](PostgresSink::with_epochs): one transaction
    /// for the group, checked by every slice's epoch in partition order
    /// (S-E4); only the slices of a stale partition fail `stale_epoch`, the
    /// others are written (S-F3). Without: [`write_group`](Sink::write_group).
    async fn write_group_with_epochs(
        &self,
        slices: &[Slice<K, R>],
        epochs: &[WriteEpoch],
    ) -> Vec<Result<Written, WriteError>> {
        let Some(table) = self.epochs.as_deref() else {
            return self.write_slices(slices).await;
        };
        if epochs.len() != slices.len() {
            let e = || WriteError::terminal("a group's epochs do not match its slices");
            return slices.iter().map(|_| Err(e())).collect();
        }
        let with: Vec<(&K, &[R], WriteEpoch)> = slices
            .iter()
            .zip(epochs)
            .map(|(s, e)| (&s.tenant, s.items.as_slice(), *e))
            .collect();
        self.write_checked(table, &with).await
    }
}

/// How many leading items of `items` (non-empty) go in one statement: at
/// least 1, at most `max_rows`, and no more payload than `max_bytes` unless
/// the first item alone is larger.
fn chunk_len<R: Record>(items: &[R], max_rows: usize, max_bytes: usize) -> usize {
    let mut bytes = 0usize;
    let mut n = 0usize;
    for item in items.iter().take(max_rows) {
        let len = item.payload().len();
        if n > 0 && bytes.saturating_add(len) > max_bytes {
            break;
        }
        bytes = bytes.saturating_add(len);
        n += 1;
    }
    n.max(1)
}

/// The `CREATE TABLE` and `CREATE INDEX` statements (`IF NOT EXISTS`) for
/// `table` (the grammar of [`PostgresSink::new`]) with a `tenant` column
/// for keys `K` ([`PgTenant::SQL_TYPE`]), as run by
/// [`PostgresSink::create_table`]: for migrations, e.g.
/// `schema_sql::<TenantId>("usage_records")`.
///
/// # Errors
/// [`InvalidTableName`] for a name outside the grammar.
pub fn schema_sql<K: PgTenant>(table: &str) -> Result<String, InvalidTableName> {
    QualifiedName::parse(table).map(|t| schema_for(&t, K::SQL_TYPE))
}

fn schema_for(table: &QualifiedName, tenant_type: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {t} (\n    \
             tenant     {tenant_type:<11} NOT NULL,\n    \
             item_id    uuid        NOT NULL,\n    \
             seq        bigint      GENERATED ALWAYS AS IDENTITY,\n    \
             payload    bytea       NOT NULL,\n    \
             written_at timestamptz NOT NULL DEFAULT now(),\n    \
             PRIMARY KEY (tenant, item_id)\n\
         );\n\
         CREATE INDEX IF NOT EXISTS {i} ON {t} (tenant, seq);\n",
        t = table.quoted,
        i = quote(&format!("{}_tenant_seq", truncate(table.name(), 52))),
    )
}

/// Whether a SQLSTATE (five characters, e.g. `"40001"`) is retryable or
/// terminal for this sink: the table in the [module docs](self). Unknown
/// codes are retryable.
pub fn sqlstate_kind(code: &str) -> ErrorKind {
    const TERMINAL_CLASSES: [&str; 3] = ["22", "23", "54"];
    const TERMINAL_CODES: [&str; 2] = ["40002", "P0001"];
    let class = code.get(..2).unwrap_or(code);
    if TERMINAL_CLASSES.contains(&class) || TERMINAL_CODES.contains(&code) {
        ErrorKind::Terminal
    } else {
        ErrorKind::Retryable
    }
}

/// Classifies a client error: by SQLSTATE when the server sent one
/// ([`sqlstate_kind`]), else retryable (I/O, closed connection, timeout).
pub fn error_kind(error: &tokio_postgres::Error) -> ErrorKind {
    match error.code() {
        Some(code) => sqlstate_kind(code.code()),
        None => ErrorKind::Retryable,
    }
}

/// Classifies a pool error: see the [module docs](self).
pub fn pool_error_kind(error: &PoolError) -> ErrorKind {
    match error {
        PoolError::Backend(e) => error_kind(e),
        PoolError::Timeout(_) | PoolError::PostCreateHook(_) => ErrorKind::Retryable,
        PoolError::Closed | PoolError::NoRuntimeSpecified => ErrorKind::Terminal,
    }
}

pub(crate) fn pg_error(e: tokio_postgres::Error) -> WriteError {
    let kind = error_kind(&e);
    let e = PostgresError(e);
    match kind {
        ErrorKind::Terminal => WriteError::terminal(e),
        _ => WriteError::retryable(e),
    }
}

/// The cause of a [`WriteError`] from the server or the client: the
/// [`tokio_postgres::Error`], displayed with the server's message and
/// SQLSTATE when there is one (`tokio-postgres` alone says "db error").
#[derive(Debug)]
pub struct PostgresError(pub tokio_postgres::Error);

impl fmt::Display for PostgresError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.as_db_error() {
            Some(db) => write!(f, "{db} (SQLSTATE {})", db.code().code()),
            None => match self.0.source() {
                Some(source) => write!(f, "{}: {source}", self.0),
                None => fmt::Display::fmt(&self.0, f),
            },
        }
    }
}

impl StdError for PostgresError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&self.0)
    }
}

fn pool_error(e: PoolError) -> WriteError {
    match pool_error_kind(&e) {
        ErrorKind::Terminal => WriteError::terminal(e),
        _ => WriteError::retryable(e),
    }
}

/// A table name outside the accepted grammar ([`PostgresSink::new`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidTableName {
    name: String,
}

impl InvalidTableName {
    /// For the outbox table's derived names (feature `table`).
    #[cfg(feature = "table")]
    pub(crate) fn for_name(name: &str) -> Self {
        InvalidTableName {
            name: name.to_owned(),
        }
    }
}

impl fmt::Display for InvalidTableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid table name {:?}: expected `name` or `schema.name`, each an \
             identifier of ASCII letters, digits, `_` or `$`, not starting with a \
             digit, at most 63 bytes",
            self.name
        )
    }
}

impl StdError for InvalidTableName {}

/// A payload over [`MAX_PAYLOAD_BYTES`]: the cause of a terminal error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PayloadTooLarge {
    /// The item.
    pub item_id: Uuid,
    /// Its payload's length, in bytes.
    pub len: usize,
}

impl fmt::Display for PayloadTooLarge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "payload of item {} is {} bytes, over the bytea limit of {} bytes",
            self.item_id, self.len, MAX_PAYLOAD_BYTES
        )
    }
}

impl StdError for PayloadTooLarge {}

/// A validated `name` or `schema.name`, plain and quoted.
#[derive(Clone, Debug)]
pub(crate) struct QualifiedName {
    pub(crate) plain: String,
    pub(crate) quoted: String,
}

impl QualifiedName {
    pub(crate) fn parse(name: &str) -> Result<Self, InvalidTableName> {
        let invalid = || InvalidTableName {
            name: name.to_owned(),
        };
        let parts: Vec<&str> = name.split('.').collect();
        if parts.len() > 2 || !parts.iter().all(|p| is_identifier(p)) {
            return Err(invalid());
        }
        let quoted = parts.iter().map(|p| quote(p)).collect::<Vec<_>>().join(".");
        Ok(QualifiedName {
            plain: name.to_owned(),
            quoted,
        })
    }

    /// The table part, without the schema.
    pub(crate) fn name(&self) -> &str {
        self.plain.rsplit('.').next().unwrap_or(&self.plain)
    }
}

fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    let first_ok = matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_');
    first_ok && s.len() <= 63 && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
}

/// Quotes an identifier already checked by [`is_identifier`] (so it holds
/// no `"`).
pub(crate) fn quote(ident: &str) -> String {
    format!("\"{ident}\"")
}

/// The longest prefix of an ASCII `s` of at most `n` bytes.
fn truncate(s: &str, n: usize) -> &str {
    s.get(..n.min(s.len())).unwrap_or(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sinks::Envelope;

    #[test]
    fn sqlstates_classify_as_documented() {
        for retryable in [
            "08000", "08006", "08001", "08P01", "40001", "40P01", "40000", "40003", "53300",
            "53100", "55P03", "57P01", "57P03", "57014", "58030", "25006", "XX000", "42P01",
            "42501", "0A000",
        ] {
            assert_eq!(
                sqlstate_kind(retryable),
                ErrorKind::Retryable,
                "{retryable}"
            );
        }
        for terminal in [
            "22001", "22P02", "22003", "23505", "23503", "23514", "23502", "40002", "54000",
            "P0001",
        ] {
            assert_eq!(sqlstate_kind(terminal), ErrorKind::Terminal, "{terminal}");
        }
        // Garbage never panics.
        assert_eq!(sqlstate_kind(""), ErrorKind::Retryable);
        assert_eq!(sqlstate_kind("2"), ErrorKind::Retryable);
        assert_eq!(sqlstate_kind("é"), ErrorKind::Retryable);
    }

    #[test]
    fn table_names_are_validated_and_quoted() {
        let ok = QualifiedName::parse("Usage_Records").unwrap();
        assert_eq!(ok.quoted, "\"Usage_Records\"");
        let ok = QualifiedName::parse("billing.usage$1").unwrap();
        assert_eq!(ok.quoted, "\"billing\".\"usage$1\"");
        assert_eq!(ok.name(), "usage$1");
        for bad in [
            "",
            "1abc",
            "a b",
            "a;drop table x",
            "a\"b",
            "a.b.c",
            ".a",
            "a.",
            "é",
            &"x".repeat(64),
        ] {
            assert!(QualifiedName::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn schema_mentions_every_column_and_the_key() {
        let sql = schema_sql::<TenantId>("s.t").unwrap();
        for needle in [
            "CREATE TABLE IF NOT EXISTS \"s\".\"t\"",
            "tenant     uuid",
            "item_id    uuid",
            "seq        bigint",
            "payload    bytea",
            "written_at timestamptz",
            "PRIMARY KEY (tenant, item_id)",
            "CREATE INDEX IF NOT EXISTS \"t_tenant_seq\" ON \"s\".\"t\" (tenant, seq)",
        ] {
            assert!(sql.contains(needle), "{needle} in {sql}");
        }
    }

    #[test]
    fn keys_map_to_their_column_and_u64_never_wraps() {
        for (sql, ty) in [
            (schema_sql::<TenantId>("t").unwrap(), "uuid"),
            (schema_sql::<Uuid>("t").unwrap(), "uuid"),
            (schema_sql::<i64>("t").unwrap(), "bigint"),
            (schema_sql::<u64>("t").unwrap(), "bigint"),
            (schema_sql::<String>("t").unwrap(), "text"),
            (schema_sql::<std::sync::Arc<str>>("t").unwrap(), "text"),
        ] {
            assert!(
                sql.contains(&format!("tenant     {ty:<11} NOT NULL")),
                "{ty}: {sql}"
            );
        }
        assert_eq!(i64::MAX.unsigned_abs().param(), Ok(i64::MAX));
        assert_eq!((-3i64).param(), Ok(-3));
        let over = u64::try_from(i64::MAX).unwrap() + 1;
        let err = over.param().unwrap_err();
        assert_eq!(err.tenant(), "9223372036854775808");
        assert!(err.to_string().contains("i64::MAX"), "{err}");
        assert_eq!(u64::MAX.param().unwrap_err().tenant(), u64::MAX.to_string());
        assert_eq!("acme".to_owned().param(), Ok("acme"));
    }

    #[test]
    fn chunks_respect_rows_and_bytes() {
        let items: Vec<Envelope> = (0..10)
            .map(|i| Envelope::with_id(Uuid::from_u128(i), vec![0u8; 10]))
            .collect();
        assert_eq!(chunk_len(&items, 3, usize::MAX), 3);
        assert_eq!(chunk_len(&items, 100, 25), 2);
        assert_eq!(chunk_len(&items, 100, 5), 1, "an oversized row goes alone");
        assert_eq!(chunk_len(&items[..1], 100, 1000), 1);
    }
}
