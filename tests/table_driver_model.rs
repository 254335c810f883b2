//! An outbox with an outbox table, against the table's in-memory model on
//! tokio's paused clock. Writes gated by the lease (S-T37): every write
//! carries its lease's epoch to the sink; once the lease's deadline passed
//! (the store unreachable, no renewal) no write starts, and the items it
//! held are handed over, never lost; bad lease settings are a build
//! error. No second way in (S-T32): every stage is refused, typed and
//! counted.
#![cfg(all(feature = "table", feature = "testkit"))]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox::codec::{Codec, Postcard};
use outbox::table::model::{Model, ModelConfig};
use outbox::table::{Relayed, TableRelay};
use outbox::{
    BuildError, Config, DropReason, Outbox, Sink, StageError, Staged, WriteEpoch, WriteError,
    Written,
};
use tokio::sync::Semaphore;

/// One write as the sink saw it: its epoch and its items.
type Seen = (Option<WriteEpoch>, Vec<u32>);

/// A sink that records every write with its epoch; each write first takes
/// a permit, so the test decides when writes end.
#[derive(Clone)]
struct Recording {
    writes: Arc<Mutex<Vec<Seen>>>,
    permits: Arc<Semaphore>,
}

impl Recording {
    fn new() -> Self {
        Recording {
            writes: Arc::default(),
            permits: Arc::new(Semaphore::new(0)),
        }
    }

    fn writes(&self) -> Vec<Seen> {
        self.writes.lock().unwrap().clone()
    }

    async fn record(&self, epoch: Option<WriteEpoch>, items: &[Relayed<u32>]) -> Written {
        let ids = items.iter().map(|r| r.item).collect();
        self.writes.lock().unwrap().push((epoch, ids));
        self.permits.acquire().await.expect("open").forget();
        Written::ALL
    }
}

impl Sink for Recording {
    type Tenant = u64;
    type Item = Relayed<u32>;
    fn name(&self) -> &str {
        "recording"
    }
    async fn write(&self, _: &u64, items: &[Relayed<u32>]) -> Result<Written, WriteError> {
        Ok(self.record(None, items).await)
    }
    async fn write_with_epoch(
        &self,
        epoch: WriteEpoch,
        _: &u64,
        items: &[Relayed<u32>],
    ) -> Result<Written, WriteError> {
        Ok(self.record(Some(epoch), items).await)
    }
}

/// Commits one row per item of `tenant`, in one transaction each.
fn stage(model: &Model, tenant: u64, items: &[u32]) {
    let codec = Postcard;
    for item in items {
        let (mut t, mut i) = (Vec::new(), Vec::new());
        Codec::<u64, u32>::encode_tenant(&codec, &tenant, &mut t).unwrap();
        Codec::<u64, u32>::encode_item(&codec, item, &mut i).unwrap();
        let session = model.begin();
        model.stage(session, &t, &i, 0, true).unwrap();
        assert!(model.commit(session).unwrap());
    }
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

fn outbox(model: &Model, sink: Recording) -> Outbox<Recording> {
    let config = Config::builder().max_batch(1).build().unwrap();
    Outbox::builder(sink)
        .config(config)
        .table(
            model.store(),
            TableRelay::new("gate-1").poll_interval(Duration::from_millis(50)),
        )
        .build()
        .expect("build")
}

/// S-T37, S-E8: each write carries the epoch its partition is held under.
#[tokio::test(start_paused = true)]
async fn every_write_carries_its_lease_epoch() {
    let model = Model::new(ModelConfig {
        partitions: 2,
        ..ModelConfig::default()
    });
    let sink = Recording::new();
    sink.permits.add_permits(1_000);
    let outbox = outbox(&model, sink.clone());
    stage(&model, 1, &[1, 2]);
    stage(&model, 2, &[3]);
    until("three writes", || sink.writes().len() == 3).await;
    for (epoch, items) in sink.writes() {
        let epoch = epoch.unwrap_or_else(|| panic!("a write of {items:?} without an epoch"));
        assert!(epoch.epoch >= 1 && epoch.partition < 2, "{epoch:?}");
    }
    drop(outbox.shutdown(Duration::from_secs(5)).await);
    let c = outbox.counters();
    assert_eq!((c.written, c.handed_over, c.lost_total()), (3, 0, 0));
}

/// S-T37, S-L8: the store unreachable, the lease is not renewed; past its
/// deadline no write starts, and the items waiting are handed over
/// (counted `handed_over`, their rows left in the table), never lost.
#[tokio::test(start_paused = true)]
async fn past_the_lease_deadline_no_write_starts_and_items_are_handed_over() {
    let model = Model::new(ModelConfig {
        partitions: 1,
        ..ModelConfig::default()
    });
    let sink = Recording::new();
    let outbox = outbox(&model, sink.clone());
    stage(&model, 7, &[1, 2, 3]);
    until("the first write", || sink.writes().len() == 1).await;
    until("all three rows in the engine", || {
        outbox.counters().pending == 3
    })
    .await;
    // The database goes away: no renewal, no removal succeeds.
    model.fail_next(u32::MAX / 2);
    tokio::time::sleep(Duration::from_secs(30)).await;
    // The write in flight ends as written; the next is not started.
    sink.permits.add_permits(1_000);
    until("the waiting items handed over", || {
        outbox.counters().handed_over == 2
    })
    .await;
    let writes = sink.writes();
    assert_eq!(writes.len(), 1, "no write after the deadline: {writes:?}");
    assert_eq!(writes[0].1, [1]);
    let c = outbox.counters();
    assert_eq!((c.written, c.lost_total(), c.pending), (1, 0, 0), "{c:?}");
    assert_eq!(model.rows().len(), 3, "every row stays in the table");
}

/// S-T37: lease settings the policy refuses are a build error, not a log
/// line at the relay's start.
#[tokio::test]
async fn refused_lease_settings_are_a_build_error() {
    let model = Model::new(ModelConfig::default());
    let relay = TableRelay::<u64, u32>::new("gate-1").lease(|b| {
        b.lease_ttl(Duration::from_secs(2))
            .renew_every(Duration::from_secs(2))
    });
    let built = Outbox::builder(Recording::new())
        .table(model.store(), relay)
        .build();
    match built {
        Err(BuildError::Lease(e)) => {
            let text = e.to_string();
            assert!(text.contains("renew_every"), "{text}");
        }
        Err(e) => panic!("another error: {e}"),
        Ok(_) => panic!("built with a renewal period at the ttl"),
    }
}

/// S-T32: an outbox built with an outbox table refuses every stage with
/// a typed answer, counted dropped under `table_only` (never lost
/// silently, never a panic), and never waits; the table's rows still go
/// through.
#[tokio::test(start_paused = true)]
async fn every_stage_on_a_table_outbox_is_refused_typed_and_counted() {
    let model = Model::new(ModelConfig::default());
    let sink = Recording::new();
    sink.permits.add_permits(1_000);
    let outbox = outbox(&model, sink.clone());
    let relayed = |n| Relayed {
        row_id: -1,
        item: n,
    };
    assert_eq!(
        outbox.stage(1, relayed(1)),
        Staged::Dropped(DropReason::TableOnly)
    );
    match outbox.try_stage(1, relayed(2)) {
        Err(e @ StageError::TableOnly(_)) => {
            assert!(e.to_string().contains("outbox table"), "{e}");
            assert_eq!(e.into_item().item, 2);
        }
        other => panic!("try_stage answered {other:?}"),
    }
    let waited = outbox
        .stage_wait(1, relayed(3), Duration::from_secs(3600))
        .await;
    assert!(
        matches!(waited, Err(StageError::TableOnly(_))),
        "{waited:?}"
    );
    let many = outbox.stage_many([(1, relayed(4)), (2, relayed(5))]);
    assert_eq!((many.accepted, many.dropped, many.shutting_down), (0, 2, 0));
    stage(&model, 1, &[6]);
    until("the table's row written", || sink.writes().len() == 1).await;
    let c = outbox.counters();
    assert_eq!(c.dropped(DropReason::TableOnly), 3, "{c:?}");
    assert_eq!((c.staged, c.written, c.lost_total()), (3, 1, 0), "{c:?}");
    assert!(sink.writes().iter().all(|(_, items)| items == &[6]));
    assert!(c.balanced(), "{c:?}");
}

/// S-T38: relayed items left at a shutdown's deadline, the one in flight
/// and those waiting, are counted `handed_over` (their rows stay in the
/// table), not lost, and are not in `unwritten`.
#[tokio::test(start_paused = true)]
async fn items_left_at_the_shutdown_deadline_are_handed_over() {
    let model = Model::new(ModelConfig {
        partitions: 1,
        ..ModelConfig::default()
    });
    // No permit: every write hangs.
    let sink = Recording::new();
    let outbox = outbox(&model, sink.clone());
    stage(&model, 3, &[1, 2, 3]);
    until("the first write", || sink.writes().len() == 1).await;
    until("all three rows in the engine", || {
        outbox.counters().pending == 3
    })
    .await;
    let report = outbox.shutdown(Duration::from_millis(200)).await;
    assert!(report.deadline_passed, "{report:?}");
    assert_eq!((report.handed_over, report.lost), (3, 0), "{report:?}");
    assert!(report.unwritten.is_empty(), "{report:?}");
    let c = outbox.counters();
    assert_eq!(
        (c.handed_over, c.lost_total(), c.pending),
        (3, 0, 0),
        "{c:?}"
    );
    assert!(c.balanced(), "{c:?}");
    assert_eq!(model.rows().len(), 3, "every row stays in the table");
}

/// S-W16, S-T33: an outbox whose outbox table cannot be read from the
/// start (a table name that does not exist, the database down) closes
/// for good after its shutdown once every handle is dropped: the lease
/// task, still waiting to read the table's schema, stops with the relay.
#[tokio::test(start_paused = true)]
async fn an_outbox_whose_table_never_answers_still_closes() {
    let model = Model::new(ModelConfig::default());
    // Every store call fails: the schema is never read.
    model.fail_next(u32::MAX / 2);
    let outbox = outbox(&model, Recording::new());
    tokio::time::sleep(Duration::from_secs(3)).await;
    let report = outbox.shutdown(Duration::from_secs(1)).await;
    assert_eq!((report.lost, report.pending), (0, 0));
    let closed = outbox.closed();
    drop(outbox);
    tokio::time::timeout(Duration::from_secs(60), closed)
        .await
        .expect("the outbox closes although its table never answered");
}
