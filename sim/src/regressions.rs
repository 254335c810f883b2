//! The regression list, `sim/regressions.txt`: one seed per line as
//! `SEED WORLD WHAT-IT-CAUGHT`, `#` starts a comment. `cargo test -p
//! outbox-sim` replays every entry.

use crate::world::WorldKind;

/// One entry of the list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Regression {
    /// The seed.
    pub seed: u64,
    /// The world it failed in.
    pub world: WorldKind,
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
        let what = parts.next().unwrap_or("").trim().to_string();
        out.push(Regression {
            seed,
            world,
            what,
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
        assert!(parse("x fast y").is_err());
        assert!(parse("1 slow y").is_err());
    }

    #[test]
    fn the_shipped_list_parses() {
        parse(LIST).unwrap();
    }
}
