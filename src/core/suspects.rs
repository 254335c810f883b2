//! The suspects of a crash (S-J17): a journal's recovery names, per
//! tenant, how many of its oldest items were in flight when the process
//! died (or come before one that was). Until they have settled, they are
//! written alone: one item per write, in a group of its own, started
//! only when no other write is in flight, and no other write starts
//! while it is. A crash during such a write implicates its item alone.
//!
//! Empty outside a recovery after a crash: every check is one emptiness
//! test then.

use std::collections::BTreeMap;

use super::write::WriteId;

/// The tenants whose oldest items go alone, and the lone write in flight.
#[derive(Debug)]
pub(crate) struct Suspects<K> {
    /// Per tenant, how many of its oldest pending items go alone.
    alone: BTreeMap<K, u64>,
    /// The lone write in flight, if any: nothing else starts meanwhile.
    in_flight: Option<WriteId>,
}

impl<K> Default for Suspects<K> {
    fn default() -> Self {
        Suspects {
            alone: BTreeMap::new(),
            in_flight: None,
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

    /// Whether `tenant`'s next slice goes alone.
    pub(crate) fn is_alone(&self, tenant: &K) -> bool {
        !self.alone.is_empty() && self.alone.contains_key(tenant)
    }

    /// `n` of `tenant`'s oldest items settled.
    pub(crate) fn settled(&mut self, tenant: &K, n: u64) {
        if self.alone.is_empty() {
            return;
        }
        if let Some(c) = self.alone.get_mut(tenant) {
            *c = c.saturating_sub(n);
            if *c == 0 {
                self.alone.remove(tenant);
            }
        }
    }

    /// A lone write started.
    pub(crate) fn started(&mut self, id: WriteId) {
        self.in_flight = Some(id);
    }

    /// Write `id` ended (any outcome).
    pub(crate) fn ended(&mut self, id: WriteId) {
        if self.in_flight == Some(id) {
            self.in_flight = None;
        }
    }

    /// Whether a lone write is in flight: nothing else may start.
    pub(crate) fn blocking(&self) -> bool {
        self.in_flight.is_some()
    }

    /// Whether `id` is the lone write in flight.
    pub(crate) fn is_lone(&self, id: WriteId) -> bool {
        self.in_flight == Some(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suspects_settle_from_the_oldest_and_a_lone_write_blocks_until_it_ends() {
        let mut s: Suspects<u32> = Suspects::default();
        assert!(!s.is_alone(&1));
        s.set(1, 2);
        s.set(2, 0);
        assert!(s.is_alone(&1) && !s.is_alone(&2));
        s.started(WriteId(7));
        assert!(s.blocking() && s.is_lone(WriteId(7)));
        s.ended(WriteId(8));
        assert!(s.blocking());
        s.ended(WriteId(7));
        assert!(!s.blocking());
        s.settled(&1, 1);
        assert!(s.is_alone(&1));
        s.settled(&1, 1);
        assert!(!s.is_alone(&1));
    }
}
