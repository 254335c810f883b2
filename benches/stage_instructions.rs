//! `stage_instructions`: the instructions one `Outbox::stage` costs on the
//! request path, counted by valgrind's callgrind rather than timed, so the
//! figure is the same on every run whatever else the machine is doing
//! (the `stage` bench's times depend on whether the writer keeps up with
//! the stager, issue 24). Baseline: a bare `unbounded_channel` send of the
//! same `(TenantId, u64)`, the `stage` bench's baseline.
//!
//! Run by hand, not by criterion (`cargo bench` runs it once with no
//! arguments and it only says how): `stage_instructions MODE N TENANTS`,
//! `MODE` = `outbox`, `journal` (with the `journal` feature: the same
//! with a journal in a temporary directory, its commit task never run) or
//! `channel`, stages `N` items round-robin over
//! `TENANTS` tenants on a current-thread runtime that is never driven, so
//! the writer never runs and only the stages are counted; the items wait
//! in the hand-off (S-W19). Two runs with different `N`, subtracted,
//! cancel the set-up: docs/benchmarks.md has the commands.

mod common;

use std::hint::black_box;

use common::{tenant, Counting};
use outbox::{Config, Outbox, TenantId};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let parsed = match &args[..] {
        [mode, n, tenants] => n
            .parse::<u64>()
            .ok()
            .zip(tenants.parse::<u64>().ok().filter(|&t| t > 0))
            .map(|(n, t)| (mode.as_str(), n, t)),
        _ => None,
    };
    let Some((mode, n, tenants)) = parsed else {
        println!(
            "stage_instructions: run under callgrind with MODE N TENANTS \
             (docs/benchmarks.md, \"Instructions per stage\"); nothing to do here"
        );
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    match mode {
        "outbox" => {
            let outbox = rt.block_on(async {
                Outbox::new(Counting::default(), Config::default()).expect("the default config")
            });
            // In the runtime's context, as a request handler is; never
            // driven, so the writer takes nothing in while this counts.
            let _in = rt.enter();
            for i in 0..n {
                let _ = black_box(outbox.stage(tenant(i % tenants), i));
            }
            // Not shut down: a shutdown's intake would be counted too.
            std::process::exit(0);
        }
        #[cfg(feature = "journal")]
        "journal" => {
            let dir =
                std::env::temp_dir().join(format!("stage-instructions-{}", std::process::id()));
            let outbox = rt.block_on(async {
                Outbox::builder(Counting::default())
                    .journal(outbox::journal::JournalConfig::new(&dir))
                    .build()
                    .expect("a journal in the temporary directory")
            });
            let _in = rt.enter();
            for i in 0..n {
                let _ = black_box(outbox.stage(tenant(i % tenants), i));
            }
            drop(_in);
            let _ = std::fs::remove_dir_all(&dir);
            std::process::exit(0);
        }
        "channel" => {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<(TenantId, u64)>();
            for i in 0..n {
                black_box(tx.send((tenant(i % tenants), i)).is_ok());
            }
            // Exits with the receiver alive: its drop would drain the
            // queue and be counted.
            black_box(&rx);
            std::process::exit(0);
        }
        other => {
            eprintln!(
                "stage_instructions: MODE is outbox, journal (feature) or channel, not {other}"
            );
            std::process::exit(2);
        }
    }
}
