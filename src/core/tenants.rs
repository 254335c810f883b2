//! The engine's tenant table: a dense vector of tenants (key and state side
//! by side, no gaps) under an open-addressing index of slot numbers, so
//! that a chunk of the intake can have its lookups in flight at once:
//! hash every tenant of the chunk, prefetch its index slot, then its
//! tenant, then take the items in (S-C10, issue 27).
//!
//! Lookups only decide anything: the order of the dense vector depends on
//! the history of insertions and removals and is never iterated to decide
//! (S-C1; `keys` is sorted by its caller). The hasher is foldhash with a
//! fixed seed, as the map it replaces: the same every run.

use std::hash::{BuildHasher, Hash};

use super::backlog::Tenant;
use super::shrink;

/// A tenant and its key, side by side: one lookup touches both.
#[derive(Debug)]
struct Entry<K, I> {
    key: K,
    tenant: Tenant<I>,
}

/// The smallest index: below it nothing is given back.
const MIN_INDEX: usize = 16;

/// An index slot: 0 when empty, else the upper 32 bits of the key's hash
/// (its tag, which also places it) and the dense slot number plus one.
type Cell = u64;

/// The tenants holding items or a write in flight, by key (S-B8).
#[derive(Debug)]
pub(crate) struct TenantTable<K, I> {
    /// Linear probing, a power of two long (or empty), at most half full.
    index: Vec<Cell>,
    entries: Dense<Entry<K, I>>,
    hasher: foldhash::fast::FixedState,
}

impl<K, I> Default for TenantTable<K, I> {
    fn default() -> Self {
        TenantTable {
            index: Vec::new(),
            entries: Dense::default(),
            hasher: foldhash::fast::FixedState::default(),
        }
    }
}

fn tag(hash: u64) -> u64 {
    hash >> 32
}

fn cell(hash: u64, slot: usize) -> Cell {
    (tag(hash) << 32) | (slot as u64 + 1)
}

fn slot_of(cell: Cell) -> usize {
    (cell & 0xffff_ffff) as usize - 1
}

impl<K, I> TenantTable<K, I> {
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

impl<K: Hash + Eq, I> TenantTable<K, I> {
    /// The key's hash, for [`find`](Self::find) and the prefetches.
    #[inline]
    pub(crate) fn hash(&self, key: &K) -> u64 {
        self.hasher.hash_one(key)
    }

    #[inline]
    fn mask(&self) -> usize {
        self.index.len().wrapping_sub(1)
    }

    /// The index position of `key` (hashing to `hash`) and its dense slot.
    #[inline]
    fn position(&self, key: &K, hash: u64) -> Option<(usize, usize)> {
        if self.index.is_empty() {
            return None;
        }
        let mask = self.mask();
        let mut at = tag(hash) as usize & mask;
        loop {
            let c = self.index[at];
            if c == 0 {
                return None;
            }
            if c >> 32 == tag(hash) && self.entries.at(slot_of(c)).key == *key {
                return Some((at, slot_of(c)));
            }
            at = (at + 1) & mask;
        }
    }

    /// The dense slot of `key`, if it is in the table.
    #[inline]
    pub(crate) fn find(&self, key: &K, hash: u64) -> Option<usize> {
        self.position(key, hash).map(|(_, slot)| slot)
    }

    #[inline]
    pub(crate) fn get(&self, key: &K) -> Option<&Tenant<I>> {
        let slot = self.find(key, self.hash(key))?;
        Some(&self.entries.at(slot).tenant)
    }

    #[inline]
    pub(crate) fn get_mut(&mut self, key: &K) -> Option<&mut Tenant<I>> {
        let slot = self.find(key, self.hash(key))?;
        Some(&mut self.entries.at_mut(slot).tenant)
    }

    /// The tenant of `key` (hashing to `hash`), made by `make` if absent.
    /// `guess`: the dense slot a prefetch found for the hash, taken if it
    /// holds `key` (the line is in cache, the probe is skipped); a stale
    /// guess only costs the probe.
    // Inlined: the hit is a few instructions, the call around it as many.
    #[inline(always)]
    pub(crate) fn get_or_insert(
        &mut self,
        key: &K,
        hash: u64,
        guess: Option<usize>,
        make: impl FnOnce() -> Tenant<I>,
    ) -> &mut Tenant<I>
    where
        K: Clone,
    {
        let guessed = guess.filter(|&g| g < self.entries.len() && self.entries.at(g).key == *key);
        let slot = match guessed.or_else(|| self.find(key, hash)) {
            Some(slot) => slot,
            None => self.insert(key.clone(), hash, make()),
        };
        &mut self.entries.at_mut(slot).tenant
    }

    /// Adds `tenant` for `key` (absent, hashing to `hash`); its slot.
    #[inline(never)]
    fn insert(&mut self, key: K, hash: u64, tenant: Tenant<I>) -> usize {
        if (self.entries.len() + 1) * 2 > self.index.len() {
            self.rebuild((self.index.len() * 2).max(MIN_INDEX));
        }
        let slot = self.entries.len();
        self.entries.push(Entry { key, tenant });
        self.place(cell(hash, slot));
        slot
    }

    /// Puts `c` in the first free index slot from its place.
    fn place(&mut self, c: Cell) {
        let mask = self.mask();
        let mut at = (c >> 32) as usize & mask;
        while self.index[at] != 0 {
            at = (at + 1) & mask;
        }
        self.index[at] = c;
    }

    /// A new index of `len` slots over the same entries.
    fn rebuild(&mut self, len: usize) {
        self.index = vec![0; len];
        for slot in 0..self.entries.len() {
            let hash = self.hash(&self.entries.at(slot).key);
            self.place(cell(hash, slot));
        }
    }

    /// Forgets `key`'s tenant; the last entry takes its dense slot, and
    /// what a burst grew is given back once mostly empty (S-B8).
    #[cfg(test)]
    pub(crate) fn remove(&mut self, key: &K) -> Option<Tenant<I>> {
        self.remove_if(key, |_| true)
    }

    /// Forgets `key`'s tenant if `forget` says so, with one lookup: as
    /// [`remove`](Self::remove).
    pub(crate) fn remove_if(
        &mut self,
        key: &K,
        forget: impl FnOnce(&Tenant<I>) -> bool,
    ) -> Option<Tenant<I>> {
        let (at, slot) = self.position(key, self.hash(key))?;
        if !forget(&self.entries.at(slot).tenant) {
            return None;
        }
        self.unplace(at);
        let last = self.entries.len() - 1;
        if slot != last {
            // The last entry moves into the hole: its cell is the one from
            // its place on that names its slot (no key to compare).
            let hash = self.hash(&self.entries.at(last).key);
            let mask = self.mask();
            let mut moved = tag(hash) as usize & mask;
            while self.index[moved] != cell(hash, last) {
                moved = (moved + 1) & mask;
            }
            self.index[moved] = cell(hash, slot);
        }
        let gone = self.entries.swap_remove(slot);
        if self.index.len() > MIN_INDEX && self.entries.len() * 8 < self.index.len() {
            self.rebuild((self.entries.len() * 4).next_power_of_two().max(MIN_INDEX));
        }
        Some(gone.tenant)
    }

    /// Forgets, in one pass, every tenant `keep` says no to, and rebuilds
    /// the index once for those left (a shutdown deadline or an abandon
    /// forgets nearly all at once: O(tenants), where one
    /// [`remove_if`](Self::remove_if) each would shrink and rebuild the
    /// index again and again). `keep` sees them in no meaningful order
    /// (it must not decide anything order-dependent, S-C1).
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&K, &Tenant<I>) -> bool) {
        let before = self.entries.len();
        self.entries.0.retain(|e| keep(&e.key, &e.tenant));
        if self.entries.len() == before {
            return;
        }
        shrink::vec(&mut self.entries.0);
        // The slots moved: one new index, given back as `remove_if` would.
        let len = if self.index.len() > MIN_INDEX && self.entries.len() * 8 < self.index.len() {
            (self.entries.len() * 4).next_power_of_two().max(MIN_INDEX)
        } else {
            self.index.len()
        };
        self.rebuild(len);
    }

    /// Empties index slot `at`, shifting back the cells after it that
    /// probed past it, so no probe stops short (linear probing's removal).
    fn unplace(&mut self, at: usize) {
        let mask = self.mask();
        let mut hole = at;
        let mut j = at;
        loop {
            j = (j + 1) & mask;
            let c = self.index[j];
            if c == 0 {
                break;
            }
            let home = (c >> 32) as usize & mask;
            // It may fill the hole if the hole lies between its home and j.
            if j.wrapping_sub(home) & mask >= j.wrapping_sub(hole) & mask {
                self.index[hole] = c;
                hole = j;
            }
        }
        self.index[hole] = 0;
    }

    /// The keys, in no meaningful order (callers sort them, S-C1).
    pub(crate) fn keys(&self) -> impl Iterator<Item = &K> {
        self.entries.iter().map(|e| &e.key)
    }

    /// The tenants, in no meaningful order (for order-free folds only).
    pub(crate) fn values(&self) -> impl Iterator<Item = &Tenant<I>> {
        self.entries.iter().map(|e| &e.tenant)
    }

    /// A hint: starts fetching the index slot `hash` probes first.
    pub(crate) fn prefetch_index(&self, hash: u64) {
        if let Some(c) = self.index.get(tag(hash) as usize & self.mask()) {
            prefetch(std::ptr::from_ref(c).cast());
        }
    }

    /// A hint: starts fetching the tenant whose index cell first carries
    /// `hash`'s tag (its index slot should be fetched by now), without
    /// reading it; returns that dense slot for
    /// [`prefetch_backlog`](Self::prefetch_backlog). A guess: the key is
    /// not compared (that would wait for the line).
    pub(crate) fn prefetch_tenant(&self, hash: u64) -> Option<usize> {
        let mask = self.mask();
        let mut at = tag(hash) as usize & mask;
        loop {
            let c = *self.index.get(at)?;
            if c == 0 {
                return None;
            }
            if c >> 32 == tag(hash) {
                let slot = slot_of(c);
                let entry: *const u8 = self.entries.ptr(slot).cast();
                for line in (0..std::mem::size_of::<Entry<K, I>>()).step_by(64) {
                    prefetch(entry.wrapping_add(line));
                }
                return Some(slot);
            }
            at = (at + 1) & mask;
        }
    }

    /// A hint: starts fetching the back of the backlog of the tenant in
    /// dense `slot` (its entry should be fetched by now), where the next
    /// item goes.
    pub(crate) fn prefetch_backlog(&self, slot: usize) {
        if slot < self.entries.len() {
            let entry = self.entries.at(slot);
            let (a, b) = entry.tenant.items.as_slices();
            let back = if b.is_empty() { a } else { b };
            prefetch(back.as_ptr_range().end.cast());
        }
    }
}

/// Up to this many entries, the entries grow as a vector does (doubling);
/// beyond, by an eighth at a time, so a large table carries at most an
/// eighth of slack where a doubling vector carries up to its length
/// (S-B8: bytes per tenant). A large allocation grows by remapping pages
/// rather than copying, where the allocator can.
const DOUBLING_UP_TO: usize = 4096;

/// The entries, densely, in one vector whose growth [`Dense::push`]
/// paces.
#[derive(Debug)]
struct Dense<T>(Vec<T>);

impl<T> Default for Dense<T> {
    fn default() -> Self {
        Dense(Vec::new())
    }
}

impl<T> Dense<T> {
    #[inline]
    fn len(&self) -> usize {
        self.0.len()
    }

    #[inline]
    fn at(&self, slot: usize) -> &T {
        &self.0[slot]
    }

    #[inline]
    fn at_mut(&mut self, slot: usize) -> &mut T {
        &mut self.0[slot]
    }

    /// Where slot `slot` lives, for a prefetch (any address will do for
    /// one out of range).
    fn ptr(&self, slot: usize) -> *const T {
        self.0.as_ptr().wrapping_add(slot)
    }

    fn push(&mut self, value: T) {
        let v = &mut self.0;
        if v.len() == v.capacity() && v.len() >= DOUBLING_UP_TO {
            v.reserve_exact(v.len() / 8);
        }
        v.push(value);
    }

    /// Takes slot `slot` out; the last one takes its place.
    fn swap_remove(&mut self, slot: usize) -> T {
        let gone = self.0.swap_remove(slot);
        shrink::vec(&mut self.0);
        gone
    }

    fn iter(&self) -> impl Iterator<Item = &T> {
        self.0.iter()
    }
}

/// Asks the CPU to start loading the cache line at `at` (x86_64 only; a
/// no-op elsewhere). A hint: it reads nothing and never faults, whatever
/// the address.
#[inline(always)]
fn prefetch(at: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `_mm_prefetch` is unsafe only as a `target_feature(sse)`
    // function, and SSE is part of the x86_64 baseline. A prefetch is a
    // hint that never dereferences its pointer in the language's sense: no
    // read, no write, no fault, for any address, dangling or not.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(at.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::time::Time;

    #[test]
    fn retain_forgets_in_one_pass_and_lookups_still_find_the_rest() {
        let mut table: TenantTable<u64, u64> = TenantTable::default();
        for k in 0..10_000u64 {
            let h = table.hash(&k);
            table
                .get_or_insert(&k, h, None, || Tenant::new(Time::ZERO))
                .pending = k as usize;
        }
        let big = table.index.len();
        table.retain(|k, _| k % 100 == 7);
        assert_eq!(table.len(), 100);
        assert!(table.index.len() < big, "given back");
        for k in 0..10_000u64 {
            assert_eq!(
                table.get(&k).map(|t| t.pending),
                (k % 100 == 7).then_some(k as usize)
            );
        }
        table.retain(|_, _| true);
        assert_eq!(table.len(), 100);
        table.retain(|_, _| false);
        assert_eq!((table.len(), table.get(&7).is_none()), (0, true));
        let h = table.hash(&3);
        table.get_or_insert(&3, h, None, || Tenant::new(Time::ZERO));
        assert!(table.get(&3).is_some());
    }

    #[test]
    fn inserts_finds_and_removes_as_a_map_would() {
        let mut table: TenantTable<u64, u64> = TenantTable::default();
        let mut model = std::collections::BTreeMap::new();
        let mut x = 12345u64;
        for step in 0..60_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // A key range that grows and shrinks, so the index is rebuilt
            // both ways and removals shift probe runs.
            let range = 1 + (step / 3_000 % 7) * 700;
            let key = x % range;
            if x % 3 == 0 {
                assert_eq!(table.remove(&key).is_some(), model.remove(&key).is_some());
            } else {
                let h = table.hash(&key);
                // Guesses right, wrong and out of range: only a right one
                // may be taken.
                let guess = match x % 5 {
                    0 => None,
                    1 => table.find(&key, h),
                    _ => Some((x >> 8) as usize % (table.len() + 2)),
                };
                table
                    .get_or_insert(&key, h, guess, || Tenant::new(Time::ZERO))
                    .pending += 1;
                *model.entry(key).or_insert(0usize) += 1;
            }
            assert_eq!(table.len(), model.len());
            if step % 997 == 0 {
                for (k, n) in &model {
                    assert_eq!(table.get(k).map(|t| t.pending), Some(*n), "key {k}");
                }
            }
        }
        let mut keys: Vec<u64> = table.keys().copied().collect();
        keys.sort_unstable();
        assert_eq!(keys, model.keys().copied().collect::<Vec<_>>());
        for k in keys {
            table.remove(&k);
        }
        assert_eq!(table.index.len(), MIN_INDEX, "given back once empty");
    }
}
