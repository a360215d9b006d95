//! The layers of src/ point one way (docs/architecture.md): each module uses only the layers listed for it, and
//! the core does no I/O and never touches an async runtime, a web framework or a Kubernetes client. A `use` that
//! breaks the rule fails here with the file and line, not in review.

use std::path::{Path, PathBuf};

/// Each layer and the layers of this crate it may use.
const LAYERS: &[(&str, &[&str])] = &[
    ("names", &[]),
    ("duration", &[]),
    ("size", &[]),
    ("config", &["names"]),
    ("core", &["names", "config"]),
    ("admission", &["names", "config", "core"]),
    ("tls", &[]),
    ("cluster", &["names", "config", "core", "tls"]),
    (
        "webhook",
        &[
            "names",
            "config",
            "core",
            "admission",
            "tls",
            "cluster",
            "duration",
            "size",
        ],
    ),
    ("offline", &["names", "config", "core"]),
    // Reads the cluster, so not in the core; judges Pods with the core and adapts the config exactly as the
    // webhook does (webhook::server::ClusterFit), so the hashes it compares are the ones the webhook writes.
    (
        "check",
        &["names", "config", "core", "tls", "cluster", "webhook"],
    ),
    // The front uses tls for the serving configuration and its reload, shared with the webhook, and the
    // duration syntax every flag of the binary reads alike.
    ("node", &["tls", "duration", "size"]),
];

/// What the pure layers may not name: I/O, the runtime, the server stack, the Kubernetes client.
const IMPURE: &[&str] = &[
    "tokio",
    "axum",
    "hyper",
    "kube::",
    "std::fs",
    "std::net",
    "std::io",
    "std::process",
    "std::env",
    "std::thread",
    "tracing",
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The layer a source file belongs to: its folder, or its own name at the top of src/.
fn layer_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (!matches!(name, "lib" | "main")).then(|| name.to_string())
}

/// The code of a file without its comments and its `#[cfg(test)]` module (tests may use anything).
fn code_lines(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("#[cfg(test)]") {
            break;
        }
        if trimmed.starts_with("//") {
            continue;
        }
        out.push((n + 1, line.split(" //").next().unwrap().to_string()));
    }
    out
}

#[test]
fn layers_point_one_way_and_the_core_is_pure() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut problems = Vec::new();
    let mut seen_layers = std::collections::BTreeSet::new();
    for file in &files {
        let Some(layer) = layer_of(&src, file) else {
            continue;
        };
        seen_layers.insert(layer.clone());
        let Some((_, allowed)) = LAYERS.iter().find(|(l, _)| *l == layer) else {
            problems.push(format!(
                "{}: layer {layer:?} is not in tests/layers.rs",
                file.display()
            ));
            continue;
        };
        let text = std::fs::read_to_string(file).unwrap();
        for (line_no, line) in code_lines(&text) {
            let mut rest = line.as_str();
            while let Some(at) = rest.find("crate::") {
                let after = &rest[at + "crate::".len()..];
                let used: String = after
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if used != layer && !allowed.contains(&used.as_str()) {
                    problems.push(format!(
                        "{}:{line_no}: layer {layer} uses crate::{used}",
                        file.display()
                    ));
                }
                rest = after;
            }
            if matches!(
                layer.as_str(),
                "names" | "duration" | "size" | "core" | "admission"
            ) {
                for word in IMPURE {
                    if line.contains(word) {
                        problems.push(format!(
                            "{}:{line_no}: the pure layer {layer} names {word}",
                            file.display()
                        ));
                    }
                }
            }
        }
    }
    assert!(
        seen_layers.contains("core") && seen_layers.contains("webhook"),
        "the layout changed: {seen_layers:?}"
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
