//! Every rule id cited in the repository resolves in `docs/contract.md`,
//! and nothing cites a document outside the repository.
//!
//! An id is a whole word (neighbours are neither letters, digits nor `_`)
//! of one of three shapes: `S-` then one or two capitals then digits
//! (`S-W5`, `S-B8`), `I` then one or two digits (`I3`), or `D` then one or
//! two digits (`D4`). Ranges such as `I2-I5` cite both ends. The contract
//! defines an id by a heading that starts with an anchor of the id in lower
//! case followed by the id itself: `### <a id="s-w5"></a>S-W5 ...`.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// Where ids may be cited: these directories (recursively) and files,
/// relative to the repository root.
const SCANNED: &[&str] = &[
    "src",
    "tests",
    "sim",
    "benches",
    "examples",
    "fuzz",
    "inspect",
    "README.md",
    "CHANGELOG.md",
    "docs",
    "Cargo.toml",
];

/// Text files are scanned by extension; fuzz inputs and build outputs are not.
const EXTENSIONS: &[&str] = &["rs", "md", "toml", "txt", "sql"];

fn is_word(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The rule ids cited in `text`, in order of appearance, with their line
/// numbers (1-based).
fn cited_ids(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let chars: Vec<char> = line.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            let starts_word = i == 0 || !is_word(chars[i - 1]);
            if starts_word {
                if let Some(len) = id_at(&chars[i..]) {
                    out.push((n + 1, chars[i..i + len].iter().collect()));
                    i += len;
                    continue;
                }
            }
            i += 1;
        }
    }
    out
}

/// The length of the id that starts `s`, if one does and it ends at a word
/// boundary.
fn id_at(s: &[char]) -> Option<usize> {
    let digits_from = |from: usize| s[from..].iter().take_while(|c| c.is_ascii_digit()).count();
    let len = match s.first()? {
        'S' if s.get(1) == Some(&'-') => {
            let caps = s[2..].iter().take_while(|c| c.is_ascii_uppercase()).count();
            if !(1..=2).contains(&caps) {
                return None;
            }
            let digits = digits_from(2 + caps);
            if digits == 0 {
                return None;
            }
            2 + caps + digits
        }
        'I' | 'D' => {
            let digits = digits_from(1);
            if !(1..=2).contains(&digits) {
                return None;
            }
            1 + digits
        }
        _ => return None,
    };
    match s.get(len) {
        Some(&c) if is_word(c) => None,
        _ => Some(len),
    }
}

/// The ids the contract defines: every heading `<a id="x"></a>X ...` whose
/// anchor is its id in lower case. Panics on a malformed or repeated one.
fn defined_ids(contract: &str) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    for line in contract.lines() {
        let Some(rest) = line.trim_start_matches('#').trim().strip_prefix("<a id=\"") else {
            continue;
        };
        let (anchor, after) = rest.split_once("\"></a>").expect("anchor closed");
        let id: String = after.chars().take_while(|&c| !c.is_whitespace()).collect();
        assert_eq!(
            anchor,
            id.to_lowercase(),
            "the anchor of {id} is its id in lower case"
        );
        let whole: Vec<char> = id.chars().collect();
        assert_eq!(
            id_at(&whole),
            Some(whole.len()),
            "{id} has the shape of a rule id"
        );
        assert!(ids.insert(id.clone()), "{id} is defined twice");
    }
    ids
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn collect(path: &Path, out: &mut Vec<PathBuf>) {
    if path.is_dir() {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name == "target" || name.starts_with('.') {
            return;
        }
        let mut entries: Vec<PathBuf> = fs::read_dir(path)
            .expect("readable directory")
            .map(|e| e.expect("directory entry").path())
            .collect();
        entries.sort();
        for entry in entries {
            collect(&entry, out);
        }
    } else if path
        .extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| EXTENSIONS.contains(&e))
    {
        out.push(path.to_path_buf());
    }
}

/// Every scanned file with its text.
fn scanned_files() -> Vec<(PathBuf, String)> {
    let mut paths = Vec::new();
    for entry in SCANNED {
        let path = root().join(entry);
        if path.exists() {
            collect(&path, &mut paths);
        }
    }
    paths
        .into_iter()
        .map(|p| {
            let text = fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p, text)
        })
        .collect()
}

/// The citations in `files` of ids missing from `defined`, one line each.
fn undefined(files: &[(PathBuf, String)], defined: &BTreeSet<String>) -> Vec<String> {
    let mut missing = Vec::new();
    for (path, text) in files {
        for (line, id) in cited_ids(text) {
            if !defined.contains(&id) {
                missing.push(format!("{}:{line}: {id}", path.display()));
            }
        }
    }
    missing
}

fn contract() -> String {
    fs::read_to_string(root().join("docs/contract.md")).expect("docs/contract.md")
}

#[test]
fn every_cited_rule_id_is_defined_in_the_contract() {
    let defined = defined_ids(&contract());
    let files = scanned_files();
    assert!(files.len() > 50, "the scan found the sources");
    let missing = undefined(&files, &defined);
    assert!(
        missing.is_empty(),
        "ids cited but not defined in docs/contract.md:\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_contract_defines_every_round_two_id() {
    let defined = defined_ids(&contract());
    let wanted = (1..=9)
        .map(|n| format!("I{n}"))
        .chain((1..=6).map(|n| format!("D{n}")))
        .chain(["S-F1", "S-O1", "S-O2", "S-O3", "S-W18", "S-B8"].map(String::from));
    for id in wanted {
        assert!(defined.contains(&id), "{id} is defined");
    }
}

#[test]
fn nothing_cites_a_document_outside_the_repository() {
    // Built at run time so this file does not match itself.
    let outside = [format!("SPEC{}", ".md"), format!("shared{}", "/")];
    let mut found = Vec::new();
    for (path, text) in scanned_files() {
        for (n, line) in text.lines().enumerate() {
            if outside.iter().any(|o| line.contains(o.as_str())) {
                found.push(format!("{}:{}: {line}", path.display(), n + 1));
            }
        }
    }
    assert!(found.is_empty(), "outside citations:\n{}", found.join("\n"));
}

#[test]
fn the_scan_finds_exactly_the_ids() {
    let text = "S-W5, I2-I5 and S-C1..S-C4; (D6) S-W17.\n\
                not ids: 0xD2 AI2 I2C S-5 S-abc1 S-ABC1 I123 D1x x_I3 S-W5a";
    let ids: Vec<String> = cited_ids(text).into_iter().map(|(_, id)| id).collect();
    assert_eq!(
        ids,
        ["S-W5", "I2", "I5", "S-C1", "S-C4", "D6", "S-W17"].map(String::from)
    );
    assert_eq!(cited_ids("x\n  I7")[0], (2, "I7".to_string()));
}

#[test]
fn a_planted_undefined_id_fails_the_check() {
    let defined = defined_ids(&contract());
    // Planted at run time, so the scan of this file does not see it.
    let (rule, invariant) = (format!("S-{}{}", "Q", 42), format!("I{}", 77));
    let planted = format!("/// Retries per {rule} and {invariant}.");
    let files = vec![(PathBuf::from("planted.rs"), planted)];
    assert_eq!(
        undefined(&files, &defined),
        [
            format!("planted.rs:1: {rule}"),
            format!("planted.rs:1: {invariant}")
        ]
    );
    let clean = vec![(PathBuf::from("clean.rs"), "/// S-W5 and I3.".to_string())];
    assert!(undefined(&clean, &defined).is_empty());
}

#[test]
fn a_malformed_anchor_is_refused() {
    let result = std::panic::catch_unwind(|| defined_ids("### <a id=\"s-w5\"></a>S-W6 Wrong"));
    assert!(result.is_err());
}
