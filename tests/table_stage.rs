//! Migrations and transactional staging against a real PostgreSQL (S-T2,
//! S-T3, S-T4, S-T10). Needs `OUTBOX_TEST_POSTGRES_URL` (skipped when
//! unset, failing when set and unreachable).
#![cfg(feature = "table")]

mod common;

use std::time::Duration;

use outbox::core::relay::{PageRequest, PartitionRead, ReadOrder, Row};
use outbox::table::{
    check, migrate, partition_of, OutboxTable, PgStore, SchemaError, StageError, Store, TableNames,
    SCHEMA_VERSION,
};
use tokio_postgres::Client;

struct Pg {
    admin: Client,
    pool: deadpool_postgres::Pool,
    name: String,
    names: TableNames,
    store: PgStore,
}

async fn setup(test: &str, partitions: u32) -> Option<Pg> {
    let (mut admin, _proxy, _) =
        common::postgres::connect(test, 2, Duration::from_secs(2), Duration::from_secs(1)).await?;
    let url = std::env::var(common::postgres::VAR).expect("set");
    let config: tokio_postgres::Config = url.parse().expect("a postgres URL");
    let manager = deadpool_postgres::Manager::new(config.clone(), tokio_postgres::NoTls);
    let pool = deadpool_postgres::Pool::builder(manager)
        .max_size(4)
        .build()
        .expect("pool");
    let name = common::servers::unique_name(test);
    let names = TableNames::new(&name).expect("name");
    let m = migrate(&mut admin, &names, partitions)
        .await
        .expect("migrate");
    assert_eq!(
        (m.from, m.to, m.partitions),
        (0, SCHEMA_VERSION, partitions)
    );
    let store = PgStore::new(pool.clone(), config, names.clone());
    Some(Pg {
        admin,
        pool,
        name,
        names,
        store,
    })
}

impl Pg {
    async fn finish(self) {
        let n = &self.name;
        let sql = format!(
            "DROP TABLE IF EXISTS \"{n}\", \"{n}_dead\", \"{n}_in_flight\", \"{n}_crashes\", \
             \"{n}_lease\", \"{n}_member\", \"{n}_sink_epoch\", \"{n}_schema\" CASCADE; \
             DROP FUNCTION IF EXISTS \"{n}_partition\"(bytea), \"{n}_partitions\"()"
        );
        self.admin.batch_execute(&sql).await.expect("clean up");
    }

    /// Every row, once every transaction that ended is below the watermark.
    async fn rows(&self, partitions: u32) -> Vec<Row> {
        let x: i64 = self
            .admin
            .query_one("SELECT pg_current_xact_id()::text::bigint", &[])
            .await
            .unwrap()
            .get(0);
        common::servers::eventually("the watermark", Duration::from_secs(20), || async {
            let xmin: i64 = self
                .admin
                .query_one(
                    "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            (xmin > x).then_some(())
        })
        .await;
        let request = PageRequest {
            order: ReadOrder::Watermark,
            partitions: (0..partitions)
                .map(|p| PartitionRead {
                    partition: p,
                    after: None,
                    limit: 1000,
                })
                .collect(),
            tenants: vec![],
        };
        let page = self.store.read_page(&request).await.expect("read");
        let mut all: Vec<Row> = page.partitions.into_iter().flatten().collect();
        all.sort_by_key(|r| r.position());
        all
    }
}

/// S-T2: migrating again applies nothing; concurrent migrations apply
/// each migration once; another P is refused; a newer schema this crate
/// cannot run against is refused, one it can is accepted.
#[tokio::test]
async fn migrations_apply_once_and_refuse_what_they_do_not_know() {
    let Some(mut pg) = setup("tbl_migrate", 4).await else {
        return;
    };
    let again = migrate(&mut pg.admin, &pg.names, 4).await.expect("again");
    assert_eq!((again.from, again.to), (SCHEMA_VERSION, SCHEMA_VERSION));
    let url = std::env::var(common::postgres::VAR).unwrap();
    let mut clients = Vec::new();
    for _ in 0..3 {
        let (c, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        clients.push(c);
    }
    let names = pg.names.clone();
    let runs = clients.into_iter().map(|mut c| {
        let names = names.clone();
        async move { migrate(&mut c, &names, 4).await }
    });
    for r in futures_join(runs).await {
        r.expect("concurrent migrations");
    }
    let n: i64 = pg
        .admin
        .query_one(&format!("SELECT count(*) FROM {}", pg.names.schema()), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, i64::from(SCHEMA_VERSION));
    let other_p = migrate(&mut pg.admin, &pg.names, 8).await;
    assert!(matches!(
        other_p,
        Err(SchemaError::Partitions { table: 4, asked: 8 })
    ));
    let schema = pg.store.schema().await.expect("schema");
    assert_eq!((schema.version, schema.partitions), (SCHEMA_VERSION, 4));
    // A newer additive migration (min_reader within reach) runs; one
    // that is not is refused, by the relay's check and by migrate.
    let add = |v: u32, min: u32| {
        format!(
            "INSERT INTO {} (version, name, min_reader, applied_by) VALUES ({v}, 'future', {min}, 'test')",
            pg.names.schema()
        )
    };
    pg.admin
        .batch_execute(&add(SCHEMA_VERSION + 1, SCHEMA_VERSION))
        .await
        .unwrap();
    check(&pg.store.schema().await.unwrap()).expect("an additive newer schema runs");
    pg.admin
        .batch_execute(&add(SCHEMA_VERSION + 2, SCHEMA_VERSION + 2))
        .await
        .unwrap();
    let newer = pg.store.schema().await.unwrap();
    assert!(matches!(check(&newer), Err(SchemaError::Unknown { .. })));
    assert!(matches!(
        migrate(&mut pg.admin, &pg.names, 4).await,
        Err(SchemaError::Unknown { .. })
    ));
    pg.finish().await;
}

async fn futures_join<F>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.expect("joined"));
    }
    out
}

/// S-T4: the SQL partition function and `partition_of` agree; the table
/// carries its queue autovacuum settings.
#[tokio::test]
async fn the_partition_function_matches_the_crate_and_vacuum_is_set_for_a_queue() {
    let Some(pg) = setup("tbl_partition", 64).await else {
        return;
    };
    let f = format!("\"{}_partition\"", pg.name);
    for i in 0u32..200 {
        let tenant: Vec<u8> = i.to_le_bytes().iter().chain(b"tenant").copied().collect();
        let p: i32 = pg
            .admin
            .query_one(&format!("SELECT {f}($1)"), &[&tenant])
            .await
            .unwrap()
            .get(0);
        assert_eq!(p as u32, partition_of(&tenant, 64), "tenant {i}");
    }
    let opts: Vec<String> = pg
        .admin
        .query_one(
            "SELECT reloptions FROM pg_class WHERE relname = $1",
            &[&pg.name],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        opts.contains(&"autovacuum_vacuum_scale_factor=0".to_owned()),
        "{opts:?}"
    );
    pg.finish().await;
}

/// S-T10: a stage rolls back with the caller's transaction and commits
/// with it, in one statement; a run keeps its order; an unencodable item
/// fails before anything is sent; the database's error comes back.
#[tokio::test]
async fn staging_commits_and_rolls_back_with_the_callers_transaction() {
    let Some(pg) = setup("tbl_stage", 4).await else {
        return;
    };
    let table: OutboxTable<u64, String> = OutboxTable::new(&pg.name).unwrap().codec_version(7);
    let mut client = pg.pool.get().await.unwrap();
    let tx = client.transaction().await.unwrap();
    table
        .stage(&*tx, &1, &"rolled back".to_owned())
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let tx = client.transaction().await.unwrap();
    let id = table.stage(&*tx, &1, &"kept".to_owned()).await.unwrap();
    let items: Vec<(u64, String)> = (0..5).map(|i| (2, format!("run {i}"))).collect();
    let n = table
        .stage_run(&*tx, items.iter().map(|(t, i)| (t, i)))
        .await
        .unwrap();
    assert_eq!(n, 5);
    tx.commit().await.unwrap();
    let rows = pg.rows(4).await;
    assert_eq!(rows.len(), 6);
    assert_eq!(rows[0].id, id);
    assert!(rows.iter().all(|r| r.codec_version == 7));
    let decoded: Vec<String> = rows
        .iter()
        .map(|r| postcard::from_bytes(&r.item).unwrap())
        .collect();
    assert_eq!(decoded[0], "kept");
    assert_eq!(&decoded[1..], ["run 0", "run 1", "run 2", "run 3", "run 4"]);
    assert!(rows.windows(2).all(|w| w[0].position() < w[1].position()));
    let bad: OutboxTable<u64, String> = OutboxTable::new("no_such_outbox_table").unwrap();
    let tx = client.transaction().await.unwrap();
    let err = bad.stage(&*tx, &1, &"x".to_owned()).await.unwrap_err();
    assert!(
        matches!(err, StageError::Database(ref e) if e.sqlstate() == Some("42P01")),
        "{err}"
    );
    drop(tx);
    pg.finish().await;
}

/// S-T10: an item the codec refuses is an error before any statement.
#[tokio::test]
async fn an_unencodable_item_is_refused_before_anything_is_sent() {
    let Some(pg) = setup("tbl_unenc", 4).await else {
        return;
    };
    struct Refuse;
    impl outbox::codec::Codec<u64, u64> for Refuse {
        fn encode_tenant(&self, _: &u64, _: &mut Vec<u8>) -> Result<(), outbox::BoxError> {
            Ok(())
        }
        fn decode_tenant(&self, _: &[u8]) -> Result<u64, outbox::BoxError> {
            Ok(0)
        }
        fn encode_item(&self, i: &u64, out: &mut Vec<u8>) -> Result<(), outbox::BoxError> {
            if *i == 13 {
                return Err("thirteen".into());
            }
            out.push(*i as u8);
            Ok(())
        }
        fn decode_item(&self, _: &[u8]) -> Result<u64, outbox::BoxError> {
            Ok(0)
        }
    }
    let table = OutboxTable::with_codec(&pg.name, Refuse).unwrap();
    let mut client = pg.pool.get().await.unwrap();
    let tx = client.transaction().await.unwrap();
    let items = [(1u64, 1u64), (1, 13)];
    let err = table
        .stage_run(&*tx, items.iter().map(|(t, i)| (t, i)))
        .await
        .unwrap_err();
    assert!(
        matches!(err, StageError::Unencodable { index: 1, .. }),
        "{err}"
    );
    // The transaction is untouched: it can still stage and commit.
    table.stage(&*tx, &1, &2).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(pg.rows(4).await.len(), 1);
    pg.finish().await;
}

/// S-T10: the same staging in sqlx's transaction (feature `sqlx`).
#[cfg(feature = "sqlx")]
#[tokio::test]
async fn staging_in_a_sqlx_transaction() {
    let Some(pg) = setup("tbl_sqlx", 4).await else {
        return;
    };
    let url = std::env::var(common::postgres::VAR).unwrap();
    let pool = sqlx::PgPool::connect(&url).await.expect("sqlx pool");
    let table: OutboxTable<u64, String> = OutboxTable::new(&pg.name).unwrap();
    let mut tx = pool.begin().await.unwrap();
    table
        .stage_sqlx(&mut tx, &5, &"rolled back".to_owned())
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    table
        .stage_sqlx(&mut tx, &5, &"kept".to_owned())
        .await
        .unwrap();
    let run = [(6u64, "a".to_owned()), (6, "b".to_owned())];
    let n = table
        .stage_run_sqlx(&mut tx, run.iter().map(|(t, i)| (t, i)))
        .await
        .unwrap();
    assert_eq!(n, 2);
    tx.commit().await.unwrap();
    let rows = pg.rows(4).await;
    let decoded: Vec<String> = rows
        .iter()
        .map(|r| postcard::from_bytes(&r.item).unwrap())
        .collect();
    assert_eq!(decoded, ["kept", "a", "b"]);
    pool.close().await;
    pg.finish().await;
}

/// The staging error names the database's SQLSTATE once (a table that is
/// not there: `42P01`).
#[tokio::test]
async fn a_database_error_at_stage_names_its_sqlstate_once() {
    let Some((mut admin, _proxy, _)) = common::postgres::connect(
        "stage_sqlstate",
        1,
        Duration::from_secs(2),
        Duration::from_secs(1),
    )
    .await
    else {
        return;
    };
    // Never migrated: the stage's INSERT meets no table.
    let name = common::servers::unique_name("nosuch");
    let table: OutboxTable<u64, u64> = OutboxTable::new(&name).expect("name");
    let tx = admin.transaction().await.expect("begin");
    let e = table.stage(&tx, &1, &2).await.expect_err("no table");
    let text = e.to_string();
    assert!(matches!(e, StageError::Database(_)), "{text}");
    assert_eq!(text.matches("SQLSTATE").count(), 1, "{text}");
    assert!(text.contains("42P01"), "{text}");
    tx.rollback().await.expect("rollback");
}
