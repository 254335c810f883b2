//! A sink's `stale_epoch` answer through the driver (S-E7): the write
//! ends `stale_epoch`, its tenant is handed over (neither retried nor
//! lost), the others go on; and the Sink trait's epoch methods (S-E8)
//! default to the plain ones.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox::core::Failure;
use outbox::{Config, ErrorKind, Outbox, Sink, Slice, Staged, WriteEpoch, WriteError, Written};

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

#[tokio::test(start_paused = true)]
async fn s_e7_a_stale_write_hands_its_tenant_over_through_the_driver() {
    let sink = Fenced::default();
    let config = Config::builder().concurrency(1).build().unwrap();
    let o = Outbox::new(sink.clone(), config).unwrap();
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
        (1, 3, 0, 0)
    );
    let c = o.counters();
    assert_eq!((c.handed_over, c.lost_total(), c.written), (3, 0, 1));
    assert_eq!(
        c.failed(Failure::StaleEpoch),
        1,
        "one attempt, never retried"
    );
    assert_eq!(*sink.calls.lock().unwrap(), 2);
    assert_eq!(*sink.stored.lock().unwrap(), [(2, vec![9])]);
    let sd = o.shutdown(Duration::from_secs(1)).await;
    assert!(sd.unwritten.is_empty(), "handed over is no dead letter");
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
