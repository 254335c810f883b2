//! Per-tenant bookkeeping: the rows delivered and not yet removed, in
//! delivery order, and why a tenant is held back from the partition's
//! flow.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::types::{DeadLetterRow, Position};

/// How a delivered row ended, as far as the relay cares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Ended {
    /// Written: delete it.
    Written,
    /// Given up: move it to the dead-letter table.
    Dead(DeadLetterRow),
}

/// One row of a tenant the relay holds: delivered (or bound for the
/// dead-letter table without delivery), not yet removed.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) id: i64,
    pub(crate) ended: Option<Ended>,
}

/// Why a tenant's rows are skipped by its partition's reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Why {
    /// It holds its share of the read-ahead (S-T9): caught up by tenant
    /// reads when room frees.
    Saturated,
    /// Its next row has a codec version this relay does not know (S-T19):
    /// left in the table for an instance that does.
    UnknownVersion(u32),
    /// A suspect of a crash is waiting for its retry (S-T18): this
    /// tenant's rows (its, or another suspect's and those after it) wait
    /// in the table until that suspect ends, then catch up as a saturated
    /// tenant's do.
    Deferred,
}

/// A tenant held back: its rows after `after` are skipped until it catches
/// up (or, for an unknown version, for as long as the partition is owned).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Hold {
    pub(crate) after: Option<Position>,
    pub(crate) why: Why,
}

#[derive(Debug)]
pub(crate) struct Tenant {
    pub(crate) partition: u32,
    /// Rows held, in delivery order.
    pub(crate) queue: VecDeque<Entry>,
    /// The last row taken (the catch-up read starts after it).
    pub(crate) last_taken: Option<Position>,
    pub(crate) hold: Option<Hold>,
}

/// Every tenant with rows held or held back, indexed by partition so a
/// lost partition's tenants are found without a scan (S-C4).
#[derive(Debug, Default)]
pub(crate) struct Tenants {
    by_tenant: BTreeMap<Vec<u8>, Tenant>,
    by_partition: BTreeMap<u32, BTreeSet<Vec<u8>>>,
    /// Tenants held as [`Why::Saturated`].
    pub(crate) saturated: BTreeSet<Vec<u8>>,
    /// Tenants held as [`Why::Deferred`].
    deferred: BTreeSet<Vec<u8>>,
}

impl Tenants {
    pub(crate) fn get(&self, tenant: &[u8]) -> Option<&Tenant> {
        self.by_tenant.get(tenant)
    }

    pub(crate) fn get_mut(&mut self, tenant: &[u8]) -> Option<&mut Tenant> {
        self.by_tenant.get_mut(tenant)
    }

    pub(crate) fn entry(&mut self, tenant: &[u8], partition: u32) -> &mut Tenant {
        if !self.by_tenant.contains_key(tenant) {
            self.by_partition
                .entry(partition)
                .or_default()
                .insert(tenant.to_vec());
            self.by_tenant.insert(
                tenant.to_vec(),
                Tenant {
                    partition,
                    queue: VecDeque::new(),
                    last_taken: None,
                    hold: None,
                },
            );
        }
        self.by_tenant.get_mut(tenant).expect("inserted above")
    }

    /// Holds `tenant` back for `why`, after its last row taken.
    pub(crate) fn hold(&mut self, tenant: &[u8], why: Why) {
        if let Some(t) = self.by_tenant.get_mut(tenant) {
            t.hold = Some(Hold {
                after: t.last_taken,
                why,
            });
            if why == Why::Saturated {
                self.saturated.insert(tenant.to_vec());
            } else {
                self.saturated.remove(tenant);
            }
            if why == Why::Deferred {
                self.deferred.insert(tenant.to_vec());
            } else {
                self.deferred.remove(tenant);
            }
        }
    }

    /// Every tenant held as [`Why::Deferred`] catches up as a saturated
    /// one: from after its last row taken (S-T18, S-T9).
    pub(crate) fn undefer(&mut self) {
        for tenant in std::mem::take(&mut self.deferred) {
            self.hold(&tenant, Why::Saturated);
        }
    }

    /// Lets `tenant` rejoin its partition's flow.
    pub(crate) fn release(&mut self, tenant: &[u8]) {
        if let Some(t) = self.by_tenant.get_mut(tenant) {
            t.hold = None;
        }
        self.saturated.remove(tenant);
        self.deferred.remove(tenant);
        self.forget_if_idle(tenant);
    }

    /// Drops a tenant that holds nothing and is held back for nothing.
    pub(crate) fn forget_if_idle(&mut self, tenant: &[u8]) {
        let idle = self
            .by_tenant
            .get(tenant)
            .is_some_and(|t| t.queue.is_empty() && t.hold.is_none());
        if idle {
            if let Some(t) = self.by_tenant.remove(tenant) {
                if let Some(set) = self.by_partition.get_mut(&t.partition) {
                    set.remove(tenant);
                    if set.is_empty() {
                        self.by_partition.remove(&t.partition);
                    }
                }
            }
        }
    }

    /// Forgets every tenant of `partition`; returns their held entries.
    pub(crate) fn drop_partition(&mut self, partition: u32) -> Vec<Entry> {
        let mut entries = Vec::new();
        for tenant in self.by_partition.remove(&partition).unwrap_or_default() {
            self.saturated.remove(&tenant);
            self.deferred.remove(&tenant);
            if let Some(t) = self.by_tenant.remove(&tenant) {
                entries.extend(t.queue);
            }
        }
        entries
    }

    /// Takes the ended rows at the front of `tenant`'s queue (its removable
    /// prefix, S-T12).
    pub(crate) fn take_ended_prefix(&mut self, tenant: &[u8]) -> Vec<(i64, Ended)> {
        let mut out = Vec::new();
        if let Some(t) = self.by_tenant.get_mut(tenant) {
            while t.queue.front().is_some_and(|e| e.ended.is_some()) {
                let e = t.queue.pop_front().expect("checked");
                out.push((e.id, e.ended.expect("checked")));
            }
        }
        self.forget_if_idle(tenant);
        out
    }

    /// Drops `tenant`'s entries from `id` on (handed over: they stay in the
    /// table, and so must every later one, S-T12); returns them.
    pub(crate) fn drop_from(&mut self, tenant: &[u8], id: i64) -> Vec<Entry> {
        let mut out = Vec::new();
        if let Some(t) = self.by_tenant.get_mut(tenant) {
            if let Some(at) = t.queue.iter().position(|e| e.id == id) {
                out.extend(t.queue.drain(at..));
            }
        }
        self.forget_if_idle(tenant);
        out
    }

    /// How many rows `tenant` holds.
    pub(crate) fn held(&self, tenant: &[u8]) -> u32 {
        self.by_tenant
            .get(tenant)
            .map_or(0, |t| u32::try_from(t.queue.len()).unwrap_or(u32::MAX))
    }

    /// Tenants known (for tests and memory checks).
    pub(crate) fn len(&self) -> usize {
        self.by_tenant.len()
    }
}
