//! Replays, as ordinary tests, every input the fuzz targets must keep passing: the crashes fuzzing found
//! (`fuzz/regressions/<target>/`, minimised and committed) and the seeds the fuzz corpus starts from (the golden
//! files and fixtures), through the same property checks as the targets (`fuzz/src/checks.rs`).

use std::fs;
use std::path::{Path, PathBuf};

mod checks {
    include!("../../fuzz/src/checks.rs");
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The files under `dir` (recursively) that `keep` accepts, dot files aside. A directory that cannot be read or
/// gives none is a failure: a replay that finds no input proves nothing.
fn files(dir: &Path, keep: &dyn Fn(&str) -> bool) -> Vec<PathBuf> {
    let out = files_in(dir, keep);
    assert!(
        !out.is_empty(),
        "{}: no input to replay (missing, unreadable or empty)",
        dir.display()
    );
    out
}

fn files_in(dir: &Path, keep: &dyn Fn(&str) -> bool) -> Vec<PathBuf> {
    let entries = fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut out = vec![];
    for e in entries {
        let path = e.unwrap().path();
        let dot = path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with('.'));
        if path.is_dir() {
            out.extend(files_in(&path, keep));
        } else if !dot && keep(&path.to_string_lossy()) {
            out.push(path);
        }
    }
    out.sort();
    out
}

/// Every committed crash input of `target` (its directory must exist; `config` has none yet) and every seed,
/// through `check`; at least `least` inputs in all (what is committed today), so that a lost corpus fails
/// rather than passes.
fn replay(target: &str, check: fn(&[u8]), seeds: Vec<PathBuf>, least: usize) {
    let found = files_in(&root().join("fuzz/regressions").join(target), &|_| true);
    for path in found.iter().chain(&seeds) {
        let bytes = fs::read(path).unwrap();
        if let Err(panic) = std::panic::catch_unwind(|| check(&bytes)) {
            let msg = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            panic!("{target}: {} fails: {msg}", path.display());
        }
    }
    eprintln!(
        "{target}: {} regression inputs, {} seeds",
        found.len(),
        seeds.len()
    );
    let replayed = found.len() + seeds.len();
    assert!(
        replayed >= least,
        "{target}: {replayed} inputs replayed, fewer than the {least} committed"
    );
}

#[test]
fn review_regressions_and_seeds() {
    replay(
        "review",
        checks::review,
        files(&root().join("tests/fixtures"), &|p| p.ends_with(".json")),
        4,
    );
}

#[test]
fn config_regressions_and_seeds() {
    let mut seeds = files(&root().join("tests/golden"), &|p| {
        p.ends_with("/config.yaml")
    });
    seeds.extend(files(&root().join("manifests"), &|p| {
        p.ends_with("/config.yaml")
    }));
    seeds.extend(files(&root().join("fuzz/seeds/config"), &|_| true));
    replay("config", checks::config, seeds, 15);
}

#[test]
fn offline_regressions_and_seeds() {
    let mut seeds = files(&root().join("tests/golden"), &|p| p.ends_with(".yaml"));
    seeds.extend(files(&root().join("examples"), &|p| p.ends_with(".yaml")));
    replay("offline", checks::offline, seeds, 211);
}

/// Found by the `offline` target: a document that reads as null (a tagged empty node such as `!tag`) is printed as
/// `null`, and `inject` on that output drops it (an explicit `null` document is skipped when read), so the
/// output is not a fixed point and later documents change their index in messages.
#[test]
fn offline_null_document_is_a_fixed_point() {
    use pdp_core::config::Config;
    use pdp_core::offline::{Options, inject_stream};
    let input = "# A namespace\n!tag\n---\nkind: ConfigMap\n";
    let (out, reports) = inject_stream(input, &Config::builtin(), &Options::default()).unwrap();
    let (again, reports_again) =
        inject_stream(&out, &Config::builtin(), &Options::default()).unwrap();
    assert_eq!(
        reports.len(),
        reports_again.len(),
        "documents: {out:?} -> {again:?}"
    );
    assert_eq!(again, out);
}
