//! I1: per tenant, the store ends with each accepted, non-lost, non-dropped
//! item exactly once, in staging order. At the end against the store; at
//! each attempt's start, the slice's shape and order.

use outbox::core::Counters;

use super::fates::Fates;
use super::Broken;
use crate::net::book::{Admit, Book};
use crate::net::datastore::Durable;

/// At the end: every item the store holds was staged, accepted and stored
/// under its tenant once; the written ones are in staging order; every item
/// whose write was answered committed is there; their number is the
/// `written` counter.
pub fn store_holds_what_was_written(
    book: &Book,
    store: &Durable,
    c: &Counters,
    fates: &Fates,
) -> Result<(), Broken> {
    let stored = rows_are_staged_once_in_order(book, store, &fates.written)?;
    let mut count = 0u64;
    for (id, (&written, &stored)) in fates.written.iter().zip(&stored).enumerate() {
        if written {
            count += 1;
            if !stored {
                return Err((
                    "I1",
                    format!(
                        "item #{id}'s write was answered committed, but it is not in the store"
                    ),
                ));
            }
        }
    }
    if count != c.written {
        return Err((
            "I1",
            format!(
                "the sink saw {count} items committed (not given up), the counters say {} written",
                c.written
            ),
        ));
    }
    Ok(())
}

/// Every row of the store is an item staged and accepted, under its own
/// tenant, once; the `written` ones are in staging order. Which items the
/// store holds, by id.
fn rows_are_staged_once_in_order(
    book: &Book,
    store: &Durable,
    written: &[bool],
) -> Result<Vec<bool>, Broken> {
    let mut stored = vec![false; book.items.len()];
    for (tenant, rows) in &store.by_tenant {
        let mut last_written: Option<u64> = None;
        for &id in rows {
            let Some(rec) = book.items.get(id as usize) else {
                return Err(("I1", format!("the store holds item #{id}, never staged")));
            };
            if rec.tenant != *tenant {
                return Err((
                    "I1",
                    format!(
                        "item #{id} of tenant {} stored under tenant {tenant}",
                        rec.tenant
                    ),
                ));
            }
            if rec.admit != Admit::Accepted {
                return Err((
                    "I1",
                    format!(
                        "item #{id} is in the store, but stage answered {:?}",
                        rec.admit
                    ),
                ));
            }
            if stored[id as usize] {
                return Err(("I1", format!("item #{id} is in the store twice")));
            }
            stored[id as usize] = true;
            if written[id as usize] {
                if let Some(prev) = last_written.filter(|p| *p > id) {
                    return Err((
                        "I1",
                        format!(
                            "tenant {tenant}'s store has written item #{prev} before #{id}: \
                             out of staging order"
                        ),
                    ));
                }
                last_written = Some(id);
            }
        }
    }
    Ok(stored)
}

/// At an attempt's start: the slice carries items of its own tenant only
/// (`wrong_tenant` says whether it does not), in staging order.
pub fn slice_of_one_tenant_in_order(
    tenant: &dyn std::fmt::Display,
    tenant_ix: u32,
    wrong_tenant: bool,
    ids: &[u64],
) -> Vec<Broken> {
    let mut broken = Vec::new();
    if wrong_tenant {
        broken.push((
            "I1",
            format!("a write for tenant {tenant} carries another tenant's items"),
        ));
    }
    if let Some(w) = ids.windows(2).find(|w| w[0] >= w[1]) {
        broken.push((
            "I1",
            format!(
                "a slice of tenant {tenant_ix} is out of staging order: #{} before #{}",
                w[0], w[1]
            ),
        ));
    }
    broken
}

/// At a new slice's first attempt: it comes after every earlier slice of
/// its tenant (S-W3: staging order).
pub fn slice_starts_after_earlier_ones(book: &Book, tenant_ix: u32, first: u64) -> Option<Broken> {
    let later = book
        .slices
        .range(first..)
        .find(|(_, s)| s.tenant == tenant_ix)
        .map(|(f, _)| *f)?;
    Some((
        "I1",
        format!("tenant {tenant_ix}'s slice #{first} started after its slice #{later}"),
    ))
}
