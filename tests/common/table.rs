//! What the outbox-table relay tests share: a test-unique outbox table
//! and target table, a store, an outbox relaying the one into the other;
//! and, against the table's in-memory model, a sink whose writes wait for
//! the test's permits, staging into the model and an outbox relaying it.

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use outbox::codec::{Codec, Postcard};
use outbox::sinks::postgres::PostgresSink;
use outbox::sinks::Record;
use outbox::table::{OutboxTable, PgStore, Relayed, TableNames, TableRelay};
use outbox::{Config, Outbox, WriteError, Written};
use serde::{Deserialize, Serialize};
use tokio_postgres::Client;
use uuid::Uuid;

use super::{postgres, proxy::Proxy, servers};

/// P for the tests' tables: small, so a page reads every partition.
pub const P: u32 = 4;

/// A staged item: its own id and bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub id: u128,
    pub payload: Vec<u8>,
}

impl Usage {
    pub fn new(id: u128) -> Self {
        Usage {
            id,
            payload: id.to_le_bytes().to_vec(),
        }
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

pub type Sink = PostgresSink<Relayed<Usage>, u64>;

/// One test's tables.
pub struct World {
    pub admin: Client,
    pub proxy: Proxy,
    pub pool: Pool,
    /// The outbox table's name.
    pub name: String,
    /// The target table's name.
    pub target: String,
    /// The application name of the relay's listener connection.
    pub listener_app: String,
    /// A pool straight to the server whose sessions carry
    /// [`relay_app`](Self::relay_app): the relay's and its sink's.
    pub relay_pool: Pool,
    pub relay_app: String,
    pub table: OutboxTable<u64, Usage>,
}

impl World {
    /// `None` when the server's variable is unset.
    pub async fn new(test: &str) -> Option<World> {
        let (mut admin, proxy, pool) =
            postgres::connect(test, 8, Duration::from_secs(2), Duration::from_secs(1)).await?;
        let short: String = test
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .take(12)
            .collect();
        let name = servers::unique_name(&format!("tr{short}"));
        let target = format!("{name}_target");
        let names = TableNames::new(&name).expect("a valid name");
        outbox::table::migrate(&mut admin, &names, P)
            .await
            .expect("migrate");
        let sql = outbox::sinks::postgres::schema_sql::<u64>(&target).expect("name");
        admin.batch_execute(&sql).await.expect("the target table");
        let table = OutboxTable::new(&name).expect("name");
        let relay_app = format!("r_{name}");
        let relay_pool = app_pool(&relay_app);
        Some(World {
            admin,
            proxy,
            pool,
            relay_pool,
            relay_app,
            listener_app: format!("l_{name}"),
            name,
            target,
            table,
        })
    }

    /// The store over the proxied pool, its listener connecting directly
    /// under [`listener_app`](Self::listener_app).
    pub fn store(&self) -> PgStore {
        let url = std::env::var(postgres::VAR).expect("set");
        let mut listen: tokio_postgres::Config = url.parse().expect("a postgres URL");
        listen.application_name(&self.listener_app);
        let names = TableNames::new(&self.name).expect("name");
        PgStore::new(self.relay_pool.clone(), listen, names)
    }

    /// The sink into the target table.
    pub fn sink(&self) -> Sink {
        PostgresSink::new(self.relay_pool.clone(), &self.target).expect("name")
    }

    /// An outbox relaying the table into the target, polling every 100 ms.
    pub fn outbox(&self, config: Config, relay: TableRelay<u64, Usage>) -> Outbox<Sink> {
        self.outbox_into(self.sink(), config, relay)
    }

    /// The same into `sink`.
    pub fn outbox_into<S>(
        &self,
        sink: S,
        config: Config,
        relay: TableRelay<u64, Usage>,
    ) -> Outbox<S>
    where
        S: outbox::Sink<Tenant = u64, Item = Relayed<Usage>>,
    {
        Outbox::builder(sink)
            .config(config)
            .table(
                self.store(),
                relay.poll_interval(Duration::from_millis(100)),
            )
            .build()
            .expect("build")
    }

    /// Stages `items` of `tenant` in one transaction of a fresh
    /// connection, then commits or rolls back.
    pub async fn stage(&self, tenant: u64, items: &[Usage], commit: bool) {
        let mut client = self.pool.get().await.expect("a connection");
        let tx = tokio_postgres::Client::transaction(&mut client)
            .await
            .expect("begin");
        for item in items {
            self.table.stage(&tx, &tenant, item).await.expect("stage");
        }
        if commit {
            tx.commit().await.expect("commit");
        } else {
            tx.rollback().await.expect("rollback");
        }
    }

    /// The target's rows: (tenant, item id as u128), in write order.
    pub async fn target_rows(&self) -> Vec<(i64, u128)> {
        let sql = format!(
            "SELECT tenant, item_id FROM \"{}\" ORDER BY seq",
            self.target
        );
        let rows = self.admin.query(&sql, &[]).await.expect("read the target");
        rows.iter()
            .map(|r| (r.get::<_, i64>(0), r.get::<_, Uuid>(1).as_u128()))
            .collect()
    }

    /// Rows still in the outbox table.
    pub async fn left(&self) -> i64 {
        let sql = format!("SELECT count(*) FROM \"{}\"", self.name);
        self.admin.query_one(&sql, &[]).await.expect("count").get(0)
    }

    /// The dead-letter table: (item id, reason).
    pub async fn dead(&self) -> Vec<(Vec<u8>, String)> {
        let sql = format!(
            "SELECT item, reason FROM \"{}_dead\" ORDER BY id",
            self.name
        );
        let rows = self
            .admin
            .query(&sql, &[])
            .await
            .expect("read the dead letters");
        rows.iter().map(|r| (r.get(0), r.get(1))).collect()
    }

    /// Waits (bounded) until the target holds `n` rows.
    pub async fn wait_for(&self, n: usize) -> Vec<(i64, u128)> {
        servers::eventually(
            &format!("{n} rows in the target"),
            Duration::from_secs(20),
            || async {
                let rows = self.target_rows().await;
                (rows.len() >= n).then_some(rows)
            },
        )
        .await
    }

    /// Shuts `outbox` down (waiting at most `timeout`), waits until its
    /// tasks are gone, then drops every table of the test.
    pub async fn close<S: outbox::Sink>(self, outbox: Outbox<S>, timeout: Duration) {
        drop(outbox.shutdown(timeout).await);
        let closed = outbox.closed();
        drop(outbox);
        closed.await;
        self.finish().await;
    }

    /// Drops every table of the test.
    pub async fn finish(self) {
        let n = &self.name;
        let sql = format!(
            "DROP TABLE IF EXISTS \"{n}\", \"{n}_dead\", \"{n}_in_flight\", \"{n}_crashes\", \
             \"{n}_lease\", \"{n}_member\", \"{n}_sink_epoch\", \"{n}_schema\", \"{}\" CASCADE; \
             DROP FUNCTION IF EXISTS \"{n}_partition\"(bytea), \"{n}_partitions\"()",
            self.target
        );
        self.admin.batch_execute(&sql).await.expect("clean up");
    }
}

/// A pool of at most 8 connections straight to the server, each session
/// named `app`.
fn app_pool(app: &str) -> Pool {
    let url = std::env::var(postgres::VAR).expect("set");
    let mut config: tokio_postgres::Config = url.parse().expect("a postgres URL");
    config.application_name(app);
    let manager = deadpool_postgres::Manager::from_config(
        config,
        tokio_postgres::NoTls,
        deadpool_postgres::ManagerConfig {
            recycling_method: deadpool_postgres::RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(8)
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .wait_timeout(Some(Duration::from_secs(2)))
        .create_timeout(Some(Duration::from_secs(1)))
        .recycle_timeout(Some(Duration::from_secs(1)))
        .build()
        .expect("pool")
}

/// Which writes fail: `Some(error)` for a slice of this tenant holding
/// this item.
pub type Fault = Box<dyn Fn(u64, &Usage) -> Option<WriteError> + Send + Sync>;

/// The target sink, failing the writes `fault` names.
pub struct Faulty {
    pub inner: Sink,
    pub fault: Fault,
}

impl outbox::Sink for Faulty {
    type Tenant = u64;
    type Item = Relayed<Usage>;

    fn name(&self) -> &str {
        "faulty"
    }

    async fn write(&self, tenant: &u64, items: &[Relayed<Usage>]) -> Result<Written, WriteError> {
        if let Some(e) = items.iter().find_map(|i| (self.fault)(*tenant, &i.item)) {
            return Err(e);
        }
        self.inner.write(tenant, items).await
    }
}

/// A sink of relayed `u32`s whose every write first takes a permit: the
/// test decides when writes end.
#[derive(Clone)]
pub struct Held {
    pub permits: Arc<tokio::sync::Semaphore>,
}

impl Held {
    /// Holding `permits` permits.
    pub fn new(permits: usize) -> Self {
        Held {
            permits: Arc::new(tokio::sync::Semaphore::new(permits)),
        }
    }
}

impl outbox::Sink for Held {
    type Tenant = u64;
    type Item = Relayed<u32>;
    fn name(&self) -> &str {
        "held"
    }
    async fn write(&self, _: &u64, _: &[Relayed<u32>]) -> Result<Written, WriteError> {
        self.permits.acquire().await.expect("open").forget();
        Ok(Written::ALL)
    }
}

/// `tenant` and `item` as the default codec encodes them.
pub fn encoded(tenant: u64, item: u32) -> (Vec<u8>, Vec<u8>) {
    let (mut t, mut i) = (Vec::new(), Vec::new());
    Codec::<u64, u32>::encode_tenant(&Postcard, &tenant, &mut t).unwrap();
    Codec::<u64, u32>::encode_item(&Postcard, &item, &mut i).unwrap();
    (t, i)
}

/// Commits one row of `tenant` into the model.
#[cfg(feature = "testkit")]
pub fn stage_model(model: &outbox::table::model::Model, tenant: u64, item: u32) {
    let (t, i) = encoded(tenant, item);
    let session = model.begin();
    model.stage(session, &t, &i, 0, true).unwrap();
    assert!(model.commit(session).unwrap());
}

/// An outbox relaying the model into `sink` with `config`, its relay
/// `relay` polling every 50 ms.
#[cfg(feature = "testkit")]
pub fn model_outbox(
    model: &outbox::table::model::Model,
    sink: Held,
    config: Config,
    relay: TableRelay<u64, u32>,
) -> Outbox<Held> {
    Outbox::builder(sink)
        .config(config)
        .table(
            model.store(),
            relay.poll_interval(Duration::from_millis(50)),
        )
        .build()
        .expect("build")
}

/// A pool of its own for one life of a relay: its connections live on
/// that life's runtime and die with it (8 connections, 1-2 s timeouts).
pub fn life_pool(url: &str) -> Pool {
    let config: tokio_postgres::Config = url.parse().expect("a postgres URL");
    let manager = Manager::from_config(
        config,
        tokio_postgres::NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(8)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(Duration::from_secs(2)))
        .create_timeout(Some(Duration::from_secs(1)))
        .recycle_timeout(Some(Duration::from_secs(1)))
        .build()
        .expect("pool")
}
