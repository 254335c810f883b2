//! The outbox table relayed by an outbox (S-T30..S-T37), against the real
//! PostgreSQL (`OUTBOX_TEST_POSTGRES_URL`: skipped when unset, failing
//! when set and unreachable). Each test has tables of its own.
#![cfg(all(feature = "table", feature = "testkit"))]

mod common;

use std::time::Duration;

use common::table::{Usage, World};
use outbox::table::TableRelay;
use outbox::Config;

fn config() -> Config {
    Config::builder().max_batch(50).build().expect("config")
}

/// S-T10, S-T31: a rolled-back stage is never delivered; a committed one
/// is, once, and its row is deleted.
#[tokio::test]
async fn a_rolled_back_stage_is_never_delivered_a_committed_one_once() {
    let Some(w) = World::new("rolled_back").await else {
        return;
    };
    let outbox = w.outbox(config(), TableRelay::new("i1"));
    w.stage(7, &[Usage::new(1)], false).await;
    w.stage(7, &[Usage::new(2)], true).await;
    w.stage(8, &[Usage::new(3)], false).await;
    w.stage(8, &[Usage::new(4)], true).await;
    let rows = w.wait_for(2).await;
    let report = outbox.shutdown(Duration::from_secs(5)).await;
    outbox.closed().await;
    let mut ids: Vec<u128> = w.target_rows().await.iter().map(|r| r.1).collect();
    ids.sort_unstable();
    assert_eq!(ids, [2, 4], "rows {rows:?}, report {report:?}");
    assert_eq!(w.left().await, 0, "every delivered row is deleted");
    assert_eq!(outbox.counters().written, 2);
    w.finish().await;
}
