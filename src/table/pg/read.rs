//! The page read: every partition read and every tenant read of a request
//! in one statement (one snapshot), with the snapshot's xmin.

use tokio_postgres::types::Type;

use super::{error, from_micros, to_i64, to_u64, PgStore};
use crate::core::relay::{Page, PageRequest, Position, ReadOrder, Row, StoreError};

/// The columns every arm selects, after the read's index `k`. A row's
/// crash count is looked up only when the crash table holds any (it is
/// empty but after a crash, S-T17): a join probed it once per row read,
/// half the read's time.
fn columns(crashes: &str) -> String {
    format!(
        "o.id, o.xid::text::bigint, o.partition, o.tenant, o.item, o.codec_version, \
         greatest((extract(epoch FROM s.t - o.staged_at) * 1000000)::bigint, 0), \
         CASE WHEN s.crashed \
              THEN coalesce((SELECT c.crashes FROM {crashes} c WHERE c.id = o.id), 0) \
              ELSE 0 END, \
         s.xmin::text::bigint"
    )
}

fn page_sql(store: &PgStore, order: ReadOrder) -> String {
    let n = &store.names;
    let (outbox, crashes) = (&n.outbox, &n.crashes);
    let columns = columns(crashes);
    let (p_filter, p_order, t_filter) = match order {
        ReadOrder::Watermark => (
            "o.partition = r.p AND (o.xid, o.id) > (r.ax::text::xid8, r.ai) AND o.xid < s.xmin",
            "o.xid, o.id",
            "o.tenant = r.t AND (o.xid, o.id) > (r.ax::text::xid8, r.ai) \
             AND (o.xid, o.id) <= (r.ux::text::xid8, r.ui) AND o.xid < s.xmin",
        ),
        ReadOrder::IdAboveLastSeen => (
            "o.partition = r.p AND o.id > r.ai",
            "o.id",
            "o.tenant = r.t AND o.id > r.ai AND o.id <= r.ui",
        ),
    };
    format!(
        "WITH s AS MATERIALIZED (\
             SELECT pg_snapshot_xmin(pg_current_snapshot()) AS xmin, clock_timestamp() AS t, \
                    EXISTS (SELECT 1 FROM {crashes}) AS crashed) \
         SELECT r.k::bigint, {columns} \
         FROM s, unnest($1::int[], $2::bigint[], $3::bigint[], $4::int[]) \
              WITH ORDINALITY AS r(p, ax, ai, lim, k) \
         CROSS JOIN LATERAL (SELECT * FROM {outbox} o WHERE {p_filter} \
                             ORDER BY {p_order} LIMIT r.lim) o \
         UNION ALL \
         SELECT -r.k::bigint, {columns} \
         FROM s, unnest($5::bytea[], $6::bigint[], $7::bigint[], $8::bigint[], $9::bigint[], \
                        $10::int[]) WITH ORDINALITY AS r(t, ax, ai, ux, ui, lim, k) \
         CROSS JOIN LATERAL (SELECT * FROM {outbox} o WHERE {t_filter} \
                             ORDER BY {p_order} LIMIT r.lim) o \
         UNION ALL \
         SELECT 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, s.xmin::text::bigint FROM s"
    )
}

fn after(p: Option<Position>) -> (i64, i64) {
    p.map_or((0, 0), |p| (to_i64(p.xid), p.id))
}

fn limit(l: u32) -> i32 {
    i32::try_from(l.max(1)).unwrap_or(i32::MAX)
}

pub(super) async fn read_page(store: &PgStore, request: &PageRequest) -> Result<Page, StoreError> {
    let parts = &request.partitions;
    let p: Vec<i32> = parts.iter().map(|r| r.partition as i32).collect();
    let (pax, pai): (Vec<i64>, Vec<i64>) = parts.iter().map(|r| after(r.after)).unzip();
    let plim: Vec<i32> = parts.iter().map(|r| limit(r.limit)).collect();
    let tens = &request.tenants;
    let t: Vec<&[u8]> = tens.iter().map(|r| r.tenant.as_slice()).collect();
    let (tax, tai): (Vec<i64>, Vec<i64>) = tens.iter().map(|r| after(r.after)).unzip();
    let (tux, tui): (Vec<i64>, Vec<i64>) = tens.iter().map(|r| after(Some(r.until))).unzip();
    let tlim: Vec<i32> = tens.iter().map(|r| limit(r.limit)).collect();
    let client = store.client().await?;
    let types = [
        Type::INT4_ARRAY,
        Type::INT8_ARRAY,
        Type::INT8_ARRAY,
        Type::INT4_ARRAY,
        Type::BYTEA_ARRAY,
        Type::INT8_ARRAY,
        Type::INT8_ARRAY,
        Type::INT8_ARRAY,
        Type::INT8_ARRAY,
        Type::INT4_ARRAY,
    ];
    // Prepared once per connection: parsing and planning this statement
    // for every page cost the server more than running it.
    let statement = client
        .prepare_typed_cached(&page_sql(store, request.order), &types)
        .await
        .map_err(error)?;
    let rows = client
        .query(
            &statement,
            &[&p, &pax, &pai, &plim, &t, &tax, &tai, &tux, &tui, &tlim],
        )
        .await
        .map_err(error)?;
    let mut page = Page {
        xmin: 0,
        partitions: vec![Vec::new(); parts.len()],
        tenants: vec![Vec::new(); tens.len()],
    };
    for r in rows {
        let k: i64 = r.get(0);
        page.xmin = to_u64(r.get(9));
        let Some(id) = r.get::<_, Option<i64>>(1) else {
            continue;
        };
        let row = Row {
            id,
            xid: to_u64(r.get(2)),
            partition: u32::try_from(r.get::<_, i32>(3)).unwrap_or(0),
            tenant: r.get(4),
            item: r.get(5),
            codec_version: u32::try_from(r.get::<_, i64>(6)).unwrap_or(u32::MAX),
            age: from_micros(r.get(7)),
            crashes: u32::try_from(r.get::<_, i32>(8)).unwrap_or(0),
        };
        let slot = if k > 0 {
            page.partitions.get_mut((k - 1) as usize)
        } else {
            page.tenants.get_mut((-k - 1) as usize)
        };
        if let Some(slot) = slot {
            slot.push(row);
        }
    }
    let key = |r: &Row| match request.order {
        ReadOrder::Watermark => r.position(),
        ReadOrder::IdAboveLastSeen => Position { xid: 0, id: r.id },
    };
    for rows in page.partitions.iter_mut().chain(page.tenants.iter_mut()) {
        rows.sort_by_key(key);
    }
    Ok(page)
}

/// `Store::horizon`: the oldest xmin-holding transaction's age and the
/// oldest row's age, in microseconds on the server's clock, one statement
/// (no `greatest`: it would turn an empty minimum into 0; clamped here).
pub(super) async fn horizon(store: &PgStore) -> Result<crate::table::store::Horizon, StoreError> {
    let sql = format!(
        "WITH c AS MATERIALIZED (SELECT clock_timestamp() AS t) \
         SELECT (SELECT (extract(epoch FROM c.t - min(s)) * 1000000)::bigint FROM ( \
                   SELECT xact_start AS s FROM pg_stat_activity \
                   WHERE pid <> pg_backend_pid() AND xact_start IS NOT NULL \
                     AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL) \
                   UNION ALL SELECT prepared FROM pg_prepared_xacts) x), \
                (SELECT (extract(epoch FROM c.t - min(staged_at)) * 1000000)::bigint \
                   FROM {}) \
         FROM c",
        store.names.outbox
    );
    let client = store.client().await?;
    let row = client.query_one(&sql, &[]).await.map_err(error)?;
    let us = |i: usize| -> Option<std::time::Duration> {
        row.get::<_, Option<i64>>(i)
            .map(|v| std::time::Duration::from_micros(v.max(0) as u64))
    };
    Ok(crate::table::store::Horizon {
        oldest_transaction: us(0),
        lag: us(1),
    })
}
