//! The layers point one way (docs/architecture.md). The compiler keeps the big rule: the pure core is its own
//! crate, `crates/pdp-core`, whose `Cargo.toml` has no runtime, server, Kubernetes client, logging or command line,
//! so nothing there can do I/O through them. What the compiler cannot say is checked here:
//! - the core crate's manifest keeps that list (a dependency added later fails here, not in review);
//! - inside the core crate, each module uses only the layers listed for it (`use crate::X`);
//! - the binary crate holds the command line only (each capability is a crate whose manifest is its rule);
//! - the core's decision modules name no `std` I/O either (`std::fs`, `std::net`, ...), which needs no crate.
//!
//! A `use` that breaks a rule fails with the file and line.

use std::path::{Path, PathBuf};

/// Each layer of the core crate and the layers of that crate it may use.
const CORE_LAYERS: &[(&str, &[&str])] = &[
    ("names", &[]),
    ("duration", &[]),
    ("size", &[]),
    ("flag_sets", &[]),
    // The JSON reader (serde_json's answers, sooner): below everything that reads JSON.
    ("json", &[]),
    ("pki", &[]),
    ("route", &[]),
    ("peer", &[]),
    // HTTP/2 frame headers, for the node front and the CSI plugin.
    ("h2frame", &[]),
    ("config", &["names"]),
    ("core", &["names", "config", "json", "flag_sets"]),
    ("admission", &["names", "config", "core", "json"]),
    ("offline", &["names", "config", "core"]),
    ("check", &["names", "config", "core", "pki"]),
];

/// Modules of the core crate that decide and may not even touch `std`'s I/O. `config` may read its own file,
/// `pki` reads the clock for validity, `route` compares instance times.
const NO_STD_IO: &[&str] = &[
    "names",
    "duration",
    "size",
    "flag_sets",
    "peer",
    "json",
    "core",
    "admission",
    "check",
];

/// What the pure modules may not name.
const STD_IO: &[&str] = &[
    "std::fs",
    "std::net::Tcp",
    "std::net::Udp",
    "std::io::std",
    "std::process",
    "std::env",
    "std::thread",
];

/// What the core crate may not depend on: I/O, the runtime, the server stack, the client, logs, the CLI.
const IMPURE_CRATES: &[&str] = &[
    "tokio",
    "axum",
    "axum-server",
    "hyper",
    "hyper-util",
    "kube",
    "tracing",
    "tracing-subscriber",
    "clap",
    "tokio-rustls",
    "prometheus-client",
    "libc",
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

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

/// Every breach of `layers` in the crate whose sources are `src`.
fn breaches(src: &Path, layers: &[(&str, &[&str])], pure: &[&str]) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    let mut problems = Vec::new();
    for file in &files {
        let Some(layer) = layer_of(src, file) else {
            continue;
        };
        let Some((_, allowed)) = layers.iter().find(|(l, _)| *l == layer) else {
            problems.push(format!(
                "{}: layer {layer:?} is not in tests/it/layers.rs",
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
            if pure.contains(&layer.as_str()) {
                for word in STD_IO {
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
    problems
}

#[test]
fn the_core_crate_depends_on_nothing_impure() {
    let manifest = std::fs::read_to_string(root().join("crates/pdp-core/Cargo.toml")).unwrap();
    let mut section = "";
    let mut deps = Vec::new();
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            section = line;
            continue;
        }
        // Tests may use anything; what ships may not.
        if matches!(section, "[dependencies]" | "[build-dependencies]")
            && let Some((name, _)) = line.split_once('=')
            && !line.starts_with('#')
        {
            deps.push(name.trim().to_string());
        }
    }
    assert!(
        deps.iter().any(|d| d == "k8s-openapi"),
        "the manifest's layout changed: {deps:?}"
    );
    let impure: Vec<&String> = deps
        .iter()
        .filter(|d| IMPURE_CRATES.contains(&d.as_str()))
        .collect();
    assert!(
        impure.is_empty(),
        "crates/pdp-core depends on {impure:?}: the core stays pure (docs/architecture.md)"
    );
}

#[test]
fn layers_point_one_way_in_the_core() {
    let problems = breaches(&root().join("crates/pdp-core/src"), CORE_LAYERS, NO_STD_IO);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The binary crate is the command line only: every capability is a crate of the workspace, whose Cargo.toml
/// says what it may use.
#[test]
fn the_binary_crate_is_only_the_command_line() {
    let mut entries: Vec<String> = std::fs::read_dir(root().join("src"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    entries.sort();
    assert_eq!(
        entries,
        ["cli", "lib.rs", "main.rs"],
        "src/ holds the command line only; put a capability in its crate (docs/architecture.md)"
    );
}

/// The check can fail: a file of the core that used the webhook, or a pure module that opened a file, is found.
#[test]
fn a_breach_is_found() {
    let scratch = pdp_testkit::dir::TempDir::new("layers");
    let dir = scratch.path();
    std::fs::create_dir_all(dir.join("core")).unwrap();
    std::fs::write(
        dir.join("core/bad.rs"),
        "use crate::admission::x;\nfn f() { std::fs::read(\"a\"); }\n#[cfg(test)]\nuse crate::check;\n",
    )
    .unwrap();
    let found = breaches(dir, CORE_LAYERS, NO_STD_IO);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found[0].ends_with("bad.rs:1: layer core uses crate::admission"));
    assert!(found[1].ends_with("bad.rs:2: the pure layer core names std::fs"));
}
