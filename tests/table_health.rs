//! `Outbox::health` of an outbox with an outbox table (S-T36): the
//! listener's state and the horizon the relay reads on its own schedule
//! (the oldest open transaction holding delivery back, the relay's lag),
//! with the reading's age; a failed read keeps the last value. Against the
//! table's in-memory model on tokio's paused clock, and against the real
//! PostgreSQL (`OUTBOX_TEST_POSTGRES_URL`: skipped when unset, failing
//! when set and unreachable).
#![cfg(all(feature = "table", feature = "testkit"))]

mod common;

use std::time::Duration;

use common::table::{encoded, model_outbox, stage_model as stage, Held};
use outbox::table::model::{Model, ModelConfig};
use outbox::table::{ListenerState, SchemaState, TableHealth, TableRelay};
use outbox::{Config, Outbox, WriteError};

fn outbox(model: &Model, sink: Held, listen: bool) -> Outbox<Held> {
    let config = Config::builder().max_batch(1).build().unwrap();
    model_outbox(
        model,
        sink,
        config,
        TableRelay::new("health-1").listen(listen),
    )
}

fn table(outbox: &Outbox<Held>) -> TableHealth {
    outbox.health().table.expect("an outbox with a table")
}

/// Waits (paused clock, bounded) until the table's health satisfies `f`.
async fn until(outbox: &Outbox<Held>, what: &str, f: impl Fn(&TableHealth) -> bool) -> TableHealth {
    for _ in 0..3_000 {
        let h = table(outbox);
        if f(&h) {
            return h;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("never: {what}; health {:?}", table(outbox));
}

/// S-T36: a row staged and not relayed (its write held) shows as the lag,
/// on the database's clock; an open transaction holding an id shows as the
/// oldest transaction; both go once the row is written and the
/// transaction ends. The listener is reported listening.
#[tokio::test(start_paused = true)]
async fn health_shows_the_lag_of_a_row_not_relayed_and_the_listener() {
    let model = Model::new(ModelConfig {
        partitions: 1,
        ..ModelConfig::default()
    });
    let sink = Held::new(0);
    let outbox = outbox(&model, sink.clone(), true);
    let h = until(&outbox, "an empty table read", |h| h.horizon.is_some()).await;
    assert_eq!(h.horizon.and_then(|h| h.lag), None, "{h:?}");
    until(&outbox, "the listener", |h| {
        h.listener == ListenerState::Listening
    })
    .await;

    stage(&model, 7, 1);
    let (t, i) = encoded(8, 2);
    let open = model.begin();
    model.stage(open, &t, &i, 0, false).unwrap();
    model.advance(Duration::from_secs(5));
    let h = until(&outbox, "a lag of 5 s", |h| {
        h.horizon.and_then(|h| h.lag) >= Some(Duration::from_secs(5))
    })
    .await;
    let horizon = h.horizon.unwrap();
    assert!(
        horizon.oldest_transaction >= Some(Duration::from_secs(5)),
        "{h:?}"
    );
    assert!(
        h.horizon_age <= Some(Duration::from_secs(1)),
        "fresh: {h:?}"
    );
    assert_eq!(h.horizon_failures, 0);
    assert_eq!(h.listener, ListenerState::Listening);
    assert_eq!(outbox.counters().written, 0, "the row is not relayed yet");

    model.rollback(open);
    sink.permits.add_permits(100);
    until(&outbox, "no lag, no transaction", |h| {
        h.horizon
            .is_some_and(|h| h.lag.is_none() && h.oldest_transaction.is_none())
    })
    .await;
    assert_eq!(outbox.counters().written, 1);
    assert!(model.rows().is_empty());
    drop(outbox.shutdown(Duration::from_secs(5)).await);
}

/// S-T36, S-T34: with the database gone, the listener is reported away,
/// and the horizon keeps its last value, growing older, while the failed
/// reads are counted; `health()` itself never waits for the store.
#[tokio::test(start_paused = true)]
async fn a_failed_read_keeps_the_last_horizon_with_its_age_and_the_listener_is_away() {
    let model = Model::new(ModelConfig {
        partitions: 1,
        ..ModelConfig::default()
    });
    let sink = Held::new(0);
    let outbox = outbox(&model, sink, true);
    stage(&model, 7, 1);
    model.advance(Duration::from_secs(2));
    let before = until(&outbox, "a lag and the listener", |h| {
        h.listener == ListenerState::Listening
            && h.horizon.and_then(|h| h.lag) >= Some(Duration::from_secs(2))
    })
    .await;
    model.fail_next(u32::MAX / 2);
    model.disconnect_listeners();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let h = table(&outbox);
    assert_eq!(h.listener, ListenerState::Away, "{h:?}");
    assert_eq!(h.horizon, before.horizon, "the last value kept");
    assert!(h.horizon_age >= Some(Duration::from_secs(4)), "{h:?}");
    assert!(h.horizon_failures >= 3, "{h:?}");
    drop(outbox.shutdown(Duration::from_millis(100)).await);
}

/// S-T36: an outbox built to poll only says so; one without a table has
/// no table health.
#[tokio::test(start_paused = true)]
async fn polling_only_is_reported_and_an_outbox_without_a_table_has_none() {
    let model = Model::new(ModelConfig::default());
    let sink = Held::new(10);
    let outbox = outbox(&model, sink.clone(), false);
    let h = until(&outbox, "a horizon", |h| h.horizon.is_some()).await;
    assert_eq!(h.listener, ListenerState::PollingOnly);
    drop(outbox.shutdown(Duration::from_secs(1)).await);
    let plain = Outbox::builder(sink).build().expect("build");
    assert_eq!(plain.health().table, None);
    drop(plain.shutdown(Duration::from_secs(1)).await);
}

/// S-T36 against the real PostgreSQL: a row whose writes keep failing
/// shows as the lag, an open transaction holding an id as the oldest
/// transaction (at least its age: other sessions of the server may be
/// older), and the listener as listening.
#[cfg(feature = "postgres")]
#[tokio::test]
async fn health_against_postgres_shows_the_lag_the_oldest_transaction_and_the_listener() {
    use common::table::{Faulty, Usage, World};
    let Some(w) = World::new("health").await else {
        return;
    };
    let sink = Faulty {
        inner: w.sink(),
        fault: Box::new(|_, _| Some(WriteError::retryable("down"))),
    };
    let config = Config::builder()
        .max_batch(1)
        .initial_backoff(Duration::from_millis(10))
        .max_backoff(Duration::from_millis(50))
        .build()
        .expect("config");
    let outbox = w.outbox_into(sink, config, TableRelay::new("h1"));
    w.stage(9, &[Usage::new(1)], true).await;
    let mut client = w.pool.get().await.expect("a connection");
    let tx = tokio_postgres::Client::transaction(&mut client)
        .await
        .expect("begin");
    tx.query_one("SELECT pg_current_xact_id()", &[])
        .await
        .expect("an id");
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let h = common::servers::eventually(
        "a lag and an old transaction",
        Duration::from_secs(20),
        || async {
            let h = outbox.health().table.expect("a table");
            let old = Duration::from_secs(1);
            let ok = h.listener == ListenerState::Listening
                && h.horizon
                    .is_some_and(|z| z.lag >= Some(old) && z.oldest_transaction >= Some(old));
            ok.then_some(h)
        },
    )
    .await;
    assert_eq!(h.horizon_failures, 0, "{h:?}");
    assert_eq!(
        h.schema,
        SchemaState::Accepted {
            version: outbox::table::SCHEMA_VERSION
        }
    );
    tx.rollback().await.expect("rollback");
    drop(client);
    w.close(outbox, Duration::from_millis(200)).await;
}

/// S-T36, S-T3 against the real PostgreSQL: a relay whose outbox table is
/// not there says so (`Missing`, and reads again), and one whose table's
/// schema this crate refuses says so with the version (`Refused`); in both
/// nothing is relayed. The refused one reads the schema again: once it is
/// one the crate reads, the relay starts, without a restart.
#[cfg(feature = "postgres")]
#[tokio::test]
async fn health_against_postgres_says_the_table_is_missing_or_its_schema_refused() {
    use common::table::World;
    let Some(w) = World::new("hschema").await else {
        return;
    };
    let schema =
        |outbox: &Outbox<common::table::Sink>| outbox.health().table.expect("a table").schema;
    // A table of another name, never migrated.
    let url = std::env::var(common::postgres::VAR).expect("set");
    let listen: tokio_postgres::Config = url.parse().expect("a postgres URL");
    let names = outbox::table::TableNames::new(&format!("{}_none", w.name)).expect("name");
    let store = outbox::table::PgStore::new(w.relay_pool.clone(), listen, names);
    let missing = Outbox::builder(w.sink())
        .table(
            store,
            TableRelay::new("hs1").poll_interval(Duration::from_millis(100)),
        )
        .build()
        .expect("build");
    common::servers::eventually("missing", Duration::from_secs(20), || async {
        (schema(&missing) == SchemaState::Missing).then_some(())
    })
    .await;
    drop(missing.shutdown(Duration::from_millis(200)).await);

    // The test's table, at a version this crate does not know.
    w.admin
        .execute(
            &format!(
                "INSERT INTO \"{}_schema\" (version, name, min_reader, applied_by) \
                 VALUES (999, 'future', 999, 'test')",
                w.name
            ),
            &[],
        )
        .await
        .expect("a future version");
    w.stage(3, &[common::table::Usage::new(1)], true).await;
    let refused = w.outbox(
        Config::default(),
        TableRelay::new("hs2").poll_interval(Duration::from_millis(100)),
    );
    common::servers::eventually("refused", Duration::from_secs(20), || async {
        (schema(&refused)
            == SchemaState::Refused {
                version: 999,
                min_reader: 999,
            })
        .then_some(())
    })
    .await;
    assert_eq!(refused.counters().written, 0, "nothing relayed");
    assert_eq!(w.left().await, 1, "the row stays");
    // The schema becomes one this crate reads (as after the migrations
    // ran): the running relay reads it again, starts, and relays the row,
    // with no restart.
    w.admin
        .execute(
            &format!("DELETE FROM \"{}_schema\" WHERE version = 999", w.name),
            &[],
        )
        .await
        .expect("back to a known version");
    common::servers::eventually("accepted", Duration::from_secs(20), || async {
        (schema(&refused)
            == SchemaState::Accepted {
                version: outbox::table::SCHEMA_VERSION,
            })
        .then_some(())
    })
    .await;
    common::servers::eventually("relayed", Duration::from_secs(20), || async {
        (refused.counters().written == 1).then_some(())
    })
    .await;
    w.close(refused, Duration::from_millis(200)).await;
}
