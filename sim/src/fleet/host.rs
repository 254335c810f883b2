//! One application host of the fleet: the real driver (`outbox::Outbox`
//! with the outbox table's relay and lease tasks) over its link to the
//! store, its sink, and its stagers, who commit and roll back
//! transactions, some long. A restart (turmoil's bounce) runs this again
//! under the next incarnation.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use outbox::codec::{Codec, Postcard};
use outbox::core::lease::{LeaseConfig, LeaseConfigBuilder};
use outbox::table::model::{Model, SessionId};
use outbox::table::{partition_of, TableRelay};
use outbox::{Config, Outbox};
use rand::Rng;

use super::book::{self, Fate, SharedBook, StagedRow};
use super::link::{LinkStore, SharedLinks};
use super::sink::FleetSink;
use super::Setup;
use crate::draw::{self, SimRng};

/// What a host needs to (re)start.
#[derive(Clone)]
pub struct HostPlan {
    /// Its index.
    pub host: usize,
    /// The world's setup.
    pub setup: Setup,
    /// The store's database.
    pub model: Model,
    /// Every host's links.
    pub links: SharedLinks,
    /// The book.
    pub book: SharedBook,
    /// Starts so far (the incarnation of the next).
    pub starts: Arc<AtomicU64>,
}

/// The instance name of host `host`.
pub fn instance(host: usize) -> String {
    format!("h{host}")
}

/// The lease settings of `setup` for a host's `incarnation`.
fn settings(b: LeaseConfigBuilder, s: &Setup, incarnation: u64) -> LeaseConfigBuilder {
    b.incarnation(incarnation)
        .lease_ttl(s.ttl)
        .renew_every(s.renew)
        .max_clock_drift(s.drift)
        .acquire_poll(s.acquire_poll)
        .heartbeat_every(s.heartbeat)
        .rejoin_grace(s.grace)
}

/// The lease settings of host `host` (for the world's check that the
/// policy takes them).
pub fn lease_config(s: &Setup, host: usize, incarnation: u64) -> LeaseConfigBuilder {
    settings(
        LeaseConfig::builder(instance(host)).partitions(s.partitions),
        s,
        incarnation,
    )
}

/// Runs the host until it is crashed or the simulation ends: from its
/// join on, and until it leaves (a graceful shutdown, for good).
pub async fn run(plan: HostPlan) -> turmoil::Result {
    let join_at = plan
        .setup
        .join_at
        .get(plan.host)
        .copied()
        .unwrap_or_default();
    let now = plan.model.now();
    if join_at > now {
        tokio::time::sleep(join_at - now).await;
    }
    if plan.setup.has_left(plan.host, plan.model.now()) {
        // Gone for good: a restart after the leave runs nothing.
        return idle().await;
    }
    let incarnation = plan.starts.fetch_add(1, Ordering::Relaxed);
    if join_at > Duration::ZERO && incarnation == 0 {
        let mut b = book::lock(&plan.book);
        b.count("join");
        b.note("join", plan.host as u64, 0, 0);
    }
    let s = plan.setup.clone();
    let link = LinkStore::new(
        plan.host,
        plan.model.store(),
        Arc::clone(&plan.links),
        Arc::clone(&plan.book),
    );
    let sink = FleetSink {
        host: plan.host,
        instance: instance(plan.host),
        link: link.to_datastore(),
        model: plan.model.clone(),
        book: Arc::clone(&plan.book),
        partitions: plan.setup.partitions,
        repeat_window: plan.setup.repeat_window,
        ttl: plan.setup.ttl,
    };
    let mut relay = TableRelay::<u64, u64>::new(instance(plan.host))
        .poll_interval(if super::canary::on("notify_only") {
            Duration::from_secs(3600)
        } else {
            s.poll
        })
        .lease(move |b| settings(b, &s, incarnation));
    if super::canary::on("id_above_last_seen") {
        relay = relay.planted_id_above_last_seen();
    }
    let skew = plan.setup.skews.get(plan.host).cloned().unwrap_or_default();
    if !skew.is_none() {
        // The lease clock starts with the gate, at this start (S-FW9).
        let base = plan.model.now();
        relay = relay.lease_clock(move |e| skew.at(base + e).saturating_sub(skew.at(base)));
    }
    let config = Config::builder()
        .write_timeout(plan.setup.write_timeout)
        .build()
        .map_err(|e| e.to_string())?;
    let outbox = Outbox::builder(sink)
        .config(config)
        .table(link, relay)
        .build()
        .map_err(|e| e.to_string())?;
    for stager in 0..plan.setup.stagers {
        let seed = plan.setup.seed ^ (plan.host as u64) << 40 ^ incarnation << 20 ^ stager;
        let stager = Stager {
            rng: draw::rng(seed),
            plan: plan.clone(),
        };
        drop(tokio::spawn(stager.run()));
    }
    if let Some((_, at)) = plan.setup.leave.filter(|l| l.0 == plan.host) {
        tokio::time::sleep(at.saturating_sub(plan.model.now())).await;
        {
            let mut b = book::lock(&plan.book);
            b.count("leave");
            b.note("leave", plan.host as u64, 0, 0);
        }
        let report = outbox.shutdown(plan.setup.ttl).await;
        drop(report);
        drop(outbox);
        return idle().await;
    }
    idle().await
}

/// Waits for ever (the host's process stays, doing nothing more).
async fn idle() -> turmoil::Result {
    loop {
        tokio::time::sleep(Duration::from_secs(3600)).await;
    }
}

/// One stager: transactions of one to three rows of a drawn tenant.
struct Stager {
    rng: SimRng,
    plan: HostPlan,
}

/// A stager's open transaction (its key in the book's `open`): rolled
/// back if dropped while still open there.
struct OpenTx {
    model: Model,
    book: SharedBook,
    session: SessionId,
    key: u64,
}

impl Drop for OpenTx {
    fn drop(&mut self) {
        let mut b = book::lock(&self.book);
        if b.open.contains_key(&self.key) {
            self.model.rollback(self.session);
            b.end_tx(self.key, false);
        }
    }
}

impl Stager {
    async fn run(mut self) {
        let s = self.plan.setup.clone();
        loop {
            let gap = draw::gap(&mut self.rng, s.stage_gap);
            tokio::time::sleep(gap).await;
            let now = self.plan.model.now();
            if now >= s.phase || s.has_left(self.plan.host, now) {
                return;
            }
            self.held().await;
            self.transaction().await;
        }
    }

    /// Waits while the host is paused.
    async fn held(&self) {
        loop {
            let now = self.plan.model.now();
            let paused = self
                .plan
                .links
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .stagers_wait(self.plan.host, now);
            if !paused {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn transaction(&mut self) {
        let model = self.plan.model.clone();
        let tenant = self.rng.random_range(0..self.plan.setup.tenants);
        let session = model.begin();
        let key = {
            let mut b = book::lock(&self.plan.book);
            let key = b.next_seq();
            b.open.insert(key, (self.plan.host, session, Vec::new()));
            key
        };
        let tx = OpenTx {
            model: model.clone(),
            book: Arc::clone(&self.plan.book),
            session,
            key,
        };
        let mut tenant_bytes = Vec::new();
        let _ = Codec::<u64, u64>::encode_tenant(&Postcard, &tenant, &mut tenant_bytes);
        let partition = partition_of(&tenant_bytes, self.plan.setup.partitions);
        let poison_per_mille = self.plan.setup.poison_per_mille;
        for _ in 0..self.rng.random_range(1..=3u32) {
            let poison = draw::chance(&mut self.rng, poison_per_mille, 1000);
            let item = book::lock(&self.plan.book).next_seq();
            let mut item_bytes = Vec::new();
            let _ = Codec::<u64, u64>::encode_item(&Postcard, &item, &mut item_bytes);
            let Ok(id) = model.stage(session, &tenant_bytes, &item_bytes, 0, true) else {
                return;
            };
            let mut b = book::lock(&self.plan.book);
            if let Some(open) = b.open.get_mut(&key) {
                open.2.push(id);
            }
            b.rows.insert(
                id,
                StagedRow {
                    tenant,
                    partition,
                    poison,
                    begin: key,
                    commit: 0,
                    fate: Fate::Open,
                },
            );
        }
        if draw::chance(&mut self.rng, 1, 10) {
            let long = Duration::from_millis(self.rng.random_range(200..3_000));
            tokio::time::sleep(long).await;
        }
        self.held().await;
        let mut b = book::lock(&self.plan.book);
        if draw::chance(&mut self.rng, 1, 5) {
            model.rollback(session);
            b.end_tx(key, false);
        } else {
            let committed = model.commit(session).unwrap_or(false);
            b.end_tx(key, committed);
        }
        drop(b);
        drop(tx);
    }
}
