//! The harness's own account of every item: its fate (pending, written,
//! dropped, lost), the per-tenant backlogs waiting for a write, the slices
//! of the writes seen, and the open waits. The checks compare the engine
//! with this ledger; nothing here decides a verdict.

use std::collections::VecDeque;

use super::Harness;
use crate::core::{Time, Write, WriteId};
use crate::testkit::op::weight_of;

/// What became of an item, in the harness's own account.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fate {
    /// Accepted, not yet written, dropped or lost.
    Pending,
    /// Written by the sink.
    Written,
    /// Dropped by a policy (refused at stage time or a failed batch under
    /// the drop policy).
    Dropped,
    /// Lost (refused after the fence, or given up).
    Lost,
}

/// A write the harness has seen, across its attempts.
#[derive(Debug)]
pub(super) struct Slice {
    pub(super) tenant: u8,
    pub(super) items: Vec<u64>,
    pub(super) attempts: u32,
    /// Set when an attempt failed with a retry: no retry before this (I7).
    pub(super) retry_not_before: Option<Time>,
    /// The first attempt's start (S-B2 `max_retry_duration`).
    pub(super) first_started: Time,
}

/// A flush, settle or shutdown waiting for its answer. It covers the items
/// pending at the call: those staged before it (`item < bound`) that were
/// still pending then. Its answer is computed incrementally (O(log n)),
/// never by walking the items.
#[derive(Debug)]
pub(super) struct WaitCheck {
    /// Items numbered below this were staged before the call.
    pub(super) bound: u64,
    /// Items pending at the call.
    pub(super) pending: u64,
    /// Items staged before the call and already written, dropped or lost
    /// at the call, by fate (index `Fate as usize - 1`).
    pub(super) settled_before: [u64; 3],
    pub(super) deadline: Time,
}

/// What a first attempt took from its tenant's waiting backlog.
pub(super) struct Taken {
    /// The backlog's first `items.len()` items, in staging order.
    pub(super) prefix: Vec<u64>,
    /// The backlog's length before the cut.
    pub(super) whole: usize,
    /// The first item left behind, if any.
    pub(super) next: Option<u64>,
}

/// Counts of settled items by fate (written, dropped, lost) over item
/// numbers, as a Fenwick tree that grows by one slot per staged item:
/// O(log n) to settle an item, to stage one and to ask how many items
/// below a bound have each fate.
#[derive(Debug, Default)]
pub(super) struct FateTree {
    /// 1-based; slot `n` sums items `(n - lowbit(n), n]`.
    tree: Vec<[u64; 3]>,
}

impl FateTree {
    fn len(&self) -> usize {
        self.tree.len().saturating_sub(1)
    }

    /// Appends an unsettled item.
    pub(super) fn push(&mut self) {
        if self.tree.is_empty() {
            self.tree.push([0; 3]);
        }
        let n = self.tree.len();
        let low = n & n.wrapping_neg();
        let a = self.prefix(n - 1);
        let b = self.prefix(n - low);
        self.tree.push([a[0] - b[0], a[1] - b[1], a[2] - b[2]]);
    }

    /// Item `item` (0-based) settled with fate index `f` (0..3).
    pub(super) fn add(&mut self, item: u64, f: usize) {
        let mut i = item as usize + 1;
        while i < self.tree.len() {
            self.tree[i][f] += 1;
            i += i & i.wrapping_neg();
        }
    }

    /// Settled counts among items `0..n`.
    pub(super) fn prefix(&self, n: usize) -> [u64; 3] {
        let mut out = [0; 3];
        let mut i = n.min(self.len());
        while i > 0 {
            for (o, v) in out.iter_mut().zip(self.tree[i]) {
                *o += v;
            }
            i &= i - 1;
        }
        out
    }
}

impl Harness {
    /// Records an accepted item: pending, at the back of its tenant's
    /// backlog (starting the backlog's linger clock if it was empty, S-A3).
    pub(super) fn ledger_accept(&mut self, tenant: u8, id: u64, weight: u64) {
        self.new_fate(Fate::Pending);
        self.tenant_pending[usize::from(tenant)] += 1;
        let queue = self.waiting.entry(tenant).or_default();
        if queue.is_empty() {
            self.linger_from[usize::from(tenant)] = self.now;
        }
        queue.push_back(id);
        self.waiting_bytes[usize::from(tenant)] += weight_of(id);
        self.pending_bytes += weight;
    }

    /// Records an item settled at stage time (dropped, or refused: lost).
    pub(super) fn ledger_done_at_stage(&mut self, id: u64, fate: Fate) {
        self.new_fate(fate);
        self.settled.add(id, fate as usize - 1);
    }

    /// Takes a first attempt's items off the front of its tenant's backlog;
    /// items left behind restart the linger clock (S-A3).
    pub(super) fn ledger_take_batch(&mut self, w: &Write<u8, u64>) -> Taken {
        let queue: &mut VecDeque<u64> = self.waiting.entry(w.tenant).or_default();
        let n = w.items.len();
        let prefix: Vec<u64> = queue.iter().take(n).copied().collect();
        let whole = queue.len();
        queue.drain(..n.min(whole));
        let next = queue.front().copied();
        if next.is_some() {
            // Items left behind restart the linger clock (S-A3).
            self.linger_from[usize::from(w.tenant)] = self.now;
        }
        let taken: u64 = w.items.iter().map(|i| weight_of(*i)).sum();
        let wb = &mut self.waiting_bytes[usize::from(w.tenant)];
        *wb = wb.saturating_sub(taken);
        Taken {
            prefix,
            whole,
            next,
        }
    }

    /// Records a first attempt's slice, to hold its retries to it (I2).
    pub(super) fn ledger_open_slice(&mut self, w: &Write<u8, u64>) {
        self.slices.insert(
            w.id,
            Slice {
                tenant: w.tenant,
                items: w.items.clone(),
                attempts: 1,
                retry_not_before: None,
                first_started: self.now,
            },
        );
    }

    /// A deadline or abandon gave up everything pending: every pending
    /// item is lost, the backlogs are empty, and the slices of writes not
    /// in flight (retries) are settled.
    pub(super) fn ledger_lose_all_pending(&mut self) {
        let pending: Vec<u64> = self.pending_items();
        self.set_fates(&pending, Fate::Lost);
        for q in self.waiting.values_mut() {
            q.clear();
        }
        self.waiting_bytes.iter_mut().for_each(|b| *b = 0);
        // Retry slices and in-flight slices are settled too.
        let ids: Vec<WriteId> = self.slices.keys().copied().collect();
        for id in ids {
            if !self.in_flight.iter().any(|w| w.id == id) {
                self.slices.remove(&id);
            }
        }
    }

    /// Every pending item (O(items); only for a mass loss, once a run).
    fn pending_items(&self) -> Vec<u64> {
        self.fate
            .iter()
            .enumerate()
            .filter(|(_, f)| **f == Fate::Pending)
            .map(|(i, _)| i as u64)
            .collect()
    }

    /// The check for a wait opened now, covering the items pending now.
    pub(super) fn wait_check(&self, deadline: Time) -> WaitCheck {
        let [_, written, dropped, lost] = self.model;
        WaitCheck {
            bound: self.next_item,
            pending: self.model[0],
            settled_before: [written, dropped, lost],
            deadline,
        }
    }

    /// Records the fate of the item just numbered.
    fn new_fate(&mut self, fate: Fate) {
        debug_assert_eq!(self.fate.len() as u64 + 1, self.next_item);
        self.fate.push(fate);
        self.model[fate as usize] += 1;
    }

    /// Settles pending items (items already settled keep their fate) and
    /// keeps every derived count in step: O(log n) per item.
    pub(super) fn set_fates(&mut self, items: &[u64], fate: Fate) {
        debug_assert_ne!(fate, Fate::Pending);
        for &i in items {
            let ix = i as usize;
            let Some(f) = self.fate.get_mut(ix) else {
                continue;
            };
            if *f != Fate::Pending {
                continue;
            }
            *f = fate;
            if self.config.max_item_age().is_some() {
                let age = self.now.saturating_since(self.staged_at[ix]);
                let ns = u64::try_from(age.as_nanos()).unwrap_or(u64::MAX);
                self.ages_due.push((fate, ns));
            }
            self.model[Fate::Pending as usize] -= 1;
            self.model[fate as usize] += 1;
            self.settled.add(i, fate as usize - 1);
            self.tenant_pending[usize::from(self.tenant_of[ix])] -= 1;
            if self.weighs {
                self.pending_bytes -= weight_of(i);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::FateTree;

    #[test]
    fn fate_tree_agrees_with_a_plain_count() {
        let mut tree = FateTree::default();
        let mut plain: Vec<Option<usize>> = Vec::new();
        // A fixed pseudo-random mix of stages and settles.
        let mut x = 12_345u64;
        for _ in 0..2_000 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            if plain.is_empty() || x % 3 == 0 {
                tree.push();
                plain.push(None);
            } else {
                let i = (x >> 33) as usize % plain.len();
                if plain[i].is_none() {
                    let f = (x >> 20) as usize % 3;
                    plain[i] = Some(f);
                    tree.add(i as u64, f);
                }
            }
            let n = (x >> 40) as usize % (plain.len() + 1);
            let mut want = [0u64; 3];
            for f in plain[..n].iter().flatten() {
                want[*f] += 1;
            }
            assert_eq!(tree.prefix(n), want);
        }
    }
}
