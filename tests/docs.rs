//! The users' guide (README.md and docs/*.md) checked against the code, so that it cannot drift.
//!
//! - Every `docs/examples/<name>.in.yaml` goes through the offline injector (the library, and the
//!   `pdp-injector inject` binary with the flags in `<name>.args`): stdout must equal `<name>.out.yaml` (absent
//!   when the injector refuses the input) and stderr `<name>.stderr.txt`.
//! - In the Markdown, a fenced block right after `<!-- example: PATH -->` must equal the file PATH, and the text
//!   between `<!-- generated: ID -->` and `<!-- end generated: ID -->` must equal what this file generates from
//!   the code (precedence matrix, environment variables, metrics, the snippet matrix).
//! - docs/annotations.md lists every reason code with its decision and every warning code, and holds the exact
//!   text of every denial and warning, produced here by running the core on the offending input.
//! - Commands: `inject` lines in the docs use the flags of the example they name; variable names, socket paths
//!   and ports in the docs and snippets are the ones the injector renders and the manifests serve; the README's
//!   quick start (`serve` + curl) and the log and kubectl/jq snippets run for real (kubectl replaced by a stub
//!   that prints canned cluster output).
//! - Examples are valid Kubernetes 1.33 objects (scripts/validate_k8s.py, when kubernetes-validate is installed,
//!   as .ci/run does); links and repository paths in the Markdown exist.
//! - With `PDP_DOCS_CERBOS=/path/to/cerbos` (scripts/docs-snippets.sh sets it up), the app snippets of
//!   docs/apps.md run against a real Cerbos started as the DaemonSet and as the sidecar run it, with the
//!   environment the injector renders, and must work exactly where docs/apps.md says they do.
//!
//! Refresh the expected files and the embedded blocks with `UPDATE_DOCS=1 cargo test --test docs`, then review
//! the diff.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::fs;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Once;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use pdp_injector::admission;
use pdp_injector::config::{Config, Mode};
use pdp_injector::core::render::app_env;
use pdp_injector::core::{NamespaceInfo, Reason, WarningCode};
use pdp_injector::core::{Outcome, inject};
use pdp_injector::offline::{self, Options};
use pdp_injector::webhook::metrics::Metrics;
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_pdp-injector");

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn updating() -> bool {
    std::env::var_os("UPDATE_DOCS").is_some()
}

/// The Markdown files of the guide, relative to the repository root.
fn markdown_files() -> Vec<String> {
    let mut files = vec!["README.md".to_string()];
    let mut docs: Vec<String> = fs::read_dir(root().join("docs"))
        .expect("docs/ exists")
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

/// Snippet files (docs/snippets/*), relative to the repository root.
fn snippet_files() -> Vec<String> {
    let mut files: Vec<String> = fs::read_dir(root().join("docs/snippets"))
        .expect("docs/snippets/ exists")
        .map(|e| format!("docs/snippets/{}", e.unwrap().file_name().to_string_lossy()))
        .collect();
    files.sort();
    files
}

/// A temporary directory, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir =
            std::env::temp_dir().join(format!("pdp-injector-docs-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// A child process, killed when dropped (also when a test panics).
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_for(what: &str, timeout: Duration, mut ready: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ready() {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn have(tool: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

// ---------------------------------------------------------------------------------------------------------------
// Examples

struct Example {
    stem: String,
    args: Vec<String>,
}

impl Example {
    fn input(&self) -> String {
        format!("docs/examples/{}.in.yaml", self.stem)
    }
    fn output(&self) -> String {
        format!("docs/examples/{}.out.yaml", self.stem)
    }
    fn stderr(&self) -> String {
        format!("docs/examples/{}.stderr.txt", self.stem)
    }

    /// The library's options for the example's command-line flags (only those the docs use).
    fn options(&self) -> Options {
        let mut options = Options {
            mode: None,
            default_namespace: Some("default".into()),
        };
        let mut args = self.args.iter();
        while let Some(flag) = args.next() {
            let value = args
                .next()
                .unwrap_or_else(|| panic!("{}: flag {flag} without a value", self.stem))
                .clone();
            match flag.as_str() {
                "--mode" => options.mode = Some(value),
                "--namespace" => options.default_namespace = Some(value),
                "--config" => {}
                other => panic!("{}.args: flag {other} is not supported here", self.stem),
            }
        }
        options
    }

    /// The config of the example's `--config FILE` (a path from the repository root), else the built-in one.
    fn config(&self) -> Config {
        match self.args.iter().position(|a| a == "--config") {
            Some(i) => {
                let path = &self.args[i + 1];
                Config::load(&root().join(path)).unwrap_or_else(|e| panic!("{}: {e}", self.stem))
            }
            None => Config::builtin(),
        }
    }

    /// `pdp-injector inject <args> -f docs/examples/<stem>.in.yaml`, run from the repository root.
    fn run_cli(&self) -> Output {
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

fn examples() -> Vec<Example> {
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

/// With UPDATE_DOCS, rewrites every example's expected files (once per test process, before anyone reads them).
fn refresh_examples() {
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
    let mut failures = Vec::new();
    for example in examples() {
        let library = run_library(&example);
        let expected_out = fs::read_to_string(root().join(example.output())).ok();
        match (&library, &expected_out) {
            (Ok(out), Some(expected)) if out == expected => {}
            (Ok(out), Some(expected)) => failures.push(format!(
                "{}: output differs from {}:\n--- expected\n{expected}\n--- actual\n{out}",
                example.input(),
                example.output()
            )),
            (Ok(_), None) => failures.push(format!("{} is missing", example.output())),
            (Err(e), Some(_)) => failures.push(format!(
                "{}: the injector refuses it ({e}) but {} exists",
                example.input(),
                example.output()
            )),
            (Err(_), None) => {}
        }

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
        let expected_err = fs::read_to_string(root().join(example.stderr())).unwrap_or_default();
        if stderr != expected_err {
            failures.push(format!(
                "{}: stderr differs from {}:\n--- expected\n{expected_err}\n--- actual\n{stderr}",
                example.input(),
                example.stderr()
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} mismatches (refresh with UPDATE_DOCS=1 and review the diff):\n{}",
        failures.len(),
        failures.join("\n")
    );
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
        eprintln!("SKIPPED: python3 with kubernetes-validate is needed to validate docs/examples");
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

// ---------------------------------------------------------------------------------------------------------------
// Markdown: embedded files and generated sections

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
        "stale blocks (refresh with UPDATE_DOCS=1 and review the diff):\n{}",
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

fn pod_with(annotation: Option<&str>) -> Pod {
    let mut metadata = json!({"name": "app"});
    if let Some(v) = annotation {
        metadata["annotations"] = json!({ "pdp-injector.io/inject": v });
    }
    serde_json::from_value(json!({
        "metadata": metadata,
        "spec": {"containers": [{"name": "app", "image": "registry.example/app:1"}]}
    }))
    .unwrap()
}

fn describe_outcome(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Injected(i) => format!("**{}**", i.mode),
        Outcome::Skipped { reason, warnings } => {
            let mut s = format!("skip `{reason}`");
            for w in warnings {
                write!(s, " + `{}`", w.code.code()).unwrap();
            }
            s
        }
        Outcome::Denied(d) => format!("deny `{}`", d.reason),
    }
}

/// The built-in config plus the one setting central mode needs (docs/annotations.md says so above the matrix).
const CENTRAL_CERBOS: &str =
    "profiles:\n  cerbos:\n    central:\n      address: cerbos.cerbos.svc.cluster.local:3593\n";

/// The whole precedence table, as the core applies it to every pair of values (built-in config, plus a central
/// address for cerbos).
fn precedence_matrix() -> String {
    let config = Config::from_yaml(CENTRAL_CERBOS).unwrap();
    let values = [
        None,
        Some("enabled"),
        Some("sidecar"),
        Some("daemonset"),
        Some("central"),
        Some("disabled"),
        Some("on"),
    ];
    let show = |v: Option<&str>| v.map_or("(none)".to_string(), |v| format!("`{v}`"));
    let mut s = String::from("| Pod `inject` ↓ · namespace `injection` → |");
    for ns in values {
        write!(s, " {} |", show(ns)).unwrap();
    }
    s.push_str("\n|---|");
    for _ in values {
        s.push_str("---|");
    }
    s.push('\n');
    for pod in values {
        write!(s, "| {} |", show(pod)).unwrap();
        for ns in values {
            let info = NamespaceInfo {
                name: "shop".into(),
                injection: ns.map(String::from),
                pss_enforce: None,
            };
            let outcome = inject(&pod_with(pod), &info, &config);
            write!(s, " {} |", describe_outcome(&outcome)).unwrap();
        }
        s.push('\n');
    }
    s
}

fn env_value(e: &k8s_openapi::api::core::v1::EnvVar) -> String {
    match (
        &e.value,
        e.value_from.as_ref().and_then(|v| v.field_ref.as_ref()),
    ) {
        (_, Some(f)) => format!("Downward API `{}`", f.field_path),
        (Some(v), None) => format!("`{v}`"),
        (None, None) => "`\"\"`".into(),
    }
}

/// What app containers receive, per profile and mode, straight from the renderer.
fn env_tables() -> String {
    let config = Config::builtin();
    let mut s = String::new();
    for (name, profile) in &config.profiles {
        // The built-ins name no central Service: show the one an admin would typically set.
        let address = format!("{name}.{name}.svc.cluster.local:{}", profile.address_port);
        let mut with_central = profile.clone();
        with_central.central = Some(pdp_injector::config::CentralSpec {
            address: address.clone(),
        });
        let columns = [
            app_env(profile, Mode::Sidecar, false),
            app_env(profile, Mode::Sidecar, true),
            app_env(profile, Mode::Daemonset, true),
            app_env(profile, Mode::Daemonset, false),
            app_env(&with_central, Mode::Central, false),
        ];
        writeln!(s, "Profile `{name}`:\n").unwrap();
        writeln!(s, "| variable | sidecar | sidecar, `sidecar.unixSocket: true` | daemonset | daemonset, namespace not `privileged` | central, `central.address: {address}` |").unwrap();
        s.push_str("|---|---|---|---|---|---|\n");
        for var in &columns[2] {
            write!(s, "| `{}` |", var.name).unwrap();
            for column in &columns {
                let cell = column
                    .iter()
                    .find(|e| e.name == var.name)
                    .map_or("—".to_string(), env_value);
                write!(s, " {cell} |").unwrap();
            }
            s.push('\n');
        }
        s.push('\n');
    }
    s
}

/// Families of the Prometheus exposition: name -> (type, help, label -> values).
type Families = BTreeMap<String, (String, String, BTreeMap<String, BTreeSet<String>>)>;

fn metric_families() -> Families {
    let text = Metrics::default().render();
    let mut families: Families = BTreeMap::new();
    let mut order = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap();
            order.push(name.to_string());
            families.entry(name.into()).or_default().1 = help.into();
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            families.entry(name.into()).or_default().0 = kind.into();
        } else if !line.is_empty() {
            let series = line.split(' ').next().unwrap();
            let (name, labels) = match series.split_once('{') {
                Some((n, l)) => (n, l.trim_end_matches('}')),
                None => (series, ""),
            };
            let family = order
                .iter()
                .rev()
                .find(|f| {
                    name == f.as_str()
                        || name
                            .strip_prefix(f.as_str())
                            .is_some_and(|s| ["_bucket", "_sum", "_count"].contains(&s))
                })
                .unwrap_or_else(|| panic!("sample {name} without a family"))
                .clone();
            for pair in labels.split(',').filter(|p| !p.is_empty()) {
                let (k, v) = pair.split_once('=').unwrap();
                if k != "le" {
                    families
                        .get_mut(&family)
                        .unwrap()
                        .2
                        .entry(k.into())
                        .or_default()
                        .insert(v.trim_matches('"').into());
                }
            }
        }
    }
    families
}

fn metrics_table() -> String {
    let mut s = String::from("| metric | type | labels | what |\n|---|---|---|---|\n");
    for (name, (kind, help, labels)) in metric_families() {
        let labels: Vec<String> = labels
            .iter()
            .map(|(k, values)| {
                if k == "version" {
                    format!("`{k}`")
                } else if values.len() > 5 {
                    format!("`{k}` (a reason code)")
                } else {
                    let values: Vec<String> = values.iter().map(|v| format!("`{v}`")).collect();
                    format!("`{k}`: {}", values.join(", "))
                }
            })
            .collect();
        writeln!(s, "| `{name}` | {kind} | {} | {help} |", labels.join("; ")).unwrap();
    }
    s
}

// ---------------------------------------------------------------------------------------------------------------
// Codes, denials and warnings in docs/annotations.md

/// The rows of the Markdown tables under a `## heading`, as cells.
fn table_rows(text: &str, heading: &str) -> Vec<Vec<String>> {
    let mut in_section = false;
    let mut rows = Vec::new();
    for line in text.lines() {
        if line.starts_with("## ") {
            in_section = line.trim() == heading;
            continue;
        }
        if in_section && line.starts_with('|') && !line.starts_with("|---") {
            rows.push(
                line.trim()
                    .trim_matches('|')
                    .split('|')
                    .map(|c| c.trim().to_string())
                    .collect(),
            );
        }
    }
    assert!(!rows.is_empty(), "no table under {heading:?}");
    rows
}

#[test]
fn annotations_doc_lists_every_reason_and_warning_code() {
    let text = read("docs/annotations.md");
    let reasons = table_rows(&text, "## Reason codes");
    let mut listed = BTreeMap::new();
    for row in reasons.iter().skip(1) {
        let code = row[0].trim_matches('`').to_string();
        listed.insert(code, row.get(1).cloned().unwrap_or_default());
    }
    for r in Reason::ALL {
        let decision = listed
            .get(r.code())
            .unwrap_or_else(|| panic!("docs/annotations.md: reason {} is not listed", r.code()));
        assert_eq!(
            decision.trim_matches('`'),
            r.decision(),
            "docs/annotations.md: decision of {}",
            r.code()
        );
    }
    let known: BTreeSet<&str> = Reason::ALL.iter().map(|r| r.code()).collect();
    for code in listed.keys() {
        assert!(
            known.contains(code.as_str()),
            "docs/annotations.md lists unknown reason {code}"
        );
    }

    let warnings = table_rows(&text, "## Warnings");
    let listed: BTreeSet<String> = warnings
        .iter()
        .skip(1)
        .map(|row| row[0].trim_matches('`').to_string())
        .collect();
    let known: BTreeSet<String> = WarningCode::ALL
        .iter()
        .map(|w| w.code().to_string())
        .collect();
    assert_eq!(listed, known, "docs/annotations.md: warning codes");
}

/// The Pod of an example stream and what its namespace looks like, as the offline injector sees them.
fn pod_of(example: &Example) -> (Pod, NamespaceInfo) {
    let docs = offline::parse_stream(&read(&example.input())).unwrap();
    let mut namespaces = BTreeMap::new();
    for doc in &docs {
        if doc["kind"] == "Namespace" {
            let name = doc["metadata"]["name"].as_str().unwrap().to_string();
            let labels: BTreeMap<String, String> =
                serde_json::from_value(doc["metadata"]["labels"].clone()).unwrap_or_default();
            namespaces.insert(name.clone(), NamespaceInfo::from_labels(name, &labels));
        }
    }
    let doc = docs
        .iter()
        .find(|d| d["kind"] == "Pod")
        .unwrap_or_else(|| panic!("{}: no Pod", example.input()));
    let ns_name = doc["metadata"]["namespace"].as_str().unwrap_or("default");
    let ns = namespaces
        .get(ns_name)
        .cloned()
        .unwrap_or_else(|| NamespaceInfo::named(ns_name));
    (serde_json::from_value(doc.clone()).unwrap(), ns)
}

#[test]
fn every_denial_message_is_documented_exactly() {
    let text = read("docs/annotations.md");
    let config = Config::builtin();
    let mut covered = BTreeSet::new();
    for example in examples().iter().filter(|e| e.stem.starts_with("deny-")) {
        let (pod, ns) = pod_of(example);
        let Outcome::Denied(denial) = inject(&pod, &ns, &example.config()) else {
            panic!("{}: the core does not deny it", example.input());
        };
        let message = denial.to_string();
        assert!(
            text.contains(&message),
            "docs/annotations.md does not contain the denial of {}:\n{message}",
            example.input()
        );
        covered.insert(denial.reason.code());
    }
    // Denials only the webhook can give: an AdmissionReview whose object is missing or is not a Pod.
    let review = |object: Option<Value>| {
        let mut request = json!({
            "uid": "u", "operation": "CREATE", "namespace": "shop",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"}
        });
        if let Some(o) = object {
            request["object"] = o;
        }
        let body = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request});
        let (bytes, _) =
            admission::review(&serde_json::to_vec(&body).unwrap(), &config, &|n: &str| {
                NamespaceInfo::named(n)
            })
            .unwrap();
        let out: Value = serde_json::from_slice(&bytes).unwrap();
        out["response"]["status"]["message"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let missing = review(None);
    assert!(
        text.contains(&missing),
        "docs/annotations.md lacks {missing:?}"
    );
    let not_a_pod = review(Some(json!({"spec": "x"})));
    let prefix = not_a_pod.split(": spec: invalid type").next().unwrap();
    assert!(
        text.contains(&format!("{prefix}: <field>: <parse error>")),
        "docs/annotations.md lacks {prefix:?}: <field>: <parse error> (from {not_a_pod:?})"
    );
    covered.insert(Reason::InvalidObject.code());
    // The webhook's refusal of a Pod whose opted-in namespace it cannot read (src/webhook/server.rs).
    let unreadable = pdp_injector::core::Denial::namespace_unreadable("shop", "<error>");
    assert!(
        text.contains(&unreadable.to_string()),
        "docs/annotations.md lacks {unreadable}"
    );
    covered.insert(unreadable.reason.code());

    let deny_codes: BTreeSet<&str> = Reason::ALL
        .iter()
        .filter(|r| r.decision() == "deny")
        .map(|r| r.code())
        .collect();
    assert_eq!(covered, deny_codes, "every deny reason has an example");
}

#[test]
fn every_warning_message_is_documented_exactly() {
    let text = read("docs/annotations.md");
    let mut covered = BTreeSet::new();
    for example in examples() {
        let input = read(&example.input());
        let Ok((_, reports)) =
            offline::inject_stream(&input, &example.config(), &example.options())
        else {
            continue;
        };
        for w in reports.iter().flat_map(|r| &r.warnings) {
            let message = w.to_string();
            assert!(
                text.contains(&message),
                "docs/annotations.md does not contain the warning of {}:\n{message}",
                example.input()
            );
            covered.insert(w.code.code());
        }
    }
    for code in WarningCode::ALL {
        assert!(
            covered.contains(code.code()),
            "no example gives warning {}",
            code.code()
        );
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Names, ports, paths and commands in the prose and the snippets

#[test]
fn inject_commands_in_the_docs_use_their_examples_flags() {
    let mut seen = 0;
    for file in markdown_files() {
        for (n, line) in read(&file).lines().enumerate() {
            if !line.contains("-f docs/examples/") || !line.contains(" inject ") {
                continue;
            }
            let tokens: Vec<&str> = line
                .split(|c: char| c.is_whitespace() || c == '`')
                .filter(|t| !t.is_empty())
                .collect();
            let at = tokens
                .iter()
                .position(|t| *t == "inject")
                .unwrap_or_else(|| panic!("{file}:{}: not an inject command", n + 1));
            let f = tokens[at..].iter().position(|t| *t == "-f").unwrap() + at;
            let path = tokens[f + 1];
            let stem = path
                .strip_prefix("docs/examples/")
                .and_then(|p| p.strip_suffix(".in.yaml"))
                .unwrap_or_else(|| panic!("{file}:{}: {path} is not an example input", n + 1));
            let example = examples()
                .into_iter()
                .find(|e| e.stem == stem)
                .unwrap_or_else(|| panic!("{file}:{}: no example {stem}", n + 1));
            let flags: Vec<String> = tokens[at + 1..f].iter().map(|s| s.to_string()).collect();
            assert_eq!(
                flags,
                example.args,
                "{file}:{}: flags differ from docs/examples/{stem}.args",
                n + 1
            );
            seen += 1;
        }
    }
    assert!(seen >= 3, "only {seen} inject commands in the docs");
}

#[test]
fn names_ports_and_paths_in_the_docs_are_the_rendered_ones() {
    let config = Config::builtin();
    // The shipped config's profiles (the node-local flagd ones) are rendered by the docs' examples too.
    let shipped = Config::load(&root().join("manifests/base/config.yaml")).unwrap();
    let mut env_names = BTreeSet::new();
    let mut sockets = BTreeSet::new();
    let mut ports = BTreeSet::from([8443u16]);
    for p in config.profiles.values().chain(shipped.profiles.values()) {
        env_names.extend(p.app_env.iter().map(|e| e.name.clone()));
        env_names.extend(
            [&p.env_names.host, &p.env_names.address, &p.env_names.socket]
                .into_iter()
                .chain(p.env_names.port.as_ref())
                .cloned(),
        );
        // The sidecar's own environment (CERBOS_NO_TELEMETRY) is rendered too.
        env_names.extend(p.env.iter().map(|e| e.name.clone()));
        sockets.insert(p.socket.path());
        ports.extend(p.ports.iter().map(|port| port.port));
    }
    let mut files = markdown_files();
    files.extend(snippet_files());
    for file in &files {
        let text = read(file);
        for word in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if word.starts_with("CERBOS_") || word.starts_with("FLAGD_") {
                assert!(
                    env_names.contains(word),
                    "{file}: {word} is not a variable the injector renders ({env_names:?})"
                );
            }
        }
        for (at, _) in text.match_indices("/var/run/") {
            let path: String = text[at..]
                .chars()
                .take_while(|c| !c.is_whitespace() && !"\"'`),;".contains(*c))
                .collect();
            if path.ends_with(".sock") {
                assert!(
                    sockets.contains(&path),
                    "{file}: socket {path} is not one the injector renders ({sockets:?})"
                );
            }
        }
    }
    // Ports in the snippets are PDP ports of a profile (or the webhook's).
    for file in snippet_files() {
        let text = read(&file);
        for (at, _) in text.match_indices(':') {
            let digits: String = text[at + 1..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            if digits.len() == 4 {
                let port: u16 = digits.parse().unwrap();
                assert!(
                    ports.contains(&port),
                    "{file}: port {port} is not a PDP port ({ports:?})"
                );
            }
        }
    }

    // What docs/apps.md says each listener is, against the profile and the shipped DaemonSet.
    let cerbos = &config.profiles["cerbos"];
    let port = |name: &str| cerbos.ports.iter().find(|p| p.name == name).unwrap().port;
    assert_eq!(
        cerbos.address_port, 3593,
        "CERBOS_PDP_ADDR is the gRPC port"
    );
    assert_eq!(port("grpc"), 3593);
    assert_eq!(
        port("http"),
        3592,
        "the sidecar's HTTP port (docs/snippets/http-tcp.sh)"
    );
    assert!(
        cerbos
            .args
            .contains(&"--set=server.httpListenAddr=:3592".to_string())
    );
    assert!(
        cerbos
            .args
            .contains(&"--set=server.grpcListenAddr=:3593".to_string())
    );
    assert!(
        !cerbos.sidecar.unix_socket,
        "the sidecar has no socket by default"
    );
    let daemonset = read("manifests/components/pdp-daemonset/daemonset.yaml");
    assert!(
        daemonset.contains("hostPort: 3593"),
        "the DaemonSet publishes gRPC on 3593"
    );
    assert!(
        !daemonset.contains("hostPort: 3592"),
        "the DaemonSet publishes no HTTP port"
    );
    let server = read("manifests/components/pdp-daemonset/cerbos-config.yaml");
    assert!(
        server.contains(&format!(
            "httpListenAddr: \"unix:{}\"",
            cerbos.socket.path()
        )),
        "the DaemonSet's HTTP listener is the socket"
    );
    assert!(server.contains("grpcListenAddr: \":3593\""));

    // The Go snippet dials exactly the two forms the live test proves.
    let go = read("docs/snippets/grpc-client.go");
    assert!(go.contains("os.Getenv(\"CERBOS_PDP_ADDR\")"));
    assert!(go.contains("\"unix:\" + sock") && go.contains("os.Getenv(\"CERBOS_PDP_SOCKET\")"));
}

#[test]
fn metrics_named_in_the_docs_exist() {
    let families = metric_families();
    let rendered = Metrics::default().render();
    let mut files = markdown_files();
    files.push("docs/examples/prometheus-rules.yaml".into());
    for file in files {
        let text = read(&file);
        for (at, _) in text.match_indices("pdp_injector_") {
            let name: String = text[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .filter(|b| families.contains_key(*b))
                .unwrap_or(&name);
            assert!(
                families.contains_key(base),
                "{file}: metric {name} does not exist"
            );
        }
    }
    // Label matchers in the alert rules name label values the webhook exports.
    let rules = read("docs/examples/prometheus-rules.yaml");
    let doc: Value = serde_saphyr::from_str(&rules).expect("the rules are YAML");
    let exprs: Vec<String> = doc["groups"][0]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["expr"].as_str().unwrap().to_string())
        .collect();
    assert!(exprs.len() >= 5);
    // The scrape job finds the webhook's Pods by the label and port name of the Deployment, and checks the
    // certificate against a name the serving certificate carries.
    let scrape: Value =
        serde_saphyr::from_str(&read("docs/examples/prometheus-scrape.yaml")).unwrap();
    let job = &scrape["scrape_configs"][0];
    assert_eq!(job["metrics_path"], "/metrics");
    assert_eq!(job["scheme"], "https");
    let sans = pdp_injector::tls::certs::service_sans("pdp-injector", "pdp-system");
    assert!(
        sans.iter()
            .any(|s| job["tls_config"]["server_name"] == s.as_str())
    );
    let deployment = read("manifests/base/deployment.yaml");
    assert_eq!(job["relabel_configs"][0]["regex"], "pdp-injector;https");
    assert!(deployment.contains("app.kubernetes.io/name: pdp-injector"));
    assert!(deployment.contains("- name: https\n              containerPort: 8443"));
    for expr in exprs {
        for (at, _) in expr.match_indices("=\"") {
            let key: String = expr[..at]
                .trim_end_matches('!')
                .chars()
                .rev()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            let value: String = expr[at + 2..].chars().take_while(|c| *c != '"').collect();
            assert!(
                rendered.contains(&format!("{key}=\"{value}\"")),
                "alert rule matcher {key}=\"{value}\" matches no exported series"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Commands that run here: the README's quick start, the log query, the un-injected Pods query

/// A directory with a `kubectl` that prints `output` whatever it is asked, for cluster snippets.
fn kubectl_stub(dir: &Path, output: &Path) -> String {
    let stub = dir.join("kubectl");
    fs::write(&stub, format!("#!/bin/sh\ncat '{}'\n", output.display())).unwrap();
    let mut perms = fs::metadata(&stub).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    fs::set_permissions(&stub, perms).unwrap();
    format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// The fenced `sh` block of `file` that contains `needle`.
fn sh_block(file: &str, needle: &str) -> String {
    let text = read(file);
    let mut block = None;
    let mut current: Option<String> = None;
    for line in text.lines() {
        match &mut current {
            None if line.trim_start().starts_with("```sh") => current = Some(String::new()),
            Some(b) if line.trim() == "```" => {
                if b.contains(needle) {
                    block = Some(b.clone());
                }
                current = None;
            }
            Some(b) => {
                b.push_str(line);
                b.push('\n');
            }
            None => {}
        }
    }
    block.unwrap_or_else(|| panic!("{file}: no sh block with {needle:?}"))
}

#[test]
fn readme_quick_start_and_log_query_run() {
    if !have("curl") || !have("python3") {
        eprintln!("SKIPPED: the README quick start needs curl and python3");
        return;
    }
    let readme = read("README.md");
    assert!(readme.contains("cargo run -- serve --listen 127.0.0.1:8443"));
    assert!(readme.contains("cargo test"));
    let tmp = TempDir::new("quick-start");
    let port = free_port();
    let log = tmp.path().join("serve.log");
    // The README's command, on a free port, with the CA in a private directory and no cluster lookup.
    let _server = Running(
        Command::new(BIN)
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .args([
                "--cluster",
                "off",
                "--log-format",
                "json",
                "--self-signed-dir",
            ])
            .arg(tmp.path())
            .stderr(fs::File::create(&log).unwrap())
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for("serve", Duration::from_secs(30), || {
        tmp.path().join("ca.crt").exists() && TcpStream::connect(("127.0.0.1", port)).is_ok()
    });

    let block = sh_block(
        "README.md",
        "tests/fixtures/admissionreview-v1-pod-create.json",
    );
    assert!(
        block.contains("https://localhost:8443/mutate")
            && block.contains("/tmp/pdp-injector/ca.crt")
    );
    let script = block
        .replace("localhost:8443", &format!("localhost:{port}"))
        .replace(
            "/tmp/pdp-injector/ca.crt",
            &tmp.path().join("ca.crt").display().to_string(),
        );
    let out = Command::new("bash")
        .args(["-o", "pipefail", "-c", &script])
        .current_dir(root())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "README quick start failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("'reason': 'injected_daemonset'"),
        "{stdout}"
    );
    assert!(stdout.contains("CERBOS_PDP_ADDR"), "{stdout}");

    // The README's offline example.
    assert!(readme.contains("cargo run -- inject -f examples/deployment.yaml"));
    let out = Command::new(BIN)
        .current_dir(root())
        .args(["inject", "-f", "examples/deployment.yaml"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("CERBOS_PDP_ADDR"));

    if !have("jq") {
        eprintln!("SKIPPED: docs/snippets/review-log.sh needs jq");
        return;
    }
    // docs/operations.md's log query, on this server's log (kubectl logs replaced by the log file).
    wait_for("the review's log line", Duration::from_secs(10), || {
        fs::read_to_string(&log).is_ok_and(|l| l.contains("admission review answered"))
    });
    let path = kubectl_stub(tmp.path(), &log);
    let out = Command::new("sh")
        .arg(root().join("docs/snippets/review-log.sh"))
        .env("PATH", path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("\"namespace\":\"webhook-demo\"")
            && stdout.contains("\"reason\":\"injected_daemonset\""),
        "docs/snippets/review-log.sh printed:\n{stdout}"
    );
}

/// Runs a kubectl/jq snippet with `kubectl get ...` answering `list`; returns its stdout.
fn run_with_pods(snippet: &str, list: &Value) -> String {
    let tmp = TempDir::new(snippet.rsplit('/').next().unwrap());
    let file = tmp.path().join("pods.json");
    fs::write(&file, serde_json::to_vec(list).unwrap()).unwrap();
    let out = Command::new("sh")
        .arg(root().join(snippet))
        .env("PATH", kubectl_stub(tmp.path(), &file))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{snippet}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn config_hashes_query_runs() {
    if !have("jq") {
        eprintln!("SKIPPED: docs/snippets/config-hashes.sh needs jq");
        return;
    }
    // The Pods of two examples as the webhook stores them, plus one that was not injected.
    let mut items = Vec::new();
    for out in [
        "docs/examples/daemonset.out.yaml",
        "docs/examples/sidecar.out.yaml",
    ] {
        let docs = offline::parse_stream(&read(out)).unwrap();
        let workload = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
        let template = workload["spec"]["template"].clone();
        items.push(template.clone());
        items.push(template);
    }
    items.push(json!({"metadata": {"name": "plain"}}));
    let stdout = run_with_pods(
        "docs/snippets/config-hashes.sh",
        &json!({"apiVersion": "v1", "kind": "List", "items": items}),
    );
    let config = Config::builtin();
    let version = pdp_injector::names::VERSION;
    let hash = &config.hash;
    let lines: Vec<String> = stdout
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    assert_eq!(
        lines,
        [
            format!("2 daemonset cerbos {hash} {version}"),
            format!("2 sidecar cerbos {hash} {version}")
        ]
    );
}

#[test]
fn check_codes_are_documented() {
    // Every code `pdp-injector check` can print is in docs/operations.md's table, and the jq query it replaced
    // is gone for good.
    let ops = read("docs/operations.md");
    let section = &ops[ops
        .find("## Checking the cluster: `pdp-injector check`")
        .expect("docs/operations.md documents check")..];
    for drift in pdp_injector::check::pods::Drift::ALL {
        assert!(
            section.contains(&format!("`{}`", drift.code())),
            "docs/operations.md does not document the check code {}",
            drift.code()
        );
    }
    let src = read("src/check/analyse.rs");
    for (at, _) in src.match_indices("Finding::new(") {
        // The code is the second argument: skip calls whose code is computed (the Pod drifts, checked above).
        let args: Vec<&str> = src[at + "Finding::new(".len()..].splitn(3, ',').collect();
        let Some(code) = args.get(1).map(|a| a.trim()) else {
            continue;
        };
        let Some(code) = code.strip_prefix('"').and_then(|c| c.strip_suffix('"')) else {
            continue;
        };
        assert!(
            section.contains(&format!("`{code}`")),
            "docs/operations.md does not document the check code {code}"
        );
    }
    assert!(!root().join("docs/snippets/uninjected-pods.sh").exists());
    assert!(
        read("README.md").contains("check -A"),
        "the README shows check after install"
    );
}

#[test]
fn links_and_paths_in_the_docs_exist() {
    for file in markdown_files() {
        let text = read(&file);
        let dir = Path::new(&file).parent().unwrap().to_path_buf();
        // Relative Markdown links, from the file's directory (anchors are not checked).
        for (at, _) in text.match_indices("](") {
            let target: String = text[at + 2..].chars().take_while(|c| *c != ')').collect();
            if target.starts_with("http") || target.starts_with('#') {
                continue;
            }
            let path = target.split('#').next().unwrap();
            assert!(
                root().join(&dir).join(path).exists(),
                "{file}: link to {target} points nowhere"
            );
        }
        // Repository paths written in the prose and the commands.
        for prefix in [
            "docs/",
            "manifests/",
            "scripts/",
            "tests/fixtures/",
            "examples/",
        ] {
            for (at, _) in text.match_indices(prefix) {
                if at > 0 && !" `(\n".contains(&text[at - 1..at]) {
                    continue;
                }
                let path: String = text[at..]
                    .chars()
                    .take_while(|c| !c.is_whitespace() && !"`),;:'\"".contains(*c))
                    .collect();
                let path = path.split('#').next().unwrap().trim_end_matches('.');
                if path.contains('<')
                    || path.contains('*')
                    || path.ends_with('/') && path.len() == prefix.len()
                {
                    continue;
                }
                assert!(root().join(path).exists(), "{file}: {path} does not exist");
            }
        }
    }
    // The README names the image the manifests pull.
    let readme = read("README.md");
    let deployment = read("manifests/base/deployment.yaml");
    let image = deployment
        .lines()
        .find_map(|l| l.trim().strip_prefix("image: "))
        .unwrap();
    assert!(
        readme.contains(&format!("`{image}`")),
        "README does not name {image}"
    );
}

// ---------------------------------------------------------------------------------------------------------------
// The app snippets against a real Cerbos (opt-in: PDP_DOCS_CERBOS)

/// The three ways a Pod can be wired, with the example whose rendered environment the app sees.
const MODES: [(&str, &str); 3] = [
    ("sidecar", "docs/examples/sidecar.out.yaml"),
    ("daemonset", "docs/examples/daemonset.out.yaml"),
    (
        "daemonset, namespace not `privileged`",
        "docs/examples/daemonset-baseline.out.yaml",
    ),
];

struct Snippet {
    file: &'static str,
    what: &'static str,
    /// Whether it works in each of [`MODES`].
    works: [bool; 3],
    /// What its output contains when it works.
    expect: &'static str,
}

const SNIPPETS: [Snippet; 4] = [
    Snippet {
        file: "docs/snippets/http-tcp.sh",
        what: "HTTP/JSON API over TCP, `$CERBOS_PDP_HOST:3592`",
        works: [true, false, false],
        expect: "\"view\":\"EFFECT_ALLOW\"",
    },
    Snippet {
        file: "docs/snippets/http-unix-socket.sh",
        what: "HTTP/JSON API over the Unix socket `$CERBOS_PDP_SOCKET`",
        works: [false, true, false],
        expect: "\"view\":\"EFFECT_ALLOW\"",
    },
    Snippet {
        file: "docs/snippets/grpc-tcp.sh",
        what: "gRPC over TCP, `$CERBOS_PDP_ADDR`",
        works: [true, true, true],
        expect: "SERVING",
    },
    Snippet {
        file: "docs/snippets/grpc-unix-socket.sh",
        what: "gRPC over the Unix socket, `unix:$CERBOS_PDP_SOCKET`",
        works: [false, true, false],
        expect: "SERVING",
    },
];

fn snippet_matrix() -> String {
    let mut s = String::from("| snippet | reaches Cerbos by |");
    for (mode, _) in MODES {
        write!(s, " {mode} |").unwrap();
    }
    s.push_str("\n|---|---|---|---|---|\n");
    for snippet in &SNIPPETS {
        let name = snippet.file.trim_start_matches("docs/");
        write!(
            s,
            "| [`{}`]({name}) | {} |",
            name.trim_start_matches("snippets/"),
            snippet.what
        )
        .unwrap();
        for works in snippet.works {
            s.push_str(if works { " works |" } else { " no |" });
        }
        s.push('\n');
    }
    s
}

/// The environment of the first app container of an example output, as the kubelet would expand it, with the
/// Downward API host as 127.0.0.1 and the socket path moved to `socket`.
fn app_environment(out_yaml: &str, socket: &Path) -> Vec<(String, String)> {
    let docs = offline::parse_stream(&read(out_yaml)).unwrap();
    let doc = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
    let env = doc["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap();
    let cerbos = &Config::builtin().profiles["cerbos"];
    let mut out: Vec<(String, String)> = Vec::new();
    for var in env {
        let name = var["name"].as_str().unwrap().to_string();
        let value = if let Some(field) = var.pointer("/valueFrom/fieldRef/fieldPath") {
            assert_eq!(field, "status.hostIP");
            "127.0.0.1".to_string()
        } else {
            let mut v = var["value"].as_str().unwrap().to_string();
            for (n, val) in &out {
                v = v.replace(&format!("$({n})"), val);
            }
            if v == cerbos.socket.path() {
                v = socket.display().to_string();
            }
            v
        };
        out.push((name, value));
    }
    out
}

fn start_cerbos(bin: &str, args: &[String], dir: &Path) -> Running {
    let child = Command::new(bin)
        .args(args)
        .env("CERBOS_NO_TELEMETRY", "1")
        .current_dir(dir)
        .stdout(fs::File::create(dir.join("cerbos.log")).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {bin}: {e}"));
    Running(child)
}

#[test]
fn app_snippets_work_where_the_docs_say_against_cerbos() {
    let Some(bin) = std::env::var_os("PDP_DOCS_CERBOS") else {
        eprintln!(
            "SKIPPED: set PDP_DOCS_CERBOS to a cerbos binary (scripts/docs-snippets.sh does) to run the app snippets"
        );
        return;
    };
    let bin = bin.to_string_lossy().to_string();
    for port in [3592, 3593] {
        assert!(
            TcpListener::bind(("0.0.0.0", port)).is_ok(),
            "port {port} is busy: the snippets need 3592 and 3593 free"
        );
    }
    let tmp = TempDir::new("cerbos");
    let policies = root().join("manifests/components/pdp-daemonset/policies");
    let socket = tmp.path().join("cerbos.sock");
    let cerbos = &Config::builtin().profiles["cerbos"];

    let run = |mode: usize, env: &[(String, String)]| -> Vec<String> {
        let mut failures = Vec::new();
        for snippet in &SNIPPETS {
            let out = Command::new("bash")
                .arg("-o")
                .arg("pipefail")
                .arg(root().join(snippet.file))
                .env_clear()
                .env("PATH", std::env::var("PATH").unwrap_or_default())
                .envs(env.iter().map(|(k, v)| (k, v)))
                .output()
                .unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            let worked = out.status.success() && stdout.contains(snippet.expect);
            if worked != snippet.works[mode] {
                failures.push(format!(
                    "{} in mode {}: works={worked}, docs say {}\nstdout: {stdout}\nstderr: {}",
                    snippet.file,
                    MODES[mode].0,
                    snippet.works[mode],
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
        }
        failures
    };
    let mut failures = Vec::new();

    // The node-local PDP, configured as manifests/components/pdp-daemonset configures it.
    let config = read("manifests/components/pdp-daemonset/cerbos-config.yaml")
        .replace(&cerbos.socket.path(), &socket.display().to_string())
        .replace(
            "directory: /policies",
            &format!("directory: {}", policies.display()),
        );
    fs::write(tmp.path().join("config.yaml"), config).unwrap();
    {
        let _pdp = start_cerbos(
            &bin,
            &["server".into(), "--config=config.yaml".into()],
            tmp.path(),
        );
        wait_for(
            "the DaemonSet-shaped Cerbos",
            Duration::from_secs(60),
            || socket.exists() && TcpStream::connect(("127.0.0.1", 3593)).is_ok(),
        );
        for mode in [1, 2] {
            failures.extend(run(mode, &app_environment(MODES[mode].1, &socket)));
        }
    }

    // The sidecar, with the built-in profile's arguments.
    let args: Vec<String> = cerbos
        .args
        .iter()
        .map(|a| {
            a.replace(
                "directory=/policies",
                &format!("directory={}", policies.display()),
            )
        })
        .collect();
    {
        let _pdp = start_cerbos(&bin, &args, tmp.path());
        wait_for("the sidecar-shaped Cerbos", Duration::from_secs(60), || {
            TcpStream::connect(("127.0.0.1", 3592)).is_ok()
                && TcpStream::connect(("127.0.0.1", 3593)).is_ok()
        });
        failures.extend(run(0, &app_environment(MODES[0].1, &socket)));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
