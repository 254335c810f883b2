//! Groups of slices handed out together (S-F1): which groups still have a
//! slice in flight, so that `concurrency` bounds groups, not slices.
//!
//! A slice keeps everything of its own (id, attempt, retry, outcome) in
//! the engine's in-flight records; a group is only a count of its slices
//! still out. It holds one concurrency slot until the count is back to 0.

use std::collections::BTreeMap;

/// Identifies one group handed out. Ids grow by one per group, from 1;
/// never reused, so a late slice cannot join a newer group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct GroupId(u64);

/// The groups with a slice in flight, given-up slices included.
#[derive(Debug, Default)]
pub(crate) struct Groups {
    /// Per open group, its slices still in flight (at least 1).
    out: BTreeMap<GroupId, usize>,
    /// The last id handed out.
    last: u64,
}

impl Groups {
    /// A new, empty group; it takes a slot once a slice joins it.
    pub(crate) fn open(&mut self) -> GroupId {
        self.last += 1;
        GroupId(self.last)
    }

    /// A slice of `group` was handed out.
    pub(crate) fn join(&mut self, group: GroupId) {
        *self.out.entry(group).or_insert(0) += 1;
    }

    /// A slice of `group` came back (finished or lost): the group frees
    /// its slot with its last slice.
    pub(crate) fn leave(&mut self, group: GroupId) {
        if let Some(n) = self.out.get_mut(&group) {
            *n -= 1;
            if *n == 0 {
                self.out.remove(&group);
            }
        }
    }

    /// Groups with a slice in flight: the concurrency slots taken.
    pub(crate) fn len(&self) -> usize {
        self.out.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_holds_its_slot_until_its_last_slice_is_back() {
        let mut g = Groups::default();
        let a = g.open();
        g.join(a);
        g.join(a);
        let b = g.open();
        g.join(b);
        assert_eq!(g.len(), 2);
        g.leave(a);
        assert_eq!(g.len(), 2);
        g.leave(b);
        assert_eq!(g.len(), 1);
        g.leave(a);
        assert_eq!(g.len(), 0);
        // A slice of an unknown group changes nothing.
        g.leave(a);
        assert_eq!(g.len(), 0);
        assert!(g.open() > b);
    }
}
