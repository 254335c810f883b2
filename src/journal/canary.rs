//! Deliberate journal bugs for the crash world's canaries (feature
//! `canary`; issue 13): the simulation must catch each. Chosen at run time
//! by the `OUTBOX_CANARY` environment variable; without the feature every
//! switch is a constant `false` and compiles away.
//!
//! - `early_mark`: an item is marked done when its first attempt starts,
//!   before the write it marks (D1);
//! - `no_checksum`: a record's crc32c is not verified at recovery (D3);
//! - `reorder`: recovery stages each tenant's items in reverse (D2);
//! - `no_fsync` is the storage's (the simulation's disk skips `sync`).

/// Marks done at the first attempt's start.
pub const EARLY_MARK: &str = "early_mark";
/// Skips the checksum at recovery.
pub const NO_CHECKSUM: &str = "no_checksum";
/// Recovers each tenant in reverse.
pub const REORDER: &str = "reorder";

/// Whether the canary `name` is on.
#[cfg(feature = "canary")]
pub fn on(name: &str) -> bool {
    std::env::var("OUTBOX_CANARY").is_ok_and(|v| v == name)
}

/// Whether the canary `name` is on: never without the feature.
#[cfg(not(feature = "canary"))]
pub const fn on(_name: &str) -> bool {
    false
}
