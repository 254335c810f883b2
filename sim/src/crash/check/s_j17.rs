//! S-J17: an item is dead-lettered `poisoned` only after
//! `max_crash_attempts` crashes of the process cut its attempts, and a
//! healthy item is not poisoned by its poison neighbours: a crash in a
//! poison item's write counts against a healthy item beside it at most
//! once (before the healthy one is a suspect, written alone).

use std::collections::{BTreeMap, BTreeSet};

use super::Broken;

/// The crashes that could have counted against each item: `(all, caused
/// by another item's poison write)`, over the crashes during which it had
/// been handed to the sink in that life, or after which its attempt mark,
/// left by a group commit of that life that failed, was on disk (its
/// attempt never started; the journal cannot make that durable before
/// the commit's sync: crash seed 970612). An upper bound of what the
/// journal counts.
pub type Cuts = BTreeMap<u64, (u32, u32)>;

/// Every item of `poisoned` was cut `max` times, and one that is not a
/// poison item (`poison`) by at least `max - 1` crashes no poison write
/// caused.
pub fn poisoned_only_after_its_crashes(
    poisoned: &BTreeSet<u64>,
    poison: &BTreeSet<u64>,
    cuts: &Cuts,
    max: u32,
) -> Option<Broken> {
    for id in poisoned {
        let (all, by_poison) = cuts.get(id).copied().unwrap_or((0, 0));
        if all < max {
            return Some((
                "S-J17",
                format!(
                    "item #{id} was dead-lettered poisoned after {all} crashes cut its \
                     attempts, fewer than max_crash_attempts {max}"
                ),
            ));
        }
        if !poison.contains(id) && all - by_poison + 1 < max {
            return Some((
                "S-J17",
                format!(
                    "healthy item #{id} was dead-lettered poisoned: {by_poison} of the {all} \
                     crashes that cut it were poison items' writes beside it"
                ),
            ));
        }
    }
    None
}
