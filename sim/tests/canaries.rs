//! The crash world's canaries (issue 13): with the journal deliberately
//! broken, a campaign of at most 1,000 crash seeds must fail, by the rule
//! the break offends; and the fleet world's (issue 30), each failing a
//! campaign of at most 1,000 fleet seeds of 30 virtual seconds. Behind the feature `canary` (the switches read
//! `OUTBOX_CANARY`); run them with
//! `cargo test --release -p outbox-sim --features canary --test canaries`.
#![cfg(feature = "canary")]

use std::sync::Mutex;

use outbox_sim::{run_seed, RunOptions, WorldKind};

/// One campaign at a time: the canary is an environment variable.
static CANARY: Mutex<()> = Mutex::new(());

/// The first seed in `0..1000` of `world` whose run breaks one of
/// `rules` with the canary `name` on.
fn first_failing_seed(
    world: WorldKind,
    opts: &RunOptions,
    name: &str,
    rules: &[&str],
) -> Option<(u64, String)> {
    let _one = CANARY.lock().unwrap_or_else(|e| e.into_inner());
    std::env::set_var("OUTBOX_CANARY", name);
    let found = (0..1_000).find_map(|seed| {
        let r = run_seed(world, seed, opts, false).unwrap();
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
        let found = first_failing_seed(WorldKind::Crash, &RunOptions::default(), name, rules);
        assert!(found.is_some(), "canary {name}: 1,000 seeds passed");
        let (seed, failure) = found.expect("checked");
        eprintln!("canary {name}: first failing seed {seed}: {failure}");
    }
}

/// The fleet world's canaries (docs/testing.md): each break fails a
/// campaign of at most 1,000 fleet seeds, by the rule it offends.
#[test]
fn every_fleet_canary_fails_a_campaign() {
    let opts = RunOptions {
        net_secs: 30,
        ..RunOptions::default()
    };
    let canaries: [(&str, &[&str]); 9] = [
        // The relay reads by id above the last seen: a row committed late
        // below it is skipped, the table never drains (S-FW6), or it is
        // delivered after rows committed later (S-FW3).
        ("id_above_last_seen", &["S-FW6", "S-FW1", "S-FW3"]),
        // NOTIFY alone: a notification lost while a listener is away
        // leaves rows behind (S-FW6).
        ("notify_only", &["S-FW6"]),
        // The sink commits without the epoch check: a zombie's write
        // lands after the takeover's install (S-FW4).
        ("sink_no_epoch_check", &["S-FW4"]),
        // The epoch read at the sink transaction's start, not under the
        // share lock held to its commit (S-FW4).
        ("epoch_check_at_start", &["S-FW4"]),
        // The lease trusted for its whole ttl: a host whose lease clock
        // runs slow starts a write after the store's expiry (S-FW5).
        ("no_drift_margin", &["S-FW5"]),
        // The world's skew past the documented bound (S-FW9): the drift
        // margin no longer covers it (S-FW5).
        ("skew_beyond_bound", &["S-FW5"]),
        // A row deleted when its write starts (S-FW8, or lost: S-FW1).
        ("delete_before_written", &["S-FW8", "S-FW1"]),
        // The dead-letter move without the epoch condition: a zombie moves
        // a row its successor owns (S-FW8) or delivered (S-FW1).
        ("dead_letter_no_epoch", &["S-FW8", "S-FW1"]),
        // The delete by id range takes rows not yet written (S-FW8).
        ("delete_by_id_range", &["S-FW8", "S-FW1"]),
    ];
    for (name, rules) in canaries {
        let found = first_failing_seed(WorldKind::Fleet, &opts, name, rules);
        assert!(found.is_some(), "fleet canary {name}: 1,000 seeds passed");
        let (seed, failure) = found.expect("checked");
        eprintln!("fleet canary {name}: first failing seed {seed}: {failure}");
    }
}
