//! A service-shaped example: request handlers stage usage records (one
//! per API call, say) through an [`Outbox`] into PostgreSQL, without ever
//! waiting for the database; at the end the service shuts down, prints
//! the accounting and its metrics in Prometheus text format, and checks in
//! SQL that every record is there exactly once, per tenant in staging
//! order.
//!
//! ```sh
//! cargo run --release --example usage_records --features postgres
//! ```
//!
//! Environment:
//! - `OUTBOX_EXAMPLE_POSTGRES_URL` (or `OUTBOX_TEST_POSTGRES_URL`; default
//!   `postgres://postgres@127.0.0.1:5432/test`): the server. The example
//!   creates the table `outbox_example_usage_records`, empties it first
//!   and drops it at the end (set `OUTBOX_EXAMPLE_KEEP=1` to keep it).
//! - `OUTBOX_EXAMPLE_RECORDS` (default 1,000,000) and
//!   `OUTBOX_EXAMPLE_TENANTS` (default 10,000): the load;
//!   `OUTBOX_EXAMPLE_CONCURRENCY` (default 16): writes in flight and pool
//!   size.
//! - `OUTBOX_EXAMPLE_SLICES` (default 64): fan-in, tenants' slices per
//!   write (S-F1; 1 writes one tenant per transaction), and
//!   `OUTBOX_EXAMPLE_GROUP_ITEMS` (default 1,000): items per group at most.
//! - `OUTBOX_EXAMPLE_BASELINE=0` skips the bare loader: by default, the
//!   same rows go first through a bare loader (multi-row
//!   `INSERT ... ON CONFLICT DO NOTHING` in batches of the group size, on
//!   the same pool and table, no outbox); the example prints both rates
//!   and their ratio.
//!
//! Exits non-zero when a record is missing, repeated or out of order, or
//! when anything was lost or dropped.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use metrics_exporter_prometheus::PrometheusBuilder;
use outbox::core::{DropReason, LostReason};
use outbox::sinks::postgres::PostgresSink;
use outbox::sinks::{Envelope, Record};
use outbox::{Config, Outbox, Staged, TenantId};
use tokio_postgres::NoTls;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const TABLE: &str = "outbox_example_usage_records";
/// Tasks staging records, like request handlers on several connections.
const STAGERS: usize = 8;
/// Writes in flight, and connections in the pool (one per write); set
/// `OUTBOX_EXAMPLE_CONCURRENCY` to try another.
const CONCURRENCY: usize = 16;
/// Items per write: a tenant's backlog up to this goes in one transaction.
const MAX_BATCH: usize = 1_000;
/// How long a short backlog waits for company before it is written.
const LINGER: Duration = Duration::from_millis(20);
const SHUTDOWN_DEADLINE: Duration = Duration::from_secs(300);

fn env_usize(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(default)
}

/// A usage record: `n` is its position in its tenant's staging order.
fn record(n: usize, units: usize) -> Envelope {
    Envelope::new(format!(r#"{{"n":{n},"meter":"api_calls","units":{units}}}"#).into_bytes())
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("usage_records: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<bool, BoxError> {
    let records = env_usize("OUTBOX_EXAMPLE_RECORDS", 1_000_000);
    let tenants = env_usize("OUTBOX_EXAMPLE_TENANTS", 10_000).clamp(1, records.max(1));
    let concurrency = env_usize("OUTBOX_EXAMPLE_CONCURRENCY", CONCURRENCY).max(1);
    let url = std::env::var("OUTBOX_EXAMPLE_POSTGRES_URL")
        .or_else(|_| std::env::var("OUTBOX_TEST_POSTGRES_URL"))
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());

    // Metrics: the recorder must be in place before the outbox is built.
    let prometheus = PrometheusBuilder::new().install_recorder()?;

    let pg: tokio_postgres::Config = url.parse()?;
    let (admin, conn) = pg.connect(NoTls).await?;
    tokio::spawn(conn);
    let manager = Manager::from_config(
        pg,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    let pool = Pool::builder(manager)
        .max_size(concurrency)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(Duration::from_secs(5)))
        .create_timeout(Some(Duration::from_secs(5)))
        .recycle_timeout(Some(Duration::from_secs(5)))
        .build()?;
    let sink = PostgresSink::<Envelope>::new(pool, TABLE)?;
    admin
        .batch_execute(&format!("DROP TABLE IF EXISTS \"{TABLE}\""))
        .await?;
    sink.create_table().await?;

    let slices = env_usize("OUTBOX_EXAMPLE_SLICES", 64).max(1);
    let group_items = env_usize("OUTBOX_EXAMPLE_GROUP_ITEMS", MAX_BATCH).max(1);
    let baseline = if std::env::var("OUTBOX_EXAMPLE_BASELINE").as_deref() == Ok("0") {
        None
    } else {
        let ids: Vec<TenantId> = (0..tenants).map(|_| TenantId::new_v7()).collect();
        let rate = bare_loader(sink.pool(), &ids, records, group_items, concurrency).await?;
        admin
            .batch_execute(&format!("TRUNCATE \"{TABLE}\""))
            .await?;
        println!(
            "bare loader: {records} rows in batches of {group_items} over {concurrency} \
             connections: {rate:.0} rows/s"
        );
        Some(rate)
    };

    let config = Config::builder()
        .concurrency(concurrency)
        .max_slices_per_write(slices)
        .max_group_items(group_items)
        .max_batch(MAX_BATCH)
        .linger(LINGER)
        .write_timeout(Duration::from_secs(30))
        .build()?;
    let outbox = Outbox::builder(sink).config(config).build()?;
    println!(
        "staging {records} usage records over {tenants} tenants from {STAGERS} tasks into \
         {TABLE} (concurrency {concurrency}, pool {concurrency}, max_batch {MAX_BATCH}, \
         linger {LINGER:?})"
    );

    // Progress: a line per second.
    let done = Arc::new(AtomicBool::new(false));
    let progress = tokio::spawn(progress(outbox.clone(), Arc::clone(&done)));

    // Each stager owns the tenants i with i % STAGERS == its index and
    // stages round-robin over them, so a tenant's records are staged by
    // one task, in the order of `n`.
    let ids: Arc<Vec<TenantId>> = Arc::new((0..tenants).map(|_| TenantId::new_v7()).collect());
    let start = Instant::now();
    let stagers: Vec<_> = (0..STAGERS)
        .map(|s| {
            let (outbox, ids) = (outbox.clone(), Arc::clone(&ids));
            tokio::spawn(async move {
                let mut not_accepted = 0u64;
                let mut staged = 0usize;
                for n in 0.. {
                    for t in (s..ids.len()).step_by(STAGERS) {
                        // Tenant t gets records n * tenants + t < records.
                        if n * ids.len() + t >= records {
                            return not_accepted;
                        }
                        if outbox.stage(ids[t], record(n, 1 + (n + t) % 7)) != Staged::Accepted {
                            not_accepted += 1;
                        }
                        staged += 1;
                        if staged % 256 == 0 {
                            // A request handler awaits other things too.
                            tokio::task::yield_now().await;
                        }
                    }
                }
                not_accepted
            })
        })
        .collect();
    let mut not_accepted = 0;
    for s in stagers {
        not_accepted += s.await?;
    }
    let staged_in = start.elapsed();

    let report = outbox.shutdown(SHUTDOWN_DEADLINE).await;
    let elapsed = start.elapsed();
    done.store(true, Ordering::Relaxed);
    progress.await?;

    let c = outbox.counters();
    println!();
    println!(
        "staged {} records in {:.2?} ({:.0} records/s staged)",
        c.staged,
        staged_in,
        c.staged as f64 / staged_in.as_secs_f64()
    );
    println!(
        "written {} records in {:.2?}: {:.0} records/s end to end, {} writes ({:.1} records per \
         write), {} failed attempts",
        c.written,
        elapsed,
        c.written as f64 / elapsed.as_secs_f64(),
        c.writes,
        c.written as f64 / c.writes.max(1) as f64,
        c.failed_attempts
    );
    if let Some(bare) = baseline {
        let rate = c.written as f64 / elapsed.as_secs_f64();
        println!(
            "outbox {rate:.0} records/s vs bare loader {bare:.0} rows/s: ratio {:.2} \
             (target >= 0.7; {slices} slices per write)",
            rate / bare
        );
    }
    println!(
        "shutdown (items pending at the fence): written {}, lost {}, dropped {}, deadline passed {}, dead letters {}",
        report.written,
        report.lost,
        report.dropped,
        report.deadline_passed,
        report.unwritten.iter().map(|r| r.items.len()).sum::<usize>()
    );
    let lost: Vec<String> = LostReason::ALL
        .iter()
        .map(|&r| format!("{r}={}", c.lost(r)))
        .collect();
    let dropped: Vec<String> = DropReason::ALL
        .iter()
        .map(|&r| format!("{r}={}", c.dropped(r)))
        .collect();
    println!(
        "accounting: staged {} = written {} + pending {} + lost {} + dropped {}",
        c.staged,
        c.written,
        c.pending,
        c.lost_total(),
        c.dropped_total()
    );
    println!("  lost by reason:    {}", lost.join(" "));
    println!("  dropped by reason: {}", dropped.join(" "));
    println!();
    println!("# metrics (Prometheus text format)");
    print!("{}", prometheus.render());
    println!();

    let mut ok = c.balanced() && not_accepted == 0;
    if c.lost_total() + c.dropped_total() > 0 || c.written != records as u64 {
        println!(
            "FAIL: {} of {records} records written, {} lost, {} dropped",
            c.written,
            c.lost_total(),
            c.dropped_total()
        );
        ok = false;
    }
    ok &= verify(&admin, records, tenants).await?;
    if std::env::var_os("OUTBOX_EXAMPLE_KEEP").is_none() {
        admin
            .batch_execute(&format!("DROP TABLE \"{TABLE}\""))
            .await?;
    }
    println!("{}", if ok { "OK" } else { "FAILED" });
    Ok(ok)
}

/// The bare loader: the rows the stagers make, in the order they make
/// them (round-robin over the tenants), inserted in batches of `batch`
/// rows by `concurrency` tasks, each batch one multi-row `INSERT ... ON
/// CONFLICT DO NOTHING`, no outbox. Returns rows per second.
async fn bare_loader(
    pool: &Pool,
    ids: &[TenantId],
    records: usize,
    batch: usize,
    concurrency: usize,
) -> Result<f64, BoxError> {
    let mut rows: Vec<(uuid::Uuid, uuid::Uuid, Vec<u8>)> = Vec::with_capacity(records);
    'fill: for n in 0.. {
        for (t, id) in ids.iter().enumerate() {
            if n * ids.len() + t >= records {
                break 'fill;
            }
            let r = record(n, 1 + (n + t) % 7);
            rows.push((id.0, Record::id(&r), Record::payload(&r).to_vec()));
        }
    }
    let sql = format!(
        "INSERT INTO \"{TABLE}\" (tenant, item_id, payload) \
         SELECT u.tenant, u.item_id, u.payload \
         FROM UNNEST($1::uuid[], $2::uuid[], $3::bytea[]) AS u(tenant, item_id, payload) \
         ON CONFLICT (tenant, item_id) DO NOTHING"
    );
    let rows = Arc::new(rows);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let (pool, rows, next, sql) = (
                pool.clone(),
                Arc::clone(&rows),
                Arc::clone(&next),
                sql.clone(),
            );
            tokio::spawn(async move {
                let client = pool.get().await?;
                let stmt = client.prepare_cached(&sql).await?;
                loop {
                    let at = next.fetch_add(batch, Ordering::Relaxed);
                    if at >= rows.len() {
                        return Ok::<(), BoxError>(());
                    }
                    let chunk = &rows[at..(at + batch).min(rows.len())];
                    let tenants: Vec<uuid::Uuid> = chunk.iter().map(|r| r.0).collect();
                    let items: Vec<uuid::Uuid> = chunk.iter().map(|r| r.1).collect();
                    let payloads: Vec<&[u8]> = chunk.iter().map(|r| r.2.as_slice()).collect();
                    client
                        .execute(&stmt, &[&tenants, &items, &payloads])
                        .await?;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await??;
    }
    Ok(records as f64 / start.elapsed().as_secs_f64())
}

/// Prints staged, written, pending and the write rate once a second.
async fn progress<S: outbox::Sink>(outbox: Outbox<S>, done: Arc<AtomicBool>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.tick().await;
    let start = Instant::now();
    let mut last = 0;
    while !done.load(Ordering::Relaxed) {
        tick.tick().await;
        let c = outbox.counters();
        println!(
            "{:>5.1}s  staged {:>9}  written {:>9}  pending {:>9}  rate {:>7} records/s",
            start.elapsed().as_secs_f64(),
            c.staged,
            c.written,
            c.pending,
            c.written - last
        );
        last = c.written;
    }
}

/// Checks in SQL that every record is there exactly once and that each
/// tenant's rows, in `seq` order, are its records in staging order.
async fn verify(
    admin: &tokio_postgres::Client,
    records: usize,
    tenants: usize,
) -> Result<bool, BoxError> {
    let started = Instant::now();
    let row = admin
        .query_one(
            &format!(
                "WITH r AS ( \
                   SELECT tenant, seq, (convert_from(payload, 'UTF8')::jsonb->>'n')::bigint AS n \
                   FROM \"{TABLE}\") \
                 SELECT \
                   (SELECT count(*) FROM r), \
                   (SELECT count(DISTINCT (tenant, n)) FROM r), \
                   (SELECT count(DISTINCT tenant) FROM r), \
                   (SELECT count(*) FROM ( \
                      SELECT n, row_number() OVER (PARTITION BY tenant ORDER BY seq) - 1 AS pos \
                      FROM r) o WHERE n <> pos)"
            ),
            &[],
        )
        .await?;
    let (count, distinct, tenants_seen, out_of_order): (i64, i64, i64, i64) =
        (row.get(0), row.get(1), row.get(2), row.get(3));
    println!(
        "verify ({:.2?}): rows {count}, distinct (tenant, n) {distinct}, tenants {tenants_seen}, \
         rows out of staging order {out_of_order}",
        started.elapsed()
    );
    let want_tenants = tenants.min(records) as i64;
    let ok = count == records as i64
        && distinct == records as i64
        && tenants_seen == want_tenants
        && out_of_order == 0;
    if !ok {
        println!(
            "FAIL: want {records} rows, all distinct, over {want_tenants} tenants, none out of \
             order"
        );
    }
    Ok(ok)
}
