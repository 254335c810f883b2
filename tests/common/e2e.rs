//! What the end-to-end tests share: an [`Outbox`] over a real server through
//! a fault-injecting [`Proxy`], seen through the [`World`] of a test, and
//! the checks that do not depend on the server.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox::sinks::Envelope;
use outbox::telemetry::names;
use outbox::{Config, LostReason, Outbox, Report, Sink, Staged, TenantId};
use tokio::sync::Barrier;
use tokio::task::JoinHandle;

use super::proxy::{Mode, Proxy};
use super::recorder::Recorder;
use super::servers::eventually;
use super::sink::items;

/// Bounds every wait on the server or the outbox: a test that needs it
/// has failed.
pub const DEADLINE: Duration = Duration::from_secs(10);
pub const CONCURRENCY: usize = 4;

/// Per tenant, what the server keeps of the items, in staging order (or as
/// stored, in the server's order).
pub type PerTenant<T> = BTreeMap<TenantId, Vec<T>>;

/// An outbox over `sink` (with short backoffs, slices of up to
/// `max_batch`, writes cut after `write_timeout`) and its metrics.
pub fn build<S: Sink>(sink: S, max_batch: usize, write_timeout: Duration) -> (Outbox<S>, Recorder) {
    let config = Config::builder()
        .concurrency(CONCURRENCY)
        .max_batch(max_batch)
        .initial_backoff(Duration::from_millis(10))
        .max_backoff(Duration::from_millis(80))
        .write_timeout(write_timeout)
        .build()
        .expect("config");
    let metrics = Recorder::new();
    let outbox = metrics
        .install(|| Outbox::builder(sink).config(config).build())
        .expect("build the outbox");
    (outbox, metrics)
}

/// One test's world: an outbox, its metrics, the proxy its sink goes
/// through, and what the server stores.
#[allow(async_fn_in_trait)]
pub trait World {
    type Sink: Sink<Tenant = TenantId, Item = Envelope>;
    /// What the server keeps of an item, compared by the tests.
    type Row: Clone + PartialEq + Debug + Send + 'static;

    fn outbox(&self) -> &Outbox<Self::Sink>;
    fn metrics(&self) -> &Recorder;
    fn proxy(&self) -> &Proxy;
    fn row(item: Envelope) -> Self::Row;
    /// Everything the server stores, per tenant in the server's order.
    async fn stored(&self) -> PerTenant<Self::Row>;

    /// Stages `items` (each accepted) and adds them to `want`.
    fn stage(&self, tenant: TenantId, items: &[Envelope], want: &mut PerTenant<Self::Row>) {
        for item in items {
            assert_eq!(self.outbox().stage(tenant, item.clone()), Staged::Accepted);
            want.entry(tenant)
                .or_default()
                .push(Self::row(item.clone()));
        }
    }

    /// The dead letters of a shutdown, per tenant: its runs concatenated in
    /// the order given (an in-flight slice, then the backlog).
    fn dead_letters(unwritten: Vec<(TenantId, Vec<Envelope>)>) -> PerTenant<Self::Row> {
        let mut out = PerTenant::new();
        for (tenant, run) in unwritten {
            out.entry(tenant)
                .or_default()
                .extend(run.into_iter().map(Self::row));
        }
        out
    }

    /// Waits (bounded) until the outbox has counted more than `than`
    /// failed attempts.
    async fn failures_above(&self, than: u64) {
        eventually("a failed attempt", DEADLINE, || async {
            (self.outbox().counters().failed_attempts > than).then_some(())
        })
        .await;
    }

    fn lost_metric(&self, reason: LostReason) -> u64 {
        self.metrics().counter(
            names::EVENTS_LOST,
            self.outbox().name(),
            Some(reason.as_str()),
        )
    }

    fn pending_gauge(&self) -> f64 {
        self.metrics().gauge(names::PENDING, self.outbox().name())
    }
}

pub fn tenants(n: usize) -> Vec<TenantId> {
    (0..n).map(|_| TenantId::new_v7()).collect()
}

pub fn total<T>(p: &PerTenant<T>) -> u64 {
    p.values().map(|v| v.len() as u64).sum()
}

/// Spawns a stager per tenant of `tenants` that stages `rounds` rounds of
/// `per_round` items, in bursts of `burst` with a yield after each, and
/// waits on `barrier` before each round (its fault is armed) and after it
/// (it is staged); each returns what it staged.
pub fn spawn_stagers<W: World + Send + Sync + 'static>(
    w: &Arc<W>,
    barrier: &Arc<Barrier>,
    tenants: Vec<TenantId>,
    rounds: usize,
    per_round: usize,
    burst: usize,
) -> Vec<JoinHandle<PerTenant<W::Row>>> {
    tenants
        .into_iter()
        .enumerate()
        .map(|(n, tenant)| {
            let (w, barrier) = (Arc::clone(w), Arc::clone(barrier));
            tokio::spawn(async move {
                let mut want = PerTenant::new();
                for round in 0..rounds {
                    barrier.wait().await; // the round's fault is armed
                    for burst in items(&format!("t{n}-r{round}"), per_round).chunks(burst) {
                        w.stage(tenant, burst, &mut want);
                        tokio::task::yield_now().await;
                    }
                    barrier.wait().await; // the round is staged
                }
                want
            })
        })
        .collect()
}

/// The end of the concurrent-stagers test: collects what the `stagers`
/// staged, flushes, and checks that the server stores each of the
/// `tenants` × `per_tenant` items exactly once, per tenant in staging
/// order, and that every one of the 4 rounds' faults failed a write.
pub async fn all_once_in_order<W: World>(
    w: &W,
    stagers: Vec<JoinHandle<PerTenant<W::Row>>>,
    start: Instant,
    tenants: usize,
    per_tenant: usize,
) {
    let mut want = PerTenant::new();
    for stager in stagers {
        want.extend(stager.await.expect("a stager"));
    }
    let report = w.outbox().flush(DEADLINE).await;
    eprintln!("faults and flush took {:?}", start.elapsed());
    assert_eq!(report.pending, 0, "{report:?}");

    let stored = w.stored().await;
    assert_eq!(stored.len(), tenants);
    assert_eq!(total(&stored), (tenants * per_tenant) as u64);
    assert_eq!(stored, want, "per tenant: exactly once, in staging order");
    let c = w.outbox().counters();
    assert_eq!(c.written, total(&want));
    assert_eq!((c.pending, c.lost_total(), c.dropped_total()), (0, 0, 0));
    assert!(
        c.failed_attempts >= 4,
        "every round's fault failed a write: {c:?}"
    );
    let _ = w.outbox().shutdown(DEADLINE).await;
}

/// Stages a first round and writes it, then takes the server `away` and
/// stages a second round, which no attempt can write; returns both, per
/// tenant.
pub async fn written_then<W: World>(
    w: &W,
    away: impl FnOnce(&Proxy),
) -> (PerTenant<W::Row>, PerTenant<W::Row>) {
    let mut first = PerTenant::new();
    let mut second = PerTenant::new();
    let ts = tenants(3);
    for (n, &t) in ts.iter().enumerate() {
        w.stage(t, &items(&format!("t{n}-first"), 10), &mut first);
    }
    let report = w.outbox().flush(DEADLINE).await;
    assert_eq!(report.written, 30, "{report:?}");
    away(w.proxy());
    for (n, &t) in ts.iter().enumerate() {
        w.stage(t, &items(&format!("t{n}-second"), 12), &mut second);
    }
    (first, second)
}

/// With the server away (after [`written_then`]) past a shutdown's
/// deadline: exactly the unwritten `second` round is counted lost (report,
/// counters, metrics) and handed back, per tenant in staging order; an item
/// staged after the fence is refused and lost under `shutdown`.
pub async fn lost_past_the_deadline<W: World>(w: &W, second: &PerTenant<W::Row>) {
    let deadline = Duration::from_millis(700);
    let start = Instant::now();
    let shutdown = w.outbox().shutdown(deadline);
    // After the fence: refused, lost under `shutdown`, not a dead letter.
    let late = TenantId::new_v7();
    assert_eq!(
        w.outbox().stage(late, Envelope::new(b"late".to_vec())),
        Staged::ShuttingDown
    );
    let sd = shutdown.await;
    let took = start.elapsed();
    assert!(
        took >= deadline && took < deadline + Duration::from_secs(2),
        "{took:?}"
    );

    let lost = total(second);
    assert_eq!(lost, 36);
    assert!(sd.first);
    assert_eq!(
        sd.report(),
        Report {
            written: 0,
            dropped: 0,
            lost,
            handed_over: 0,
            pending: 0,
            deadline_passed: true,
        }
    );
    assert_eq!(
        W::dead_letters(sd.unwritten.into_iter().map(|r| r.into_parts()).collect()),
        *second,
        "the dead letters are exactly the unwritten items, per tenant in order"
    );

    let c = w.outbox().counters();
    assert_eq!(c.lost(LostReason::Deadline), lost);
    assert_eq!(c.lost(LostReason::Shutdown), 1);
    assert_eq!(c.lost_total(), lost + 1);
    assert_eq!((c.written, c.pending, c.staged), (30, 0, 30 + lost + 1));
    assert!(c.balanced(), "{c:?}");
    assert_eq!(w.outbox().pending(), 0);
    assert_eq!(w.lost_metric(LostReason::Deadline), lost);
    assert_eq!(w.lost_metric(LostReason::Shutdown), 1);
    assert_eq!(
        w.metrics()
            .counter(names::ITEMS_WRITTEN, w.outbox().name(), None),
        30
    );
    assert_eq!(w.pending_gauge(), 0.0);
}

/// With the server away (after [`written_then`]) when a shutdown starts
/// and back before its deadline: the drain retries through it, nothing is
/// lost, and the server stores both rounds once, per tenant in staging
/// order.
pub async fn nothing_lost_when_back<W: World>(
    w: &W,
    first: PerTenant<W::Row>,
    second: PerTenant<W::Row>,
) {
    let start = Instant::now();
    let shutdown = w.outbox().shutdown(DEADLINE);
    let failed = w.outbox().counters().failed_attempts;
    w.failures_above(failed).await; // the drain is failing: still away
    w.proxy().set_mode(Mode::Pass);
    let sd = shutdown.await;
    eprintln!("shutdown took {:?}", start.elapsed());

    assert_eq!(
        sd.report(),
        Report {
            written: total(&second),
            ..Report::default()
        }
    );
    assert!(sd.unwritten.is_empty());
    let c = w.outbox().counters();
    assert_eq!((c.written, c.pending, c.lost_total()), (66, 0, 0));
    for reason in LostReason::ALL {
        assert_eq!(w.lost_metric(reason), 0, "{reason}");
    }
    assert_eq!(w.pending_gauge(), 0.0);

    let mut want = first;
    for (t, rows) in second {
        want.entry(t).or_default().extend(rows);
    }
    assert_eq!(w.stored().await, want, "all, once, in staging order");
}
