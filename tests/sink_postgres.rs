//! Fault tests of the PostgreSQL sink against a real server, through a
//! fault-injecting proxy. Needs `OUTBOX_TEST_POSTGRES_URL` (skipped when
//! unset, failing when set and unreachable).
#![cfg(feature = "postgres")]

mod common;

use std::time::Duration;

use common::postgres;
use common::proxy::{Mode, Proxy};
use common::servers;
use common::sink::{items, retryable, terminal};
use outbox::sinks::postgres::PostgresSink;
use outbox::sinks::Envelope;
use outbox::{Sink, Slice, TenantId, Written};
use tokio_postgres::Client;
use uuid::Uuid;

const DEADLINE: Duration = Duration::from_secs(10);

/// One test's world: a direct client for checks, a proxy to the server, a
/// pool through the proxy, a sink on the test's own table.
struct Pg {
    admin: Client,
    proxy: Proxy,
    sink: PostgresSink<Envelope>,
    table: String,
}

async fn setup(test: &str) -> Option<Pg> {
    let (admin, proxy, pool) =
        postgres::connect(test, 2, Duration::from_secs(2), Duration::from_millis(500)).await?;
    let table = servers::unique_name(test);
    let sink = PostgresSink::new(pool, &table).expect("valid table name");
    sink.create_table().await.expect("create the table");
    Some(Pg {
        admin,
        proxy,
        sink,
        table,
    })
}

impl Pg {
    /// `(item id, payload)` of `tenant`, in `seq` order.
    async fn rows(&self, tenant: TenantId) -> Vec<(Uuid, Vec<u8>)> {
        let sql = format!(
            "SELECT item_id, payload FROM \"{}\" WHERE tenant = $1 ORDER BY seq",
            self.table
        );
        self.admin
            .query(&sql, &[tenant.as_uuid()])
            .await
            .expect("read back")
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect()
    }

    async fn count(&self) -> i64 {
        let sql = format!("SELECT count(*) FROM \"{}\"", self.table);
        self.admin.query_one(&sql, &[]).await.expect("count").get(0)
    }

    async fn drop_table(&self) {
        postgres::drop_table(&self.admin, &self.table).await;
    }
}

fn expected(items: &[Envelope]) -> Vec<(Uuid, Vec<u8>)> {
    items.iter().map(|e| (e.id, e.payload.clone())).collect()
}

/// Writes with retries, as the driver would (S-W5, S-W7), a few times.
/// After a cut, a pooled connection may fail once before the pool notices
/// it is closed.
async fn write_retrying(sink: &PostgresSink<Envelope>, tenant: TenantId, slice: &[Envelope]) {
    common::sink::write_retrying(sink, &tenant, slice, 5).await;
}

/// Writes `n` items, cutting the connection on the server's reply
/// `pattern`, which it sends once the slice is committed; then retries the
/// identical slice and checks that one copy is left.
async fn cut_commit_reply_then_retry(
    mut pg: Pg,
    rows_per_statement: usize,
    n: usize,
    pattern: &[u8],
) {
    pg.sink = pg.sink.max_rows_per_statement(rows_per_statement);
    let tenant = TenantId::new_v7();
    let slice = items("a", n);

    let cut = pg.proxy.cut_reply_on(pattern);
    retryable(pg.sink.write(&tenant, &slice).await);
    cut.fired(DEADLINE).await;
    assert_eq!(
        pg.rows(tenant).await,
        expected(&slice),
        "the first attempt committed"
    );

    assert_eq!(pg.sink.write(&tenant, &slice).await.unwrap(), Written::ALL);
    assert_eq!(
        pg.rows(tenant).await,
        expected(&slice),
        "one copy, in order"
    );
    assert_eq!(pg.count().await, n as i64);
    pg.drop_table().await;
}

// S-W5, I1: a slice that fits one statement is one implicit transaction:
// the server commits it before it replies `INSERT 0 10`; that reply is
// lost, and the retry of the identical slice is absorbed by (tenant,
// item_id).
#[tokio::test]
async fn retry_after_a_cut_commit_reply_leaves_one_copy() {
    let Some(pg) = setup("pg_cut_commit").await else {
        return;
    };
    cut_commit_reply_then_retry(pg, 1_000, 10, b"INSERT 0 10\0").await;
}

// The same for a slice of several statements in one explicit
// transaction: the reply to its COMMIT is lost.
#[tokio::test]
async fn retry_after_a_cut_commit_reply_of_a_transaction_leaves_one_copy() {
    let Some(pg) = setup("pg_cut_commit_tx").await else {
        return;
    };
    cut_commit_reply_then_retry(pg, 4, 10, b"COMMIT\0").await;
}

// All-or-nothing: a connection lost between the statements of one slice
// leaves nothing; the retry writes the whole slice once, in order.
#[tokio::test]
async fn a_cut_inside_the_transaction_writes_nothing_then_the_retry_writes_all() {
    let Some(mut pg) = setup("pg_cut_mid_tx").await else {
        return;
    };
    pg.sink = pg.sink.max_rows_per_statement(5);
    let tenant = TenantId::new_v7();
    let slice = items("b", 12);

    let cut = pg.proxy.cut_reply_on(b"INSERT 0 5\0");
    retryable(pg.sink.write(&tenant, &slice).await);
    cut.fired(DEADLINE).await;
    assert_eq!(
        pg.count().await,
        0,
        "nothing of the cut transaction is visible"
    );

    pg.sink.write(&tenant, &slice).await.unwrap();
    assert_eq!(pg.rows(tenant).await, expected(&slice));
    pg.drop_table().await;
}

// S-W3, S-W4: per tenant, rows follow staging order across several
// statements per slice and several slices, with repeats and a duplicate id
// within a slice absorbed.
#[tokio::test]
async fn order_per_tenant_holds_across_statements_and_writes() {
    let Some(mut pg) = setup("pg_order").await else {
        return;
    };
    // 7 rows or ~40 bytes per statement: a 25-item slice takes 4+ statements.
    pg.sink = pg
        .sink
        .max_rows_per_statement(7)
        .max_bytes_per_statement(40);
    let (t1, t2) = (TenantId::new_v7(), TenantId::new_v7());
    let mut want1 = Vec::new();
    let mut want2 = Vec::new();
    for round in 0..3 {
        let s1 = items(&format!("t1-r{round}"), 25);
        let s2 = items(&format!("t2-r{round}"), 25);
        pg.sink.write(&t1, &s1).await.unwrap();
        pg.sink.write(&t2, &s2).await.unwrap();
        // A repeat of the same slice is absorbed and moves nothing.
        pg.sink.write(&t1, &s1).await.unwrap();
        want1.extend(expected(&s1));
        want2.extend(expected(&s2));
    }
    // An id repeated inside one slice: the first occurrence stays.
    let first = Envelope::new(b"dup-first".to_vec());
    let again = Envelope::with_id(first.id, b"dup-second".to_vec());
    pg.sink.write(&t2, &[first.clone(), again]).await.unwrap();
    want2.push((first.id, first.payload.clone()));

    assert_eq!(pg.rows(t1).await, want1);
    assert_eq!(pg.rows(t2).await, want2);
    assert_eq!(pg.sink.write(&t1, &[]).await.unwrap(), Written::ALL);
    pg.drop_table().await;
}

// S-A5, S-W7: during an outage (refused, then stalled connections) a write
// fails retryably; once the server is back a write succeeds.
#[tokio::test]
async fn a_write_during_an_outage_fails_retryably_and_a_later_one_succeeds() {
    let Some(pg) = setup("pg_outage").await else {
        return;
    };
    let tenant = TenantId::new_v7();
    let slice = items("c", 5);

    pg.proxy.set_mode(Mode::Refuse);
    pg.proxy.cut_all();
    let e = retryable(pg.sink.write(&tenant, &slice).await);
    eprintln!("refused: {e}");

    // Accepted but silent: the pool's create timeout turns it into an error.
    pg.proxy.set_mode(Mode::Stall);
    let e = retryable(pg.sink.write(&tenant, &slice).await);
    eprintln!("stalled: {e}");
    assert_eq!(pg.count().await, 0);

    pg.proxy.set_mode(Mode::Pass);
    pg.proxy.cut_all();
    write_retrying(&pg.sink, tenant, &slice).await;
    assert_eq!(pg.rows(tenant).await, expected(&slice));
    pg.drop_table().await;
}

// S-B3: a write that hangs on a stalled connection is cancelled (its future
// dropped, as the outbox's write timeout does); the retry leaves one copy.
// A slow (delayed) link only slows a write down.
#[tokio::test]
async fn a_write_cancelled_on_a_stall_then_retried_leaves_one_copy() {
    let Some(pg) = setup("pg_stall").await else {
        return;
    };
    let tenant = TenantId::new_v7();
    let slow = items("slow", 3);
    pg.proxy.set_mode(Mode::Delay(Duration::from_millis(20)));
    pg.sink.write(&tenant, &slow).await.unwrap();

    let slice = items("d", 8);
    pg.proxy.set_mode(Mode::Stall);
    let hung =
        tokio::time::timeout(Duration::from_millis(300), pg.sink.write(&tenant, &slice)).await;
    assert!(hung.is_err(), "a stalled write does not finish");

    pg.proxy.set_mode(Mode::Pass);
    pg.proxy.cut_all();
    write_retrying(&pg.sink, tenant, &slice).await;
    let mut want = expected(&slow);
    want.extend(expected(&slice));
    assert_eq!(pg.rows(tenant).await, want);
    pg.drop_table().await;
}

// S-A5: what the data makes impossible is terminal and writes nothing of
// the slice; what an operator can fix (a missing table) is retryable.
#[tokio::test]
async fn data_errors_are_terminal_and_schema_errors_retryable() {
    let Some(pg) = setup("pg_terminal").await else {
        return;
    };
    let tenant = TenantId::new_v7();
    pg.admin
        .batch_execute(&format!(
            "ALTER TABLE \"{t}\" ADD CONSTRAINT short_payload CHECK (length(payload) <= 8);\
             CREATE UNIQUE INDEX \"{t}_payload\" ON \"{t}\" (payload);",
            t = pg.table
        ))
        .await
        .expect("add constraints");

    // 23514 check_violation, after a valid item in the same slice.
    let slice = vec![
        Envelope::new(b"ok".to_vec()),
        Envelope::new(b"far too long".to_vec()),
    ];
    let e = terminal(pg.sink.write(&tenant, &slice).await);
    assert!(e.to_string().contains("short_payload"), "{e}");
    assert_eq!(pg.count().await, 0, "all-or-nothing");

    // 23505 on a unique key other than (tenant, item_id).
    pg.sink
        .write(&tenant, &[Envelope::new(b"same".to_vec())])
        .await
        .unwrap();
    terminal(
        pg.sink
            .write(&tenant, &[Envelope::new(b"same".to_vec())])
            .await,
    );
    assert_eq!(pg.count().await, 1);

    // 42P01 undefined_table: retryable (an operator creates it).
    pg.drop_table().await;
    let e = retryable(
        pg.sink
            .write(&tenant, &[Envelope::new(b"x".to_vec())])
            .await,
    );
    assert!(e.to_string().contains("does not exist"), "{e}");
}

/// Writes two slices for `tenant` through a sink keyed by `K` on a fresh
/// table, the first twice (the repeat absorbed), and returns what the
/// table holds for it: `(tenant as text, item id, payload)` in `seq`
/// order, with the `tenant` column's SQL type.
async fn round_trip<K>(test: &str, tenant: K) -> Option<(String, Vec<(String, Uuid, Vec<u8>)>)>
where
    K: outbox::sinks::postgres::PgTenant,
{
    let (admin, _proxy, pool) =
        postgres::connect(test, 2, Duration::from_secs(2), Duration::from_millis(500)).await?;
    let table = servers::unique_name(test);
    let sink = PostgresSink::<Envelope, K>::new(pool, &table).expect("valid table name");
    sink.create_table().await.expect("create the table");
    let (first, second) = (items("k1", 3), items("k2", 2));
    for slice in [&first, &first, &second] {
        assert_eq!(sink.write(&tenant, slice).await.unwrap(), Written::ALL);
    }
    let column: String = admin
        .query_one(
            "SELECT data_type FROM information_schema.columns \
             WHERE table_name = $1 AND column_name = 'tenant'",
            &[&table],
        )
        .await
        .expect("the tenant column")
        .get(0);
    let sql = format!("SELECT tenant::text, item_id, payload FROM \"{table}\" ORDER BY seq");
    let rows = admin
        .query(&sql, &[])
        .await
        .expect("read back")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect::<Vec<(String, Uuid, Vec<u8>)>>();
    let want: Vec<_> = first
        .iter()
        .chain(&second)
        .map(|e| (rows[0].0.clone(), e.id, e.payload.clone()))
        .collect();
    assert_eq!(rows, want, "one copy of each, in order, one tenant");
    postgres::drop_table(&admin, &table).await;
    Some((column, rows))
}

// The tenant key is the user's type: each maps to its column type and
// round-trips as the same tenant.
#[tokio::test]
async fn u64_keys_use_a_bigint_column() {
    let Some((column, rows)) = round_trip("pg_key_u64", u64::try_from(i64::MAX).unwrap()).await
    else {
        return;
    };
    assert_eq!(column, "bigint");
    assert_eq!(rows[0].0, i64::MAX.to_string());
}

#[tokio::test]
async fn i64_keys_use_a_bigint_column() {
    let Some((column, rows)) = round_trip("pg_key_i64", -42i64).await else {
        return;
    };
    assert_eq!(column, "bigint");
    assert_eq!(rows[0].0, "-42");
}

#[tokio::test]
async fn string_keys_use_a_text_column() {
    let Some((column, rows)) = round_trip("pg_key_string", "acme.eu/1 ü".to_owned()).await else {
        return;
    };
    assert_eq!(column, "text");
    assert_eq!(rows[0].0, "acme.eu/1 ü");
}

#[tokio::test]
async fn uuid_keys_use_a_uuid_column() {
    let id = Uuid::from_u128(0x0192_3456_789a_7bcd_8ef0_1234_5678_9abc);
    let Some((column, rows)) = round_trip("pg_key_uuid", id).await else {
        return;
    };
    assert_eq!(column, "uuid");
    assert_eq!(rows[0].0, "01923456-789a-7bcd-8ef0-123456789abc");
}

// A u64 key above i64::MAX is refused before any I/O, never wrapped into
// a negative bigint; the table stays empty.
#[tokio::test]
async fn a_u64_key_above_i64_max_is_terminal_and_writes_nothing() {
    let Some((admin, _proxy, pool)) = postgres::connect(
        "pg_key_u64_over",
        2,
        Duration::from_secs(2),
        Duration::from_millis(500),
    )
    .await
    else {
        return;
    };
    let table = servers::unique_name("pg_key_u64_over");
    let sink = PostgresSink::<Envelope, u64>::new(pool, &table).expect("valid table name");
    sink.create_table().await.expect("create the table");
    let e = terminal(sink.write(&u64::MAX, &items("over", 2)).await);
    assert!(e.to_string().contains("i64::MAX"), "{e}");
    let over = u64::try_from(i64::MAX).unwrap() + 1;
    terminal(sink.write(&over, &items("over", 1)).await);
    let sql = format!("SELECT count(*) FROM \"{table}\"");
    let n: i64 = admin.query_one(&sql, &[]).await.expect("count").get(0);
    assert_eq!(n, 0);
    postgres::drop_table(&admin, &table).await;
}

// A text key holding a NUL character cannot be stored in a `text` column:
// the server refuses it (SQLSTATE 22021, class 22), which the sink takes as
// terminal, as its module docs say, so the tenant is not retried forever;
// the table stays empty.
#[tokio::test]
async fn a_string_key_with_a_nul_is_terminal_and_writes_nothing() {
    let Some((admin, _proxy, pool)) = postgres::connect(
        "pg_key_nul",
        2,
        Duration::from_secs(2),
        Duration::from_millis(500),
    )
    .await
    else {
        return;
    };
    let table = servers::unique_name("pg_key_nul");
    let sink = PostgresSink::<Envelope, String>::new(pool, &table).expect("valid table name");
    sink.create_table().await.expect("create the table");
    terminal(sink.write(&"acme\0eu".to_owned(), &items("nul", 2)).await);
    let sql = format!("SELECT count(*) FROM \"{table}\"");
    let n: i64 = admin.query_one(&sql, &[]).await.expect("count").get(0);
    assert_eq!(n, 0);
    postgres::drop_table(&admin, &table).await;
}

#[tokio::test]
async fn a_group_is_written_in_one_go_and_a_bad_slice_fails_alone() {
    // S-F1: a group of three tenants' slices lands in one statement, each
    // tenant's rows in its slice's order; a repeat of the group is
    // absorbed. S-F3: a slice with bad data is rejected alone, the others
    // are written.
    let Some(pg) = setup("pg_group").await else {
        return;
    };
    let (a, b, c) = (TenantId::new_v7(), TenantId::new_v7(), TenantId::new_v7());
    let group = vec![
        Slice::new(a, items("a", 3)),
        Slice::new(b, items("b", 2)),
        Slice::new(c, items("c", 4)),
    ];
    for _ in 0..2 {
        let outcomes = pg.sink.write_group(&group).await;
        assert_eq!(outcomes.len(), 3);
        assert!(outcomes.iter().all(|o| matches!(o, Ok(Written::ALL))));
    }
    for s in &group {
        assert_eq!(pg.rows(s.tenant).await, expected(&s.items));
    }
    assert_eq!(pg.count().await, 9);

    pg.admin
        .batch_execute(&format!(
            "ALTER TABLE \"{t}\" ADD CONSTRAINT short_payload CHECK (length(payload) <= 8)",
            t = pg.table
        ))
        .await
        .expect("add the constraint");
    let (d, e) = (TenantId::new_v7(), TenantId::new_v7());
    let bad = vec![
        Slice::new(d, items("d", 2)),
        Slice::new(e, vec![Envelope::new(b"far too long".to_vec())]),
        Slice::new(a, items("a2", 1)),
    ];
    let mut outcomes = pg.sink.write_group(&bad).await.into_iter();
    assert!(matches!(outcomes.next(), Some(Ok(Written::ALL))));
    let err = terminal(outcomes.next().expect("three outcomes"));
    assert!(err.to_string().contains("short_payload"), "{err}");
    assert!(matches!(outcomes.next(), Some(Ok(Written::ALL))));
    assert_eq!(pg.rows(d).await, expected(&bad[0].items));
    assert!(pg.rows(e).await.is_empty());
    assert_eq!(pg.count().await, 12);
    pg.drop_table().await;
}
