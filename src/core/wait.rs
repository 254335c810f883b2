//! Flush, settle and shutdown waits: which items each one waits for and
//! what became of them (S-A4, S-W10, S-B6).
//!
//! A wait covers the items pending when it was opened. Rather than stamp
//! every item with a sequence number (8 bytes an item) or snapshot every
//! tenant (O(T) per flush), each tenant is caught up lazily: a tenant not
//! caught up since a wait opened has all its pending items before that wait,
//! so the first time it is caught up afterwards it records a [`Cover`]
//! (how many of its oldest pending items the wait covers). A tenant's items
//! settle oldest first, so settling n items takes them off the front of
//! every cover. The answer is exact even when waits overlap and later items
//! settle in between; the cost is O(open waits) per catch-up.

use std::collections::BTreeMap;

use super::backlog::TimerKey;
use super::write::{Report, WaitId};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WaitKind {
    Flush,
    Settle,
    Shutdown,
}

/// How one item left the pending state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SettledAs {
    Written,
    Dropped,
    Lost,
    HandedOver,
}

/// One open wait's share of a tenant's backlog: the wait covers the
/// tenant's `items` oldest pending items (those pending when it opened,
/// less those settled since).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Cover {
    wait: WaitId,
    /// How many of the tenant's oldest pending items the wait still covers;
    /// settling n items takes min(n, items) off it.
    items: u64,
}

/// A tenant's view of the waits, kept in its state: which waits it has
/// caught up with and what each open one covers of its backlog.
#[derive(Clone, Debug, Default)]
pub(crate) struct WaitMarks {
    /// The id of the latest wait opened when the tenant was last caught up
    /// (see [`Waits::catch_up`]): every wait after it covers all of the
    /// tenant's pending items and has no [`Cover`] yet.
    caught_up_to: u64,
    /// The open waits that cover some of its pending items, oldest first.
    covers: Vec<Cover>,
    /// Of its oldest pending items, how many were staged before the latest
    /// flush or shutdown call: those skip linger (S-A3, S-A4), even after
    /// that call's deadline passed, since the caller asked for them to go.
    skip_linger: u64,
}

#[derive(Debug)]
struct Wait {
    /// Of the covered items, how many are still pending.
    remaining: u64,
    /// What became of the covered items settled so far.
    report: Report,
    deadline: TimerKey,
}

/// The open waits, and the ids handed out so far.
#[derive(Debug, Default)]
pub(crate) struct Waits {
    /// The last wait id handed out (flush, settle and shutdown alike).
    last_id: u64,
    /// The id of the latest flush or shutdown (not settle): a tenant not
    /// caught up since has all its pending items skip linger.
    last_hurrying: u64,
    open: BTreeMap<WaitId, Wait>,
}

impl Waits {
    pub(crate) fn next_id(&mut self) -> WaitId {
        self.last_id += 1;
        WaitId(self.last_id)
    }

    /// Opens a wait covering the `pending` items pending now. Returns
    /// whether it is already done (nothing pending).
    pub(crate) fn open(
        &mut self,
        id: WaitId,
        kind: WaitKind,
        pending: u64,
        deadline: TimerKey,
    ) -> bool {
        if kind != WaitKind::Settle {
            self.last_hurrying = id.0;
        }
        self.open.insert(
            id,
            Wait {
                remaining: pending,
                report: Report::default(),
                deadline,
            },
        );
        pending == 0
    }

    /// Catches a tenant with `pending` items up on the waits opened since
    /// it was last caught up: each covers all `pending` items. Call before
    /// its pending count changes. A new tenant starts from
    /// `WaitMarks::default()`: with nothing pending, catching up adds nothing.
    pub(crate) fn catch_up(&self, marks: &mut WaitMarks, pending: u64) {
        if marks.caught_up_to == self.last_id {
            return;
        }
        if marks.caught_up_to < self.last_hurrying {
            marks.skip_linger = pending;
        }
        if pending > 0 {
            // Every open wait still waits for something: one whose items
            // all settled was answered (and closed) in the same input.
            for (id, _) in self.open.range(WaitId(marks.caught_up_to + 1)..) {
                marks.covers.push(Cover {
                    wait: *id,
                    items: pending,
                });
            }
        }
        marks.caught_up_to = self.last_id;
    }

    /// Every pending item settled at once, all `settled_as` (a shutdown
    /// deadline or an abandon gives everything up, S-W9, S-A7): each open
    /// wait is owed every item it still waits for. O(open waits): no
    /// tenant is caught up or visited, and the tenants' covers of these
    /// waits count nothing more (a closed wait's cover is skipped).
    /// Returns the waits it completed, in id order.
    pub(crate) fn count_all_done(&mut self, settled_as: SettledAs) -> Vec<WaitId> {
        let mut done = Vec::new();
        for (id, w) in &mut self.open {
            let report = &mut w.report;
            let to = match settled_as {
                SettledAs::Written => &mut report.written,
                SettledAs::Dropped => &mut report.dropped,
                SettledAs::Lost => &mut report.lost,
                SettledAs::HandedOver => &mut report.handed_over,
            };
            *to += w.remaining;
            w.remaining = 0;
            done.push(*id);
        }
        done
    }

    /// The tenant's `n` oldest pending items settled (`how(i)` says what
    /// became of the i-th): counts them into the waits that cover them.
    /// The tenant must have been caught up. Returns the waits it completed.
    pub(crate) fn count_done(
        &mut self,
        marks: &mut WaitMarks,
        n: usize,
        how: impl Fn(usize) -> SettledAs,
    ) -> Vec<WaitId> {
        let mut done = Vec::new();
        for c in &mut marks.covers {
            let Some(w) = self.open.get_mut(&c.wait) else {
                // Answered at its deadline: nothing left to count.
                c.items = 0;
                continue;
            };
            let covered = c.items.min(n as u64);
            for i in 0..covered as usize {
                match how(i) {
                    SettledAs::Written => w.report.written += 1,
                    SettledAs::Dropped => w.report.dropped += 1,
                    SettledAs::Lost => w.report.lost += 1,
                    SettledAs::HandedOver => w.report.handed_over += 1,
                }
            }
            c.items -= covered;
            w.remaining -= covered;
            // An open wait has something left, so reaching zero means this
            // slice settled its last item.
            if w.remaining == 0 {
                done.push(c.wait);
            }
        }
        marks.covers.retain(|c| c.items > 0);
        super::shrink::vec(&mut marks.covers);
        marks.skip_linger = marks.skip_linger.saturating_sub(n as u64);
        done
    }

    /// Whether the tenant (caught up) has items staged before a flush or
    /// shutdown call: those skip linger (S-A3, S-A4).
    pub(crate) fn skips_linger(&self, marks: &WaitMarks) -> bool {
        marks.skip_linger > 0
    }

    /// Closes a wait whose items are settled; returns its report and the
    /// key of its deadline timer.
    pub(crate) fn take(&mut self, id: WaitId) -> Option<(Report, TimerKey)> {
        let w = self.open.remove(&id)?;
        let report = Report {
            pending: w.remaining,
            ..w.report
        };
        Some((report, w.deadline))
    }

    /// The deadline of a flush or settle passed: close it with what it has.
    pub(crate) fn expire(&mut self, id: WaitId) -> Option<Report> {
        self.mark_deadline_passed(id);
        self.take(id).map(|(report, _)| report)
    }

    pub(crate) fn mark_deadline_passed(&mut self, id: WaitId) {
        if let Some(w) = self.open.get_mut(&id) {
            w.report.deadline_passed = true;
        }
    }

    pub(crate) fn deadline_key(&self, id: WaitId) -> Option<TimerKey> {
        self.open.get(&id).map(|w| w.deadline)
    }

    pub(crate) fn set_deadline_key(&mut self, id: WaitId, key: TimerKey) {
        if let Some(w) = self.open.get_mut(&id) {
            w.deadline = key;
        }
    }
}
