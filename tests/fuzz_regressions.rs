//! Replays, as ordinary tests, every input the fuzz targets must keep passing: the crashes fuzzing found
//! (`fuzz/regressions/<target>/`, minimised and committed) and the seeds the fuzz corpus starts from (the golden
//! files and fixtures), through the same property checks as the targets (`fuzz/src/checks.rs`).

use std::fs;
use std::path::{Path, PathBuf};

mod checks {
    include!("../fuzz/src/checks.rs");
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn files(dir: &Path, keep: &dyn Fn(&str) -> bool) -> Vec<PathBuf> {
    let mut out = vec![];
    let Ok(entries) = fs::read_dir(dir) else {
        return out;
    };
    for e in entries {
        let path = e.unwrap().path();
        if path.is_dir() {
            out.extend(files(&path, keep));
        } else if keep(&path.to_string_lossy()) {
            out.push(path);
        }
    }
    out.sort();
    out
}

fn replay(target: &str, check: fn(&[u8]), seeds: Vec<PathBuf>) {
    let found = files(&root().join("fuzz/regressions").join(target), &|_| true);
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
}

#[test]
fn review_regressions_and_seeds() {
    replay(
        "review",
        checks::review,
        files(&root().join("tests/fixtures"), &|p| p.ends_with(".json")),
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
    replay("config", checks::config, seeds);
}

#[test]
fn offline_regressions_and_seeds() {
    let mut seeds = files(&root().join("tests/golden"), &|p| p.ends_with(".yaml"));
    seeds.extend(files(&root().join("examples"), &|p| p.ends_with(".yaml")));
    replay("offline", checks::offline, seeds);
}

/// Found by the `offline` target: a document that reads as null (a tagged empty node such as `!tag`) is printed as
/// `null`, and `inject` on that output drops it (an explicit `null` document is skipped when read), so the
/// output is not a fixed point and later documents change their index in messages.
#[test]
fn offline_null_document_is_a_fixed_point() {
    use pdp_injector::config::Config;
    use pdp_injector::offline::{Options, inject_stream};
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
