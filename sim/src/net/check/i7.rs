//! I7: no retry starts before its backoff has elapsed.

use std::time::Duration;

use outbox::core::Time;

use super::Broken;
use crate::net::book::SliceRec;

/// A retry of slice `first` starts at least `min_backoff` (the shortest
/// backoff the config allows) after its last attempt ended. Not checked
/// once a shutdown or abandon was called (the caller's part).
pub fn retry_after_backoff(
    s: &SliceRec,
    first: u64,
    now: Time,
    min_backoff: Duration,
) -> Option<Broken> {
    let end = s.ended_at.filter(|e| now < *e + min_backoff)?;
    Some((
        "I7",
        format!(
            "attempt {} of slice #{first} started {:?} after the last one ended, \
             the shortest backoff is {min_backoff:?}",
            s.attempts + 1,
            now - end
        ),
    ))
}
