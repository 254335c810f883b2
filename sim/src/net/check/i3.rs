//! I3: S-W14 holds after every step (every item staged is pending, written,
//! lost or dropped), and the metrics equal the counters (the comparison is
//! [`SimRecorder::mismatch`](crate::net::metrics::SimRecorder::mismatch)).

use outbox::core::Counters;

use super::Broken;

/// The counters balance: staged = pending + written + lost + dropped.
pub fn counters_balance(c: &Counters) -> Option<Broken> {
    (!c.balanced()).then(|| ("I3", format!("the counters do not balance: {c:?}")))
}

/// The counters count every item the application staged.
pub fn every_stage_counted(c: &Counters, staged: usize) -> Option<Broken> {
    (c.staged != staged as u64).then(|| {
        (
            "I3",
            format!("{staged} items staged, the counters say {}", c.staged),
        )
    })
}
