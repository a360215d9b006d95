//! Names, ports, paths and commands in the prose and the snippets: `inject` commands use their example's
//! flags, variables, sockets and ports are the rendered ones, links and repository paths exist.

use std::collections::BTreeSet;
use std::path::Path;

use pdp_core::config::Config;

use crate::examples::examples;
use crate::support::{configmap_data, markdown_files, read, root, snippet_files};

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
    let shipped = Config::load(&root().join("manifests/overlays/daemonset/config.yaml")).unwrap();
    let mut env_names = BTreeSet::new();
    let mut sockets = BTreeSet::new();
    let mut ports = BTreeSet::from([8443u16]);
    for p in config.profiles.values().chain(shipped.profiles.values()) {
        env_names.extend(p.app_env.iter().map(|e| e.name.clone()));
        env_names.extend(
            [&p.env_names.host, &p.env_names.address, &p.env_names.socket]
                .into_iter()
                .chain(p.env_names.port.as_ref())
                .chain(p.env_names.http_address.as_ref())
                .chain(p.env_names.fallback_address.as_ref())
                .chain(p.env_names.fallback_http_address.as_ref())
                .cloned(),
        );
        // The TLS variables, rendered once a profile sets `tls`.
        if let Some(t) = p.tls_env_names() {
            env_names.extend([t.flag, t.ca, t.server_name, t.cert, t.key]);
        }
        // The sidecar's own environment (CERBOS_NO_TELEMETRY) is rendered too.
        env_names.extend(p.env.iter().map(|e| e.name.clone()));
        sockets.insert(p.socket.path());
        ports.extend(p.ports.iter().map(|port| port.port));
    }
    // What an app sets itself for its provider (the flag sets it selects), named in the docs, never rendered.
    env_names.insert("FLAGD_SOURCE_SELECTOR".to_string());
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
    // The node's endpoints are the front's: gRPC on hostPort 3593 and the stable socket; the PDP behind it
    // publishes nothing and listens on its own per-Pod sockets, which the front forwards to.
    let front = read("manifests/overlays/daemonset/cerbos-node/front.yaml");
    assert!(
        front.contains("hostPort: 3593"),
        "the front publishes gRPC on 3593"
    );
    assert!(
        front.contains(&format!("--socket={}", cerbos.socket.path())),
        "the front serves the profile's socket"
    );
    let daemonset = read("manifests/overlays/daemonset/cerbos-node/daemonset.yaml");
    assert!(
        !daemonset.contains("hostPort:"),
        "the PDP publishes no port (its surge Pod must fit next to the old one)"
    );
    let server = configmap_data(
        "manifests/overlays/daemonset/cerbos-node/configmaps.yaml",
        "cerbos-pdp-config",
        "config.yaml",
    );
    assert!(
        server.contains("httpListenAddr: \"unix:/var/run/cerbos-instances/${POD_NAME}.http.sock\"")
            && server.contains(
                "grpcListenAddr: \"unix:/var/run/cerbos-instances/${POD_NAME}.grpc.sock\""
            ),
        "the PDP listens on the per-Pod sockets the front forwards to"
    );
    assert!(front.contains("--instances=/var/run/cerbos-instances"));

    // The Go snippet dials exactly the two forms the live test proves.
    let go = read("docs/snippets/grpc-client.go");
    assert!(go.contains("os.Getenv(\"CERBOS_PDP_ADDR\")"));
    assert!(go.contains("\"unix:\" + sock") && go.contains("os.Getenv(\"CERBOS_PDP_SOCKET\")"));
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
    let deployment = read("manifests/overlays/daemonset/webhook/deployment.yaml");
    let image = deployment
        .lines()
        .find_map(|l| l.trim().strip_prefix("image: "))
        .unwrap();
    assert!(
        readme.contains(&format!("`{image}`")),
        "README does not name {image}"
    );
}
