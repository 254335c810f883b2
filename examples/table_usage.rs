//! The outbox table in a service: each request handler changes a business
//! row and stages a usage record in the same PostgreSQL transaction, so
//! the record exists if and only if the change committed (a request that
//! fails rolls both back). The outbox relays the outbox table into a
//! PostgreSQL target table, checking the lease's epoch at the sink, and at
//! the end the example prints the accounting and checks in SQL that every
//! committed record is in the target exactly once, no rolled-back one is,
//! and the outbox table is empty.
//!
//! ```sh
//! cargo run --example table_usage --features table
//! ```
//!
//! Environment: `OUTBOX_EXAMPLE_POSTGRES_URL` (or `OUTBOX_TEST_POSTGRES_URL`;
//! default `postgres://postgres@127.0.0.1:5432/test`); `OUTBOX_EXAMPLE_REQUESTS`
//! (default 2,000). The example creates the tables `outbox_example_accounts`,
//! `outbox_example_usage_outbox` (and its companions) and
//! `outbox_example_usage`, and drops them at the end (set
//! `OUTBOX_EXAMPLE_KEEP=1` to keep them).
//!
//! Exits non-zero when a committed record is missing or repeated, a
//! rolled-back one was delivered, a row is left, or anything was lost.

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use outbox::sinks::postgres::{schema_sql, PostgresSink};
use outbox::sinks::Record;
use outbox::table::{migrate, OutboxTable, PgStore, Relayed, TableNames, TableRelay};
use outbox::{Config, Outbox};
use serde::{Deserialize, Serialize};
use tokio_postgres::NoTls;
use uuid::Uuid;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const ACCOUNTS: &str = "outbox_example_accounts";
const OUTBOX_TABLE: &str = "outbox_example_usage_outbox";
const TARGET: &str = "outbox_example_usage";
/// Accounts (the tenants): each account's records in causal order.
const TENANTS: u64 = 50;
/// Request handlers running at once.
const HANDLERS: u64 = 8;
/// One request in this many fails after staging: its transaction rolls
/// back, business change and usage record alike.
const FAIL_ONE_IN: u64 = 10;

/// The usage record a request stages: its own id (the sink's idempotency
/// key, so a redelivery after a crash is absorbed) and what it measured.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct UsageRecord {
    id: u128,
    payload: Vec<u8>,
}

impl Record for UsageRecord {
    fn id(&self) -> Uuid {
        Uuid::from_u128(self.id)
    }
    fn payload(&self) -> &[u8] {
        &self.payload
    }
}

type Sink = PostgresSink<Relayed<UsageRecord>, u64>;

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("table_usage: {e}");
            ExitCode::FAILURE
        }
    }
}

fn url() -> String {
    std::env::var("OUTBOX_EXAMPLE_POSTGRES_URL")
        .or_else(|_| std::env::var("OUTBOX_TEST_POSTGRES_URL"))
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

fn pool(size: usize) -> Result<Pool, BoxError> {
    let config: tokio_postgres::Config = url().parse()?;
    let manager = Manager::from_config(
        config,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Ok(Pool::builder(manager)
        .max_size(size)
        .runtime(Runtime::Tokio1)
        .build()?)
}

/// The business table, the outbox table (by the crate's migrations) and
/// the target, all fresh.
async fn set_up(admin: &mut tokio_postgres::Client, names: &TableNames) -> Result<(), BoxError> {
    tear_down(admin).await?;
    admin
        .batch_execute(&format!(
            "CREATE TABLE {ACCOUNTS} (id bigint PRIMARY KEY, used bigint NOT NULL DEFAULT 0); \
             INSERT INTO {ACCOUNTS} (id) SELECT generate_series(0, {})",
            TENANTS - 1
        ))
        .await?;
    migrate(admin, names, outbox::table::DEFAULT_PARTITIONS).await?;
    admin.batch_execute(&schema_sql::<u64>(TARGET)?).await?;
    Ok(())
}

async fn tear_down(admin: &tokio_postgres::Client) -> Result<(), BoxError> {
    let n = OUTBOX_TABLE;
    admin
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS {ACCOUNTS}, {TARGET}, {n}, {n}_dead, {n}_in_flight, \
             {n}_crashes, {n}_lease, {n}_member, {n}_sink_epoch, {n}_schema CASCADE; \
             DROP FUNCTION IF EXISTS {n}_partition(bytea), {n}_partitions()"
        ))
        .await?;
    Ok(())
}

/// A request handler: charges `units` to `account` and stages the usage
/// record in the same transaction. Answers whether it committed.
async fn handle_request(
    pool: &Pool,
    table: &OutboxTable<u64, UsageRecord>,
    account: u64,
    request: u64,
    units: i64,
) -> Result<bool, BoxError> {
    let mut client = pool.get().await?;
    // The plain tokio-postgres transaction (the pool's wrapper caches
    // statements; staging needs none of that).
    let tx = tokio_postgres::Client::transaction(&mut client).await?;
    tx.execute(
        &format!("UPDATE {ACCOUNTS} SET used = used + $2 WHERE id = $1"),
        &[&i64::try_from(account)?, &units],
    )
    .await?;
    let record = UsageRecord {
        id: u128::from(request),
        payload: format!("account={account} units={units}").into_bytes(),
    };
    table.stage(&tx, &account, &record).await?;
    if request % FAIL_ONE_IN == FAIL_ONE_IN - 1 {
        // The request fails after staging: nothing of it remains.
        tx.rollback().await?;
        return Ok(false);
    }
    tx.commit().await?;
    Ok(true)
}

async fn count(admin: &tokio_postgres::Client, sql: &str) -> Result<i64, BoxError> {
    Ok(admin.query_one(sql, &[]).await?.get(0))
}

async fn run() -> Result<bool, BoxError> {
    let requests: u64 = std::env::var("OUTBOX_EXAMPLE_REQUESTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    let (mut admin, connection) = tokio_postgres::connect(&url(), NoTls).await?;
    tokio::spawn(connection);
    let names = TableNames::new(OUTBOX_TABLE)?;
    set_up(&mut admin, &names).await?;

    // The outbox: relays the outbox table into the target, the sink
    // checking each write's lease epoch (a paused old owner cannot write).
    let relay_pool = pool(8)?;
    let sink: Sink = PostgresSink::new(relay_pool.clone(), TARGET)?
        .with_epochs(&format!("{OUTBOX_TABLE}_sink_epoch"))?;
    let store = PgStore::new(relay_pool, url().parse()?, names);
    let config = Config::builder()
        .max_batch(200)
        .linger(Duration::from_millis(10))
        .concurrency(4)
        .build()?;
    let outbox: Outbox<Sink> = Outbox::builder(sink)
        .config(config)
        .table(store, TableRelay::new("table-usage-example-1"))
        .build()?;

    // The service: request handlers on a pool of their own.
    let app_pool = pool(HANDLERS as usize)?;
    let table = Arc::new(OutboxTable::<u64, UsageRecord>::new(OUTBOX_TABLE)?);
    let committed = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut handlers = tokio::task::JoinSet::new();
    for h in 0..HANDLERS {
        let (pool, table, committed) =
            (app_pool.clone(), Arc::clone(&table), Arc::clone(&committed));
        handlers.spawn(async move {
            for request in (h..requests).step_by(HANDLERS as usize) {
                let account = request % TENANTS;
                let units = i64::try_from(request % 7 + 1)?;
                if handle_request(&pool, &table, account, request, units).await? {
                    committed.fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok::<(), BoxError>(())
        });
    }
    while let Some(done) = handlers.join_next().await {
        done??;
    }
    let committed = committed.load(Ordering::Relaxed);
    println!(
        "{requests} requests in {:.2?}: {committed} committed, {} rolled back",
        started.elapsed(),
        requests - committed
    );

    // Wait (bounded) for the relay to deliver every committed record.
    let delivered_sql = format!("SELECT count(*) FROM {TARGET}");
    let wait = Instant::now();
    while count(&admin, &delivered_sql).await? < i64::try_from(committed)?
        && wait.elapsed() < Duration::from_secs(60)
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("relayed in {:.2?} after the last commit", wait.elapsed());
    let report = outbox.shutdown(Duration::from_secs(10)).await;
    let c = outbox.counters();
    let closed = outbox.closed();
    drop(outbox);
    closed.await;
    println!(
        "accounting: relayed {} written {} handed over {} dropped {} lost {} pending {}",
        c.recovered,
        c.written,
        c.handed_over,
        c.dropped_total(),
        c.lost_total(),
        c.pending
    );
    println!(
        "shutdown: written {} handed over {} lost {} deadline passed {}",
        report.written, report.handed_over, report.lost, report.deadline_passed
    );

    let ok = check(&admin, committed).await?;
    if std::env::var_os("OUTBOX_EXAMPLE_KEEP").is_none() {
        tear_down(&admin).await?;
    }
    Ok(ok && c.lost_total() == 0)
}

/// Every committed record in the target once, none of a rolled-back
/// request, the outbox table empty.
async fn check(admin: &tokio_postgres::Client, committed: u64) -> Result<bool, BoxError> {
    let delivered = count(admin, &format!("SELECT count(*) FROM {TARGET}")).await?;
    let distinct = count(
        admin,
        &format!("SELECT count(DISTINCT (tenant, item_id)) FROM {TARGET}"),
    )
    .await?;
    // A rolled-back request's id is one below a multiple of FAIL_ONE_IN.
    let rolled_back = count(
        admin,
        &format!(
            "SELECT count(*) FROM {TARGET} WHERE (('x' || right(item_id::text, 8))::bit(32)::int) % {FAIL_ONE_IN} = {}",
            FAIL_ONE_IN - 1
        ),
    )
    .await?;
    let left = count(admin, &format!("SELECT count(*) FROM {OUTBOX_TABLE}")).await?;
    let dead = count(admin, &format!("SELECT count(*) FROM {OUTBOX_TABLE}_dead")).await?;
    println!(
        "target: {delivered} records ({distinct} distinct), {rolled_back} of rolled-back requests; \
         outbox table: {left} rows left, {dead} dead letters"
    );
    let ok = delivered == i64::try_from(committed)?
        && distinct == delivered
        && rolled_back == 0
        && left == 0
        && dead == 0;
    println!("{}", if ok { "ok" } else { "FAILED" });
    Ok(ok)
}
