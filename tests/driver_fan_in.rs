//! Fan-in through the driver (S-F1..S-F4): a sink that takes groups gets
//! slices of distinct tenants in one call, each slice with its own
//! outcome, retry and accounting; a timeout applies to the whole group.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox::{Config, Outbox, Sink, Slice, Staged, TenantId, WriteError, Written};

fn t(n: u128) -> TenantId {
    TenantId::from_u128(n)
}

/// Slices as a sink saw them: (tenant, items).
type Seen = Vec<(TenantId, Vec<u32>)>;

#[derive(Default)]
struct State {
    /// Every call: the (tenant, items) of its slices.
    calls: Vec<Seen>,
    /// Written items per tenant, in write order.
    stored: Vec<(TenantId, u32)>,
    /// Tenants whose slice fails retryably (each time until healed).
    failing: BTreeSet<TenantId>,
    /// Tenants whose slice fails terminally.
    rejected: BTreeSet<TenantId>,
    /// A group holding one of these hangs (until healed).
    hanging: BTreeSet<TenantId>,
}

#[derive(Clone, Default)]
struct Groups(Arc<Mutex<State>>);

impl Groups {
    fn stored(&self, tenant: TenantId) -> Vec<u32> {
        let s = self.0.lock().unwrap();
        s.stored
            .iter()
            .filter(|(t, _)| *t == tenant)
            .map(|(_, i)| *i)
            .collect()
    }
    fn calls(&self) -> Vec<Seen> {
        self.0.lock().unwrap().calls.clone()
    }
}

impl Sink for Groups {
    type Tenant = TenantId;
    type Item = u32;
    fn name(&self) -> &str {
        "groups"
    }
    async fn write(&self, tenant: &TenantId, items: &[u32]) -> Result<Written, WriteError> {
        let slice = [Slice::new(*tenant, items.to_vec())];
        self.write_group(&slice).await.pop().expect("one outcome")
    }
    fn takes_groups(&self) -> bool {
        true
    }
    async fn write_group(
        &self,
        slices: &[Slice<TenantId, u32>],
    ) -> Vec<Result<Written, WriteError>> {
        let hang = {
            let mut s = self.0.lock().unwrap();
            s.calls
                .push(slices.iter().map(|x| (x.tenant, x.items.clone())).collect());
            slices.iter().any(|x| s.hanging.contains(&x.tenant))
        };
        if hang {
            std::future::pending::<()>().await;
        }
        let mut s = self.0.lock().unwrap();
        slices
            .iter()
            .map(|x| {
                if s.rejected.contains(&x.tenant) {
                    Err(WriteError::terminal("bad data"))
                } else if s.failing.contains(&x.tenant) {
                    Err(WriteError::retryable("try again"))
                } else {
                    for i in &x.items {
                        s.stored.push((x.tenant, *i));
                    }
                    Ok(Written::ALL)
                }
            })
            .collect()
    }
}

fn stage(o: &Outbox<Groups>, tenant: TenantId, items: impl IntoIterator<Item = u32>) {
    for i in items {
        assert_eq!(o.stage(tenant, i), Staged::Accepted);
    }
}

#[tokio::test(start_paused = true)]
async fn each_slice_of_a_group_has_its_own_outcome_and_retry() {
    let sink = Groups::default();
    sink.0.lock().unwrap().failing.insert(t(2));
    sink.0.lock().unwrap().rejected.insert(t(3));
    let config = Config::builder()
        .concurrency(1)
        .max_slices_per_write(8)
        .initial_backoff(Duration::from_millis(100))
        // Tenant 5's slice, staged at 50 ms, is ready at 100 ms, when
        // tenant 2's backoff ends: they share a group.
        .linger(Duration::from_millis(50))
        .build()
        .unwrap();
    let o = Outbox::new(sink.clone(), config).unwrap();
    for n in 1..=4 {
        stage(&o, t(n), [n as u32 * 10, n as u32 * 10 + 1]);
    }
    let r = o.flush(Duration::from_millis(50)).await;
    assert!(r.deadline_passed, "tenant 2 is still failing");
    // S-F1: one call for the four tenants, in ready order.
    let first = &sink.calls()[0];
    assert_eq!(
        first.iter().map(|(t, _)| *t).collect::<Vec<_>>(),
        [t(1), t(2), t(3), t(4)]
    );
    // S-F3: the others are written, 3's bad data is lost alone.
    assert_eq!(sink.stored(t(1)), [10, 11]);
    assert_eq!(sink.stored(t(4)), [40, 41]);
    // Tenant 2's retry joins a later group with tenant 5's new slice.
    stage(&o, t(2), [22]);
    stage(&o, t(5), [50]);
    sink.0.lock().unwrap().failing.clear();
    let r = o.settle(Duration::from_secs(10)).await;
    assert_eq!(r.pending, 0);
    assert_eq!(sink.stored(t(2)), [20, 21, 22]);
    assert_eq!(sink.stored(t(5)), [50]);
    let calls = sink.calls();
    let retried = calls
        .iter()
        .skip(1)
        .find(|c| c.iter().any(|(t2, _)| *t2 == t(2)))
        .expect("a retry");
    // S-W5: the identical slice, in a group with another tenant's.
    assert!(retried.contains(&(t(2), vec![20, 21])));
    assert!(retried.iter().any(|(x, _)| *x == t(5)));
    let c = o.counters();
    assert_eq!(c.written, 8);
    assert_eq!(c.lost(outbox::LostReason::Terminal), 2);
    assert!(c.balanced());
}

#[tokio::test(start_paused = true)]
async fn a_timeout_fails_every_slice_of_its_group() {
    let sink = Groups::default();
    sink.0.lock().unwrap().hanging.insert(t(2));
    let config = Config::builder()
        .concurrency(1)
        .max_slices_per_write(4)
        .write_timeout(Duration::from_secs(1))
        .initial_backoff(Duration::from_millis(100))
        .build()
        .unwrap();
    let o = Outbox::new(sink.clone(), config).unwrap();
    stage(&o, t(1), [1]);
    stage(&o, t(2), [2]);
    let r = o.flush(Duration::from_millis(1_500)).await;
    assert!(r.deadline_passed);
    // S-F4: both slices timed out with their group.
    assert_eq!(o.counters().failed_attempts, 2);
    assert!(sink.stored(t(1)).is_empty());
    sink.0.lock().unwrap().hanging.clear();
    let r = o.settle(Duration::from_secs(10)).await;
    assert_eq!(r.pending, 0);
    assert_eq!(sink.stored(t(1)), [1]);
    assert_eq!(sink.stored(t(2)), [2]);
    assert!(o.counters().balanced());
}

#[tokio::test(start_paused = true)]
async fn a_sink_that_does_not_take_groups_writes_one_slice_per_call() {
    // S-F1: `takes_groups` is false by default: one `write` per slice,
    // each its own write, whatever `max_slices_per_write` says.
    #[derive(Clone, Default)]
    struct Plain(Arc<Mutex<Seen>>);
    impl Sink for Plain {
        type Tenant = TenantId;
        type Item = u32;
        fn name(&self) -> &str {
            "plain"
        }
        async fn write(&self, tenant: &TenantId, items: &[u32]) -> Result<Written, WriteError> {
            self.0.lock().unwrap().push((*tenant, items.to_vec()));
            Ok(Written::ALL)
        }
    }
    let sink = Plain::default();
    let config = Config::builder()
        .concurrency(1)
        .max_slices_per_write(3)
        .build()
        .unwrap();
    let o = Outbox::new(sink.clone(), config).unwrap();
    for n in 1..=3 {
        assert_eq!(o.stage(t(n), n as u32), Staged::Accepted);
    }
    assert_eq!(o.settle(Duration::from_secs(1)).await.pending, 0);
    assert_eq!(
        *sink.0.lock().unwrap(),
        [(t(1), vec![1]), (t(2), vec![2]), (t(3), vec![3])]
    );
}
