//! Replays every input under `fuzz/regressions/engine/` through the same
//! decoding and invariant-checking `Harness` as the `engine` fuzz target,
//! without libFuzzer, so `cargo test --features arbitrary` keeps every
//! crash the fuzzer ever found fixed.
//!
//! Crash inputs are committed under their libFuzzer name (`crash-…`);
//! `corpus-…` files are large inputs kept from the corpus of the first
//! 10-minute campaign (no crash), so the replay always exercises something
//! (led by the `LEGACY` format byte since the outage knobs joined the
//! input, so they replay as they were found), and three of the first
//! 10-minute campaign with every knob (issue 26), each opening the
//! breaker, expiring items and handing out dead letters, with fan-in.

#![cfg(feature = "arbitrary")]

use std::fs;
use std::path::Path;
use std::time::Duration;

#[allow(dead_code)] // `decode` and `Case` are for the fuzz target's users
#[path = "../fuzz/common/decode.rs"]
mod decode;

#[test]
fn every_fuzz_regression_replays_clean() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions/engine");
    let mut inputs: Vec<_> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("readable entry").path())
        .filter(|p| p.is_file() && p.file_name().is_some_and(|n| n != ".gitkeep"))
        .collect();
    inputs.sort();
    let mut failures = Vec::new();
    for path in &inputs {
        let data = fs::read(path).expect("readable input");
        if let Err(v) = decode::run(&data) {
            failures.push(format!("{}: {v}", path.display()));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_decoder_runs_a_hand_made_input() {
    // Guards the replay itself: a config (22 bytes of derived fields, 7 of
    // the knobs beyond them) and a tenant count, then ops, each behind a
    // "one more" byte (odd: yes).
    let mut data = vec![0u8; 30];
    data.extend((0..400u32).map(|i| (i.wrapping_mul(37) as u8) | 1));
    let case = decode::decode(&data).expect("long enough");
    assert!((1..=8).contains(&case.tenants));
    assert!(case.ops.len() > 10, "{case:?}");
    decode::run(&data).expect("no violation");
    // Empty input: the default config and no ops, still a valid run.
    assert!(decode::decode(&[]).is_some_and(|c| c.ops.is_empty()));
    decode::run(&[]).expect("no violation");
}

#[test]
fn the_fan_in_format_byte_draws_the_group_knobs_and_older_inputs_do_not() {
    // S-F1, S-F2: an input led by `FAN_IN` reads max_slices and
    // max_group_items after the config; any other decodes as before fan-in.
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions/engine");
    let data = fs::read(dir.join("fan-in-groups-partial-outcomes")).expect("the input");
    let case = decode::decode(&data).expect("long enough");
    let c = case.draw.config();
    assert_eq!(c.max_slices_per_write(), 4);
    assert_eq!(c.max_group_items(), Some(12));
    assert!(case.ops.len() > 100, "{case:?}");
    let old = decode::decode(&[&[decode::LEGACY], &data[1..]].concat()).expect("long enough");
    assert_eq!(old.draw.config().max_slices_per_write(), 1);
    assert_eq!(c.breaker(), None, "a fan-in input draws no outage knob");
}

#[test]
fn an_input_without_a_format_byte_draws_every_knob() {
    // The derived fields (22 bytes: linger 0), then max_slices 2,
    // max_group_items 0, the breaker (failures 1 + 1, probe 1 + 9 ms, cap
    // 0 ms more), max_item_age 5 x 4 ms and dead letters on (S-F1, S-R1-S-R4).
    let mut data = vec![0u8; 22];
    data.extend([2, 0, 1, 9, 0, 4, 1]);
    data.extend((0..400u32).map(|i| (i.wrapping_mul(37) as u8) | 1));
    let case = decode::decode(&data).expect("long enough");
    let c = case.draw.config();
    assert_eq!(c.max_slices_per_write(), 2);
    let b = c.breaker().expect("a breaker");
    assert_eq!(b.failures_to_open(), 2);
    assert_eq!(b.first_probe_interval(), Duration::from_millis(10));
    assert_eq!(b.probe_interval_cap(), Duration::from_millis(10));
    assert_eq!(c.max_item_age(), Some(Duration::from_millis(20)));
    assert!(c.dead_letters());
    decode::run(&data).expect("no violation");
    // The same bytes led by LEGACY draw none of them.
    let legacy = decode::decode(&[&[decode::LEGACY], &data[..]].concat()).expect("long enough");
    let c = legacy.draw.config();
    assert!(c.breaker().is_none() && c.max_item_age().is_none() && !c.dead_letters());
}
