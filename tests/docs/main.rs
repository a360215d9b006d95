//! The users' guide (README.md, docs/*.md and CONTRIBUTING.md) checked against the code, so that it cannot
//! drift. One module per concern:
//!
//! - `examples`: every `docs/examples/<name>.in.yaml` goes through the offline injector (the library, and the
//!   `pdp-injector inject` binary with the flags in `<name>.args`): stdout must equal `<name>.out.yaml` (absent
//!   when the injector refuses the input) and stderr `<name>.stderr.txt`; outputs are fixed points and valid
//!   Kubernetes 1.33 objects (scripts/validate_k8s.py, when kubernetes-validate is installed, as .ci/run does).
//! - `markdown`: a fenced block right after `<!-- example: PATH -->` must equal the file PATH, and the text
//!   between `<!-- generated: ID -->` and `<!-- end generated: ID -->` must equal what is generated from the code:
//!   the precedence matrix and environment variables (`tables`), the metrics (`metrics`), the snippet matrix
//!   (`snippets`).
//! - `annotations`: docs/annotations.md lists every reason code with its decision and every warning code, and
//!   holds the exact text of every denial and warning, produced here by running the core on the offending input.
//! - `references`: `inject` lines in the docs use the flags of the example they name; variable names, socket
//!   paths and ports in the docs and snippets are the ones the injector renders and the manifests serve; links
//!   and repository paths in the Markdown exist.
//! - `metrics`: metric names and alert-rule matchers in the docs exist; the scrape job matches the Deployment.
//! - `commands`: the quick start of CONTRIBUTING.md (`serve` + curl) and the log and kubectl/jq snippets run for real
//!   (kubectl replaced by a stub that prints canned cluster output).
//! - `snippets`: with `PDP_DOCS_CERBOS=/path/to/cerbos` (scripts/docs-snippets.sh sets it up), the app snippets
//!   of docs/apps.md run against a real Cerbos started as the DaemonSet and as the sidecar run it, with the
//!   environment the injector renders, and must work exactly where docs/apps.md says they do.
//!
//! - `security`: every test SECURITY.md's threat table cites exists where the row says and runs in CI, unless
//!   the row says where it is checked instead ("not in CI: ...").
//!
//! Shared helpers (the repository's files, temporary directories, child processes) are in `support`.
//!
//! Refresh the expected files and the embedded blocks with `UPDATE_GOLDEN=1 cargo test --test docs`, then review
//! the diff.

mod annotations;
mod commands;
#[path = "../common/mod.rs"]
mod common;
mod examples;
mod markdown;
mod metrics;
mod references;
mod security;
mod snippets;
mod support;
mod tables;
