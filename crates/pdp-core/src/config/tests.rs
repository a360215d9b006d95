//! Unit tests of loading, merging and validating configs.

use super::validate::{socket_dir_problem, volume_source_problem};
use super::*;
use k8s_openapi::api::core::v1::SecurityContext;

#[test]
fn builtin_config_has_both_profiles_and_safe_defaults() {
    let c = Config::builtin();
    assert_eq!(c.default_mode, Mode::Daemonset);
    assert_eq!(c.default_profile, "cerbos");
    assert!(!c.inject_by_default);
    assert_eq!(c.profile_names(), "cerbos, flagd");
    for ns in [
        "kube-system",
        "kube-public",
        "kube-node-lease",
        "pdp-system",
    ] {
        assert!(c.excluded_namespaces.contains(ns), "{ns}");
    }
    assert_eq!(c.hash.len(), 12);
}

#[test]
fn empty_file_equals_builtin() {
    assert_eq!(Config::from_yaml("").unwrap(), Config::builtin());
    assert_eq!(Config::from_yaml("# nothing\n").unwrap(), Config::builtin());
}

#[test]
fn unknown_key_names_its_path() {
    let err = Config::from_yaml("profiles:\n  cerbos:\n    imagee: x\n").unwrap_err();
    let text = err.to_string();
    assert!(text.contains("profiles.cerbos"), "{text}");
    assert!(text.contains("imagee"), "{text}");
    let err = Config::from_yaml("defaultMod: sidecar\n").unwrap_err();
    assert!(err.to_string().contains("defaultMod"), "{err}");
}

#[test]
fn wrong_type_names_its_path() {
    let err = Config::from_yaml("defaultMode: sidecars\n").unwrap_err();
    assert!(
        err.to_string().starts_with("config key defaultMode:"),
        "{err}"
    );
}

#[test]
fn overlay_keeps_builtin_fields_and_changes_the_hash() {
    let c = Config::from_yaml(
        "defaultMode: sidecar\nprofiles:\n  cerbos:\n    image: registry.local/cerbos:1\n",
    )
    .unwrap();
    assert_eq!(c.default_mode, Mode::Sidecar);
    let p = &c.profiles["cerbos"];
    assert_eq!(p.image, "registry.local/cerbos:1");
    assert_eq!(p.address_port, 3593);
    assert_ne!(c.hash, Config::builtin().hash);
}

#[test]
fn new_profile_extends_and_requires_fields() {
    let c = Config::from_yaml(
        "profiles:\n  cerbos-tenant:\n    extends: cerbos\n    containerName: tenant-pdp\n",
    )
    .unwrap();
    assert_eq!(c.profiles["cerbos-tenant"].container_name, "tenant-pdp");
    let err = Config::from_yaml("profiles:\n  opa:\n    image: openpolicyagent/opa\n").unwrap_err();
    assert!(
        err.to_string().contains("profile \"opa\" has no ports"),
        "{err}"
    );
    let err = Config::from_yaml("profiles:\n  x:\n    extends: nope\n").unwrap_err();
    assert!(
        err.to_string().contains("unknown profile \"nope\""),
        "{err}"
    );
}

#[test]
fn unsafe_profiles_are_refused() {
    let err = Config::from_yaml(
        "profiles:\n  cerbos:\n    securityContext:\n      allowPrivilegeEscalation: true\n",
    )
    .unwrap_err();
    assert!(err.to_string().contains("restricted"), "{err}");
    let err = Config::from_yaml(
        "profiles:\n  cerbos:\n    volumes:\n    - mountPath: /x\n      volume:\n        name: host\n        hostPath:\n          path: /\n",
    )
    .unwrap_err();
    assert!(err.to_string().contains("hostPath"), "{err}");
    let err = Config::from_yaml("defaultProfile: opa\n").unwrap_err();
    assert!(err.to_string().contains("cerbos, flagd"), "{err}");
    let err = Config::from_yaml("profiles:\n  cerbos:\n    addressPort: 1\n").unwrap_err();
    assert!(err.to_string().contains("addressPort 1"), "{err}");
}

#[test]
fn admin_security_context_keeps_the_hardening_it_does_not_mention() {
    let c =
        Config::from_yaml("profiles:\n  cerbos:\n    securityContext:\n      runAsUser: 4242\n")
            .unwrap();
    let sc = &c.profiles["cerbos"].security_context;
    assert_eq!(sc.run_as_user, Some(4242));
    assert!(restricted_violations(sc).is_empty());
}

#[test]
fn builtin_contexts_meet_restricted() {
    for p in builtin_profiles().values() {
        assert!(restricted_violations(&p.security_context).is_empty());
    }
    let open = SecurityContext::default();
    assert_eq!(restricted_violations(&open).len(), 4);
}

/// A profile `cerbos` whose securityContext is `sc` (YAML flow mapping), laid over the restricted baseline.
fn with_security_context(sc: &str) -> Result<Config, ConfigError> {
    Config::from_yaml(&format!(
        "profiles:\n  cerbos:\n    securityContext: {sc}\n"
    ))
}

#[test]
fn restricted_checker_refuses_every_container_level_escape() {
    // Each line: a securityContext that Pod Security admission refuses at `restricted`, and the words the
    // refusal must contain (the field and its value).
    let refused = [
        ("{procMount: Unmasked}", "procMount is \"Unmasked\""),
        (
            "{seLinuxOptions: {type: spc_t}}",
            "seLinuxOptions.type is \"spc_t\"",
        ),
        (
            "{seLinuxOptions: {type: container_engine_t}}",
            "seLinuxOptions.type is \"container_engine_t\"",
        ),
        (
            "{seLinuxOptions: {type: unconfined_t}}",
            "seLinuxOptions.type is \"unconfined_t\"",
        ),
        (
            "{seLinuxOptions: {user: system_u}}",
            "seLinuxOptions.user is \"system_u\"",
        ),
        (
            "{seLinuxOptions: {role: system_r}}",
            "seLinuxOptions.role is \"system_r\"",
        ),
        (
            "{appArmorProfile: {type: Unconfined}}",
            "appArmorProfile.type is \"Unconfined\"",
        ),
        (
            "{appArmorProfile: {type: unconfined}}",
            "appArmorProfile.type is \"unconfined\"",
        ),
        (
            "{windowsOptions: {hostProcess: true}}",
            "windowsOptions.hostProcess is true",
        ),
        (
            "{capabilities: {drop: [ALL], add: [SYS_ADMIN]}}",
            "capabilities.add holds SYS_ADMIN",
        ),
        (
            "{capabilities: {drop: [ALL], add: [NET_BIND_SERVICE, NET_RAW]}}",
            "capabilities.add holds NET_RAW",
        ),
        (
            "{capabilities: {add: [NET_BIND_SERVICE]}}",
            "capabilities.drop does not contain ALL",
        ),
        (
            "{seccompProfile: {type: Unconfined}}",
            "seccompProfile.type is \"Unconfined\"",
        ),
        ("{privileged: true}", "privileged is true"),
        ("{runAsUser: 0}", "runAsUser is 0"),
        ("{runAsNonRoot: false}", "runAsNonRoot is not true"),
        (
            "{allowPrivilegeEscalation: true}",
            "allowPrivilegeEscalation is not false",
        ),
    ];
    for (sc, words) in refused {
        let err = with_security_context(sc).unwrap_err().to_string();
        assert!(
            err.contains(
                "profile \"cerbos\": securityContext does not meet Pod Security restricted"
            ) && err.contains(words),
            "{sc}: {err}"
        );
    }
    // What restricted allows for the same fields.
    let allowed = [
        "{procMount: Default}",
        "{seLinuxOptions: {type: container_t, level: \"s0:c123,c456\"}}",
        "{seLinuxOptions: {type: container_init_t}}",
        "{seLinuxOptions: {type: container_kvm_t, user: \"\", role: \"\"}}",
        "{seLinuxOptions: {type: \"\"}}",
        "{seLinuxOptions: {level: s0}}",
        "{appArmorProfile: {type: RuntimeDefault}}",
        "{appArmorProfile: {type: Localhost, localhostProfile: k8s-pdp}}",
        "{windowsOptions: {hostProcess: false, runAsUserName: pdp}}",
        "{capabilities: {drop: [ALL], add: [NET_BIND_SERVICE]}}",
        "{seccompProfile: {type: Localhost, localhostProfile: pdp.json}}",
    ];
    for sc in allowed {
        let c = with_security_context(sc).unwrap_or_else(|e| panic!("{sc}: {e}"));
        assert!(restricted_violations(&c.profiles["cerbos"].security_context).is_empty());
    }
    // The checker on its own: every violation is reported, not only the first.
    let sc: SecurityContext = serde_json::from_value(serde_json::json!({
        "allowPrivilegeEscalation": false, "runAsNonRoot": true, "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"}, "procMount": "Unmasked",
        "seLinuxOptions": {"type": "spc_t", "user": "u", "role": "r"},
        "appArmorProfile": {"type": "Unconfined"}, "windowsOptions": {"hostProcess": true}
    }))
    .unwrap();
    assert_eq!(
        restricted_violations(&sc).len(),
        6,
        "{:?}",
        restricted_violations(&sc)
    );
}

/// A profile `cerbos` with one sidecar volume `v` of the given source (YAML flow mapping entries).
fn with_volume(source: &str) -> Result<Config, ConfigError> {
    Config::from_yaml(&format!(
        "profiles:\n  cerbos:\n    volumes:\n    - mountPath: /data\n      volume: {{name: v, {source}}}\n"
    ))
}

#[test]
fn profile_volumes_are_an_allow_list() {
    for source in [
        "configMap: {name: policies}",
        "secret: {secretName: pdp-tls}",
        "emptyDir: {medium: Memory}",
        "projected: {sources: [{configMap: {name: a}}, {downwardAPI: {items: [{path: ns, fieldRef: {fieldPath: metadata.namespace}}]}}]}",
        "downwardAPI: {items: [{path: labels, fieldRef: {fieldPath: metadata.labels}}]}",
    ] {
        with_volume(source).unwrap_or_else(|e| panic!("{source}: {e}"));
    }
    // Everything that reaches the node, its network or cluster storage is refused, naming the volume, its
    // kind and the allowed kinds.
    for (source, kind) in [
        ("hostPath: {path: /}", "hostPath"),
        (
            "persistentVolumeClaim: {claimName: data}",
            "persistentVolumeClaim",
        ),
        ("csi: {driver: secrets-store.csi.k8s.io}", "csi"),
        (
            "ephemeral: {volumeClaimTemplate: {spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}}}",
            "ephemeral",
        ),
        ("nfs: {server: nfs.local, path: /exports}", "nfs"),
        (
            "iscsi: {targetPortal: 10.0.0.1, iqn: iqn.2001-04.com.example:storage, lun: 0}",
            "iscsi",
        ),
        ("image: {reference: registry.local/policies:1}", "image"),
        (
            "gitRepo: {repository: https://example.invalid/p.git}",
            "gitRepo",
        ),
        ("rbd: {monitors: [10.0.0.1], image: pdp}", "rbd"),
        ("flexVolume: {driver: example/driver}", "flexVolume"),
    ] {
        let err = with_volume(source).unwrap_err().to_string();
        assert!(
            err.contains(&format!(
                "profile \"cerbos\": volume \"v\" is a {kind} volume"
            )) && err.contains("configMap, secret, emptyDir, projected, downwardAPI"),
            "{source}: {err}"
        );
    }
    // A source the Volume type does not know (misspelt or newer) is not dropped silently.
    let err = with_volume("configMap: {name: p}, hostPathh: {path: /}")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("profiles.cerbos.volumes[0].volume.hostPathh")
            && err.contains("configMap, secret, emptyDir, projected, downwardAPI"),
        "{err}"
    );
    // No source at all, or two.
    let err = Config::from_yaml(
        "profiles:\n  cerbos:\n    volumes:\n    - mountPath: /data\n      volume: {name: v}\n",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("volume \"v\" has no volume source"), "{err}");
    let err = with_volume("configMap: {name: p}, emptyDir: {}")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("volume \"v\" has several volume sources"),
        "{err}"
    );
}

fn with_socket_dir(dir: &str) -> Result<Config, ConfigError> {
    Config::from_yaml(&format!(
        "profiles:\n  cerbos:\n    socket: {{dir: \"{dir}\", file: cerbos.sock}}\n"
    ))
}

#[test]
fn socket_dir_is_an_allow_list() {
    // Refused: the node's system, kubelet, runtime and network trees (also those a deny list once missed), the
    // PDP instances' own directory, parents, and any other directory.
    let refused = [
        "/",
        "//",
        "/run",
        "/var/run",
        "/var/run/",
        "//var//run//",
        "/var/./run",
        "/var",
        "/etc",
        "/proc",
        "/sys",
        "/dev",
        "/home",
        "/root",
        "/usr",
        "/tmp",
        "/var/lib",
        "/var/lib/kubelet",
        "/var/lib/kubelet/pods",
        "/var/log/pods",
        "/var/run/docker.sock",
        "/run/containerd",
        "/var/run/crio",
        "/run/k3s",
        "/run/cilium",
        "/run/dbus",
        "/run/systemd",
        "/var/run/cerbos-instances",
        "/var/run/cerbos/../containerd",
        "/var/run/pdp-injector",
        "/run/pdp-injector/",
        "/var/run/pdp-injector-x/cerbos",
        "/var/run/cerbosx",
        "/var/run/cerbos/sub",
        "/opt/pdp",
        "/var/lib/cerbos",
    ];
    for dir in refused {
        let Err(err) = with_socket_dir(dir) else {
            panic!("{dir}: accepted");
        };
        let err = err.to_string();
        assert!(
            err.contains(&format!("profile \"cerbos\": socket.dir {dir:?}"))
                && (err.contains("is not a directory a node-local PDP may use")
                    || err.contains("absolute")),
            "{dir}: {err}"
        );
    }
    let err = with_socket_dir("/run/k3s").unwrap_err().to_string();
    assert!(
        err.contains("/var/run/cerbos, /run/cerbos, /var/run/flagd, /run/flagd")
            && err.contains("below /var/run/pdp-injector or /run/pdp-injector"),
        "{err}"
    );
    let err = with_socket_dir("//var//run//").unwrap_err().to_string();
    assert!(err.contains("(that is /var/run)"), "{err}");
    for dir in [
        "/var/run/cerbos",
        "/var/run/cerbos/",
        "/run/cerbos",
        "/run/flagd",
        "/var/run/flagd",
        "/var/run/pdp-injector/opa",
        "/run/pdp-injector/tenant/a",
    ] {
        with_socket_dir(dir).unwrap_or_else(|e| panic!("{dir}: {e}"));
    }
}

#[test]
fn builtin_and_shipped_configs_pass_every_check() {
    // The repository root: the shipped manifests and fixtures are beside the binary crate.
    let root = &Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut configs = vec![("built-in".to_string(), Config::builtin())];
    for file in [
        "manifests/overlays/daemonset/config.yaml",
        "manifests/overlays/sidecar-only/config.yaml",
        "tests/golden/custom/config.yaml",
        "fuzz/seeds/config/every-key.yaml",
    ] {
        let config = Config::load(&root.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        configs.push((file.to_string(), config));
    }
    for (source, config) in &configs {
        for (name, p) in &config.profiles {
            assert!(
                restricted_violations(&p.security_context).is_empty(),
                "{source}: {name}"
            );
            assert_eq!(socket_dir_problem(&p.socket.dir), None, "{source}: {name}");
            for v in &p.volumes {
                assert_eq!(volume_source_problem(&v.volume), None, "{source}: {name}");
            }
        }
    }
}

#[test]
fn pss_levels_parse_strictly() {
    assert_eq!(PssLevel::from_label("privileged"), PssLevel::Privileged);
    assert_eq!(PssLevel::from_label("baseline"), PssLevel::Baseline);
    assert_eq!(PssLevel::from_label("restricted"), PssLevel::Restricted);
    assert_eq!(PssLevel::from_label("Privileged"), PssLevel::Restricted);
}

#[test]
fn central_addresses_parse_or_name_what_is_wrong() {
    let spec = |a: &str| CentralSpec {
        address: a.into(),
        http_address: None,
    };
    assert_eq!(
        spec("cerbos.cerbos.svc.cluster.local:3593").host_port(),
        Ok(("cerbos.cerbos.svc.cluster.local", 3593))
    );
    assert_eq!(
        spec("10.96.0.10:3593").host_port(),
        Ok(("10.96.0.10", 3593))
    );
    assert_eq!(spec("[fd00::a]:3593").host_port(), Ok(("fd00::a", 3593)));
    for bad in [
        "cerbos",
        "cerbos:",
        "cerbos:0",
        "cerbos:70000",
        ":3593",
        "http://cerbos:3593",
        "Cerbos:3593",
        "$(HOST):3593",
        "a..b:3593",
        "fd00::a:3593",
        "[fd00::a:3593",
        "[not-v6]:3593",
    ] {
        assert!(spec(bad).host_port().is_err(), "{bad} accepted");
    }
}

#[test]
fn central_is_a_profile_setting_checked_at_load() {
    let c = Config::from_yaml(
        "profiles:\n  cerbos:\n    central:\n      address: cerbos.cerbos.svc:3593\n  mine:\n    extends: cerbos\n",
    )
    .unwrap();
    assert_eq!(
        c.profiles["mine"].central.as_ref().unwrap().address,
        "cerbos.cerbos.svc:3593",
        "extends carries the central address"
    );
    assert_eq!(Config::builtin().profiles["cerbos"].central, None);
    let e = Config::from_yaml(
        "profiles:\n  cerbos:\n    central:\n      address: http://cerbos:3593\n",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("profile \"cerbos\": central.address"), "{e}");
    let e = Config::from_yaml("defaultMode: central\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("defaultMode is central") && e.contains("profiles.cerbos.central.address"),
        "{e}"
    );
    let c = Config::from_yaml(
        "defaultMode: central\nprofiles:\n  cerbos:\n    central:\n      address: cerbos:3593\n",
    )
    .unwrap();
    assert_eq!(c.default_mode, Mode::Central);
    // A config without central keeps the hash it had before the setting existed.
    assert_eq!(Config::builtin().hash, Config::from_yaml("").unwrap().hash);
}

#[test]
fn app_env_takes_plain_distinct_values_only() {
    let load =
        |app_env: &str| Config::from_yaml(&format!("profiles:\n  flagd:\n    appEnv:\n{app_env}"));
    let c = load("      - {name: FLAGD_RESOLVER, value: in-process}\n").unwrap();
    assert_eq!(c.profiles["flagd"].app_env[0].name, "FLAGD_RESOLVER");
    for (bad, why) in [
        (
            "      - name: X\n        valueFrom: {fieldRef: {fieldPath: metadata.name}}\n",
            "plain value",
        ),
        ("      - {name: X}\n", "plain value"),
        (
            "      - {name: FLAGD_PORT, value: \"1\"}\n",
            "also envNames.port",
        ),
        (
            "      - {name: X, value: a}\n      - {name: X, value: b}\n",
            "twice",
        ),
        (
            "      - {name: \"1X\", value: a}\n",
            "not a valid environment variable name",
        ),
    ] {
        let e = load(bad).unwrap_err().to_string();
        assert!(e.contains(why), "{bad}: {e}");
    }
}

#[test]
fn host_socket_defaults_on_and_leaves_the_hash_alone() {
    let c = Config::from_yaml("profiles:\n  mine:\n    extends: flagd\n    hostSocket: false\n")
        .unwrap();
    assert!(Config::builtin().profiles["flagd"].host_socket);
    assert!(!c.profiles["mine"].host_socket);
    // Unset appEnv and hostSocket are left out of the hashed config: the built-in hash is what the docs show.
    assert_eq!(Config::builtin().hash, "9e3b16eb2aa4");
}

fn with_tls(profile: &str, tls: &str) -> Result<Config, ConfigError> {
    Config::from_yaml(&format!("profiles:\n  {profile}:\n    tls:\n{tls}"))
}

#[test]
fn tls_defaults_its_mount_path_and_names_per_builtin() {
    let c = with_tls(
        "cerbos",
        "      secretName: pdp-tls\n      serverName: cerbos-pdp.pdp-node.svc\n",
    )
    .unwrap();
    let p = &c.profiles["cerbos"];
    let tls = p.tls.as_ref().unwrap();
    assert_eq!(tls.mount_path, "/var/run/pdp-injector/tls");
    assert!(!tls.client_certificate);
    assert_eq!(tls.keys(), ["ca.crt"]);
    let names = p.tls_env_names().unwrap();
    assert_eq!(
        [
            names.flag,
            names.ca,
            names.server_name,
            names.cert,
            names.key
        ],
        [
            "CERBOS_PDP_TLS",
            "CERBOS_PDP_TLS_CA",
            "CERBOS_PDP_TLS_SERVER_NAME",
            "CERBOS_PDP_TLS_CERT",
            "CERBOS_PDP_TLS_KEY"
        ]
    );
    // flagd's names are what its OpenFeature providers read; a profile extending flagd inherits them.
    let c = Config::from_yaml(
        "profiles:\n  flags:\n    extends: flagd\n    tls:\n      secretName: f\n      serverName: flagd.x.svc\n      clientCertificate: true\n",
    )
    .unwrap();
    let names = c.profiles["flags"].tls_env_names().unwrap();
    assert_eq!(names.flag, "FLAGD_TLS");
    assert_eq!(names.ca, "FLAGD_SERVER_CERT_PATH");
    assert_eq!(names.cert, "FLAGD_TLS_CERT_PATH");
    assert_eq!(names.key, "FLAGD_TLS_KEY_PATH");
    assert_eq!(
        c.profiles["flags"].tls.as_ref().unwrap().keys(),
        ["ca.crt", "tls.crt", "tls.key"]
    );
    // envNames renames them one by one; the rest keep the built-in names.
    let c = Config::from_yaml(
        "profiles:\n  cerbos:\n    envNames: {host: H, address: A, socket: S, tlsCa: MY_CA}\n    tls:\n      secretName: s\n      serverName: pdp.example\n",
    )
    .unwrap();
    let names = c.profiles["cerbos"].tls_env_names().unwrap();
    assert_eq!(names.ca, "MY_CA");
    assert_eq!(names.flag, "CERBOS_PDP_TLS");
}

#[test]
fn tls_and_node_address_family_leave_other_configs_hash_alone() {
    // The built-in TLS names are code, not config: the built-in hash is unchanged (the docs show it).
    assert_eq!(Config::builtin().hash, "9e3b16eb2aa4");
    assert_eq!(
        Config::from_yaml("nodeAddressFamily: IPv4\n").unwrap().hash,
        "9e3b16eb2aa4"
    );
    let v6 = Config::from_yaml("nodeAddressFamily: IPv6\n").unwrap();
    assert_eq!(v6.node_address_family, NodeAddressFamily::IPv6);
    assert_ne!(v6.hash, "9e3b16eb2aa4");
    let tls = with_tls(
        "cerbos",
        "      secretName: s\n      serverName: pdp.example\n",
    )
    .unwrap();
    assert_ne!(tls.hash, "9e3b16eb2aa4");
    let e = Config::from_yaml("nodeAddressFamily: ipv6\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("nodeAddressFamily"), "{e}");
}

#[test]
fn tls_is_validated_with_clear_messages() {
    let ok = "      secretName: pdp-tls\n      serverName: cerbos-pdp.pdp-node.svc\n";
    for (tls, why) in [
        ("      secretName: pdp-tls\n", "serverName"),
        ("      serverName: a.b\n", "secretName"),
        (
            "      secretName: Pdp_TLS\n      serverName: a.b\n",
            "tls.secretName \"Pdp_TLS\" is not a DNS label",
        ),
        (
            "      secretName: s\n      serverName: 10.0.0.7\n",
            "tls.serverName \"10.0.0.7\" must be the DNS name",
        ),
        (
            "      secretName: s\n      serverName: \"*.pdp.svc\"\n",
            "tls.serverName",
        ),
        (
            "      secretName: s\n      serverName: a.b\n      mountPath: tls\n",
            "tls.mountPath \"tls\" must be an absolute path",
        ),
        (
            "      secretName: s\n      serverName: a.b\n      mountPath: /var/run/cerbos\n",
            "overlaps socket.dir",
        ),
        (
            "      secretName: s\n      serverName: a.b\n      mountPath: /var/run/cerbos/tls\n",
            "overlaps socket.dir",
        ),
        (
            "      secretName: s\n      serverName: a.b\n      mountPath: /var\n",
            "overlaps socket.dir",
        ),
        (
            "      secretName: s\n      serverName: a.b\n      clientCert: true\n",
            "clientCert",
        ),
        (
            "      caConfigMap: ca\n      serverName: a.b\n      clientCertificate: true\n",
            "tls.clientCertificate needs tls.secretName",
        ),
        (
            "      secretName: s\n      caConfigMap: ca\n      serverName: a.b\n",
            "tls.secretName is not used",
        ),
        (
            "      caConfigMap: Ca_Map\n      serverName: a.b\n",
            "tls.caConfigMap \"Ca_Map\" is not a DNS label",
        ),
    ] {
        let e = with_tls("cerbos", tls).unwrap_err().to_string();
        assert!(e.contains(why), "{tls}: {e}");
    }
    with_tls("cerbos", ok).unwrap();
    // The server's CA from a ConfigMap, with or without a client certificate from the Secret.
    with_tls("cerbos", "      caConfigMap: ca\n      serverName: a.b\n").unwrap();
    with_tls(
        "cerbos",
        "      secretName: s\n      caConfigMap: ca\n      serverName: a.b\n      clientCertificate: true\n",
    )
    .unwrap();

    // tls and mtls together: one rule, said plainly.
    let e = Config::from_yaml(&format!(
        "profiles:\n  cerbos:\n    mtls: {{secretName: c, mountPath: /etc/c}}\n    tls:\n{ok}"
    ))
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("profile \"cerbos\": tls and mtls are both set") && e.contains("Keep one"),
        "{e}"
    );

    // TLS names: valid, distinct from each other and from the rest, not shadowed by appEnv.
    for (names, why) in [
        (
            "{host: H, address: A, socket: S, tls: \"1X\"}",
            "not a valid environment variable name",
        ),
        (
            "{host: H, address: A, socket: S, tlsCa: H}",
            "envNames must be distinct: host and tlsCa are both \"H\"",
        ),
        (
            "{host: H, address: A, socket: S, tlsCert: K, tlsKey: K}",
            "tlsCert and tlsKey are both \"K\"",
        ),
    ] {
        let e = Config::from_yaml(&format!(
            "profiles:\n  cerbos:\n    envNames: {names}\n    tls:\n{ok}"
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains(why), "{names}: {e}");
    }
    let e = Config::from_yaml(&format!(
        "profiles:\n  cerbos:\n    appEnv: [{{name: CERBOS_PDP_TLS, value: \"false\"}}]\n    tls:\n{ok}"
    ))
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("appEnv \"CERBOS_PDP_TLS\" is also envNames.tls"),
        "{e}"
    );

    // A profile of its own has no built-in names to fall back on.
    let own = "profiles:\n  opa:\n    image: opa\n    ports: [{name: http, port: 8181}]\n    health: {path: /health, port: 8181}\n    envNames: {host: OPA_HOST, address: OPA_ADDR, socket: OPA_SOCKET}\n    socket: {dir: /var/run/pdp-injector/opa, file: opa.sock}\n";
    Config::from_yaml(own).unwrap();
    let e = Config::from_yaml(&format!(
        "{own}    tls:\n  {}",
        ok.replace('\n', "\n  ").trim_end()
    ))
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("envNames does not name every TLS variable"),
        "{e}"
    );
    Config::from_yaml(&format!(
        "{}    envNames: {{host: OPA_HOST, address: OPA_ADDR, socket: OPA_SOCKET, tls: OPA_TLS, tlsCa: OPA_CA, tlsServerName: OPA_SN, tlsCert: OPA_CERT, tlsKey: OPA_KEY}}\n    tls:\n{ok}",
        own.replace("    envNames: {host: OPA_HOST, address: OPA_ADDR, socket: OPA_SOCKET}\n", "")
    ))
    .unwrap();
}

#[test]
fn central_ipv6_addresses_need_brackets() {
    let spec = |a: &str| CentralSpec {
        address: a.into(),
        http_address: None,
    };
    for bad in ["fd00::a:3593", "fd00:10:96::a:3593"] {
        let e = spec(bad).host_port().unwrap_err();
        assert!(
            e.contains("an IPv6 host must be written in brackets"),
            "{bad}: {e}"
        );
    }
    let e = spec("fd00::a:3593").host_port().unwrap_err();
    assert!(e.contains("[fd00::a]:3593"), "{e}");
    let e = Config::from_yaml("profiles:\n  cerbos:\n    central: {address: \"fd00::a:3593\"}\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("central.address") && e.contains("brackets"),
        "{e}"
    );
}

#[test]
fn the_socket_comes_by_csi_where_the_setting_and_the_driver_say_so() {
    use super::{PssLevel::*, SocketBy};
    let builtin = Config::builtin();
    let cerbos = &builtin.profiles["cerbos"];
    let flagd = &builtin.profiles["flagd"];
    // auto without the driver: as before CSI existed.
    assert_eq!(builtin.socket_by(cerbos, Privileged), SocketBy::HostPath);
    assert_eq!(builtin.socket_by(cerbos, Baseline), SocketBy::Downgraded);
    // auto with the driver: CSI below privileged, for the profile the plugin serves; hostPath where allowed.
    let with = builtin.clone().with_csi_driver(true);
    assert_ne!(with.hash, builtin.hash, "the fact is in the hash");
    for level in [Baseline, Restricted] {
        assert_eq!(with.socket_by(cerbos, level), SocketBy::Csi);
    }
    assert_eq!(with.socket_by(cerbos, Privileged), SocketBy::HostPath);
    // flagd's /var/run/flagd is not the plugin's default directory and names no csiProfile.
    assert_eq!(with.socket_by(flagd, Baseline), SocketBy::Downgraded);
    assert_eq!(with.socket_by(flagd, Privileged), SocketBy::HostPath);
    // hostPath: never CSI; csi: CSI even without the driver (the admin says it is there).
    let host = Config::from_yaml("socketVolume: hostPath\n")
        .unwrap()
        .with_csi_driver(true);
    assert_eq!(host.socket_by(cerbos, Restricted), SocketBy::Downgraded);
    let csi = Config::from_yaml(
        "socketVolume: csi\nprofiles:\n  f:\n    extends: flagd\n    csiProfile: flagd\n",
    )
    .unwrap();
    assert_eq!(csi.socket_by(cerbos, Restricted), SocketBy::Csi);
    assert_eq!(csi.socket_by(cerbos, Privileged), SocketBy::Csi);
    assert_eq!(csi.socket_by(&csi.profiles["f"], Restricted), SocketBy::Csi);
    // A node-local PDP without a socket: none, and nothing to warn about.
    let mut none = cerbos.clone();
    none.host_socket = false;
    assert_eq!(with.socket_by(&none, Restricted), SocketBy::NotServed);
    // The default keeps existing configs' hashes: auto is not serialized.
    assert_eq!(
        Config::from_yaml("socketVolume: auto\n").unwrap().hash,
        builtin.hash
    );
    assert!(Config::from_yaml("socketVolume: nfs\n").is_err());
}

#[test]
fn await_node_is_on_for_cerbos_and_needs_the_health_check_on_the_http_port_the_front_serves() {
    assert!(Config::builtin().profiles["cerbos"].await_node);
    assert!(!Config::builtin().profiles["flagd"].await_node);
    let c = Config::from_yaml("profiles:\n  cerbos:\n    awaitNode: false\n").unwrap();
    assert!(!c.profiles["cerbos"].await_node);
    // flagd's health check is on its management port 8014, which no node front serves.
    let e = Config::from_yaml("profiles:\n  flagd:\n    awaitNode: true\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("awaitNode needs health.port (8014) to be httpPort (unset)"),
        "{e}"
    );
    let e = Config::from_yaml(
        "profiles:\n  cerbos:\n    awaitNode: true\n    health: {path: /_cerbos/health, port: 3593}\n",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("health.port (3593) to be httpPort (3592)"),
        "{e}"
    );
    // Turning the gate off is a change of wiring: the hash says so.
    assert_ne!(c.hash, Config::builtin().hash);
}

#[test]
fn fallback_needs_the_central_service_and_the_variable_that_carries_it() {
    let e = Config::from_yaml("profiles:\n  cerbos:\n    fallback: true\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("fallback needs central.address"), "{e}");
    let e = Config::from_yaml(
        "profiles:\n  flagd:\n    fallback: true\n    central: {address: flagd.pdp-system.svc:8013}\n",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("envNames.fallbackAddress"), "{e}");
    let c = Config::from_yaml(
        "profiles:\n  cerbos:\n    fallback: true\n    central: {address: cerbos.pdp-system.svc:3593}\n",
    )
    .unwrap();
    assert!(c.profiles["cerbos"].fallback);
}

#[test]
fn http_address_needs_the_http_port_and_one_of_the_ports() {
    let e = Config::from_yaml(
        "profiles:\n  flagd:\n    envNames: {host: H, address: A, socket: S, httpAddress: X}\n",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("envNames.httpAddress \"X\" needs httpPort"),
        "{e}"
    );
    let e = Config::from_yaml("profiles:\n  cerbos:\n    httpPort: 9999\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("httpPort 9999 is not one of its ports"), "{e}");
    let e = Config::from_yaml(
        "profiles:\n  cerbos:\n    envNames: {host: H, address: A, socket: S, httpAddress: A}\n",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("envNames must be distinct"), "{e}");
    // An envNames written before httpAddress existed: no HTTP variable, no error.
    let c =
        Config::from_yaml("profiles:\n  cerbos:\n    envNames: {host: H, address: A, socket: S}\n")
            .unwrap();
    assert_eq!(c.profiles["cerbos"].env_names.http_address, None);
}
