//! In-flight records (S-T17): the rows a page read delivers are recorded
//! in one store call, one record per partition, before any of them goes
//! to the engine; each record lives until the last of its rows is settled
//! (in a removal, or no longer this relay's), and is dropped in the
//! removal that settles it. Rows wait here, in page order, until their
//! page's records are durable, so a tenant's rows reach the engine in
//! delivery order whatever order the answers come in (S-T5).

use std::collections::{BTreeMap, VecDeque};

use super::types::{InFlight, OpId, Row};

/// The rows of one page, waiting for their records.
#[derive(Debug)]
struct Batch {
    op: OpId,
    rows: Vec<Row>,
    durable: bool,
}

/// A record written (or being written), by its first row.
#[derive(Debug)]
struct Live {
    partition: u32,
    /// Its rows not yet settled.
    left: usize,
}

#[derive(Debug, Default)]
pub(crate) struct Records {
    /// Rows taken from the page being read, not yet recorded.
    staged: Vec<Row>,
    batches: VecDeque<Batch>,
    live: BTreeMap<i64, Live>,
}

impl Records {
    /// Holds `row` for the page's record.
    pub(crate) fn stage(&mut self, row: Row) {
        self.staged.push(row);
    }

    /// The rows staged since the last call, as one record per partition
    /// (in partition order, each in delivery order), now waiting for `op`.
    /// Each row's record is its partition's first row. Empty if nothing
    /// was staged.
    pub(crate) fn open(&mut self, op: OpId) -> Vec<InFlight> {
        let rows = std::mem::take(&mut self.staged);
        let mut by_partition: BTreeMap<u32, Vec<i64>> = BTreeMap::new();
        for row in &rows {
            by_partition.entry(row.partition).or_default().push(row.id);
        }
        let records: Vec<InFlight> = by_partition
            .into_iter()
            .map(|(partition, ids)| InFlight { partition, ids })
            .collect();
        for r in &records {
            if let Some(first) = r.first_id() {
                // A row is delivered once per epoch of its partition, so a
                // first row names one live record; a repeat adds to it.
                let live = self.live.entry(first).or_insert(Live {
                    partition: r.partition,
                    left: 0,
                });
                live.left += r.ids.len();
            }
        }
        if !rows.is_empty() {
            self.batches.push_back(Batch {
                op,
                rows,
                durable: false,
            });
        }
        records
    }

    /// A record of the one row `id` (a suspect's retry, S-T18), with no
    /// rows to release: they are in the engine already.
    pub(crate) fn open_alone(&mut self, partition: u32, id: i64) {
        let live = self.live.entry(id).or_insert(Live { partition, left: 0 });
        live.left += 1;
    }

    /// Whether the record `first` was settled and its drop is not yet
    /// answered.
    pub(crate) fn dropping(&self, first: i64) -> bool {
        self.live.get(&first).is_some_and(|l| l.left == 0)
    }

    /// The record (its first row) of each row of `records`.
    pub(crate) fn keys(records: &[InFlight]) -> impl Iterator<Item = (i64, i64)> + '_ {
        records.iter().flat_map(|r| {
            let first = r.first_id().unwrap_or_default();
            r.ids.iter().map(move |&id| (id, first))
        })
    }

    /// The records of `op` are durable: the rows now due for the engine,
    /// in page order (a later page's wait behind an earlier one's).
    pub(crate) fn answered(&mut self, op: OpId) -> Vec<Row> {
        if let Some(b) = self.batches.iter_mut().find(|b| b.op == op) {
            b.durable = true;
        }
        let mut out = Vec::new();
        while self.batches.front().is_some_and(|b| b.durable) {
            if let Some(b) = self.batches.pop_front() {
                out.extend(b.rows);
            }
        }
        out
    }

    /// The call `op` goes again as `fresh`.
    pub(crate) fn renamed(&mut self, op: OpId, fresh: OpId) {
        if let Some(b) = self.batches.iter_mut().find(|b| b.op == op) {
            b.op = fresh;
        }
    }

    /// One row of the record `first` is done: `Some(partition)` when it
    /// was its last (the record is to be dropped).
    pub(crate) fn row_done(&mut self, first: i64) -> Option<u32> {
        let live = self.live.get_mut(&first)?;
        live.left = live.left.saturating_sub(1);
        (live.left == 0).then_some(live.partition)
    }

    /// The records `firsts` were dropped from the store.
    pub(crate) fn dropped(&mut self, firsts: &[i64]) {
        for first in firsts {
            if self.live.get(first).is_some_and(|l| l.left == 0) {
                self.live.remove(first);
            }
        }
    }

    /// The rows of `partition` still waiting for their records (never
    /// handed to the engine).
    pub(crate) fn waiting(&self, partition: u32) -> std::collections::BTreeSet<i64> {
        self.staged
            .iter()
            .chain(self.batches.iter().flat_map(|b| b.rows.iter()))
            .filter(|r| r.partition == partition)
            .map(|r| r.id)
            .collect()
    }

    /// Forgets `partition` (lost): its records are the next owner's to
    /// count, its waiting rows no longer this relay's.
    pub(crate) fn forget_partition(&mut self, partition: u32) {
        self.live.retain(|_, l| l.partition != partition);
        self.staged.retain(|r| r.partition != partition);
        for b in &mut self.batches {
            b.rows.retain(|r| r.partition != partition);
        }
        self.batches.retain(|b| !b.rows.is_empty());
    }

    /// Whether no record is live: a crash now would implicate no row.
    pub(crate) fn idle(&self) -> bool {
        self.live.is_empty()
    }

    /// Records live (for tests and memory checks).
    pub(crate) fn live(&self) -> usize {
        self.live.len()
    }
}
