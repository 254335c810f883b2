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
//!   slice before it in the group (S-W5, S-F3, I2);
//!
//! and for the simulation's fleet world (issue 30; docs/testing.md):
//!
//! - `no_drift_margin`: a lease is trusted for the whole `lease_ttl` after
//!   its request's send, with no `max_clock_drift` margin (S-L4, S-L7);
//! - `delete_before_written`: the relay deletes a row as soon as its
//!   write starts, before the write is known written (S-T12);
//! - `dead_letter_no_epoch`: the store's dead-letter move has no epoch
//!   condition (the model's; S-T11);
//! - `delete_by_id_range`: the store deletes every row of the fenced
//!   partitions whose id is within the removal's lowest and highest (the
//!   model's; S-T12).

/// The breaker does not count timeouts.
pub(crate) const BREAKER_TIMEOUT: &str = "breaker_timeout";
/// A retry slice never expires.
pub(crate) const EXPIRED_RETRY: &str = "expired_retry";
/// A commit on the last allowed attempt is dead-lettered.
pub(crate) const WRITTEN_DEAD_LETTER: &str = "written_dead_letter";
/// A retried group slice carries its group mate's items.
pub(crate) const GROUP_RETRY_SWAP: &str = "group_retry_swap";

/// A lease is trusted for its whole ttl.
pub(crate) const NO_DRIFT_MARGIN: &str = "no_drift_margin";
/// A row is deleted when its write starts.
pub(crate) const DELETE_BEFORE_WRITTEN: &str = "delete_before_written";
/// The dead-letter move is not fenced.
#[cfg(all(feature = "testkit", feature = "table"))]
pub(crate) const DEAD_LETTER_NO_EPOCH: &str = "dead_letter_no_epoch";
/// The delete takes the removal's id range.
#[cfg(all(feature = "testkit", feature = "table"))]
pub(crate) const DELETE_BY_ID_RANGE: &str = "delete_by_id_range";

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
