//! `outbox-inspect`: look inside an outbox journal directory without
//! starting the service (issue 25, S-J13): its segments, the items pending
//! per tenant (tenants and items as hex: the tool does not know the
//! service's types), the damaged ranges with their offsets, the format
//! version, the disk use. Read only.
//!
//! ```text
//! outbox-inspect show DIR [--json] [--live]
//! outbox-inspect verify DIR [--json] [--live]
//! ```
//!
//! `verify` exits 0 when the journal is clean, 1 when it holds damage, 2
//! when it cannot be read, or when another process holds it and `--live`
//! is not given (a running journal changes while it is read: `--live`
//! accepts a snapshot that tolerates a growing tail and deleted segments).
//! `show` exits 0 once it has shown what it read (2 as `verify` does).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use outbox::journal::{inspect, Inspection, RawBytes};
use serde_json::{json, Value};

#[derive(Parser)]
#[command(
    name = "outbox-inspect",
    version,
    about = "Look inside an outbox journal directory"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show the segments, the pending items per tenant, the damage.
    Show {
        /// The journal's directory.
        dir: PathBuf,
        /// Print JSON (for scripts).
        #[arg(long)]
        json: bool,
        /// Read a directory another process holds (a snapshot).
        #[arg(long)]
        live: bool,
    },
    /// Exit 0 when clean, 1 on damage, 2 when unreadable or locked
    /// (without --live).
    Verify {
        /// The journal's directory.
        dir: PathBuf,
        /// Print JSON (for scripts).
        #[arg(long)]
        json: bool,
        /// Read a directory another process holds (a snapshot).
        #[arg(long)]
        live: bool,
    },
}

type Raw = Inspection<Vec<u8>, Vec<u8>>;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// Every pending item, whatever its codec version (S-J14), in staging
/// order: `(sequence, codec version, tenant, item)`. `RawBytes` is of
/// version 0; items of other versions come as their bytes.
fn all_pending(r: &Raw) -> Vec<(u64, u32, &[u8], &[u8])> {
    let mut all: Vec<(u64, u32, &[u8], &[u8])> = r
        .pending
        .iter()
        .map(|(seq, t, i)| (*seq, 0, t.as_slice(), i.as_slice()))
        .chain(
            r.other
                .iter()
                .map(|(seq, o)| (*seq, o.version, o.tenant.as_slice(), o.item.as_slice())),
        )
        .collect();
    all.sort_by_key(|x| x.0);
    all
}

/// Pending items per tenant, every version.
fn per_tenant<'a>(all: &[(u64, u32, &'a [u8], &[u8])]) -> BTreeMap<&'a [u8], usize> {
    let mut per = BTreeMap::new();
    for (_, _, t, _) in all {
        *per.entry(*t).or_default() += 1;
    }
    per
}

fn to_json(r: &Raw) -> Value {
    let segments: Vec<Value> = r
        .segments
        .iter()
        .map(|s| {
            json!({
                "name": s.name, "id": s.id, "bytes": s.bytes, "header": s.header,
                "first": s.first, "version": s.version, "sealed": s.sealed,
                "codec_version": s.schema.as_ref().map(|x| x.0),
                "item_type": s.schema.as_ref().map(|x| x.1.clone()),
                "item_versions": s.item_versions,
                "items": s.items, "marks": s.marks,
                "damaged": s.damaged.iter().map(|(a, b)| json!({"from": a, "to": b})).collect::<Vec<_>>(),
            })
        })
        .collect();
    let all = all_pending(r);
    let tenants: Vec<Value> = per_tenant(&all)
        .into_iter()
        .map(|(t, n)| json!({"tenant": hex(t), "pending": n}))
        .collect();
    let pending: Vec<Value> = all
        .iter()
        .map(|(seq, v, t, i)| json!({"seq": seq, "version": v, "tenant": hex(t), "item": hex(i)}))
        .collect();
    json!({
        "live": r.live, "clean": r.is_clean(), "bytes": r.bytes,
        "unreadable": r.unreadable, "done": r.done, "torn_bytes": r.torn_bytes,
        "segments": segments, "tenants": tenants, "pending": pending,
    })
}

fn to_text(r: &Raw) -> String {
    let mut out = String::new();
    let _ =
        writeln!(
        out,
        "{} segments, {} bytes{}; {} pending, {} done, {} unreadable, {} torn bytes at the end: {}",
        r.segments.len(),
        r.bytes,
        if r.live { " (live snapshot: another process holds the journal)" } else { "" },
        r.pending.len() + r.other.len(),
        r.done,
        r.unreadable,
        r.torn_bytes,
        if r.is_clean() { "clean" } else { "DAMAGED" }
    );
    for s in &r.segments {
        let _ = writeln!(
            out,
            "  {} {} B header {} (format {:?}) first {:?} sealed {:?}: {} items, {} marks",
            s.name, s.bytes, s.header, s.version, s.first, s.sealed, s.items, s.marks
        );
        if let Some((version, name)) = &s.schema {
            let _ = writeln!(out, "    schema: codec version {version}, item type {name}");
        }
        if !s.item_versions.is_empty() {
            let _ = writeln!(out, "    item codec versions {:?}", s.item_versions);
        }
        for (from, to) in &s.damaged {
            let _ = writeln!(out, "    damaged bytes {from}..{to}");
        }
    }
    let all = all_pending(r);
    for (tenant, n) in per_tenant(&all) {
        let _ = writeln!(out, "  tenant {}: {n} pending", hex(tenant));
    }
    for (seq, version, tenant, item) in &all {
        let _ = writeln!(
            out,
            "    #{seq} v{version} tenant {} item {}",
            hex(tenant),
            hex(item)
        );
    }
    out
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let (dir, json, live, verify) = match cli.command {
        Command::Show { dir, json, live } => (dir, json, live, false),
        Command::Verify { dir, json, live } => (dir, json, live, true),
    };
    let r: Raw = match inspect(&dir, &RawBytes) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("outbox-inspect: {}: {e}", dir.display());
            return ExitCode::from(2);
        }
    };
    if r.live && !live {
        eprintln!(
            "outbox-inspect: {} is held by another process (a running outbox); pass --live to read a snapshot",
            dir.display()
        );
        return ExitCode::from(2);
    }
    if json {
        println!("{}", to_json(&r));
    } else {
        print!("{}", to_text(&r));
    }
    if verify && !r.is_clean() {
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}
