//! The app snippets of docs/apps.md against a real Cerbos (opt-in: `PDP_DOCS_CERBOS`), started as the
//! DaemonSet and as the sidecar run it, with the environment the injector renders; and the snippet matrix
//! generated from the same table.

use std::fmt::Write as _;
use std::fs;
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use pdp_injector::config::Config;
use pdp_injector::offline;

use crate::support::{Running, TempDir, read, root, wait_for};

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

pub fn snippet_matrix() -> String {
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
