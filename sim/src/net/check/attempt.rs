//! The checks made when an attempt starts in the sink, in a fixed order:
//! the slice's shape (S-W4, I1), nothing after the close (I8), then a
//! retry's identity, backoff and uniqueness (I2, I7, I4) or a new slice's
//! place in its tenant's order (I1). The sink records the attempt after.

use std::fmt;

use outbox::core::Time;

use super::{i1, i2, i4, i7, i8, s_w4, Broken};
use crate::net::book::Book;

/// What the sink was handed for one attempt.
pub struct Start<'a> {
    /// When the attempt started.
    pub now: Time,
    /// The tenant the write was for, as the driver named it.
    pub tenant: &'a dyn fmt::Display,
    /// The tenant index of the slice's first item (`u32::MAX` if empty).
    pub tenant_ix: u32,
    /// Whether any item belongs to another tenant than `tenant`.
    pub wrong_tenant: bool,
    /// The slice's item ids.
    pub ids: &'a [u64],
    /// The slice's first item id, its identity (`u64::MAX` if empty).
    pub first: u64,
}

/// Every rule the start of this attempt breaks, in the order checked.
pub fn on_start(book: &Book, a: &Start<'_>) -> Vec<Broken> {
    let mut broken = Vec::new();
    broken.extend(s_w4::slice_not_empty(a.ids));
    broken.extend(i1::slice_of_one_tenant_in_order(
        a.tenant,
        a.tenant_ix,
        a.wrong_tenant,
        a.ids,
    ));
    broken.extend(i8::nothing_starts_after_close(book, a.first, a.now));
    match book.slices.get(&a.first) {
        Some(s) => broken.extend(retry(book, s, a)),
        None => broken.extend(i1::slice_starts_after_earlier_ones(
            book,
            a.tenant_ix,
            a.first,
        )),
    }
    broken
}

/// A retry: identical (I2), else after its backoff (I7, unless closing),
/// else the only attempt of its slice in flight (I4).
fn retry(book: &Book, s: &crate::net::book::SliceRec, a: &Start<'_>) -> Option<Broken> {
    if let Some(b) = i2::retry_is_identical(s, a.first, a.tenant_ix, a.ids) {
        return Some(b);
    }
    if let Some(b) = i7::retry_after_backoff(s, a.first, a.now, book.min_backoff) {
        return (!book.closing).then_some(b);
    }
    i4::one_attempt_per_slice(s, a.first)
}
