//! A poison item (one whose write takes the relay down) against the real
//! PostgreSQL with a relay (S-T17, S-T18): each life of the relay runs on
//! a runtime of its own, and a write holding the poison item "crashes" it
//! (the runtime is dropped under the write: no lease released, the
//! in-flight record left behind, as a `kill -9` leaves them); the next
//! life counts the crash against the record's rows, delivers the suspects
//! alone, and once the poison row's count reaches `max_crash_attempts`
//! moves it to the dead-letter table as `poisoned`. Its healthy
//! neighbours, of its tenant and of others, are delivered and never
//! dead-lettered. `OUTBOX_TEST_POSTGRES_URL`: skipped when unset, failing
//! when set and unreachable.
#![cfg(all(feature = "table", feature = "testkit"))]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::table::{life_pool, Sink as Target, Usage, World};
use outbox::codec::{Codec, Postcard};
use outbox::sinks::postgres::PostgresSink;
use outbox::table::{PgStore, Relayed, TableNames, TableRelay};
use outbox::{Config, Outbox, Sink, WriteEpoch, WriteError, Written};
use tokio::sync::mpsc;

/// The poison item's id.
const POISON: u128 = 666;

/// The lease's ttl: a crashed life's leases lapse after it.
const TTL: Duration = Duration::from_millis(1500);

/// Crashed attempts after which a row is poisoned.
const MAX_CRASHES: u32 = 2;

/// The target sink; a write holding the poison item says so and never
/// ends (the test then drops its runtime: the crash).
struct Crashing {
    inner: Target,
    crashed: mpsc::UnboundedSender<()>,
}

impl Crashing {
    async fn poison(&self, items: &[Relayed<Usage>]) {
        if items.iter().any(|r| r.item.id == POISON) {
            let _ = self.crashed.send(());
            std::future::pending::<()>().await;
        }
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

/// One life of the relay: its runtime, its outbox, and where its crash
/// is announced.
struct Life {
    runtime: tokio::runtime::Runtime,
    outbox: Outbox<Crashing>,
    crashed: mpsc::UnboundedReceiver<()>,
}

/// What every life of these tests shares: a runtime of one worker (as a
/// process of its own would have), the store on `w`'s table, and the
/// relay's settings (a short poll and lease, `max_crash_attempts`).
fn life_parts(
    w: &World,
    url: &str,
    max_crash_attempts: u32,
) -> (tokio::runtime::Runtime, PgStore, TableRelay<u64, Usage>) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    let names = TableNames::new(&w.name).expect("name");
    let store = PgStore::new(life_pool(url), url.parse().expect("a postgres URL"), names);
    let relay = TableRelay::new("i1")
        .poll_interval(Duration::from_millis(50))
        .max_crash_attempts(max_crash_attempts)
        .lease(|b| {
            b.lease_ttl(TTL)
                .renew_every(TTL / 5)
                .max_clock_drift(TTL / 10)
                .acquire_poll(TTL / 10)
                .heartbeat_every(TTL / 10)
                .rejoin_grace(TTL / 2)
        });
    (runtime, store, relay)
}

fn life(w: &World) -> Life {
    let url = std::env::var(common::postgres::VAR).expect("set");
    let (runtime, store, relay) = life_parts(w, &url, MAX_CRASHES);
    let (tx, crashed) = mpsc::unbounded_channel();
    let sink = Crashing {
        inner: PostgresSink::new(life_pool(&url), &w.target).expect("name"),
        crashed: tx,
    };
    let outbox = Outbox::builder(sink)
        .runtime(runtime.handle().clone())
        .config(Config::builder().max_batch(1).build().expect("config"))
        .table(store, relay)
        .build()
        .expect("build");
    Life {
        runtime,
        outbox,
        crashed,
    }
}

/// The dead-letter table: (item id, reason, crashes).
async fn dead(w: &World) -> Vec<(u128, String, i64)> {
    let sql = format!(
        "SELECT item, reason, crashes::bigint FROM \"{}_dead\" ORDER BY id",
        w.name
    );
    let rows = w.admin.query(&sql, &[]).await.expect("the dead letters");
    rows.iter()
        .map(|r| {
            let item: Usage =
                Codec::<u64, Usage>::decode_item(&Postcard, &r.get::<_, Vec<u8>>(0)).expect("item");
            (item.id, r.get(1), r.get(2))
        })
        .collect()
}

/// The in-flight records, crash counts and leases, for a failure.
async fn state(w: &World) -> String {
    let n = &w.name;
    let sql = format!(
        "SELECT (SELECT coalesce(string_agg(first_id || ':' || ids::text, ' '), '') FROM \"{n}_in_flight\"), \
                (SELECT coalesce(string_agg(id || ':' || crashes, ' '), '') FROM \"{n}_crashes\"), \
                (SELECT coalesce(string_agg(partition || '=' || coalesce(owner, '-') || '@' || epoch || (CASE WHEN expiry > clock_timestamp() THEN ' live' ELSE '' END), ' '), '') FROM \"{n}_lease\"), \
                (SELECT coalesce(string_agg(id || '/' || partition, ' '), '') FROM \"{n}\")"
    );
    let r = w.admin.query_one(&sql, &[]).await.expect("state");
    format!(
        "in flight [{}] crashes [{}] leases [{}] rows [{}]",
        r.get::<_, String>(0),
        r.get::<_, String>(1),
        r.get::<_, String>(2),
        r.get::<_, String>(3)
    )
}

/// The target's item ids per tenant, in write order.
async fn delivered(w: &World) -> BTreeMap<i64, Vec<u128>> {
    let mut by_tenant: BTreeMap<i64, Vec<u128>> = BTreeMap::new();
    for (tenant, id) in w.target_rows().await {
        by_tenant.entry(tenant).or_default().push(id);
    }
    by_tenant
}

/// S-T17, S-T18: a row whose write crashes the relay, life after life,
/// is dead-lettered `poisoned` once its crashes reach
/// `max_crash_attempts`; its neighbours of the same tenant (before and
/// after it) and of other tenants are delivered, in order, and none of
/// them is dead-lettered.
#[tokio::test]
async fn a_row_that_crashes_the_relay_is_poisoned_and_its_neighbours_are_not() {
    let Some(w) = World::new("poisoned").await else {
        return;
    };
    for id in [1, 2, POISON, 3, 4] {
        w.stage(5, &[Usage::new(id)], true).await;
    }
    w.stage(6, &[Usage::new(10), Usage::new(11)], true).await;
    w.stage(7, &[Usage::new(20)], true).await;
    let expected: BTreeMap<i64, Vec<u128>> =
        [(5, vec![1, 2, 3, 4]), (6, vec![10, 11]), (7, vec![20])]
            .into_iter()
            .collect();

    let mut crashes = 0u32;
    let last = loop {
        assert!(crashes <= MAX_CRASHES, "crashed {crashes} times");
        let mut l = life(&w);
        let done = async {
            loop {
                // Rows written before a crash are in the target already:
                // the end is when the table is empty too.
                if !dead(&w).await.is_empty()
                    && delivered(&w).await == expected
                    && w.left().await == 0
                {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        tokio::select! {
            Some(()) = l.crashed.recv() => {
                crashes += 1;
                // The crash: every task of this life dropped where it
                // stands, nothing released.
                l.runtime.shutdown_background();
                drop(l.outbox);
                eprintln!("crash {crashes}: {}", state(&w).await);
            }
            () = done => break l,
            () = tokio::time::sleep(Duration::from_secs(30)) => {
                panic!("life {crashes}: neither a crash nor the end; delivered {:?}, dead {:?}",
                    delivered(&w).await, dead(&w).await);
            }
        }
    };
    let report = last
        .runtime
        .handle()
        .clone()
        .spawn({
            let outbox = last.outbox.clone();
            async move { outbox.shutdown(Duration::from_secs(5)).await }
        })
        .await
        .expect("the shutdown");
    let closed = last.outbox.closed();
    drop(last.outbox);
    last.runtime.spawn(closed).await.expect("closed");
    last.runtime.shutdown_background();

    // One crash per life until poisoned: every crash is counted against
    // the poison row, its record living until its last row is removed
    // (S-T17), and after the first crash it is written alone (S-T18).
    assert_eq!(crashes, MAX_CRASHES, "{crashes} crashes");
    assert_eq!(
        dead(&w).await,
        [(POISON, "poisoned".to_owned(), i64::from(MAX_CRASHES))],
        "only the poison row is dead-lettered"
    );
    assert_eq!(delivered(&w).await, expected, "every neighbour, in order");
    assert_eq!(w.left().await, 0, "report {report:?}; {}", state(&w).await);
    w.finish().await;
}

/// What [`Flaky`] does with the poison row's writes.
const CRASH: u8 = 0;
const FAIL: u8 = 1;
const WRITE: u8 = 2;

/// The target sink; a write holding the poison item crashes the life
/// (as [`Crashing`]), fails retryably, or goes, as `mode` says.
struct Flaky {
    inner: Target,
    crashed: mpsc::UnboundedSender<()>,
    mode: std::sync::Arc<std::sync::atomic::AtomicU8>,
    poison_attempts: std::sync::Arc<std::sync::atomic::AtomicU32>,
}

impl Flaky {
    async fn poison(&self, items: &[Relayed<Usage>]) -> Result<(), WriteError> {
        use std::sync::atomic::Ordering;
        if !items.iter().any(|r| r.item.id == POISON) {
            return Ok(());
        }
        self.poison_attempts.fetch_add(1, Ordering::SeqCst);
        match self.mode.load(Ordering::SeqCst) {
            CRASH => {
                let _ = self.crashed.send(());
                std::future::pending().await
            }
            FAIL => Err(WriteError::retryable("the poison row fails")),
            _ => Ok(()),
        }
    }
}

impl Sink for Flaky {
    type Tenant = u64;
    type Item = Relayed<Usage>;

    fn name(&self) -> &str {
        "flaky"
    }

    async fn write(&self, tenant: &u64, items: &[Relayed<Usage>]) -> Result<Written, WriteError> {
        self.poison(items).await?;
        self.inner.write(tenant, items).await
    }

    async fn write_with_epoch(
        &self,
        epoch: WriteEpoch,
        tenant: &u64,
        items: &[Relayed<Usage>],
    ) -> Result<Written, WriteError> {
        self.poison(items).await?;
        self.inner.write_with_epoch(epoch, tenant, items).await
    }
}

/// The crash counts: (row id, crashes).
async fn crash_counts(w: &World) -> Vec<(i64, i32)> {
    let sql = format!("SELECT id, crashes FROM \"{}_crashes\" ORDER BY id", w.name);
    let rows = w.admin.query(&sql, &[]).await.expect("the crash counts");
    rows.iter().map(|r| (r.get(0), r.get(1))).collect()
}

/// S-T18, S-W8: a suspect of a crash whose writes keep failing
/// (retryably, retried without end) holds no other tenant back: while it
/// waits for its retries, other tenants' rows are read and written; its
/// tenant's later rows wait behind it; the crashes of its life count
/// nothing new against it; once it goes, its tenant follows in order.
/// (Before: the suspect held the whole relay until it ended, and nothing
/// of the other tenants was written.)
#[tokio::test]
async fn a_suspect_that_keeps_failing_holds_no_other_tenant_back() {
    use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};
    use std::sync::Arc;
    let Some(w) = World::new("suspect_fails").await else {
        return;
    };
    let url = std::env::var(common::postgres::VAR).expect("set");
    for id in [POISON, 1, 2] {
        w.stage(5, &[Usage::new(id)], true).await;
    }
    let mode = Arc::new(AtomicU8::new(CRASH));
    let attempts = Arc::new(AtomicU32::new(0));
    let life = |w: &World| {
        let (runtime, store, relay) = life_parts(w, &url, 3);
        let (tx, crashed) = mpsc::unbounded_channel();
        let sink = Flaky {
            inner: PostgresSink::new(life_pool(&url), &w.target).expect("name"),
            crashed: tx,
            mode: Arc::clone(&mode),
            poison_attempts: Arc::clone(&attempts),
        };
        let config = Config::builder()
            .max_batch(1)
            .max_backoff(Duration::from_millis(200))
            .build()
            .expect("config");
        let outbox = Outbox::builder(sink)
            .runtime(runtime.handle().clone())
            .config(config)
            .table(store, relay)
            .build()
            .expect("build");
        (runtime, outbox, crashed)
    };

    // Life 1: the poison row's write crashes it; every row read is now a
    // suspect.
    let (runtime, outbox, mut crashed) = life(&w);
    tokio::time::timeout(Duration::from_secs(30), crashed.recv())
        .await
        .expect("the crash");
    runtime.shutdown_background();
    drop(outbox);

    // Life 2: the poison row's writes fail, retried without end; other
    // tenants stage meanwhile.
    mode.store(FAIL, Ordering::SeqCst);
    attempts.store(0, Ordering::SeqCst);
    let (runtime, outbox, _crashed) = life(&w);
    w.stage(6, &[Usage::new(10), Usage::new(11)], true).await;
    w.stage(7, &[Usage::new(20)], true).await;
    let others: BTreeMap<i64, Vec<u128>> = [(6, vec![10, 11]), (7, vec![20])].into_iter().collect();
    let started = std::time::Instant::now();
    loop {
        let d = delivered(&w).await;
        if d == others && attempts.load(Ordering::SeqCst) >= 3 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the others wait behind the failing suspect: delivered {d:?}, {} attempts of it; {}",
            attempts.load(Ordering::SeqCst),
            state(&w).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        crash_counts(&w)
            .await
            .iter()
            .find(|(id, _)| *id == 1)
            .map(|c| c.1),
        Some(1),
        "no crash counted against the suspect in this life: {}",
        state(&w).await
    );
    assert!(dead(&w).await.is_empty());

    // The poison row goes: its tenant follows, in order.
    mode.store(WRITE, Ordering::SeqCst);
    let expected: BTreeMap<i64, Vec<u128>> =
        [(5, vec![POISON, 1, 2]), (6, vec![10, 11]), (7, vec![20])]
            .into_iter()
            .collect();
    let started = std::time::Instant::now();
    while !(delivered(&w).await == expected && w.left().await == 0) {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "delivered {:?}; {}",
            delivered(&w).await,
            state(&w).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(dead(&w).await.is_empty());
    let report = runtime
        .handle()
        .clone()
        .spawn({
            let outbox = outbox.clone();
            async move { outbox.shutdown(Duration::from_secs(5)).await }
        })
        .await
        .expect("the shutdown");
    drop(report);
    drop(outbox);
    runtime.shutdown_background();
    w.finish().await;
}
