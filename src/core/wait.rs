//! Flush, settle and shutdown waits: which items each one waits for and
//! what became of them (S-A4, S-W10, S-B6).
//!
//! A wait covers the items pending when it was opened. Rather than stamp
//! every item with a sequence number (8 bytes an item) or snapshot every
//! tenant (O(T) per flush), each tenant is caught up lazily: a tenant not
//! touched since a wait opened has all its pending items before that wait,
//! so the first time it is touched afterwards it records a [`Mark`] (how
//! many of its oldest pending items the wait covers). A tenant's items
//! settle oldest first, so settling n items takes them off the front of
//! every mark. The answer is exact even when waits overlap and later items
//! settle in between; the cost is O(open waits) per touch.

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
pub(crate) enum Settled {
    Written,
    Dropped,
    Lost,
}

/// Of a tenant's oldest pending items, how many an open wait covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Mark {
    wait: WaitId,
    before: u64,
}

/// A tenant's view of the waits: the latest wait it has caught up with and
/// its marks. Lives in the tenant's state.
#[derive(Clone, Debug, Default)]
pub(crate) struct Seen {
    latest: u64,
    marks: Vec<Mark>,
    /// Of its oldest pending items, how many were staged before the latest
    /// flush or shutdown call: those skip linger (S-A3, S-A4), even after
    /// that call's deadline passed, since the caller asked for them to go.
    hurried: u64,
}

#[derive(Debug)]
struct Wait {
    /// Of the covered items, how many are still pending.
    remaining: u64,
    report: Report,
    deadline: TimerKey,
}

#[derive(Debug, Default)]
pub(crate) struct Waits {
    latest: u64,
    /// The latest flush or shutdown (not settle).
    latest_hurry: u64,
    open: BTreeMap<WaitId, Wait>,
}

impl Waits {
    pub(crate) fn next_id(&mut self) -> WaitId {
        self.latest += 1;
        WaitId(self.latest)
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
            self.latest_hurry = id.0;
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
    /// it was last touched. Call before its pending count changes. A new
    /// tenant starts from `Seen::default()`: with nothing pending, catching
    /// up adds nothing.
    pub(crate) fn touch(&self, seen: &mut Seen, pending: u64) {
        if seen.latest == self.latest {
            return;
        }
        if seen.latest < self.latest_hurry {
            seen.hurried = pending;
        }
        if pending > 0 {
            // Every open wait still waits for something: one whose items
            // all settled was answered (and closed) in the same input.
            for (id, _) in self.open.range(WaitId(seen.latest + 1)..) {
                seen.marks.push(Mark {
                    wait: *id,
                    before: pending,
                });
            }
        }
        seen.latest = self.latest;
    }

    /// The tenant's `n` oldest pending items settled (`how(i)` says what
    /// became of the i-th): counts them into the waits that cover them.
    /// The tenant must have been touched. Returns the waits it completed.
    pub(crate) fn settle(
        &mut self,
        seen: &mut Seen,
        n: usize,
        how: impl Fn(usize) -> Settled,
    ) -> Vec<WaitId> {
        let mut done = Vec::new();
        for m in &mut seen.marks {
            let Some(w) = self.open.get_mut(&m.wait) else {
                m.before = 0;
                continue;
            };
            let covered = m.before.min(n as u64);
            for i in 0..covered as usize {
                match how(i) {
                    Settled::Written => w.report.written += 1,
                    Settled::Dropped => w.report.dropped += 1,
                    Settled::Lost => w.report.lost += 1,
                }
            }
            m.before -= covered;
            w.remaining -= covered;
            // An open wait has something left, so reaching zero means this
            // slice settled its last item.
            if w.remaining == 0 {
                done.push(m.wait);
            }
        }
        seen.marks.retain(|m| m.before > 0);
        seen.hurried = seen.hurried.saturating_sub(n as u64);
        done
    }

    /// Whether the tenant (touched) has items staged before a flush or
    /// shutdown call: those skip linger (S-A3, S-A4).
    pub(crate) fn hurried(&self, seen: &Seen) -> bool {
        seen.hurried > 0
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
