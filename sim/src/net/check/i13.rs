//! I13: every run-time dead letter matches a counted loss (S-R4): its
//! items were accepted, belong to its tenant and come out once; at a
//! quiet end, the items counted under the run-time reasons equal those
//! handed out, reason by reason.

use outbox::core::{Counters, DeadReason};

use super::Broken;
use crate::net::book::{Admit, Book};

/// A dead letter of tenant index `tenant` with item ids `ids` came out.
/// Records it in the book; the rule it breaks, if any.
pub fn on_letter(
    book: &mut Book,
    tenant: Option<u32>,
    ids: &[u64],
    reason: DeadReason,
) -> Option<Broken> {
    if ids.is_empty() {
        return Some(("I13", format!("an empty dead letter ({})", reason.as_str())));
    }
    for id in ids {
        let Some(item) = book.items.get_mut(*id as usize) else {
            return Some(("I13", format!("dead letter item #{id} was never staged")));
        };
        if item.admit != Admit::Accepted || Some(item.tenant) != tenant || item.dead_letter {
            return Some((
                "I13",
                format!(
                    "dead letter ({}) holds item #{id} of tenant {}, {:?}, already out: {}",
                    reason.as_str(),
                    item.tenant,
                    item.admit,
                    item.dead_letter
                ),
            ));
        }
        item.dead_letter = true;
    }
    book.dead_letters[reason.index()] += ids.len() as u64;
    None
}

/// At a quiet end, with dead letters on: per reason, counted = handed out.
pub fn every_loss_handed_out(book: &Book, c: &Counters) -> Result<(), Broken> {
    if !book.dead_letters_on {
        return Ok(());
    }
    for (ix, reason) in DeadReason::ALL.iter().enumerate() {
        let counted = reason.counted(c);
        if counted != book.dead_letters[ix] {
            return Err((
                "I13",
                format!(
                    "{counted} items counted under {}, {} handed out as dead letters",
                    reason.as_str(),
                    book.dead_letters[ix]
                ),
            ));
        }
    }
    Ok(())
}
