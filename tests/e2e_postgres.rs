//! End-to-end fault tests through the driver: an [`Outbox`] writing into a
//! real PostgreSQL server through a fault-injecting proxy. Needs
//! `OUTBOX_TEST_POSTGRES_URL` (skipped when unset, failing when set and
//! unreachable). Each test runs on real time, in about a second.
#![cfg(feature = "postgres")]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::e2e::{self, tenants, PerTenant, World as _, CONCURRENCY, DEADLINE};
use common::postgres;
use common::proxy::{Mode, Proxy};
use common::recorder::Recorder;
use common::servers;
use common::sink::items;
use outbox::sinks::postgres::PostgresSink;
use outbox::sinks::Envelope;
use outbox::{Outbox, Report, TenantId};
use tokio::sync::Barrier;
use tokio_postgres::Client;
use uuid::Uuid;

/// Cuts a hung write (S-B3): far above a write's few milliseconds on
/// loopback, far below the tests' deadlines.
const WRITE_TIMEOUT: Duration = Duration::from_millis(300);

/// One test's world: a direct client for checks, a proxy to the server, an
/// outbox whose sink's pool goes through the proxy, its metrics.
struct World {
    admin: Client,
    proxy: Proxy,
    outbox: Outbox<PostgresSink<Envelope>>,
    metrics: Recorder,
    table: String,
}

async fn setup(test: &str, max_batch: usize, rows_per_statement: usize) -> Option<World> {
    let (admin, proxy, pool) = postgres::connect(
        test,
        CONCURRENCY,
        Duration::from_secs(1),
        Duration::from_millis(200),
    )
    .await?;
    let table = servers::unique_name(test);
    let sink = PostgresSink::new(pool, &table)
        .expect("valid table name")
        .max_rows_per_statement(rows_per_statement);
    sink.create_table().await.expect("create the table");
    let (outbox, metrics) = e2e::build(sink, max_batch, WRITE_TIMEOUT);
    Some(World {
        admin,
        proxy,
        outbox,
        metrics,
        table,
    })
}

impl e2e::World for World {
    type Sink = PostgresSink<Envelope>;
    /// The item's id and payload.
    type Row = (Uuid, Vec<u8>);

    fn outbox(&self) -> &Outbox<Self::Sink> {
        &self.outbox
    }

    fn metrics(&self) -> &Recorder {
        &self.metrics
    }

    fn proxy(&self) -> &Proxy {
        &self.proxy
    }

    fn row(item: Envelope) -> (Uuid, Vec<u8>) {
        (item.id, item.payload)
    }

    /// The whole table, per tenant in `seq` order.
    async fn stored(&self) -> PerTenant<(Uuid, Vec<u8>)> {
        let sql = format!(
            "SELECT tenant, item_id, payload FROM \"{}\" ORDER BY tenant, seq",
            self.table
        );
        let mut out = PerTenant::new();
        for row in self.admin.query(&sql, &[]).await.expect("read back") {
            let tenant: Uuid = row.get(0);
            out.entry(TenantId::from_u128(tenant.as_u128()))
                .or_default()
                .push((row.get(1), row.get(2)));
        }
        out
    }
}

impl World {
    async fn drop_table(&self) {
        postgres::drop_table(&self.admin, &self.table).await;
    }
}

// (a) S-W5, I1 through the driver: the reply to a write is cut after the
// server committed it (a slice of one statement is an implicit
// transaction, committed before `INSERT 0 16` is sent); the sink sees a
// lost connection, the driver retries the identical slice and the key
// absorbs it: one copy, in order.
#[tokio::test]
async fn a_retry_after_a_cut_commit_reply_leaves_one_copy() {
    let Some(w) = setup("e2e_pg_cut_commit", 16, 1_000).await else {
        return;
    };
    let tenant = TenantId::new_v7();
    let mut want = PerTenant::new();

    // Staged before the writer runs: slices of 16, 16 and 8.
    let cut = w.proxy.cut_reply_on(b"INSERT 0 16\0");
    w.stage(tenant, &items("a", 40), &mut want);
    let report = w.outbox.flush(DEADLINE).await;
    cut.fired(DEADLINE).await;
    assert_eq!(
        report,
        Report {
            written: 40,
            ..Report::default()
        }
    );

    assert_eq!(w.stored().await, want, "one copy of each item, in order");
    let c = w.outbox.counters();
    assert!(c.failed_attempts >= 1, "the cut attempt failed: {c:?}");
    assert!(c.attempts > c.writes, "and was retried: {c:?}");
    assert_eq!((c.written, c.pending, c.lost_total()), (40, 0, 0));
    let _ = w.outbox.shutdown(DEADLINE).await;
    w.drop_table().await;
}

// (b) S-W3, S-W5, I1, I4: several tenants stage concurrently from their own
// tasks while the connection is cut after a COMMIT, cut after an INSERT
// (inside a transaction, or after an implicit one), refused, and stalled
// past the write timeout; every tenant's rows end up exactly once, in
// staging order.
#[tokio::test]
async fn order_per_tenant_holds_across_retries_with_concurrent_stagers() {
    const TENANTS: usize = 6;
    const PER_ROUND: usize = 30;
    const ROUNDS: usize = 4;
    // Slices of up to 16 items in statements of 5 rows: a slice of more
    // than 5 is an explicit transaction, and a cut after an INSERT lands
    // inside it. Stagers stage in bursts of 10 (the test runtime has one
    // thread), so every round has such slices.
    let Some(w) = setup("e2e_pg_order", 16, 5).await else {
        return;
    };
    let w = Arc::new(w);
    let barrier = Arc::new(Barrier::new(TENANTS + 1));
    let stagers = e2e::spawn_stagers(&w, &barrier, tenants(TENANTS), ROUNDS, PER_ROUND, 10);

    let start = Instant::now();
    for round in 0..ROUNDS {
        let failed = w.outbox.counters().failed_attempts;
        match round {
            0 => {
                let cut = w.proxy.cut_reply_on(b"COMMIT\0");
                barrier.wait().await;
                barrier.wait().await;
                cut.fired(DEADLINE).await;
            }
            1 => {
                let cut = w.proxy.cut_reply_on(b"INSERT 0 ");
                barrier.wait().await;
                barrier.wait().await;
                cut.fired(DEADLINE).await;
            }
            2 => {
                w.proxy.set_mode(Mode::Refuse);
                w.proxy.cut_all();
                barrier.wait().await;
                barrier.wait().await;
                w.failures_above(failed).await;
                w.proxy.set_mode(Mode::Pass);
            }
            _ => {
                w.proxy.set_mode(Mode::Stall);
                barrier.wait().await;
                barrier.wait().await;
                w.failures_above(failed).await;
                w.proxy.set_mode(Mode::Pass);
            }
        }
    }
    e2e::all_once_in_order(&*w, stagers, start, TENANTS, PER_ROUND * ROUNDS).await;
    w.drop_table().await;
}

/// Stalls the server: every attempt now hangs until the write timeout cuts
/// it.
fn stalled(proxy: &Proxy) {
    proxy.set_mode(Mode::Stall);
}

// (c) S-W9, S-B6, S-W14, S-W11: the server stays away past the shutdown
// deadline. Exactly the unwritten items are counted lost (report, counters,
// metrics) and handed back, per tenant in staging order; the table holds
// exactly what was written before.
#[tokio::test]
async fn a_server_away_past_the_deadline_loses_exactly_the_unwritten_items() {
    // Slices of 5: a tenant's dead letters come as an in-flight slice and a
    // backlog.
    let Some(w) = setup("e2e_pg_away", 5, 1_000).await else {
        return;
    };
    let (first, second) = e2e::written_then(&w, stalled).await;
    w.failures_above(0).await; // a hung write was cut and is backing off
    e2e::lost_past_the_deadline(&w, &second).await;

    // Still stalled: nothing of the second round reached the table.
    assert_eq!(w.stored().await, first);
    drop(w.proxy); // closes every connection: the server rolls back
    w.admin
        .batch_execute(&format!("DROP TABLE \"{}\"", w.table))
        .await
        .expect("drop the table");
}

// (d) S-W9: the server is away when the shutdown starts and returns before
// its deadline: the drain retries through it and nothing is lost.
#[tokio::test]
async fn a_server_back_before_the_deadline_loses_nothing() {
    let Some(w) = setup("e2e_pg_back", 5, 1_000).await else {
        return;
    };
    let (first, second) = e2e::written_then(&w, stalled).await;
    e2e::nothing_lost_when_back(&w, first, second).await;
    w.drop_table().await;
}
