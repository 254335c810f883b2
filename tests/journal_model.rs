//! The journal's bookkeeping against a model, through random stages,
//! done marks, group commits, disk faults, resumes and crashes (D1-D4, D6,
//! S-J2, S-J3, S-J5): after every crash the recovery brings back exactly
//! what the model says must or may come back, per tenant in order; once
//! nothing is pending and the marks are on disk, one segment is left.
//! Failures are kept in `proptest-regressions/journal_model.txt` and
//! replayed first.
#![cfg(feature = "journal")]

use std::collections::BTreeMap;
use std::io;

use outbox::core::journal::Limits;
use outbox::journal::format::EncodedItem;
use outbox::journal::{Codec, MemStorage, Postcard};
use proptest::prelude::*;
use support::hand::Hand;

mod support;

type Tenant = u8;

#[derive(Clone, Debug)]
enum Op {
    Stage(Tenant),
    Done(Tenant, u8),
    Commit,
    Fail(bool),
    Crash,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..4).prop_map(Op::Stage),
        3 => (0u8..4, 1u8..4).prop_map(|(t, n)| Op::Done(t, n)),
        3 => Just(Op::Commit),
        1 => any::<bool>().prop_map(Op::Fail),
        1 => Just(Op::Crash),
    ]
}

/// Where an item stands, as the model sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    /// Pending: its record is in the buffer (`false`), on disk (`true`),
    /// or nowhere and never will be (`None`: a failed commit or staged
    /// while down).
    Pending(Option<bool>),
    /// Done: its mark is waiting, taken, or on disk.
    Done { mark_on_disk: bool },
}

struct World {
    disk: MemStorage,
    j: Hand<Tenant, MemStorage>,
    /// Items per tenant in staging order, pending first (the ledger's
    /// order): id and fate.
    pending: BTreeMap<Tenant, Vec<u64>>,
    fate: BTreeMap<u64, (Tenant, Fate)>,
    /// Marks handed to the ledger, not yet taken by a commit.
    marks_waiting: Vec<u64>,
    /// Marks of failed commits, redone by the resume.
    marks_redo: Vec<u64>,
    next_id: u64,
}

const LIMITS: Limits = Limits {
    segment_bytes: 120,
    max_bytes: None,
};

impl World {
    fn open(disk: MemStorage) -> (World, Vec<(Tenant, u64)>) {
        let (j, rec) = Hand::open(disk.clone(), &Postcard, LIMITS).expect("recovers");
        assert_eq!(rec.report.unreadable, 0, "no damage in this model");
        let items: Vec<(Tenant, u64)> = rec.items.iter().map(|(_, t, i)| (*t, *i)).collect();
        let mut w = World {
            disk,
            j,
            pending: BTreeMap::new(),
            fate: BTreeMap::new(),
            marks_waiting: Vec::new(),
            marks_redo: Vec::new(),
            next_id: items.iter().map(|x| x.1 + 1).max().unwrap_or(0),
        };
        for &(t, id) in &items {
            w.pending.entry(t).or_default().push(id);
            w.fate.insert(id, (t, Fate::Pending(Some(true))));
        }
        (w, items)
    }

    fn commit(&mut self) {
        let resumed = self.j.is_down();
        let taken: Vec<u64> = if resumed {
            self.marks_redo.clone()
        } else {
            std::mem::take(&mut self.marks_waiting)
        };
        let ok = self.j.round().is_ok();
        for (_, fate) in self.fate.values_mut() {
            match fate {
                Fate::Pending(Some(false)) if !resumed => {
                    *fate = Fate::Pending(if ok { Some(true) } else { None })
                }
                Fate::Pending(Some(false)) if !ok => *fate = Fate::Pending(None),
                _ => {}
            }
        }
        if !ok {
            // Every pending item not on disk never will be (S-J5).
            for (_, fate) in self.fate.values_mut() {
                if *fate == Fate::Pending(Some(false)) {
                    *fate = Fate::Pending(None);
                }
            }
        }
        if ok {
            if resumed {
                self.marks_redo.clear();
            }
            for id in taken {
                if let Some((_, Fate::Done { mark_on_disk })) = self.fate.get_mut(&id) {
                    *mark_on_disk = true;
                }
            }
        } else if !resumed {
            self.marks_redo.extend(taken);
        }
    }

    fn step(&mut self, op: &Op) -> Option<MemStorage> {
        match *op {
            Op::Stage(t) => {
                let id = self.next_id;
                self.next_id += 1;
                let record = EncodedItem::new(
                    |b| Codec::<Tenant, u64>::encode_tenant(&Postcard, &t, b),
                    |b| Codec::<Tenant, u64>::encode_item(&Postcard, &id, b),
                )
                .map_err(|_| ())
                .unwrap();
                let journaled = self.j.append(t, &record);
                self.pending.entry(t).or_default().push(id);
                self.fate
                    .insert(id, (t, Fate::Pending(journaled.then_some(false))));
            }
            Op::Done(t, n) => {
                let queue = self.pending.entry(t).or_default();
                let n = (n as usize).min(queue.len());
                self.j.done(&t, n as u64);
                for id in queue.drain(..n) {
                    let (_, fate) = self.fate.get_mut(&id).unwrap();
                    if matches!(fate, Fate::Pending(Some(_))) {
                        self.marks_waiting.push(id);
                    }
                    *fate = Fate::Done {
                        mark_on_disk: false,
                    };
                }
            }
            Op::Commit => self.commit(),
            Op::Fail(on) => self.disk.fail(on.then_some(io::ErrorKind::StorageFull)),
            Op::Crash => return Some(self.disk.clone()),
        }
        None
    }
}

/// Checks one recovery against the model before the crash.
fn check(before: &World, recovered: &[(Tenant, u64)]) -> Result<(), TestCaseError> {
    let mut last: BTreeMap<Tenant, u64> = BTreeMap::new();
    for &(t, id) in recovered {
        // D3: staged, under its tenant.
        let Some((tenant, fate)) = before.fate.get(&id) else {
            return Err(TestCaseError::fail(format!(
                "D3: item {id} was never staged"
            )));
        };
        prop_assert_eq!(*tenant, t, "D3: item {} under another tenant", id);
        // D2: per tenant in staging order.
        if let Some(prev) = last.insert(t, id) {
            prop_assert!(prev < id, "D2: tenant {t}: {prev} then {id}");
        }
        // Done with its mark on disk: never staged again (S-J3).
        prop_assert!(
            *fate != Fate::Done { mark_on_disk: true },
            "item {} is done and marked, yet recovered",
            id
        );
        prop_assert!(
            *fate != Fate::Pending(None),
            "item {} was never on disk, yet recovered",
            id
        );
    }
    // D1: every pending item on disk comes back.
    for (id, (_, fate)) in &before.fate {
        if *fate == Fate::Pending(Some(true)) {
            prop_assert!(
                recovered.iter().any(|x| x.1 == *id),
                "D1: item {} was on disk and pending, and is not recovered",
                id
            );
        }
    }
    Ok(())
}

/// Cases per run (`OUTBOX_MODEL_CASES`, default 300) from a fixed seed
/// (`OUTBOX_MODEL_SEED` explores others), like `tests/model.rs`.
fn config() -> ProptestConfig {
    let var = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    ProptestConfig {
        cases: var("OUTBOX_MODEL_CASES").map_or(300, |n| n.min(u64::from(u32::MAX)) as u32),
        rng_seed: proptest::test_runner::RngSeed::Fixed(
            var("OUTBOX_MODEL_SEED").unwrap_or(0x0b0c_5eed),
        ),
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::Direct(
                "proptest-regressions/journal_model.txt",
            ),
        )),
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn recovery_brings_back_what_the_model_says(ops in prop::collection::vec(op(), 1..200)) {
        let (mut w, _) = World::open(MemStorage::new());
        w.commit();
        for op in &ops {
            if let Some(disk) = w.step(op) {
                disk.fail(None);
                // The crashed process lets its lock go.
                w.j = Hand::open::<u64, _>(MemStorage::new(), &Postcard, LIMITS)
                    .expect("a fresh disk")
                    .0;
                disk.crash();
                let (next, recovered) = World::open(disk);
                check(&w, &recovered)?;
                w = next;
                w.commit();
            }
        }
        // D6: every item done, commit twice (marks, then deletions).
        w.disk.fail(None);
        if w.j.is_down() {
            w.commit();
        }
        for t in 0..4 {
            w.step(&Op::Done(t, u8::MAX));
        }
        w.commit();
        w.commit();
        let segments = w.disk.files().keys().filter(|n| n.starts_with("segment-")).count();
        prop_assert!(segments <= 2, "D6: {segments} segments left with nothing pending");
        prop_assert_eq!(w.j.machine.ledger().live(), 0);
        let disk = w.disk.clone();
        drop(w);
        disk.crash();
        let (_, recovered) = World::open(disk);
        prop_assert!(recovered.is_empty(), "nothing pending, nothing recovered: {recovered:?}");
    }
}
