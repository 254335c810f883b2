//! Plain-text output: the campaign summary table and the replay trace.

use std::fmt::Write as _;

use outbox::core::{DropReason, LostReason};

use crate::campaign::Summary;
use crate::world::{replay_command, RunResult, WorldKind};

fn rate(n: u64, secs: f64) -> String {
    if secs <= 0.0 {
        return "-".to_string();
    }
    let r = n as f64 / secs;
    if r >= 10_000.0 {
        format!("{:.0}", r)
    } else {
        format!("{:.1}", r)
    }
}

/// Thousands separated by `,`.
pub fn num(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The summary table, then each failure with its replay command.
pub fn summary(s: &Summary) -> String {
    let secs = s.elapsed.as_secs_f64();
    let c = &s.counters;
    let mut o = String::new();
    let row = |o: &mut String, k: &str, v: String| {
        let _ = writeln!(o, "  {k:<28} {v:>16}");
    };
    let _ = writeln!(o, "campaign: world {}", s.world);
    row(&mut o, "seeds", num(s.seeds));
    row(&mut o, "  determinism re-runs", num(s.determinism_checked));
    row(&mut o, "steps", num(s.steps));
    row(&mut o, "items staged", num(s.items));
    row(&mut o, "attempts", num(c.attempts));
    row(&mut o, "  failed attempts", num(c.failed_attempts));
    let _ = writeln!(o, "faults and controls injected");
    for (k, n) in &s.faults {
        row(&mut o, &format!("  {k}"), num(*n));
    }
    if s.world == WorldKind::Fleet && s.seeds > 0 {
        let per_seed = |k: &str| {
            let n = s.faults.get(k).copied().unwrap_or(0);
            format!("{:.2}", n as f64 / s.seeds as f64)
        };
        let _ = writeln!(o, "fleet, per seed");
        row(&mut o, "  handovers", per_seed("handover"));
        row(
            &mut o,
            "  pauses longer than the ttl",
            per_seed("long_pause"),
        );
    }
    if s.world == WorldKind::Crash {
        // A crash takes a life's counters with it: only the last life's
        // survive (the items staged and the faults count every life).
        let _ = writeln!(o, "items (each seed's last life)");
    } else {
        let _ = writeln!(o, "items");
    }
    row(&mut o, "written", num(c.written));
    row(&mut o, "  in writes", num(c.writes));
    row(&mut o, "pending at the end", num(c.pending));
    row(&mut o, "lost", num(c.lost_total()));
    for r in LostReason::ALL {
        row(&mut o, &format!("  {}", r.as_str()), num(c.lost(r)));
    }
    row(&mut o, "dropped", num(c.dropped_total()));
    for r in DropReason::ALL {
        row(&mut o, &format!("  {}", r.as_str()), num(c.dropped(r)));
    }
    let _ = writeln!(o, "speed");
    row(&mut o, "wall time", format!("{secs:.2} s"));
    row(&mut o, "seeds per second", rate(s.seeds, secs));
    row(&mut o, "steps per second", rate(s.steps, secs));
    row(
        &mut o,
        "seeds per minute",
        rate(s.seeds.saturating_mul(60), secs),
    );
    if s.failures.is_empty() {
        let _ = writeln!(o, "result: all {} seeds passed", num(s.seeds));
    } else {
        let _ = writeln!(
            o,
            "result: {} of {} seeds FAILED",
            s.failures.len(),
            num(s.seeds)
        );
        for (seed, f) in &s.failures {
            let _ = writeln!(
                o,
                "  seed {seed}: {} broken at step {}: {}",
                f.rule, f.step, f.detail
            );
            let _ = writeln!(o, "    replay: {}", replay_command(*seed, s.world, &s.run));
        }
    }
    o
}

/// The outcome of one replayed seed, in a few lines.
pub fn replay(r: &RunResult, world: WorldKind) -> String {
    let c = &r.counters;
    let mut o = String::new();
    let _ = writeln!(o, "seed {} world {world}", r.seed);
    let _ = writeln!(o, "  drew: {}", r.setup);
    let last = if world == WorldKind::Crash {
        " (the last life's counts)"
    } else {
        ""
    };
    let _ = writeln!(
        o,
        "  {} steps, {} items staged, virtual time {}; written {}, lost {}, dropped {}, pending {}{last}",
        num(r.steps),
        num(r.items),
        r.end,
        num(c.written),
        num(c.lost_total()),
        num(c.dropped_total()),
        num(c.pending)
    );
    let faults: Vec<String> = r
        .faults
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    let _ = writeln!(o, "  faults: {}", faults.join(", "));
    let _ = writeln!(o, "  trace hash {:#018x}", r.trace_hash);
    match &r.failure {
        None => {
            let _ = writeln!(o, "result: passed");
        }
        Some(f) => {
            let _ = writeln!(
                o,
                "result: FAILED, {} broken at step {}: {}",
                f.rule, f.step, f.detail
            );
        }
    }
    o
}
