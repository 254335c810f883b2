//! Deliberate engine bugs for the harnesses' canaries (feature `canary`;
//! issue 26): the model test and the fuzz target must catch each. Chosen
//! at run time by the `OUTBOX_CANARY` environment variable; without the
//! feature every switch is a constant `false` and compiles away. Each
//! plant is one marked `canary::on` condition in the core, asked only on
//! the rare path it breaks.
//!
//! - `breaker_timeout`: the breaker counts a timed-out attempt neither way
//!   (S-R1 counts it as a failure);
//! - `expired_retry`: a retry slice older than `max_item_age` is retried
//!   anyway instead of expiring (S-R3, I12);
//! - `written_dead_letter`: a write that commits on its last allowed
//!   attempt is handed out as a `retries_exhausted` dead letter (S-R4, I13);
//! - `group_retry_swap`: a retry joining a group takes the items of the
//!   slice before it in the group (S-W5, S-F3, I2).

/// The breaker does not count timeouts.
pub(crate) const BREAKER_TIMEOUT: &str = "breaker_timeout";
/// A retry slice never expires.
pub(crate) const EXPIRED_RETRY: &str = "expired_retry";
/// A commit on the last allowed attempt is dead-lettered.
pub(crate) const WRITTEN_DEAD_LETTER: &str = "written_dead_letter";
/// A retried group slice carries its group mate's items.
pub(crate) const GROUP_RETRY_SWAP: &str = "group_retry_swap";

/// Whether the canary `name` is on.
#[cfg(feature = "canary")]
pub(crate) fn on(name: &str) -> bool {
    std::env::var_os("OUTBOX_CANARY").is_some_and(|v| v == name)
}

/// Whether the canary `name` is on: never without the feature.
#[cfg(not(feature = "canary"))]
pub(crate) const fn on(_name: &str) -> bool {
    false
}
