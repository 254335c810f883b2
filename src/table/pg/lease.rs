//! Leases and members: each call one autocommit statement, every expiry
//! set and every remaining time computed on the database's
//! `clock_timestamp()` (S-T20..S-T22).

use std::time::Duration;

use tokio_postgres::types::Type;

use super::{error, from_micros, micros, to_i64, to_u64, PgStore};
use crate::core::relay::{StoreError, StoreErrorKind};
use crate::table::store::{Acquire, Acquired, LeaseKey, LeaseRow, Member};

/// Micros left until `expiry` at `c.t`, zero when past (or `-infinity`).
const LEFT: &str = "CASE WHEN x.expiry > c.t \
     THEN (extract(epoch FROM x.expiry - c.t) * 1000000)::bigint ELSE 0 END";

pub(super) async fn acquire(store: &PgStore, request: &Acquire) -> Result<Acquired, StoreError> {
    let sql = format!(
        "WITH c AS MATERIALIZED (SELECT clock_timestamp() AS t), \
         up AS (UPDATE {lease} l SET owner = $2, epoch = greatest(l.epoch, $3) + 1, \
                       expiry = c.t + $4 * interval '1 microsecond', acquired_at = c.t \
                FROM c WHERE l.partition = $1 AND l.expiry <= c.t \
                RETURNING l.epoch) \
         SELECT (SELECT epoch FROM up), x.owner, x.epoch, {LEFT} \
         FROM {lease} x, c WHERE x.partition = $1",
        lease = store.names.lease
    );
    let client = store.client().await?;
    let row = client
        .query_typed_opt(
            &sql,
            &[
                (&(request.partition as i32), Type::INT4),
                (&request.owner, Type::TEXT),
                (&to_i64(request.above), Type::INT8),
                (&micros(request.ttl), Type::INT8),
            ],
        )
        .await
        .map_err(error)?;
    let Some(row) = row else {
        return Err(StoreError::new(
            StoreErrorKind::Refused,
            None,
            format!("no partition {} in the lease table", request.partition),
        ));
    };
    if let Some(epoch) = row.get::<_, Option<i64>>(0) {
        return Ok(Acquired::Taken {
            epoch: to_u64(epoch),
        });
    }
    Ok(Acquired::Held {
        owner: row.get::<_, Option<String>>(1).unwrap_or_default(),
        epoch: to_u64(row.get(2)),
        expires_in: from_micros(row.get(3)),
    })
}

pub(super) async fn renew(
    store: &PgStore,
    lease: &LeaseKey,
    ttl: Duration,
) -> Result<bool, StoreError> {
    let sql = format!(
        "UPDATE {} SET expiry = clock_timestamp() + $4 * interval '1 microsecond' \
         WHERE partition = $1 AND owner = $2 AND epoch = $3 AND expiry > clock_timestamp()",
        store.names.lease
    );
    let client = store.client().await?;
    let n = client
        .execute_typed(
            &sql,
            &[
                (&(lease.partition as i32), Type::INT4),
                (&lease.owner, Type::TEXT),
                (&to_i64(lease.epoch), Type::INT8),
                (&micros(ttl), Type::INT8),
            ],
        )
        .await
        .map_err(error)?;
    Ok(n == 1)
}

pub(super) async fn release(store: &PgStore, lease: &LeaseKey) -> Result<bool, StoreError> {
    let sql = format!(
        "WITH r AS (UPDATE {lease} SET expiry = least(expiry, clock_timestamp()) \
                    WHERE partition = $1 AND owner = $2 AND epoch = $3 RETURNING partition), \
         f AS (DELETE FROM {in_flight} WHERE partition IN (SELECT partition FROM r)) \
         SELECT count(*) FROM r",
        lease = store.names.lease,
        in_flight = store.names.in_flight,
    );
    let client = store.client().await?;
    let row = client
        .query_typed_one(
            &sql,
            &[
                (&(lease.partition as i32), Type::INT4),
                (&lease.owner, Type::TEXT),
                (&to_i64(lease.epoch), Type::INT8),
            ],
        )
        .await
        .map_err(error)?;
    Ok(row.get::<_, i64>(0) == 1)
}

pub(super) async fn leases(store: &PgStore) -> Result<Vec<LeaseRow>, StoreError> {
    let sql = format!(
        "WITH c AS MATERIALIZED (SELECT clock_timestamp() AS t) \
         SELECT x.partition, x.owner, x.epoch, {LEFT} FROM {lease} x, c ORDER BY x.partition",
        lease = store.names.lease
    );
    let client = store.client().await?;
    let rows = client.query_typed(&sql, &[]).await.map_err(error)?;
    Ok(rows
        .iter()
        .map(|r| LeaseRow {
            partition: u32::try_from(r.get::<_, i32>(0)).unwrap_or(0),
            owner: r.get(1),
            epoch: to_u64(r.get(2)),
            expires_in: from_micros(r.get(3)),
        })
        .collect())
}

pub(super) async fn heartbeat(
    store: &PgStore,
    instance: &str,
    ttl: Duration,
) -> Result<(), StoreError> {
    let sql = format!(
        "INSERT INTO {member} (instance, expiry) \
         VALUES ($1, clock_timestamp() + $2 * interval '1 microsecond') \
         ON CONFLICT (instance) DO UPDATE SET expiry = EXCLUDED.expiry",
        member = store.names.member
    );
    let client = store.client().await?;
    client
        .execute_typed(&sql, &[(&instance, Type::TEXT), (&micros(ttl), Type::INT8)])
        .await
        .map_err(error)?;
    Ok(())
}

pub(super) async fn leave(store: &PgStore, instance: &str) -> Result<(), StoreError> {
    let sql = format!("DELETE FROM {} WHERE instance = $1", store.names.member);
    let client = store.client().await?;
    client
        .execute_typed(&sql, &[(&instance, Type::TEXT)])
        .await
        .map_err(error)?;
    Ok(())
}

pub(super) async fn members(store: &PgStore) -> Result<Vec<Member>, StoreError> {
    let sql = format!(
        "WITH c AS MATERIALIZED (SELECT clock_timestamp() AS t) \
         SELECT x.instance, {LEFT} FROM {member} x, c ORDER BY x.instance",
        member = store.names.member
    );
    let client = store.client().await?;
    let rows = client.query_typed(&sql, &[]).await.map_err(error)?;
    Ok(rows
        .iter()
        .map(|r| Member {
            instance: r.get(0),
            expires_in: from_micros(r.get(1)),
        })
        .collect())
}
