//! I2: every attempt of one write carries the identical slice.

use super::Broken;
use crate::net::book::SliceRec;

/// A retry of slice `first` carries the very ids of its first attempt.
pub fn retry_is_identical(s: &SliceRec, first: u64, tenant_ix: u32, ids: &[u64]) -> Option<Broken> {
    if s.ids == ids {
        return None;
    }
    Some((
        "I2",
        format!(
            "attempt {} of slice #{first} (tenant {tenant_ix}) carries {} items \
             {:?}.., the first attempt {} items {:?}..",
            s.attempts + 1,
            ids.len(),
            &ids[..ids.len().min(4)],
            s.ids.len(),
            &s.ids[..s.ids.len().min(4)]
        ),
    ))
}
