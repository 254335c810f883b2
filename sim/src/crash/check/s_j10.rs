//! S-J10: with `max_bytes`, the segment files never hold more than it
//! while the disk works.

use std::collections::BTreeMap;

use super::Broken;

/// The segment files of `files` (name to size) hold at most `max` bytes.
pub fn bound_held(when: &str, files: &BTreeMap<String, u64>, max: u64) -> Option<Broken> {
    let bytes: u64 = files
        .iter()
        .filter(|(n, _)| n.starts_with("segment-"))
        .map(|(_, len)| len)
        .sum();
    (bytes > max).then(|| {
        (
            "S-J10",
            format!(
                "{when}: the segment files hold {bytes} bytes, over max_bytes {max}: {files:?}"
            ),
        )
    })
}
