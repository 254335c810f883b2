//! The fenced writes: removals, in-flight records and crash counts, each
//! one statement whose first step takes a shared lock on the fence's lease
//! rows and keeps only those still held (S-T11).

use tokio_postgres::types::Type;

use super::{error, single, to_i64, PgStore};
use crate::core::relay::{Fence, Fenced, InFlight, Recorded, Removal, Removed, StoreError};

/// The lease rows still held under `$1` (partitions), `$2` (epochs) and
/// `$3` (owner), share-locked so a takeover's update waits for this
/// statement (and this statement sees a committed takeover).
fn held_cte(store: &PgStore) -> String {
    format!(
        "held AS (SELECT l.partition, l.epoch FROM {lease} l \
                  JOIN unnest($1::int[], $2::bigint[]) AS f(p, e) \
                    ON l.partition = f.p AND l.epoch = f.e \
                  WHERE l.owner = $3 FOR SHARE OF l)",
        lease = store.names.lease
    )
}

fn fence_params(fence: &Fence) -> (Vec<i32>, Vec<i64>) {
    fence
        .epochs
        .iter()
        .map(|&(p, e)| (p as i32, to_i64(e)))
        .unzip()
}

/// The removal. Its deletes take the fence's partitions as an array
/// (an init plan), not as a join: joined, the planner walks every held
/// partition's rows through the read index to find the ids (about 100 ms
/// a removal at 50,000 rows), where the array lets it probe the primary
/// key, or filter one bitmap scan, in a few ms.
fn remove_sql(store: &PgStore) -> String {
    let n = &store.names;
    format!(
        "WITH {held}, \
         gone AS (DELETE FROM {outbox} o \
                  WHERE o.id = ANY($4::bigint[]) \
                    AND o.partition = ANY(ARRAY(SELECT partition FROM held)) RETURNING o.id), \
         moved AS (DELETE FROM {outbox} o USING held h, \
                          unnest($5::bigint[], $6::text[], $7::int[]) AS d(id, reason, attempts) \
                   WHERE o.id = d.id AND o.partition = h.partition \
                   RETURNING o.*, d.reason, d.attempts, h.epoch), \
         dead AS (INSERT INTO {dead} (id, xid, partition, tenant, item, codec_version, staged_at, \
                                      reason, attempts, crashes, epoch) \
                  SELECT m.id, m.xid, m.partition, m.tenant, m.item, m.codec_version, \
                         m.staged_at, m.reason, m.attempts, coalesce(c.crashes, 0), m.epoch \
                  FROM moved m LEFT JOIN {crashes} c ON c.id = m.id \
                  ON CONFLICT (id) DO NOTHING RETURNING id), \
         ended AS (SELECT id FROM gone UNION ALL SELECT id FROM moved), \
         cr AS (DELETE FROM {crashes} WHERE id IN (SELECT id FROM ended)), \
         inf AS (DELETE FROM {in_flight} f \
                 WHERE f.first_id = ANY($8::bigint[]) \
                   AND f.partition = ANY(ARRAY(SELECT partition FROM held))) \
         SELECT array(SELECT id FROM gone ORDER BY id), array(SELECT id FROM moved ORDER BY id), \
                array(SELECT f.p FROM unnest($1::int[]) AS f(p) \
                      WHERE f.p NOT IN (SELECT partition FROM held) ORDER BY f.p)",
        held = held_cte(store),
        outbox = n.outbox,
        dead = n.dead,
        crashes = n.crashes,
        in_flight = n.in_flight,
    )
}

pub(super) async fn remove(
    store: &PgStore,
    fence: &Fence,
    removal: &Removal,
) -> Result<Removed, StoreError> {
    let (ps, es) = fence_params(fence);
    let ids: Vec<i64> = removal.delete.clone();
    let dead_ids: Vec<i64> = removal.dead.iter().map(|d| d.id).collect();
    let reasons: Vec<&str> = removal.dead.iter().map(|d| d.reason.as_str()).collect();
    let attempts: Vec<i32> = removal
        .dead
        .iter()
        .map(|d| i32::try_from(d.attempts).unwrap_or(i32::MAX))
        .collect();
    let client = store.client().await?;
    let types = [
        Type::INT4_ARRAY,
        Type::INT8_ARRAY,
        Type::TEXT,
        Type::INT8_ARRAY,
        Type::INT8_ARRAY,
        Type::TEXT_ARRAY,
        Type::INT4_ARRAY,
        Type::INT8_ARRAY,
    ];
    let statement = client
        .prepare_typed_cached(&remove_sql(store), &types)
        .await
        .map_err(error)?;
    let row = client
        .query_one(
            &statement,
            &[
                &ps,
                &es,
                &fence.owner,
                &ids,
                &dead_ids,
                &reasons,
                &attempts,
                &removal.records,
            ],
        )
        .await
        .map_err(error)?;
    let stale: Vec<i32> = row.get(2);
    Ok(Removed {
        deleted: row.get(0),
        dead: row.get(1),
        stale: stale.into_iter().map(|p| p as u32).collect(),
    })
}

fn record_sql(store: &PgStore) -> String {
    format!(
        "WITH {held}, \
         r AS (SELECT u.id, u.rec, u.ord \
               FROM unnest($4::bigint[], $5::int[]) WITH ORDINALITY AS u(id, rec, ord)), \
         recs AS (SELECT x.partition, x.rec \
                  FROM unnest($6::int[]) WITH ORDINALITY AS x(partition, rec)), \
         g AS (SELECT recs.partition, array_agg(r.id ORDER BY r.ord) AS ids \
               FROM r JOIN recs ON recs.rec = r.rec GROUP BY recs.rec, recs.partition), \
         ins AS (INSERT INTO {in_flight} (first_id, partition, ids, epoch) \
                 SELECT g.ids[1], g.partition, g.ids, h.epoch \
                 FROM g JOIN held h ON h.partition = g.partition \
                 ON CONFLICT (first_id) DO UPDATE \
                   SET partition = EXCLUDED.partition, ids = EXCLUDED.ids, epoch = EXCLUDED.epoch \
                 RETURNING 1) \
         SELECT array(SELECT f.p FROM unnest($1::int[]) AS f(p) \
                      WHERE f.p NOT IN (SELECT partition FROM held) ORDER BY f.p), \
                (SELECT count(*) FROM ins)",
        held = held_cte(store),
        in_flight = store.names.in_flight,
    )
}

/// Every record in one statement: its rows flattened with their record's
/// index, each record's partition by index.
pub(super) async fn record_attempts(
    store: &PgStore,
    fence: &Fence,
    records: &[InFlight],
) -> Result<Recorded, StoreError> {
    let (ps, es) = fence_params(fence);
    let mut ids: Vec<i64> = Vec::new();
    let mut recs: Vec<i32> = Vec::new();
    for (i, r) in records.iter().enumerate() {
        let index = i32::try_from(i + 1).unwrap_or(i32::MAX);
        ids.extend(&r.ids);
        recs.extend(std::iter::repeat_n(index, r.ids.len()));
    }
    let partitions: Vec<i32> = records.iter().map(|r| r.partition as i32).collect();
    let client = store.client().await?;
    let types = [
        Type::INT4_ARRAY,
        Type::INT8_ARRAY,
        Type::TEXT,
        Type::INT8_ARRAY,
        Type::INT4_ARRAY,
        Type::INT4_ARRAY,
    ];
    let statement = client
        .prepare_typed_cached(&record_sql(store), &types)
        .await
        .map_err(error)?;
    let row = client
        .query_one(
            &statement,
            &[&ps, &es, &fence.owner, &ids, &recs, &partitions],
        )
        .await
        .map_err(error)?;
    let stale: Vec<i32> = row.get(0);
    Ok(Recorded {
        stale: stale.into_iter().map(|p| p as u32).collect(),
    })
}

pub(super) async fn record_crashes(
    store: &PgStore,
    fence: &Fence,
    partition: u32,
) -> Result<Fenced<u64>, StoreError> {
    let (_, epoch) = single(fence)?;
    let n = &store.names;
    let sql = format!(
        "WITH {held}, \
         gone AS (DELETE FROM {in_flight} f WHERE f.partition = $4 \
                  AND EXISTS (SELECT 1 FROM held) RETURNING f.ids), \
         rows AS (SELECT u.id, count(*)::int AS n FROM gone, unnest(gone.ids) AS u(id) \
                  WHERE EXISTS (SELECT 1 FROM {outbox} o WHERE o.id = u.id) GROUP BY u.id), \
         up AS (INSERT INTO {crashes} (id, partition, crashes) SELECT id, $4, n FROM rows \
                ON CONFLICT (id) DO UPDATE SET crashes = {crashes}.crashes + EXCLUDED.crashes \
                RETURNING 1) \
         SELECT EXISTS (SELECT 1 FROM held), (SELECT count(*) FROM up)",
        held = held_cte(store),
        in_flight = n.in_flight,
        outbox = n.outbox,
        crashes = n.crashes,
    );
    let client = store.client().await?;
    let row = client
        .query_typed_one(
            &sql,
            &[
                (&vec![partition as i32], Type::INT4_ARRAY),
                (&vec![to_i64(epoch)], Type::INT8_ARRAY),
                (&fence.owner, Type::TEXT),
                (&(partition as i32), Type::INT4),
            ],
        )
        .await
        .map_err(error)?;
    let held: bool = row.get(0);
    let count: i64 = row.get(1);
    Ok(if held {
        Fenced::Done(super::to_u64(count))
    } else {
        Fenced::Stale
    })
}
