//! I4: at most one write in flight per tenant and `concurrency` in all.

use super::Broken;
use crate::net::book::{Book, End, SliceRec};

/// A retry of slice `first` starts only once its last attempt ended.
pub fn one_attempt_per_slice(s: &SliceRec, first: u64) -> Option<Broken> {
    (s.last == End::Running).then(|| {
        (
            "I4",
            format!("slice #{first} has two attempts in flight at once"),
        )
    })
}

/// With the new attempt counted in flight: one per tenant, `concurrency`
/// in all.
pub fn in_flight_within_bounds(book: &Book, tenant_ix: u32) -> Vec<Broken> {
    let mut broken = Vec::new();
    let n = book.in_flight.get(&tenant_ix).copied().unwrap_or(0);
    if n > 1 {
        broken.push((
            "I4",
            format!("tenant {tenant_ix} has {n} writes in flight in the sink"),
        ));
    }
    if book.in_flight_total > book.concurrency {
        let (total, conc) = (book.in_flight_total, book.concurrency);
        broken.push((
            "I4",
            format!("{total} writes in flight in the sink, concurrency is {conc}"),
        ));
    }
    broken
}
