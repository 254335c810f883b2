//! S-W4: a write carries at least one item.

use super::Broken;

/// The driver never hands the sink an empty slice.
pub fn slice_not_empty(ids: &[u64]) -> Option<Broken> {
    ids.is_empty().then(|| {
        (
            "S-W4",
            "the driver handed the sink an empty slice".to_string(),
        )
    })
}
