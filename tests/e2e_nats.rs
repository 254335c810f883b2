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

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use common::e2e::{self, tenants, total, PerTenant, World as _, DEADLINE};
use common::nats;
use common::proxy::{Mode, Proxy};
use common::recorder::Recorder;
use common::servers;
use common::sink::items;
use outbox::sinks::nats::NatsSink;
use outbox::sinks::Envelope;
use outbox::{Outbox, Report, TenantId};
use tokio::sync::Barrier;
use uuid::Uuid;

/// A lost ack fails the write after this.
const ACK_TIMEOUT: Duration = Duration::from_millis(250);
/// Cuts a hung write (S-B3), e.g. a publish the client cannot queue.
const WRITE_TIMEOUT: Duration = Duration::from_millis(500);
const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

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
    let (admin, proxy, client) = nats::connect(test).await?;
    let stream = servers::unique_name(test);
    let sink = NatsSink::new(client, &stream)
        .expect("valid prefix")
        .ack_timeout(ACK_TIMEOUT)
        .max_in_flight(max_in_flight);
    sink.create_stream(&stream, DUPLICATE_WINDOW)
        .await
        .expect("create the stream");
    let (outbox, metrics) = e2e::build(sink, max_batch, WRITE_TIMEOUT);
    Some(World {
        admin,
        proxy,
        outbox,
        metrics,
        stream,
    })
}

impl e2e::World for World {
    type Sink = NatsSink<Envelope>;
    /// The payload (unique per item).
    type Row = Vec<u8>;

    fn outbox(&self) -> &Outbox<Self::Sink> {
        &self.outbox
    }

    fn metrics(&self) -> &Recorder {
        &self.metrics
    }

    fn proxy(&self) -> &Proxy {
        &self.proxy
    }

    fn row(item: Envelope) -> Vec<u8> {
        item.payload
    }

    /// The whole stream, per tenant (from the subject) in stream order.
    async fn stored(&self) -> PerTenant<Vec<u8>> {
        let prefix = format!("{}.", self.stream);
        let mut out = PerTenant::new();
        for (subject, payload) in nats::messages(&self.admin, &self.stream).await {
            let tenant: Uuid = subject
                .strip_prefix(prefix.as_str())
                .and_then(|t| t.parse().ok())
                .unwrap_or_else(|| panic!("a subject of this stream: {subject}"));
            out.entry(TenantId::from_u128(tenant.as_u128()))
                .or_default()
                .push(payload);
        }
        out
    }
}

impl World {
    async fn delete(&self) {
        nats::delete_stream(&self.admin, &self.stream).await;
    }
}

fn sorted(mut p: PerTenant<Vec<u8>>) -> PerTenant<Vec<u8>> {
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
    let stagers = e2e::spawn_stagers(&w, &barrier, tenants(TENANTS), ROUNDS, PER_ROUND, 1);

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
    e2e::all_once_in_order(&*w, stagers, start, TENANTS, PER_ROUND * ROUNDS).await;
    w.delete().await;
}

/// Takes the server away: connections cut, new ones refused.
fn away(proxy: &Proxy) {
    proxy.set_mode(Mode::Refuse);
    proxy.cut_all();
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
    let (first, second) = e2e::written_then(&w, away).await;
    w.failures_above(0).await; // an attempt failed and is backing off
    e2e::lost_past_the_deadline(&w, &second).await;

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
    let (first, second) = e2e::written_then(&w, away).await;
    e2e::nothing_lost_when_back(&w, first, second).await;
    w.delete().await;
}
