// Shared by tests/it/golden.rs and tests/docs (the examples): expected files compared with what the offline
// injector makes, refreshed with `UPDATE_GOLDEN=1` (pdp_testkit::skip), and the flags of `pdp-injector inject`
// that a case's `.args` file holds, read as the binary reads them.

use std::path::{Path, PathBuf};

use pdp_core::offline::Options;

/// The flags of a case: the library's options and the `--config` file, if any (relative to `base`).
pub struct Flags {
    /// `--mode` and `--namespace` (default `default`, as the binary's).
    pub options: Options,
    /// `--config FILE`.
    pub config: Option<PathBuf>,
    /// `--csi-driver` (no value): as in a cluster with the node plugin's CSIDriver.
    pub csi_driver: bool,
}

/// Reads `inject`'s flags from the text of an `.args` file: whitespace-separated, `#` starts a comment line.
pub fn flags(text: &str, base: &Path) -> Result<Flags, String> {
    let words: Vec<&str> = text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .flat_map(str::split_whitespace)
        .collect();
    let mut flags = Flags {
        options: Options {
            mode: None,
            default_namespace: Some("default".into()),
            // As the command runs on two CPUs (the goldens are short: one run whatever the number).
            workers: 2,
        },
        config: None,
        csi_driver: false,
    };
    let mut words = words.into_iter();
    while let Some(flag) = words.next() {
        if flag == "--csi-driver" {
            flags.csi_driver = true;
            continue;
        }
        let value = words
            .next()
            .ok_or_else(|| format!("flag {flag} without a value"))?
            .to_string();
        match flag {
            "--mode" => flags.options.mode = Some(value),
            "--namespace" => flags.options.default_namespace = Some(value),
            "--config" => flags.config = Some(base.join(value)),
            other => return Err(format!("flag {other} is not supported in an .args file")),
        }
    }
    Ok(flags)
}

/// Expected files and the differences found, or the refresh of them.
#[derive(Default)]
pub struct Expected {
    failures: Vec<String>,
}

impl Expected {
    /// Compares `actual` (`None`: no file is expected) with the file at `path`, or writes it when refreshing.
    pub fn check(&mut self, what: &str, path: &Path, actual: Option<&str>) {
        let expected = std::fs::read_to_string(path).ok();
        if pdp_testkit::skip::refreshing() {
            match actual {
                Some(text) => std::fs::write(path, text).unwrap(),
                None => {
                    let _ = std::fs::remove_file(path);
                }
            }
            return;
        }
        if expected.as_deref() == actual {
            return;
        }
        self.failures.push(match (expected, actual) {
            (Some(expected), Some(actual)) => format!(
                "{what} differs from {}:\n--- expected\n{expected}\n--- actual\n{actual}",
                path.display()
            ),
            (None, Some(_)) => format!("{what}: {} is missing", path.display()),
            (Some(_), None) => format!("{what}: nothing is expected but {} exists", path.display()),
            (None, None) => unreachable!("equal"),
        });
    }

    /// A difference found otherwise.
    pub fn fail(&mut self, message: String) {
        self.failures.push(message);
    }

    /// Fails with every difference, if any.
    pub fn assert_none(self) {
        assert!(
            self.failures.is_empty(),
            "{} mismatches (refresh with UPDATE_GOLDEN=1, then review the diff):\n{}",
            self.failures.len(),
            self.failures.join("\n")
        );
    }
}
