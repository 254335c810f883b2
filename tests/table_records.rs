//! The relay's in-flight records against the real PostgreSQL (S-T17):
//! one record statement per page read, however the page's tenants
//! interleave, and a record that lives until the last row it covers is
//! removed, so a crash after a delivery's first row was removed still
//! counts against the rows left. `OUTBOX_TEST_POSTGRES_URL`: skipped when
//! unset, failing when set and unreachable.
#![cfg(all(feature = "table", feature = "testkit"))]

mod common;

use std::time::Duration;

use common::table::{life_pool, Sink as Target, Usage, World, P};
use outbox::core::relay::{Fence, Fenced};
use outbox::table::{
    partition_of, Acquire, Acquired, PgStore, Relayed, Store, TableNames, TableRelay,
};
use outbox::{Config, Outbox, Sink, WriteEpoch, WriteError, Written};
use tokio::sync::mpsc;

/// Counts the statements that insert into the in-flight table, with a
/// statement-level trigger (the relay's code is not touched).
async fn count_record_statements(w: &World) {
    let n = &w.name;
    let sql = format!(
        "CREATE TABLE \"{n}_stmts\" (n bigint NOT NULL); \
         INSERT INTO \"{n}_stmts\" VALUES (0); \
         CREATE FUNCTION \"{n}_count\"() RETURNS trigger LANGUAGE plpgsql AS \
           $$ BEGIN UPDATE \"{n}_stmts\" SET n = n + 1; RETURN NULL; END $$; \
         CREATE TRIGGER \"{n}_count\" AFTER INSERT ON \"{n}_in_flight\" \
           FOR EACH STATEMENT EXECUTE FUNCTION \"{n}_count\"()"
    );
    w.admin.batch_execute(&sql).await.expect("the counter");
}

async fn record_statements(w: &World) -> i64 {
    let sql = format!("SELECT n FROM \"{}_stmts\"", w.name);
    w.admin.query_one(&sql, &[]).await.expect("count").get(0)
}

async fn drop_counter(w: &World) {
    let n = &w.name;
    let sql = format!(
        "DROP TABLE IF EXISTS \"{n}_stmts\"; DROP FUNCTION IF EXISTS \"{n}_count\"() CASCADE"
    );
    w.admin.batch_execute(&sql).await.expect("drop the counter");
}

/// A sink that counts its writes.
struct Counting {
    inner: Target,
    writes: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl Sink for Counting {
    type Tenant = u64;
    type Item = Relayed<Usage>;

    fn name(&self) -> &str {
        "counting"
    }

    async fn write(&self, tenant: &u64, items: &[Relayed<Usage>]) -> Result<Written, WriteError> {
        self.writes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.write(tenant, items).await
    }

    async fn write_with_epoch(
        &self,
        epoch: WriteEpoch,
        tenant: &u64,
        items: &[Relayed<Usage>],
    ) -> Result<Written, WriteError> {
        self.writes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.write_with_epoch(epoch, tenant, items).await
    }
}

/// Rows staged.
const ROWS: u64 = 2_000;
/// Tenants they interleave over.
const TENANTS: u64 = 200;
/// Rows a page reads at most.
const PAGE: u32 = 500;

/// S-T17: rows of many tenants, staged interleaved (each transaction one
/// row of the next tenant), are recorded in one statement per page read,
/// not one per tenant's run of a page: at most four statements per page
/// the rows need (a page may come back short), and fewer than the
/// writes.
#[tokio::test]
async fn interleaved_tenants_make_one_record_statement_per_page() {
    let Some(w) = World::new("recstmts").await else {
        return;
    };
    count_record_statements(&w).await;
    // Many rows per transaction, tenants interleaved inside each.
    for chunk in 0..(ROWS / 100) {
        let mut client = w.pool.get().await.expect("a connection");
        let tx = tokio_postgres::Client::transaction(&mut client)
            .await
            .expect("begin");
        for i in 0..100 {
            let n = chunk * 100 + i;
            let item = Usage::new(u128::from(n) + 1);
            w.table
                .stage(&tx, &(n % TENANTS), &item)
                .await
                .expect("stage");
        }
        tx.commit().await.expect("commit");
    }
    let writes = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let sink = Counting {
        inner: w.sink(),
        writes: std::sync::Arc::clone(&writes),
    };
    let config = Config::builder()
        .max_batch(10)
        .concurrency(4)
        .build()
        .expect("config");
    let outbox = w.outbox_into(sink, config, TableRelay::new("i1").page_rows(PAGE));
    let rows = w.wait_for(ROWS as usize).await;
    assert_eq!(rows.len() as u64, ROWS);
    common::servers::eventually("the table empty", Duration::from_secs(20), || async {
        (w.left().await == 0).then_some(())
    })
    .await;
    let _ = outbox.shutdown(Duration::from_secs(5)).await;
    let statements = record_statements(&w).await;
    let writes = writes.load(std::sync::atomic::Ordering::Relaxed);
    let pages = ROWS.div_ceil(u64::from(PAGE)) as i64;
    eprintln!(
        "{ROWS} rows over {TENANTS} tenants: {statements} record statements, {writes} writes"
    );
    // A page may come back short, more than once while the relay refills
    // (up to 10 statements for 4 pages seen on 2 loaded cores, with and
    // without the writer's turn before an intake); one statement per
    // tenant's run of a page would be one per write, 200 here.
    assert!(
        statements <= 4 * pages,
        "{statements} record statements for {pages} pages' worth of rows"
    );
    assert!(
        (statements as u64) < writes,
        "{statements} record statements, {writes} writes"
    );
    drop_counter(&w).await;
    w.finish().await;
}

/// The poison item's id.
const POISON: u128 = 666;

/// The lease's ttl: a crashed life's lease lapses after it.
const TTL: Duration = Duration::from_millis(1500);

/// A sink whose write holding the poison item waits until every other
/// row left the table (the delivery's earlier rows removed), says so and
/// never ends: the test then drops the runtime under it (the crash).
struct Crashing {
    inner: Target,
    pool: deadpool_postgres::Pool,
    table: String,
    crashed: mpsc::UnboundedSender<()>,
}

impl Crashing {
    async fn poison(&self, items: &[Relayed<Usage>]) {
        if !items.iter().any(|r| r.item.id == POISON) {
            return;
        }
        let sql = format!("SELECT count(*) FROM \"{}\"", self.table);
        for _ in 0..1000 {
            let client = self.pool.get().await.expect("a connection");
            let left: i64 = client.query_one(&sql, &[]).await.expect("count").get(0);
            if left == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let _ = self.crashed.send(());
        std::future::pending::<()>().await;
    }
}

impl Sink for Crashing {
    type Tenant = u64;
    type Item = Relayed<Usage>;

    fn name(&self) -> &str {
        "crashing"
    }

    async fn write(&self, tenant: &u64, items: &[Relayed<Usage>]) -> Result<Written, WriteError> {
        self.poison(items).await;
        self.inner.write(tenant, items).await
    }

    async fn write_with_epoch(
        &self,
        epoch: WriteEpoch,
        tenant: &u64,
        items: &[Relayed<Usage>],
    ) -> Result<Written, WriteError> {
        self.poison(items).await;
        self.inner.write_with_epoch(epoch, tenant, items).await
    }
}

/// S-T17: one delivery of a tenant's three rows (two healthy, then the
/// poison one, written one per write): the relay crashes in the poison
/// row's write after the healthy rows were written and removed. The
/// next owner's crash count still finds the poison row's attempt: one
/// crash, counted against it alone (the healthy rows are gone).
#[tokio::test]
async fn a_crash_after_the_first_rows_were_removed_is_counted() {
    let Some(w) = World::new("reccrash").await else {
        return;
    };
    let tenant = 5u64;
    w.stage(
        tenant,
        &[Usage::new(1), Usage::new(2), Usage::new(POISON)],
        true,
    )
    .await;
    let url = std::env::var(common::postgres::VAR).expect("set");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    let names = TableNames::new(&w.name).expect("name");
    let (tx, mut crashed) = mpsc::unbounded_channel();
    let outbox = {
        let _guard = runtime.enter();
        let store = PgStore::new(life_pool(&url), url.parse().expect("a postgres URL"), names);
        let sink = Crashing {
            inner: outbox::sinks::postgres::PostgresSink::new(life_pool(&url), &w.target)
                .expect("name"),
            pool: life_pool(&url),
            table: w.name.clone(),
            crashed: tx,
        };
        let relay = TableRelay::new("i1")
            .poll_interval(Duration::from_millis(50))
            .lease(|b| {
                b.lease_ttl(TTL)
                    .renew_every(TTL / 5)
                    .max_clock_drift(TTL / 10)
                    .acquire_poll(TTL / 10)
                    .heartbeat_every(TTL / 10)
                    .rejoin_grace(TTL / 2)
            });
        Outbox::builder(sink)
            .runtime(runtime.handle().clone())
            .config(Config::builder().max_batch(1).build().expect("config"))
            .table(store, relay)
            .build()
            .expect("build")
    };
    tokio::time::timeout(Duration::from_secs(20), crashed.recv())
        .await
        .expect("the poison row's write")
        .expect("announced");
    runtime.shutdown_background();
    drop(outbox);
    assert_eq!(w.left().await, 1, "the healthy rows were removed first");

    // The next owner: once the crashed life's lease lapsed, it takes the
    // partition and counts the records left there.
    let store = w.store();
    let partition = partition_of(&postcard_tenant(tenant), P);
    let above = store
        .sink_epochs()
        .await
        .expect("sink epochs")
        .iter()
        .map(|e| e.epoch)
        .max()
        .unwrap_or(0);
    let epoch = common::servers::eventually("the lease lapsed", Duration::from_secs(10), || {
        let store = &store;
        async move {
            let acquire = Acquire {
                partition,
                owner: "i2".into(),
                above,
                ttl: Duration::from_secs(30),
            };
            match store.acquire(&acquire).await.expect("acquire") {
                Acquired::Taken { epoch } => Some(epoch),
                Acquired::Held { .. } => None,
            }
        }
    })
    .await;
    let fence = Fence {
        owner: "i2".into(),
        epochs: vec![(partition, epoch)],
    };
    assert_eq!(
        store
            .record_crashes(&fence, partition)
            .await
            .expect("count"),
        Fenced::Done(1),
        "the poison row's crashed attempt is counted"
    );
    let sql = format!("SELECT crashes::bigint FROM \"{}_crashes\"", w.name);
    let counts: Vec<i64> = w
        .admin
        .query(&sql, &[])
        .await
        .expect("crashes")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(counts, [1]);
    w.finish().await;
}

/// The tenant as the outbox table stores it.
fn postcard_tenant(tenant: u64) -> Vec<u8> {
    let mut out = Vec::new();
    outbox::codec::Codec::<u64, Usage>::encode_tenant(&outbox::codec::Postcard, &tenant, &mut out)
        .expect("encode");
    out
}
