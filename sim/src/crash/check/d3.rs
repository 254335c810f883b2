//! D3: nothing is written that was never staged.

use super::Broken;
use crate::net::book::{Admit, Book};
use crate::net::protocol::WireItem;

/// Every item a commit writes was accepted by a `stage` call, for the
/// tenant the write names and the item carries.
pub fn nothing_invented(book: &Book, tenant: u128, fresh: &[WireItem]) -> Vec<Broken> {
    let mut broken = Vec::new();
    for item in fresh {
        let staged = book.items.get(item.id as usize);
        let ok = staged.is_some_and(|s| {
            s.admit == Admit::Accepted
                && s.tenant == item.tenant
                && u128::from(item.tenant) + 1 == tenant
        });
        if !ok {
            broken.push((
                "D3",
                format!(
                    "item #{} (tenant {}) written for tenant {} was never staged so: {staged:?}",
                    item.id,
                    item.tenant,
                    tenant.wrapping_sub(1)
                ),
            ));
        }
    }
    broken
}
