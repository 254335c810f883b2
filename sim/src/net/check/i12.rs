//! I12: no attempt starts with an item staged longer than `max_item_age`
//! ago (S-R3); an item never sliced is explained by `expired`.

use std::time::Duration;

use outbox::core::Time;

use super::Broken;
use crate::net::book::Book;

/// What the sink sees lags the engine's decision by the driver's spawn
/// and a turmoil step: the age is checked with this much slack (the fast
/// world checks it exactly).
pub const SLACK: Duration = Duration::from_millis(20);

/// At an attempt's start: every item of the slice is at most
/// `max_item_age` (plus [`SLACK`]) old.
pub fn no_item_too_old(book: &Book, ids: &[u64], now: Time) -> Option<Broken> {
    let age = book.max_item_age?;
    let oldest = ids
        .iter()
        .filter_map(|id| book.items.get(*id as usize))
        .map(|i| i.staged_at)
        .min()?;
    (now.saturating_since(oldest) > age + SLACK).then(|| {
        (
            "I12",
            format!(
                "an attempt starts at {now} with an item staged at {oldest}, older than {age:?}"
            ),
        )
    })
}

/// Whether an item never sliced may have expired: with a `max_item_age`,
/// the end checks count it under `expired` (their sums make it exact).
pub fn may_have_expired(book: &Book) -> bool {
    book.max_item_age.is_some()
}
