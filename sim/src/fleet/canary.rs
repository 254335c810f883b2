//! The fleet world's canaries (feature `canary`): deliberate breaks of
//! the world's own parts, chosen by `OUTBOX_CANARY`, that a campaign must
//! catch (docs/testing.md). Inert without the feature.

/// Whether the canary `name` is on.
pub fn on(name: &str) -> bool {
    cfg!(feature = "canary") && std::env::var("OUTBOX_CANARY").is_ok_and(|v| v == name)
}
