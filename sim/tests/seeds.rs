//! The regression list and a fixed set of fresh seeds, in `cargo test`.

use outbox_sim::regressions::{self, LIST};
use outbox_sim::{run_seed, RunOptions, WorldError, WorldKind};

/// Fresh fast-world seeds per `cargo test` (about 10-20 s in debug).
const FRESH_SEEDS: u64 = 200;
/// Steps per fresh seed.
const FRESH_STEPS: u64 = 10_000;

#[test]
fn regression_list_replays() {
    let list = regressions::parse(LIST).expect("sim/regressions.txt parses");
    for r in list {
        let opts = RunOptions::default();
        match run_seed(r.world, r.seed, &opts, true) {
            Ok(result) => {
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
            // A net-world entry waits for the net world.
            Err(WorldError::NotBuilt(_)) => {}
        }
    }
}

#[test]
fn fresh_fast_seeds_pass() {
    let opts = RunOptions {
        steps: FRESH_STEPS,
        trace: false,
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

#[test]
fn the_net_world_says_it_is_not_built() {
    let err = run_seed(WorldKind::Net, 1, &RunOptions::default(), false).unwrap_err();
    assert_eq!(err, WorldError::NotBuilt(WorldKind::Net));
    assert!(err.to_string().contains("not built yet"));
}
