//! Poison across lives (S-J17), sans IO: from the journal's records of
//! its lives, how many crashes cut each recovered item's attempts, which
//! items are poisoned, and which are the suspects written alone.
//!
//! A life is numbered by the first segment it created. Before an item's
//! first attempt in a life, an attempt mark naming the life is on disk; a
//! recovery that restores items starts its life with a life record
//! holding the crashes counted so far; a closing journal with attempted
//! items still pending records that it closed cleanly. At recovery, the
//! crashes of an item are those of the latest life record, plus one for
//! each life since (that one included) that marked its attempt and did
//! not close cleanly: the item was in flight, or backing off between
//! attempts, when the process died.

use std::collections::{BTreeMap, BTreeSet};

use super::ledger::Seq;

/// What a recovery read of the journal's lives (S-J17), from every
/// segment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Lives {
    /// `(life, item)`: an attempt mark.
    pub attempts: Vec<(u64, Seq)>,
    /// `(life, counts)`: a life record, with `(item, crashes)`.
    pub starts: Vec<(u64, Vec<(Seq, u32)>)>,
    /// Lives that closed cleanly.
    pub clean: Vec<u64>,
}

impl Lives {
    /// Adds what another segment held.
    pub fn extend(&mut self, other: Lives) {
        self.attempts.extend(other.attempts);
        self.starts.extend(other.starts);
        self.clean.extend(other.clean);
    }
}

/// The crashes of the items `pending` (any order): `(item, crashes)` for
/// those with one or more, in sequence order (S-J17).
pub fn crashes(lives: &Lives, pending: &BTreeSet<Seq>) -> BTreeMap<Seq, u32> {
    let base_life = lives.starts.iter().map(|(life, _)| *life).max();
    let mut counts: BTreeMap<Seq, u32> = BTreeMap::new();
    if let Some(base) = base_life {
        for (_, c) in lives.starts.iter().filter(|(life, _)| *life == base) {
            for &(seq, n) in c {
                if pending.contains(&seq) {
                    let e = counts.entry(seq).or_default();
                    *e = (*e).max(n);
                }
            }
        }
    }
    let clean: BTreeSet<u64> = lives.clean.iter().copied().collect();
    // Each (life, item) once, however many marks repeat it.
    let cut: BTreeSet<(u64, Seq)> = lives
        .attempts
        .iter()
        .copied()
        .filter(|(life, seq)| {
            base_life.is_none_or(|b| *life >= b) && !clean.contains(life) && pending.contains(seq)
        })
        .collect();
    for (_, seq) in cut {
        let e = counts.entry(seq).or_default();
        *e = e.saturating_add(1);
    }
    counts
}

/// Whether an item cut by `crashes` crashes is poisoned under
/// `max_crash_attempts` (at least 1, S-J17).
pub fn poisoned(crashes: u32, max_crash_attempts: u32) -> bool {
    crashes >= max_crash_attempts.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(seqs: &[Seq]) -> BTreeSet<Seq> {
        seqs.iter().copied().collect()
    }

    #[test]
    fn a_crash_counts_once_per_life_that_marked_the_item_and_did_not_close_cleanly() {
        // Life 1 marked 5 and 6 and crashed; life 3 restored them (5 once
        // cut) and marked 5 again, then crashed; life 7 marked 6 and
        // closed cleanly.
        let lives = Lives {
            attempts: vec![(1, 5), (1, 6), (3, 5), (3, 5), (7, 6)],
            starts: vec![(3, vec![(5, 1), (6, 1)])],
            clean: vec![7],
        };
        let c = crashes(&lives, &set(&[5, 6, 9]));
        assert_eq!(c.into_iter().collect::<Vec<_>>(), [(5, 2), (6, 1)]);
        assert!(!poisoned(2, 3) && poisoned(3, 3) && poisoned(1, 0));
    }

    #[test]
    fn marks_of_lives_before_the_latest_life_record_are_counted_in_it() {
        let lives = Lives {
            attempts: vec![(1, 5), (2, 5)],
            starts: vec![(2, vec![(5, 1)]), (1, vec![(5, 9)])],
            clean: vec![],
        };
        assert_eq!(crashes(&lives, &set(&[5]))[&5], 2);
        assert!(
            crashes(&lives, &set(&[4])).is_empty(),
            "done items count nothing"
        );
    }
}
