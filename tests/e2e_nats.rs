//! End-to-end fault tests through the driver: an [`Outbox`] publishing into
//! a real NATS JetStream server through a fault-injecting proxy. Needs
//! `OUTBOX_TEST_NATS_URL` (skipped when unset, failing when set and
//! unreachable). Each test runs on real time, in about a second.
//!
//! Order across a reconnect needs `max_in_flight(1)` (see the sink's
//! "Order" docs: with pipelined publishes a reconnect in the middle of a
//! write can store a later item before an earlier one), so the tests that
//! check order use it; the cut-reply test runs the default pipelining and
//! checks one copy of each item.
#![cfg(feature = "nats")]

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use async_nats::ConnectOptions;
use common::proxy::{Mode, Proxy};
use common::recorder::Recorder;
use common::servers::{self, eventually};
use outbox::sinks::nats::NatsSink;
use outbox::sinks::Envelope;
use outbox::telemetry::names;
use outbox::{Config, LostReason, Outbox, Report, Staged, TenantId};
use tokio::sync::Barrier;
use uuid::Uuid;

const VAR: &str = "OUTBOX_TEST_NATS_URL";
/// Bounds every wait on the server or the outbox.
const DEADLINE: Duration = Duration::from_secs(10);
/// A lost ack fails the write after this.
const ACK_TIMEOUT: Duration = Duration::from_millis(250);
/// Cuts a hung write (S-B3), e.g. a publish the client cannot queue.
const WRITE_TIMEOUT: Duration = Duration::from_millis(500);
const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);
const CONCURRENCY: usize = 4;

/// One test's world: a direct JetStream context for checks, a proxy to the
/// server, an outbox whose sink's client goes through the proxy, its
/// metrics, the test's own stream (named like the subject prefix).
struct World {
    admin: jetstream::Context,
    proxy: Proxy,
    outbox: Outbox<NatsSink<Envelope>>,
    metrics: Recorder,
    stream: String,
}

async fn setup(test: &str, max_batch: usize, max_in_flight: usize) -> Option<World> {
    let url = servers::url(VAR, test)?;
    let admin = async_nats::connect(url.as_str())
        .await
        .unwrap_or_else(|e| panic!("{VAR}={url} is set but the server does not answer: {e}"));
    let admin = jetstream::new(admin);
    let proxy = Proxy::start(upstream_addr(&url).await).await;
    let client = ConnectOptions::new()
        .connection_timeout(Duration::from_millis(500))
        .reconnect_delay_callback(|_| Duration::from_millis(20))
        .connect(format!("nats://{}", proxy.addr()))
        .await
        .expect("connect through the proxy");
    let stream = servers::unique_name(test);
    let sink = NatsSink::new(client, &stream)
        .expect("valid prefix")
        .ack_timeout(ACK_TIMEOUT)
        .max_in_flight(max_in_flight);
    sink.create_stream(&stream, DUPLICATE_WINDOW)
        .await
        .expect("create the stream");

    let config = Config::builder()
        .concurrency(CONCURRENCY)
        .max_batch(max_batch)
        .initial_backoff(Duration::from_millis(10))
        .max_backoff(Duration::from_millis(80))
        .write_timeout(WRITE_TIMEOUT)
        .build()
        .expect("config");
    let metrics = Recorder::new();
    let outbox = metrics
        .install(|| Outbox::builder(sink).config(config).build())
        .expect("build the outbox");
    Some(World {
        admin,
        proxy,
        outbox,
        metrics,
        stream,
    })
}

async fn upstream_addr(url: &str) -> SocketAddr {
    let hostport = url
        .split("://")
        .last()
        .unwrap_or(url)
        .split(['/', ','])
        .next()
        .unwrap_or("127.0.0.1:4222");
    let hostport = hostport.rsplit('@').next().unwrap_or(hostport);
    let addr = tokio::net::lookup_host(hostport)
        .await
        .expect("resolve the NATS host")
        .find(|a| a.is_ipv4())
        .expect("an IPv4 address for the NATS host");
    addr
}

/// Per tenant, the payloads (unique per item) in staging order, or as
/// stored, in stream order.
type PerTenant = BTreeMap<TenantId, Vec<Vec<u8>>>;

impl World {
    /// The whole stream, per tenant (from the subject) in stream order.
    async fn stored(&self) -> PerTenant {
        let mut s = self.admin.get_stream(&self.stream).await.expect("stream");
        let last = s.info().await.expect("stream info").state.last_sequence;
        let prefix = format!("{}.", self.stream);
        let mut out = PerTenant::new();
        for seq in 1..=last {
            let m = s.get_raw_message(seq).await.expect("message");
            let tenant: Uuid = m
                .subject
                .strip_prefix(prefix.as_str())
                .and_then(|t| t.parse().ok())
                .unwrap_or_else(|| panic!("a subject of this stream: {}", m.subject));
            out.entry(TenantId::from_u128(tenant.as_u128()))
                .or_default()
                .push(m.payload.to_vec());
        }
        out
    }

    fn stage(&self, tenant: TenantId, items: &[Envelope], want: &mut PerTenant) {
        for item in items {
            assert_eq!(self.outbox.stage(tenant, item.clone()), Staged::Accepted);
            want.entry(tenant).or_default().push(item.payload.clone());
        }
    }

    /// Waits (bounded) until the outbox has counted more than `than`
    /// failed attempts.
    async fn failures_above(&self, than: u64) {
        eventually("a failed attempt", DEADLINE, || async {
            (self.outbox.counters().failed_attempts > than).then_some(())
        })
        .await;
    }

    fn lost_metric(&self, reason: LostReason) -> u64 {
        self.metrics.counter(
            names::EVENTS_LOST,
            self.outbox.name(),
            Some(reason.as_str()),
        )
    }

    fn pending_gauge(&self) -> f64 {
        self.metrics.gauge(names::PENDING, self.outbox.name())
    }

    async fn delete(&self) {
        self.admin
            .delete_stream(&self.stream)
            .await
            .expect("delete the stream");
    }
}

fn items(tag: &str, n: usize) -> Vec<Envelope> {
    (0..n)
        .map(|i| Envelope::new(format!("{tag}-{i}").into_bytes()))
        .collect()
}

fn tenants(n: usize) -> Vec<TenantId> {
    (0..n).map(|_| TenantId::new_v7()).collect()
}

fn dead_letters(unwritten: Vec<(TenantId, Vec<Envelope>)>) -> PerTenant {
    let mut out = PerTenant::new();
    for (tenant, run) in unwritten {
        out.entry(tenant)
            .or_default()
            .extend(run.into_iter().map(|e| e.payload));
    }
    out
}

fn total(p: &PerTenant) -> u64 {
    p.values().map(|v| v.len() as u64).sum()
}

fn sorted(mut p: PerTenant) -> PerTenant {
    for v in p.values_mut() {
        v.sort();
    }
    p
}

// (a) S-W5, I1 through the driver: the connection is cut on a publish ack
// (the server stored the message, the client never hears of it); the
// driver retries the identical slice and the message ids absorb the
// repeats: one copy of each item.
#[tokio::test]
async fn a_retry_after_a_cut_ack_leaves_one_copy() {
    let Some(w) = setup("e2e_nats_cut_ack", 16, 256).await else {
        return;
    };
    let ts = tenants(2);
    let mut want = PerTenant::new();

    let ack = format!("{{\"stream\":\"{}\"", w.stream);
    let cut = w.proxy.cut_reply_on(ack.as_bytes());
    for (n, &t) in ts.iter().enumerate() {
        w.stage(t, &items(&format!("t{n}"), 40), &mut want);
    }
    let report = w.outbox.flush(DEADLINE).await;
    cut.fired(DEADLINE).await;
    assert_eq!(
        report,
        Report {
            written: 80,
            ..Report::default()
        }
    );

    let stored = w.stored().await;
    assert_eq!(total(&stored), 80, "no repeat was stored");
    assert_eq!(sorted(stored), sorted(want), "one copy of each item");
    let c = w.outbox.counters();
    assert!(c.failed_attempts >= 1, "the cut attempt failed: {c:?}");
    assert!(c.attempts > c.writes, "and was retried: {c:?}");
    assert_eq!((c.written, c.pending, c.lost_total()), (80, 0, 0));
    let _ = w.outbox.shutdown(DEADLINE).await;
    w.delete().await;
}

// (b) S-W3, S-W5, I1, I4: several tenants stage concurrently from their own
// tasks while acks are cut, replies dropped, connections refused and
// stalled; every tenant's messages end up exactly once, in staging order.
#[tokio::test]
async fn order_per_tenant_holds_across_retries_with_concurrent_stagers() {
    const TENANTS: usize = 6;
    const PER_ROUND: usize = 25;
    const ROUNDS: usize = 4;
    let Some(w) = setup("e2e_nats_order", 16, 1).await else {
        return;
    };
    let w = Arc::new(w);
    let barrier = Arc::new(Barrier::new(TENANTS + 1));
    let stagers: Vec<_> = tenants(TENANTS)
        .into_iter()
        .enumerate()
        .map(|(n, tenant)| {
            let (w, barrier) = (Arc::clone(&w), Arc::clone(&barrier));
            tokio::spawn(async move {
                let mut want = PerTenant::new();
                for round in 0..ROUNDS {
                    barrier.wait().await; // the round's fault is armed
                    for item in items(&format!("t{n}-r{round}"), PER_ROUND) {
                        w.stage(tenant, &[item], &mut want);
                        tokio::task::yield_now().await;
                    }
                    barrier.wait().await; // the round is staged
                }
                want
            })
        })
        .collect();

    let start = Instant::now();
    for round in 0..ROUNDS {
        let failed = w.outbox.counters().failed_attempts;
        match round {
            0 => {
                let ack = format!("{{\"stream\":\"{}\"", w.stream);
                let cut = w.proxy.cut_reply_on(ack.as_bytes());
                barrier.wait().await;
                barrier.wait().await;
                cut.fired(DEADLINE).await;
            }
            1 => {
                w.proxy.set_mode(Mode::DropReplies);
                barrier.wait().await;
                barrier.wait().await;
                w.failures_above(failed).await;
                // Replies were dropped mid-stream: start a clean connection.
                w.proxy.set_mode(Mode::Pass);
                w.proxy.cut_all();
            }
            2 => {
                w.proxy.set_mode(Mode::Refuse);
                w.proxy.cut_all();
                barrier.wait().await;
                barrier.wait().await;
                w.failures_above(failed).await;
                w.proxy.set_mode(Mode::Pass);
            }
            _ => {
                w.proxy.set_mode(Mode::Stall);
                barrier.wait().await;
                barrier.wait().await;
                w.failures_above(failed).await;
                w.proxy.set_mode(Mode::Pass);
            }
        }
    }
    let mut want = PerTenant::new();
    for stager in stagers {
        want.extend(stager.await.expect("a stager"));
    }
    let report = w.outbox.flush(DEADLINE).await;
    eprintln!("faults and flush took {:?}", start.elapsed());
    assert_eq!(report.pending, 0, "{report:?}");

    let stored = w.stored().await;
    assert_eq!(stored.len(), TENANTS);
    assert_eq!(total(&stored), (TENANTS * PER_ROUND * ROUNDS) as u64);
    assert_eq!(stored, want, "per tenant: exactly once, in staging order");
    let c = w.outbox.counters();
    assert_eq!(c.written, total(&want));
    assert_eq!((c.pending, c.lost_total(), c.dropped_total()), (0, 0, 0));
    assert!(
        c.failed_attempts >= 4,
        "every round's fault failed a write: {c:?}"
    );
    let _ = w.outbox.shutdown(DEADLINE).await;
    w.delete().await;
}

/// Stages a first round and writes it, then takes the server away
/// (connections cut, new ones refused) and stages a second round, which no
/// attempt can write; returns both, per tenant.
async fn written_then_away(w: &World) -> (PerTenant, PerTenant) {
    let mut first = PerTenant::new();
    let mut second = PerTenant::new();
    let ts = tenants(3);
    for (n, &t) in ts.iter().enumerate() {
        w.stage(t, &items(&format!("t{n}-first"), 10), &mut first);
    }
    let report = w.outbox.flush(DEADLINE).await;
    assert_eq!(report.written, 30, "{report:?}");
    w.proxy.set_mode(Mode::Refuse);
    w.proxy.cut_all();
    for (n, &t) in ts.iter().enumerate() {
        w.stage(t, &items(&format!("t{n}-second"), 12), &mut second);
    }
    (first, second)
}

// (c) S-W9, S-B6, S-W14, S-W11: the server stays away past the shutdown
// deadline. Exactly the unwritten items are counted lost (report, counters,
// metrics) and handed back, per tenant in staging order; the stream holds
// exactly what was written before.
#[tokio::test]
async fn a_server_away_past_the_deadline_loses_exactly_the_unwritten_items() {
    let Some(w) = setup("e2e_nats_away", 5, 1).await else {
        return;
    };
    let (first, second) = written_then_away(&w).await;
    w.failures_above(0).await; // an attempt failed and is backing off

    let deadline = Duration::from_millis(700);
    let start = Instant::now();
    let shutdown = w.outbox.shutdown(deadline);
    let late = TenantId::new_v7();
    assert_eq!(
        w.outbox.stage(late, Envelope::new(b"late".to_vec())),
        Staged::Refused
    );
    let sd = shutdown.await;
    let took = start.elapsed();
    assert!(
        took >= deadline && took < deadline + Duration::from_secs(2),
        "{took:?}"
    );

    let lost = total(&second);
    assert_eq!(lost, 36);
    assert!(sd.first);
    assert_eq!(
        sd.report,
        Report {
            written: 0,
            dropped: 0,
            lost,
            pending: 0,
            deadline_passed: true,
        }
    );
    assert_eq!(
        dead_letters(sd.unwritten),
        second,
        "the dead letters are exactly the unwritten items, per tenant in order"
    );

    let c = w.outbox.counters();
    assert_eq!(c.lost_for(LostReason::Deadline), lost);
    assert_eq!(c.lost_for(LostReason::Shutdown), 1);
    assert_eq!(c.lost_total(), lost + 1);
    assert_eq!((c.written, c.pending, c.staged), (30, 0, 30 + lost + 1));
    assert!(c.balanced(), "{c:?}");
    assert_eq!(w.outbox.pending(), 0);
    assert_eq!(w.lost_metric(LostReason::Deadline), lost);
    assert_eq!(w.lost_metric(LostReason::Shutdown), 1);
    assert_eq!(
        w.metrics
            .counter(names::ITEMS_WRITTEN, w.outbox.name(), None),
        30
    );
    assert_eq!(w.pending_gauge(), 0.0);

    // Still away: nothing of the second round reached the stream.
    assert_eq!(w.stored().await, first);
    w.delete().await;
}

// (d) S-W9: the server is away when the shutdown starts and returns before
// its deadline: the drain retries through it and nothing is lost.
#[tokio::test]
async fn a_server_back_before_the_deadline_loses_nothing() {
    let Some(w) = setup("e2e_nats_back", 5, 1).await else {
        return;
    };
    let (first, second) = written_then_away(&w).await;

    let start = Instant::now();
    let shutdown = w.outbox.shutdown(DEADLINE);
    let failed = w.outbox.counters().failed_attempts;
    w.failures_above(failed).await; // the drain is failing: still away
    w.proxy.set_mode(Mode::Pass);
    let sd = shutdown.await;
    eprintln!("shutdown took {:?}", start.elapsed());

    assert_eq!(
        sd.report,
        Report {
            written: total(&second),
            ..Report::default()
        }
    );
    assert!(sd.unwritten.is_empty());
    let c = w.outbox.counters();
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
    w.delete().await;
}
