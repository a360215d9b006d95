//! The security-relevant settings of the install manifests, pinned so that a change to them is a deliberate one
//! (SECURITY.md): least-privilege RBAC, the two failure policies and what each webhook may see, and the
//! webhook's own hardened Pod.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

use pdp_core::offline::parse_stream;
use serde_json::{Value, json};

fn docs(path: &str) -> Vec<Value> {
    let full = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    parse_stream(&fs::read_to_string(&full).unwrap()).unwrap()
}

/// apiGroups, resources, resourceNames, verbs.
type Rule = (Vec<String>, Vec<String>, Vec<String>, Vec<String>);

/// A list of strings (absent: empty).
fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

fn rules(doc: &Value) -> Vec<Rule> {
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
    // Always: read namespaces (labels) cluster-wide, and get the one CSIDriver of the node plugin; nothing else.
    let base = docs("manifests/overlays/daemonset/webhook/rbac.yaml");
    let role = base.iter().find(|d| d["kind"] == "ClusterRole").unwrap();
    assert_eq!(
        rules(role),
        vec![
            (
                s(&[""]),
                s(&["namespaces"]),
                vec![],
                s(&["get", "list", "watch"])
            ),
            (
                s(&["storage.k8s.io"]),
                s(&["csidrivers"]),
                s(&["csi.pdp-injector.io"]),
                s(&["get"])
            )
        ]
    );
    // Self-managed certificates: one named webhook configuration; Secrets only in pdp-system, and only the one
    // Secret beyond `create` (which cannot be limited by name).
    let selfm = docs("manifests/overlays/daemonset/webhook/rbac-self-managed-certs.yaml");
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
fn check_role_reads_only() {
    // `pdp-injector check` needs list/get and nothing else; no binding is shipped (users bind it), the webhook's
    // ConfigMap is readable only by name, in pdp-system, and no Secret at all (the TLS Secret holds the CA key).
    let check = docs("manifests/overlays/daemonset/webhook/rbac-check.yaml");
    assert_eq!(check.len(), 2);
    for doc in &check {
        assert!(!doc["kind"].as_str().unwrap().ends_with("Binding"), "{doc}");
        assert!(!doc.to_string().contains("\"*\""), "wildcard in {doc}");
        for rule in doc["rules"].as_array().unwrap() {
            for verb in rule["verbs"].as_array().unwrap() {
                assert!(verb == "get" || verb == "list", "{verb} in {rule}");
            }
            let resources = rule["resources"].to_string();
            assert!(!resources.contains("secrets"), "{rule}");
            if resources.contains("configmaps") {
                assert_eq!(doc["kind"], "Role", "{rule}");
                assert_eq!(doc["metadata"]["namespace"], "pdp-system");
                assert!(rule["resourceNames"].is_array(), "{rule}");
            }
        }
    }
    let kustomization = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("manifests/overlays/daemonset/kustomization.yaml"),
    )
    .unwrap();
    assert!(kustomization.contains("- webhook/rbac-check.yaml"));
}

#[test]
fn webhook_registration_fails_closed_only_where_asked() {
    let doc =
        docs("manifests/overlays/daemonset/webhook/mutatingwebhookconfiguration.yaml").remove(0);
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
                             "values": ["enabled", "sidecar", "daemonset", "central"]})
    );
    let rest = by_policy("Ignore")["namespaceSelector"]["matchExpressions"][0].clone();
    assert_eq!(
        rest,
        json!({"key": "pdp-injector.io/injection", "operator": "NotIn",
                           "values": ["enabled", "sidecar", "daemonset", "central"]})
    );
    // Each entry has its own path, so the handler knows when the apiserver saw the namespace opted in and never
    // answers "not opted in" from doubt there (crates/pdp-webhook/src/review.rs, Entry).
    assert_eq!(
        by_policy("Fail")["clientConfig"]["service"]["path"],
        pdp_webhook::server::OPTED_IN_PATH
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
    let doc = docs("manifests/overlays/daemonset/webhook/deployment.yaml").remove(0);
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
    let ns = docs("manifests/overlays/daemonset/webhook/namespace.yaml").remove(0);
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
    use pdp_core::config::{Config, Mode};
    use pdp_core::core::NamespaceInfo;
    use pdp_core::core::{Outcome, inject, patched};

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
        "manifests/overlays/daemonset/config.yaml",
        "manifests/overlays/sidecar-only/config.yaml",
        "manifests/overlays/central/config.yaml",
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
            let stored = patched(&pod, &done.patch).unwrap();
            let spec = stored.spec.as_ref().unwrap();
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
            // The ConfigMap beside it in the same overlay (the same namespace).
            let namespace = &doc["metadata"]["namespace"];
            let cm = all
                .iter()
                .find(|d| {
                    d["kind"] == "ConfigMap"
                        && d["metadata"]["name"] == cm_name
                        && &d["metadata"]["namespace"] == namespace
                })
                .unwrap_or_else(|| panic!("no ConfigMap {cm_name} in {namespace}"));
            let source = format!("ConfigMap {namespace}/{cm_name}");
            let text = cm["data"][file_name].as_str().unwrap();
            let cerbos_config = &parse_stream(text).unwrap()[0];
            assert_eq!(
                cerbos_config.pointer("/telemetry/disabled"),
                Some(&json!(true)),
                "{source}: the node-local Cerbos must start with telemetry.disabled: true"
            );
        }
    }
    assert!(containers >= 1, "no Cerbos container found in manifests/");
}

// ---------------------------------------------------------------------------------------------------------------
// What `kubectl apply -k` sends: the rendered overlays.

/// Whether kubectl is here to render the overlays. Plain `cargo test` needs no kubectl: without it these tests
/// say so and return, except under `CI=true`, where .ci/run installs it and a missing one fails.
fn can_render() -> bool {
    let here = std::process::Command::new("kubectl")
        .args(["version", "--client"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !here {
        pdp_testkit::skip::cannot_run(
            "kubectl is needed to render the manifests (kubectl kustomize)",
        );
    }
    here
}

/// The documents `kubectl kustomize manifests/overlays/<overlay>` renders (as scripts/validate-manifests.sh).
fn rendered(overlay: &str) -> Vec<Value> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("manifests/overlays")
        .join(overlay);
    let out = std::process::Command::new("kubectl")
        .arg("kustomize")
        .arg(&dir)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "kubectl kustomize {}: {e} (kubectl is needed to render the manifests)",
                dir.display()
            )
        });
    assert!(
        out.status.success(),
        "kubectl kustomize {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    parse_stream(&String::from_utf8(out.stdout).unwrap()).unwrap()
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
}

/// Every overlay that installs the webhook (all but the Kubernetes 1.20 one, which has no such API).
const WEBHOOK_OVERLAYS: [&str; 6] = [
    "daemonset",
    "central",
    "sidecar-only",
    "cert-manager",
    "label-selected",
    "network-policy",
];

#[test]
fn the_webhook_runs_at_its_own_priority_class() {
    if !can_render() {
        return;
    }
    for overlay in WEBHOOK_OVERLAYS {
        let docs = rendered(overlay);
        let deployment = find(&docs, "Deployment", "pdp-injector").unwrap();
        let class = deployment["spec"]["template"]["spec"]["priorityClassName"]
            .as_str()
            .unwrap_or_else(|| panic!("{overlay}: the webhook has no priorityClassName"));
        assert_eq!(class, "pdp-injector-webhook", "{overlay}");
        let pc = find(&docs, "PriorityClass", class)
            .unwrap_or_else(|| panic!("{overlay}: PriorityClass {class} is not installed"));
        assert!(
            pc["metadata"].get("namespace").is_none(),
            "{overlay}: cluster-scoped"
        );
        let value = pc["value"].as_i64().unwrap();
        // Above ordinary workloads, at most what a user-defined class may be, below the system classes.
        assert!(
            (100_000_000..=1_000_000_000).contains(&value) && value < 2_000_000_000,
            "{overlay}: value {value}"
        );
        assert_eq!(pc["globalDefault"], false, "{overlay}");
        assert_eq!(pc["preemptionPolicy"], "PreemptLowerPriority", "{overlay}");
    }
}

#[test]
fn webhook_replicas_are_spread_over_nodes() {
    if !can_render() {
        return;
    }
    for overlay in WEBHOOK_OVERLAYS {
        let docs = rendered(overlay);
        let deployment = find(&docs, "Deployment", "pdp-injector").unwrap();
        assert_eq!(deployment["spec"]["replicas"], 2, "{overlay}");
        let pod = &deployment["spec"]["template"];
        let by_host: Vec<&Value> = pod["spec"]["topologySpreadConstraints"]
            .as_array()
            .unwrap_or_else(|| panic!("{overlay}: no topologySpreadConstraints"))
            .iter()
            .filter(|c| c["topologyKey"] == "kubernetes.io/hostname")
            .collect();
        assert_eq!(
            by_host.len(),
            1,
            "{overlay}: one spread constraint per node"
        );
        let c = by_host[0];
        // Never two replicas on one node while another schedulable node exists...
        assert_eq!(c["maxSkew"], 1, "{overlay}");
        assert_eq!(c["whenUnsatisfiable"], "DoNotSchedule", "{overlay}");
        assert_eq!(
            c["nodeTaintsPolicy"], "Honor",
            "{overlay}: tainted nodes are no domains"
        );
        // ...yet both start on a one-node cluster: no minDomains above 1, no required anti-affinity.
        assert!(
            c.get("minDomains").is_none_or(|m| m.as_i64() <= Some(1)),
            "{overlay}"
        );
        assert!(
            pod["spec"]
                .pointer("/affinity/podAntiAffinity/requiredDuringSchedulingIgnoredDuringExecution")
                .is_none(),
            "{overlay}"
        );
        // The constraint counts the webhook's own Pods.
        let labels = pod["metadata"]["labels"].as_object().unwrap();
        for (k, v) in c["labelSelector"]["matchLabels"].as_object().unwrap() {
            assert_eq!(labels.get(k), Some(v), "{overlay}: selector {k}");
        }
    }
}

/// Every field of an admissionregistration.k8s.io/v1 MutatingWebhook, and of its clientConfig.
const WEBHOOK_FIELDS: [&str; 12] = [
    "admissionReviewVersions",
    "clientConfig",
    "failurePolicy",
    "matchConditions",
    "matchPolicy",
    "name",
    "namespaceSelector",
    "objectSelector",
    "reinvocationPolicy",
    "rules",
    "sideEffects",
    "timeoutSeconds",
];
const CLIENT_CONFIG_FIELDS: [&str; 3] = ["caBundle", "service", "url"];

#[test]
fn only_the_ca_bundle_is_left_to_the_webhooks_own_account() {
    if !can_render() {
        return;
    }
    use k8s_openapi::ByteString;
    use k8s_openapi::api::admissionregistration::v1::{MutatingWebhook, WebhookClientConfig};
    // The lists above are the whole type: this literal names every field (no `..Default::default()`), so a
    // k8s-openapi with a new field does not compile until the lists and the guard know it.
    let every_field = MutatingWebhook {
        admission_review_versions: vec!["v1".into()],
        client_config: WebhookClientConfig {
            ca_bundle: Some(ByteString(b"x".to_vec())),
            service: Some(Default::default()),
            url: Some("https://x".into()),
        },
        failure_policy: Some("Fail".into()),
        match_conditions: Some(vec![]),
        match_policy: Some("Equivalent".into()),
        name: "x".into(),
        namespace_selector: Some(Default::default()),
        object_selector: Some(Default::default()),
        reinvocation_policy: Some("Never".into()),
        rules: Some(vec![]),
        side_effects: "None".into(),
        timeout_seconds: Some(5),
    };
    let v = serde_json::to_value(&every_field).unwrap();
    let keys: BTreeSet<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(keys, BTreeSet::from(WEBHOOK_FIELDS));
    let keys: BTreeSet<&str> = v["clientConfig"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(keys, BTreeSet::from(CLIENT_CONFIG_FIELDS));

    for overlay in WEBHOOK_OVERLAYS {
        let docs = rendered(overlay);
        let policy = find(
            &docs,
            "ValidatingAdmissionPolicy",
            "pdp-injector-webhook-config-guard",
        )
        .unwrap_or_else(|| panic!("{overlay}: no guard on the webhook's registration"));
        assert!(
            policy["metadata"].get("namespace").is_none(),
            "{overlay}: cluster-scoped"
        );
        let spec = &policy["spec"];
        assert_eq!(spec["failurePolicy"], "Fail", "{overlay}");
        // Exactly UPDATE of the one MutatingWebhookConfiguration the manifests install.
        let mwc = docs
            .iter()
            .find(|d| d["kind"] == "MutatingWebhookConfiguration")
            .unwrap();
        assert_eq!(
            spec["matchConstraints"]["resourceRules"],
            json!([{"apiGroups": ["admissionregistration.k8s.io"], "apiVersions": ["v1"],
                    "operations": ["UPDATE"], "resources": ["mutatingwebhookconfigurations"],
                    "resourceNames": [mwc["metadata"]["name"]]}]),
            "{overlay}"
        );
        // Only for the user the webhook's ServiceAccount authenticates as: the one its RBAC binds.
        let sa = find(&docs, "Deployment", "pdp-injector").unwrap()["spec"]["template"]["spec"]
            ["serviceAccountName"]
            .as_str()
            .unwrap();
        let user = format!("system:serviceaccount:pdp-system:{sa}");
        assert_eq!(
            spec["matchConditions"],
            json!([{"name": "webhook-service-account",
                    "expression": format!("request.userInfo.username == \"{user}\"")}]),
            "{overlay}"
        );
        // Every field of every webhook but caBundle is compared with the old object's, as are the metadata.
        let validations: Vec<&str> = spec["validations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["expression"].as_str().unwrap())
            .collect();
        let all = validations.join("\n");
        for field in WEBHOOK_FIELDS {
            if field == "name" || field == "clientConfig" {
                continue;
            }
            assert!(
                all.contains(&format!("w.?{field} == o.?{field}")),
                "{overlay}: {field} unguarded"
            );
        }
        for field in CLIENT_CONFIG_FIELDS {
            let guarded = all.contains(&format!(
                "w.clientConfig.?{field} == o.clientConfig.?{field}"
            ));
            assert_eq!(
                guarded,
                field != "caBundle",
                "{overlay}: clientConfig.{field}"
            );
        }
        assert!(
            !all.contains("caBundle"),
            "{overlay}: caBundle must be left free"
        );
        assert!(
            validations.contains(
                &"variables.newHooks.map(w, w.name) == variables.oldHooks.map(w, w.name)"
            ),
            "{overlay}: webhooks added, removed, renamed or reordered"
        );
        for meta in ["labels", "annotations", "ownerReferences", "finalizers"] {
            assert!(
                all.contains(&format!(
                    "object.metadata.?{meta} == oldObject.metadata.?{meta}"
                )),
                "{overlay}: metadata.{meta} unguarded"
            );
        }
        // The rendered webhooks use no field that the guard does not know.
        for hook in mwc["webhooks"].as_array().unwrap() {
            for key in hook.as_object().unwrap().keys() {
                assert!(WEBHOOK_FIELDS.contains(&key.as_str()), "{overlay}: {key}");
            }
        }
        // Bound, denying, with no narrower match than the policy's.
        let binding = docs
            .iter()
            .find(|d| {
                d["kind"] == "ValidatingAdmissionPolicyBinding"
                    && d["spec"]["policyName"] == policy["metadata"]["name"]
            })
            .unwrap_or_else(|| panic!("{overlay}: the guard is not bound"));
        assert_eq!(
            binding["spec"]["validationActions"],
            json!(["Deny"]),
            "{overlay}"
        );
        assert!(binding["spec"].get("matchResources").is_none(), "{overlay}");
        assert!(binding["metadata"].get("namespace").is_none(), "{overlay}");
    }
}

#[test]
fn network_policy_component_admits_only_what_must_reach_the_webhook_and_the_pdp() {
    if !can_render() {
        return;
    }
    let ports = |rules: &Value| -> BTreeSet<(String, i64)> {
        rules
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|r| r["ports"].as_array().unwrap())
            .map(|p| {
                (
                    p["protocol"].as_str().unwrap().to_string(),
                    p["port"].as_i64().unwrap(),
                )
            })
            .collect()
    };
    let tcp = |p: i64| ("TCP".to_string(), p);
    // Optional: the default install has none; overlays/network-policy is the default install with the component.
    assert!(
        !rendered("daemonset")
            .iter()
            .any(|d| d["kind"] == "NetworkPolicy")
    );
    let docs = rendered("network-policy");
    // The webhook's, the front's, and the PDP's (no ingress at all).
    assert_eq!(
        docs.iter().filter(|d| d["kind"] == "NetworkPolicy").count(),
        3
    );

    let webhook = find(&docs, "NetworkPolicy", "pdp-injector").unwrap();
    assert_eq!(webhook["metadata"]["namespace"], "pdp-system");
    let deployment = find(&docs, "Deployment", "pdp-injector").unwrap();
    let pod_labels = &deployment["spec"]["template"]["metadata"]["labels"];
    for (k, v) in webhook["spec"]["podSelector"]["matchLabels"]
        .as_object()
        .unwrap()
    {
        assert_eq!(&pod_labels[k], v, "the policy selects the webhook Pods");
    }
    assert_eq!(webhook["spec"]["policyTypes"], json!(["Ingress", "Egress"]));
    // Ingress: 8443/TCP from anywhere (the apiserver's address is not selectable portably), nothing else.
    let ingress = &webhook["spec"]["ingress"];
    assert_eq!(ingress.as_array().unwrap().len(), 1);
    assert!(ingress[0].get("from").is_none());
    assert_eq!(ports(ingress), BTreeSet::from([tcp(8443)]));
    let container_port =
        deployment["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
            .as_i64()
            .unwrap();
    assert_eq!(container_port, 8443);
    // Egress: the apiserver (443 before, 6443 after the Service's translation) and DNS.
    assert_eq!(
        ports(&webhook["spec"]["egress"]),
        BTreeSet::from([tcp(443), tcp(6443), ("UDP".into(), 53), tcp(53)])
    );

    // The front takes ingress on the port it publishes, and only there; the PDP Pods listen on no TCP port, so
    // their policy admits nothing.
    let selects = |policy: &Value, daemonset: &Value| {
        let labels = &daemonset["spec"]["template"]["metadata"]["labels"];
        for (k, v) in policy["spec"]["podSelector"]["matchLabels"]
            .as_object()
            .unwrap()
        {
            assert_eq!(&labels[k], v, "the policy selects the DaemonSet's Pods");
        }
        assert!(
            policy["spec"]["policyTypes"]
                .as_array()
                .unwrap()
                .contains(&json!("Ingress"))
        );
    };
    let host_ports = |daemonset: &Value| -> Vec<i64> {
        daemonset["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|c| c["ports"].as_array().into_iter().flatten())
            .filter_map(|p| p["hostPort"].as_i64())
            .collect()
    };
    let front_policy = find(&docs, "NetworkPolicy", "pdp-node-front").unwrap();
    let front = find(&docs, "DaemonSet", "pdp-node-front").unwrap();
    assert_eq!(front_policy["metadata"]["namespace"], "pdp-node");
    selects(front_policy, front);
    assert_eq!(
        ports(&front_policy["spec"]["ingress"]),
        BTreeSet::from([tcp(3593), tcp(3592)])
    );
    assert_eq!(host_ports(front), vec![3593, 3592]);

    let pdp_policy = find(&docs, "NetworkPolicy", "cerbos-pdp").unwrap();
    let pdp = find(&docs, "DaemonSet", "cerbos-pdp").unwrap();
    selects(pdp_policy, pdp);
    assert!(
        pdp_policy["spec"].get("ingress").is_none(),
        "no ingress to the PDP Pods"
    );
    let pdp_ports = pdp["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| c["ports"].as_array().into_iter().flatten())
        .count();
    assert_eq!(pdp_ports, 0, "the PDP listens on its sockets only");
}

#[test]
fn node_local_flagd_profiles_match_the_flagd_front_and_daemonset() {
    // The shipped flagd profiles point apps at the endpoints the flagd-node front owns (its hostPorts, and for
    // the built-in profile its evaluation socket), that front forwards each to the instance sockets flagd
    // serves, and flagd itself owns no node port, so its DaemonSet can surge.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config =
        pdp_core::config::Config::load(&root.join("manifests/overlays/daemonset/config.yaml"))
            .unwrap();
    let ds = docs("manifests/overlays/flagd-node/flagd-node/daemonset.yaml")
        .into_iter()
        .find(|d| d["kind"] == "DaemonSet")
        .unwrap();
    assert_eq!(
        ds["spec"]["updateStrategy"]["rollingUpdate"],
        json!({"maxUnavailable": 0, "maxSurge": 1})
    );
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(
        pod["automountServiceAccountToken"], true,
        "the Kubernetes sync needs the token"
    );
    let flagd = &pod["containers"][0];
    assert!(
        flagd["ports"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p.get("hostPort").is_none()),
        "flagd publishes nothing on the node"
    );
    let args = strings(&flagd["args"]);
    assert!(
        args.contains(&"--uri=core.openfeature.dev/flagd-node/flagd-node-flags".to_string()),
        "{args:?}"
    );
    let instance_socket = |flag: &str| {
        let value = args
            .iter()
            .find_map(|a| a.strip_prefix(flag))
            .unwrap_or_else(|| panic!("flagd has no {flag}: {args:?}"));
        // One socket pair per Pod: named after the Pod, in the instances directory the front reads.
        let suffix = value
            .strip_prefix("/var/run/flagd-instances/$(POD_NAME)")
            .unwrap_or_else(|| panic!("{flag}{value}"));
        suffix.to_string()
    };
    let eval_suffix = instance_socket("--socket-path=");
    let sync_suffix = instance_socket("--sync-socket-path=");
    // Every start of the flagd container first clears exactly those two sockets when stale (flagd will not bind
    // over a file), with the helper the init container installed into the Pod's emptyDir.
    let instance = |suffix: &str| format!("/var/run/flagd-instances/$(POD_NAME){suffix}");
    assert_eq!(
        strings(&flagd["command"]),
        vec![
            "/var/run/pdp-injector/tools/pdp-await".to_string(),
            "exec".into(),
            format!("--unlink-stale={}", instance(&eval_suffix)),
            format!("--unlink-stale={}", instance(&sync_suffix)),
            "--".into(),
            "/flagd-build".into(),
        ]
    );
    assert_eq!(
        strings(&pod["initContainers"][1]["command"]),
        vec![
            "/usr/local/bin/pdp-await",
            "install",
            "/var/run/pdp-injector/tools"
        ]
    );
    // The front: one process, one listener pair per flagd endpoint (its own flags, then a --group), each to the
    // instance sockets of its kind, read with the front's own parser.
    let front = docs("manifests/overlays/flagd-node/flagd-node/front.yaml")
        .into_iter()
        .find(|d| d["kind"] == "DaemonSet")
        .unwrap();
    let containers = front["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap();
    assert_eq!(containers.len(), 1, "one front process");
    let host_ports: BTreeSet<u64> = containers[0]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["hostPort"].as_u64())
        .collect();
    assert_eq!(host_ports, BTreeSet::from([8013, 8015]));
    let args = strings(&containers[0]["args"]);
    let flag = |name: &str| {
        args.iter()
            .find_map(|a| a.strip_prefix(name))
            .unwrap_or_else(|| panic!("{name} in {args:?}"))
            .to_string()
    };
    // Each pair listens on the default address of its port, [::]:PORT, which falls back to IPv4 on a node
    // without IPv6 (an address given with --listen or listen= would be bound as written).
    assert!(!args.iter().any(|a| a.starts_with("--listen")), "{args:?}");
    let mut pairs = vec![(
        flag("--port=").parse::<u16>().unwrap(),
        flag("--socket="),
        flag("--instances="),
        flag("--tcp-backend="),
        flag("--socket-backend="),
    )];
    for group in args.iter().filter_map(|a| a.strip_prefix("--group=")) {
        let g = pdp_node::groups::group_flag(group).unwrap();
        assert!(g.listen.is_empty(), "{group}");
        pairs.push((
            g.port.unwrap(),
            g.socket.unwrap().display().to_string(),
            g.instances.display().to_string(),
            g.tcp_backend.unwrap(),
            g.socket_backend.unwrap(),
        ));
    }
    let mut endpoints = BTreeMap::new();
    for (port, socket, instances, tcp_backend, socket_backend) in pairs {
        assert_eq!(instances, "/var/run/flagd-instances");
        assert_eq!(
            tcp_backend, socket_backend,
            "one flagd listener per endpoint"
        );
        let port = u64::from(port);
        assert!(host_ports.contains(&port), "{port}");
        endpoints.insert(port, (socket, tcp_backend));
    }
    assert_eq!(
        endpoints,
        BTreeMap::from([
            (8013, ("/var/run/flagd/flagd.sock".to_string(), eval_suffix)),
            (8015, ("/var/run/flagd/sync.sock".to_string(), sync_suffix)),
        ])
    );
    // The built-in flagd profile's node socket is the front's evaluation socket.
    let builtin = &config.profiles["flagd"];
    assert!(builtin.host_socket);
    assert_eq!(
        format!("{}/{}", builtin.socket.dir, builtin.socket.file),
        endpoints[&u64::from(builtin.address_port)].0
    );
    // The in-process profile with a socket: the front's sync socket.
    let sock = &config.profiles["flagd-in-process-socket"];
    assert!(sock.host_socket);
    assert_eq!(
        format!("{}/{}", sock.socket.dir, sock.socket.file),
        endpoints[&u64::from(sock.address_port)].0
    );
    // The node-local profiles: the front's ports, TCP only, so each can share a Pod with the cerbos profile.
    for (name, resolver) in [("flagd-node", "rpc"), ("flagd-in-process", "in-process")] {
        let p = &config.profiles[name];
        assert!(
            endpoints.contains_key(&u64::from(p.address_port)),
            "{name}: port {} is not the front's",
            p.address_port
        );
        assert!(!p.host_socket, "{name} mounts no node socket");
        let resolver_var = p
            .app_env
            .iter()
            .find(|e| e.name == "FLAGD_RESOLVER")
            .unwrap();
        assert_eq!(resolver_var.value.as_deref(), Some(resolver), "{name}");
    }
    // The sync sidecar's only source is the node's sync port, reached at the node's IP.
    let sync = &config.profiles["flagd-sync"];
    assert!(sync.volumes.is_empty());
    assert!(
        sync.args
            .contains(&"--uri=grpc://$(FLAGD_NODE_HOST):8015".to_string()),
        "{:?}",
        sync.args
    );
    let node_host = sync
        .env
        .iter()
        .find(|e| e.name == "FLAGD_NODE_HOST")
        .unwrap();
    let field = node_host
        .value_from
        .as_ref()
        .unwrap()
        .field_ref
        .as_ref()
        .unwrap();
    assert_eq!(field.field_path, "status.hostIP");
}

/// Every grant of every rendered overlay, one line each: `Kind namespace/name: group/resource[name] verb` for
/// the rules of Roles and ClusterRoles, `Kind namespace/name -> RoleKind/role: SubjectKind namespace/name` for
/// bindings.
fn grants(docs: &[Value]) -> BTreeSet<String> {
    let list = strings;
    let mut out = BTreeSet::new();
    for d in docs {
        let kind = d["kind"].as_str().unwrap_or_default();
        let at = format!(
            "{kind} {}/{}",
            d["metadata"]["namespace"].as_str().unwrap_or(""),
            d["metadata"]["name"].as_str().unwrap()
        );
        match kind {
            "Role" | "ClusterRole" => {
                assert!(d.get("aggregationRule").is_none(), "{at}: aggregated role");
                for r in d["rules"].as_array().into_iter().flatten() {
                    assert!(r.get("nonResourceURLs").is_none(), "{at}: {r}");
                    let names = list(&r["resourceNames"]);
                    let names = if names.is_empty() {
                        vec![String::new()]
                    } else {
                        names
                    };
                    for g in list(&r["apiGroups"]) {
                        for res in list(&r["resources"]) {
                            for n in &names {
                                for v in list(&r["verbs"]) {
                                    let n = if n.is_empty() {
                                        String::new()
                                    } else {
                                        format!("[{n}]")
                                    };
                                    out.insert(format!("{at}: {g}/{res}{n} {v}"));
                                }
                            }
                        }
                    }
                }
            }
            "RoleBinding" | "ClusterRoleBinding" => {
                let role = &d["roleRef"];
                for s in d["subjects"].as_array().into_iter().flatten() {
                    out.insert(format!(
                        "{at} -> {}/{}: {} {}/{}",
                        role["kind"].as_str().unwrap(),
                        role["name"].as_str().unwrap(),
                        s["kind"].as_str().unwrap(),
                        s["namespace"].as_str().unwrap_or(""),
                        s["name"].as_str().unwrap()
                    ));
                }
            }
            _ => {}
        }
    }
    out
}

/// Every RBAC grant the install can make, over all overlays. A new grant is a deliberate change of this list
/// (and of SECURITY.md's RBAC section), never a side effect of a manifest edit.
const PINNED_GRANTS: &[&str] = &[
    // The webhook: namespace labels.
    "ClusterRole /pdp-injector: /namespaces get",
    "ClusterRole /pdp-injector: /namespaces list",
    "ClusterRole /pdp-injector: /namespaces watch",
    // The webhook, at start: whether the node plugin's CSIDriver exists (socketVolume auto).
    "ClusterRole /pdp-injector: storage.k8s.io/csidrivers[csi.pdp-injector.io] get",
    "ClusterRoleBinding /pdp-injector -> ClusterRole/pdp-injector: ServiceAccount pdp-system/pdp-injector",
    // Self-managed certificates: its own registration's caBundle, its own Secret (create guarded by name).
    "ClusterRole /pdp-injector-webhook-config: admissionregistration.k8s.io/mutatingwebhookconfigurations[pdp-injector] get",
    "ClusterRole /pdp-injector-webhook-config: admissionregistration.k8s.io/mutatingwebhookconfigurations[pdp-injector] patch",
    "ClusterRole /pdp-injector-webhook-config: admissionregistration.k8s.io/mutatingwebhookconfigurations[pdp-injector] update",
    "ClusterRoleBinding /pdp-injector-webhook-config -> ClusterRole/pdp-injector-webhook-config: ServiceAccount pdp-system/pdp-injector",
    "Role pdp-system/pdp-injector: /secrets create",
    "Role pdp-system/pdp-injector: /secrets[pdp-injector-tls] get",
    "Role pdp-system/pdp-injector: /secrets[pdp-injector-tls] list",
    "Role pdp-system/pdp-injector: /secrets[pdp-injector-tls] patch",
    "Role pdp-system/pdp-injector: /secrets[pdp-injector-tls] update",
    "Role pdp-system/pdp-injector: /secrets[pdp-injector-tls] watch",
    "RoleBinding pdp-system/pdp-injector -> Role/pdp-injector: ServiceAccount pdp-system/pdp-injector",
    // `pdp-injector check`, shipped unbound: reads, no Secret.
    "ClusterRole /pdp-injector-check: /namespaces get",
    "ClusterRole /pdp-injector-check: /namespaces list",
    "ClusterRole /pdp-injector-check: /nodes get",
    "ClusterRole /pdp-injector-check: /nodes list",
    "ClusterRole /pdp-injector-check: /pods get",
    "ClusterRole /pdp-injector-check: /pods list",
    "ClusterRole /pdp-injector-check: admissionregistration.k8s.io/mutatingwebhookconfigurations[pdp-injector] get",
    "ClusterRole /pdp-injector-check: apps/controllerrevisions get",
    "ClusterRole /pdp-injector-check: apps/controllerrevisions list",
    "ClusterRole /pdp-injector-check: apps/daemonsets get",
    "ClusterRole /pdp-injector-check: apps/daemonsets list",
    "ClusterRole /pdp-injector-check: apps/deployments get",
    "ClusterRole /pdp-injector-check: apps/deployments list",
    "ClusterRole /pdp-injector-check: apps/replicasets get",
    "ClusterRole /pdp-injector-check: apps/replicasets list",
    "ClusterRole /pdp-injector-check: batch/jobs get",
    "ClusterRole /pdp-injector-check: batch/jobs list",
    "ClusterRole /pdp-injector-check: storage.k8s.io/csidrivers[csi.pdp-injector.io] get",
    "ClusterRole /pdp-injector-check: storage.k8s.io/csinodes get",
    "ClusterRole /pdp-injector-check: storage.k8s.io/csinodes list",
    "Role pdp-system/pdp-injector-check: /configmaps[pdp-injector-config] get",
    "Role pdp-system/pdp-injector-check: /pods/proxy get",
    // The node-local flagd (templates/flagd-node): its flag definitions, in its own namespace.
    "Role flagd-node/flagd-node-featureflags: core.openfeature.dev/featureflags get",
    "Role flagd-node/flagd-node-featureflags: core.openfeature.dev/featureflags list",
    "Role flagd-node/flagd-node-featureflags: core.openfeature.dev/featureflags watch",
    "RoleBinding flagd-node/flagd-node-featureflags -> Role/flagd-node-featureflags: ServiceAccount flagd-node/flagd-node",
];

#[test]
fn every_overlay_grants_only_the_pinned_rbac() {
    if !can_render() {
        return;
    }
    let overlays: Vec<String> =
        fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests/overlays"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
    assert!(overlays.len() >= 8, "{overlays:?}");
    let pinned: BTreeSet<String> = PINNED_GRANTS.iter().map(|s| s.to_string()).collect();
    let mut seen = BTreeSet::new();
    for overlay in &overlays {
        let all = grants(&rendered(overlay));
        let beyond: Vec<&String> = all.difference(&pinned).collect();
        assert!(
            beyond.is_empty(),
            "overlay {overlay} grants beyond the pinned list:\n{}",
            beyond
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join("\n")
        );
        seen.extend(all);
    }
    // A pinned grant that no overlay makes any more is a stale pin.
    let stale: Vec<&String> = pinned.difference(&seen).collect();
    assert!(
        stale.is_empty(),
        "pinned but granted by no overlay: {stale:?}"
    );
}

/// The front's connection bounds, derived from its memory budget at 75% of its container's limit, fit in the PDP
/// DaemonSet's limit: every connection the front serves is one to Cerbos (about 64 KiB each), on top of Cerbos's
/// own request (its idle size). Raising one without the others is an OOM kill waiting for a busy node.
#[test]
fn the_pdp_daemonsets_limit_holds_every_connection_the_front_may_serve() {
    use pdp_core::size::parse_size;
    use pdp_node::slots::FrontBounds;
    let container = |path: &str, name: &str| {
        docs(path)
            .into_iter()
            .find(|d| d["kind"] == "DaemonSet")
            .and_then(|d| {
                d["spec"]["template"]["spec"]["containers"]
                    .as_array()?
                    .iter()
                    .find(|c| c["name"] == name)
                    .cloned()
            })
            .unwrap_or_else(|| panic!("{path}: no container {name}"))
    };
    let size =
        |c: &Value, at: &str| parse_size(c["resources"][at]["memory"].as_str().unwrap()).unwrap();
    let front = container(
        "manifests/overlays/daemonset/cerbos-node/front.yaml",
        "front",
    );
    let cerbos = container(
        "manifests/overlays/daemonset/cerbos-node/daemonset.yaml",
        "cerbos",
    );
    let args: Vec<&str> = front["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let budget = args
        .iter()
        .find_map(|a| a.strip_prefix("--memory-budget="))
        .map_or(pdp_node::slots::DEFAULT_MEMORY_BUDGET, |b| {
            parse_size(b).unwrap()
        });
    assert!(
        budget <= size(&front, "limits") * 3 / 4,
        "the front's budget {budget} is more than 75% of its limit"
    );
    let bounds = FrontBounds::derive(budget, Some((false, None)), Some(None), 128).unwrap();
    let connections = u64::from(bounds.tcp) + u64::from(bounds.socket);
    let needed = size(&cerbos, "requests") + connections * 64 * 1024;
    assert!(
        needed <= size(&cerbos, "limits"),
        "Cerbos's limit {} does not hold its request plus {connections} connections x 64 KiB ({needed})",
        size(&cerbos, "limits")
    );
}

/// The front's server name is obtainable only in pdp-node, apps trust only that CA, and the
/// front trusts only the client CA, which the apps' ClusterIssuer signs with.
#[test]
fn the_fronts_server_name_and_the_apps_client_certificates_have_separate_cas() {
    if !can_render() {
        return;
    }
    let docs = rendered("daemonset-tls");
    let cert = |name: &str| {
        find(&docs, "Certificate", name).unwrap_or_else(|| panic!("no Certificate {name}"))
    };
    // The front's certificate: from a namespaced Issuer of pdp-node, whose CA is self-signed there.
    let front = cert("pdp-node-front-tls");
    assert_eq!(front["metadata"]["namespace"], "pdp-node");
    assert_eq!(front["spec"]["issuerRef"]["kind"], "Issuer");
    let issuer = find(
        &docs,
        "Issuer",
        front["spec"]["issuerRef"]["name"].as_str().unwrap(),
    )
    .expect("the front's Issuer is installed");
    assert_eq!(issuer["metadata"]["namespace"], "pdp-node");
    let server_ca_secret = issuer["spec"]["ca"]["secretName"].as_str().unwrap();
    let server_ca = docs
        .iter()
        .find(|d| d["kind"] == "Certificate" && d["spec"]["secretName"] == server_ca_secret)
        .expect("the server CA's Certificate");
    assert_eq!(server_ca["metadata"]["namespace"], "pdp-node");
    assert_eq!(server_ca["spec"]["isCA"], true);
    // No ClusterIssuer signs with the server CA; every server certificate comes from a namespaced Issuer.
    for d in docs.iter().filter(|d| d["kind"] == "ClusterIssuer") {
        assert_ne!(d["spec"]["ca"]["secretName"], server_ca_secret, "{d}");
    }
    for d in docs.iter().filter(|d| d["kind"] == "Certificate") {
        let usages = strings(&d["spec"]["usages"]);
        if usages.iter().any(|u| u == "server auth") {
            assert_eq!(d["spec"]["issuerRef"]["kind"], "Issuer", "{d}");
        }
    }
    // The front's client CA file: a Secret of pdp-node issued by the apps' ClusterIssuer, not the server CA.
    let ds = find(&docs, "DaemonSet", "pdp-node-front").unwrap();
    let args = strings(&ds["spec"]["template"]["spec"]["containers"][0]["args"]);
    assert!(
        args.contains(&"--tls-client-ca=/etc/pdp-node-front/client-ca/ca.crt".to_string()),
        "{args:?}"
    );
    let volumes = ds["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap();
    let client_ca = volumes
        .iter()
        .find(|v| v["name"] == "client-ca")
        .expect("the client CA volume");
    let secret = client_ca["secret"]["secretName"].as_str().unwrap();
    let issued = docs
        .iter()
        .find(|d| {
            d["kind"] == "Certificate"
                && d["metadata"]["namespace"] == "pdp-node"
                && d["spec"]["secretName"] == secret
        })
        .expect("the client CA's Secret is issued in pdp-node");
    assert_eq!(issued["spec"]["issuerRef"]["kind"], "ClusterIssuer");
    let cluster_issuer = find(
        &docs,
        "ClusterIssuer",
        issued["spec"]["issuerRef"]["name"].as_str().unwrap(),
    )
    .expect("the apps' ClusterIssuer");
    assert_ne!(cluster_issuer["spec"]["ca"]["secretName"], server_ca_secret);
    // Apps trust the server CA from a ConfigMap, not the Secret's ca.crt (the client CA).
    let config = find(&docs, "ConfigMap", "pdp-injector-config").unwrap();
    let config =
        pdp_core::config::Config::from_yaml(config["data"]["config.yaml"].as_str().unwrap())
            .expect("the shipped config loads");
    let tls = config.profiles["cerbos-tls"].tls.as_ref().unwrap();
    assert_eq!(tls.ca_config_map.as_deref(), Some("pdp-node-ca"));
    assert!(!tls.keys().contains(&"ca.crt"), "{:?}", tls.keys());
}
