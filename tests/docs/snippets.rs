//! The app snippets of docs/apps.md against a real Cerbos (opt-in: `PDP_DOCS_CERBOS`), started as the
//! DaemonSet and as the sidecar run it, with the environment the injector renders; and the snippet matrix
//! generated from the same table.

use std::fmt::Write as _;
use std::fs;
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use pdp_core::config::Config;
use pdp_core::offline;

use pdp_testkit::dir::TempDir;
use pdp_testkit::process::{Running, wait_for};
use pdp_testkit::skip::cannot_run;

use crate::support::{configmap_data, read, root};

/// The ways a Pod can be wired, with the example whose rendered environment the app sees.
const MODES: [(&str, &str); 4] = [
    ("sidecar", "docs/examples/sidecar.out.yaml"),
    ("daemonset", "docs/examples/daemonset.out.yaml"),
    (
        "daemonset, namespace not `privileged`",
        "docs/examples/daemonset-baseline.out.yaml",
    ),
    (
        "daemonset, TLS with a client certificate",
        "docs/examples/tls.out.yaml",
    ),
];

struct Snippet {
    file: &'static str,
    what: &'static str,
    /// Whether it works in each of [`MODES`].
    works: [bool; 4],
    /// What its output contains when it works.
    expect: &'static str,
}

const SNIPPETS: [Snippet; 5] = [
    Snippet {
        file: "docs/snippets/http-tcp.sh",
        what: "HTTP/JSON API over TCP, `$CERBOS_PDP_HTTP_ADDR`",
        works: [true, true, true, false],
        expect: "\"view\":\"EFFECT_ALLOW\"",
    },
    Snippet {
        file: "docs/snippets/http-unix-socket.sh",
        what: "HTTP/JSON API over the Unix socket `$CERBOS_PDP_SOCKET`",
        works: [false, true, false, false],
        expect: "\"view\":\"EFFECT_ALLOW\"",
    },
    Snippet {
        file: "docs/snippets/grpc-tcp.sh",
        what: "gRPC over TCP, `$CERBOS_PDP_ADDR`",
        works: [true, true, true, false],
        expect: "SERVING",
    },
    Snippet {
        file: "docs/snippets/grpc-unix-socket.sh",
        what: "gRPC over the Unix socket, `unix:$CERBOS_PDP_SOCKET`",
        works: [false, true, false, false],
        expect: "SERVING",
    },
    Snippet {
        file: "docs/snippets/grpc-tls.sh",
        what: "gRPC over TLS, `$CERBOS_PDP_ADDR`, checking `$CERBOS_PDP_TLS_SERVER_NAME`",
        works: [false, false, false, true],
        expect: "SERVING",
    },
];

pub fn snippet_matrix() -> String {
    let mut s = String::from("| snippet | reaches Cerbos by |");
    for (mode, _) in MODES {
        write!(s, " {mode} |").unwrap();
    }
    s.push_str("\n|---|---|");
    s.push_str(&"---|".repeat(MODES.len()));
    s.push('\n');
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
/// Downward API host as 127.0.0.1, the socket path moved to `socket`, and the TLS mount to `tls_dir`.
fn app_environment(out_yaml: &str, socket: &Path, tls_dir: &Path) -> Vec<(String, String)> {
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
            if let Some(file) = v.strip_prefix(TLS_MOUNT) {
                v = format!("{}{file}", tls_dir.display());
            }
            v
        };
        out.push((name, value));
    }
    out
}

/// Where the profile's `tls` mounts the Secret by default.
const TLS_MOUNT: &str = "/var/run/pdp-injector/tls";

/// The front (`pdp-injector node-proxy`) as the pdp-node-front DaemonSet runs it, on 127.0.0.1:3593 (gRPC),
/// 127.0.0.1:3592 (HTTP) and `socket`,
/// forwarding to the instance sockets in `instances`; `extra` adds flags (TLS).
fn start_front(dir: &Path, socket: &Path, instances: &Path, extra: &[String]) -> Running {
    let child = Command::new(env!("CARGO_BIN_EXE_pdp-injector"))
        .arg("node-proxy")
        .arg("--listen=127.0.0.1:3593")
        .arg("--http-listen=127.0.0.1:3592")
        .arg(format!("--socket={}", socket.display()))
        .arg(format!("--instances={}", instances.display()))
        .args(extra)
        .stdout(fs::File::create(dir.join("front.log")).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start pdp-injector node-proxy: {e}"));
    Running(child)
}

/// A CA, the front's certificate for `server_name`, and a client certificate, as files: the front's
/// (tls.crt, tls.key, ca.crt) in `front`, the app's Secret (ca.crt, tls.crt, tls.key) in `app`.
fn write_pki(server_name: &str, front: &Path, app: &Path) {
    use pdp_tls::certs;
    use rcgen::{CertificateParams, ExtendedKeyUsagePurpose, Issuer, KeyPair};
    let bundle = certs::generate(&[server_name.to_string()], 2, 1).unwrap();
    let issuer = Issuer::from_ca_cert_pem(
        &bundle.ca_cert_pem,
        KeyPair::from_pem(&bundle.ca_key_pem).unwrap(),
    )
    .unwrap();
    let mut params = CertificateParams::new(vec!["orders.shop".to_string()]).unwrap();
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let key = KeyPair::generate().unwrap();
    let client = params.signed_by(&key, &issuer).unwrap();
    for dir in [front, app] {
        fs::create_dir_all(dir).unwrap();
        fs::write(dir.join("ca.crt"), &bundle.ca_cert_pem).unwrap();
    }
    fs::write(front.join("tls.crt"), &bundle.cert_pem).unwrap();
    fs::write(front.join("tls.key"), &bundle.key_pem).unwrap();
    fs::write(app.join("tls.crt"), client.pem()).unwrap();
    fs::write(app.join("tls.key"), key.serialize_pem()).unwrap();
}

fn start_cerbos(bin: &str, args: &[String], dir: &Path) -> Running {
    let child = Command::new(bin)
        .args(args)
        .env("CERBOS_NO_TELEMETRY", "1")
        .env("POD_NAME", "pdp-docs")
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
        cannot_run(
            "set PDP_DOCS_CERBOS to a cerbos binary (scripts/docs-snippets.sh and .ci/run do) to run the app snippets",
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
    let policies = root().join("charts/pdp-injector/files/policies");
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

    // The node-local PDP as the chart's templates/cerbos-node run it: Cerbos on its own instance sockets
    // (${POD_NAME}.grpc.sock and .http.sock), and the front on the node's port and socket.
    let instances = tmp.path().join("instances");
    fs::create_dir_all(&instances).unwrap();
    let config = configmap_data(
        "manifests/overlays/daemonset/cerbos-node/configmaps.yaml",
        "cerbos-pdp-config",
        "config.yaml",
    )
    .replace(
        "/var/run/cerbos-instances",
        &instances.display().to_string(),
    )
    .replace(
        "directory: /policies",
        &format!("directory: {}", policies.display()),
    );
    fs::write(tmp.path().join("config.yaml"), config).unwrap();
    let tls_front = tmp.path().join("front-tls");
    let tls_app = tmp.path().join("app-tls");
    let tls_out = offline::parse_stream(&read(MODES[3].1)).unwrap();
    let server_name = tls_out
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .and_then(|d| {
            d["spec"]["template"]["spec"]["containers"][0]["env"]
                .as_array()
                .unwrap()
                .iter()
                .find(|e| e["name"] == "CERBOS_PDP_TLS_SERVER_NAME")
                .map(|e| e["value"].as_str().unwrap().to_string())
        })
        .expect("the TLS example names a server name");
    write_pki(&server_name, &tls_front, &tls_app);
    {
        let _pdp = start_cerbos(
            &bin,
            &["server".into(), "--config=config.yaml".into()],
            tmp.path(),
        );
        wait_for(
            "the DaemonSet-shaped Cerbos",
            Duration::from_secs(60),
            || instances.join("pdp-docs.http.sock").exists(),
        );
        {
            let _front = start_front(tmp.path(), &socket, &instances, &[]);
            wait_for("the front", Duration::from_secs(30), || {
                socket.exists()
                    && TcpStream::connect(("127.0.0.1", 3593)).is_ok()
                    && TcpStream::connect(("127.0.0.1", 3592)).is_ok()
            });
            for mode in [1, 2] {
                failures.extend(run(
                    mode,
                    &app_environment(MODES[mode].1, &socket, &tls_app),
                ));
            }
        }
        wait_for("the plaintext front gone", Duration::from_secs(30), || {
            TcpStream::connect(("127.0.0.1", 3593)).is_err()
                && TcpStream::connect(("127.0.0.1", 3592)).is_err()
        });
        // TLS on the port with client certificates required, as pdp.nodeLocal.tls and
        // pdp-front-client-auth configure the front.
        let tls_flags = [
            format!("--tls-cert={}", tls_front.join("tls.crt").display()),
            format!("--tls-key={}", tls_front.join("tls.key").display()),
            format!("--tls-client-ca={}", tls_front.join("ca.crt").display()),
        ];
        let _front = start_front(tmp.path(), &socket, &instances, &tls_flags);
        wait_for("the TLS front", Duration::from_secs(30), || {
            socket.exists() && TcpStream::connect(("127.0.0.1", 3593)).is_ok()
        });
        failures.extend(run(3, &app_environment(MODES[3].1, &socket, &tls_app)));
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
        failures.extend(run(0, &app_environment(MODES[0].1, &socket, tmp.path())));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
