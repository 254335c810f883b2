//! The suspects of a crash (S-J17): a journal's recovery names, per
//! tenant, how many of its oldest items were in flight when the process
//! died (or come before one that was). Until they have settled, they are
//! written alone: one item per write, in a group of its own, started
//! only when no other write is in flight, and no other write starts
//! while it is. A crash during such a write implicates its item alone.
//! Once an attempt of it has come back, others may start while it waits
//! for its retry (S-W8): the retry goes alone again, and a crash while it
//! waits counts against nobody (its attempt's end is on disk).
//!
//! A recovery also names, per tenant, how many of its oldest items an
//! earlier life attempted (an attempt mark on disk, a crash or not, or a
//! crash count in a life record): the store may hold them, so whenever
//! they are given up their dead letter says `attempted` (S-J16).
//!
//! Empty outside a recovery after a crash: every check is one emptiness
//! test then.

use std::collections::BTreeMap;

/// The tenants whose oldest items go alone, and the lone slice.
#[derive(Debug)]
pub(crate) struct Suspects<K> {
    /// Per tenant, how many of its oldest pending items go alone.
    alone: BTreeMap<K, u64>,
    /// The tenant whose lone attempt is in flight: nothing else starts
    /// until it comes back.
    lone: Option<K>,
    /// Per tenant, how many of its oldest pending items an earlier life
    /// attempted (S-J16).
    tried: BTreeMap<K, u64>,
}

impl<K> Default for Suspects<K> {
    fn default() -> Self {
        Suspects {
            alone: BTreeMap::new(),
            lone: None,
            tried: BTreeMap::new(),
        }
    }
}

impl<K: Ord> Suspects<K> {
    /// The oldest `n` pending items of `tenant` go alone (more than it
    /// holds is harmless: the count falls as its items settle).
    pub(crate) fn set(&mut self, tenant: K, n: u64) {
        if n > 0 {
            let c = self.alone.entry(tenant).or_default();
            *c = (*c).max(n);
        }
    }

    /// The oldest `n` pending items of `tenant` were attempted in an
    /// earlier life (S-J16).
    pub(crate) fn set_tried(&mut self, tenant: K, n: u64) {
        if n > 0 {
            let c = self.tried.entry(tenant).or_default();
            *c = (*c).max(n);
        }
    }

    /// How many of `tenant`'s oldest pending items an earlier life
    /// attempted.
    pub(crate) fn tried(&self, tenant: &K) -> u64 {
        if self.tried.is_empty() {
            return 0;
        }
        self.tried.get(tenant).copied().unwrap_or(0)
    }

    /// Whether `tenant`'s next slice goes alone.
    pub(crate) fn is_alone(&self, tenant: &K) -> bool {
        !self.alone.is_empty() && self.alone.contains_key(tenant)
    }

    /// `n` of `tenant`'s oldest items are done (written or given up): a
    /// lone slice of it ends.
    pub(crate) fn done(&mut self, tenant: &K, n: u64) {
        if self.alone.is_empty() && self.lone.is_none() && self.tried.is_empty() {
            return;
        }
        if let Some(c) = self.tried.get_mut(tenant) {
            *c = c.saturating_sub(n);
            if *c == 0 {
                self.tried.remove(tenant);
            }
        }
        if self.lone.as_ref() == Some(tenant) {
            self.lone = None;
        }
        if let Some(c) = self.alone.get_mut(tenant) {
            *c = c.saturating_sub(n);
            if *c == 0 {
                self.alone.remove(tenant);
            }
        }
    }

    /// A lone slice of `tenant` started (or its retry).
    pub(crate) fn started(&mut self, tenant: K) {
        self.lone = Some(tenant);
    }

    /// An attempt of `tenant` came back failed and waits for its retry:
    /// if it was the lone one, others may start meanwhile (S-W8); the
    /// retry still goes alone.
    pub(crate) fn came_back(&mut self, tenant: &K) {
        if self.lone.as_ref() == Some(tenant) {
            self.lone = None;
        }
    }

    /// The tenant whose lone attempt is in flight: nothing else starts.
    pub(crate) fn lone(&self) -> Option<&K> {
        self.lone.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suspects_count_down_from_the_oldest_and_a_lone_slice_blocks_until_it_is_done() {
        let mut s: Suspects<u32> = Suspects::default();
        assert!(!s.is_alone(&1));
        s.set(1, 2);
        s.set(2, 0);
        assert!(s.is_alone(&1) && !s.is_alone(&2));
        s.started(1);
        assert_eq!(s.lone(), Some(&1));
        s.done(&2, 1);
        assert_eq!(s.lone(), Some(&1), "another tenant's items");
        s.done(&1, 1);
        assert_eq!(s.lone(), None);
        assert!(s.is_alone(&1));
        s.done(&1, 1);
        assert!(!s.is_alone(&1));
    }

    #[test]
    fn a_lone_attempt_that_came_back_lifts_the_gate_and_its_retry_goes_alone() {
        let mut s: Suspects<u32> = Suspects::default();
        s.set(1, 1);
        s.started(1);
        s.came_back(&2);
        assert_eq!(s.lone(), Some(&1), "another tenant's attempt");
        s.came_back(&1);
        assert_eq!(s.lone(), None, "others may start while it backs off");
        assert!(s.is_alone(&1), "its retry still goes alone");
        s.started(1);
        assert_eq!(s.lone(), Some(&1));
    }
}
