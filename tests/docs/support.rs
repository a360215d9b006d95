//! Helpers shared by the modules: the binary and the repository's files (scratch directories, child processes
//! and tools come from pdp-testkit).

use std::fs;
use std::path::PathBuf;

/// The binary under test, built by cargo for the integration tests.
pub const BIN: &str = env!("CARGO_BIN_EXE_pdp-injector");

/// The repository root: every path in the docs is relative to it.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A file of the repository, by its path from the root.
pub fn read(rel: &str) -> String {
    fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// One key of a ConfigMap in a manifests file (`rel`), for example the Cerbos config the node-local PDP reads.
pub fn configmap_data(rel: &str, name: &str, key: &str) -> String {
    let docs = pdp_core::offline::parse_stream(&read(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
    docs.iter()
        .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == name)
        .and_then(|d| d["data"][key].as_str())
        .unwrap_or_else(|| panic!("{rel}: no ConfigMap {name} with data {key}"))
        .to_string()
}

/// `UPDATE_GOLDEN=1`: refresh the expected files instead of comparing (refused under CI=true).
pub fn updating() -> bool {
    pdp_testkit::skip::refreshing()
}

/// The Markdown files of the guide (README.md, docs/*.md, CONTRIBUTING.md), relative to the repository root.
pub fn markdown_files() -> Vec<String> {
    let mut files = vec!["README.md".to_string()];
    let mut docs: Vec<String> = fs::read_dir(root().join("docs"))
        .expect("docs/ exists")
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    docs.sort();
    files.extend(docs);
    files.push("CONTRIBUTING.md".to_string());
    files
}

/// Snippet files (docs/snippets/*), relative to the repository root.
pub fn snippet_files() -> Vec<String> {
    let mut files: Vec<String> = fs::read_dir(root().join("docs/snippets"))
        .expect("docs/snippets/ exists")
        .map(|e| format!("docs/snippets/{}", e.unwrap().file_name().to_string_lossy()))
        .collect();
    files.sort();
    files
}
