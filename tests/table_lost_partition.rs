//! A lost partition through the driver (S-L16), against the outbox
//! table's in-memory model on tokio's paused clock: a write that comes
//! back `stale_epoch` stops its partition, and the waiting items of that
//! partition's other tenants leave the engine at once, counted
//! `handed_over` (their rows stay in the table), not at their next write;
//! a flush answers with them as handed over; the other partition goes on.
//! Past the lease's deadline (the store unreachable) the same holds for
//! a retry slice backing off.
#![cfg(all(feature = "table", feature = "testkit"))]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox::codec::{Codec, Postcard};
use outbox::table::model::{Model, ModelConfig};
use outbox::table::{partition_of, Relayed, TableRelay};
use outbox::{Config, Outbox, Sink, WriteEpoch, WriteError, Written};
use tokio::sync::Semaphore;
use tokio::time::Instant;

/// One write as the sink saw it: its tenant, epoch and items.
type Seen = (u64, Option<WriteEpoch>, Vec<u32>);

/// Tenant `stale`'s first write waits for a permit, then comes back
/// `stale_epoch`; tenant `failing`'s writes always fail (retryably);
/// tenant `hold`'s writes wait for a permit of `held`; the rest are
/// written.
#[derive(Clone)]
struct Scripted {
    stale: u64,
    failing: u64,
    hold: u64,
    held: Arc<Semaphore>,
    seen: Arc<Mutex<Vec<Seen>>>,
    permits: Arc<Semaphore>,
    stale_sent: Arc<AtomicBool>,
}

impl Scripted {
    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    fn seen_of(&self, tenant: u64) -> Vec<Vec<u32>> {
        let seen = self.seen();
        seen.into_iter()
            .filter(|s| s.0 == tenant)
            .map(|s| s.2)
            .collect()
    }
}

impl Sink for Scripted {
    type Tenant = u64;
    type Item = Relayed<u32>;
    fn name(&self) -> &str {
        "scripted"
    }
    async fn write(&self, _: &u64, _: &[Relayed<u32>]) -> Result<Written, WriteError> {
        Err(WriteError::terminal(
            "every write of this test carries an epoch",
        ))
    }
    async fn write_with_epoch(
        &self,
        epoch: WriteEpoch,
        tenant: &u64,
        items: &[Relayed<u32>],
    ) -> Result<Written, WriteError> {
        let ids = items.iter().map(|r| r.item).collect();
        self.seen.lock().unwrap().push((*tenant, Some(epoch), ids));
        if *tenant == self.failing {
            return Err(WriteError::retryable("the target is down for this tenant"));
        }
        if *tenant == self.hold {
            self.held.acquire().await.expect("open").forget();
        }
        if *tenant == self.stale && !self.stale_sent.swap(true, Ordering::SeqCst) {
            self.permits.acquire().await.expect("open").forget();
            return Err(WriteError::stale_epoch("a newer epoch is installed"));
        }
        Ok(Written::ALL)
    }
}

fn encoded(tenant: u64) -> Vec<u8> {
    let mut t = Vec::new();
    Codec::<u64, u32>::encode_tenant(&Postcard, &tenant, &mut t).unwrap();
    t
}

/// Commits one row per item of `tenant`, in one transaction each.
fn stage(model: &Model, tenant: u64, items: &[u32]) {
    for item in items {
        let mut i = Vec::new();
        Codec::<u64, u32>::encode_item(&Postcard, item, &mut i).unwrap();
        let session = model.begin();
        model.stage(session, &encoded(tenant), &i, 0, true).unwrap();
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

/// S-L16, S-L15, S-C4: tenants `a` (its write comes back stale) and `b`
/// (its slice waits an hour for a retry) share partition 0 of two, `c`
/// is of the other. Once `a`'s write is stale, `b`'s waiting slice is
/// handed over at once, long before its retry; a flush started before
/// answers with `a`'s and `b`'s items as handed over; `c`'s partition
/// goes on writing; no row of `a` or `b` leaves the table.
#[tokio::test(start_paused = true)]
async fn a_stale_write_hands_its_partitions_waiting_items_over_at_once() {
    let model = Model::new(ModelConfig {
        partitions: 2,
        ..ModelConfig::default()
    });
    let on = |p: u32| (1..100u64).filter(move |t| partition_of(&encoded(*t), 2) == p);
    let mut zero = on(0);
    let (a, b) = (zero.next().unwrap(), zero.next().unwrap());
    let c = on(1).next().unwrap();
    let sink = Scripted {
        stale: a,
        failing: b,
        hold: u64::MAX,
        held: Arc::new(Semaphore::new(0)),
        seen: Arc::default(),
        permits: Arc::new(Semaphore::new(0)),
        stale_sent: Arc::default(),
    };
    let hour = Duration::from_secs(3600);
    let config = Config::builder()
        .max_batch(1)
        .concurrency(2)
        .initial_backoff(hour)
        .max_backoff(hour)
        .build()
        .unwrap();
    let outbox = Outbox::builder(sink.clone())
        .config(config)
        .table(
            model.store(),
            TableRelay::new("lost-1").poll_interval(Duration::from_millis(50)),
        )
        .build()
        .expect("build");
    stage(&model, b, &[1]);
    until("b's first attempt failed", || {
        outbox.counters().failed_attempts == 1
    })
    .await;
    stage(&model, a, &[2, 3]);
    until("a's write open", || sink.seen_of(a).len() == 1).await;
    until("a's second row in the engine", || {
        outbox.counters().pending == 3
    })
    .await;
    stage(&model, c, &[4]);
    until("c's row written", || outbox.counters().written == 1).await;
    let flush = tokio::spawn(outbox.flush(hour * 4));
    tokio::task::yield_now().await;
    // a's write comes back stale: partition 0 is lost.
    let stale_at = Instant::now();
    sink.permits.add_permits(1);
    until("a's and b's items handed over", || {
        outbox.counters().handed_over >= 3
    })
    .await;
    assert!(
        stale_at.elapsed() < Duration::from_secs(10),
        "b's slice waited {:?}: it left at its retry, not at the loss",
        stale_at.elapsed()
    );
    let counters = outbox.counters();
    assert_eq!(
        (counters.lost_total(), counters.dropped_total()),
        (0, 0),
        "{counters:?}"
    );
    assert!(counters.balanced(), "{counters:?}");
    let report = flush.await.unwrap();
    assert_eq!(
        (
            report.written,
            report.handed_over,
            report.lost,
            report.pending
        ),
        (0, 3, 0, 0),
        "{report:?}"
    );
    assert_eq!(sink.seen_of(b), [vec![1]], "b never retried here");
    // The other partition goes on.
    stage(&model, c, &[5]);
    until("c's next row written", || sink.seen_of(c).len() == 2).await;
    assert_eq!(sink.seen_of(c), [vec![4], vec![5]]);
    let b_rows = model
        .rows()
        .into_iter()
        .filter(|r| r.tenant == encoded(b))
        .count();
    assert_eq!(b_rows, 1, "b's row stays in the table");
    drop(outbox.shutdown(Duration::from_secs(5)).await);
}

/// S-L16, S-L15 (`deadline_passed`): the store unreachable, no renewal
/// succeeds; once the lease's deadline passes, the retry slice waiting an
/// hour for its next attempt is handed over then (within a ttl and a
/// little), not at its retry; nothing is lost and its row stays.
#[tokio::test(start_paused = true)]
async fn past_the_deadline_a_retry_slice_is_handed_over_not_kept_for_its_retry() {
    let model = Model::new(ModelConfig {
        partitions: 1,
        ..ModelConfig::default()
    });
    let sink = Scripted {
        stale: u64::MAX,
        failing: 7,
        hold: u64::MAX,
        held: Arc::new(Semaphore::new(0)),
        seen: Arc::default(),
        permits: Arc::new(Semaphore::new(0)),
        stale_sent: Arc::default(),
    };
    let hour = Duration::from_secs(3600);
    let config = Config::builder()
        .max_batch(1)
        .initial_backoff(hour)
        .max_backoff(hour)
        .build()
        .unwrap();
    let outbox = Outbox::builder(sink.clone())
        .config(config)
        .table(
            model.store(),
            TableRelay::new("lost-2").poll_interval(Duration::from_millis(50)),
        )
        .build()
        .expect("build");
    stage(&model, 7, &[1, 2]);
    until("the first attempt failed", || {
        outbox.counters().failed_attempts == 1
    })
    .await;
    assert_eq!(outbox.counters().pending, 2);
    let settle = tokio::spawn(outbox.settle(hour * 4));
    tokio::task::yield_now().await;
    // The database goes away: no renewal, no removal succeeds.
    let gone = Instant::now();
    model.fail_next(u32::MAX / 2);
    until("the retry slice and the backlog handed over", || {
        outbox.counters().handed_over == 2
    })
    .await;
    assert!(
        gone.elapsed() < Duration::from_secs(30),
        "handed over {:?} after the store went away: at the retry, not the deadline",
        gone.elapsed()
    );
    let report = settle.await.unwrap();
    assert_eq!(
        (report.handed_over, report.lost, report.written),
        (2, 0, 0),
        "{report:?}"
    );
    assert_eq!(sink.seen_of(7), [vec![1]], "never retried");
    assert_eq!(model.rows().len(), 2, "both rows stay in the table");
    let c = outbox.counters();
    assert!(c.balanced() && c.lost_total() == 0, "{c:?}");
}

/// S-T39, S-T36: a partition lost while a write of its rows is in flight
/// leaves those rows as orphans, which `health()` counts (the partition,
/// gained again, would wait for them). Tenants `h` and `s` share the one
/// partition; `h`'s write is held while `s`'s comes back `stale_epoch`,
/// which loses the partition: `h`'s row is the orphan until its write
/// ends, then the count is back to 0.
#[tokio::test(start_paused = true)]
async fn health_counts_the_rows_of_a_lost_partition_still_in_flight() {
    let model = Model::new(ModelConfig {
        partitions: 1,
        ..ModelConfig::default()
    });
    let (h, s) = (7, 8);
    let sink = Scripted {
        stale: s,
        failing: u64::MAX,
        hold: h,
        held: Arc::new(Semaphore::new(0)),
        seen: Arc::default(),
        permits: Arc::new(Semaphore::new(0)),
        stale_sent: Arc::default(),
    };
    let config = Config::builder()
        .max_batch(1)
        .concurrency(2)
        .build()
        .unwrap();
    let outbox = Outbox::builder(sink.clone())
        .config(config)
        .table(
            model.store(),
            TableRelay::new("lost-3").poll_interval(Duration::from_millis(50)),
        )
        .build()
        .expect("build");
    let orphans = || outbox.health().table.expect("a table").orphans;
    stage(&model, h, &[1]);
    until("h's write open", || sink.seen_of(h).len() == 1).await;
    stage(&model, s, &[2]);
    until("s's write open", || sink.seen_of(s).len() == 1).await;
    assert_eq!(orphans(), 0);
    sink.permits.add_permits(1);
    until("s's row handed over", || outbox.counters().handed_over == 1).await;
    until("h's row in flight counted an orphan", || orphans() == 1).await;
    sink.held.add_permits(1);
    until("h's write ended", || outbox.counters().pending == 0).await;
    until("no orphan left", || orphans() == 0).await;
    let c = outbox.counters();
    assert!(c.balanced() && c.lost_total() == 0, "{c:?}");
    drop(outbox.shutdown(Duration::from_secs(5)).await);
}
