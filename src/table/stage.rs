//! Staging into the outbox table inside the caller's own transaction
//! (S-T10): one statement per call, rolled back with the transaction.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use tokio_postgres::types::Type;
use tokio_postgres::GenericClient;

use super::names::TableNames;
use crate::codec::{Codec, Postcard};
use crate::core::relay::StoreError;
use crate::sink::BoxError;
use crate::sinks::postgres::InvalidTableName;

/// How a stage wakes the relay (S-T15).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Wakeup {
    /// A `pg_notify` in the staging statement: delivered at the caller's
    /// COMMIT (the lowest latency; it takes a database-wide lock at
    /// commit, and a full notification queue fails that COMMIT).
    #[default]
    InTransaction,
    /// None in the statement: the caller tells the outbox it committed
    /// (the outbox notifies from its own connection), or the relay polls.
    None,
}

/// A stage that failed: the item could not be encoded (nothing was sent),
/// or the database refused the statement (the caller's transaction is
/// then aborted: roll it back).
#[derive(Debug)]
#[non_exhaustive]
pub enum StageError {
    /// The codec failed on the tenant or the item (at `index` of a run).
    Unencodable {
        /// The item's place in the run (0 for a single stage).
        index: usize,
        /// The codec's error.
        source: BoxError,
    },
    /// The database's error.
    Database(StoreError),
}

impl fmt::Display for StageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StageError::Unencodable { index, source } => {
                write!(f, "item {index} cannot be encoded: {source}")
            }
            StageError::Database(e) => write!(f, "the stage failed in the database: {e}"),
        }
    }
}

impl std::error::Error for StageError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StageError::Unencodable { source, .. } => Some(&**source),
            StageError::Database(e) => Some(e),
        }
    }
}

/// The handle that stages items of tenants `K` into one outbox table,
/// encoding them with the codec `C` (S-T10). Cheap to clone; build it once.
///
/// ```no_run
/// # async fn demo(client: &mut tokio_postgres::Client) -> Result<(), Box<dyn std::error::Error>> {
/// use outbox::table::OutboxTable;
/// let table: OutboxTable<u64, String> = OutboxTable::new("usage_outbox")?;
/// let tx = client.transaction().await?;
/// tx.execute("UPDATE accounts SET balance = balance - 1 WHERE id = $1", &[&7i64]).await?;
/// table.stage(&tx, &7, &"one unit".to_owned()).await?;
/// tx.commit().await?; // the item exists if and only if this commits
/// # Ok(()) }
/// ```
pub struct OutboxTable<K, I, C = Postcard> {
    names: Arc<TableNames>,
    codec: C,
    codec_version: u32,
    wakeup: Wakeup,
    one_sql: String,
    run_sql: String,
    _items: PhantomData<fn(K, I)>,
}

impl<K, I, C: Clone> Clone for OutboxTable<K, I, C> {
    fn clone(&self) -> Self {
        OutboxTable {
            names: self.names.clone(),
            codec: self.codec.clone(),
            codec_version: self.codec_version,
            wakeup: self.wakeup,
            one_sql: self.one_sql.clone(),
            run_sql: self.run_sql.clone(),
            _items: PhantomData,
        }
    }
}

impl<K, I, C> fmt::Debug for OutboxTable<K, I, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutboxTable")
            .field("table", &self.names.name())
            .field("codec_version", &self.codec_version)
            .field("wakeup", &self.wakeup)
            .finish_non_exhaustive()
    }
}

impl<K, I> OutboxTable<K, I, Postcard>
where
    Postcard: Codec<K, I>,
{
    /// A handle on the outbox table `name` with the default codec.
    ///
    /// # Errors
    /// [`InvalidTableName`] (see [`TableNames::new`]).
    pub fn new(name: &str) -> Result<Self, InvalidTableName> {
        Self::with_codec(name, Postcard)
    }
}

impl<K, I, C: Codec<K, I>> OutboxTable<K, I, C> {
    /// A handle on the outbox table `name` encoding with `codec`.
    ///
    /// # Errors
    /// [`InvalidTableName`] (see [`TableNames::new`]).
    pub fn with_codec(name: &str, codec: C) -> Result<Self, InvalidTableName> {
        let names = TableNames::new(name)?;
        let codec_version = codec.version();
        let mut table = OutboxTable {
            names: Arc::new(names),
            codec,
            codec_version,
            wakeup: Wakeup::InTransaction,
            one_sql: String::new(),
            run_sql: String::new(),
            _items: PhantomData,
        };
        table.build_sql();
        Ok(table)
    }

    /// The codec's schema version stored with every row (S-T3; default
    /// the codec's own, [`Codec::version`], 0 for [`Postcard`]): sets
    /// another.
    pub fn codec_version(mut self, version: u32) -> Self {
        self.codec_version = version;
        self
    }

    /// How a stage wakes the relay (default [`Wakeup::InTransaction`]).
    pub fn wakeup(mut self, wakeup: Wakeup) -> Self {
        self.wakeup = wakeup;
        self.build_sql();
        self
    }

    /// The names of the outbox's tables.
    pub fn names(&self) -> &TableNames {
        &self.names
    }

    fn build_sql(&mut self) {
        let n = &self.names;
        let notify = match self.wakeup {
            Wakeup::InTransaction => format!(
                ", pg_notify('{}', '')",
                n.channel_name().replace('\'', "''")
            ),
            Wakeup::None => String::new(),
        };
        self.one_sql = format!(
            "WITH r AS (INSERT INTO {o} (partition, tenant, item, codec_version) \
                        VALUES ({f}($1), $1, $2, $3) RETURNING id) \
             SELECT (SELECT id FROM r){notify}",
            o = n.outbox,
            f = n.partition_fn,
        );
        self.run_sql = format!(
            "WITH r AS (INSERT INTO {o} (partition, tenant, item, codec_version) \
                        SELECT {f}(u.t), u.t, u.i, $3 \
                        FROM unnest($1::bytea[], $2::bytea[]) WITH ORDINALITY AS u(t, i, k) \
                        ORDER BY u.k RETURNING 1) \
             SELECT (SELECT count(*) FROM r){notify}",
            o = n.outbox,
            f = n.partition_fn,
        );
    }

    /// The tenant's and the item's bytes.
    pub fn encode(&self, tenant: &K, item: &I) -> Result<(Vec<u8>, Vec<u8>), BoxError> {
        let mut t = Vec::new();
        self.codec.encode_tenant(tenant, &mut t)?;
        let mut i = Vec::new();
        self.codec.encode_item(item, &mut i)?;
        Ok((t, i))
    }

    /// Stages `item` for `tenant` in the caller's transaction (or any
    /// client: outside a transaction the row commits at once): one
    /// statement, one round trip. Answers the row's id. The row is
    /// delivered if and only if the transaction commits; S-W1 does not
    /// hold here, and the shutdown fence does not apply (S-T10).
    ///
    /// # Errors
    /// [`StageError::Unencodable`] before anything is sent;
    /// [`StageError::Database`] with the database's error.
    ///
    /// # Cancel safety
    /// Dropped, the statement may have run in the transaction or not: roll
    /// the transaction back.
    pub async fn stage(
        &self,
        client: &impl GenericClient,
        tenant: &K,
        item: &I,
    ) -> Result<i64, StageError> {
        let (t, i) = self
            .encode(tenant, item)
            .map_err(|source| StageError::Unencodable { index: 0, source })?;
        let row = client
            .query_typed_one(
                &self.one_sql,
                &[
                    (&t, Type::BYTEA),
                    (&i, Type::BYTEA),
                    (&i64::from(self.codec_version), Type::INT8),
                ],
            )
            .await
            .map_err(|e| StageError::Database(super::pg::error(e)))?;
        Ok(row.get(0))
    }

    /// Stages a run of items (any tenants) in one multi-row statement, in
    /// the run's order; answers how many. Every item is encoded first: one
    /// that cannot be, fails the whole run before anything is sent.
    ///
    /// # Errors
    /// As [`stage`](Self::stage).
    pub async fn stage_run<'a>(
        &self,
        client: &impl GenericClient,
        items: impl IntoIterator<Item = (&'a K, &'a I)>,
    ) -> Result<u64, StageError>
    where
        K: 'a,
        I: 'a,
    {
        let (tenants, encoded) = self.encode_run(items)?;
        if tenants.is_empty() {
            return Ok(0);
        }
        let row = client
            .query_typed_one(
                &self.run_sql,
                &[
                    (&tenants, Type::BYTEA_ARRAY),
                    (&encoded, Type::BYTEA_ARRAY),
                    (&i64::from(self.codec_version), Type::INT8),
                ],
            )
            .await
            .map_err(|e| StageError::Database(super::pg::error(e)))?;
        Ok(u64::try_from(row.get::<_, i64>(0)).unwrap_or(0))
    }

    #[allow(clippy::type_complexity)]
    pub(crate) fn encode_run<'a>(
        &self,
        items: impl IntoIterator<Item = (&'a K, &'a I)>,
    ) -> Result<(Vec<Vec<u8>>, Vec<Vec<u8>>), StageError>
    where
        K: 'a,
        I: 'a,
    {
        let mut tenants = Vec::new();
        let mut encoded = Vec::new();
        for (index, (tenant, item)) in items.into_iter().enumerate() {
            let (t, i) = self
                .encode(tenant, item)
                .map_err(|source| StageError::Unencodable { index, source })?;
            tenants.push(t);
            encoded.push(i);
        }
        Ok((tenants, encoded))
    }

    #[cfg_attr(not(feature = "sqlx"), allow(dead_code))]
    pub(crate) fn one_sql(&self) -> &str {
        &self.one_sql
    }

    #[cfg_attr(not(feature = "sqlx"), allow(dead_code))]
    pub(crate) fn run_sql(&self) -> &str {
        &self.run_sql
    }

    #[cfg_attr(not(feature = "sqlx"), allow(dead_code))]
    pub(crate) fn version(&self) -> u32 {
        self.codec_version
    }
}
