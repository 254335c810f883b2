//! A campaign: many seeds in one world, their figures summed, every failure
//! kept with its seed.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use outbox::core::{Counters, DropReason, LostReason};

use outbox::testkit::Violation;

use crate::world::{run_seed, RunOptions, WorldError, WorldKind};

/// Every 64th seed (and every replay) runs twice to check determinism.
pub const DETERMINISM_EVERY: u64 = 64;

/// What to run.
#[derive(Clone, Copy, Debug)]
pub struct CampaignOptions {
    /// The world.
    pub world: WorldKind,
    /// The first seed.
    pub from: u64,
    /// How many seeds.
    pub seeds: u64,
    /// Steps per seed (faulty phase, fast world).
    pub steps: u64,
    /// Virtual seconds of the faulty phase per seed (net world).
    pub net_secs: u64,
    /// Show a progress bar.
    pub progress: bool,
}

/// The sum of a campaign.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    /// The world.
    pub world: WorldKind,
    /// The options every seed ran with (its replay command's flags).
    pub run: RunOptions,
    /// Seeds run.
    pub seeds: u64,
    /// Seeds run twice for the determinism check.
    pub determinism_checked: u64,
    /// Steps, all seeds.
    pub steps: u64,
    /// Items staged, all seeds.
    pub items: u64,
    /// Counters summed over the seeds.
    pub counters: Counters,
    /// Faults and controls injected, by kind.
    pub faults: BTreeMap<&'static str, u64>,
    /// Failing seeds, in seed order.
    pub failures: Vec<(u64, Violation)>,
    /// Wall-clock time (for the printout only).
    pub elapsed: Duration,
}

impl Summary {
    fn add(&mut self, c: &Counters) {
        let s = &mut self.counters;
        s.staged += c.staged;
        s.pending += c.pending;
        s.written += c.written;
        s.writes += c.writes;
        s.attempts += c.attempts;
        s.failed_attempts += c.failed_attempts;
        for r in LostReason::ALL {
            s.set_lost(r, s.lost(r) + c.lost(r));
        }
        for r in DropReason::ALL {
            s.set_dropped(r, s.dropped(r) + c.dropped(r));
        }
    }
}

/// Runs the campaign.
///
/// # Errors
/// [`WorldError`] if the seeds asked for make no campaign (none, or past `u64::MAX`).
pub fn run(opts: &CampaignOptions) -> Result<Summary, WorldError> {
    if opts.seeds == 0 {
        return Err(WorldError::NoSeeds);
    }
    let last = opts
        .from
        .checked_add(opts.seeds - 1)
        .ok_or(WorldError::PastLastSeed {
            from: opts.from,
            seeds: opts.seeds,
        })?;
    let run_opts = RunOptions {
        steps: opts.steps,
        net_secs: opts.net_secs,
        trace: false,
        fixed_versions: false,
    };
    let bar = if opts.progress {
        let bar = ProgressBar::new(opts.seeds);
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} {elapsed_precise} [{wide_bar}] {pos}/{len} seeds ({per_sec}, eta {eta}) {msg}",
            )
            .expect("a valid template")
            .progress_chars("=> "),
        );
        bar
    } else {
        ProgressBar::hidden()
    };
    let started = Instant::now();
    let mut summary = Summary {
        world: opts.world,
        run: run_opts,
        ..Summary::default()
    };
    for seed in opts.from..=last {
        let check = seed % DETERMINISM_EVERY == 0;
        let r = run_seed(opts.world, seed, &run_opts, check)?;
        summary.seeds += 1;
        summary.determinism_checked += u64::from(check);
        summary.steps += r.steps;
        summary.items += r.items;
        summary.add(&r.counters);
        for (k, n) in &r.faults {
            *summary.faults.entry(k).or_default() += n;
        }
        if let Some(f) = r.failure {
            bar.println(format!("seed {seed}: {} broken: {f}", f.rule));
            summary.failures.push((seed, f));
            bar.set_message(format!("{} failing", summary.failures.len()));
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    summary.elapsed = started.elapsed();
    Ok(summary)
}
