//! The worlds a seed can run in, behind one entry point, so the campaign,
//! the replay command and the tests do not care which one runs.

use std::collections::BTreeMap;
use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::str::FromStr;

use outbox::core::{Counters, Time};
use outbox::testkit::Violation;

use crate::fast::FastWorld;
use crate::timeline::Timeline;

/// Which world runs a seed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum WorldKind {
    /// The core alone under a virtual clock (`fast`).
    #[default]
    Fast,
    /// The tokio driver and a sink over turmoil's simulated network
    /// (`net/`).
    Net,
    /// The net world with a journaled outbox on a simulated disk, the
    /// application crashing and restarting (`crash/`).
    Crash,
    /// Several hosts running the driver's outbox-table relay under
    /// leases against one store (`fleet/`).
    Fleet,
}

impl WorldKind {
    /// The name the CLI and the regression list use.
    pub fn as_str(self) -> &'static str {
        match self {
            WorldKind::Fast => "fast",
            WorldKind::Net => "net",
            WorldKind::Crash => "crash",
            WorldKind::Fleet => "fleet",
        }
    }
}

impl fmt::Display for WorldKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for WorldKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "fast" => Ok(WorldKind::Fast),
            "net" => Ok(WorldKind::Net),
            "crash" => Ok(WorldKind::Crash),
            "fleet" => Ok(WorldKind::Fleet),
            other => Err(format!(
                "unknown world `{other}` (expected `fast`, `net`, `crash` or `fleet`)"
            )),
        }
    }
}

/// A campaign that cannot run as asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WorldError {
    /// `--seeds 0`: a campaign of nothing would pass vacuously.
    NoSeeds,
    /// `--from` plus `--seeds` runs past the last seed, `u64::MAX`.
    PastLastSeed {
        /// The first seed asked for.
        from: u64,
        /// How many seeds were asked for.
        seeds: u64,
    },
}

impl fmt::Display for WorldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WorldError::NoSeeds => write!(f, "--seeds must be at least 1"),
            WorldError::PastLastSeed { from, seeds } => {
                let left = u64::MAX - from + 1;
                let noun = if left == 1 { "seed" } else { "seeds" };
                write!(
                    f,
                    "--from {from} with --seeds {seeds} runs past the last seed ({}); \
                     at most {left} {noun} from there",
                    u64::MAX
                )
            }
        }
    }
}

impl std::error::Error for WorldError {}

/// How to run one seed.
#[derive(Clone, Copy, Debug)]
pub struct RunOptions {
    /// Steps (harness ops) of the faulty phase (fast world).
    pub steps: u64,
    /// Virtual seconds of the faulty phase (net world).
    pub net_secs: u64,
    /// Keep a trace and a timeline.
    pub trace: bool,
    /// Crash world: one codec version for every life, none drawn (S-J14;
    /// how the seeds caught before version changes were drawn replay their
    /// case: `versions=fixed` in `sim/regressions.txt`, `--fixed-versions`).
    pub fixed_versions: bool,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            steps: 10_000,
            net_secs: 60,
            trace: false,
            fixed_versions: false,
        }
    }
}

/// What one run of one seed gives.
#[derive(Clone, Debug)]
pub struct RunResult {
    /// The seed.
    pub seed: u64,
    /// Harness ops applied, both phases.
    pub steps: u64,
    /// Items staged.
    pub items: u64,
    /// The engine's counters at the end.
    pub counters: Counters,
    /// Faults and controls injected, by kind.
    pub faults: BTreeMap<&'static str, u64>,
    /// The first broken invariant, if any.
    pub failure: Option<Violation>,
    /// Hash of every op and output (determinism self-check).
    pub trace_hash: u64,
    /// The trace, with `RunOptions::trace`.
    pub trace: Vec<String>,
    /// The timeline, with `RunOptions::trace`.
    pub timeline: Option<Timeline>,
    /// What the seed drew (config, workload, faults), one line.
    pub setup: String,
    /// The virtual time at the end.
    pub end: Time,
}

/// Runs `seed` in `world`; a panic anywhere becomes a failure. With
/// `check_determinism` the seed runs twice and the trace hashes must match.
///
/// # Errors
/// [`WorldError`] if the world cannot run.
pub fn run_seed(
    world: WorldKind,
    seed: u64,
    opts: &RunOptions,
    check_determinism: bool,
) -> Result<RunResult, WorldError> {
    let run = |seed: u64, opts: &RunOptions| match world {
        WorldKind::Fast => run_fast(seed, opts),
        WorldKind::Net => crate::net::run(seed, opts),
        WorldKind::Crash => crate::crash::run(seed, opts),
        WorldKind::Fleet => crate::fleet::run(seed, opts),
    };
    let mut result = run(seed, opts);
    if check_determinism && result.failure.is_none() {
        let again = run(seed, opts);
        if again.trace_hash != result.trace_hash || again.steps != result.steps {
            result.failure = Some(Violation {
                rule: "determinism",
                detail: format!(
                    "two runs of the seed differ: trace hash {:#018x} vs {:#018x}, \
                     steps {} vs {}",
                    result.trace_hash, again.trace_hash, result.steps, again.steps
                ),
                step: step_index(result.steps.min(again.steps)),
            });
        }
    }
    Ok(result)
}

fn run_fast(seed: u64, opts: &RunOptions) -> RunResult {
    catching_panics(seed, || FastWorld::new(seed, opts).run())
}

/// Runs `run` (the run of `seed`); a panic that escapes it becomes a
/// failure under the rule `panic`.
pub(crate) fn catching_panics(seed: u64, run: impl FnOnce() -> RunResult) -> RunResult {
    match panic::catch_unwind(AssertUnwindSafe(run)) {
        Ok(r) => r,
        Err(payload) => {
            let msg = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "a panic with a non-string payload".to_string());
            RunResult {
                seed,
                steps: 0,
                items: 0,
                counters: Counters::default(),
                faults: BTreeMap::new(),
                failure: Some(Violation {
                    rule: "panic",
                    detail: msg,
                    step: 0,
                }),
                trace_hash: 0,
                trace: Vec::new(),
                timeline: None,
                setup: String::new(),
                end: Time::ZERO,
            }
        }
    }
}

/// `steps` as a [`Violation::step`].
pub(crate) fn step_index(steps: u64) -> usize {
    usize::try_from(steps).unwrap_or(usize::MAX)
}

/// The command that replays `seed` with a trace, with the options of
/// `opts` that differ from the defaults (`--steps`, `--secs`,
/// `--fixed-versions`: another value is another run); under a canary
/// (feature `canary` with `OUTBOX_CANARY` set), with both, or the seed
/// would pass.
pub fn replay_command(seed: u64, world: WorldKind, opts: &RunOptions) -> String {
    let canary = if cfg!(feature = "canary") {
        std::env::var("OUTBOX_CANARY").ok()
    } else {
        None
    };
    let default = RunOptions::default();
    let mut flags = String::new();
    if opts.steps != default.steps {
        flags.push_str(&format!(" --steps {}", opts.steps));
    }
    if opts.net_secs != default.net_secs {
        flags.push_str(&format!(" --secs {}", opts.net_secs));
    }
    if opts.fixed_versions {
        flags.push_str(" --fixed-versions");
    }
    match canary {
        Some(name) => format!(
            "OUTBOX_CANARY={name} cargo run --release -p outbox-sim --features canary -- replay {seed} --world {world}{flags} --trace"
        ),
        None => format!(
            "cargo run --release -p outbox-sim -- replay {seed} --world {world}{flags} --trace"
        ),
    }
}

#[cfg(test)]
mod replay_command_tests {
    use super::*;

    #[test]
    fn a_replay_command_carries_the_options_that_differ_from_the_defaults() {
        // Another `--secs` is another run: a campaign's failure must
        // print the command that replays that run.
        if std::env::var("OUTBOX_CANARY").is_ok() {
            return;
        }
        let plain = replay_command(7, WorldKind::Fleet, &RunOptions::default());
        assert!(plain.ends_with("replay 7 --world fleet --trace"), "{plain}");
        let opts = RunOptions {
            steps: 500,
            net_secs: 30,
            fixed_versions: true,
            ..RunOptions::default()
        };
        let cmd = replay_command(7, WorldKind::Crash, &opts);
        assert!(
            cmd.ends_with("replay 7 --world crash --steps 500 --secs 30 --fixed-versions --trace"),
            "{cmd}"
        );
    }
}
