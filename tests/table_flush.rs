//! `flush` and `settle` on an outbox with an outbox table (S-W10, S-A4
//! restated for the table): they cover the rows this instance had read
//! and handed to the engine before the call; a flush sends them at once,
//! lingering or not; a settle waits for them without sending early; both
//! answer once the covered rows are out of the table, or at the deadline,
//! whose report counts those still pending. Against the table's model on
//! tokio's paused clock, and the real PostgreSQL
//! (`OUTBOX_TEST_POSTGRES_URL`: skipped when unset, failing when set and
//! unreachable).
#![cfg(all(feature = "table", feature = "testkit"))]

mod common;

use std::time::Duration;

use common::table::{model_outbox, stage_model as stage, Held};
use outbox::table::model::{Model, ModelConfig};
use outbox::table::TableRelay;
use outbox::{Config, Outbox};

fn outbox(model: &Model, sink: Held, linger: Duration) -> Outbox<Held> {
    let config = Config::builder()
        .max_batch(10)
        .linger(linger)
        .build()
        .unwrap();
    model_outbox(model, sink, config, TableRelay::new("flush-1"))
}

async fn until(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..10_000 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("never: {what}");
}

/// A model with one partition, `n` rows of tenant 7 committed, and an
/// outbox relaying them into `sink`, once all `n` are in the engine.
async fn relaying(n: u32, sink: &Held, linger: Duration) -> (Model, Outbox<Held>) {
    let model = Model::new(ModelConfig {
        partitions: 1,
        ..ModelConfig::default()
    });
    let outbox = outbox(&model, sink.clone(), linger);
    for i in 0..n {
        stage(&model, 7, i);
    }
    until("the rows in the engine", || {
        outbox.counters().pending == u64::from(n)
    })
    .await;
    (model, outbox)
}

/// S-A4: a flush sends the relayed rows in the engine at once (their
/// linger is a minute) and answers once they are written.
#[tokio::test(start_paused = true)]
async fn a_flush_sends_relayed_rows_at_once_and_covers_them() {
    let sink = Held::new(100);
    let (model, outbox) = relaying(3, &sink, Duration::from_secs(60)).await;
    let t0 = tokio::time::Instant::now();
    let report = outbox.flush(Duration::from_secs(10)).await;
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    assert_eq!((report.written, report.pending), (3, 0), "{report:?}");
    assert!(!report.deadline_passed);
    until("the rows removed", || model.rows().is_empty()).await;
    drop(outbox.shutdown(Duration::from_secs(1)).await);
}

/// S-W10: a settle waits for the relayed rows in the engine, sending
/// nothing early, and answers once they are written.
#[tokio::test(start_paused = true)]
async fn a_settle_waits_for_the_relayed_rows_in_the_engine() {
    let sink = Held::new(0);
    let (_model, outbox) = relaying(3, &sink, Duration::ZERO).await;
    let mut settle = outbox.settle(Duration::from_secs(60));
    let early = tokio::time::timeout(Duration::from_secs(5), &mut settle).await;
    assert!(early.is_err(), "answered with the writes held: {early:?}");
    sink.permits.add_permits(100);
    let report = settle.await;
    assert_eq!((report.written, report.pending), (3, 0), "{report:?}");
    assert!(!report.deadline_passed);
    drop(outbox.shutdown(Duration::from_secs(1)).await);
}

/// S-W10: at a settle's deadline the report counts the relayed rows still
/// pending; nothing is lost, and the rows stay in the table.
#[tokio::test(start_paused = true)]
async fn a_settle_at_its_deadline_counts_the_rows_still_pending() {
    let sink = Held::new(0);
    let (model, outbox) = relaying(3, &sink, Duration::ZERO).await;
    let report = outbox.settle(Duration::from_secs(2)).await;
    assert!(report.deadline_passed, "{report:?}");
    assert_eq!((report.written, report.pending), (0, 3), "{report:?}");
    assert_eq!(outbox.counters().lost_total(), 0);
    assert_eq!(model.rows().len(), 3);
    drop(outbox.shutdown(Duration::from_millis(100)).await);
}

/// S-W10: a settle answers once its rows are removed from the table too,
/// but never after its deadline: with every removal failing, it answers
/// at the deadline, the rows written and still in the table.
#[tokio::test(start_paused = true)]
async fn a_settle_waits_for_the_removals_until_its_deadline() {
    let sink = Held::new(0);
    let (model, outbox) = relaying(3, &sink, Duration::ZERO).await;
    let t0 = tokio::time::Instant::now();
    let settle = outbox.settle(Duration::from_secs(3));
    model.fail_next(u32::MAX / 2);
    sink.permits.add_permits(100);
    let report = settle.await;
    let waited = t0.elapsed();
    assert_eq!((report.written, report.pending), (3, 0), "{report:?}");
    assert!(
        waited >= Duration::from_secs(3) && waited < Duration::from_millis(3100),
        "answered after {waited:?}"
    );
    assert_eq!(model.rows().len(), 3, "no removal went through");
    drop(outbox.shutdown(Duration::from_millis(100)).await);
}

/// A flush after a shutdown answers at once: nothing is waited for, no
/// removal either.
#[tokio::test(start_paused = true)]
async fn a_flush_after_the_shutdown_answers_at_once() {
    let sink = Held::new(0);
    let (_model, outbox) = relaying(3, &sink, Duration::ZERO).await;
    sink.permits.add_permits(100);
    drop(outbox.shutdown(Duration::from_secs(1)).await);
    let t0 = tokio::time::Instant::now();
    let report = outbox.flush(Duration::from_secs(60)).await;
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    assert_eq!(report.pending, 0, "{report:?}");
}

/// S-W10, S-A4 against the real PostgreSQL: a settle answers once the
/// rows it covers are written and removed from the table, so right after
/// it the table holds none of them.
#[cfg(feature = "postgres")]
#[tokio::test]
async fn after_a_settle_the_covered_rows_are_out_of_the_table() {
    use common::table::{Usage, World};
    let Some(w) = World::new("settle").await else {
        return;
    };
    let config = Config::builder().max_batch(5).build().unwrap();
    let outbox = w.outbox(config, TableRelay::new("s1"));
    for round in 0..5u128 {
        let items: Vec<Usage> = (1..=40).map(|i| Usage::new(round * 100 + i)).collect();
        w.stage(3, &items, true).await;
        common::servers::eventually(
            "the rows in the engine",
            Duration::from_secs(20),
            || async { (outbox.counters().recovered >= 40 * (round as u64 + 1)).then_some(()) },
        )
        .await;
        let report = outbox.settle(Duration::from_secs(10)).await;
        assert!(!report.deadline_passed, "{report:?}");
        assert_eq!(w.left().await, 0, "round {round}: {report:?}");
    }
    assert_eq!(w.target_rows().await.len(), 200);
    w.close(outbox, Duration::from_secs(2)).await;
}
