//! The Markdown's embedded files (`<!-- example: PATH -->`) and generated sections (`<!-- generated: ID -->`)
//! are current; every snippet and example input is shown somewhere.

use std::collections::BTreeSet;
use std::fs;

use crate::examples::{examples, refresh_examples};
use crate::metrics::metrics_table;
use crate::snippets::snippet_matrix;
use crate::support::{markdown_files, read, root, snippet_files, updating};
use crate::tables::{env_tables, precedence_matrix};

/// Rewrites `text` with every embedded file and generated section brought up to date; also returns what was stale.
fn refresh_markdown(file: &str, text: &str) -> (String, Vec<String>) {
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let mut out = String::with_capacity(text.len());
    let mut stale = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        out.push_str(line);
        let trimmed = line.trim();
        if let Some(path) = trimmed
            .strip_prefix("<!-- example: ")
            .and_then(|s| s.strip_suffix(" -->"))
        {
            let fence = lines.get(i + 1).copied().unwrap_or("");
            assert!(
                fence.trim_start().starts_with("```"),
                "{file}:{}: the marker for {path} must be followed by a fenced block",
                i + 1
            );
            out.push_str(fence);
            let start = i + 2;
            let end = (start..lines.len())
                .find(|&j| lines[j].trim() == "```")
                .unwrap_or_else(|| panic!("{file}:{}: unclosed block for {path}", i + 2));
            let current: String = lines[start..end].concat();
            let mut wanted = read(path);
            if !wanted.ends_with('\n') {
                wanted.push('\n');
            }
            if current != wanted {
                stale.push(format!("{file}:{}: block for {path}", i + 1));
            }
            out.push_str(&wanted);
            out.push_str(lines[end]);
            i = end + 1;
            continue;
        }
        if let Some(id) = trimmed
            .strip_prefix("<!-- generated: ")
            .and_then(|s| s.strip_suffix(" -->"))
        {
            let end_marker = format!("<!-- end generated: {id} -->");
            let end = (i + 1..lines.len())
                .find(|&j| lines[j].trim() == end_marker)
                .unwrap_or_else(|| panic!("{file}:{}: no {end_marker}", i + 1));
            let current: String = lines[i + 1..end].concat();
            let wanted =
                generate(id).unwrap_or_else(|| panic!("{file}: unknown generated id {id}"));
            if current != wanted {
                stale.push(format!("{file}:{}: generated section {id}", i + 1));
            }
            out.push_str(&wanted);
            out.push_str(lines[end]);
            i = end + 1;
            continue;
        }
        i += 1;
    }
    (out, stale)
}

#[test]
fn markdown_embeds_current_examples_and_generated_sections() {
    refresh_examples();
    let mut stale = Vec::new();
    let mut embedded = BTreeSet::new();
    for file in markdown_files() {
        let text = read(&file);
        for line in text.lines() {
            if let Some(path) = line
                .trim()
                .strip_prefix("<!-- example: ")
                .and_then(|s| s.strip_suffix(" -->"))
            {
                embedded.insert(path.to_string());
            }
        }
        let (fresh, file_stale) = refresh_markdown(&file, &text);
        if updating() {
            if fresh != text {
                fs::write(root().join(&file), fresh).unwrap();
            }
        } else {
            stale.extend(file_stale);
        }
    }
    assert!(
        stale.is_empty(),
        "stale blocks (refresh with UPDATE_GOLDEN=1 and review the diff):\n{}",
        stale.join("\n")
    );
    // Every snippet file is shown somewhere (a snippet nobody sees is a snippet nobody keeps right).
    for snippet in snippet_files() {
        assert!(
            embedded.contains(&snippet),
            "{snippet} is not embedded in any Markdown file"
        );
    }
    // Every example input is shown.
    for example in examples() {
        assert!(
            embedded.contains(&example.input()),
            "{} is not embedded in any Markdown file",
            example.input()
        );
    }
}

fn generate(id: &str) -> Option<String> {
    Some(match id {
        "precedence-matrix" => precedence_matrix(),
        "env-vars" => env_tables(),
        "metrics" => metrics_table(),
        "snippet-matrix" => snippet_matrix(),
        _ => return None,
    })
}
