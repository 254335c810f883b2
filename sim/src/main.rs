//! `outbox-sim`: run a campaign of seeds, or replay one.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use outbox_sim::campaign::{self, CampaignOptions};
use outbox_sim::{report, run_seed, svg, RunOptions, WorldKind};

#[derive(Parser)]
#[command(
    name = "outbox-sim",
    version,
    about = "Deterministic simulation of the outbox"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a campaign of seeds and print a summary; exits non-zero on any failure.
    Run {
        /// How many seeds.
        #[arg(long, default_value_t = 1_000)]
        seeds: u64,
        /// The world: `fast` (the core alone), `net` (the tokio driver
        /// and a network sink over turmoil), `crash` (a journaled outbox
        /// on a simulated disk, crashed and restarted) or `fleet` (several
        /// hosts relaying one outbox table under leases).
        #[arg(long, default_value = "fast")]
        world: WorldKind,
        /// The first seed.
        #[arg(long, default_value_t = 0)]
        from: u64,
        /// Steps of the faulty phase per seed (fast world).
        #[arg(long, default_value_t = 10_000)]
        steps: u64,
        /// Virtual seconds of the faulty phase per seed (net and fleet
        /// worlds, at least 1, the fleet's at most 3,600; the crash world
        /// takes a quarter of it, at least 1).
        #[arg(long, default_value_t = 60)]
        secs: u64,
    },
    /// Rerun one seed (its determinism checked), print its outcome and,
    /// with --trace, one line per event.
    Replay {
        /// The seed.
        seed: u64,
        /// The world: `fast`, `net`, `crash` or `fleet`.
        #[arg(long, default_value = "fast")]
        world: WorldKind,
        /// Steps of the faulty phase (fast world).
        #[arg(long, default_value_t = 10_000)]
        steps: u64,
        /// Virtual seconds of the faulty phase (net and fleet worlds, at
        /// least 1, the fleet's at most 3,600; the crash world takes a
        /// quarter of it, at least 1).
        #[arg(long, default_value_t = 60)]
        secs: u64,
        /// Print the trace, one line per op and event.
        #[arg(long)]
        trace: bool,
        /// Crash world: one codec version for every life (how a seed
        /// caught before version changes were drawn replays, `versions=fixed`
        /// in sim/regressions.txt).
        #[arg(long)]
        fixed_versions: bool,
        /// Draw the run as an SVG timeline into FILE.
        #[arg(long, value_name = "FILE")]
        svg: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Run {
            seeds,
            world,
            from,
            steps,
            secs,
        } => {
            let opts = CampaignOptions {
                world,
                from,
                seeds,
                steps,
                net_secs: secs,
                progress: std::io::stderr().is_terminal(),
            };
            match campaign::run(&opts) {
                Ok(summary) => {
                    print!("{}", report::summary(&summary));
                    if summary.failures.is_empty() {
                        ExitCode::SUCCESS
                    } else {
                        ExitCode::FAILURE
                    }
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Replay {
            seed,
            world,
            steps,
            secs,
            trace,
            fixed_versions,
            svg: svg_path,
        } => {
            let opts = RunOptions {
                steps,
                net_secs: secs,
                trace: trace || svg_path.is_some(),
                fixed_versions,
            };
            let r = match run_seed(world, seed, &opts, true) {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::from(2);
                }
            };
            if trace {
                for line in &r.trace {
                    println!("{line}");
                }
            }
            print!("{}", report::replay(&r, world));
            if let (Some(path), Some(timeline)) = (svg_path, r.timeline.as_ref()) {
                let title = format!("outbox-sim seed {seed} world {world}");
                if let Err(e) = std::fs::write(&path, svg::render(timeline, &title)) {
                    eprintln!("error: cannot write {}: {e}", path.display());
                    return ExitCode::from(2);
                }
                println!("timeline written to {}", path.display());
            }
            if r.failure.is_some() {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
    }
}
