//! The regression list, `sim/regressions.txt`: one seed per line as
//! `SEED WORLD [secs=N] [versions=fixed] WHAT-IT-CAUGHT`, `#` starts a
//! comment; `secs=N` sets the faulty phase's virtual seconds (`--secs`,
//! the net, crash and fleet worlds), the default's otherwise;
//! `versions=fixed` runs the crash world with one codec version for every
//! life (`--fixed-versions`), as it ran before version changes were drawn.
//! `cargo test -p outbox-sim` replays every entry.

use crate::world::WorldKind;

/// One entry of the list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Regression {
    /// The seed.
    pub seed: u64,
    /// The world it failed in.
    pub world: WorldKind,
    /// Virtual seconds of the faulty phase it failed with (`--secs`),
    /// `None` for the default.
    pub secs: Option<u64>,
    /// Crash world: one codec version for every life
    /// ([`RunOptions::fixed_versions`](crate::RunOptions::fixed_versions)).
    pub fixed_versions: bool,
    /// What it caught.
    pub what: String,
    /// Its line in the file (1-based).
    pub line: usize,
}

/// The list as compiled into the crate.
pub const LIST: &str = include_str!("../regressions.txt");

/// Parses the list.
///
/// # Errors
/// The first malformed line, with its number.
pub fn parse(text: &str) -> Result<Vec<Regression>, String> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let mut parts = line.splitn(3, char::is_whitespace);
        let seed = parts
            .next()
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or_else(|| format!("line {}: expected a seed: {raw}", i + 1))?;
        let world = parts
            .next()
            .ok_or_else(|| format!("line {}: expected a world after the seed", i + 1))?
            .parse::<WorldKind>()
            .map_err(|e| format!("line {}: {e}", i + 1))?;
        let mut what = parts.next().unwrap_or("").trim();
        let mut secs = None;
        if let Some(rest) = what.strip_prefix("secs=") {
            let (n, tail) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
            let n =
                n.parse::<u64>().ok().filter(|&n| n > 0).ok_or_else(|| {
                    format!("line {}: `secs=` wants a positive number: {raw}", i + 1)
                })?;
            secs = Some(n);
            what = tail.trim();
        }
        let mut fixed_versions = false;
        if let Some(rest) = what.strip_prefix("versions=") {
            let (v, tail) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
            if v != "fixed" {
                return Err(format!("line {}: `versions=` wants `fixed`: {raw}", i + 1));
            }
            fixed_versions = true;
            what = tail.trim();
        }
        out.push(Regression {
            seed,
            world,
            secs,
            fixed_versions,
            what: what.to_string(),
            line: i + 1,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_comments_and_entries() {
        let list = parse("# header\n\n42 fast lost items at a deadline # note\n7 net x\n").unwrap();
        assert_eq!(list.len(), 2);
        assert_eq!(list[0].seed, 42);
        assert_eq!(list[0].what, "lost items at a deadline");
        assert_eq!(list[1].world, WorldKind::Net);
        assert_eq!(list[0].secs, None);
        assert!(parse("x fast y").is_err());
        assert!(parse("1 slow y").is_err());
    }

    #[test]
    fn parses_the_seconds_of_a_phase() {
        let list = parse("1479 fleet secs=30 poisoned after a write\n3 net secs=5\n").unwrap();
        assert_eq!(list[0].secs, Some(30));
        assert_eq!(list[0].what, "poisoned after a write");
        assert_eq!(list[1].secs, Some(5));
        assert_eq!(list[1].what, "");
        assert!(parse("1 fleet secs=x y").is_err());
        assert!(parse("1 fleet secs=0 y").is_err());
    }

    #[test]
    fn parses_fixed_versions() {
        let list =
            parse("259 crash versions=fixed D6 left\n7 crash secs=5 versions=fixed\n8 crash x\n")
                .unwrap();
        assert!(list[0].fixed_versions);
        assert_eq!(list[0].what, "D6 left");
        assert_eq!((list[1].secs, list[1].fixed_versions), (Some(5), true));
        assert!(!list[2].fixed_versions);
        assert!(parse("1 crash versions=drawn y").is_err());
    }

    #[test]
    fn the_shipped_list_parses() {
        parse(LIST).unwrap();
    }
}
