//! Every `docs/examples/<name>.in.yaml` through the offline injector (the library and the binary), against its
//! expected stdout and stderr; outputs are fixed points and valid Kubernetes objects.

use std::fs;
use std::process::{Command, Output, Stdio};
use std::sync::Once;

use pdp_core::config::Config;
use pdp_core::offline::{self, Options};

use crate::support::{BIN, read, root, updating};

/// One `docs/examples/<stem>.in.yaml` and the flags of its `<stem>.args`.
pub struct Example {
    pub stem: String,
    pub args: Vec<String>,
}

impl Example {
    pub fn input(&self) -> String {
        format!("docs/examples/{}.in.yaml", self.stem)
    }
    pub fn output(&self) -> String {
        format!("docs/examples/{}.out.yaml", self.stem)
    }
    pub fn stderr(&self) -> String {
        format!("docs/examples/{}.stderr.txt", self.stem)
    }

    /// The example's flags, read as tests/golden reads its `options.args` (tests/common/golden.rs).
    fn flags(&self) -> crate::common::golden::Flags {
        crate::common::golden::flags(&self.args.join(" "), &root())
            .unwrap_or_else(|e| panic!("{}.args: {e}", self.stem))
    }

    /// The library's options for the example's command-line flags.
    pub fn options(&self) -> Options {
        self.flags().options
    }

    /// The config of the example's `--config FILE` (a path from the repository root), else the built-in one.
    pub fn config(&self) -> Config {
        match self.flags().config {
            Some(path) => Config::load(&path).unwrap_or_else(|e| panic!("{}: {e}", self.stem)),
            None => Config::builtin(),
        }
    }

    /// `pdp-injector inject <args> -f docs/examples/<stem>.in.yaml`, run from the repository root.
    pub fn run_cli(&self) -> Output {
        let mut cmd = Command::new(BIN);
        cmd.current_dir(root()).arg("inject").args(&self.args);
        cmd.args(["-f", &self.input()]);
        for var in [
            "PDP_INJECTOR_INPUT",
            "PDP_INJECTOR_MODE",
            "PDP_INJECTOR_PROFILE",
            "PDP_INJECTOR_NAMESPACE",
            "PDP_INJECTOR_CONFIG",
        ] {
            cmd.env_remove(var);
        }
        cmd.output().expect("pdp-injector runs")
    }
}

/// Every example, sorted by stem.
pub fn examples() -> Vec<Example> {
    let mut out = Vec::new();
    for entry in fs::read_dir(root().join("docs/examples")).expect("docs/examples/ exists") {
        let name = entry.unwrap().file_name().to_string_lossy().to_string();
        if let Some(stem) = name.strip_suffix(".in.yaml") {
            let args_path = root().join(format!("docs/examples/{stem}.args"));
            let args = fs::read_to_string(&args_path)
                .map(|s| s.split_whitespace().map(String::from).collect())
                .unwrap_or_default();
            out.push(Example {
                stem: stem.to_string(),
                args,
            });
        }
    }
    out.sort_by(|a, b| a.stem.cmp(&b.stem));
    assert!(out.len() >= 15, "only {} examples", out.len());
    out
}

/// What the library makes of an example: the output stream, or the error message.
fn run_library(example: &Example) -> Result<String, String> {
    let input = read(&example.input());
    offline::inject_stream(&input, &example.config(), &example.options())
        .map(|(out, _)| out)
        .map_err(|e| e.to_string())
}

static REFRESH_EXAMPLES: Once = Once::new();

/// With UPDATE_GOLDEN, rewrites every example's expected files (once per test process, before anyone reads them).
pub fn refresh_examples() {
    if !updating() {
        return;
    }
    REFRESH_EXAMPLES.call_once(|| {
        for example in examples() {
            let out_path = root().join(example.output());
            match run_library(&example) {
                Ok(out) => fs::write(&out_path, out).unwrap(),
                Err(_) => {
                    let _ = fs::remove_file(&out_path);
                }
            }
            let cli = example.run_cli();
            fs::write(root().join(example.stderr()), &cli.stderr).unwrap();
        }
    });
}

#[test]
fn examples_match_the_injector() {
    refresh_examples();
    let mut expected = crate::common::golden::Expected::default();
    for example in examples() {
        let library = run_library(&example);
        let output = root().join(example.output());
        expected.check(&example.input(), &output, library.as_deref().ok());

        // The binary, exactly as the docs show the command: same stdout, the expected stderr, and failure
        // exactly when the library refuses the input.
        let cli = example.run_cli();
        let stdout = String::from_utf8(cli.stdout).unwrap();
        let stderr = String::from_utf8(cli.stderr).unwrap();
        assert_eq!(
            cli.status.success(),
            library.is_ok(),
            "{}: exit status {} but the library says {library:?}\n{stderr}",
            example.input(),
            cli.status
        );
        if let Ok(out) = &library {
            assert_eq!(&stdout, out, "{}: CLI stdout", example.input());
        } else {
            assert_eq!(stdout, "", "{}: CLI stdout on refusal", example.input());
            let message = library.as_ref().unwrap_err();
            assert_eq!(
                stderr,
                format!("error: {message}\n"),
                "{}: CLI error",
                example.input()
            );
        }
        let what = format!("{} (stderr)", example.input());
        expected.check(&what, &root().join(example.stderr()), Some(&stderr));
    }
    expected.assert_none();
}

#[test]
fn examples_outputs_are_fixed_points() {
    // What the docs show as injected is what the webhook leaves alone when it sees it again.
    for example in examples() {
        let Ok(once) = run_library(&example) else {
            continue;
        };
        let (twice, _) = offline::inject_stream(&once, &example.config(), &example.options())
            .unwrap_or_else(|e| panic!("{}: second pass: {e}", example.input()));
        assert_eq!(once, twice, "{}: second pass changed it", example.input());
    }
}

#[test]
fn examples_validate_against_the_kubernetes_schema() {
    // What the docs tell users to apply, and what they show as injected, are valid Kubernetes 1.33 objects.
    // .ci/run installs kubernetes-validate before the tests; elsewhere this check needs it installed.
    let available = Command::new("python3")
        .args(["-c", "import kubernetes_validate, yaml"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !available {
        pdp_testkit::skip::cannot_run(
            "python3 with kubernetes-validate is needed to validate docs/examples",
        );
        return;
    }
    let mut files = Vec::new();
    for example in examples() {
        files.push(example.input());
        if root().join(example.output()).exists() {
            files.push(example.output());
        }
    }
    let out = Command::new("python3")
        .arg("scripts/validate_k8s.py")
        .args(&files)
        .current_dir(root())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
