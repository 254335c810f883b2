//! D2: per tenant, written items keep their staging order across crashes
//! and recoveries.

use super::Broken;
use crate::net::datastore::Durable;

/// The tenant's rows (first commits, in commit order) rise in item id
/// (the global staging order) through the `fresh` rows just committed.
pub fn tenant_order_kept(store: &Durable, tenant: u32, fresh: usize) -> Option<Broken> {
    let rows = store.by_tenant.get(&tenant)?;
    let from = rows.len().saturating_sub(fresh + 1);
    rows[from..].windows(2).find(|w| w[0] >= w[1]).map(|w| {
        (
            "D2",
            format!(
                "tenant {tenant}: item #{} was first written after item #{}, staged later",
                w[1], w[0]
            ),
        )
    })
}
