//! What the outbox-table relay tests share: a test-unique outbox table
//! and target table, a store, an outbox relaying the one into the other.

use std::time::Duration;

use deadpool_postgres::Pool;
use outbox::sinks::postgres::PostgresSink;
use outbox::sinks::Record;
use outbox::table::{OutboxTable, PgStore, Relayed, TableNames, TableRelay};
use outbox::{Config, Outbox};
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
        Some(World {
            admin,
            proxy,
            pool,
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
        PgStore::new(self.pool.clone(), listen, names)
    }

    /// The sink into the target table.
    pub fn sink(&self) -> Sink {
        PostgresSink::new(self.pool.clone(), &self.target).expect("name")
    }

    /// An outbox relaying the table into the target, polling every 100 ms.
    pub fn outbox(&self, config: Config, relay: TableRelay<u64, Usage>) -> Outbox<Sink> {
        Outbox::builder(self.sink())
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
