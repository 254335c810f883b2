//! S-R3 across lives: an item's age runs from its stage, not from its
//! life's start. A recovered item already past `max_item_age` when its
//! life's recovery read the clock is given up (`expired`) before any write,
//! and no item is given up as expired before it is `max_item_age` old.

use std::time::Duration;

use outbox::core::Time;

use super::Broken;
use crate::net::book::Book;

/// Records carry their stage's wall-clock time in whole milliseconds, and
/// a recovery reads the clock in whole milliseconds: an age measured
/// across lives may be off by this much either way.
pub const STAMP_SLACK: Duration = Duration::from_millis(2);

/// At an attempt's start in a life whose recovery ran at `recovered_at`:
/// none of `earlier`, items staged in earlier lives, was already
/// `max_item_age` old then (it is expired at its first write's start,
/// S-R3: its age is carried across the crash, not restarted).
pub fn not_written_past_its_age(
    book: &Book,
    earlier: &[u64],
    recovered_at: Time,
) -> Option<Broken> {
    let age = book.max_item_age?;
    let old = earlier.iter().copied().find(|&id| {
        book.items
            .get(id as usize)
            .is_some_and(|i| recovered_at.saturating_since(i.staged_at) >= age + STAMP_SLACK)
    })?;
    let staged = book.items[old as usize].staged_at;
    Some((
        "S-R3",
        format!(
            "item #{old} staged at {staged} reaches the sink after a recovery at {recovered_at}, \
             when it was already older than max_item_age {age:?}: the recovery did not carry its \
             age past the limit"
        ),
    ))
}

/// At a dead letter `expired` at `now`: its oldest item is at least
/// `max_item_age` old (less the stamps' rounding). Only the oldest: a
/// retry slice goes whole when its oldest item is that old, its younger
/// items with it (S-R3, S-W5).
pub fn expired_when_old(book: &Book, ids: &[u64], now: Time) -> Option<Broken> {
    let Some(age) = book.max_item_age else {
        return Some((
            "S-R3",
            format!("items {ids:?} expired with no max_item_age set"),
        ));
    };
    let oldest = ids
        .iter()
        .map(|&id| book.items.get(id as usize).map(|i| (i.staged_at, id)))
        .min()?;
    let Some((staged, id)) = oldest else {
        return Some(("S-R3", format!("items {ids:?} expired, never staged")));
    };
    (now.saturating_since(staged) + STAMP_SLACK < age).then(|| {
        (
            "S-R3",
            format!(
                "items {ids:?} were given up as expired at {now}, the oldest (#{id}, staged at \
                 {staged}) younger than max_item_age {age:?}"
            ),
        )
    })
}
