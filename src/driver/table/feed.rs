//! Which row each of the engine's outcomes is about (S-T31). The relay
//! hands rows to the engine per tenant in delivery order, and the engine
//! ends a tenant's items in that order (one slice of a tenant at a time,
//! S-W5), so a tenant's queue of row ids, popped by each outcome's item
//! count, names the rows an outcome ends. Kept under the engine's lock,
//! pushed as rows go in and popped as the writer drains its events.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Mutex, PoisonError};

use tokio::sync::{mpsc, watch};

use crate::core::relay::{DeadReason, Done};
use crate::core::{DropReason, Event, LostReason};

/// A row's end, for the relay task.
pub(crate) type Ended = (i64, Done);

/// The row ids the engine holds, per tenant, and where their ends go.
pub(crate) struct Feed<K> {
    inner: Mutex<Inner<K>>,
    ends: mpsc::UnboundedSender<Ended>,
    /// Where the engine's life stands, for the relay task.
    pub(crate) phase: watch::Sender<Phase>,
}

/// Where the engine's life stands, as the relay task needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Taking items.
    Open,
    /// A shutdown began: nothing more goes into the engine.
    Closing,
    /// The engine ended everything it held.
    Closed,
}

impl Phase {
    /// Where `engine` stands.
    pub(crate) fn of<K: Ord + std::hash::Hash + Clone, I>(
        engine: &crate::core::Engine<K, I>,
    ) -> Phase {
        if engine.is_closed() {
            Phase::Closed
        } else if engine.is_shutting_down() {
            Phase::Closing
        } else {
            Phase::Open
        }
    }
}

struct Inner<K> {
    ids: BTreeMap<K, VecDeque<i64>>,
    /// The last attempt number seen failing, per tenant: a slice given up
    /// next goes to the dead-letter table with it.
    attempts: BTreeMap<K, u32>,
}

impl<K: Ord + Clone> Feed<K> {
    pub(crate) fn new(ends: mpsc::UnboundedSender<Ended>, phase: watch::Sender<Phase>) -> Self {
        Feed {
            inner: Mutex::new(Inner {
                ids: BTreeMap::new(),
                attempts: BTreeMap::new(),
            }),
            ends,
            phase,
        }
    }

    /// The row `id` of `tenant` went into the engine (under its lock).
    pub(crate) fn push(&self, tenant: &K, id: i64) {
        let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        g.ids.entry(tenant.clone()).or_default().push_back(id);
    }

    /// Under the engine's lock, with its events in order: sends each row's
    /// end; notes where the engine's life stands.
    pub(crate) fn on_events<'a, I: 'a>(
        &self,
        events: impl IntoIterator<Item = &'a Event<K, I>>,
        phase: Phase,
    ) where
        K: 'a,
    {
        let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        for event in events {
            if let Event::AttemptFailed {
                tenant, attempt, ..
            } = event
            {
                g.attempts.insert(tenant.clone(), *attempt);
                continue;
            }
            let Some((tenant, items, how)) = ends(event) else {
                continue;
            };
            let attempts = g.attempts.remove(tenant).unwrap_or(1);
            let how = match how {
                End::Written => Done::Written,
                End::HandedOver => Done::HandedOver,
                End::Dead(reason) => Done::GivenUp { reason, attempts },
            };
            let Some(queue) = g.ids.get_mut(tenant) else {
                continue;
            };
            for _ in 0..items {
                let Some(id) = queue.pop_front() else { break };
                // The relay task gone (its runtime shut down): the rows
                // stay in the table for the next start.
                let _ = self.ends.send((id, how));
            }
            if queue.is_empty() {
                g.ids.remove(tenant);
            }
        }
        drop(g);
        self.phase.send_if_modified(|p| {
            let changed = *p != phase;
            *p = phase;
            changed
        });
    }
}

enum End {
    Written,
    HandedOver,
    Dead(DeadReason),
}

/// The tenant, item count and end of an event that ends relayed items
/// (as the journal's done marks, S-J3, with the shutdown's ends handed
/// over instead of lost: the rows stay in the table, S-T33).
fn ends<K, I>(event: &Event<K, I>) -> Option<(&K, u64, End)> {
    match event {
        Event::Written { tenant, items, .. } => Some((tenant, *items as u64, End::Written)),
        Event::Dropped {
            tenant,
            items,
            reason: DropReason::SinkError,
            ..
        } => Some((tenant, *items, End::Dead(DeadReason::SinkError))),
        Event::Lost {
            tenant,
            items,
            reason,
            ..
        } => {
            let end = match reason {
                LostReason::Terminal => End::Dead(DeadReason::Terminal),
                LostReason::RetriesExhausted => End::Dead(DeadReason::RetriesExhausted),
                LostReason::Expired => End::Dead(DeadReason::Expired),
                LostReason::Deadline | LostReason::Abandoned | LostReason::JoinFailed => {
                    End::HandedOver
                }
                // Refused after the fence (the relay feeds nothing then), part
                // of a written slice, or a journal's.
                _ => return None,
            };
            Some((tenant, *items, end))
        }
        _ => None,
    }
}
