//! End-to-end fault tests through the driver: an [`Outbox`] writing into a
//! real PostgreSQL server through a fault-injecting proxy. Needs
//! `OUTBOX_TEST_POSTGRES_URL` (skipped when unset, failing when set and
//! unreachable). Each test runs on real time, in about a second.
#![cfg(feature = "postgres")]

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::proxy::{Mode, Proxy};
use common::recorder::Recorder;
use common::servers::{self, eventually};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use outbox::sinks::postgres::PostgresSink;
use outbox::sinks::Envelope;
use outbox::telemetry::names;
use outbox::{Config, LostReason, Outbox, Report, Staged, TenantId};
use tokio::sync::Barrier;
use tokio_postgres::{Client, NoTls};
use uuid::Uuid;

const VAR: &str = "OUTBOX_TEST_POSTGRES_URL";
/// Bounds every wait on the server or the outbox: a test that needs it
/// has failed.
const DEADLINE: Duration = Duration::from_secs(10);
/// Cuts a hung write (S-B3): far above a write's few milliseconds on
/// loopback, far below the tests' deadlines.
const WRITE_TIMEOUT: Duration = Duration::from_millis(300);
const CONCURRENCY: usize = 4;

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
    let url = servers::url(VAR, test)?;
    let config: tokio_postgres::Config = url.parse().expect("a valid postgres URL");
    let (admin, conn) = config
        .connect(NoTls)
        .await
        .unwrap_or_else(|e| panic!("{VAR}={url} is set but the server does not answer: {e}"));
    tokio::spawn(conn);
    let proxy = Proxy::start(upstream_addr(&config).await).await;

    let mut through = tokio_postgres::Config::new();
    through.host("127.0.0.1").port(proxy.addr().port());
    if let Some(user) = config.get_user() {
        through.user(user);
    }
    if let Some(db) = config.get_dbname() {
        through.dbname(db);
    }
    if let Some(password) = config.get_password() {
        through.password(password);
    }
    let manager = Manager::from_config(
        through,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    let pool = Pool::builder(manager)
        .max_size(CONCURRENCY)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(Duration::from_secs(1)))
        .create_timeout(Some(Duration::from_millis(200)))
        .recycle_timeout(Some(Duration::from_millis(200)))
        .build()
        .expect("pool");
    let table = servers::unique_name(test);
    let sink = PostgresSink::new(pool, &table)
        .expect("valid table name")
        .max_rows_per_statement(rows_per_statement);
    sink.create_table().await.expect("create the table");

    let config = Config::builder()
        .concurrency(CONCURRENCY)
        .max_batch(max_batch)
        .initial_backoff(Duration::from_millis(10))
        .max_backoff(Duration::from_millis(80))
        .write_timeout(WRITE_TIMEOUT)
        .build()
        .expect("config");
    let metrics = Recorder::new();
    let outbox = metrics
        .install(|| Outbox::builder(sink).config(config).build())
        .expect("build the outbox");
    Some(World {
        admin,
        proxy,
        outbox,
        metrics,
        table,
    })
}

async fn upstream_addr(config: &tokio_postgres::Config) -> SocketAddr {
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        _ => "127.0.0.1".to_owned(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let addr = tokio::net::lookup_host((host.as_str(), port))
        .await
        .expect("resolve the postgres host")
        .find(|a| a.is_ipv4())
        .expect("an IPv4 address for the postgres host");
    addr
}

/// Per tenant, the items in staging order (or as stored, in `seq` order).
type PerTenant = BTreeMap<TenantId, Vec<(Uuid, Vec<u8>)>>;

impl World {
    /// The whole table, per tenant in `seq` order.
    async fn stored(&self) -> PerTenant {
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

    fn stage(&self, tenant: TenantId, items: &[Envelope], want: &mut PerTenant) {
        for item in items {
            assert_eq!(self.outbox.stage(tenant, item.clone()), Staged::Accepted);
            want.entry(tenant)
                .or_default()
                .push((item.id, item.payload.clone()));
        }
    }

    /// Waits (bounded) until the outbox has counted more than `than`
    /// failed attempts.
    async fn failures_above(&self, than: u64) {
        eventually("a failed attempt", DEADLINE, || async {
            (self.outbox.counters().failed_attempts > than).then_some(())
        })
        .await;
    }

    fn lost_metric(&self, reason: LostReason) -> u64 {
        self.metrics.counter(
            names::EVENTS_LOST,
            self.outbox.name(),
            Some(reason.as_str()),
        )
    }

    fn pending_gauge(&self) -> f64 {
        self.metrics.gauge(names::PENDING, self.outbox.name())
    }

    async fn drop_table(&self) {
        let sql = format!("DROP TABLE IF EXISTS \"{}\"", self.table);
        self.admin
            .batch_execute(&sql)
            .await
            .expect("drop the table");
    }
}

fn items(tag: &str, n: usize) -> Vec<Envelope> {
    (0..n)
        .map(|i| Envelope::new(format!("{tag}-{i}").into_bytes()))
        .collect()
}

fn tenants(n: usize) -> Vec<TenantId> {
    (0..n).map(|_| TenantId::new_v7()).collect()
}

/// The dead letters of a shutdown, per tenant: its runs concatenated in
/// the order given (an in-flight slice, then the backlog).
fn dead_letters(unwritten: Vec<(TenantId, Vec<Envelope>)>) -> PerTenant {
    let mut out = PerTenant::new();
    for (tenant, run) in unwritten {
        out.entry(tenant)
            .or_default()
            .extend(run.into_iter().map(|e| (e.id, e.payload)));
    }
    out
}

fn total(p: &PerTenant) -> u64 {
    p.values().map(|v| v.len() as u64).sum()
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
    let stagers: Vec<_> = tenants(TENANTS)
        .into_iter()
        .enumerate()
        .map(|(n, tenant)| {
            let (w, barrier) = (Arc::clone(&w), Arc::clone(&barrier));
            tokio::spawn(async move {
                let mut want = PerTenant::new();
                for round in 0..ROUNDS {
                    barrier.wait().await; // the round's fault is armed
                    for burst in items(&format!("t{n}-r{round}"), PER_ROUND).chunks(10) {
                        w.stage(tenant, burst, &mut want);
                        tokio::task::yield_now().await;
                    }
                    barrier.wait().await; // the round is staged
                }
                want
            })
        })
        .collect();

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
    let mut want = PerTenant::new();
    for stager in stagers {
        want.extend(stager.await.expect("a stager"));
    }
    let report = w.outbox.flush(DEADLINE).await;
    eprintln!("faults and flush took {:?}", start.elapsed());
    assert_eq!(report.pending, 0, "{report:?}");

    let stored = w.stored().await;
    assert_eq!(stored.len(), TENANTS);
    assert_eq!(total(&stored), (TENANTS * PER_ROUND * ROUNDS) as u64);
    assert_eq!(stored, want, "per tenant: exactly once, in staging order");
    let c = w.outbox.counters();
    assert_eq!(c.written, total(&want));
    assert_eq!((c.pending, c.lost_total(), c.dropped_total()), (0, 0, 0));
    assert!(
        c.failed_attempts >= 4,
        "every round's fault failed a write: {c:?}"
    );
    let _ = w.outbox.shutdown(DEADLINE).await;
    w.drop_table().await;
}

/// Stages a first round and writes it, then stalls the server (every
/// attempt now hangs until the write timeout cuts it) and stages a second
/// round, which no attempt can write; returns both, per tenant.
async fn written_then_stalled(w: &World) -> (PerTenant, PerTenant) {
    let mut first = PerTenant::new();
    let mut second = PerTenant::new();
    let ts = tenants(3);
    for (n, &t) in ts.iter().enumerate() {
        w.stage(t, &items(&format!("t{n}-first"), 10), &mut first);
    }
    let report = w.outbox.flush(DEADLINE).await;
    assert_eq!(report.written, 30, "{report:?}");
    w.proxy.set_mode(Mode::Stall);
    for (n, &t) in ts.iter().enumerate() {
        w.stage(t, &items(&format!("t{n}-second"), 12), &mut second);
    }
    (first, second)
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
    let (first, second) = written_then_stalled(&w).await;
    w.failures_above(0).await; // a hung write was cut and is backing off

    let deadline = Duration::from_millis(700);
    let start = Instant::now();
    let shutdown = w.outbox.shutdown(deadline);
    // After the fence: refused, lost under `shutdown`, not a dead letter.
    let late = TenantId::new_v7();
    assert_eq!(
        w.outbox.stage(late, Envelope::new(b"late".to_vec())),
        Staged::Refused
    );
    let sd = shutdown.await;
    let took = start.elapsed();
    assert!(
        took >= deadline && took < deadline + Duration::from_secs(2),
        "{took:?}"
    );

    let lost = total(&second);
    assert_eq!(lost, 36);
    assert!(sd.first);
    assert_eq!(
        sd.report,
        Report {
            written: 0,
            dropped: 0,
            lost,
            pending: 0,
            deadline_passed: true,
        }
    );
    assert_eq!(
        dead_letters(sd.unwritten),
        second,
        "the dead letters are exactly the unwritten items, per tenant in order"
    );

    let c = w.outbox.counters();
    assert_eq!(c.lost_for(LostReason::Deadline), lost);
    assert_eq!(c.lost_for(LostReason::Shutdown), 1);
    assert_eq!(c.lost_total(), lost + 1);
    assert_eq!((c.written, c.pending, c.staged), (30, 0, 30 + lost + 1));
    assert!(c.balanced(), "{c:?}");
    assert_eq!(w.outbox.pending(), 0);
    assert_eq!(w.lost_metric(LostReason::Deadline), lost);
    assert_eq!(w.lost_metric(LostReason::Shutdown), 1);
    assert_eq!(
        w.metrics
            .counter(names::ITEMS_WRITTEN, w.outbox.name(), None),
        30
    );
    assert_eq!(w.pending_gauge(), 0.0);

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
    let (first, second) = written_then_stalled(&w).await;

    let start = Instant::now();
    let shutdown = w.outbox.shutdown(DEADLINE);
    let failed = w.outbox.counters().failed_attempts;
    w.failures_above(failed).await; // the drain is failing: still away
    w.proxy.set_mode(Mode::Pass);
    let sd = shutdown.await;
    eprintln!("shutdown took {:?}", start.elapsed());

    assert_eq!(
        sd.report,
        Report {
            written: total(&second),
            ..Report::default()
        }
    );
    assert!(sd.unwritten.is_empty());
    let c = w.outbox.counters();
    assert_eq!((c.written, c.pending, c.lost_total()), (66, 0, 0));
    for reason in LostReason::ALL {
        assert_eq!(w.lost_metric(reason), 0, "{reason}");
    }
    assert_eq!(w.pending_gauge(), 0.0);

    let mut want = first;
    for (t, rows) in second {
        want.entry(t).or_default().extend(rows);
    }
    assert_eq!(w.stored().await, want, "all, once, in staging order");
    w.drop_table().await;
}
