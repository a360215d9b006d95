//! The addresses the injector writes are valid `host:port` once the kubelet has expanded them, on IPv4 and IPv6
//! nodes: the rendered variables are expanded the way the kubelet does (`$(VAR)` of a variable defined before,
//! `$$` for a literal `$`, anything else left as it is), with `status.hostIP` standing for the node's address,
//! and the address is parsed with `SocketAddr::from_str`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::str::FromStr;

use k8s_openapi::api::core::v1::{EnvVar, Pod};
use pdp_core::config::Config;
use pdp_core::core::{NamespaceInfo, Outcome, inject, patched};
use serde_json::json;

/// Kubernetes' `$(VAR)` expansion (`third_party/forked/golang/expansion`): a reference to a variable defined
/// earlier in the list is replaced, `$$` is a literal `$`, an unknown reference stays as written.
fn expand(text: &str, defined: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(')
            && let Some(end) = inner.find(')')
        {
            let name = &inner[..end];
            match defined.get(name) {
                Some(v) => out.push_str(v),
                None => out.push_str(&rest[at..at + 3 + end]),
            }
            rest = &inner[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// The environment the app sees, in order, with `status.hostIP` = `host_ip`, `spec.nodeName` = `node-1` and no
/// annotations.
fn container_env(env: &[EnvVar], host_ip: &str) -> BTreeMap<String, String> {
    let mut defined = BTreeMap::new();
    for e in env {
        let value = match (
            &e.value,
            e.value_from.as_ref().and_then(|v| v.field_ref.as_ref()),
        ) {
            (_, Some(f)) if f.field_path == "status.hostIP" => host_ip.to_string(),
            (_, Some(f)) if f.field_path == "spec.nodeName" => "node-1".to_string(),
            // The Pods here carry no flag sets annotation: the kubelet gives the empty string.
            (_, Some(f)) if f.field_path == "metadata.annotations['pdp-injector.io/flag-sets']" => {
                String::new()
            }
            (_, Some(f)) => panic!("unexpected field {}", f.field_path),
            (Some(v), None) => expand(v, &defined),
            (None, None) => String::new(),
        };
        defined.insert(e.name.clone(), value);
    }
    defined
}

fn wired_env(
    config: &Config,
    mode: &str,
    profile: &str,
    host_ip: &str,
) -> BTreeMap<String, String> {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "app", "annotations": {
            "pdp-injector.io/inject": mode, "pdp-injector.io/profile": profile}},
        "spec": {"containers": [{"name": "app", "image": "registry.example/app:1",
            "env": [{"name": "AUTHZ", "value": "$(CERBOS_PDP_ADDR)"}]}]}
    }))
    .unwrap();
    let Outcome::Injected(i) = inject(&pod, &NamespaceInfo::named("apps"), config) else {
        panic!("{mode}/{profile} not injected");
    };
    let out = patched(&pod, &i.patch).unwrap();
    let env = out.spec.unwrap().containers[0].env.clone().unwrap();
    container_env(&env, host_ip)
}

#[test]
fn expansion_follows_the_kubelet() {
    let defined = BTreeMap::from([("A".to_string(), "x".to_string())]);
    assert_eq!(expand("[$(A)]:1", &defined), "[x]:1");
    assert_eq!(expand("$$(A)", &defined), "$(A)");
    assert_eq!(expand("$(B):1", &defined), "$(B):1");
    assert_eq!(expand("a$b", &defined), "a$b");
}

#[test]
fn daemonset_addresses_parse_on_ipv4_and_ipv6_nodes() {
    let v4 = Config::builtin();
    let v6 = Config::from_yaml("nodeAddressFamily: IPv6\n").unwrap();
    for (config, host, expected) in [
        (&v4, "10.0.0.7", "10.0.0.7:3593"),
        (&v6, "fd00::7", "[fd00::7]:3593"),
    ] {
        let env = wired_env(config, "daemonset", "cerbos", host);
        let addr = &env["CERBOS_PDP_ADDR"];
        assert_eq!(addr, expected);
        let parsed = SocketAddr::from_str(addr).unwrap_or_else(|e| panic!("{addr}: {e}"));
        assert_eq!(parsed.ip().to_string(), host);
        assert_eq!(parsed.port(), 3593);
        // The app's own variable sees the expanded address too.
        assert_eq!(&env["AUTHZ"], expected);
        let flagd = wired_env(config, "daemonset", "flagd", host);
        let parsed = SocketAddr::from_str(&flagd["FLAGD_ADDR"]).unwrap();
        assert_eq!(
            (parsed.ip().to_string(), parsed.port()),
            (host.to_string(), 8013)
        );
        // Host and port on their own, for providers that join them: the bare address.
        assert_eq!(flagd["FLAGD_HOST"], host);
        assert_eq!(flagd["FLAGD_PORT"], "8013");
    }
    // The IPv4 wiring on an IPv6 node is exactly what the setting exists for: not a valid address.
    let wrong = wired_env(&v4, "daemonset", "cerbos", "fd00::7");
    assert!(SocketAddr::from_str(&wrong["CERBOS_PDP_ADDR"]).is_err());
}

#[test]
fn sidecar_and_central_addresses_parse_whatever_the_node_family() {
    let config = Config::from_yaml(
        "nodeAddressFamily: IPv6\nprofiles:\n  cerbos:\n    central: {address: \"[fd00:10:96::a]:3593\"}\n  flagd:\n    central: {address: 10.96.0.10:8013}\n",
    )
    .unwrap();
    let sidecar = wired_env(&config, "sidecar", "cerbos", "fd00::7");
    assert_eq!(
        SocketAddr::from_str(&sidecar["CERBOS_PDP_ADDR"]).unwrap(),
        SocketAddr::from_str("127.0.0.1:3593").unwrap()
    );
    let central = wired_env(&config, "central", "cerbos", "fd00::7");
    assert_eq!(
        SocketAddr::from_str(&central["CERBOS_PDP_ADDR"]).unwrap(),
        SocketAddr::from_str("[fd00:10:96::a]:3593").unwrap()
    );
    let central = wired_env(&config, "central", "flagd", "fd00::7");
    assert!(SocketAddr::from_str(&central["FLAGD_ADDR"]).is_ok());
}

#[test]
fn a_node_name_is_never_bracketed() {
    let config = Config::from_yaml(
        "nodeAddressFamily: IPv6\nprofiles:\n  cerbos:\n    hostField: spec.nodeName\n",
    )
    .unwrap();
    let env = wired_env(&config, "daemonset", "cerbos", "fd00::7");
    assert_eq!(env["CERBOS_PDP_ADDR"], "node-1:3593");
}

#[test]
fn tls_variables_point_into_the_mount() {
    let config = Config::from_yaml(
        "profiles:\n  cerbos:\n    tls:\n      secretName: pdp-tls\n      serverName: cerbos-pdp.pdp-node.svc\n      clientCertificate: true\n",
    )
    .unwrap();
    let env = wired_env(&config, "daemonset", "cerbos", "10.0.0.7");
    assert_eq!(env["CERBOS_PDP_TLS"], "true");
    assert_eq!(env["CERBOS_PDP_TLS_CA"], "/var/run/pdp-injector/tls/ca.crt");
    assert_eq!(env["CERBOS_PDP_TLS_SERVER_NAME"], "cerbos-pdp.pdp-node.svc");
    assert_eq!(
        env["CERBOS_PDP_TLS_CERT"],
        "/var/run/pdp-injector/tls/tls.crt"
    );
    assert_eq!(
        env["CERBOS_PDP_TLS_KEY"],
        "/var/run/pdp-injector/tls/tls.key"
    );
    let sidecar = wired_env(&config, "sidecar", "cerbos", "10.0.0.7");
    assert!(
        !sidecar.keys().any(|k| k.starts_with("CERBOS_PDP_TLS")),
        "{sidecar:?}"
    );
}
