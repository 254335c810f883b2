//! The sink's epochs (S-T23): the install a takeover runs under
//! `lock_timeout`, and the check a sink transaction runs as its last
//! statement before COMMIT under shared locks taken in partition order.

use tokio_postgres::types::Type;

use super::{error, pool_error, to_i64, to_u64, PgStore};
use crate::core::relay::{Fenced, StoreError, StoreErrorKind};
use crate::table::store::{EpochTx, Installed};

pub(super) async fn sink_epochs(store: &PgStore) -> Result<Vec<(u32, u64)>, StoreError> {
    let sql = format!(
        "SELECT partition, epoch FROM {} ORDER BY partition",
        store.names.sink_epoch
    );
    let client = store.client().await?;
    let rows = client.query_typed(&sql, &[]).await.map_err(error)?;
    Ok(rows
        .iter()
        .map(|r| {
            (
                u32::try_from(r.get::<_, i32>(0)).unwrap_or(0),
                to_u64(r.get(1)),
            )
        })
        .collect())
}

pub(super) async fn install(
    store: &PgStore,
    partition: u32,
    epoch: u64,
) -> Result<Installed, StoreError> {
    let t = &store.names.sink_epoch;
    let mut client = store.client().await?;
    let tx = client.transaction().await.map_err(error)?;
    let ms = store.lock_timeout.as_millis().max(1);
    tx.batch_execute(&format!("SET LOCAL lock_timeout = '{ms}ms'"))
        .await
        .map_err(error)?;
    let sql = format!(
        "INSERT INTO {t} (partition, epoch) VALUES ($1, $2) ON CONFLICT (partition) \
         DO UPDATE SET epoch = EXCLUDED.epoch WHERE {t}.epoch <= EXCLUDED.epoch RETURNING epoch"
    );
    let params: [(&(dyn tokio_postgres::types::ToSql + Sync), Type); 2] = [
        (&(partition as i32), Type::INT4),
        (&to_i64(epoch), Type::INT8),
    ];
    let done = tx.query_typed_opt(&sql, &params).await.map_err(error)?;
    let answer = if done.is_some() {
        Installed::Installed
    } else {
        let current: i64 = tx
            .query_typed_one(
                &format!("SELECT epoch FROM {t} WHERE partition = $1"),
                &[(&(partition as i32), Type::INT4)],
            )
            .await
            .map_err(error)?
            .get(0);
        Installed::Superseded {
            current: to_u64(current),
        }
    };
    tx.commit().await.map_err(error)?;
    Ok(answer)
}

/// A sink transaction fenced by epochs, on a pooled connection: see
/// [`EpochTx`]. Run the sink's own statements on
/// [`client`](Self::client) between `begin` and the check. Dropped without
/// `commit` or `rollback`, its connection is closed (never returned to the
/// pool inside a transaction), which rolls it back.
pub struct PgEpochTx {
    client: Option<deadpool_postgres::Object>,
    check_sql: String,
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
        let ms = store.idle_timeout.as_millis().max(1);
        client
            .batch_execute(&format!(
                "BEGIN; SET LOCAL idle_in_transaction_session_timeout = '{ms}ms'"
            ))
            .await
            .map_err(error)?;
        let t = &store.names.sink_epoch;
        Ok(PgEpochTx {
            client: Some(client),
            check_sql: format!(
                "SELECT e.partition FROM {t} e \
                 JOIN unnest($1::int[], $2::bigint[]) AS c(p, ep) \
                   ON e.partition = c.p AND e.epoch = c.ep \
                 ORDER BY e.partition FOR SHARE OF e"
            ),
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
        let mut sorted = epochs.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let (ps, es): (Vec<i32>, Vec<i64>) =
            sorted.iter().map(|&(p, e)| (p as i32, to_i64(e))).unzip();
        let client = self.client.as_ref().ok_or_else(Self::gone)?;
        let rows = client
            .query_typed(
                &self.check_sql,
                &[(&ps, Type::INT4_ARRAY), (&es, Type::INT8_ARRAY)],
            )
            .await;
        match rows {
            Ok(rows) if rows.len() == sorted.len() => Ok(Fenced::Done(())),
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
