//! The fleet's end checks: S-FW1 (every committed row delivered once or
//! dead-lettered, never both), S-FW3 (per-tenant causal order across
//! hosts), and the drain (S-FW6).

use std::collections::{BTreeMap, BTreeSet};

use outbox::table::model::Model;
use outbox::table::Store;

use super::book::{Book, Fate};

/// The ids of the dead-letter table's rows.
fn dead(model: &Model) -> BTreeSet<i64> {
    super::now(model.store().dead_letters(u32::MAX))
        .unwrap_or_default()
        .into_iter()
        .map(|r| r.id)
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
        .all(|(id, _)| b.delivered.contains_key(id) || dead.contains(id))
}

/// The end checks, after the drain.
pub fn end(b: &mut Book, model: &Model) {
    let dead = dead(model);
    let mut problem = None;
    for (id, row) in &b.rows {
        let delivered = b.delivered.contains_key(id);
        match (row.fate, delivered, dead.contains(id)) {
            (Fate::Committed, true, true) => {
                problem = Some(format!("row {id} both delivered and dead-lettered"));
            }
            (Fate::Committed, false, false) => {
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
    if let Some(p) = problem {
        b.fail("S-FW1", p);
        return;
    }
    if let Some(p) = causal_order(b) {
        b.fail("S-FW3", p);
    }
}

/// S-FW3: of one tenant's rows, one whose transaction committed before
/// another's began is delivered first.
fn causal_order(b: &Book) -> Option<String> {
    let mut by_tenant: BTreeMap<u64, Vec<(u64, i64)>> = BTreeMap::new();
    for (id, &(seq, _, _)) in &b.delivered {
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
