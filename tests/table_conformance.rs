//! One conformance suite over the store interface (S-T27): every test body
//! runs against the real PostgreSQL (`pg::*`, needs
//! `OUTBOX_TEST_POSTGRES_URL`: skipped when unset, failing when set and
//! unreachable) and against the in-memory model (`model::*`), so the
//! simulation can trust the model.
#![cfg(all(feature = "table", feature = "testkit"))]

mod common;

use std::time::Duration;

use outbox::codec::Codec;
use outbox::core::lease::{Holder, InstanceId};
use outbox::core::relay::{
    DeadLetterRow, DeadReason, Fence, Fenced, InFlight, PageRequest, PartitionRead, Position,
    ReadOrder, Recorded, Removal, Row, StoreErrorKind, TenantRead,
};
use outbox::table::model::{Model, ModelConfig, ModelStore, SessionId};
use outbox::table::{
    partition_of, Acquire, Acquired, EpochTx, Installed, LeaseKey, Listener, OutboxTable, PgStore,
    Store, TableNames, Wakeup,
};
use outbox::BoxError;

const P: u32 = 8;
const LOCK_TIMEOUT: Duration = Duration::from_millis(300);
const IDLE_TIMEOUT: Duration = Duration::from_millis(1000);

/// A lost reply to make.
#[derive(Clone, Copy)]
enum Reply {
    /// A stager's COMMIT.
    Commit,
    /// The next one-row SELECT (a removal).
    Select,
}

/// A stager's open transaction.
trait Stager {
    async fn stage(&mut self, tenant: &[u8], item: &[u8], notify: bool) -> i64;
    async fn fail_statement(&mut self);
    async fn commit(self) -> Result<(), outbox::core::relay::StoreError>;
    async fn rollback(self);
}

/// One backend of the suite.
trait Backend {
    type S: Store;
    type T: Stager;
    fn store(&self) -> &Self::S;
    async fn begin(&self) -> Self::T;
    /// Lets `d` pass on the store's clock.
    async fn pass(&self, d: Duration);
    /// How long to wait to see that nothing arrives.
    fn quiet(&self) -> Duration;
    /// The next store call fails without effect.
    async fn break_next(&self);
    async fn heal(&self);
    /// The next such reply is lost after the server acted.
    async fn lose_next_reply(&self, reply: Reply);
    /// Every listener's connection goes away.
    async fn drop_listeners(&self);
    /// Waits until every transaction that ended before the call is below
    /// the watermark (other sessions of the cluster may hold it back).
    async fn caught_up(&self);
}

// ---- the model ----

struct ModelBackend {
    model: Model,
    store: ModelStore,
}

impl ModelBackend {
    fn new() -> Self {
        let model = Model::new(ModelConfig {
            partitions: P,
            lock_timeout: LOCK_TIMEOUT,
            idle_in_transaction_timeout: IDLE_TIMEOUT,
        });
        let store = model.store();
        ModelBackend { model, store }
    }
}

struct ModelStager {
    model: Model,
    session: SessionId,
}

impl Stager for ModelStager {
    async fn stage(&mut self, tenant: &[u8], item: &[u8], notify: bool) -> i64 {
        self.model
            .stage(self.session, tenant, item, 0, notify)
            .expect("stage")
    }
    async fn fail_statement(&mut self) {
        self.model.fail_statement(self.session);
    }
    async fn commit(self) -> Result<(), outbox::core::relay::StoreError> {
        self.model.commit(self.session).map(|_| ())
    }
    async fn rollback(self) {
        self.model.rollback(self.session);
    }
}

impl Backend for ModelBackend {
    type S = ModelStore;
    type T = ModelStager;
    fn store(&self) -> &ModelStore {
        &self.store
    }
    async fn begin(&self) -> ModelStager {
        ModelStager {
            model: self.model.clone(),
            session: self.model.begin(),
        }
    }
    async fn pass(&self, d: Duration) {
        // Let a waiting call register before the clock moves.
        tokio::task::yield_now().await;
        self.model.advance(d);
        tokio::task::yield_now().await;
    }
    fn quiet(&self) -> Duration {
        Duration::from_millis(20)
    }
    async fn break_next(&self) {
        self.model.fail_next(1);
    }
    async fn heal(&self) {}
    async fn lose_next_reply(&self, _reply: Reply) {
        self.model.lose_next_reply(1);
    }
    async fn drop_listeners(&self) {
        self.model.disconnect_listeners();
    }
    async fn caught_up(&self) {}
}

// ---- PostgreSQL ----

/// Stages the raw bytes, as the model does.
#[derive(Clone, Copy)]
struct Raw;

impl Codec<Vec<u8>, Vec<u8>> for Raw {
    fn encode_tenant(&self, t: &Vec<u8>, out: &mut Vec<u8>) -> Result<(), BoxError> {
        out.extend_from_slice(t);
        Ok(())
    }
    fn decode_tenant(&self, b: &[u8]) -> Result<Vec<u8>, BoxError> {
        Ok(b.to_vec())
    }
    fn encode_item(&self, i: &Vec<u8>, out: &mut Vec<u8>) -> Result<(), BoxError> {
        out.extend_from_slice(i);
        Ok(())
    }
    fn decode_item(&self, b: &[u8]) -> Result<Vec<u8>, BoxError> {
        Ok(b.to_vec())
    }
}

struct PgBackend {
    admin: tokio_postgres::Client,
    proxy: common::proxy::Proxy,
    pool: deadpool_postgres::Pool,
    store: PgStore,
    name: String,
    app: String,
    notifying: OutboxTable<Vec<u8>, Vec<u8>, Raw>,
    quiet_table: OutboxTable<Vec<u8>, Vec<u8>, Raw>,
}

impl PgBackend {
    async fn new(test: &str) -> Option<Self> {
        let (mut admin, proxy, pool) =
            common::postgres::connect(test, 4, Duration::from_secs(2), Duration::from_secs(1))
                .await?;
        let short: String = test
            .chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .take(10)
            .collect();
        let name = common::servers::unique_name(&format!("ct{short}"));
        let names = TableNames::new(&name).expect("a valid name");
        outbox::table::migrate(&mut admin, &names, P)
            .await
            .expect("migrate");
        let url = std::env::var(common::postgres::VAR).expect("set");
        let mut listen: tokio_postgres::Config = url.parse().expect("a postgres URL");
        let app = format!("l_{name}");
        listen.application_name(&app);
        let store = PgStore::new(pool.clone(), listen, names)
            .lock_timeout(LOCK_TIMEOUT)
            .idle_in_transaction_timeout(IDLE_TIMEOUT);
        let notifying = OutboxTable::with_codec(&name, Raw).expect("name");
        let quiet_table = OutboxTable::with_codec(&name, Raw)
            .expect("name")
            .wakeup(Wakeup::None);
        Some(PgBackend {
            admin,
            proxy,
            pool,
            store,
            name,
            app,
            notifying,
            quiet_table,
        })
    }

    async fn finish(self) {
        let n = &self.name;
        let sql = format!(
            "DROP TABLE IF EXISTS \"{n}\", \"{n}_dead\", \"{n}_in_flight\", \"{n}_crashes\", \
             \"{n}_lease\", \"{n}_member\", \"{n}_sink_epoch\", \"{n}_schema\" CASCADE; \
             DROP FUNCTION IF EXISTS \"{n}_partition\"(bytea), \"{n}_partitions\"()"
        );
        self.admin.batch_execute(&sql).await.expect("clean up");
    }
}

struct PgStager {
    client: deadpool_postgres::Object,
    notifying: OutboxTable<Vec<u8>, Vec<u8>, Raw>,
    quiet_table: OutboxTable<Vec<u8>, Vec<u8>, Raw>,
}

impl Stager for PgStager {
    async fn stage(&mut self, tenant: &[u8], item: &[u8], notify: bool) -> i64 {
        let table = if notify {
            &self.notifying
        } else {
            &self.quiet_table
        };
        table
            .stage(&**self.client, &tenant.to_vec(), &item.to_vec())
            .await
            .expect("stage")
    }
    async fn fail_statement(&mut self) {
        let failed = self.client.batch_execute("SELECT 1/0").await;
        assert!(failed.is_err());
    }
    async fn commit(self) -> Result<(), outbox::core::relay::StoreError> {
        let result = self.client.batch_execute("COMMIT").await;
        result.map_err(|e| {
            let kind = if e.code().is_some() {
                StoreErrorKind::Refused
            } else {
                StoreErrorKind::Unknown
            };
            outbox::core::relay::StoreError::new(kind, None, e)
        })
    }
    async fn rollback(self) {
        self.client
            .batch_execute("ROLLBACK")
            .await
            .expect("rollback");
    }
}

impl Backend for PgBackend {
    type S = PgStore;
    type T = PgStager;
    fn store(&self) -> &PgStore {
        &self.store
    }
    async fn begin(&self) -> PgStager {
        let client = self.pool.get().await.expect("a connection");
        client.batch_execute("BEGIN").await.expect("begin");
        PgStager {
            client,
            notifying: self.notifying.clone(),
            quiet_table: self.quiet_table.clone(),
        }
    }
    async fn pass(&self, d: Duration) {
        // The server's clock: real time passes.
        tokio::time::sleep(d).await;
    }
    fn quiet(&self) -> Duration {
        Duration::from_millis(300)
    }
    async fn break_next(&self) {
        self.proxy.set_mode(common::proxy::Mode::Refuse);
        self.proxy.cut_all();
    }
    async fn heal(&self) {
        self.proxy.set_mode(common::proxy::Mode::Pass);
    }
    async fn lose_next_reply(&self, reply: Reply) {
        let pattern: &[u8] = match reply {
            Reply::Commit => b"COMMIT\0",
            Reply::Select => b"SELECT 1\0",
        };
        drop(self.proxy.cut_reply_on(pattern));
    }
    async fn drop_listeners(&self) {
        self.admin
            .execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
                &[&self.app],
            )
            .await
            .expect("terminate the listener");
    }
    async fn caught_up(&self) {
        let x: i64 = self
            .admin
            .query_one("SELECT pg_current_xact_id()::text::bigint", &[])
            .await
            .expect("an xid")
            .get(0);
        common::servers::eventually("the watermark", Duration::from_secs(20), || async {
            let xmin: i64 = self
                .admin
                .query_one(
                    "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint",
                    &[],
                )
                .await
                .expect("xmin")
                .get(0);
            (xmin > x).then_some(())
        })
        .await;
    }
}

/// The PostgreSQL bodies run one at a time: each holds transactions open
/// on purpose, and the watermark is the whole cluster's.
static PG_ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

// ---- helpers ----

const OWNER: &str = "instance-a";
const TTL: Duration = Duration::from_secs(30);

/// A tenant whose partition is `p`.
fn tenant_in(p: u32, salt: u8) -> Vec<u8> {
    (0u32..)
        .map(|i| {
            let mut t = vec![salt];
            t.extend_from_slice(&i.to_be_bytes());
            t
        })
        .find(|t| partition_of(t, P) == p)
        .expect("some tenant hashes into p")
}

async fn read<B: Backend>(
    b: &B,
    order: ReadOrder,
    p: u32,
    after: Option<Position>,
) -> (u64, Vec<Row>) {
    let request = PageRequest {
        order,
        partitions: vec![PartitionRead {
            partition: p,
            after,
            limit: 100,
        }],
        tenants: vec![],
    };
    let page = b.store().read_page(&request).await.expect("read");
    (page.xmin, page.partitions.into_iter().next().unwrap())
}

/// Partition `p`'s rows once every ended transaction is below the
/// watermark.
async fn rows<B: Backend>(b: &B, p: u32) -> Vec<Row> {
    b.caught_up().await;
    read(b, ReadOrder::Watermark, p, None).await.1
}

fn ids(rows: &[Row]) -> Vec<i64> {
    rows.iter().map(|r| r.id).collect()
}

async fn take<B: Backend>(b: &B, p: u32, owner: &str, above: u64) -> u64 {
    let a = Acquire {
        partition: p,
        owner: owner.into(),
        above,
        ttl: TTL,
    };
    match b.store().acquire(&a).await.expect("acquire") {
        Acquired::Taken { epoch } => epoch,
        held => panic!("not taken: {held:?}"),
    }
}

fn fence(p: u32, epoch: u64) -> Fence {
    Fence {
        owner: OWNER.into(),
        epochs: vec![(p, epoch)],
    }
}

fn holder(instance: &str, incarnation: u64) -> Holder {
    Holder {
        instance: InstanceId::new(instance).expect("a valid id"),
        incarnation,
    }
}

/// The sink's `(partition, epoch)`s.
async fn epochs_of<B: Backend>(b: &B) -> Vec<(u32, u64)> {
    let rows = b.store().sink_epochs().await.expect("sink epochs");
    rows.iter().map(|r| (r.partition, r.epoch)).collect()
}

/// A call retried a few times: after a cut connection, a pooled one may
/// fail once more before the pool drops it.
async fn retry<T, F, Fut>(mut call: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, outbox::core::relay::StoreError>>,
{
    let mut last = None;
    for _ in 0..3 {
        match call().await {
            Ok(v) => return v,
            Err(e) => last = Some(e),
        }
    }
    panic!("still failing: {last:?}")
}

async fn committed<B: Backend>(b: &B, tenant: &[u8], items: &[&[u8]]) -> Vec<i64> {
    let mut tx = b.begin().await;
    let mut out = Vec::new();
    for item in items {
        out.push(tx.stage(tenant, item, false).await);
    }
    tx.commit().await.expect("commit");
    out
}

// ---- the bodies ----

/// S-T5: committed rows come back in (xid, id) order; a rolled-back row
/// never does.
async fn committed_rows_read_in_xid_order_rolled_back_never<B: Backend>(b: &B) {
    let t = tenant_in(1, 0);
    let a = committed(b, &t, &[b"a1", b"a2"]).await;
    let mut rb = b.begin().await;
    rb.stage(&t, b"rolled back", false).await;
    rb.rollback().await;
    let c = committed(b, &t, &[b"c1"]).await;
    b.caught_up().await;
    let (xmin, got) = read(b, ReadOrder::Watermark, 1, None).await;
    assert_eq!(ids(&got), [a[0], a[1], c[0]]);
    assert!(got
        .iter()
        .all(|r| r.xid < xmin && r.partition == 1 && r.tenant == t));
    assert!(got[0].xid == got[1].xid && got[1].xid < got[2].xid);
    assert_eq!(got[0].item, b"a1");
    let after = read(b, ReadOrder::Watermark, 1, Some(got[1].position()))
        .await
        .1;
    assert_eq!(ids(&after), [c[0]]);
}

/// S-T5, S-T6: a late-committing transaction holds the watermark back;
/// its rows then come first (xid order), where a reader of "ids above the
/// last seen" has already passed them.
async fn late_committing_transaction_holds_the_watermark<B: Backend>(b: &B) {
    let t = tenant_in(2, 0);
    let mut late = b.begin().await;
    let x = late.stage(&t, b"late", false).await;
    let y = committed(b, &t, &[b"early"]).await[0];
    let (xmin, got) = read(b, ReadOrder::Watermark, 2, None).await;
    assert!(got.is_empty(), "nothing at or above xmin {xmin}: {got:?}");
    let (_, naive) = read(b, ReadOrder::IdAboveLastSeen, 2, None).await;
    assert_eq!(
        ids(&naive),
        [y],
        "the naive reader sees only the early commit"
    );
    late.commit().await.expect("commit");
    let got = rows(b, 2).await;
    assert_eq!(ids(&got), [x, y]);
    let last_seen = Position { xid: 0, id: y };
    let (_, naive) = read(b, ReadOrder::IdAboveLastSeen, 2, Some(last_seen)).await;
    assert!(
        naive.is_empty(),
        "the naive reader skipped the late row for good"
    );
}

/// S-T36: `horizon` reports the oldest open transaction holding the
/// watermark and the relay's lag, both on the store's clock.
async fn horizon_reports_the_oldest_transaction_and_the_lag<B: Backend>(b: &B) {
    let t = tenant_in(4, 7);
    let before = b.store().horizon().await.expect("horizon");
    assert_eq!(before.lag, None, "an empty table has no lag");
    let mut open = b.begin().await;
    open.stage(&t, b"held", false).await;
    b.pass(Duration::from_millis(150)).await;
    let during = b.store().horizon().await.expect("horizon");
    let oldest = during.oldest_transaction.expect("an open transaction");
    assert!(oldest >= Duration::from_millis(150), "{oldest:?}");
    assert_eq!(during.lag, None, "an uncommitted row is no lag");
    open.commit().await.expect("commit");
    b.pass(Duration::from_millis(50)).await;
    let after = b.store().horizon().await.expect("horizon");
    let lag = after.lag.expect("a committed row");
    assert!(lag >= Duration::from_millis(200), "{lag:?}");
}

/// `now()` is the transaction's start: rows staged apart in one
/// transaction share their staging time, so their ages are equal.
async fn now_is_the_transaction_start<B: Backend>(b: &B) {
    let t = tenant_in(3, 0);
    let mut tx = b.begin().await;
    tx.stage(&t, b"first", false).await;
    b.pass(Duration::from_millis(150)).await;
    tx.stage(&t, b"second", false).await;
    tx.commit().await.expect("commit");
    let got = rows(b, 3).await;
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].age, got[1].age);
    assert!(got[0].age >= Duration::from_millis(150), "{:?}", got[0].age);
}

/// S-T7, S-T9: one request reads several partitions after their cursors
/// and a tenant between two positions, with limits.
async fn page_reads_partitions_and_tenants<B: Backend>(b: &B) {
    let (t4, t5, u4) = (tenant_in(4, 0), tenant_in(5, 0), tenant_in(4, 1));
    let a = committed(b, &t4, &[b"1", b"2", b"3"]).await;
    let c = committed(b, &t5, &[b"1"]).await;
    let u = committed(b, &u4, &[b"1"]).await;
    let all4 = rows(b, 4).await;
    let request = PageRequest {
        order: ReadOrder::Watermark,
        partitions: vec![
            PartitionRead {
                partition: 4,
                after: Some(all4[0].position()),
                limit: 2,
            },
            PartitionRead {
                partition: 5,
                after: None,
                limit: 10,
            },
        ],
        tenants: vec![TenantRead {
            partition: 4,
            tenant: t4.clone(),
            after: Some(all4[0].position()),
            until: all4[1].position(),
            limit: 10,
        }],
    };
    let page = b.store().read_page(&request).await.expect("read");
    assert_eq!(ids(&page.partitions[0]), [a[1], a[2]], "{page:?}");
    assert_eq!(ids(&page.partitions[1]), [c[0]]);
    assert_eq!(ids(&page.tenants[0]), [a[1]]);
    assert_eq!(ids(&all4), [a[0], a[1], a[2], u[0]]);
}

/// S-T11, S-T12: rows are deleted by their exact ids, only under the
/// lease's owner and epoch; a repeat is a no-op.
async fn remove_deletes_exact_ids_under_the_fence<B: Backend>(b: &B) {
    let t = tenant_in(6, 0);
    let epoch = take(b, 6, OWNER, 0).await;
    let r = committed(b, &t, &[b"1", b"2", b"3"]).await;
    let stale = Fence {
        owner: OWNER.into(),
        epochs: vec![(6, epoch + 1)],
    };
    let removal = Removal {
        delete: vec![r[0], r[2]],
        dead: vec![],
        records: vec![],
    };
    let none = b.store().remove(&stale, &removal).await.expect("remove");
    assert!(none.deleted.is_empty() && none.stale == [6]);
    let other = Fence {
        owner: "someone-else".into(),
        epochs: vec![(6, epoch)],
    };
    assert_eq!(b.store().remove(&other, &removal).await.unwrap().stale, [6]);
    assert_eq!(ids(&rows(b, 6).await), r);
    let done = b
        .store()
        .remove(&fence(6, epoch), &removal)
        .await
        .expect("remove");
    assert_eq!(done.deleted, [r[0], r[2]]);
    assert!(done.stale.is_empty());
    assert_eq!(ids(&rows(b, 6).await), [r[1]]);
    let again = b
        .store()
        .remove(&fence(6, epoch), &removal)
        .await
        .expect("repeat");
    assert!(again.deleted.is_empty() && again.stale.is_empty());
}

/// S-T13: a dead-letter move keeps the reason, attempts and epoch, in the
/// transaction that deletes the row; a redrive stages it again; retention
/// purges old letters.
async fn dead_letters_move_redrive_and_purge<B: Backend>(b: &B) {
    let t = tenant_in(7, 0);
    let epoch = take(b, 7, OWNER, 0).await;
    let r = committed(b, &t, &[b"poison", b"fine"]).await;
    let removal = Removal {
        delete: vec![r[1]],
        dead: vec![DeadLetterRow {
            id: r[0],
            reason: DeadReason::Poisoned,
            attempts: 2,
        }],
        records: vec![],
    };
    let done = b
        .store()
        .remove(&fence(7, epoch), &removal)
        .await
        .expect("remove");
    assert_eq!((done.deleted, done.dead), (vec![r[1]], vec![r[0]]));
    assert!(rows(b, 7).await.is_empty());
    let dead = b.store().dead_letters(10).await.expect("dead letters");
    assert_eq!(dead.len(), 1);
    let d = &dead[0];
    assert_eq!(
        (d.id, d.reason.as_str(), d.attempts, d.epoch),
        (r[0], "poisoned", 2, epoch)
    );
    assert_eq!(
        (d.tenant.as_slice(), d.item.as_slice()),
        (t.as_slice(), &b"poison"[..])
    );
    assert_eq!(b.store().redrive(&[r[0]]).await.expect("redrive"), 1);
    let back = rows(b, 7).await;
    assert_eq!(back.len(), 1);
    assert!(back[0].id > r[1] && back[0].item == b"poison");
    assert!(b.store().dead_letters(10).await.unwrap().is_empty());
    let removal = Removal {
        delete: vec![],
        dead: vec![DeadLetterRow {
            id: back[0].id,
            reason: DeadReason::Expired,
            attempts: 0,
        }],
        records: vec![],
    };
    b.store()
        .remove(&fence(7, epoch), &removal)
        .await
        .expect("remove");
    assert_eq!(
        b.store()
            .purge_dead(Duration::from_secs(3600))
            .await
            .unwrap(),
        0
    );
    assert_eq!(b.store().dead_letters(10).await.unwrap().len(), 1);
    b.pass(Duration::from_millis(50)).await;
    assert_eq!(
        b.store()
            .purge_dead(Duration::from_millis(10))
            .await
            .unwrap(),
        1
    );
    assert!(b.store().dead_letters(10).await.unwrap().is_empty());
}

/// S-T17: in-flight records left by an owner that did not release become
/// one crash per row at the next owner's count; a release leaves none.
async fn in_flight_records_become_crashes_at_takeover<B: Backend>(b: &B) {
    let t = tenant_in(0, 9);
    let short = Acquire {
        partition: 0,
        owner: OWNER.into(),
        above: 0,
        ttl: Duration::from_millis(100),
    };
    let Acquired::Taken { epoch: e1 } = b.store().acquire(&short).await.unwrap() else {
        panic!()
    };
    let r = committed(b, &t, &[b"1", b"2"]).await;
    let rec = InFlight {
        partition: 0,
        ids: r.clone(),
    };
    let stale = Fence {
        owner: OWNER.into(),
        epochs: vec![(0, e1 + 5)],
    };
    assert_eq!(
        b.store()
            .record_attempts(&stale, std::slice::from_ref(&rec))
            .await
            .unwrap(),
        Recorded { stale: vec![0] }
    );
    assert_eq!(
        b.store()
            .record_attempts(&fence(0, e1), std::slice::from_ref(&rec))
            .await
            .unwrap(),
        Recorded::default()
    );
    b.pass(Duration::from_millis(150)).await;
    let e2 = take(b, 0, "instance-b", 0).await;
    assert!(e2 > e1);
    let b_fence = Fence {
        owner: "instance-b".into(),
        epochs: vec![(0, e2)],
    };
    assert_eq!(
        b.store().record_crashes(&fence(0, e1), 0).await.unwrap(),
        Fenced::Stale
    );
    assert_eq!(
        b.store().record_crashes(&b_fence, 0).await.unwrap(),
        Fenced::Done(2)
    );
    let got = rows(b, 0).await;
    assert!(got.iter().all(|r| r.crashes == 1), "{got:?}");
    assert_eq!(
        b.store().record_crashes(&b_fence, 0).await.unwrap(),
        Fenced::Done(0)
    );
    // A clean release leaves no record behind.
    b.store()
        .record_attempts(&b_fence, std::slice::from_ref(&rec))
        .await
        .unwrap();
    let key = LeaseKey {
        partition: 0,
        owner: "instance-b".into(),
        epoch: e2,
    };
    assert!(b.store().release(&key).await.unwrap());
    let e3 = take(b, 0, OWNER, 0).await;
    assert_eq!(
        b.store().record_crashes(&fence(0, e3), 0).await.unwrap(),
        Fenced::Done(0)
    );
    assert!(rows(b, 0).await.iter().all(|r| r.crashes == 1));
}

/// S-T17: the records of many partitions are written in one call, those
/// of a partition not held are not (and it is answered stale); a record
/// stays while rows it covers are deleted, and goes only when a removal
/// names it; the next owner counts a crash for each of its rows still in
/// the table; two records with one first row are refused whole.
async fn records_of_many_partitions_in_one_call_live_until_dropped<B: Backend>(b: &B) {
    let e0 = take(b, 0, OWNER, 0).await;
    let e1 = take(b, 1, OWNER, 0).await;
    let r0 = committed(b, &tenant_in(0, 11), &[b"a", b"b", b"c"]).await;
    let r1 = committed(b, &tenant_in(1, 12), &[b"d"]).await;
    let r2 = committed(b, &tenant_in(2, 13), &[b"e"]).await;
    let records = [
        InFlight {
            partition: 0,
            ids: r0.clone(),
        },
        InFlight {
            partition: 1,
            ids: r1.clone(),
        },
        InFlight {
            partition: 2,
            ids: r2.clone(),
        },
    ];
    let all = Fence {
        owner: OWNER.into(),
        epochs: vec![(0, e0), (1, e1), (2, 1)],
    };
    let answer = b.store().record_attempts(&all, &records).await.unwrap();
    assert_eq!(
        answer,
        Recorded { stale: vec![2] },
        "partition 2 is not held"
    );
    let twice = [records[0].clone(), records[0].clone()];
    let refused = b.store().record_attempts(&fence(0, e0), &twice).await;
    assert_eq!(refused.unwrap_err().kind(), StoreErrorKind::Refused);
    // Rows deleted without naming the record leave it in place.
    let first = Removal {
        delete: vec![r0[0], r0[1]],
        dead: vec![],
        records: vec![],
    };
    let two = Fence {
        owner: OWNER.into(),
        epochs: vec![(0, e0), (1, e1)],
    };
    let done = b.store().remove(&two, &first).await.unwrap();
    assert_eq!(done.deleted.len(), 2);
    // Partition 1's record goes with its row.
    let second = Removal {
        delete: vec![r1[0]],
        dead: vec![],
        records: vec![r1[0]],
    };
    b.store().remove(&two, &second).await.unwrap();
    // A crash count now (as the next owner's would): partition 0's record
    // counts its row left.
    assert_eq!(
        b.store().record_crashes(&fence(0, e0), 0).await.unwrap(),
        Fenced::Done(1),
        "the record outlived its first rows"
    );
    let got = rows(b, 0).await;
    assert_eq!(ids(&got), [r0[2]]);
    assert_eq!(got[0].crashes, 1);
    assert_eq!(
        b.store().record_crashes(&fence(1, e1), 1).await.unwrap(),
        Fenced::Done(0),
        "dropped with its last row"
    );
    assert_eq!(rows(b, 2).await[0].crashes, 0, "never written");
}

/// S-T15: a notification in a staging transaction is delivered at its
/// commit, never before, never for a rollback.
async fn notifications_are_delivered_at_commit<B: Backend>(b: &B) {
    let mut listener = b.store().listen().await.expect("listen");
    let t = tenant_in(1, 3);
    let mut tx = b.begin().await;
    tx.stage(&t, b"x", true).await;
    let early = tokio::time::timeout(b.quiet(), listener.next()).await;
    assert!(early.is_err(), "nothing before the commit");
    tx.commit().await.expect("commit");
    tokio::time::timeout(Duration::from_secs(5), listener.next())
        .await
        .expect("delivered at commit")
        .expect("listening");
    let mut rb = b.begin().await;
    rb.stage(&t, b"y", true).await;
    rb.rollback().await;
    let none = tokio::time::timeout(b.quiet(), listener.next()).await;
    assert!(none.is_err(), "nothing for a rollback");
    b.store().notify().await.expect("notify");
    tokio::time::timeout(Duration::from_secs(5), listener.next())
        .await
        .expect("the store's own notify")
        .expect("listening");
}

/// S-T15: notifications sent while a listener is away are lost; a new
/// listener hears only later ones.
async fn notifications_while_the_listener_is_away_are_lost<B: Backend>(b: &B) {
    let mut listener = b.store().listen().await.expect("listen");
    b.drop_listeners().await;
    let gone = tokio::time::timeout(Duration::from_secs(5), listener.next())
        .await
        .expect("the loss is reported");
    assert!(gone.is_err());
    b.store().notify().await.expect("notify while away");
    let mut again = b.store().listen().await.expect("listen again");
    let none = tokio::time::timeout(b.quiet(), again.next()).await;
    assert!(none.is_err(), "what was sent while away is lost");
    b.store().notify().await.expect("notify");
    tokio::time::timeout(Duration::from_secs(5), again.next())
        .await
        .expect("heard")
        .expect("listening");
}

/// S-T20: an acquire takes an epoch above the lease row's and the sink's;
/// a held lease is reported with its owner, whoever asks.
async fn acquire_takes_an_epoch_above_the_lease_and_the_sink<B: Backend>(b: &B) {
    assert_eq!(take(b, 3, OWNER, 0).await, 1);
    let other = Acquire {
        partition: 3,
        owner: "instance-b".into(),
        above: 0,
        ttl: TTL,
    };
    match b.store().acquire(&other).await.unwrap() {
        Acquired::Held {
            owner,
            epoch,
            expires_in,
        } => {
            assert_eq!((owner.as_str(), epoch), (OWNER, 1));
            assert!(expires_in > Duration::ZERO && expires_in <= TTL);
        }
        taken => panic!("{taken:?}"),
    }
    let key = LeaseKey {
        partition: 3,
        owner: OWNER.into(),
        epoch: 1,
    };
    assert!(b.store().release(&key).await.unwrap());
    assert!(b.store().release(&key).await.unwrap(), "a repeat matches");
    let above_sink = Acquire {
        above: 5,
        ..other.clone()
    };
    assert_eq!(
        b.store().acquire(&above_sink).await.unwrap(),
        Acquired::Taken { epoch: 6 }
    );
    assert!(
        !b.store().release(&key).await.unwrap(),
        "the old owner's key no longer matches"
    );
    match b.store().acquire(&other).await.unwrap() {
        Acquired::Held { owner, epoch, .. } => {
            assert_eq!((owner.as_str(), epoch), ("instance-b", 6))
        }
        taken => panic!("its own live lease is not taken again: {taken:?}"),
    }
    let leases = b.store().leases().await.unwrap();
    assert_eq!(leases.len(), P as usize);
    assert_eq!(leases[3].owner.as_deref(), Some("instance-b"));
    assert_eq!(leases[3].epoch, 6);
    assert_eq!(leases[4].owner, None);
}

/// S-T20, S-L10: a live lease is never taken again, not even by its own
/// owner (a rejoin waits for its old lease to lapse); a released or lapsed
/// one is, by anyone, under a new epoch; the release keeps the last owner
/// (S-L17, S-L21) and the epoch.
async fn acquire_never_takes_a_live_lease_not_even_its_own<B: Backend>(b: &B) {
    let s = b.store();
    let ttl = Duration::from_millis(300);
    let mine = Acquire {
        partition: 6,
        owner: OWNER.into(),
        above: 0,
        ttl,
    };
    assert_eq!(
        s.acquire(&mine).await.unwrap(),
        Acquired::Taken { epoch: 1 }
    );
    match s.acquire(&mine).await.unwrap() {
        Acquired::Held {
            owner,
            epoch,
            expires_in,
        } => {
            assert_eq!((owner.as_str(), epoch), (OWNER, 1));
            assert!(expires_in > Duration::ZERO && expires_in <= ttl);
        }
        taken => panic!("a live lease taken again: {taken:?}"),
    }
    let key = LeaseKey {
        partition: 6,
        owner: OWNER.into(),
        epoch: 1,
    };
    assert!(s.release(&key).await.unwrap());
    let row = &s.leases().await.unwrap()[6];
    assert_eq!(row.owner.as_deref(), Some(OWNER), "the last owner stays");
    assert_eq!((row.epoch, row.expires_in), (1, Duration::ZERO));
    assert_eq!(
        s.acquire(&mine).await.unwrap(),
        Acquired::Taken { epoch: 2 }
    );
    // Lapsed on the store's clock: taken again, under a new epoch.
    b.pass(ttl + Duration::from_millis(100)).await;
    let row = &s.leases().await.unwrap()[6];
    assert_eq!(row.owner.as_deref(), Some(OWNER), "an expiry keeps it too");
    assert_eq!(row.expires_in, Duration::ZERO);
    let other = Acquire {
        owner: "instance-b".into(),
        ..mine.clone()
    };
    assert_eq!(
        s.acquire(&other).await.unwrap(),
        Acquired::Taken { epoch: 3 }
    );
}

/// S-T21: a renewal never revives a released or lapsed lease, nor renews
/// under another epoch or owner.
async fn renew_never_revives_a_released_or_lapsed_lease<B: Backend>(b: &B) {
    let s = b.store();
    let ttl = Duration::from_millis(300);
    let epoch = take(b, 7, OWNER, 0).await;
    let key = LeaseKey {
        partition: 7,
        owner: OWNER.into(),
        epoch,
    };
    assert!(s.renew(&key, ttl).await.unwrap());
    let wrong_epoch = LeaseKey {
        epoch: epoch + 1,
        ..key.clone()
    };
    let wrong_owner = LeaseKey {
        owner: "instance-b".into(),
        ..key.clone()
    };
    assert!(!s.renew(&wrong_epoch, ttl).await.unwrap());
    assert!(!s.renew(&wrong_owner, ttl).await.unwrap());
    assert!(s.release(&key).await.unwrap());
    assert!(!s.renew(&key, ttl).await.unwrap(), "released");
    assert_eq!(s.leases().await.unwrap()[7].expires_in, Duration::ZERO);
    let a = Acquire {
        partition: 7,
        owner: OWNER.into(),
        above: 0,
        ttl,
    };
    let Acquired::Taken { epoch: e2 } = s.acquire(&a).await.unwrap() else {
        panic!("released: free")
    };
    let key2 = LeaseKey { epoch: e2, ..key };
    b.pass(ttl + Duration::from_millis(100)).await;
    assert!(!s.renew(&key2, ttl).await.unwrap(), "lapsed");
    assert_eq!(s.leases().await.unwrap()[7].expires_in, Duration::ZERO);
}

/// S-T21: a renewal sets the expiry from the store's clock; it fails once
/// another owner took the partition.
async fn renew_sets_the_expiry_from_the_store_clock<B: Backend>(b: &B) {
    let ttl = Duration::from_millis(600);
    let a = Acquire {
        partition: 5,
        owner: OWNER.into(),
        above: 0,
        ttl,
    };
    let Acquired::Taken { epoch } = b.store().acquire(&a).await.unwrap() else {
        panic!()
    };
    let key = LeaseKey {
        partition: 5,
        owner: OWNER.into(),
        epoch,
    };
    b.pass(Duration::from_millis(400)).await;
    assert!(b.store().renew(&key, ttl).await.unwrap());
    b.pass(Duration::from_millis(400)).await;
    let other = Acquire {
        owner: "instance-b".into(),
        ..a.clone()
    };
    assert!(matches!(
        b.store().acquire(&other).await.unwrap(),
        Acquired::Held { .. }
    ));
    b.pass(Duration::from_millis(400)).await;
    let Acquired::Taken { epoch: e2 } = b.store().acquire(&other).await.unwrap() else {
        panic!("expired on the store's clock")
    };
    assert_eq!(e2, epoch + 1);
    assert!(!b.store().renew(&key, ttl).await.unwrap());
}

/// S-T22: heartbeats expire on the store's clock; a member that leaves is
/// gone.
async fn heartbeats_expire_on_the_store_clock<B: Backend>(b: &B) {
    let s = b.store();
    s.heartbeat("a", Duration::from_millis(300)).await.unwrap();
    s.heartbeat("b", Duration::from_secs(30)).await.unwrap();
    let m = s.members().await.unwrap();
    assert_eq!(m.len(), 2);
    assert!(m.iter().all(|m| m.expires_in > Duration::ZERO));
    b.pass(Duration::from_millis(400)).await;
    let m = s.members().await.unwrap();
    assert_eq!(
        (m[0].instance.as_str(), m[0].expires_in),
        ("a", Duration::ZERO)
    );
    assert!(m[1].expires_in > Duration::ZERO);
    s.leave("b").await.unwrap();
    assert_eq!(s.members().await.unwrap().len(), 1);
}

/// S-T22: a heartbeat upserts (one row per instance) and sets the expiry
/// afresh from the store's clock; members come by instance.
async fn a_heartbeat_extends_its_member<B: Backend>(b: &B) {
    let s = b.store();
    let ttl = Duration::from_millis(400);
    s.heartbeat("m-b", ttl).await.unwrap();
    s.heartbeat("m-a", ttl).await.unwrap();
    b.pass(Duration::from_millis(250)).await;
    s.heartbeat("m-b", ttl).await.unwrap();
    b.pass(Duration::from_millis(250)).await;
    let m = s.members().await.unwrap();
    let names: Vec<&str> = m.iter().map(|m| m.instance.as_str()).collect();
    assert_eq!(names, ["m-a", "m-b"]);
    assert_eq!(m[0].expires_in, Duration::ZERO, "m-a lapsed");
    assert!(m[1].expires_in > Duration::ZERO && m[1].expires_in <= ttl);
}

/// S-T23: an install never lowers the epoch; the check passes for the
/// installed epoch only.
async fn epoch_install_and_check<B: Backend>(b: &B) {
    let s = b.store();
    let h = holder(OWNER, 0);
    assert_eq!(
        s.install_epoch(2, 3, &h).await.unwrap(),
        Installed::Installed
    );
    assert_eq!(
        s.install_epoch(2, 2, &h).await.unwrap(),
        Installed::Superseded { current: 3 }
    );
    assert_eq!(
        s.install_epoch(2, 3, &h).await.unwrap(),
        Installed::Installed
    );
    let mut tx = s.begin_epoch_tx().await.unwrap();
    assert_eq!(tx.check_epochs(&[(2, 3)]).await.unwrap(), Fenced::Done(()));
    tx.commit().await.unwrap();
    let mut tx = s.begin_epoch_tx().await.unwrap();
    assert_eq!(tx.check_epochs(&[(2, 2)]).await.unwrap(), Fenced::Stale);
    tx.rollback().await.unwrap();
    let mut tx = s.begin_epoch_tx().await.unwrap();
    assert_eq!(
        tx.check_epochs(&[(2, 3), (6, 1)]).await.unwrap(),
        Fenced::Stale
    );
    tx.rollback().await.unwrap();
    assert_eq!(epochs_of(b).await, [(2, 3)]);
}

/// S-T23, S-L11: an epoch is installed for one holder: a retry of the same
/// install answers installed, the same epoch for another instance or
/// another run of it is superseded; the row records the holder.
async fn an_epoch_is_installed_for_one_holder<B: Backend>(b: &B) {
    let s = b.store();
    let first = holder(OWNER, 7);
    assert_eq!(
        s.install_epoch(5, 4, &first).await.unwrap(),
        Installed::Installed
    );
    assert_eq!(
        s.install_epoch(5, 4, &first).await.unwrap(),
        Installed::Installed
    );
    for other in [holder("instance-b", 7), holder(OWNER, 8)] {
        assert_eq!(
            s.install_epoch(5, 4, &other).await.unwrap(),
            Installed::Superseded { current: 4 }
        );
    }
    let row = s.sink_epochs().await.unwrap().remove(0);
    assert_eq!(
        (
            row.partition,
            row.epoch,
            row.holder.as_deref(),
            row.incarnation
        ),
        (5, 4, Some(OWNER), 7)
    );
    let next = holder("instance-b", 1);
    assert_eq!(
        s.install_epoch(5, 5, &next).await.unwrap(),
        Installed::Installed
    );
    let row = s.sink_epochs().await.unwrap().remove(0);
    assert_eq!(
        (row.epoch, row.holder.as_deref(), row.incarnation),
        (5, Some("instance-b"), 1)
    );
    assert_eq!(
        s.install_epoch(5, 4, &first).await.unwrap(),
        Installed::Superseded { current: 5 }
    );
}

/// S-T23, S-L14: shared locks do not conflict: a second sink transaction
/// checks and commits while a first, paused, holds its check's lock.
async fn sink_transactions_never_queue_behind_each_other<B: Backend>(b: &B) {
    let s = b.store();
    s.install_epoch(3, 2, &holder(OWNER, 0)).await.unwrap();
    let mut paused = s.begin_epoch_tx().await.unwrap();
    assert_eq!(
        paused.check_epochs(&[(3, 2)]).await.unwrap(),
        Fenced::Done(())
    );
    let mut second = s.begin_epoch_tx().await.unwrap();
    let checked = tokio::time::timeout(Duration::from_secs(5), second.check_epochs(&[(3, 2)]))
        .await
        .expect("a shared lock never waits for another");
    assert_eq!(checked.unwrap(), Fenced::Done(()));
    second.commit().await.unwrap();
    paused.commit().await.unwrap();
}

/// A commit whose reply is lost (S-T21, S-T23): the install took effect,
/// and its retry by the same holder answers installed; a sink
/// transaction's commit took effect (its lock is gone); an acquire took
/// the lease, and its retry finds the lease live, held by itself.
async fn a_commit_whose_reply_is_lost_took_effect<B: Backend>(b: &B) {
    let s = b.store();
    let h = holder(OWNER, 0);
    b.lose_next_reply(Reply::Commit).await;
    let lost = s.install_epoch(4, 9, &h).await;
    assert!(lost.expect_err("the reply is lost").outcome_unknown());
    assert_eq!(retry(|| s.sink_epochs()).await[0].epoch, 9);
    assert_eq!(
        s.install_epoch(4, 9, &h).await.unwrap(),
        Installed::Installed
    );

    let mut tx = retry(|| s.begin_epoch_tx()).await;
    assert_eq!(tx.check_epochs(&[(4, 9)]).await.unwrap(), Fenced::Done(()));
    b.lose_next_reply(Reply::Commit).await;
    assert!(tx
        .commit()
        .await
        .expect_err("the reply is lost")
        .outcome_unknown());
    let next = retry(|| s.install_epoch(4, 10, &h)).await;
    assert_eq!(next, Installed::Installed, "the transaction ended: no lock");

    b.lose_next_reply(Reply::Select).await;
    let a = Acquire {
        partition: 4,
        owner: OWNER.into(),
        above: 10,
        ttl: TTL,
    };
    assert!(s.acquire(&a).await.expect_err("lost").outcome_unknown());
    match retry(|| s.acquire(&a)).await {
        Acquired::Held { owner, epoch, .. } => assert_eq!((owner.as_str(), epoch), (OWNER, 11)),
        taken => panic!("taken twice: {taken:?}"),
    }
}

/// S-T23: a paused sink transaction's shared lock makes an install fail at
/// `lock_timeout`, until the server ends the transaction at its idle
/// timeout; meanwhile it also holds the watermark back (it has an xid).
async fn a_paused_sink_transaction_holds_the_install_until_its_timeout<B: Backend>(b: &B) {
    let s = b.store();
    s.install_epoch(1, 3, &holder(OWNER, 0)).await.unwrap();
    let mut zombie = s.begin_epoch_tx().await.unwrap();
    assert_eq!(
        zombie.check_epochs(&[(1, 3)]).await.unwrap(),
        Fenced::Done(())
    );
    // The zombie pauses here, before its COMMIT.
    let t = tenant_in(4, 7);
    committed(b, &t, &[b"behind the zombie"]).await;
    let (_, held) = read(b, ReadOrder::Watermark, 4, None).await;
    assert!(held.is_empty(), "the paused transaction holds xmin");
    let newer = holder("instance-b", 0);
    let (installed, ()) = tokio::join!(
        s.install_epoch(1, 4, &newer),
        b.pass(LOCK_TIMEOUT + Duration::from_millis(200))
    );
    let err = installed.expect_err("blocked by the paused transaction");
    assert_eq!(err.kind(), StoreErrorKind::LockTimeout);
    b.pass(IDLE_TIMEOUT + Duration::from_millis(300)).await;
    assert_eq!(
        s.install_epoch(1, 4, &newer).await.unwrap(),
        Installed::Installed
    );
    assert!(zombie.commit().await.is_err(), "the server ended it");
    assert_eq!(epochs_of(b).await, [(1, 4)]);
    assert_eq!(rows(b, 4).await.len(), 1);
}

/// A commit whose reply is lost still committed; so did a removal whose
/// reply is lost.
async fn a_lost_reply_still_took_effect<B: Backend>(b: &B) {
    let t = tenant_in(2, 5);
    let mut tx = b.begin().await;
    let id = tx.stage(&t, b"x", false).await;
    b.lose_next_reply(Reply::Commit).await;
    assert!(tx.commit().await.is_err(), "the reply is lost");
    assert_eq!(ids(&rows(b, 2).await), [id]);
    let epoch = take(b, 2, OWNER, 0).await;
    b.lose_next_reply(Reply::Select).await;
    let removal = Removal {
        delete: vec![id],
        dead: vec![],
        records: vec![],
    };
    let lost = b.store().remove(&fence(2, epoch), &removal).await;
    assert!(lost.expect_err("the reply is lost").outcome_unknown());
    assert!(rows(b, 2).await.is_empty(), "it removed the row");
}

/// A failed statement aborts its transaction (its COMMIT rolls back); a
/// failed store call takes no effect.
async fn a_failed_statement_takes_no_effect<B: Backend>(b: &B) {
    let t = tenant_in(3, 5);
    let mut tx = b.begin().await;
    tx.stage(&t, b"x", false).await;
    tx.fail_statement().await;
    let _ = tx.commit().await;
    assert!(
        rows(b, 3).await.is_empty(),
        "the aborted transaction rolled back"
    );
    let id = committed(b, &t, &[b"y"]).await[0];
    let epoch = take(b, 3, OWNER, 0).await;
    b.break_next().await;
    let removal = Removal {
        delete: vec![id],
        dead: vec![],
        records: vec![],
    };
    assert!(b.store().remove(&fence(3, epoch), &removal).await.is_err());
    b.heal().await;
    // Rows show only below the watermark: another test's open transaction
    // may hold it back for a moment.
    b.caught_up().await;
    // A pooled connection may fail once more before the pool drops it.
    let mut seen = None;
    for _ in 0..3 {
        if let Ok(r) = b
            .store()
            .read_page(&PageRequest {
                order: ReadOrder::Watermark,
                partitions: vec![PartitionRead {
                    partition: 3,
                    after: None,
                    limit: 10,
                }],
                tenants: vec![],
            })
            .await
        {
            seen = Some(r);
            break;
        }
    }
    assert_eq!(ids(&seen.expect("read after healing").partitions[0]), [id]);
}

/// S-T2, S-T3: the schema reports its version and P.
async fn schema_reports_version_and_partitions<B: Backend>(b: &B) {
    let schema = b.store().schema().await.expect("schema");
    assert_eq!(schema.version, outbox::table::SCHEMA_VERSION);
    assert_eq!(schema.partitions, P);
    outbox::table::check(&schema).expect("runs against its own schema");
}

macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        mod pg {
            $(
                #[tokio::test]
                async fn $name() {
                    let _one = super::PG_ONE_AT_A_TIME.lock().await;
                    let Some(b) = super::PgBackend::new(stringify!($name)).await else { return };
                    super::$name(&b).await;
                    b.finish().await;
                }
            )*
        }
        mod model {
            $(
                #[tokio::test]
                async fn $name() {
                    let b = super::ModelBackend::new();
                    super::$name(&b).await;
                }
            )*
        }
    };
}

conformance!(
    committed_rows_read_in_xid_order_rolled_back_never,
    late_committing_transaction_holds_the_watermark,
    now_is_the_transaction_start,
    page_reads_partitions_and_tenants,
    remove_deletes_exact_ids_under_the_fence,
    dead_letters_move_redrive_and_purge,
    in_flight_records_become_crashes_at_takeover,
    records_of_many_partitions_in_one_call_live_until_dropped,
    notifications_are_delivered_at_commit,
    notifications_while_the_listener_is_away_are_lost,
    acquire_takes_an_epoch_above_the_lease_and_the_sink,
    acquire_never_takes_a_live_lease_not_even_its_own,
    renew_sets_the_expiry_from_the_store_clock,
    renew_never_revives_a_released_or_lapsed_lease,
    heartbeats_expire_on_the_store_clock,
    a_heartbeat_extends_its_member,
    epoch_install_and_check,
    an_epoch_is_installed_for_one_holder,
    sink_transactions_never_queue_behind_each_other,
    a_commit_whose_reply_is_lost_took_effect,
    a_paused_sink_transaction_holds_the_install_until_its_timeout,
    a_lost_reply_still_took_effect,
    a_failed_statement_takes_no_effect,
    schema_reports_version_and_partitions,
    horizon_reports_the_oldest_transaction_and_the_lag,
);
