//! A tiny in-memory lease table, heartbeat table and sink epoch table,
//! with the store's own clock: each operation runs atomically at the
//! instant it arrives, as one autocommit statement would. Private to
//! these tests; the full model of PostgreSQL lives with the store
//! interface.

use std::collections::BTreeMap;

use outbox::core::lease::{Epoch, Holder, InstanceId, Partition, Reply, StoreOp};
use outbox::core::Time;

use super::clock::Clock;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    pub owner: String,
    pub epoch: u64,
    /// On the store's clock, in nanoseconds.
    pub expiry: i128,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SinkRow {
    pub epoch: u64,
    pub holder: Holder,
}

#[derive(Clone, Debug, Default)]
pub struct Tables {
    pub leases: BTreeMap<Partition, Row>,
    pub members: BTreeMap<String, i128>,
}

#[derive(Clone, Debug)]
pub struct Store {
    /// The lease and heartbeat tables (a database failover may roll them
    /// back).
    pub tables: Tables,
    /// The sink's epoch table (the sink's own database: never rolled
    /// back).
    pub sink: BTreeMap<Partition, SinkRow>,
    pub clock: Clock,
    /// Whether a renewal also requires the lease not to have expired (S-L5
    /// allows either).
    pub renew_needs_live: bool,
}

fn ns(d: std::time::Duration) -> i128 {
    d.as_nanos() as i128
}

fn id(s: &str) -> InstanceId {
    InstanceId::new(s).unwrap()
}

impl Store {
    pub fn new() -> Store {
        Store {
            tables: Tables::default(),
            sink: BTreeMap::new(),
            clock: Clock::exact(),
            renew_needs_live: true,
        }
    }

    /// `clock_timestamp()` at real time `t`.
    pub fn now(&self, t: Time) -> i128 {
        self.clock.raw(t)
    }

    /// Whether the store, at real time `t`, takes `(p, owner, epoch)` for a
    /// live lease.
    pub fn live(&self, t: Time, p: Partition, owner: &str, epoch: Epoch) -> bool {
        let now = self.now(t);
        self.tables
            .leases
            .get(&p)
            .is_some_and(|r| r.owner == owner && r.epoch == epoch.0 && r.expiry > now)
    }

    pub fn run(&mut self, t: Time, op: &StoreOp) -> Reply {
        let now = self.now(t);
        let tables = &mut self.tables;
        match op {
            StoreOp::Heartbeat {
                instance,
                member_ttl,
            } => {
                tables
                    .members
                    .insert(instance.to_string(), now + ns(*member_ttl));
                let members = tables
                    .members
                    .iter()
                    .filter(|(_, &e)| e > now)
                    .map(|(m, _)| id(m))
                    .collect();
                let owners = tables
                    .leases
                    .iter()
                    .map(|(&p, r)| (p, id(&r.owner)))
                    .collect();
                Reply::Members { members, owners }
            }
            StoreOp::SinkEpochs { partitions } => Reply::SinkEpochs {
                epochs: partitions
                    .iter()
                    .filter_map(|p| self.sink.get(p).map(|r| (*p, Epoch(r.epoch))))
                    .collect(),
            },
            StoreOp::Acquire {
                instance,
                ttl,
                leases,
            } => {
                let mut granted = Vec::new();
                for &(p, floor) in leases {
                    let row = tables.leases.get(&p);
                    if row.is_some_and(|r| r.expiry > now) {
                        continue;
                    }
                    let epoch = row.map_or(0, |r| r.epoch).max(floor.0) + 1;
                    let row = Row {
                        owner: instance.to_string(),
                        epoch,
                        expiry: now + ns(*ttl),
                    };
                    tables.leases.insert(p, row);
                    granted.push((p, Epoch(epoch)));
                }
                Reply::Acquired { granted }
            }
            StoreOp::Renew {
                instance,
                ttl,
                leases,
            } => {
                let mut renewed = Vec::new();
                for &(p, e) in leases {
                    if let Some(r) = tables.leases.get_mut(&p) {
                        let live = r.expiry > now || !self.renew_needs_live;
                        if r.owner == instance.as_str() && r.epoch == e.0 && live {
                            r.expiry = now + ns(*ttl);
                            renewed.push(p);
                        }
                    }
                }
                Reply::Renewed { renewed }
            }
            StoreOp::Install {
                partition,
                epoch,
                holder,
            } => {
                let row = self.sink.entry(*partition).or_insert(SinkRow {
                    epoch: 0,
                    holder: holder.clone(),
                });
                if row.epoch < epoch.0 {
                    *row = SinkRow {
                        epoch: epoch.0,
                        holder: holder.clone(),
                    };
                }
                Reply::Installed {
                    epoch: Epoch(row.epoch),
                    ours: row.holder == *holder,
                }
            }
            StoreOp::Release { instance, leases } => {
                for &(p, e) in leases {
                    if let Some(r) = tables.leases.get_mut(&p) {
                        if r.owner == instance.as_str() && r.epoch == e.0 {
                            r.expiry = r.expiry.min(now);
                        }
                    }
                }
                Reply::Released
            }
            StoreOp::Leave { instance } => {
                tables.members.remove(instance.as_str());
                Reply::Left
            }
            other => panic!("the world does not know {other:?}"),
        }
    }
}
