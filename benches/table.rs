//! `table`: the PostgreSQL outbox table (feature `table`), against the
//! PostgreSQL server of `OUTBOX_BENCH_POSTGRES_URL` (else
//! `OUTBOX_TEST_POSTGRES_URL`; neither set: the bench says it is skipped and
//! exits 0; set and unreachable: it panics). Every baseline is measured in
//! the same run. Targets (issues 28 and 29):
//!
//! 1. `table/stage`: one transaction that updates one business row, stages
//!    one item with `OutboxTable::stage` and commits, against the same
//!    transaction with a bare `INSERT` of the same columns into a plain
//!    table of the same shape (`LIKE … INCLUDING ALL`, the same storage
//!    options; the partition computed by the client with
//!    `outbox::table::partition_of`, no `NOTIFY`), at 1 stager and at 8
//!    concurrent stagers (each on its own connection and its own business
//!    rows), with `Wakeup::InTransaction` (`NOTIFY`, a listener connected)
//!    and with `Wakeup::None`. Target: at most 1.2x at 1 stager, both
//!    wake-ups; reported at 8.
//! 2. `table/relay`: `N` rows pre-staged (committed in one transaction)
//!    relayed by an outbox with the table into the PostgreSQL sink (with
//!    epochs, fan-in) until the outbox table is empty, against a bare
//!    client loop on one connection that, one transaction per page, reads
//!    a page ordered by id (`FOR UPDATE SKIP LOCKED`), inserts the rows
//!    into a target table with the sink's multi-row statement and deletes
//!    them by id. Same page size: the loop's page is `PAGE` rows; the relay
//!    reads at most `PAGE` rows per read (at least 64 per partition) and
//!    writes groups of at most `PAGE` rows. Target: relay throughput at least 0.7x the
//!    loop's. Each loop's PostgreSQL server CPU-seconds per million rows
//!    are printed (utime + stime of every process whose `comm` is
//!    `postgres`, from `/proc`, before and after: other sessions of the
//!    same server count too).
//! 3. `table/latency`: commit-to-write latency, p50 and p99, per wake-up
//!    mode: the listener with `NOTIFY` in the staging transaction, and
//!    polling only (`TableRelay::listen(false)`, the default poll
//!    interval, stages without `NOTIFY`). Stagers commit one item per
//!    transaction at a paced rate; the sink records when it got each item,
//!    against the instant its COMMIT was acknowledged. Reported (ratio:
//!    notify p50 / poll p50).
//! 4. `table/instances` (issue 29): three outbox instances (three
//!    `TableRelay` instance ids in one process, a runtime each) against one,
//!    each at concurrency 4 with `max_batch` 10, over 10,000 tenants with a
//!    standing backlog (pre-staged, and topped up while it runs) into a
//!    sink that takes 2 ms a write: items/s over a fixed window after the
//!    partitions are owned and a warm-up. Targets: the single instance's
//!    write slots busy at least 90% of the window (sum of write durations
//!    / (4 x window)); three instances at least 2.5x one. PostgreSQL's CPU
//!    share over each window is printed.
//!
//! ```sh
//! cargo bench --features table --bench table
//! TABLE_BENCH_QUICK=1 cargo bench --features table --bench table   # a check, not a measurement
//! TABLE_BENCH_GROUPS=relay,latency cargo bench --features table --bench table
//! ```
//!
//! `TABLE_BENCH_VERBOSE=1` prints the relay's and the instances' progress
//! on stderr; `TABLE_BENCH_SPLIT_POOLS=0` makes the relay group's store
//! and sink share one pool (default: a pool of 8 each);
//! `TABLE_BENCH_SHARED_RUNTIME=1` runs the instances of group 4 on the
//! bench's runtime (default: a one-worker runtime each).
//!
//! Tables: `bench_table_*` (an outbox table per group, created by
//! `outbox::table::migrate`, and their targets), dropped at the end.

mod common;

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{fmt_secs, summary, Samples};
use criterion::{criterion_group, criterion_main, Criterion, SamplingMode};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Timeouts};
use outbox::codec::{Codec, Postcard};
use outbox::sinks::postgres::{schema_sql, PostgresSink};
use outbox::sinks::Record;
use outbox::table::{
    migrate, partition_of, OutboxTable, PgStore, Relayed, TableNames, TableRelay, Wakeup,
    DEFAULT_PARTITIONS,
};
use outbox::{Config, Outbox, Sink, WriteError, Written};
use serde::{Deserialize, Serialize};
use tokio::runtime::Runtime;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, NoTls, Statement};
use uuid::Uuid;

/// P of every bench table.
const P: u32 = DEFAULT_PARTITIONS;
/// Bytes of each item's payload.
const PAYLOAD: usize = 64;
/// Business rows of the staging group (each stager updates its own).
const ACCOUNTS: u64 = 1_024;
/// Concurrent stagers of the staging group's second half.
const STAGERS: usize = 8;
/// Items per statement (`stage_run`) when the bench stages a backlog.
const RUN: usize = 1_000;
const SAMPLES: usize = 10;
/// The table target at 1 stager.
const STAGE_LIMIT: f64 = 1.2;
const RELAY_LIMIT: f64 = 0.7;
const BUSY_LIMIT: f64 = 0.9;
const INSTANCES_LIMIT: f64 = 2.5;
/// The slow sink's time per write.
const WRITE_TIME: Duration = Duration::from_millis(2);

/// Sizes and windows: the full run's, or the quick check's
/// (`TABLE_BENCH_QUICK=1`).
struct Params {
    quick: bool,
    stage_warm_up: Duration,
    stage_measure: Duration,
    relay_rows: u64,
    relay_tenants: u64,
    page: u32,
    relay_runs: usize,
    latency_rate: u32,
    latency_time: Duration,
    inst_backlog: u64,
    inst_tenants: u64,
    inst_warm_up: Duration,
    inst_window: Duration,
}

impl Params {
    fn get() -> Params {
        let quick = std::env::var("TABLE_BENCH_QUICK").is_ok_and(|v| v != "0" && !v.is_empty());
        if quick {
            Params {
                quick,
                stage_warm_up: Duration::from_millis(100),
                stage_measure: Duration::from_millis(500),
                relay_rows: 5_000,
                relay_tenants: 100,
                page: 1_000,
                relay_runs: 1,
                latency_rate: 100,
                latency_time: Duration::from_secs(1),
                inst_backlog: 10_000,
                inst_tenants: 1_000,
                inst_warm_up: Duration::from_millis(500),
                inst_window: Duration::from_secs(2),
            }
        } else {
            Params {
                quick,
                stage_warm_up: Duration::from_secs(1),
                stage_measure: Duration::from_secs(5),
                relay_rows: 50_000,
                relay_tenants: 1_000,
                page: 1_000,
                relay_runs: 3,
                latency_rate: 500,
                latency_time: Duration::from_secs(5),
                inst_backlog: 200_000,
                inst_tenants: 10_000,
                inst_warm_up: Duration::from_secs(5),
                inst_window: Duration::from_secs(20),
            }
        }
    }

    /// The note every summary line of a quick run carries.
    fn note(&self) -> &'static str {
        if self.quick {
            " (TABLE_BENCH_QUICK: a check of the bench, not a measurement)"
        } else {
            ""
        }
    }
}

/// Whether `TABLE_BENCH_GROUPS` (comma-separated: stage, relay, latency,
/// instances; unset: all) selects `group`.
fn selected(group: &str) -> bool {
    match std::env::var("TABLE_BENCH_GROUPS") {
        Ok(v) if !v.trim().is_empty() => v.split(',').any(|g| g.trim() == group),
        _ => true,
    }
}

/// Whether `TABLE_BENCH_VERBOSE` asks for progress lines (on stderr).
fn verbose() -> bool {
    std::env::var_os("TABLE_BENCH_VERBOSE").is_some()
}

/// Whether the relay group's store and sink each have a pool of 8 (the
/// default), or share one (`TABLE_BENCH_SPLIT_POOLS=0`, as
/// `examples/table_usage.rs` does: the in-flight records then queue in
/// the pool ahead of the sink's writes).
fn split_pools() -> bool {
    std::env::var("TABLE_BENCH_SPLIT_POOLS").map_or(true, |v| v != "0")
}

// ----- PostgreSQL ----------------------------------------------------------

/// The server's URL and the variable it came from, if one is set.
fn url() -> Option<(String, &'static str)> {
    ["OUTBOX_BENCH_POSTGRES_URL", "OUTBOX_TEST_POSTGRES_URL"]
        .into_iter()
        .find_map(|var| {
            std::env::var(var)
                .ok()
                .filter(|v| !v.trim().is_empty())
                .map(|v| (v, var))
        })
}

fn pg_config(url: &str, var: &str) -> tokio_postgres::Config {
    let mut config: tokio_postgres::Config = url
        .parse()
        .unwrap_or_else(|e| panic!("table bench: {var} is not a PostgreSQL URL: {e}"));
    config.connect_timeout(Duration::from_secs(5));
    config
}

/// A connection of its own (its driver spawned on the current runtime).
async fn connect(url: &str, var: &str) -> Client {
    let (client, connection) = pg_config(url, var)
        .connect(NoTls)
        .await
        .unwrap_or_else(|e| {
            panic!("table bench: {var} is set but PostgreSQL is unreachable there: {e}")
        });
    tokio::spawn(connection);
    client
}

fn pool(url: &str, var: &str, size: usize) -> Pool {
    let manager = Manager::from_config(
        pg_config(url, var),
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(size)
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .timeouts(Timeouts {
            wait: Some(Duration::from_secs(10)),
            create: Some(Duration::from_secs(5)),
            recycle: Some(Duration::from_secs(5)),
        })
        .build()
        .expect("a pool")
}

/// Drops the outbox table `name` and its companions.
async fn drop_outbox(admin: &Client, name: &str) {
    let n = name;
    admin
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS {n}, {n}_dead, {n}_in_flight, {n}_crashes, {n}_lease, \
             {n}_member, {n}_sink_epoch, {n}_schema CASCADE; \
             DROP FUNCTION IF EXISTS {n}_partition(bytea), {n}_partitions()"
        ))
        .await
        .expect("drop an outbox table");
}

/// A fresh outbox table `name` (P = [`P`]) made by the crate's migrations.
async fn fresh_outbox(admin: &mut Client, name: &str) -> TableNames {
    drop_outbox(admin, name).await;
    let names = TableNames::new(name).expect("a valid name");
    migrate(admin, &names, P).await.expect("migrate");
    names
}

/// A fresh target table of the PostgreSQL sink's schema.
async fn fresh_target(admin: &Client, name: &str) {
    admin
        .batch_execute(&format!("DROP TABLE IF EXISTS {name}"))
        .await
        .expect("drop a target");
    admin
        .batch_execute(&schema_sql::<u64>(name).expect("a valid name"))
        .await
        .expect("a target table");
}

async fn count(admin: &Client, sql: &str) -> i64 {
    admin.query_one(sql, &[]).await.expect("a count").get(0)
}

/// The CPU time of every process named `postgres` (the server's), from
/// `/proc/PID/stat`; `None` if none is visible.
/// A checkpoint before a measured run, so that no run pays for the dirty
/// buffers of the one before (without it, a checkpoint that starts inside
/// one run and not the other moved a ratio by a third on this VM). Needs
/// superuser or `pg_checkpoint`; without, the runs go on unsettled.
async fn checkpoint(admin: &Client) {
    if let Err(e) = admin.batch_execute("CHECKPOINT").await {
        eprintln!("table bench: CHECKPOINT refused ({e}); runs are not settled");
    }
}

fn postgres_cpu() -> Option<Duration> {
    // SAFETY: `sysconf` only reads a constant of the system.
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let tick = if tick > 0 { tick as f64 } else { 100.0 };
    let mut ticks = 0u64;
    let mut seen = false;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let path = entry.path();
        let is_pid = entry
            .file_name()
            .to_str()
            .is_some_and(|s| s.bytes().all(|b| b.is_ascii_digit()));
        if !is_pid {
            continue;
        }
        let comm = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        if comm.trim() != "postgres" {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(path.join("stat")) else {
            continue;
        };
        // After the command's closing parenthesis: state is field 3, utime
        // field 14, stime field 15.
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let field = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
        if let (Some(u), Some(s)) = (field(11), field(12)) {
            ticks += u + s;
            seen = true;
        }
    }
    seen.then(|| Duration::from_secs_f64(ticks as f64 / tick))
}

/// `after - before` of two [`postgres_cpu`] readings, in seconds.
fn cpu_between(before: Option<Duration>, after: Option<Duration>) -> Option<f64> {
    Some(after?.saturating_sub(before?).as_secs_f64())
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

// ----- items, staging, ownership -------------------------------------------

/// A staged item: its own id (the sink's idempotency key) and bytes.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Usage {
    id: u128,
    payload: Vec<u8>,
}

fn usage(id: u64) -> Usage {
    let mut payload = id.to_le_bytes().to_vec();
    payload.resize(PAYLOAD, b'u');
    Usage {
        id: u128::from(id),
        payload,
    }
}

impl Record for Usage {
    fn id(&self) -> Uuid {
        Uuid::from_u128(self.id)
    }
    fn payload(&self) -> &[u8] {
        &self.payload
    }
}

type Table = OutboxTable<u64, Usage>;

/// Stages the items `ids` (tenant: id modulo `tenants`) through `table`
/// in one transaction, `RUN` items per statement.
async fn stage_all(client: &mut Client, table: &Table, ids: std::ops::Range<u64>, tenants: u64) {
    let tx = client.transaction().await.expect("begin");
    let all: Vec<(u64, Usage)> = ids.map(|i| (i % tenants, usage(i))).collect();
    for chunk in all.chunks(RUN) {
        table
            .stage_run(&tx, chunk.iter().map(|(t, u)| (t, u)))
            .await
            .expect("stage a run");
    }
    tx.commit().await.expect("commit the backlog");
}

/// Partitions owned by each instance, counting only unexpired leases whose
/// epoch is installed at the sink.
async fn owners(admin: &Client, names: &TableNames) -> BTreeMap<String, i64> {
    let sql = format!(
        "SELECT l.owner, count(*) FROM {} l JOIN {} s USING (partition) \
         WHERE l.owner IS NOT NULL AND l.expiry > clock_timestamp() AND s.epoch = l.epoch \
         GROUP BY l.owner",
        names.lease(),
        names.sink_epoch()
    );
    let rows = admin.query(&sql, &[]).await.expect("read the leases");
    rows.iter().map(|r| (r.get(0), r.get(1))).collect()
}

/// Waits (at most 2 minutes) until `instances` own all P partitions
/// between them, each some, and the owners have not changed for `stable`.
async fn wait_owned(
    admin: &Client,
    names: &TableNames,
    instances: &[String],
    stable: Duration,
) -> BTreeMap<String, i64> {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut last: Option<(BTreeMap<String, i64>, Instant)> = None;
    loop {
        let now = owners(admin, names).await;
        let complete = instances.iter().all(|i| now.contains_key(i))
            && now.values().sum::<i64>() == i64::from(P);
        if !complete {
            last = None;
        } else if let Some((map, since)) = &last {
            if *map == now && since.elapsed() >= stable {
                return now;
            }
            if *map != now {
                last = Some((now, Instant::now()));
            }
        } else {
            last = Some((now, Instant::now()));
        }
        assert!(
            Instant::now() < deadline,
            "table bench: the partitions of {} were not owned by {instances:?} within 2 minutes \
             (last seen: {last:?})",
            names.name()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Shuts `outbox` down and waits for its tasks to end.
async fn close<S: Sink>(outbox: Outbox<S>) {
    drop(outbox.shutdown(Duration::from_secs(10)).await);
    let closed = outbox.closed();
    drop(outbox);
    closed.await;
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

// ----- 1. staging ----------------------------------------------------------

const STAGE_TABLE: &str = "bench_table_stage";
const PLAIN_TABLE: &str = "bench_table_plain";
const ACCOUNTS_TABLE: &str = "bench_table_accounts";

/// How one staging transaction adds its row.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Way {
    /// `OutboxTable::stage` with this wake-up.
    Table(Wakeup),
    /// A bare `INSERT` into the plain table.
    Bare,
}

struct StageWorld {
    notify: Table,
    none: Table,
    plain_sql: String,
    next_id: AtomicU64,
}

/// One stager: its connection and its prepared business update.
struct Stager {
    client: Client,
    update: Statement,
}

async fn stage_set_up(admin: &mut Client) -> StageWorld {
    fresh_outbox(admin, STAGE_TABLE).await;
    admin
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS {PLAIN_TABLE}, {ACCOUNTS_TABLE}; \
             CREATE TABLE {PLAIN_TABLE} (LIKE {STAGE_TABLE} INCLUDING ALL); \
             CREATE TABLE {ACCOUNTS_TABLE} (id bigint PRIMARY KEY, used bigint NOT NULL DEFAULT 0); \
             INSERT INTO {ACCOUNTS_TABLE} (id) SELECT generate_series(0, {})",
            ACCOUNTS - 1
        ))
        .await
        .expect("the plain and business tables");
    // The outbox table's storage options (its autovacuum settings) too.
    let options: Option<String> = admin
        .query_one(
            &format!(
                "SELECT array_to_string(reloptions, ', ') FROM pg_class \
                 WHERE oid = '{STAGE_TABLE}'::regclass"
            ),
            &[],
        )
        .await
        .expect("the table's options")
        .get(0);
    if let Some(options) = options.filter(|o| !o.is_empty()) {
        admin
            .batch_execute(&format!("ALTER TABLE {PLAIN_TABLE} SET ({options})"))
            .await
            .expect("the plain table's options");
    }
    let notify = Table::new(STAGE_TABLE).expect("a valid name");
    StageWorld {
        none: notify.clone().wakeup(Wakeup::None),
        notify,
        plain_sql: format!(
            "INSERT INTO {PLAIN_TABLE} (partition, tenant, item, codec_version) \
             VALUES ($1, $2, $3, $4)"
        ),
        next_id: AtomicU64::new(0),
    }
}

async fn stager(url: &str, var: &str) -> Stager {
    let client = connect(url, var).await;
    let update = client
        .prepare(&format!(
            "UPDATE {ACCOUNTS_TABLE} SET used = used + 1 WHERE id = $1"
        ))
        .await
        .expect("prepare the business update");
    Stager { client, update }
}

/// One transaction: the business row's update, the row, COMMIT.
async fn one_transaction(s: &mut Stager, w: &StageWorld, way: Way, account: u64) {
    let id = w.next_id.fetch_add(1, Ordering::Relaxed);
    let item = usage(id);
    let tx = s.client.transaction().await.expect("begin");
    tx.execute(&s.update, &[&(account as i64)])
        .await
        .expect("the business update");
    match way {
        Way::Table(wakeup) => {
            let table = if wakeup == Wakeup::None {
                &w.none
            } else {
                &w.notify
            };
            table.stage(&tx, &account, &item).await.expect("stage");
        }
        Way::Bare => {
            let (t, i) = w.none.encode(&account, &item).expect("encode");
            let partition = partition_of(&t, P) as i32;
            tx.query_typed(
                &w.plain_sql,
                &[
                    (&partition, Type::INT4),
                    (&t, Type::BYTEA),
                    (&i, Type::BYTEA),
                    (&0i64, Type::INT8),
                ],
            )
            .await
            .expect("the bare insert");
        }
    }
    tx.commit().await.expect("commit");
}

/// `iters` transactions on each of the first `n` stagers at once (stager
/// k updates the business rows k, k + n, ...): the time they took.
fn run_stagers(
    rt: &Runtime,
    stagers: &RefCell<Vec<Stager>>,
    w: &Arc<StageWorld>,
    n: usize,
    way: Way,
    iters: u64,
) -> Duration {
    let taken: Vec<Stager> = stagers.borrow_mut().drain(..n).collect();
    let (took, back) = rt.block_on(async {
        let start = Instant::now();
        let mut set = tokio::task::JoinSet::new();
        for (k, mut s) in taken.into_iter().enumerate() {
            let w = Arc::clone(w);
            set.spawn(async move {
                let rows = ACCOUNTS / n as u64;
                for j in 0..iters {
                    let account = k as u64 + (j % rows) * n as u64;
                    one_transaction(&mut s, &w, way, account).await;
                }
                s
            });
        }
        let mut back = Vec::with_capacity(n);
        while let Some(s) = set.join_next().await {
            back.push(s.expect("a stager"));
        }
        (start.elapsed(), back)
    });
    let mut all = stagers.borrow_mut();
    let rest: Vec<Stager> = all.drain(..).collect();
    all.extend(back);
    all.extend(rest);
    took
}

fn way_name(way: Way) -> &'static str {
    match way {
        Way::Bare => "bare",
        Way::Table(Wakeup::None) => "none",
        Way::Table(_) => "notify",
    }
}

fn stage_group(c: &mut Criterion, rt: &Runtime, url: &str, var: &str, p: &Params) {
    let samples = Samples::default();
    let (mut admin, listener) =
        rt.block_on(async { (connect(url, var).await, connect(url, var).await) });
    let w = Arc::new(rt.block_on(stage_set_up(&mut admin)));
    // A listener, as a relay would have: the notifications are read and
    // dropped by its connection's task.
    let channel = w.notify.names().channel().to_owned();
    rt.block_on(listener.batch_execute(&format!("LISTEN {channel}")))
        .expect("listen");
    let stagers = RefCell::new(rt.block_on(async {
        let mut v = Vec::new();
        for _ in 0..STAGERS {
            v.push(stager(url, var).await);
        }
        v
    }));
    let ways = [
        Way::Bare,
        Way::Table(Wakeup::None),
        Way::Table(Wakeup::InTransaction),
    ];
    let mut group = c.benchmark_group("table/stage");
    group
        .sample_size(SAMPLES)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(p.stage_warm_up)
        .measurement_time(p.stage_measure);
    for n in [1, STAGERS] {
        for way in ways {
            let id = format!("c{n}/{}", way_name(way));
            rt.block_on(checkpoint(&admin));
            group.bench_function(&id, |b| {
                samples.iter_custom(b, &id, |iters| run_stagers(rt, &stagers, &w, n, way, iters));
            });
        }
    }
    group.finish();
    drop(stagers);
    stage_report(&samples, p);
    rt.block_on(async {
        drop_outbox(&admin, STAGE_TABLE).await;
        admin
            .batch_execute(&format!(
                "DROP TABLE IF EXISTS {PLAIN_TABLE}, {ACCOUNTS_TABLE}"
            ))
            .await
            .expect("drop the staging tables");
    });
    drop(listener);
}

fn stage_report(samples: &Samples, p: &Params) {
    for n in [1, STAGERS] {
        let Some(bare) = samples.median(&format!("c{n}/bare"), SAMPLES) else {
            continue;
        };
        for way in [Way::Table(Wakeup::None), Way::Table(Wakeup::InTransaction)] {
            let Some(m) = samples.median(&format!("c{n}/{}", way_name(way)), SAMPLES) else {
                continue;
            };
            let ratio = m / bare;
            let judged = n == 1;
            // Per round: n transactions at once.
            let extra = format!(
                "stagers={n} wakeup={} stage={} bare={} ({:.0} vs {:.0} tx/s){}{}",
                way_name(way),
                fmt_secs(m),
                fmt_secs(bare),
                n as f64 / m,
                n as f64 / bare,
                if judged {
                    ""
                } else {
                    " (reported, not judged)"
                },
                p.note()
            );
            summary(
                &format!("table/stage_c{n}_{}", way_name(way)),
                ratio,
                &format!("<={STAGE_LIMIT:.1}"),
                judged.then_some(ratio <= STAGE_LIMIT),
                &extra,
            );
        }
    }
}

// ----- 2. the relay against a bare loop ------------------------------------

const RELAY_TABLE: &str = "bench_table_relay";
const RELAY_TARGET: &str = "bench_table_relay_target";
const BARE_TARGET: &str = "bench_table_relay_bare";
const RELAY_INSTANCE: &str = "bench-relay-1";

type RelaySink = PostgresSink<Relayed<Usage>, u64>;

/// One measured drain: its time and the server's CPU-seconds in it.
struct Drained {
    secs: f64,
    cpu: Option<f64>,
    /// The relay's writes and in-flight records (S-T17), if known.
    writes: Option<(u64, i64)>,
}

/// Rows ever inserted into `table`, from the server's statistics (which
/// the backends send at most once a second, and when they exit).
async fn inserted(admin: &Client, table: &str) -> i64 {
    count(
        admin,
        &format!(
            "SELECT coalesce((SELECT n_tup_ins FROM pg_stat_user_tables \
             WHERE relid = '{table}'::regclass), 0)"
        ),
    )
    .await
}

/// The bare loop: one transaction per page of `page` rows read in id
/// order, inserted into `target` with the sink's group statement, deleted
/// by id; until a page comes back empty.
async fn bare_loop(client: &mut Client, names: &TableNames, target: &str, page: u32) -> u64 {
    let o = names.outbox();
    let select = client
        .prepare(&format!(
            "SELECT id, tenant, item FROM {o} ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED"
        ))
        .await
        .expect("prepare the read");
    // The PostgreSQL sink's group statement (S-F1), as it sends it.
    let insert = client
        .prepare(&format!(
            "INSERT INTO \"{target}\" (tenant, item_id, payload) \
             SELECT u.tenant, u.item_id, u.payload \
             FROM UNNEST($1::bigint[], $2::uuid[], $3::bytea[]) \
             WITH ORDINALITY AS u(tenant, item_id, payload, ord) \
             ORDER BY u.ord \
             ON CONFLICT (tenant, item_id) DO NOTHING"
        ))
        .await
        .expect("prepare the insert");
    let delete = client
        .prepare(&format!("DELETE FROM {o} WHERE id = ANY($1)"))
        .await
        .expect("prepare the delete");
    let limit = i64::from(page);
    let mut total = 0u64;
    loop {
        let tx = client.transaction().await.expect("begin");
        let rows = tx.query(&select, &[&limit]).await.expect("read a page");
        if rows.is_empty() {
            tx.commit().await.expect("commit");
            return total;
        }
        let mut ids = Vec::with_capacity(rows.len());
        let mut tenants = Vec::with_capacity(rows.len());
        let mut items = Vec::with_capacity(rows.len());
        for r in &rows {
            ids.push(r.get::<_, i64>(0));
            let t: u64 = Codec::<u64, Usage>::decode_tenant(&Postcard, r.get(1)).expect("tenant");
            tenants.push(t as i64);
            items.push(Codec::<u64, Usage>::decode_item(&Postcard, r.get(2)).expect("item"));
        }
        let item_ids: Vec<Uuid> = items.iter().map(Record::id).collect();
        let payloads: Vec<&[u8]> = items.iter().map(Record::payload).collect();
        tx.execute(&insert, &[&tenants, &item_ids, &payloads])
            .await
            .expect("insert a page");
        tx.execute(&delete, &[&ids]).await.expect("delete a page");
        tx.commit().await.expect("commit a page");
        total += rows.len() as u64;
    }
}

/// The relay's outbox over the bench's relay table.
fn relay_outbox(url: &str, var: &str, names: &TableNames, page: u32) -> Outbox<RelaySink> {
    let sink_pool = pool(url, var, 8);
    let store_pool = if split_pools() {
        pool(url, var, 8)
    } else {
        sink_pool.clone()
    };
    let sink: RelaySink = PostgresSink::new(sink_pool, RELAY_TARGET)
        .expect("a valid name")
        .with_epochs(&format!("{RELAY_TABLE}_sink_epoch"))
        .expect("a valid name");
    let store = PgStore::new(store_pool, pg_config(url, var), names.clone());
    let config = Config::builder()
        .concurrency(4)
        .max_batch(page as usize)
        .max_slices_per_write(64)
        .max_group_items(page as usize)
        .linger(Duration::from_millis(2))
        .build()
        .expect("config");
    Outbox::builder(sink)
        .config(config)
        .table(store, TableRelay::new(RELAY_INSTANCE).page_rows(page))
        .build()
        .expect("build the relay's outbox")
}

async fn relay_bare_once(
    admin: &mut Client,
    names: &TableNames,
    table: &Table,
    ids: std::ops::Range<u64>,
    p: &Params,
) -> Drained {
    let n = ids.end - ids.start;
    checkpoint(admin).await;
    stage_all(admin, table, ids, p.relay_tenants).await;
    admin
        .batch_execute(&format!("VACUUM ANALYZE {RELAY_TABLE}"))
        .await
        .expect("vacuum");
    let cpu0 = postgres_cpu();
    let start = Instant::now();
    let moved = bare_loop(admin, names, BARE_TARGET, p.page).await;
    let secs = start.elapsed().as_secs_f64();
    let cpu = cpu_between(cpu0, postgres_cpu());
    assert_eq!(moved, n, "the bare loop moved every row");
    Drained {
        secs,
        cpu,
        writes: None,
    }
}

async fn relay_once(
    admin: &mut Client,
    url: &str,
    var: &str,
    names: &TableNames,
    table: &Table,
    ids: std::ops::Range<u64>,
    p: &Params,
) -> Drained {
    let n = ids.end - ids.start;
    admin
        .batch_execute(&format!("VACUUM ANALYZE {RELAY_TABLE}"))
        .await
        .expect("vacuum");
    let records0 = inserted(admin, &format!("{RELAY_TABLE}_in_flight")).await;
    let outbox = relay_outbox(url, var, names, p.page);
    wait_owned(admin, names, &[RELAY_INSTANCE.to_owned()], Duration::ZERO).await;
    checkpoint(admin).await;
    // Every row commits at once: the relay sees none before the COMMIT.
    let tx = admin.transaction().await.expect("begin");
    let all: Vec<(u64, Usage)> = ids.map(|i| (i % p.relay_tenants, usage(i))).collect();
    for chunk in all.chunks(RUN) {
        table
            .stage_run(&tx, chunk.iter().map(|(t, u)| (t, u)))
            .await
            .expect("stage a run");
    }
    tx.commit().await.expect("commit the backlog");
    let cpu0 = postgres_cpu();
    let start = Instant::now();
    let deadline = start + Duration::from_secs(600);
    let mut said = Instant::now();
    while outbox.counters().written < n {
        assert!(
            Instant::now() < deadline,
            "the relay did not write {n} rows in 10 minutes"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
        if verbose() && said.elapsed() >= Duration::from_millis(100) {
            said = Instant::now();
            let c = outbox.counters();
            eprintln!(
                "table relay at {}: relayed {} written {} writes {} pending {}",
                fmt_secs(start.elapsed().as_secs_f64()),
                c.recovered,
                c.written,
                c.writes,
                c.pending
            );
        }
    }
    let empty = format!("SELECT count(*) FROM (SELECT 1 FROM {RELAY_TABLE} LIMIT 1) x");
    while count(admin, &empty).await > 0 {
        assert!(
            Instant::now() < deadline,
            "the relay did not empty its table in 10 minutes"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let secs = start.elapsed().as_secs_f64();
    let cpu = cpu_between(cpu0, postgres_cpu());
    let c = outbox.counters();
    close(outbox).await;
    assert_eq!(c.lost_total(), 0, "nothing lost");
    let written = count(admin, &format!("SELECT count(*) FROM {RELAY_TARGET}")).await;
    assert_eq!(written, n as i64, "every row in the target once");
    // The relay's sessions have exited and sent their statistics.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let records = inserted(admin, &format!("{RELAY_TABLE}_in_flight")).await - records0;
    Drained {
        secs,
        cpu,
        writes: Some((c.writes, records)),
    }
}

fn relay_group(rt: &Runtime, url: &str, var: &str, p: &Params) {
    let (bare, relay) = rt.block_on(async {
        let mut admin = connect(url, var).await;
        let names = fresh_outbox(&mut admin, RELAY_TABLE).await;
        let table = Table::new(RELAY_TABLE).expect("a valid name");
        let (mut bare, mut relay) = (Vec::new(), Vec::new());
        let n = p.relay_rows;
        for run in 0..p.relay_runs as u64 {
            fresh_target(&admin, BARE_TARGET).await;
            fresh_target(&admin, RELAY_TARGET).await;
            let base = run * 2 * n;
            bare.push(relay_bare_once(&mut admin, &names, &table, base..base + n, p).await);
            let ids = base + n..base + 2 * n;
            relay.push(relay_once(&mut admin, url, var, &names, &table, ids, p).await);
        }
        drop_outbox(&admin, RELAY_TABLE).await;
        admin
            .batch_execute(&format!(
                "DROP TABLE IF EXISTS {RELAY_TARGET}, {BARE_TARGET}"
            ))
            .await
            .expect("drop the targets");
        (bare, relay)
    });
    relay_report(&bare, &relay, p);
}

fn relay_report(bare: &[Drained], relay: &[Drained], p: &Params) {
    let n = p.relay_rows as f64;
    let rate = |d: &[Drained]| median(d.iter().map(|d| n / d.secs).collect());
    let per_million = |d: &[Drained]| {
        let cpu: Vec<f64> = d.iter().filter_map(|d| d.cpu).collect();
        if cpu.is_empty() {
            "n/a".to_owned()
        } else {
            format!("{:.2}", median(cpu) / n * 1e6)
        }
    };
    let (relay_rate, bare_rate) = (rate(relay), rate(bare));
    let ratio = relay_rate / bare_rate;
    for (name, d) in [("bare loop", bare), ("relay", relay)] {
        let runs: Vec<String> = d
            .iter()
            .map(|d| {
                format!(
                    "{} ({:.0} rows/s, server {} cpu-s{})",
                    fmt_secs(d.secs),
                    n / d.secs,
                    d.cpu.map_or("n/a".to_owned(), |c| format!("{c:.2}")),
                    d.writes.map_or(String::new(), |(w, r)| format!(
                        ", {w} writes ({:.1} rows each), {r} in-flight records",
                        n / w.max(1) as f64
                    ))
                )
            })
            .collect();
        println!(
            "table relay, {name}: {} rows over {} tenants, page {}: {}",
            p.relay_rows,
            p.relay_tenants,
            p.page,
            runs.join("; ")
        );
    }
    let extra = format!(
        "relay={relay_rate:.0} rows/s bare={bare_rate:.0} rows/s server_cpu_s_per_million: \
         relay={} bare={} (median of {} runs){}",
        per_million(relay),
        per_million(bare),
        relay.len(),
        p.note()
    );
    summary(
        "table/relay",
        ratio,
        &format!(">={RELAY_LIMIT:.1}"),
        Some(ratio >= RELAY_LIMIT),
        &extra,
    );
}

// ----- 3. commit-to-write latency ------------------------------------------

const LATENCY_TABLE: &str = "bench_table_latency";
const LATENCY_INSTANCE: &str = "bench-latency-1";
/// Stagers committing at once in the latency group.
const LATENCY_STAGERS: usize = 4;

/// A sink that records when it got each item.
#[derive(Clone, Default)]
struct Recording {
    got: Arc<Mutex<Vec<(u128, Instant)>>>,
}

impl Sink for Recording {
    type Tenant = u64;
    type Item = Relayed<Usage>;
    fn name(&self) -> &str {
        "bench-recording"
    }
    async fn write(&self, _: &u64, items: &[Relayed<Usage>]) -> Result<Written, WriteError> {
        let now = Instant::now();
        self.got
            .lock()
            .unwrap()
            .extend(items.iter().map(|i| (i.item.id, now)));
        Ok(Written::ALL)
    }
}

/// Stager `k` of `LATENCY_STAGERS`: commits its items at their paced
/// instants; answers each item's id and the instant its COMMIT was
/// acknowledged.
async fn paced_stager(
    mut client: Client,
    table: Table,
    k: usize,
    total: u64,
    rate: u32,
    origin: tokio::time::Instant,
) -> Vec<(u128, Instant)> {
    let mut acked = Vec::new();
    let mut j = k as u64;
    while j < total {
        let at = origin + Duration::from_secs_f64(j as f64 / f64::from(rate));
        tokio::time::sleep_until(at).await;
        let tx = client.transaction().await.expect("begin");
        table
            .stage(&tx, &(j % 100), &usage(j))
            .await
            .expect("stage");
        tx.commit().await.expect("commit");
        acked.push((u128::from(j), Instant::now()));
        j += LATENCY_STAGERS as u64;
    }
    acked
}

/// One wake-up mode: latencies, sorted.
async fn latency_mode(url: &str, var: &str, notify: bool, p: &Params) -> Vec<Duration> {
    let mut admin = connect(url, var).await;
    let names = fresh_outbox(&mut admin, LATENCY_TABLE).await;
    let sink = Recording::default();
    let got = Arc::clone(&sink.got);
    let pool = pool(url, var, 6);
    let store = PgStore::new(pool, pg_config(url, var), names.clone());
    let config = Config::builder()
        .concurrency(4)
        .max_batch(100)
        .build()
        .expect("config");
    let outbox = Outbox::builder(sink)
        .config(config)
        .table(store, TableRelay::new(LATENCY_INSTANCE).listen(notify))
        .build()
        .expect("build the latency outbox");
    wait_owned(
        &admin,
        &names,
        &[LATENCY_INSTANCE.to_owned()],
        Duration::ZERO,
    )
    .await;
    let wakeup = if notify {
        Wakeup::InTransaction
    } else {
        Wakeup::None
    };
    let table = Table::new(LATENCY_TABLE)
        .expect("a valid name")
        .wakeup(wakeup);
    let total = (f64::from(p.latency_rate) * p.latency_time.as_secs_f64()) as u64;
    let origin = tokio::time::Instant::now() + Duration::from_millis(100);
    let mut set = tokio::task::JoinSet::new();
    for k in 0..LATENCY_STAGERS {
        let client = connect(url, var).await;
        set.spawn(paced_stager(
            client,
            table.clone(),
            k,
            total,
            p.latency_rate,
            origin,
        ));
    }
    let mut acked: HashMap<u128, Instant> = HashMap::new();
    while let Some(a) = set.join_next().await {
        acked.extend(a.expect("a stager"));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while (got.lock().unwrap().len() as u64) < total {
        assert!(
            Instant::now() < deadline,
            "the latency run did not deliver every item in 60 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    close(outbox).await;
    drop_outbox(&admin, LATENCY_TABLE).await;
    let mut seen = std::collections::HashSet::new();
    let mut latencies: Vec<Duration> = got
        .lock()
        .unwrap()
        .iter()
        .filter(|(id, _)| seen.insert(*id))
        .filter_map(|(id, at)| acked.get(id).map(|a| at.saturating_duration_since(*a)))
        .collect();
    latencies.sort();
    latencies
}

fn latency_group(rt: &Runtime, url: &str, var: &str, p: &Params) {
    let notify = rt.block_on(latency_mode(url, var, true, p));
    let poll = rt.block_on(latency_mode(url, var, false, p));
    let line = |name: &str, l: &[Duration]| {
        println!(
            "table latency, {name}: {} items at {}/s: p50 {} p99 {} max {}",
            l.len(),
            p.latency_rate,
            fmt_secs(percentile(l, 0.5).as_secs_f64()),
            fmt_secs(percentile(l, 0.99).as_secs_f64()),
            fmt_secs(l.last().copied().unwrap_or_default().as_secs_f64())
        );
    };
    line("listener with NOTIFY", &notify);
    line("poll only (default poll interval)", &poll);
    let p50 = |l: &[Duration]| percentile(l, 0.5).as_secs_f64();
    let p99 = |l: &[Duration]| percentile(l, 0.99).as_secs_f64();
    let extra = format!(
        "notify_p50={} notify_p99={} poll_p50={} poll_p99={} rate={}/s{}",
        fmt_secs(p50(&notify)),
        fmt_secs(p99(&notify)),
        fmt_secs(p50(&poll)),
        fmt_secs(p99(&poll)),
        p.latency_rate,
        p.note()
    );
    summary(
        "table/latency",
        p50(&notify) / p50(&poll),
        "reported",
        None,
        &extra,
    );
}

// ----- 4. instances (issue 29) ---------------------------------------------

const INST_TABLE: &str = "bench_table_inst";

/// A sink that takes `WRITE_TIME` a write, counts items and the time its
/// writes took. Epochs are accepted unchecked (this measures throughput).
#[derive(Clone, Default)]
struct Slow {
    written: Arc<AtomicU64>,
    writes: Arc<AtomicU64>,
    busy_ns: Arc<AtomicU64>,
}

impl Sink for Slow {
    type Tenant = u64;
    type Item = Relayed<Usage>;
    fn name(&self) -> &str {
        "bench-slow"
    }
    async fn write(&self, _: &u64, items: &[Relayed<Usage>]) -> Result<Written, WriteError> {
        let start = Instant::now();
        tokio::time::sleep(WRITE_TIME).await;
        self.written
            .fetch_add(items.len() as u64, Ordering::Relaxed);
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.busy_ns
            .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        Ok(Written::ALL)
    }
}

/// One instances run's figures.
struct Window {
    rate: f64,
    /// Per instance: its write slots' busy share over the window.
    busy: Vec<f64>,
    /// The server's CPU-seconds per second of the window.
    cpu: Option<f64>,
    /// This process's CPU-seconds per second of the window.
    bench_cpu: f64,
    /// Writes in the window, all instances.
    writes: u64,
    /// In-flight records inserted in the window (S-T17), about (the
    /// server's statistics lag by up to a second).
    records: i64,
    owned: BTreeMap<String, i64>,
    /// The smallest backlog seen by the top-up during the window.
    low: u64,
}

/// Tops the backlog (staged minus written) up to `backlog` in runs of
/// `RUN` committed one at a time until `stop`; tracks the lowest backlog
/// seen since `low` was last reset.
#[allow(clippy::too_many_arguments)]
async fn top_up(
    client: Client,
    table: Table,
    mut staged: u64,
    backlog: u64,
    tenants: u64,
    sinks: Vec<Slow>,
    stop: Arc<AtomicBool>,
    low: Arc<AtomicU64>,
) {
    while !stop.load(Ordering::Relaxed) {
        let written: u64 = sinks
            .iter()
            .map(|s| s.written.load(Ordering::Relaxed))
            .sum();
        let left = staged.saturating_sub(written);
        low.fetch_min(left, Ordering::Relaxed);
        if left >= backlog {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        let items: Vec<(u64, Usage)> = (staged..staged + RUN as u64)
            .map(|i| (i % tenants, usage(i)))
            .collect();
        table
            .stage_run(&client, items.iter().map(|(t, u)| (t, u)))
            .await
            .expect("top up");
        staged += RUN as u64;
    }
}

async fn instances_run(url: &str, var: &str, k: usize, p: &Params) -> Window {
    let mut admin = connect(url, var).await;
    let names = fresh_outbox(&mut admin, INST_TABLE).await;
    let table = Table::new(INST_TABLE).expect("a valid name");
    let mut staged = 0;
    while staged < p.inst_backlog {
        let n = (p.inst_backlog - staged).min(10 * RUN as u64);
        stage_all(&mut admin, &table, staged..staged + n, p.inst_tenants).await;
        staged += n;
    }
    admin
        .batch_execute(&format!("VACUUM ANALYZE {INST_TABLE}"))
        .await
        .expect("vacuum");
    checkpoint(&admin).await;
    let ids: Vec<String> = (1..=k).map(|i| format!("bench-inst-{i}")).collect();
    let sinks: Vec<Slow> = ids.iter().map(|_| Slow::default()).collect();
    // Each instance on a runtime of its own (one worker), as separate
    // processes would be; `TABLE_BENCH_SHARED_RUNTIME=1`: all on the
    // bench's runtime.
    let shared = std::env::var("TABLE_BENCH_SHARED_RUNTIME").is_ok_and(|v| v == "1");
    let runtimes: Vec<Runtime> = if shared {
        Vec::new()
    } else {
        ids.iter().map(|_| common::runtime()).collect()
    };
    let outboxes: Vec<Outbox<Slow>> = ids
        .iter()
        .zip(&sinks)
        .enumerate()
        .map(|(i, (id, sink))| {
            let pool = pool(url, var, 6);
            let store = PgStore::new(pool, pg_config(url, var), names.clone());
            let config = Config::builder()
                .concurrency(4)
                .max_batch(10)
                .build()
                .expect("config");
            let mut builder = Outbox::builder(sink.clone())
                .config(config)
                .table(store, TableRelay::new(id.clone()));
            if let Some(rt) = runtimes.get(i) {
                builder = builder.runtime(rt.handle().clone());
            }
            builder.build().expect("build an instance")
        })
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let low = Arc::new(AtomicU64::new(u64::MAX));
    let stager = tokio::spawn(top_up(
        connect(url, var).await,
        table.clone(),
        staged,
        p.inst_backlog,
        p.inst_tenants,
        sinks.clone(),
        Arc::clone(&stop),
        Arc::clone(&low),
    ));
    let owned = wait_owned(&admin, &names, &ids, Duration::from_secs(2)).await;
    tokio::time::sleep(p.inst_warm_up).await;
    let snapshot = || -> (u64, u64, Vec<u64>) {
        let sum =
            |f: fn(&Slow) -> &AtomicU64| sinks.iter().map(|s| f(s).load(Ordering::Relaxed)).sum();
        let busy = sinks
            .iter()
            .map(|s| s.busy_ns.load(Ordering::Relaxed))
            .collect();
        (sum(|s| &s.written), sum(|s| &s.writes), busy)
    };
    low.store(u64::MAX, Ordering::Relaxed);
    let in_flight = format!("{INST_TABLE}_in_flight");
    let records0 = inserted(&admin, &in_flight).await;
    let ((w0, n0, b0), cpu0, own0, t0) = (
        snapshot(),
        postgres_cpu(),
        common::process_cpu(),
        Instant::now(),
    );
    while t0.elapsed() < p.inst_window {
        let left = p.inst_window.saturating_sub(t0.elapsed());
        tokio::time::sleep(left.min(Duration::from_millis(500))).await;
        if verbose() {
            let each: Vec<String> = outboxes
                .iter()
                .map(|o| {
                    let c = o.counters();
                    format!(
                        "relayed {} written {} pending {}",
                        c.recovered, c.written, c.pending
                    )
                })
                .collect();
            eprintln!(
                "table instances at {}: {}",
                fmt_secs(t0.elapsed().as_secs_f64()),
                each.join(" | ")
            );
        }
    }
    let (w1, n1, b1) = snapshot();
    let (cpu1, own1, secs) = (
        postgres_cpu(),
        common::process_cpu(),
        t0.elapsed().as_secs_f64(),
    );
    let records = inserted(&admin, &in_flight).await - records0;
    stop.store(true, Ordering::Relaxed);
    stager.await.expect("the top-up");
    for outbox in outboxes {
        close(outbox).await;
    }
    for rt in runtimes {
        rt.shutdown_background();
    }
    drop_outbox(&admin, INST_TABLE).await;
    let busy = b0
        .iter()
        .zip(&b1)
        .map(|(a, b)| (b - a) as f64 / 1e9 / (4.0 * secs))
        .collect();
    Window {
        rate: (w1 - w0) as f64 / secs,
        busy,
        cpu: cpu_between(cpu0, cpu1).map(|c| c / secs),
        bench_cpu: own1.saturating_sub(own0).as_secs_f64() / secs,
        writes: n1 - n0,
        records,
        owned,
        low: low.load(Ordering::Relaxed),
    }
}

fn instances_group(rt: &Runtime, url: &str, var: &str, p: &Params) {
    let one = rt.block_on(instances_run(url, var, 1, p));
    let three = rt.block_on(instances_run(url, var, 3, p));
    let cpu = |w: &Window| {
        w.cpu.map_or("n/a".to_owned(), |c| {
            format!(
                "{c:.2} cores ({:.0}% of {})",
                c / cores() as f64 * 100.0,
                cores()
            )
        })
    };
    for (name, w) in [("one instance", &one), ("three instances", &three)] {
        let busy: Vec<String> = w
            .busy
            .iter()
            .map(|b| format!("{:.0}%", b * 100.0))
            .collect();
        let per_write = |x: f64| {
            if w.writes == 0 {
                0.0
            } else {
                x / w.writes as f64
            }
        };
        let mean = per_write(w.busy.iter().sum::<f64>() * 4.0 * p.inst_window.as_secs_f64());
        let late = if mean > 2.0 * WRITE_TIME.as_secs_f64() {
            format!(
                " (a write took {:.1}x the sink's {} ms sleep: the machine is loaded, and the \
                 busy share counts that delay)",
                mean / WRITE_TIME.as_secs_f64(),
                WRITE_TIME.as_millis()
            )
        } else {
            String::new()
        };
        println!(
            "table instances, {name}: {:.0} items/s over {}; {} writes (about {} in-flight \
             records), {:.1} items and {} each{late}; write slots busy {}; partitions owned \
             {:?}; PostgreSQL CPU {}, the bench's own {:.2} cores; lowest backlog in the window \
             {}{}",
            w.rate,
            fmt_secs(p.inst_window.as_secs_f64()),
            w.writes,
            w.records,
            per_write(w.rate * p.inst_window.as_secs_f64()),
            fmt_secs(mean),
            busy.join(", "),
            w.owned,
            cpu(w),
            w.bench_cpu,
            w.low,
            if w.low == 0 {
                " (the backlog ran dry: the top-up bounded the run)"
            } else {
                ""
            }
        );
    }
    let busy = one.busy.first().copied().unwrap_or(0.0);
    summary(
        "table/instances_busy",
        busy,
        &format!(">={BUSY_LIMIT:.2}"),
        Some(busy >= BUSY_LIMIT),
        &format!(
            "one instance, concurrency 4, max_batch 10, {} ms a write: {:.0} items/s, \
             PostgreSQL CPU {}{}",
            WRITE_TIME.as_millis(),
            one.rate,
            cpu(&one),
            p.note()
        ),
    );
    let ratio = three.rate / one.rate;
    summary(
        "table/instances",
        ratio,
        &format!(">={INSTANCES_LIMIT:.1}"),
        Some(ratio >= INSTANCES_LIMIT),
        &format!(
            "three={:.0} items/s one={:.0} items/s over {} tenants; PostgreSQL CPU three={} \
             one={}{}",
            three.rate,
            one.rate,
            p.inst_tenants,
            cpu(&three),
            cpu(&one),
            p.note()
        ),
    );
}

// ----- the bench -----------------------------------------------------------

fn table(c: &mut Criterion) {
    let Some((url, var)) = url() else {
        println!(
            "bench table: skipped (neither OUTBOX_BENCH_POSTGRES_URL nor OUTBOX_TEST_POSTGRES_URL \
             is set)"
        );
        return;
    };
    let p = Params::get();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    // Reachable, or a clear panic now.
    drop(rt.block_on(connect(&url, var)));
    if selected("stage") {
        stage_group(c, &rt, &url, var, &p);
    }
    if selected("relay") {
        relay_group(&rt, &url, var, &p);
    }
    if selected("latency") {
        latency_group(&rt, &url, var, &p);
    }
    if selected("instances") {
        instances_group(&rt, &url, var, &p);
    }
}

criterion_group!(benches, table);
criterion_main!(benches);
