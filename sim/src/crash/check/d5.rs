//! D5: after the faults stop, recovery completes and a settle empties the
//! outbox within a bound (the journal never wedges).

use std::time::Duration;

use outbox::core::Report;

use super::Broken;

/// The settle's bound for `pending` items: a healthy write takes a few
/// ticks; 5 s plus 2 ms per item.
pub fn bound(pending: u64) -> Duration {
    Duration::from_secs(5)
        + Duration::from_millis(2).saturating_mul(u32::try_from(pending).unwrap_or(u32::MAX))
}

/// The final settle answered in its bound with nothing pending.
pub fn settled_in_bound(r: &Report, pending: u64, bound: Duration) -> Option<Broken> {
    (r.pending != 0 || r.deadline_passed).then(|| {
        (
            "D5",
            format!(
                "after the faults stopped, a settle with a {} ms bound left {} of {pending} items \
                 pending",
                bound.as_millis(),
                r.pending
            ),
        )
    })
}
