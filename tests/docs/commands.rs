//! Commands that run here: the quick start of CONTRIBUTING.md (`serve` + curl) and its offline example, the
//! log query, the config-hash and un-injected Pods queries (kubectl replaced by a stub that prints canned
//! cluster output).

use std::fs;
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use pdp_core::config::Config;
use pdp_core::offline;
use serde_json::{Value, json};

use pdp_testkit::dir::TempDir;
use pdp_testkit::net::free_port;
use pdp_testkit::process::{Running, have, wait_for};
use pdp_testkit::skip::cannot_run;

use crate::support::{BIN, read, root};

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
fn quick_start_and_log_query_run() {
    if !have("curl") || !have("python3") {
        cannot_run("the quick start (CONTRIBUTING.md) needs curl and python3");
        return;
    }
    let guide = read("CONTRIBUTING.md");
    assert!(guide.contains("cargo run -- serve --listen 127.0.0.1:8443"));
    assert!(guide.contains("cargo test"));
    let tmp = TempDir::new("quick-start");
    let port = free_port();
    let log = tmp.path().join("serve.log");
    // The quick start's command, on a free port, with the CA in a private directory and no cluster lookup.
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
        "CONTRIBUTING.md",
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
        "CONTRIBUTING.md quick start failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("'reason': 'injected_daemonset'"),
        "{stdout}"
    );
    assert!(stdout.contains("CERBOS_PDP_ADDR"), "{stdout}");

    // The quick start's offline example.
    assert!(guide.contains("cargo run -- inject -f examples/deployment.yaml"));
    let out = Command::new(BIN)
        .current_dir(root())
        .args(["inject", "-f", "examples/deployment.yaml"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("CERBOS_PDP_ADDR"));

    if !have("jq") {
        cannot_run("docs/snippets/review-log.sh needs jq");
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
        cannot_run("docs/snippets/config-hashes.sh needs jq");
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
    let version = pdp_core::names::VERSION;
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
    for drift in pdp_core::check::pods::Drift::ALL {
        assert!(
            section.contains(&format!("`{}`", drift.code())),
            "docs/operations.md does not document the check code {}",
            drift.code()
        );
    }
    for code in pdp_core::check::FindingCode::ALL {
        assert!(
            section.contains(&format!("`{}`", code.code())),
            "docs/operations.md does not document the check code {}",
            code.code()
        );
    }
    assert!(!root().join("docs/snippets/uninjected-pods.sh").exists());
    assert!(
        read("README.md").contains("check -A"),
        "the README shows check after install"
    );
}
