//! I8: after shutdown returns (or abandon), no write starts. The end check
//! that no attempt is left running is in [`super::fates::tally`].

use outbox::core::Time;

use super::Broken;
use crate::net::book::Book;

/// No attempt starts after the outbox closed.
pub fn nothing_starts_after_close(book: &Book, first: u64, now: Time) -> Option<Broken> {
    let at = book.closed_at?;
    Some((
        "I8",
        format!("an attempt of slice #{first} started at {now}, after the outbox closed at {at}"),
    ))
}
