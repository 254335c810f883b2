//! Flush, settle and shutdown waits: which items each one waits for and
//! what became of them (SPEC S-A4, S-W10, S-B6).
//!
//! A wait covers the items pending when it was opened. Items carry a global
//! staging sequence, so "pending at the call" is "sequence below the wait's
//! bound": counting those among each settled slice gives an exact, per-call
//! answer even when flushes overlap and later items settle in between.

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

#[derive(Debug)]
struct Wait {
    #[allow(dead_code)] // kept for debugging output
    kind: WaitKind,
    /// Items with a staging sequence below this are waited for.
    bound: u64,
    /// Of those, how many are still pending.
    remaining: u64,
    report: Report,
    deadline: TimerKey,
}

#[derive(Debug, Default)]
pub(crate) struct Waits {
    next: u64,
    open: BTreeMap<WaitId, Wait>,
}

impl Waits {
    pub(crate) fn next_id(&mut self) -> WaitId {
        self.next += 1;
        WaitId(self.next)
    }

    /// Opens a wait for the `pending` items staged below `bound`. Returns
    /// whether it is already done (nothing pending).
    pub(crate) fn open(
        &mut self,
        id: WaitId,
        kind: WaitKind,
        bound: u64,
        pending: u64,
        deadline: TimerKey,
    ) -> bool {
        self.open.insert(
            id,
            Wait {
                kind,
                bound,
                remaining: pending,
                report: Report::default(),
                deadline,
            },
        );
        pending == 0
    }

    /// Counts a settled slice (sequences ascending; `how(i)` says what
    /// became of its i-th item) into every wait it concerns. Returns the
    /// waits it completed.
    pub(crate) fn settle(&mut self, seqs: &[u64], how: impl Fn(usize) -> Settled) -> Vec<WaitId> {
        let mut done = Vec::new();
        let Some(&first) = seqs.first() else {
            return done;
        };
        for (id, w) in self.open.iter_mut() {
            if w.remaining == 0 || first >= w.bound {
                continue;
            }
            let n = seqs.partition_point(|&s| s < w.bound);
            for i in 0..n {
                match how(i) {
                    Settled::Written => w.report.written += 1,
                    Settled::Dropped => w.report.dropped += 1,
                    Settled::Lost => w.report.lost += 1,
                }
            }
            w.remaining -= n as u64;
            if w.remaining == 0 {
                done.push(*id);
            }
        }
        done
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
