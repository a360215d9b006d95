//! Golden files: every `tests/golden/<dir>/<case>.in.yaml` goes through the offline injector (the same core as
//! the webhook) with the directory's `config.yaml` and the flags of its `options.args`, and must produce
//! `<case>.out.yaml` exactly. The harness is shared with docs/examples (tests/common/golden.rs): refresh both with
//! `UPDATE_GOLDEN=1 cargo test --test it --test docs` and review the diff as a reviewer would.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use pdp_core::config::Config;
use pdp_core::offline::{self, Options};

fn golden_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

fn load_dir(dir: &Path) -> (Config, Options) {
    let config_path = dir.join("config.yaml");
    let mut config = if config_path.exists() {
        Config::load(&config_path).unwrap_or_else(|e| panic!("{}: {e}", config_path.display()))
    } else {
        Config::builtin()
    };
    let args = fs::read_to_string(dir.join("options.args")).unwrap_or_default();
    let flags = crate::common::golden::flags(&args, dir)
        .unwrap_or_else(|e| panic!("{}/options.args: {e}", dir.display()));
    assert!(
        flags.config.is_none(),
        "{}/options.args: the directory's config.yaml is the config",
        dir.display()
    );
    // As `inject --csi-driver`: a cluster with the node plugin's CSIDriver.
    if flags.csi_driver {
        config = config.with_csi_driver(true);
    }
    (config, flags.options)
}

/// Renders what the golden file holds for one input: a commented report, then the output stream.
fn render_case(input: &str, config: &Config, options: &Options) -> String {
    match offline::inject_stream(input, config, options) {
        Err(e) => format!("# error: {e}\n"),
        Ok((output, reports)) => {
            let mut text = String::new();
            for r in &reports {
                let what = r.reason.map(|r| r.code()).unwrap_or("passed through");
                writeln!(text, "# {}: {what}", r.heading()).unwrap();
                for w in &r.warnings {
                    writeln!(text, "#   warning: {w}").unwrap();
                }
            }
            text.push_str(&output);
            text
        }
    }
}

pub fn cases() -> Vec<(PathBuf, PathBuf)> {
    let mut cases = Vec::new();
    for dir in fs::read_dir(golden_root()).unwrap() {
        let dir = dir.unwrap().path();
        if !dir.is_dir() {
            continue;
        }
        for f in fs::read_dir(&dir).unwrap() {
            let f = f.unwrap().path();
            let name = f.file_name().unwrap().to_string_lossy().to_string();
            if let Some(stem) = name.strip_suffix(".in.yaml") {
                cases.push((f.clone(), dir.join(format!("{stem}.out.yaml"))));
            }
        }
    }
    cases.sort();
    cases
}

#[test]
fn golden_files_match() {
    let cases = cases();
    assert!(cases.len() >= 25, "only {} golden cases", cases.len());
    let mut expected = crate::common::golden::Expected::default();
    for (input_path, expected_path) in &cases {
        let (config, options) = load_dir(input_path.parent().unwrap());
        let input = fs::read_to_string(input_path).unwrap();
        let actual = render_case(&input, &config, &options);
        expected.check(
            &input_path.display().to_string(),
            expected_path,
            Some(&actual),
        );
    }
    expected.assert_none();
}

#[test]
fn golden_outputs_are_fixed_points() {
    // Injecting the output again changes nothing: the webhook on its own output gives an empty patch.
    for (input_path, _) in cases() {
        let (config, options) = load_dir(input_path.parent().unwrap());
        let input = fs::read_to_string(&input_path).unwrap();
        let Ok((once, _)) = offline::inject_stream(&input, &config, &options) else {
            continue;
        };
        let (twice, reports) = offline::inject_stream(&once, &config, &options)
            .unwrap_or_else(|e| panic!("{}: second pass failed: {e}", input_path.display()));
        assert_eq!(
            once,
            twice,
            "{}: second pass changed the output",
            input_path.display()
        );
        for r in reports {
            if let Some(reason) = r.reason {
                assert!(
                    !matches!(
                        reason.code(),
                        "injected_sidecar" | "injected_daemonset" | "injected_central" | "rewired"
                    ),
                    "{}: second pass injected document {}",
                    input_path.display(),
                    r.index
                );
            }
        }
    }
}

#[test]
fn golden_outputs_keep_every_input_field() {
    for (input_path, _) in cases() {
        let (config, options) = load_dir(input_path.parent().unwrap());
        let input = fs::read_to_string(&input_path).unwrap();
        let Ok((output, _)) = offline::inject_stream(&input, &config, &options) else {
            continue;
        };
        let before = offline::parse_stream(&input).unwrap();
        let after = offline::parse_stream(&output).unwrap();
        assert_eq!(before.len(), after.len(), "{}", input_path.display());
        for (b, a) in before.iter().zip(&after) {
            // Our own status annotations (one per profile) are the input fields the injector may rewrite (on
            // re-wiring).
            let mut b = b.clone();
            for annotations in [
                "/metadata/annotations",
                "/spec/template/metadata/annotations",
            ] {
                if let Some(map) = b.pointer_mut(annotations).and_then(|m| m.as_object_mut()) {
                    map.retain(|k, _| !k.starts_with("pdp-injector.io/status"));
                }
            }
            if let Err(path) = crate::common::contains::contains(a, &b, "") {
                panic!(
                    "{}: input field {path} lost or changed",
                    input_path.display()
                );
            }
        }
    }
}
