//! The sink's epochs (S-T23): the install a takeover runs under
//! `lock_timeout`, and the check a sink transaction runs as its last
//! statement before COMMIT under shared locks taken in partition order.

use super::{error, pool_error, PgStore};
use crate::core::lease::Holder;
use crate::core::relay::{Fenced, StoreError, StoreErrorKind};
use crate::sinks::postgres::epochs::{millis, EpochSql, Installed, SinkEpoch};
use crate::table::store::EpochTx;

pub(super) async fn sink_epochs(store: &PgStore) -> Result<Vec<SinkEpoch>, StoreError> {
    let client = store.client().await?;
    store.epochs.read(&**client).await.map_err(error)
}

pub(super) async fn install(
    store: &PgStore,
    partition: u32,
    epoch: u64,
    holder: &Holder,
) -> Result<Installed, StoreError> {
    let mut client = store.client().await?;
    store
        .epochs
        .install(&mut client, partition, epoch, holder, store.lock_timeout)
        .await
        .map_err(error)
}

/// A sink transaction fenced by epochs, on a pooled connection: see
/// [`EpochTx`]. Run the sink's own statements on
/// [`client`](Self::client) between `begin` and the check. Dropped without
/// `commit` or `rollback`, its connection is closed (never returned to the
/// pool inside a transaction), which rolls it back.
pub struct PgEpochTx {
    client: Option<deadpool_postgres::Object>,
    epochs: std::sync::Arc<EpochSql>,
    failed: bool,
}

impl std::fmt::Debug for PgEpochTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgEpochTx")
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

impl PgEpochTx {
    pub(super) async fn begin(store: &PgStore) -> Result<Self, StoreError> {
        let client = store.pool.get().await.map_err(pool_error)?;
        client
            .batch_execute(&format!(
                "BEGIN; SET LOCAL idle_in_transaction_session_timeout = '{}ms'",
                millis(store.idle_timeout)
            ))
            .await
            .map_err(error)?;
        Ok(PgEpochTx {
            client: Some(client),
            epochs: store.epochs.clone(),
            failed: false,
        })
    }

    /// The transaction's connection, for the sink's own statements.
    pub fn client(&self) -> Option<&tokio_postgres::Client> {
        self.client.as_deref().map(|c| &**c)
    }

    fn gone() -> StoreError {
        StoreError::new(StoreErrorKind::Refused, None, "the transaction has ended")
    }

    async fn end(&mut self, sql: &str) -> Result<(), StoreError> {
        let client = self.client.take().ok_or_else(Self::gone)?;
        let result = client.batch_execute(sql).await.map_err(error);
        if result.is_err() {
            // Never hand a connection in an unknown state back to the pool.
            drop(deadpool_postgres::Object::take(client));
        }
        result
    }
}

impl EpochTx for PgEpochTx {
    async fn check_epochs(&mut self, epochs: &[(u32, u64)]) -> Result<Fenced<()>, StoreError> {
        let client = self.client.as_ref().ok_or_else(Self::gone)?;
        let checked = match client
            .prepare_typed_cached(self.epochs.check_sql(), &EpochSql::CHECK_TYPES)
            .await
        {
            Ok(check) => self.epochs.check(&***client, &check, epochs).await,
            Err(e) => Err(e),
        };
        match checked {
            Ok(stale) if stale.is_empty() => Ok(Fenced::Done(())),
            Ok(_) => Ok(Fenced::Stale),
            Err(e) => {
                self.failed = true;
                Err(error(e))
            }
        }
    }

    async fn commit(mut self) -> Result<(), StoreError> {
        if self.failed {
            self.end("ROLLBACK").await?;
            return Err(StoreError::new(
                StoreErrorKind::Refused,
                None,
                "a statement of the transaction failed: rolled back",
            ));
        }
        self.end("COMMIT").await
    }

    async fn rollback(mut self) -> Result<(), StoreError> {
        self.end("ROLLBACK").await
    }
}

impl Drop for PgEpochTx {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            drop(deadpool_postgres::Object::take(client));
        }
    }
}
