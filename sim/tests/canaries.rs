//! The crash world's canaries (issue 13): with the journal deliberately
//! broken, a campaign of at most 1,000 crash seeds must fail, by the rule
//! the break offends. Behind the feature `canary` (the switches read
//! `OUTBOX_CANARY`); run them with
//! `cargo test --release -p outbox-sim --features canary --test canaries`.
#![cfg(feature = "canary")]

use outbox_sim::{run_seed, RunOptions, WorldKind};

/// The first seed in `0..1000` whose run breaks one of `rules` with the
/// canary `name` on.
fn first_failing_seed(name: &str, rules: &[&str]) -> Option<(u64, String)> {
    // One test sets the variable at a time: the canaries share one test.
    std::env::set_var("OUTBOX_CANARY", name);
    let found = (0..1_000).find_map(|seed| {
        let r = run_seed(WorldKind::Crash, seed, &RunOptions::default(), false).unwrap();
        r.failure
            .filter(|f| rules.contains(&f.rule))
            .map(|f| (seed, f.to_string()))
    });
    std::env::remove_var("OUTBOX_CANARY");
    found
}

#[test]
fn every_canary_fails_a_campaign() {
    let canaries: [(&str, &[&str]); 4] = [
        // Nothing is durable: synced items vanish (D1), or a segment whose
        // header never reached the disk makes the journal unopenable (D5).
        ("no_fsync", &["D1", "D5"]),
        // A mark before its write: a crash while the write is retried
        // (the datastore's errors) loses the item (D1), or the marks no
        // longer match the items (D4, D5).
        ("early_mark", &["D1", "D4", "D5"]),
        // A rotten record decodes into an item never staged (D3), a
        // rotten item handed to the sink or sequence numbers no item had
        // (D4), or a mark for items it never marked (D1).
        ("no_checksum", &["D1", "D2", "D3", "D4"]),
        // Recovery reverses each tenant (D2).
        ("reorder", &["D2"]),
    ];
    for (name, rules) in canaries {
        let found = first_failing_seed(name, rules);
        assert!(found.is_some(), "canary {name}: 1,000 seeds passed");
        let (seed, failure) = found.expect("checked");
        eprintln!("canary {name}: first failing seed {seed}: {failure}");
    }
}
