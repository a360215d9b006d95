//! SECURITY.md's threat table against the tests it cites: every cited test exists where the row says, and runs
//! in CI (`.ci/run`), unless the row says where and how it is checked instead.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use crate::support::{read, root};

/// Every Rust source file of the repository's tests and src, by path from the root.
fn sources() -> BTreeMap<String, String> {
    fn walk(dir: &Path, out: &mut BTreeMap<String, String>) {
        let Ok(entries) = fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs" || x == "py") {
                let rel = p
                    .strip_prefix(root())
                    .unwrap()
                    .to_string_lossy()
                    .to_string();
                out.insert(rel, fs::read_to_string(&p).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    for d in [
        "src",
        "crates",
        "scripts",
        "tests",
        "tools/pdp-await/src",
        "fuzz/src",
    ] {
        walk(&root().join(d), &mut out);
    }
    out
}

/// Where `fn name` (Rust) or `def name` (the Python tiers' pytest tests) is defined in `text`: the attributes
/// right above it (`#[test]`, `#[ignore = ...]`).
fn attributes_of(text: &str, name: &str) -> Option<String> {
    let lines: Vec<&str> = text.lines().collect();
    let at = lines.iter().position(|l| {
        let l = l.trim_start();
        let l = l.strip_prefix("pub ").unwrap_or(l);
        let l = l.strip_prefix("async ").unwrap_or(l);
        l.strip_prefix("fn ")
            .or_else(|| l.strip_prefix("def "))
            .is_some_and(|rest| {
                rest.starts_with(name) && rest[name.len()..].starts_with(['(', '<'])
            })
    })?;
    let mut attrs = vec![];
    for l in lines[..at].iter().rev() {
        let t = l.trim();
        if t.starts_with("#[") || t.starts_with("///") {
            attrs.push(t);
        } else {
            break;
        }
    }
    Some(attrs.join("\n"))
}

/// The backticked references of one "covered by" cell: `tests/x.rs::name`, `::name` (the file named last), and
/// bare test-like names (`name_with_underscores`), each as (file or "", name).
fn references(cell: &str) -> Vec<(String, String)> {
    let mut out = vec![];
    let mut file = String::new();
    for (i, token) in cell.split('`').enumerate() {
        if i % 2 == 0 {
            continue;
        }
        if let Some((path, name)) = token.split_once("::") {
            if !path.is_empty() {
                file = path.to_string();
            }
            if name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') && !name.is_empty() {
                out.push((file.clone(), name.to_string()));
            }
        } else if token.ends_with(".rs") {
            file = token.to_string();
        } else if token.matches('_').count() >= 2
            && token
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        {
            out.push((String::new(), token.to_string()));
        }
    }
    out
}

#[test]
fn every_threat_row_cites_tests_that_exist_and_run_in_ci() {
    let security = read("SECURITY.md");
    let sources = sources();
    let ci = read(".ci/run");
    let hostile_in_ci = ci.contains("scripts/hostile.sh")
        && read("scripts/hostile.sh").contains("--include-ignored");
    let mut rows = 0;
    let mut problems = vec![];
    for line in security.lines() {
        let cells: Vec<&str> = line.split(" | ").collect();
        // | # | threat | defence | covered by |
        if cells.len() < 4
            || !cells[0]
                .trim_start_matches('|')
                .trim()
                .chars()
                .all(|c| c.is_ascii_digit())
        {
            continue;
        }
        let row = cells[0].trim_start_matches('|').trim();
        if row.is_empty() {
            continue;
        }
        rows += 1;
        let cell = cells[cells.len() - 1];
        let elsewhere = cell.contains("not in CI");
        let refs = references(cell);
        if refs.is_empty() && !cell.contains("scripts/") && !cell.contains("golden") {
            problems.push(format!("row {row}: cites no test"));
        }
        for (file, name) in refs {
            let found: Vec<(&String, String)> = sources
                .iter()
                .filter(|(path, _)| file.is_empty() || path.starts_with(file.trim_end_matches('/')))
                .filter_map(|(path, text)| attributes_of(text, &name).map(|a| (path, a)))
                .collect();
            let Some((path, attrs)) = found.first() else {
                problems.push(format!(
                    "row {row}: `{file}::{name}` does not exist (no `fn {name}` in {})",
                    if file.is_empty() {
                        "src/ or tests/"
                    } else {
                        &file
                    }
                ));
                continue;
            };
            if attrs.contains("#[ignore") {
                let by_hostile = path.as_str() == "tests/hostile/main.rs" && hostile_in_ci;
                if !by_hostile && !elsewhere {
                    problems.push(format!(
                        "row {row}: `{path}::{name}` is #[ignore]d and no CI stage runs it: run it in .ci/run or \
                         say in the row where and how it is checked (\"not in CI: ...\")"
                    ));
                }
            }
        }
    }
    assert!(
        rows >= 30,
        "SECURITY.md's threat table has {rows} rows: has its shape changed?"
    );
    assert!(problems.is_empty(), "SECURITY.md:\n{}", problems.join("\n"));
}

#[test]
fn references_are_read_from_a_cell() {
    let refs = references(
        "`tests/a.rs::one`, `::two` [long], `crates/pdp-core/src/config/` unit tests `three_four_five`, fuzz target `review`",
    );
    assert_eq!(
        refs,
        vec![
            ("tests/a.rs".into(), "one".into()),
            ("tests/a.rs".into(), "two".into()),
            (String::new(), "three_four_five".into()),
        ]
    );
}
