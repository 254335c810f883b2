//! D4: every item recovered from the journal is counted; a record that
//! cannot be read back is counted lost under `journal_unreadable`; no
//! readable item vanishes uncounted.

use outbox::core::Counters;

use super::Broken;

/// The items of earlier lives the sink was handed in this life came from
/// the journal's recovery: at most `recovered` of them.
pub fn recovered_counted(c: &Counters, replayed: usize, life: u32) -> Option<Broken> {
    (replayed as u64 > c.recovered).then(|| {
        (
            "D4",
            format!(
                "life {life}: the sink was handed {replayed} items staged in earlier lives, \
                 the outbox counts {} recovered",
                c.recovered
            ),
        )
    })
}

/// After the final settle, every item this life took in (staged or
/// recovered) is written, lost or dropped, and none is pending.
pub fn settled_accounting(c: &Counters, life: u32) -> Option<Broken> {
    let out = c.written + c.lost_total() + c.dropped_total();
    (c.pending != 0 || c.staged + c.recovered != out).then(|| {
        (
            "D4",
            format!(
                "life {life}: after the final settle staged {} + recovered {} != written {} + \
                 lost {} + dropped {} (pending {})",
                c.staged,
                c.recovered,
                c.written,
                c.lost_total(),
                c.dropped_total(),
                c.pending
            ),
        )
    })
}

/// A recovery counts no item that never was: what it stages again plus
/// what it counts unreadable (the outbox's `recovered`, which holds both)
/// is at most the items accepted in earlier lives, each journaled under
/// one sequence number at most.
pub fn recovery_bounded(recovered: u64, accepted_before: u64, life: u32) -> Option<Broken> {
    (recovered > accepted_before).then(|| {
        (
            "D4",
            format!(
                "life {life}: recovery counts {recovered} items (recovered or unreadable), \
                 more than the {accepted_before} ever accepted before it"
            ),
        )
    })
}
