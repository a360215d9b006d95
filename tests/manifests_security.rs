//! The security-relevant settings of the install manifests, pinned so that a change to them is a deliberate one
//! (SECURITY.md): least-privilege RBAC, the two failure policies and what each webhook may see, and the
//! webhook's own hardened Pod.

use std::fs;
use std::path::Path;

use pdp_injector::offline::parse_stream;
use serde_json::{Value, json};

fn docs(path: &str) -> Vec<Value> {
    let full = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    parse_stream(&fs::read_to_string(&full).unwrap()).unwrap()
}

/// apiGroups, resources, resourceNames, verbs.
type Rule = (Vec<String>, Vec<String>, Vec<String>, Vec<String>);

fn rules(doc: &Value) -> Vec<Rule> {
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .map(|s| s.as_str().unwrap().to_string())
            .collect()
    };
    doc["rules"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            (
                strings(&r["apiGroups"]),
                strings(&r["resources"]),
                strings(&r["resourceNames"]),
                strings(&r["verbs"]),
            )
        })
        .collect()
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn rbac_is_least_privilege() {
    // Always: read namespaces (labels), nothing else, cluster-wide.
    let base = docs("manifests/base/rbac.yaml");
    let role = base.iter().find(|d| d["kind"] == "ClusterRole").unwrap();
    assert_eq!(
        rules(role),
        vec![(
            s(&[""]),
            s(&["namespaces"]),
            vec![],
            s(&["get", "list", "watch"])
        )]
    );
    // Self-managed certificates: one named webhook configuration; Secrets only in pdp-system, and only the one
    // Secret beyond `create` (which cannot be limited by name).
    let selfm = docs("manifests/base/rbac-self-managed-certs.yaml");
    let cluster = selfm.iter().find(|d| d["kind"] == "ClusterRole").unwrap();
    assert_eq!(
        rules(cluster),
        vec![(
            s(&["admissionregistration.k8s.io"]),
            s(&["mutatingwebhookconfigurations"]),
            s(&["pdp-injector"]),
            s(&["get", "patch", "update"])
        )]
    );
    let ns_role = selfm.iter().find(|d| d["kind"] == "Role").unwrap();
    assert_eq!(ns_role["metadata"]["namespace"], "pdp-system");
    assert_eq!(
        rules(ns_role),
        vec![
            (s(&[""]), s(&["secrets"]), vec![], s(&["create"])),
            (
                s(&[""]),
                s(&["secrets"]),
                s(&["pdp-injector-tls"]),
                s(&["get", "list", "watch", "update", "patch"])
            ),
        ]
    );
    // No wildcard anywhere, and every binding is to the webhook's own ServiceAccount.
    for doc in base.iter().chain(&selfm) {
        let text = doc.to_string();
        assert!(!text.contains("\"*\""), "wildcard in {text}");
        if doc["kind"].as_str().unwrap().ends_with("Binding") {
            assert_eq!(
                doc["subjects"],
                json!([{"kind": "ServiceAccount", "name": "pdp-injector", "namespace": "pdp-system"}])
            );
        }
    }
}

#[test]
fn webhook_registration_fails_closed_only_where_asked() {
    let doc = docs("manifests/base/mutatingwebhookconfiguration.yaml").remove(0);
    let hooks = doc["webhooks"].as_array().unwrap();
    assert_eq!(hooks.len(), 2);
    for h in hooks {
        let name = h["name"].as_str().unwrap();
        assert_eq!(h["admissionReviewVersions"], json!(["v1"]), "{name}");
        assert_eq!(h["sideEffects"], "None", "{name}");
        assert_eq!(h["reinvocationPolicy"], "IfNeeded", "{name}");
        let timeout = h["timeoutSeconds"].as_i64().unwrap();
        assert!(
            (1..=10).contains(&timeout),
            "{name}: timeoutSeconds {timeout}"
        );
        assert_eq!(
            h["rules"],
            json!([{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                                       "resources": ["pods"], "scope": "Namespaced"}]),
            "{name}"
        );
        // The webhook never gates its own namespace or the control plane's.
        let excluded = h["namespaceSelector"]["matchExpressions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["key"] == "kubernetes.io/metadata.name")
            .unwrap_or_else(|| panic!("{name}: no namespace exclusion"));
        assert_eq!(excluded["operator"], "NotIn");
        for ns in [
            "pdp-system",
            "kube-system",
            "kube-public",
            "kube-node-lease",
        ] {
            assert!(
                excluded["values"].as_array().unwrap().contains(&json!(ns)),
                "{name}: {ns}"
            );
        }
    }
    // Fail only for namespaces that asked for a PDP; Ignore for annotation-only opt-in elsewhere.
    let by_policy = |p: &str| hooks.iter().find(|h| h["failurePolicy"] == p).unwrap();
    let opted = by_policy("Fail")["namespaceSelector"]["matchExpressions"][0].clone();
    assert_eq!(
        opted,
        json!({"key": "pdp-injector.io/injection", "operator": "In",
                             "values": ["enabled", "sidecar", "daemonset"]})
    );
    let rest = by_policy("Ignore")["namespaceSelector"]["matchExpressions"][0].clone();
    assert_eq!(
        rest,
        json!({"key": "pdp-injector.io/injection", "operator": "NotIn",
                           "values": ["enabled", "sidecar", "daemonset"]})
    );
    // Each entry has its own path, so the handler knows when the apiserver saw the namespace opted in and never
    // answers "not opted in" from doubt there (src/server.rs, Entry).
    assert_eq!(
        by_policy("Fail")["clientConfig"]["service"]["path"],
        pdp_injector::server::OPTED_IN_PATH
    );
    assert_eq!(
        by_policy("Ignore")["clientConfig"]["service"]["path"],
        "/mutate"
    );
    // The Ignore entry sees every Pod CREATE of the cluster: a hung replica must cost them at most 2 s.
    assert!(by_policy("Ignore")["timeoutSeconds"].as_i64().unwrap() <= 2);
}

#[test]
fn the_webhook_pod_is_restricted() {
    let doc = docs("manifests/base/deployment.yaml").remove(0);
    let pod = &doc["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    assert!(pod.get("hostNetwork").is_none() && pod.get("hostPID").is_none());
    for c in pod["containers"].as_array().unwrap() {
        let sc = &c["securityContext"];
        assert_eq!(sc["allowPrivilegeEscalation"], false);
        assert_eq!(sc["readOnlyRootFilesystem"], true);
        assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
        assert!(sc.get("privileged").is_none_or(|p| p == false));
        assert!(
            c["resources"]["limits"]["memory"].is_string(),
            "memory limit"
        );
    }
    for v in pod["volumes"].as_array().unwrap() {
        assert!(v.get("hostPath").is_none(), "{v}");
    }
    let ns = docs("manifests/base/namespace.yaml").remove(0);
    assert_eq!(
        ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
        "restricted"
    );
}

/// Cerbos reports usage to its vendor unless told not to. Every Cerbos the project ships must start with it off:
/// the built-in and shipped profiles' sidecars (rendered through the real core) and every Cerbos container in
/// the manifests, whose config file must say `telemetry.disabled: true` or whose environment must carry
/// `CERBOS_NO_TELEMETRY=1`.
#[test]
fn shipped_pdps_do_not_phone_home() {
    use k8s_openapi::api::core::v1::{Container, Pod};
    use pdp_injector::config::{Config, Mode};
    use pdp_injector::decision::NamespaceInfo;
    use pdp_injector::inject::{Outcome, inject};

    let no_telemetry_env = |c: &Container| {
        c.env.iter().flatten().any(|e| {
            e.name == "CERBOS_NO_TELEMETRY"
                && matches!(e.value.as_deref(), Some("1" | "true" | "TRUE" | "True"))
        })
    };
    let no_telemetry_arg = |c: &Container| {
        c.args
            .iter()
            .flatten()
            .any(|a| a == "--set=telemetry.disabled=true")
    };

    // Sidecars: the built-in config and every config file the manifests ship.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut configs = vec![("built-in".to_string(), Config::builtin())];
    for file in [
        "manifests/base/config.yaml",
        "manifests/overlays/sidecar-only/config.yaml",
    ] {
        configs.push((file.to_string(), Config::load(&root.join(file)).unwrap()));
    }
    let mut checked = 0;
    for (source, config) in &configs {
        for (name, profile) in &config.profiles {
            if !profile.image.contains("cerbos") {
                continue;
            }
            let pod: Pod = serde_json::from_value(json!({
                "metadata": {"name": "app", "annotations": {
                    "pdp-injector.io/inject": "sidecar", "pdp-injector.io/profile": name}},
                "spec": {"containers": [{"name": "app", "image": "app"}]}
            }))
            .unwrap();
            let Outcome::Injected(done) = inject(&pod, &NamespaceInfo::named("apps"), config)
            else {
                panic!("{source}: profile {name} was not injected");
            };
            assert_eq!(done.mode, Mode::Sidecar);
            let spec = done.pod.spec.as_ref().unwrap();
            let pdp = spec
                .init_containers
                .iter()
                .flatten()
                .chain(&spec.containers)
                .find(|c| c.name == profile.container_name)
                .unwrap();
            assert!(
                no_telemetry_env(pdp) || no_telemetry_arg(pdp),
                "{source}: profile {name}'s sidecar starts Cerbos with telemetry on: {pdp:?}"
            );
            checked += 1;
        }
    }
    assert!(checked >= 3, "only {checked} Cerbos profiles checked");

    // Containers in the manifests: any image with cerbos in its name, in every YAML file under manifests/.
    let mut files = Vec::new();
    let mut dirs = vec![root.join("manifests")];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "yaml") {
                files.push(path);
            }
        }
    }
    let all: Vec<Value> = files
        .iter()
        .flat_map(|f| parse_stream(&fs::read_to_string(f).unwrap()).unwrap())
        .collect();
    let mut containers = 0;
    for doc in &all {
        let Some(spec) = doc.pointer("/spec/template/spec") else {
            continue;
        };
        for c in ["containers", "initContainers"]
            .iter()
            .filter_map(|k| spec[k].as_array())
            .flatten()
        {
            if !c["image"].as_str().unwrap_or("").contains("cerbos") {
                continue;
            }
            containers += 1;
            let container: Container = serde_json::from_value(c.clone()).unwrap();
            if no_telemetry_env(&container) || no_telemetry_arg(&container) {
                continue;
            }
            // Otherwise its --config file must turn telemetry off: find the ConfigMap behind the mount.
            let config_path = container
                .args
                .iter()
                .flatten()
                .find_map(|a| a.strip_prefix("--config="))
                .unwrap_or_else(|| {
                    panic!(
                        "{}: Cerbos with neither --config nor telemetry off",
                        c["name"]
                    )
                });
            let mount = container
                .volume_mounts
                .iter()
                .flatten()
                .find(|m| config_path.starts_with(&format!("{}/", m.mount_path)))
                .expect("the config file comes from a mounted volume");
            let volume = spec["volumes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|v| v["name"] == mount.name.as_str())
                .unwrap();
            let cm_name = volume["configMap"]["name"].as_str().unwrap();
            let file_name = &config_path[mount.mount_path.len() + 1..];
            // The ConfigMap is generated by kustomize from a file: find the generator that names it.
            let kustomization = root.join("manifests/components/pdp-daemonset/kustomization.yaml");
            let k = &parse_stream(&fs::read_to_string(&kustomization).unwrap()).unwrap()[0];
            let generator = k["configMapGenerator"]
                .as_array()
                .unwrap()
                .iter()
                .find(|g| g["name"] == cm_name)
                .unwrap_or_else(|| panic!("no generator for ConfigMap {cm_name}"));
            let source = generator["files"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(Value::as_str)
                .find_map(|f| f.strip_prefix(&format!("{file_name}=")))
                .unwrap();
            let text = fs::read_to_string(kustomization.parent().unwrap().join(source)).unwrap();
            let cerbos_config = &parse_stream(&text).unwrap()[0];
            assert_eq!(
                cerbos_config.pointer("/telemetry/disabled"),
                Some(&json!(true)),
                "{source}: the node-local Cerbos must start with telemetry.disabled: true"
            );
        }
    }
    assert!(containers >= 1, "no Cerbos container found in manifests/");
}
