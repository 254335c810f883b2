//! D6: after the final settle, the journal's disk use returns to a small
//! constant.

use std::collections::BTreeMap;

use super::Broken;

/// Disk use after the final settle and a sync: at most the current
/// segment and the one before it (`limit` bytes); after the final clean
/// shutdown, one empty segment (`limit` = its header and seal).
pub fn disk_use_small(
    when: &str,
    bytes: u64,
    files: &BTreeMap<String, u64>,
    limit: u64,
) -> Option<Broken> {
    (bytes > limit).then(|| {
        (
            "D6",
            format!("{when}: the journal holds {bytes} bytes, more than {limit}: {files:?}"),
        )
    })
}
