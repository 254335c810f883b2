//! Where each item went, as the sink saw it: the tally the end checks
//! compare with the store and the counters. Tallying also checks that no
//! attempt is left running at the end (I8, or S-W16 after a drop).

use outbox::core::Counters;

use super::{Broken, Ending};
use crate::net::book::{Book, End};

/// Where the items went, by the slices the sink saw.
#[derive(Debug, Default)]
pub struct Fates {
    /// By item id: its slice's last attempt committed it (and it was not
    /// discarded or given up).
    pub written: Vec<bool>,
    /// By item id: some attempt carried it.
    pub in_slice: Vec<bool>,
    /// Items the datastore discarded from committed slices.
    pub discarded: u64,
    /// Items of slices rejected terminally.
    pub terminal: u64,
    /// Items of slices whose last attempt failed or was cancelled.
    pub failed: u64,
    /// Items of attempts that committed or were rejected after the drop
    /// deadline fired: given up like a shutdown's dead letters.
    pub given_up: u64,
}

/// Tallies every slice not handed back. Broken: an attempt still running
/// when nothing is pending (I8; S-W16 after a drop).
pub fn tally(book: &Book, c: &Counters, ending: Ending) -> Result<Fates, Broken> {
    let n = book.items.len();
    // An attempt that ended at or after the drop deadline fired was given
    // up (its items are lost under `deadline`) whatever it returned: the
    // writer applies an outcome at the instant the attempt ends, and the
    // engine fires a due deadline before it applies any outcome. A shutdown
    // hands such items back instead; here nobody gets them back.
    let gave_up_at = ending.gave_up_at();
    let mut f = Fates {
        written: vec![false; n],
        in_slice: vec![false; n],
        ..Fates::default()
    };
    for (first, s) in &book.slices {
        let back = s.ids.iter().any(|id| book.items[*id as usize].handed_back);
        for id in &s.ids {
            f.in_slice[*id as usize] = true;
        }
        if back {
            continue;
        }
        let late = gave_up_at.is_some_and(|at| s.ended_at.is_some_and(|e| e >= at));
        if late && matches!(s.last, End::Ok(_) | End::Terminal) {
            f.given_up += s.ids.len() as u64;
            continue;
        }
        match s.last {
            End::Ok(d) => {
                let keep = s.ids.len().saturating_sub(d as usize);
                for id in &s.ids[..keep] {
                    f.written[*id as usize] = true;
                }
                f.discarded += u64::from(d).min(s.ids.len() as u64);
            }
            End::Terminal => f.terminal += s.ids.len() as u64,
            End::Failed | End::Dropped => f.failed += s.ids.len() as u64,
            End::Running => {
                if c.pending == 0 {
                    // After a drop: a write the writer left running (S-W16).
                    return Err((
                        if ending.is_drop() { "S-W16" } else { "I8" },
                        format!("slice #{first}'s attempt is still running at the end"),
                    ));
                }
            }
        }
    }
    Ok(f)
}
