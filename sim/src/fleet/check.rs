//! The fleet's end checks: S-FW1 (every committed row delivered once or
//! dead-lettered, never both), S-FW3 (per-tenant causal order across
//! hosts), and the drain (S-FW6).

use std::collections::BTreeMap;

use outbox::core::relay::{DeadReason, DEFAULT_MAX_CRASH_ATTEMPTS};
use outbox::table::model::Model;
use outbox::table::{DeadRow, Store};

use super::book::{Book, Fate};

/// The dead-letter table's rows, by id.
fn dead(model: &Model) -> BTreeMap<i64, DeadRow> {
    super::now(model.store().dead_letters(u32::MAX))
        .unwrap_or_default()
        .into_iter()
        .map(|r| (r.id, r))
        .collect()
}

/// Whether every committed row is delivered or dead-lettered and the
/// outbox table is empty.
pub fn drained(b: &Book, model: &Model) -> bool {
    if !model.rows().is_empty() {
        return false;
    }
    let dead = dead(model);
    b.rows
        .iter()
        .filter(|(_, r)| r.fate == Fate::Committed)
        .all(|(id, _)| b.delivered.contains_key(id) || dead.contains_key(id))
}

/// The end checks, after the drain.
pub fn end(b: &mut Book, model: &Model) {
    let dead = dead(model);
    let mut problem = None;
    let (mut repeats_refused, mut poisoned_after_write) = (0, 0);
    for (id, row) in &b.rows {
        let delivered = b.delivered.contains_key(id);
        match (row.fate, delivered, dead.get(id)) {
            (Fate::Committed, true, Some(_)) if refused_repeat(b, *id) => {
                repeats_refused += 1;
            }
            (Fate::Committed, true, Some(d)) if poisoned_after_unknown_write(b, *id, d) => {
                poisoned_after_write += 1;
            }
            (Fate::Committed, true, Some(d)) => {
                problem = Some(format!(
                    "row {id} both delivered and dead-lettered ({d:?}; accepted last at \
                     (seq, epoch) {:?}, moved at seq {:?})",
                    b.last_accept.get(id),
                    b.dead_moved.get(id)
                ));
            }
            (Fate::Committed, false, None) => {
                problem = Some(format!(
                    "committed row {id} neither delivered nor dead-lettered"
                ));
            }
            (Fate::Open, _, _) => problem = Some(format!("row {id}'s transaction never ended")),
            _ => {}
        }
        if problem.is_some() {
            break;
        }
    }
    *b.faults.entry("refused_repeat").or_default() += repeats_refused;
    *b.faults.entry("poisoned_after_write").or_default() += poisoned_after_write;
    if problem.is_none() {
        problem = dead_cause(b, model, &dead);
    }
    if let Some(p) = problem {
        b.fail("S-FW1", p);
        return;
    }
    if let Some(p) = causal_order(b) {
        b.fail("S-FW3", p);
    }
}

/// S-FW10: after the settle the store holds a small constant (the
/// outbox table empty, at most one session, terminated session, listener
/// and membership row per host, at most one in-flight record per
/// partition, no crash count); the dead-letter table keeps its rows.
pub fn settled(b: &mut Book, model: &Model, hosts: usize, partitions: u32) {
    let f = model.footprint();
    let p = partitions as usize;
    let over = [
        ("rows", f.rows, 0),
        ("sessions", f.sessions, hosts),
        ("terminated sessions", f.terminated, hosts),
        ("listeners", f.listeners, hosts),
        ("in-flight records", f.in_flight, p),
        ("crash counts", f.crash_counts, 0),
        ("membership rows", f.members, hosts),
    ]
    .into_iter()
    .find(|(_, n, bound)| n > bound);
    if let Some((what, n, bound)) = over {
        b.fail(
            "S-FW10",
            format!("after the settle the store holds {n} {what} (bound {bound}): {f:?}"),
        );
    }
}

/// S-FW1's one exception to "never both": the datastore refused
/// (terminally, a whole write, S-A5) a repeat of row `id` after it had
/// accepted the row (a new owner re-reads rows whose removal never took
/// effect, and a refused write is dead-lettered whole).
fn refused_repeat(b: &Book, id: i64) -> bool {
    match (b.rejected.get(&id), b.delivered.get(&id)) {
        (Some(&refused), Some(&(accepted, _, _))) => refused > accepted,
        _ => false,
    }
}

/// S-FW1's second exception: row `id` was dead-lettered `poisoned`
/// (letter `d`) after the datastore had accepted it, where the owner
/// that moved it could not know: its crash count reached
/// `max_crash_attempts` (each charged attempt one whose owner vanished
/// or lost its lease with the outcome unknown, S-T17), and every
/// acceptance came before the move and under an earlier epoch than the
/// move's (an earlier owner's attempt, never the mover's own).
fn poisoned_after_unknown_write(b: &Book, id: i64, d: &DeadRow) -> bool {
    let poisoned = d.reason == DeadReason::Poisoned.as_str();
    let (Some(&(accepted, epoch)), Some(&moved)) = (b.last_accept.get(&id), b.dead_moved.get(&id))
    else {
        return false;
    };
    poisoned && d.crashes >= DEFAULT_MAX_CRASH_ATTEMPTS && epoch < d.epoch && accepted < moved
}

/// S-FW1's cause: a dead letter is the datastore's refusal of a write
/// the row was in, or the relay's crash count reaching
/// `max_crash_attempts` (poisoned); nothing else in the fleet gives a row
/// up.
fn dead_cause(b: &Book, model: &Model, dead: &BTreeMap<i64, DeadRow>) -> Option<String> {
    for (id, d) in dead {
        let reason = model.dead_reason(*id);
        let caused = match reason {
            Some(DeadReason::Terminal) => b.rejected.contains_key(id),
            Some(DeadReason::Poisoned) => d.crashes >= DEFAULT_MAX_CRASH_ATTEMPTS,
            _ => false,
        };
        if !caused {
            return Some(format!(
                "row {id} dead-lettered as {reason:?} without that cause ({d:?})"
            ));
        }
    }
    None
}

/// S-FW3: of one tenant's rows, one whose transaction committed before
/// another's began is delivered first; a row accepted only after the
/// datastore refused it (given up, its dead-letter move lost) is exempt.
fn causal_order(b: &Book) -> Option<String> {
    let mut by_tenant: BTreeMap<u64, Vec<(u64, i64)>> = BTreeMap::new();
    for (id, &(seq, _, _)) in &b.delivered {
        if b.rejected.get(id).is_some_and(|&refused| refused < seq) {
            continue;
        }
        if let Some(row) = b.rows.get(id) {
            by_tenant.entry(row.tenant).or_default().push((seq, *id));
        }
    }
    for (tenant, mut rows) in by_tenant {
        rows.sort_unstable();
        // Walking delivery order backwards: the earliest commit delivered
        // after each row.
        let mut later: Option<(u64, i64)> = None;
        for &(_, id) in rows.iter().rev() {
            let row = &b.rows[&id];
            if let Some((commit, other)) = later {
                if commit < row.begin {
                    return Some(format!(
                        "tenant {tenant}: row {other} committed before row {id}'s transaction \
                         began, yet was delivered after it"
                    ));
                }
            }
            if later.is_none_or(|(c, _)| row.commit < c) {
                later = Some((row.commit, id));
            }
        }
    }
    None
}
