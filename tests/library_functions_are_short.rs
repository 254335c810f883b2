//! No library function is over 80 lines (DEVELOPERS.md): every function
//! body in `src/`, test modules (`#[cfg(test)] mod`, `tests.rs` files)
//! aside, from its `fn` line to its closing brace at the same indent. A
//! bodyless declaration (a trait method ending in `;`) has no body: the
//! lines after it belong to the next item, not to it.

use std::fs;
use std::path::{Path, PathBuf};

const MAX_LINES: usize = 80;

/// Whether `line` starts a function item (after visibility and qualifiers).
fn starts_fn(line: &str) -> bool {
    let mut rest = line.trim_start();
    if let Some(r) = rest.strip_prefix("pub") {
        rest = match r.strip_prefix('(') {
            Some(r) => r.split_once(") ").map_or(r, |(_, r)| r),
            None => r.trim_start(),
        };
    }
    for qualifier in ["const ", "async ", "unsafe ", "extern \"C\" "] {
        rest = rest.strip_prefix(qualifier).unwrap_or(rest);
    }
    rest.strip_prefix("fn ")
        .is_some_and(|r| r.starts_with(|c: char| c.is_alphanumeric() || c == '_'))
}

fn indent(line: &str) -> &str {
    &line[..line.len() - line.trim_start().len()]
}

/// Every function body over `max` lines in `text`, as (first line number,
/// lines, the `fn` line), test modules aside.
fn long_functions(text: &str, max: usize) -> Vec<(usize, usize, String)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut long = Vec::new();
    let mut test_mod: Option<&str> = None;
    let mut after_cfg_test = false;
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        if let Some(ind) = test_mod {
            if line.len() == ind.len() + 1 && line.starts_with(ind) && line.ends_with('}') {
                test_mod = None;
            }
            i += 1;
            continue;
        }
        let trimmed = line.trim_start();
        if trimmed.starts_with("#[cfg(test)]") {
            after_cfg_test = true;
            i += 1;
            continue;
        }
        let is_mod = trimmed.starts_with("mod ") || trimmed.starts_with("pub(crate) mod ");
        if after_cfg_test && is_mod && !trimmed.ends_with(';') {
            test_mod = Some(indent(line));
        }
        after_cfg_test = false;
        if starts_fn(line) {
            if let Some(end) = body_end(&lines, i) {
                let n = end - i + 1;
                if n > max {
                    long.push((i + 1, n, trimmed.to_owned()));
                }
            }
        }
        i += 1;
    }
    long
}

/// The line closing the body of the function whose `fn` is at `start`, or
/// `None` if it is a bodyless declaration.
fn body_end(lines: &[&str], start: usize) -> Option<usize> {
    let ind = indent(lines[start]);
    let mut j = start;
    // The signature ends at the first `{` (a body) or `;` (no body).
    loop {
        let line = lines.get(j)?;
        match (line.find('{'), line.find(';')) {
            (_, Some(semi)) if line.find('{').is_none_or(|brace| semi < brace) => return None,
            (Some(_), _) => break,
            _ => j += 1,
        }
    }
    if j == start && lines[start].trim_end().ends_with('}') {
        return Some(start);
    }
    (j..lines.len()).find(|&k| {
        lines[k].len() == ind.len() + 1 && lines[k].starts_with(ind) && lines[k].ends_with('}')
    })
}

fn collect(path: &Path, out: &mut Vec<PathBuf>) {
    if path.is_dir() {
        let mut entries: Vec<PathBuf> = fs::read_dir(path)
            .expect("readable directory")
            .map(|e| e.expect("directory entry").path())
            .collect();
        entries.sort();
        for entry in entries {
            collect(&entry, out);
        }
    } else if path.extension().is_some_and(|e| e == "rs")
        && path.file_name().is_some_and(|n| n != "tests.rs")
    {
        out.push(path.to_path_buf());
    }
}

#[test]
fn no_library_function_is_over_80_lines() {
    let mut files = Vec::new();
    collect(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut files,
    );
    assert!(files.len() > 50, "the scan finds the library's files");
    let mut long = Vec::new();
    for path in files {
        let text = fs::read_to_string(&path).unwrap();
        for (line, n, head) in long_functions(&text, MAX_LINES) {
            long.push(format!("{}:{line}: {n} lines: {head}", path.display()));
        }
    }
    assert!(
        long.is_empty(),
        "functions over {MAX_LINES} lines:\n{}",
        long.join("\n")
    );
}

#[test]
fn the_scan_measures_bodies_and_skips_declarations_and_test_modules() {
    let body = "        x += 1;\n".repeat(5);
    let text = format!(
        "trait T {{\n    fn declared(\n        &self,\n    ) -> u32;\n    fn short(&self) {{}}\n{body}}}\n\
         pub(crate) async fn long(\n    a: u32,\n) -> u32 {{\n{body}    a\n}}\n\
         #[cfg(test)]\nmod tests {{\n    fn long_test() {{\n{body}    }}\n}}\n\
         fn one_line() {{}}\n"
    );
    assert_eq!(long_functions(&text, 100), []);
    let found = long_functions(&text, 5);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!((found[0].0, found[0].1), (12, 10));
    assert!(found[0].2.starts_with("pub(crate) async fn long("));
}
