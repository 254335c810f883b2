//! The lease task (S-T30): runs the sans-IO lease policy
//! ([`LeasePolicy`]) against the outbox table's [`Store`] and publishes
//! the partitions this instance may relay, with their epochs. IO only:
//! every decision is the policy's. Ownership is the lease table, never
//! row locks, so even one intended relay is one relay at a time: a second
//! instance on the same table (a rolling deploy) gets only what the plan
//! gives it, and nothing while the first holds everything.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::gate::Gate;

use crate::core::lease::{
    Departure, Epoch, InstanceId, LeaseEvent, LeasePolicy, Partition, Reply, Request, RequestId,
    StoreError as LeaseError, StoreOp,
};
use crate::core::relay::{StoreError, StoreErrorKind};
use crate::core::Time;
use crate::table::{Acquire, Acquired, Installed, LeaseKey, Store};

/// The partitions this instance may relay, with the epoch each is held
/// under: published by the lease task, read by the relay task.
pub(crate) type Owned = BTreeMap<u32, u64>;

/// What the relay tells the lease task: a fenced call found this
/// partition's lease taken under this epoch (S-T11).
pub(crate) type Stale = (u32, u64);

/// The lease task's state: the policy (in the gate the writer asks
/// before each write, S-T37) and the store it runs against.
pub(crate) struct LeaseTask<St: Store> {
    store: Arc<St>,
    gate: Arc<Gate>,
    owned: watch::Sender<Owned>,
    stale: mpsc::UnboundedReceiver<Stale>,
    closing: watch::Receiver<bool>,
}

impl<St: Store> LeaseTask<St> {
    /// A task running `policy` against `store`, installed in `gate` (its
    /// clock starts at the gate's making); it publishes into `owned`,
    /// takes stale partitions from `stale`, and shuts down (releasing its
    /// leases, S-L28) once `closing` turns `true` or its sender is gone.
    pub(crate) fn new(
        store: Arc<St>,
        gate: Arc<Gate>,
        policy: LeasePolicy,
        owned: watch::Sender<Owned>,
        stale: mpsc::UnboundedReceiver<Stale>,
        closing: watch::Receiver<bool>,
    ) -> Self {
        gate.install(policy);
        LeaseTask {
            store,
            gate,
            owned,
            stale,
            closing,
        }
    }

    /// Runs `f` on the policy (installed at `new`).
    fn policy<R: Default>(&self, f: impl FnOnce(&mut LeasePolicy, Time) -> R) -> R {
        self.gate.with(f).unwrap_or_default()
    }

    /// Runs until the policy has shut down; then nothing is owned.
    pub(crate) async fn run(mut self) {
        let mut calls: JoinSet<(RequestId, Result<Reply, LeaseError>)> = JoinSet::new();
        let mut closing = *self.closing.borrow();
        if closing {
            self.policy(|p, now| p.shutdown(now, Departure::Rejoin));
        }
        loop {
            self.drain(&mut calls);
            if self.gate.with(|p, _| p.is_shut_down()).unwrap_or(true) {
                break;
            }
            let wake = self
                .policy(|p, _| p.poll_timeout())
                .map(|t| self.gate.instant(t));
            tokio::select! {
                biased;
                Some(joined) = calls.join_next() => {
                    let (id, result) = joined.unwrap_or((RequestId(u64::MAX), Err(LeaseError::Unknown)));
                    // A reply the policy no longer waits for changes nothing (S-L10).
                    self.policy(|p, now| drop(p.handle_reply(now, id, result)));
                }
                changed = self.closing.changed(), if !closing => {
                    if changed.is_err() || *self.closing.borrow() {
                        closing = true;
                        self.policy(|p, now| p.shutdown(now, Departure::Rejoin));
                    }
                }
                Some((partition, epoch)) = self.stale.recv() => {
                    self.policy(|p, now| p.handle_stale_epoch(now, Partition(partition), Epoch(epoch)));
                }
                // The writer ended a write or met a stale epoch (S-T37).
                () = self.gate.changed.notified() => {}
                () = sleep_until(wake) => self.policy(|p, now| p.handle_timeout(now)),
            }
        }
        self.owned.send_replace(Owned::new());
    }

    /// Sends every request due and publishes every event (the policy's
    /// output order, S-L2).
    fn drain(&mut self, calls: &mut JoinSet<(RequestId, Result<Reply, LeaseError>)>) {
        let (requests, events) = self.policy(|p, now| {
            let requests: Vec<Request> = std::iter::from_fn(|| p.poll_request(now)).collect();
            let events: Vec<LeaseEvent> = std::iter::from_fn(|| p.poll_event()).collect();
            (requests, events)
        });
        for Request { id, op } in requests {
            let store = Arc::clone(&self.store);
            calls.spawn(async move { (id, run(&*store, op).await) });
        }
        for event in events {
            self.owned.send_modify(|owned| match event {
                LeaseEvent::Writable { partition, epoch } => {
                    owned.insert(partition.0, epoch.0);
                }
                LeaseEvent::Stopped { partition, .. } | LeaseEvent::Released { partition, .. } => {
                    owned.remove(&partition.0);
                }
            });
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A store error as the lease policy counts it: unknown outcome or none.
fn lease_error(e: &StoreError) -> LeaseError {
    match e.kind() {
        StoreErrorKind::Unknown => LeaseError::Unknown,
        _ => LeaseError::Failed,
    }
}

/// Runs one of the policy's operations as the store's calls (the table in
/// `core::lease`'s docs).
async fn run<St: Store>(store: &St, op: StoreOp) -> Result<Reply, LeaseError> {
    if let StoreOp::Acquire {
        instance,
        ttl,
        leases,
    } = &op
    {
        return acquire(store, instance, *ttl, leases).await;
    }
    statement(store, op).await.map_err(|e| lease_error(&e))
}

/// Every operation but the acquire.
async fn statement<St: Store>(store: &St, op: StoreOp) -> Result<Reply, StoreError> {
    match op {
        StoreOp::Heartbeat {
            instance,
            member_ttl,
        } => heartbeat(store, &instance, member_ttl).await,
        StoreOp::SinkEpochs { partitions } => {
            let epochs = store.sink_epochs().await?;
            let epochs = epochs
                .into_iter()
                .filter(|e| partitions.contains(&Partition(e.partition)))
                .map(|e| (Partition(e.partition), Epoch(e.epoch)))
                .collect();
            Ok(Reply::SinkEpochs { epochs })
        }
        StoreOp::Renew {
            instance,
            ttl,
            leases,
        } => {
            let mut renewed = Vec::new();
            for (partition, epoch) in leases {
                if store.renew(&key(&instance, partition, epoch), ttl).await? {
                    renewed.push(partition);
                }
            }
            Ok(Reply::Renewed { renewed })
        }
        StoreOp::Install {
            partition,
            epoch,
            holder,
        } => Ok(
            match store.install_epoch(partition.0, epoch.0, &holder).await? {
                Installed::Installed => Reply::Installed { epoch, ours: true },
                Installed::Superseded { current } => Reply::Installed {
                    epoch: Epoch(current),
                    ours: false,
                },
            },
        ),
        StoreOp::Release { instance, leases } => {
            for (partition, epoch) in leases {
                store.release(&key(&instance, partition, epoch)).await?;
            }
            Ok(Reply::Released)
        }
        StoreOp::Leave { instance } => {
            store.leave(instance.as_str()).await?;
            Ok(Reply::Left)
        }
        _ => Err(StoreError::new(
            StoreErrorKind::Refused,
            None,
            "an operation this driver does not know",
        )),
    }
}

fn key(instance: &InstanceId, partition: Partition, epoch: Epoch) -> LeaseKey {
    LeaseKey {
        partition: partition.0,
        owner: instance.as_str().to_owned(),
        epoch: epoch.0,
    }
}

async fn heartbeat<St: Store>(
    store: &St,
    instance: &InstanceId,
    ttl: std::time::Duration,
) -> Result<Reply, StoreError> {
    store.heartbeat(instance.as_str(), ttl).await?;
    let members = store
        .members()
        .await?
        .into_iter()
        .filter(|m| !m.expires_in.is_zero())
        .filter_map(|m| InstanceId::new(m.instance).ok())
        .collect();
    let owners = store
        .leases()
        .await?
        .into_iter()
        .filter_map(|row| {
            let owner = InstanceId::new(row.owner?).ok()?;
            Some((Partition(row.partition), owner))
        })
        .collect();
    Ok(Reply::Members { members, owners })
}

async fn acquire<St: Store>(
    store: &St,
    instance: &InstanceId,
    ttl: std::time::Duration,
    leases: &[(Partition, Epoch)],
) -> Result<Reply, LeaseError> {
    let mut granted = Vec::new();
    for &(partition, floor) in leases {
        let request = Acquire {
            partition: partition.0,
            owner: instance.as_str().to_owned(),
            above: floor.0,
            ttl,
        };
        match store.acquire(&request).await {
            Ok(Acquired::Taken { epoch }) => granted.push((partition, Epoch(epoch))),
            Ok(Acquired::Held { .. }) => {}
            // Leases taken before the failure are held unknown to the
            // policy: it lets them expire (S-L10).
            Err(_) if !granted.is_empty() => return Err(LeaseError::Unknown),
            Err(e) => return Err(lease_error(&e)),
        }
    }
    Ok(Reply::Acquired { granted })
}

#[cfg(all(test, feature = "testkit"))]
mod tests {
    use super::*;
    use crate::core::lease::LeaseConfig;
    use crate::table::model::{Model, ModelConfig};

    /// S-T30: alone on the table, the task owns every partition under an
    /// epoch, publishes them, and at its stop releases them and publishes
    /// nothing owned.
    #[tokio::test(start_paused = true)]
    async fn the_lease_task_owns_publishes_and_releases() {
        let model = Model::new(ModelConfig {
            partitions: 4,
            ..ModelConfig::default()
        });
        let store = Arc::new(model.store());
        let config = LeaseConfig::builder("a").partitions(4).build().unwrap();
        let (owned_tx, mut owned) = watch::channel(Owned::new());
        let (_stale, stale_rx) = mpsc::unbounded_channel();
        let (stop, stop_rx) = watch::channel(false);
        let policy = LeasePolicy::new(config, Time::ZERO);
        let gate = Arc::new(Gate::new(None));
        let task = tokio::spawn(
            LeaseTask::new(
                Arc::clone(&store),
                gate,
                policy,
                owned_tx,
                stale_rx,
                stop_rx,
            )
            .run(),
        );
        while owned.borrow_and_update().len() < 4 {
            owned.changed().await.unwrap();
        }
        assert!(owned.borrow().values().all(|&e| e >= 1));
        let rows = store.leases().await.unwrap();
        assert!(rows.iter().all(|r| r.owner.as_deref() == Some("a")));
        drop(stop);
        task.await.unwrap();
        assert!(owned.borrow().is_empty());
        let rows = store.leases().await.unwrap();
        assert!(rows.iter().all(|r| r.expires_in.is_zero()), "{rows:?}");
    }
}
