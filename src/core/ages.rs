//! How old items were when they left the engine (S-R7): one sample per
//! pending item as it settles, written or given up, by outcome. Kept only
//! while items are stamped (a `max_item_age`, S-R3), and then exact: a
//! tenant's pending items settle oldest first (S-W5), so a queue of their
//! staging times, popped as they settle, names each one's age.

use std::time::Duration;

use super::accounting::{DropReason, LostReason};
use super::wait::SettledAs;

/// How a pending item left the engine, for its age sample (S-R7).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ItemOutcome {
    /// Written by a write that committed.
    Written,
    /// Given up, counted lost under this reason.
    Lost(LostReason),
    /// Given up, counted dropped under this reason (after its staging:
    /// `sink_error` under the `drop` error policy).
    Dropped(DropReason),
    /// Left for another instance: the outbox table still holds it (S-E7).
    HandedOver,
}

impl ItemOutcome {
    /// The `outcome` label of `outbox_item_age_seconds`: `written`,
    /// `handed_over`, or the loss's or drop's reason label.
    pub const fn as_str(self) -> &'static str {
        match self {
            ItemOutcome::Written => "written",
            ItemOutcome::HandedOver => "handed_over",
            ItemOutcome::Lost(r) => r.as_str(),
            ItemOutcome::Dropped(r) => r.as_str(),
        }
    }

    /// Every label `as_str` gives, each once: `written`, `handed_over`,
    /// then every [`LostReason`] and every [`DropReason`].
    pub fn all() -> impl Iterator<Item = ItemOutcome> {
        [ItemOutcome::Written, ItemOutcome::HandedOver]
            .into_iter()
            .chain(LostReason::ALL.into_iter().map(ItemOutcome::Lost))
            .chain(DropReason::ALL.into_iter().map(ItemOutcome::Dropped))
    }

    /// Its place in [`all`](Self::all).
    pub fn index(self) -> usize {
        match self {
            ItemOutcome::Written => 0,
            ItemOutcome::HandedOver => 1,
            ItemOutcome::Lost(r) => 2 + r.index(),
            ItemOutcome::Dropped(r) => 2 + LostReason::ALL.len() + r.index(),
        }
    }

    /// How many outcomes [`all`](Self::all) gives.
    pub const COUNT: usize = 2 + LostReason::ALL.len() + DropReason::ALL.len();

    pub(crate) fn settled_as(self) -> SettledAs {
        match self {
            ItemOutcome::Written => SettledAs::Written,
            ItemOutcome::Lost(_) => SettledAs::Lost,
            ItemOutcome::Dropped(_) => SettledAs::Dropped,
            ItemOutcome::HandedOver => SettledAs::HandedOver,
        }
    }
}

/// One item's age as it settled (S-R7).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ItemAge {
    /// How it left.
    pub outcome: ItemOutcome,
    /// From its staging time (for a durable item, its age at recovery or
    /// relay included, S-W22) to the engine's `now` as it settled.
    pub age: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outcomes_index_is_its_place_in_all_and_labels_are_distinct() {
        let all: Vec<ItemOutcome> = ItemOutcome::all().collect();
        assert_eq!(all.len(), ItemOutcome::COUNT);
        for (ix, o) in all.iter().enumerate() {
            assert_eq!(o.index(), ix, "{o:?}");
        }
        let labels: std::collections::BTreeSet<&str> = all.iter().map(|o| o.as_str()).collect();
        assert_eq!(labels.len(), all.len());
    }
}
