//! A sink's `stale_epoch` answer through the driver (S-E7) on an outbox
//! without an outbox table (in memory, and with the journal): nothing can
//! take the items over, so the write ends `stale_epoch` as a terminal
//! failure, its items lost under `stale_epoch` and dead-lettered, never
//! counted handed over into nowhere; the others go on. (With an outbox
//! table it hands its tenant over: `tests/table_lost_partition.rs`.) And
//! the Sink trait's epoch methods (S-E8) default to the plain ones.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox::core::{DeadLetter, DeadReason, Failure};
use outbox::{
    Config, DeadLetters, ErrorKind, LostReason, Outbox, Sink, Slice, Staged, WriteEpoch,
    WriteError, Written,
};

/// What the sink stored: (tenant, slice), in order.
type Stored = Arc<Mutex<Vec<(u64, Vec<u32>)>>>;

/// Refuses every write of tenant 1 as stale; stores the others.
#[derive(Clone, Default)]
struct Fenced {
    stored: Stored,
    calls: Arc<Mutex<u32>>,
}

impl Sink for Fenced {
    type Tenant = u64;
    type Item = u32;
    fn name(&self) -> &str {
        "fenced"
    }
    async fn write(&self, tenant: &u64, items: &[u32]) -> Result<Written, WriteError> {
        *self.calls.lock().unwrap() += 1;
        if *tenant == 1 {
            return Err(WriteError::stale_epoch("a newer epoch is installed"));
        }
        self.stored.lock().unwrap().push((*tenant, items.to_vec()));
        Ok(Written::ALL)
    }
}

/// Dead letters handed out at run time: (tenant, items, reason).
type Letters = Arc<Mutex<Vec<(u64, Vec<u32>, DeadReason)>>>;

fn letters() -> (Letters, DeadLetters<u64, u32>) {
    let got = Letters::default();
    let into = Arc::clone(&got);
    let dl = DeadLetters::callback(move |d: DeadLetter<u64, u32>| {
        into.lock().unwrap().push((d.tenant, d.items, d.reason));
    });
    (got, dl)
}

/// Stages 3 items of tenant 1 (refused stale) and 1 of tenant 2, settles
/// and checks that without an outbox table the stale write is a terminal
/// loss (S-E7): lost under `stale_epoch`, dead-lettered, never counted
/// handed over; the items staged behind it are written.
async fn stale_without_a_table_is_lost(o: &Outbox<Fenced>, sink: &Fenced, got: &Letters) {
    for i in 0..3 {
        assert_eq!(o.stage(1, i), Staged::Accepted);
    }
    assert_eq!(o.stage(2, 9), Staged::Accepted);
    let report = o.settle(Duration::from_secs(10)).await;
    assert_eq!(
        (
            report.written,
            report.handed_over,
            report.lost,
            report.pending
        ),
        (1, 0, 3, 0)
    );
    let c = o.counters();
    assert_eq!(
        (c.handed_over, c.lost(LostReason::StaleEpoch), c.written),
        (0, 3, 1)
    );
    assert_eq!(
        c.failed(Failure::StaleEpoch),
        1,
        "one attempt, never retried"
    );
    assert_eq!(*sink.calls.lock().unwrap(), 2);
    assert_eq!(*sink.stored.lock().unwrap(), [(2, vec![9])]);
    assert_eq!(
        *got.lock().unwrap(),
        [(1, vec![0, 1, 2], DeadReason::StaleEpoch)]
    );
}

#[tokio::test(start_paused = true)]
async fn s_e7_without_an_outbox_table_a_stale_write_is_lost_and_dead_lettered() {
    let sink = Fenced::default();
    let config = Config::builder().concurrency(1).build().unwrap();
    let (got, dl) = letters();
    let o = Outbox::builder(sink.clone())
        .config(config)
        .dead_letters(dl)
        .build()
        .unwrap();
    stale_without_a_table_is_lost(&o, &sink, &got).await;
    let sd = o.shutdown(Duration::from_secs(1)).await;
    assert_eq!((sd.lost, sd.handed_over), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn s_e7_without_an_outbox_table_or_dead_letters_the_loss_is_counted() {
    let sink = Fenced::default();
    let config = Config::builder().concurrency(1).build().unwrap();
    let o = Outbox::new(sink.clone(), config).unwrap();
    assert_eq!(o.stage(1, 5), Staged::Accepted);
    let report = o.settle(Duration::from_secs(10)).await;
    assert_eq!((report.lost, report.handed_over), (1, 0));
    assert_eq!(o.counters().lost(LostReason::StaleEpoch), 1);
}

#[cfg(feature = "journal")]
#[test]
fn s_e7_with_a_journal_a_stale_write_is_lost_dead_lettered_and_not_recovered() {
    use outbox::journal::{JournalConfig, MemStorage};
    let disk = MemStorage::new();
    let journal = || {
        JournalConfig::with_storage(disk.clone())
            .sync_interval(Duration::from_millis(1))
            .segment_bytes(4_096)
    };
    // A runtime per run: dropping it ends the journal's tasks (its lock).
    let rt = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    rt().block_on(async {
        let sink = Fenced::default();
        let (got, dl) = letters();
        let o = Outbox::builder(sink.clone())
            .config(Config::builder().concurrency(1).build().unwrap())
            .journal(journal())
            .dead_letters(dl)
            .build()
            .unwrap();
        stale_without_a_table_is_lost(&o, &sink, &got).await;
        let sd = o.shutdown(Duration::from_secs(5)).await;
        assert!(sd.unwritten.is_empty());
    });
    // Lost (and handed out as dead letters) is an end: a restart does not
    // bring them back.
    rt().block_on(async {
        let o = Outbox::builder(Fenced::default())
            .journal(journal())
            .build()
            .unwrap();
        assert_eq!(o.counters().recovered, 0);
        o.shutdown(Duration::from_secs(1)).await;
    });
}

#[tokio::test]
async fn s_e8_the_epoch_methods_default_to_the_plain_ones() {
    let sink = Fenced::default();
    let epoch = WriteEpoch::new(3, 7);
    assert_eq!((epoch.partition, epoch.epoch), (3, 7));
    sink.write_with_epoch(epoch, &2, &[1, 2]).await.unwrap();
    let e = sink.write_with_epoch(epoch, &1, &[3]).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::StaleEpoch);
    assert!(!e.is_terminal());
    assert!(e.to_string().starts_with("stale epoch write error"), "{e}");
    let slices = [Slice::new(2, vec![4]), Slice::new(1, vec![5])];
    let out = sink
        .write_group_with_epochs(&slices, &[epoch, WriteEpoch::new(4, 1)])
        .await;
    assert!(out[0].is_ok());
    assert_eq!(out[1].as_ref().unwrap_err().kind(), ErrorKind::StaleEpoch);
    assert_eq!(
        *sink.stored.lock().unwrap(),
        [(2, vec![1, 2]), (2, vec![4])]
    );
}
