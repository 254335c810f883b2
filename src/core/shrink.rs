//! Giving back the memory a burst took (SPEC S-B8): a container that grew
//! for a spike shrinks once it is mostly empty again.
//!
//! Amortised: a container is shrunk only when its length is below a
//! quarter of its capacity, and then to twice its length, so at least
//! half of that length must go again before the next shrink, and the
//! copying costs O(1) per removal. Below [`KEEP`] slots nothing is given
//! back: a small steady state does not reallocate.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, Hash};

/// Slots a container keeps whatever its length.
pub(crate) const KEEP: usize = 8;

/// The capacity to shrink to, if a container of `len` items in `capacity`
/// slots should shrink.
fn target(len: usize, capacity: usize) -> Option<usize> {
    (capacity > KEEP && len < capacity / 4).then(|| (len * 2).max(KEEP))
}

/// Shrinks a queue that a burst left mostly empty.
pub(crate) fn deque<T>(q: &mut VecDeque<T>) {
    if let Some(to) = target(q.len(), q.capacity()) {
        q.shrink_to(to);
    }
}

/// Shrinks a vector that a burst left mostly empty.
pub(crate) fn vec<T>(v: &mut Vec<T>) {
    if let Some(to) = target(v.len(), v.capacity()) {
        v.shrink_to(to);
    }
}

/// Shrinks a map that a burst left mostly empty.
// The journal's ledger keeps one; the engine's tenants have their own table.
#[cfg_attr(not(feature = "journal"), allow(dead_code))]
pub(crate) fn map<K: Eq + Hash, V, S: BuildHasher>(m: &mut HashMap<K, V, S>) {
    if let Some(to) = target(m.len(), m.capacity()) {
        m.shrink_to(to);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drained_burst_is_given_back_and_a_small_state_kept() {
        let mut q: VecDeque<u64> = (0..1_000).collect();
        while q.len() > 3 {
            q.pop_front();
            deque(&mut q);
        }
        assert!(q.capacity() <= 2 * KEEP, "capacity {}", q.capacity());
        assert_eq!(q, [997, 998, 999]);
        let mut v: Vec<u64> = Vec::with_capacity(KEEP);
        v.push(1);
        let before = v.capacity();
        vec(&mut v);
        assert_eq!(v.capacity(), before, "a small vector keeps its slots");
        let mut m: HashMap<u64, u64> = (0..1_000).map(|i| (i, i)).collect();
        for i in 0..1_000 {
            m.remove(&i);
            map(&mut m);
        }
        assert!(m.capacity() <= 2 * KEEP, "capacity {}", m.capacity());
    }

    #[test]
    fn shrinks_only_below_a_quarter() {
        assert_eq!(target(0, KEEP), None);
        assert_eq!(target(10, 40), None);
        assert_eq!(target(9, 40), Some(18));
        assert_eq!(target(1, 40), Some(KEEP));
        assert_eq!(target(0, 9), Some(KEEP));
    }
}
