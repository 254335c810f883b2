//! The regression list and a fixed set of fresh seeds, in `cargo test`.

use outbox_sim::regressions::{self, LIST};
use outbox_sim::{run_seed, RunOptions, WorldKind};

/// Fresh fast-world seeds per `cargo test` (about 10-20 s in debug).
const FRESH_SEEDS: u64 = 200;
/// Steps per fresh seed.
const FRESH_STEPS: u64 = 10_000;

#[test]
fn regression_list_replays() {
    let list = regressions::parse(LIST).expect("sim/regressions.txt parses");
    for r in list {
        let opts = RunOptions::default();
        let result = run_seed(r.world, r.seed, &opts, true).expect("every world is built");
        if let Some(f) = result.failure {
            panic!(
                "regression seed {} ({}, line {}: {}) fails again: {f}\n  replay: {}",
                r.seed,
                r.world,
                r.line,
                r.what,
                outbox_sim::replay_command(r.seed, r.world)
            );
        }
    }
}

#[test]
fn fresh_fast_seeds_pass() {
    let opts = RunOptions {
        steps: FRESH_STEPS,
        trace: false,
        ..RunOptions::default()
    };
    // A fixed window far from the campaign's default start, so `cargo test`
    // and `outbox-sim run` cover different seeds.
    let from = 1_000_000;
    for seed in from..from + FRESH_SEEDS {
        let r = run_seed(WorldKind::Fast, seed, &opts, seed % 8 == 0).unwrap();
        if let Some(f) = r.failure {
            panic!(
                "seed {seed} fails: {f}\n  replay: {}",
                outbox_sim::replay_command(seed, WorldKind::Fast)
            );
        }
        assert!(r.steps > 0);
    }
}

#[test]
fn a_traced_replay_is_deterministic() {
    let opts = RunOptions {
        steps: 500,
        trace: true,
        ..RunOptions::default()
    };
    let a = run_seed(WorldKind::Fast, 3, &opts, false).unwrap();
    let b = run_seed(WorldKind::Fast, 3, &opts, false).unwrap();
    assert_eq!(a.trace_hash, b.trace_hash);
    assert_eq!(a.trace, b.trace);
    assert!(!a.trace.is_empty());
    assert!(a.timeline.is_some());
    // Tracing does not change the run.
    let untraced = run_seed(
        WorldKind::Fast,
        3,
        &RunOptions {
            trace: false,
            ..opts
        },
        false,
    )
    .unwrap();
    assert_eq!(untraced.trace_hash, a.trace_hash);
}

/// Fresh net-world seeds per `cargo test` (each runs 60 virtual seconds
/// of faults, then the healed phase; about 1-3 s each in debug).
const FRESH_NET_SEEDS: u64 = 8;

#[test]
fn fresh_net_seeds_pass() {
    let opts = RunOptions::default();
    let from = 2_000_000;
    for seed in from..from + FRESH_NET_SEEDS {
        let r = run_seed(WorldKind::Net, seed, &opts, seed == from).unwrap();
        if let Some(f) = r.failure {
            panic!(
                "net seed {seed} fails: {f}\n  replay: {}",
                outbox_sim::replay_command(seed, WorldKind::Net)
            );
        }
        assert!(r.steps > 0);
    }
}

#[test]
fn a_traced_net_replay_is_deterministic() {
    let opts = RunOptions {
        net_secs: 5,
        trace: true,
        ..RunOptions::default()
    };
    let a = run_seed(WorldKind::Net, 5, &opts, false).unwrap();
    let b = run_seed(WorldKind::Net, 5, &opts, false).unwrap();
    assert!(a.failure.is_none(), "{:?}", a.failure);
    assert_eq!(a.trace_hash, b.trace_hash);
    assert_eq!(a.trace, b.trace);
    assert!(a.trace.iter().any(|l| l.contains("stage t")));
    let untraced = run_seed(
        WorldKind::Net,
        5,
        &RunOptions {
            trace: false,
            ..opts
        },
        false,
    )
    .unwrap();
    assert_eq!(untraced.trace_hash, a.trace_hash);
}
