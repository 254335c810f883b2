//! Poison across lives (S-J17), sans IO: from the journal's records of
//! its lives, how many crashes cut each recovered item's attempts, which
//! items are poisoned, and which are the suspects written alone.
//!
//! A life is numbered by the first segment it created. Before each
//! attempt of an item in a life, an attempt mark naming the life is on
//! disk; when an attempt comes back failed to wait for its retry, an
//! attempt-end mark follows it (not waited for); a recovery that restores
//! items starts its life with a life record holding the crashes counted
//! so far; a closing journal with attempted items still pending records
//! that it closed cleanly. At recovery, the crashes of an item are those
//! of the latest life record, plus one for each life since (that one
//! included) that marked its attempt, wrote no end mark after its last
//! attempt mark and did not close cleanly: the item was in flight when
//! the process died. An end mark lost in the crash counts the attempt as
//! cut: the safe side.

use std::collections::{BTreeMap, BTreeSet};

use super::ledger::Seq;

/// What a recovery read of the journal's lives (S-J17), from every
/// segment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Lives {
    /// `(life, item)`: an attempt mark, in journal order.
    pub attempts: Vec<(u64, Seq)>,
    /// `(after, life, item)`: an attempt-end mark, written after the
    /// first `after` attempt marks of `attempts`.
    pub ends: Vec<(usize, u64, Seq)>,
    /// `(life, counts)`: a life record, with `(item, crashes)`.
    pub starts: Vec<(u64, Vec<(Seq, u32)>)>,
    /// Lives that closed cleanly.
    pub clean: Vec<u64>,
}

impl Lives {
    /// Adds what another segment held.
    pub fn extend(&mut self, other: Lives) {
        let before = self.attempts.len();
        self.ends.extend(
            other
                .ends
                .into_iter()
                .map(|(after, life, seq)| (before + after, life, seq)),
        );
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
    // Each (life, item) once, however many marks repeat it: where its last
    // attempt mark ends in `attempts`, and where its last end mark follows.
    let mut last: BTreeMap<(u64, Seq), usize> = BTreeMap::new();
    for (i, &(life, seq)) in lives.attempts.iter().enumerate() {
        if base_life.is_none_or(|b| life >= b) && !clean.contains(&life) && pending.contains(&seq) {
            last.insert((life, seq), i + 1);
        }
    }
    let mut ended: BTreeMap<(u64, Seq), usize> = BTreeMap::new();
    for &(after, life, seq) in &lives.ends {
        if last.contains_key(&(life, seq)) {
            let e = ended.entry((life, seq)).or_default();
            *e = (*e).max(after);
        }
    }
    // Cut: no end mark after its last attempt mark in that life.
    let cut = last
        .into_iter()
        .filter(|(key, at)| ended.get(key).is_none_or(|end| end < at));
    for ((_, seq), _) in cut {
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
            ..Lives::default()
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
            ..Lives::default()
        };
        assert_eq!(crashes(&lives, &set(&[5]))[&5], 2);
        assert!(
            crashes(&lives, &set(&[4])).is_empty(),
            "done items count nothing"
        );
    }

    #[test]
    fn an_attempt_that_ended_before_the_crash_is_not_cut_and_a_later_one_is() {
        // Life 1: 5's attempt failed and waited for its retry (ended), 6's
        // retry started after its end mark and was in flight. Life 2: 5
        // ended, then its retry started and ended again.
        let mut lives = Lives {
            attempts: vec![(1, 5), (1, 6)],
            ends: vec![(2, 1, 5), (2, 1, 6)],
            ..Lives::default()
        };
        lives.extend(Lives {
            attempts: vec![(1, 6), (2, 5)],
            ends: vec![(2, 2, 5)],
            ..Lives::default()
        });
        lives.extend(Lives {
            attempts: vec![(2, 5)],
            ends: vec![(1, 2, 5)],
            ..Lives::default()
        });
        let c = crashes(&lives, &set(&[5, 6]));
        assert_eq!(c.into_iter().collect::<Vec<_>>(), [(6, 1)]);
        // An end mark of another life, or before the attempt mark, ends
        // nothing.
        let lives = Lives {
            attempts: vec![(2, 5), (3, 5)],
            ends: vec![(0, 3, 5), (2, 2, 5)],
            ..Lives::default()
        };
        assert_eq!(crashes(&lives, &set(&[5]))[&5], 1);
    }
}
