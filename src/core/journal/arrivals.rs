//! The ledger's newest entries in arrival order (S-J1, issue 25): a stage
//! appends its item's entry to one list, and the tenants' queues take them
//! later, in bulk, grouped by tenant off the journal's lock.
//!
//! Sorting each entry into its tenant's queue at its append (a hash lookup
//! and a push onto one of many queues, each a likely cache miss) was the
//! largest part of a journaled stage under the journal's lock, the lock
//! every stage waits for. Now the commit task takes the list out with
//! each batch ([`Arrivals::hand_out`]), groups it by tenant while it holds
//! no lock ([`Sorting::sort`]), and the queues take each tenant's group in
//! one step ([`Arrivals::apply`]). Anything that reads a tenant's queue
//! first [settles](Arrivals::settle) whatever is not in the queues yet,
//! so every reader sees the same queues as if each entry had been sorted
//! at its append; a grouping that comes back after such a settle is
//! dropped. Grouping decides nothing: a tenant's queue is the same
//! whichever way its entries got there (S-C1).

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;

use super::ledger::{Entry, PerTenant};

/// Entries not yet in their tenants' queues: the oldest handed out to be
/// sorted, then the rest. A tenant's queue goes on with its entries in
/// `handed`, then in `fresh`.
#[derive(Debug)]
pub(super) struct Arrivals<K> {
    handed: Option<Arc<Vec<(K, Entry)>>>,
    fresh: Vec<(K, Entry)>,
}

impl<K> Default for Arrivals<K> {
    fn default() -> Self {
        Arrivals {
            handed: None,
            fresh: Vec::new(),
        }
    }
}

/// Entries handed out to be grouped by tenant off the journal's lock
/// ([`Machine::poll_sort`](super::Machine::poll_sort)).
#[derive(Debug)]
pub struct Sorting<K>(Arc<Vec<(K, Entry)>>);

/// The entries of a [`Sorting`], grouped by tenant in the order each
/// tenant first appears, each group in arrival order; for
/// [`Machine::handle_sorted`](super::Machine::handle_sorted).
#[derive(Debug)]
pub struct Sorted<K> {
    of: Arc<Vec<(K, Entry)>>,
    groups: Vec<(K, Vec<Entry>)>,
}

impl<K: Hash + Eq + Clone> Sorting<K> {
    /// Groups the entries by tenant: O(entries), one hash lookup each.
    pub fn sort(&self) -> Sorted<K> {
        let mut at: HashMap<&K, usize, foldhash::fast::FixedState> = HashMap::default();
        let mut groups: Vec<(K, Vec<Entry>)> = Vec::new();
        for (tenant, entry) in self.0.iter() {
            let i = *at.entry(tenant).or_insert_with(|| {
                groups.push((tenant.clone(), Vec::new()));
                groups.len() - 1
            });
            groups[i].1.push(*entry);
        }
        Sorted {
            of: Arc::clone(&self.0),
            groups,
        }
    }
}

impl<K: Hash + Eq + Clone> Arrivals<K> {
    /// `tenant`'s next entry.
    #[inline]
    pub(super) fn push(&mut self, tenant: K, entry: Entry) {
        self.fresh.push((tenant, entry));
    }

    /// Puts every entry into its tenant's queue in `tenants`, in order.
    pub(super) fn settle(&mut self, tenants: &mut PerTenant<K>) {
        if let Some(handed) = self.handed.take() {
            for (tenant, entry) in handed.iter() {
                tenants.entry(tenant.clone()).or_default().push_back(*entry);
            }
        }
        for (tenant, entry) in self.fresh.drain(..) {
            tenants.entry(tenant).or_default().push_back(entry);
        }
    }

    /// The entries so far, to be sorted off the lock; `None` if there are
    /// none. One sorting at a time: an earlier one not yet applied is
    /// settled first, into `tenants`.
    pub(super) fn hand_out(&mut self, tenants: &mut PerTenant<K>) -> Option<Sorting<K>> {
        if self.fresh.is_empty() {
            return None;
        }
        if self.handed.is_some() {
            self.settle(tenants);
            return None;
        }
        let handed = Arc::new(std::mem::take(&mut self.fresh));
        self.handed = Some(Arc::clone(&handed));
        Some(Sorting(handed))
    }

    /// The queues in `tenants` take `sorted`'s groups, if its entries are
    /// still the handed ones (a reader may have settled them meanwhile).
    pub(super) fn apply(&mut self, sorted: Sorted<K>, tenants: &mut PerTenant<K>) {
        if !self
            .handed
            .as_ref()
            .is_some_and(|h| Arc::ptr_eq(h, &sorted.of))
        {
            return;
        }
        self.handed = None;
        for (tenant, entries) in sorted.groups {
            tenants.entry(tenant).or_default().extend(entries);
        }
    }

    /// Entries not in their tenants' queues yet.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.handed.as_ref().map_or(0, |h| h.len()) + self.fresh.len()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::*;

    fn queues(t: &PerTenant<u32>) -> Vec<(u32, Vec<u64>)> {
        let mut v: Vec<_> = t
            .iter()
            .map(|(k, q)| (*k, q.iter().map(|e| e.0).collect()))
            .collect();
        v.sort_unstable();
        v
    }

    fn arrive(a: &mut Arrivals<u32>, seqs: std::ops::Range<u64>) {
        for s in seqs {
            a.push((s % 3) as u32, Entry(s));
        }
    }

    #[test]
    fn a_sorting_applied_gives_the_queues_of_a_settle() {
        let (mut a, mut b) = (Arrivals::default(), Arrivals::default());
        let (mut ta, mut tb) = (PerTenant::default(), PerTenant::default());
        arrive(&mut a, 1..8);
        arrive(&mut b, 1..8);
        let sorting = a.hand_out(&mut ta).unwrap();
        arrive(&mut a, 8..11);
        a.apply(sorting.sort(), &mut ta);
        assert_eq!(a.len(), 3, "the later arrivals wait");
        a.settle(&mut ta);
        arrive(&mut b, 8..11);
        b.settle(&mut tb);
        assert_eq!(queues(&ta), queues(&tb));
        assert_eq!(queues(&ta)[1], (1, vec![1, 4, 7, 10]));
    }

    #[test]
    fn a_sorting_after_a_settle_is_dropped() {
        let mut a = Arrivals::default();
        let mut t = PerTenant::default();
        arrive(&mut a, 1..5);
        let sorting = a.hand_out(&mut t).unwrap();
        arrive(&mut a, 5..7);
        // A reader settles the handed entries and the fresh ones.
        a.settle(&mut t);
        a.apply(sorting.sort(), &mut t);
        assert_eq!(a.len(), 0);
        let all: usize = t.values().map(VecDeque::len).sum();
        assert_eq!(all, 6, "each entry once");
        assert_eq!(queues(&t)[2], (2, vec![2, 5]));
    }

    #[test]
    fn a_second_hand_out_settles_the_first() {
        let mut a = Arrivals::default();
        let mut t = PerTenant::default();
        assert!(a.hand_out(&mut t).is_none(), "nothing to sort");
        arrive(&mut a, 1..4);
        let lost = a.hand_out(&mut t).unwrap();
        arrive(&mut a, 4..6);
        assert!(a.hand_out(&mut t).is_none());
        assert_eq!(a.len(), 0, "the first and the later ones settled");
        a.apply(lost.sort(), &mut t);
        assert_eq!(queues(&t)[1], (1, vec![1, 4]));
    }
}
