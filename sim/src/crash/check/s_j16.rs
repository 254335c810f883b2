//! S-J16 across lives: a dead letter that says `attempted: false` holds
//! no item the store may hold as far as the outbox can know: none handed
//! to the sink in this life, and none with an attempt mark on disk when
//! this life's recovery read the journal (an earlier life attempted it).
//! An attempt that started while the journal was down left no mark
//! (S-J17 lets it go at once), and one whose mark a rotten byte damaged
//! left none the recovery can read (the world leaves those out of what
//! it counts as on disk), so their items may say `false` after a crash.

use super::Broken;
use crate::crash::ledger::Ledger;

/// The items `ids` of a dead letter that says `attempted: false`.
pub fn unattempted(l: &Ledger, ids: &[u64]) -> Option<Broken> {
    let tried = |id: &u64| l.handed.contains(id) || l.marked_at_recovery.contains(id);
    let id = ids.iter().find(|id| tried(id))?;
    let why = if l.handed.contains(id) {
        "was handed to the sink in this life"
    } else {
        "had an attempt mark on disk at this life's recovery"
    };
    Some((
        "S-J16",
        format!(
            "items {ids:?} were dead-lettered with attempted false, but #{id} {why}: the store \
             may hold it"
        ),
    ))
}
