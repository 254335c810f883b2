//! The dead-letter table: listing, redrive and retention (S-T13).

use std::time::Duration;

use tokio_postgres::types::Type;

use super::{error, micros, to_u64, PgStore};
use crate::core::relay::StoreError;
use crate::table::store::DeadRow;

pub(super) async fn dead_letters(store: &PgStore, limit: u32) -> Result<Vec<DeadRow>, StoreError> {
    let sql = format!(
        "SELECT id, tenant, item, codec_version, reason, attempts, crashes, epoch \
         FROM {} ORDER BY dead_at, id LIMIT $1",
        store.names.dead
    );
    let client = store.client().await?;
    let rows = client
        .query_typed(&sql, &[(&i64::from(limit), Type::INT8)])
        .await
        .map_err(error)?;
    Ok(rows
        .iter()
        .map(|r| DeadRow {
            id: r.get(0),
            tenant: r.get(1),
            item: r.get(2),
            codec_version: u32::try_from(r.get::<_, i64>(3)).unwrap_or(u32::MAX),
            reason: r.get(4),
            attempts: u32::try_from(r.get::<_, i32>(5)).unwrap_or(0),
            crashes: u32::try_from(r.get::<_, i32>(6)).unwrap_or(0),
            epoch: to_u64(r.get(7)),
        })
        .collect())
}

pub(super) async fn redrive(store: &PgStore, ids: &[i64]) -> Result<u64, StoreError> {
    let n = &store.names;
    let sql = format!(
        "WITH back AS (DELETE FROM {dead} WHERE id = ANY($1::bigint[]) \
                       RETURNING id, xid, tenant, item, codec_version), \
         ins AS (INSERT INTO {outbox} (partition, tenant, item, codec_version) \
                 SELECT {partition_fn}(tenant), tenant, item, codec_version FROM back \
                 ORDER BY xid, id RETURNING 1) \
         SELECT count(*) FROM ins",
        dead = n.dead,
        outbox = n.outbox,
        partition_fn = n.partition_fn,
    );
    let client = store.client().await?;
    let row = client
        .query_typed_one(&sql, &[(&ids, Type::INT8_ARRAY)])
        .await
        .map_err(error)?;
    Ok(to_u64(row.get(0)))
}

pub(super) async fn purge(store: &PgStore, older_than: Duration) -> Result<u64, StoreError> {
    let sql = format!(
        "DELETE FROM {} WHERE dead_at < clock_timestamp() - $1 * interval '1 microsecond'",
        store.names.dead
    );
    let client = store.client().await?;
    let n = client
        .execute_typed(&sql, &[(&micros(older_than), Type::INT8)])
        .await
        .map_err(error)?;
    Ok(n)
}
