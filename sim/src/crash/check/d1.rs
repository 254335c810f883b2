//! D1: every item whose `sync` was answered before a crash is written,
//! exactly once in an idempotent store, once the last recovery settled.

use std::collections::BTreeSet;

use super::Broken;
use crate::net::book::Book;
use crate::net::datastore::Durable;

/// Every synced item is in the store (once: the store absorbs repeats and
/// keeps each item once), unless a shutdown handed it back to the caller,
/// or bit rot hit its record (`rotten`: the disk knows which records it
/// damaged; the journal may count such an item lost, or cut it as a torn
/// tail when it was the last record).
pub fn synced_items_written(
    book: &Book,
    store: &Durable,
    synced: &BTreeSet<u64>,
    rotten: &BTreeSet<u64>,
) -> Option<Broken> {
    let written: BTreeSet<u64> = store.by_tenant.values().flatten().copied().collect();
    let missing: Vec<u64> = synced
        .iter()
        .copied()
        .filter(|id| !written.contains(id) && !rotten.contains(id))
        .filter(|id| !book.items.get(*id as usize).is_some_and(|i| i.handed_back))
        .collect();
    (!missing.is_empty()).then(|| {
        (
            "D1",
            format!(
                "{} items covered by an answered sync are not in the datastore after the last \
                 recovery settled, and no rotten byte hit their records; first {:?}",
                missing.len(),
                &missing[..missing.len().min(8)]
            ),
        )
    })
}
