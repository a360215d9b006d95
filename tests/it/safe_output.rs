//! Safe output: what pdp-injector writes into a Pod comes from the admin's config, never from the Pod.
//!
//! - Every golden output (`tests/golden/*/*.out.yaml`, against its `.in.yaml`): injected containers meet Pod
//!   Security `restricted` and run a profile's image; the only hostPath added is the profile's socket directory,
//!   in daemonset mode, and never where the status says the socket was dropped for Pod Security; app containers
//!   keep their image, security context, ports and command; nothing else of the Pod changes.
//! - Hostile annotation values on `pdp-injector.io/inject`, `/profile`, `/containers`, `/status` and on other
//!   keys (quotes, newlines, JSON, YAML, `../`, patch-shaped text, huge values) are denied or ignored; when a Pod
//!   is injected anyway, images, hostPaths, capabilities, privileges and users are the profile's, and the patch
//!   has the same structure as for a plain value.
//! - Offline output: hostile values never add or split YAML documents.

use pdp_core::offline::template_pointer;
use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use base64::Engine;
use k8s_openapi::api::core::v1::SecurityContext;
use pdp_core::admission;
use pdp_core::config::{Config, restricted_violations};
use pdp_core::core::NamespaceInfo;
use pdp_core::offline;
use serde_json::{Value, json};

fn golden_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

fn config_of(dir: &Path) -> Config {
    let path = dir.join("config.yaml");
    if path.exists() {
        Config::load(&path).unwrap()
    } else {
        Config::builtin()
    }
}

/// Pod templates of a document, Lists flattened, as (where, template).
fn templates(doc: &Value, at: String, out: &mut Vec<(String, Value)>) {
    let kind = doc["kind"].as_str().unwrap_or("");
    if kind == "List" {
        for (i, item) in doc["items"].as_array().into_iter().flatten().enumerate() {
            templates(item, format!("{at}.{}", i + 1), out);
        }
        return;
    }
    if let Some(p) = template_pointer(kind)
        && let Some(t) = doc.pointer(p)
    {
        out.push((format!("{at} ({kind})"), t.clone()));
    }
}

fn containers(pod: &Value) -> Vec<&Value> {
    ["containers", "initContainers"]
        .iter()
        .flat_map(|f| pod["spec"][f].as_array().into_iter().flatten())
        .collect()
}

fn find<'a>(pod: &'a Value, name: &str) -> Option<&'a Value> {
    containers(pod).into_iter().find(|c| c["name"] == name)
}

/// The rules for one (input, output) pair of Pod templates. Returns how many containers were added.
fn check_pair(input: &Value, output: &Value, config: &Config, ctx: &str) -> usize {
    let images: BTreeSet<&str> = config.added_images().collect();
    let socket_dirs: BTreeSet<&str> = config
        .profiles
        .values()
        .map(|p| p.socket.dir.as_str())
        .collect();
    // The helper's init container runs as the injector image's nonroot user.
    let users: BTreeSet<Option<i64>> = config
        .profiles
        .values()
        .map(|p| p.security_context.run_as_user)
        .chain([Some(65532)])
        .collect();
    let status: Option<Value> = output["metadata"]["annotations"]["pdp-injector.io/status"]
        .as_str()
        .map(|s| serde_json::from_str(s).unwrap());
    let mut added = 0;

    for c in containers(output) {
        let name = c["name"].as_str().unwrap();
        match find(input, name) {
            Some(old) => {
                // An app container: only env and volumeMounts may change.
                for key in [
                    "image",
                    "securityContext",
                    "command",
                    "args",
                    "ports",
                    "resources",
                    "restartPolicy",
                    "envFrom",
                ] {
                    assert_eq!(c.get(key), old.get(key), "{ctx}: {name}.{key} changed");
                }
                let old_mounts: Vec<&Value> = old["volumeMounts"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .collect();
                for m in c["volumeMounts"].as_array().into_iter().flatten() {
                    if old_mounts.contains(&m) {
                        continue;
                    }
                    let volume = m["name"].as_str().unwrap();
                    assert!(
                        [
                            "pdp-injector-socket",
                            "pdp-injector-mtls",
                            "pdp-injector-tls"
                        ]
                        .contains(&volume),
                        "{ctx}: {name} got a mount of {volume}"
                    );
                    assert_eq!(m["readOnly"], true, "{ctx}: {name} mount of {volume}");
                }
            }
            None => {
                added += 1;
                let image = c["image"].as_str().unwrap_or("");
                assert!(images.contains(image), "{ctx}: added {name} runs {image:?}");
                let sc: SecurityContext = serde_json::from_value(c["securityContext"].clone())
                    .unwrap_or_else(|e| panic!("{ctx}: added {name} securityContext: {e}"));
                let v = restricted_violations(&sc);
                assert!(v.is_empty(), "{ctx}: added {name}: {v:?}");
                // Spelled out, not only through the library's own checker:
                assert_eq!(sc.run_as_non_root, Some(true), "{ctx}: {name} runAsNonRoot");
                assert_eq!(
                    sc.allow_privilege_escalation,
                    Some(false),
                    "{ctx}: {name} allowPrivilegeEscalation"
                );
                assert_ne!(sc.privileged, Some(true), "{ctx}: {name} privileged");
                let caps = sc.capabilities.clone().unwrap_or_default();
                assert_eq!(
                    caps.drop,
                    Some(vec!["ALL".to_string()]),
                    "{ctx}: {name} drop"
                );
                assert!(
                    caps.add.unwrap_or_default().is_empty(),
                    "{ctx}: {name} adds capabilities"
                );
                assert_eq!(
                    sc.seccomp_profile.map(|s| s.type_),
                    Some("RuntimeDefault".to_string()),
                    "{ctx}: {name} seccomp"
                );
                assert!(users.contains(&sc.run_as_user), "{ctx}: {name} runAsUser");
                assert_ne!(sc.run_as_user, Some(0), "{ctx}: {name} runs as root");
                for m in c["volumeMounts"].as_array().into_iter().flatten() {
                    let volume = m["name"].as_str().unwrap();
                    let v = output["spec"]["volumes"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .find(|v| v["name"] == volume)
                        .unwrap_or_else(|| panic!("{ctx}: {name} mounts missing {volume}"));
                    assert!(
                        v.get("hostPath").is_none(),
                        "{ctx}: sidecar mounts a hostPath"
                    );
                }
            }
        }
    }

    let old_volumes: Vec<&Value> = input["spec"]["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    for v in output["spec"]["volumes"].as_array().into_iter().flatten() {
        if old_volumes.contains(&v) {
            continue;
        }
        if v["name"] == "pdp-injector-tls" {
            // The profile's TLS Secret (and, with caConfigMap, the server CA's ConfigMap), on the TCP path only,
            // and only the keys an SDK needs: ca.crt from the ConfigMap when a profile names one.
            let tls_of = |pick: &dyn Fn(&pdp_core::config::TlsSpec) -> Option<&str>, name: &str| {
                config
                    .profiles
                    .values()
                    .filter_map(|p| p.tls.as_ref())
                    .any(|t| pick(t) == Some(name))
            };
            let mut sources = Vec::new();
            if v.get("secret").is_some() {
                sources.push(("secret", &v["secret"], &v["secret"]["secretName"]));
            }
            for source in v["projected"]["sources"].as_array().into_iter().flatten() {
                for kind in ["secret", "configMap"] {
                    if source.get(kind).is_some() {
                        sources.push((kind, &source[kind], &source[kind]["name"]));
                    }
                }
            }
            assert!(
                !sources.is_empty(),
                "{ctx}: TLS volume without a source: {v}"
            );
            for (kind, source, name) in sources {
                let name = name.as_str().unwrap_or("");
                let (named, keys): (bool, &[&str]) = if kind == "secret" {
                    (
                        tls_of(&|t| t.secret_name.as_deref(), name),
                        &["ca.crt", "tls.crt", "tls.key"],
                    )
                } else {
                    (tls_of(&|t| t.ca_config_map.as_deref(), name), &["ca.crt"])
                };
                assert!(
                    named,
                    "{ctx}: TLS volume of {kind} {name:?}, which no profile names"
                );
                for item in source["items"].as_array().expect("TLS keys are listed") {
                    assert!(
                        keys.contains(&item["key"].as_str().unwrap_or("")),
                        "{ctx}: TLS volume projects {item} from {kind} {name}"
                    );
                }
            }
            let status = status.as_ref().expect("an injected Pod has a status");
            assert_ne!(
                status["mode"], "sidecar",
                "{ctx}: TLS wired in sidecar mode"
            );
        }
        let Some(hp) = v.get("hostPath") else {
            continue;
        };
        let path = hp["path"].as_str().unwrap_or("");
        assert_eq!(v["name"], "pdp-injector-socket", "{ctx}: hostPath {path}");
        assert!(socket_dirs.contains(path), "{ctx}: hostPath {path}");
        assert_eq!(hp["type"], "Directory", "{ctx}: hostPath type");
        let status = status.as_ref().expect("an injected Pod has a status");
        assert_eq!(
            status["mode"], "daemonset",
            "{ctx}: hostPath outside daemonset mode"
        );
        let downgraded = status["warnings"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|w| w == "downgraded_pss");
        assert!(
            !downgraded,
            "{ctx}: hostPath although downgraded for Pod Security"
        );
    }

    // Nothing else of the Pod changes, but for the shared process namespace that the watch container of a
    // classic sidecar in a run-to-completion Pod needs (and only then).
    for (key, value) in output["spec"].as_object().into_iter().flatten() {
        if ["containers", "initContainers", "volumes"].contains(&key.as_str()) {
            continue;
        }
        if key == "shareProcessNamespace" && input["spec"].get(key).is_none() {
            let watched = output["spec"]["containers"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| {
                    c["name"]
                        .as_str()
                        .is_some_and(|n| n.starts_with("pdp-injector-watch-"))
                });
            assert!(
                watched && value == true,
                "{ctx}: shareProcessNamespace {value} without a watch container"
            );
            continue;
        }
        assert_eq!(
            Some(value),
            input["spec"].get(key),
            "{ctx}: spec.{key} changed"
        );
    }
    for key in input["spec"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, _)| k)
    {
        assert!(output["spec"].get(key).is_some(), "{ctx}: spec.{key} lost");
    }
    for (key, value) in output["metadata"].as_object().into_iter().flatten() {
        if key == "annotations" {
            continue;
        }
        if key == "labels" {
            // Every label is the Pod's own: the injector adds none.
            let labels = value.clone();
            let before = input["metadata"].get("labels");
            if before.is_some() || !labels.as_object().is_some_and(|l| l.is_empty()) {
                assert_eq!(Some(&labels), before, "{ctx}: metadata.labels changed");
            }
            continue;
        }
        assert_eq!(
            Some(value),
            input["metadata"].get(key),
            "{ctx}: metadata.{key} changed"
        );
    }
    for (key, value) in output["metadata"]["annotations"]
        .as_object()
        .into_iter()
        .flatten()
    {
        if input["metadata"]["annotations"].get(key) == Some(value) {
            continue;
        }
        // One status per profile: the first in pdp-injector.io/status, each further one under its name.
        assert!(
            key == "pdp-injector.io/status"
                || key
                    .strip_prefix("pdp-injector.io/status-")
                    .is_some_and(|p| config.profiles.contains_key(p))
                || key == "cluster-autoscaler.kubernetes.io/safe-to-evict-local-volumes"
                // A classic sidecar goes first: kubectl's default stays the app.
                || (key == "kubectl.kubernetes.io/default-container"
                    && find(input, value.as_str().unwrap()).is_some()),
            "{ctx}: annotation {key} written"
        );
    }
    added
}

#[test]
fn every_golden_output_is_safe() {
    let mut pairs = 0;
    let mut added = 0;
    let mut dirs = fs::read_dir(golden_root())
        .unwrap()
        .map(|d| d.unwrap().path())
        .filter(|d| d.is_dir())
        .collect::<Vec<_>>();
    dirs.sort();
    for dir in dirs {
        let config = config_of(&dir);
        let mut files: Vec<PathBuf> = fs::read_dir(&dir)
            .unwrap()
            .map(|f| f.unwrap().path())
            .filter(|f| f.to_string_lossy().ends_with(".out.yaml"))
            .collect();
        files.sort();
        for out_path in files {
            let text = fs::read_to_string(&out_path).unwrap();
            if text.starts_with("# error:") {
                continue;
            }
            let in_path =
                PathBuf::from(out_path.to_string_lossy().replace(".out.yaml", ".in.yaml"));
            let input = offline::parse_stream(&fs::read_to_string(&in_path).unwrap()).unwrap();
            let output = offline::parse_stream(&text).unwrap();
            let name = out_path
                .strip_prefix(golden_root())
                .unwrap()
                .display()
                .to_string();
            assert_eq!(input.len(), output.len(), "{name}: documents added or lost");
            for (i, (a, b)) in input.iter().zip(&output).enumerate() {
                let (mut ta, mut tb) = (vec![], vec![]);
                templates(a, (i + 1).to_string(), &mut ta);
                templates(b, (i + 1).to_string(), &mut tb);
                assert_eq!(ta.len(), tb.len(), "{name}: document {}", i + 1);
                for ((at, pa), (_, pb)) in ta.iter().zip(&tb) {
                    added += check_pair(pa, pb, &config, &format!("{name} document {at}"));
                    pairs += 1;
                }
            }
        }
    }
    assert!(pairs > 40, "only {pairs} Pod templates checked");
    assert!(added > 5, "only {added} added containers checked");
}

// ---- hostile annotation values through the whole AdmissionReview path ----

const FIXTURE: &str = include_str!("../fixtures/admissionreview-v1-pod-create.json");

/// Values a user might put into an annotation to steer the webhook or break its output.
fn hostile_values() -> Vec<String> {
    let mut v: Vec<String> = [
        "sidecar\"",
        "\"sidecar\"",
        "sidecar\n",
        " sidecar",
        "SIDECAR",
        "sidecar,daemonset",
        "sidecar\ndaemonset",
        "daemonset\u{0}",
        "{\"image\":\"evil:latest\"}",
        "{\"image\":\"evil:latest\",\"privileged\":true,\"runAsUser\":0}",
        "[{\"op\":\"add\",\"path\":\"/spec/containers/0/image\",\"value\":\"evil:latest\"}]",
        "image: evil:latest\nsecurityContext:\n  privileged: true",
        "---\nkind: Pod\nmetadata:\n  name: evil",
        "cerbos\nimage: evil:latest",
        "../",
        "../../../../etc",
        "/var/run/../../",
        "cerbos/../flagd",
        "cerbos,flagd",
        "cerbos-pdp",
        "$(CERBOS_PDP_ADDR)",
        "~1spec~1containers",
        "/spec/containers/0/image",
        "c\",\"image\":\"evil",
        "c,evil",
        "c,,",
        ",",
        "",
        "\u{202e}cerbos",
        "!!str cerbos",
        "&a cerbos",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.push("x".repeat(64 * 1024));
    v.push("{".repeat(1000));
    v
}

fn review_with(annotations: Value, labels: Value) -> Vec<u8> {
    let mut r: Value = serde_json::from_str(FIXTURE).unwrap();
    r["request"]["object"]["metadata"]["annotations"] = annotations;
    r["request"]["object"]["metadata"]["labels"] = labels;
    serde_json::to_vec(&r).unwrap()
}

struct Answer {
    allowed: bool,
    reason: String,
    message: String,
    /// The patch's paths, in order, when there is one.
    paths: Vec<String>,
    /// The object as sent.
    before: Value,
    /// The object with the patch applied (the input object when there is no patch).
    pod: Value,
}

fn answer(body: &[u8], ns: &NamespaceInfo) -> Answer {
    let config = Config::builtin();
    let (bytes, _) = admission::review(body, &config, &|_| ns.clone()).expect("a review");
    let out: Value = serde_json::from_slice(&bytes).unwrap();
    let resp = &out["response"];
    let input: Value = serde_json::from_slice(body).unwrap();
    let before = input["request"]["object"].clone();
    let mut pod = before.clone();
    let mut paths = vec![];
    if let Some(p) = resp["patch"].as_str() {
        let raw = base64::engine::general_purpose::STANDARD.decode(p).unwrap();
        let patch: json_patch::Patch = serde_json::from_slice(&raw).unwrap();
        for op in &patch.0 {
            let v = serde_json::to_value(op).unwrap();
            let path = v["path"].as_str().unwrap().to_string();
            assert!(
                path.starts_with("/metadata/annotations") || path.starts_with("/spec/"),
                "patch touches {path}"
            );
            assert_eq!(v["op"], "add", "patch does more than add: {v}");
            paths.push(path);
        }
        json_patch::patch(&mut pod, &patch).unwrap();
    }
    Answer {
        allowed: resp["allowed"].as_bool().unwrap(),
        reason: resp["auditAnnotations"]["reason"].as_str().unwrap().into(),
        message: resp["status"]["message"].as_str().unwrap_or("").into(),
        paths,
        before,
        pod,
    }
}

fn namespaces() -> Vec<NamespaceInfo> {
    vec![
        NamespaceInfo::named("webhook-demo"),
        NamespaceInfo {
            name: "webhook-demo".into(),
            injection: Some("sidecar".into()),
            pss_enforce: Some("restricted".into()),
            required: false,
        },
        NamespaceInfo {
            name: "webhook-demo".into(),
            injection: Some("daemonset".into()),
            pss_enforce: None,
            required: false,
        },
    ]
}

/// The three pdp-injector keys a Pod sets: a hostile value is refused with a message that names the key and
/// quotes the value, or (the profile and containers keys, when the Pod is not opted in) ignored; it never
/// reaches the output.
#[test]
fn hostile_values_on_pdp_injector_keys_are_refused_or_ignored() {
    let config = Config::builtin();
    for ns in namespaces() {
        for value in hostile_values() {
            for (key, base) in [
                ("pdp-injector.io/inject", json!({})),
                (
                    "pdp-injector.io/profile",
                    json!({"pdp-injector.io/inject": "sidecar"}),
                ),
                (
                    "pdp-injector.io/profile",
                    json!({"pdp-injector.io/inject": "daemonset"}),
                ),
                (
                    "pdp-injector.io/containers",
                    json!({"pdp-injector.io/inject": "sidecar"}),
                ),
                ("pdp-injector.io/containers", json!({})),
            ] {
                let mut annotations = base.clone();
                annotations[key] = json!(value);
                let a = answer(&review_with(annotations, json!({"app": "mutated"})), &ns);
                let ctx = format!("{key}={value:.60?} in {ns:?}: {}", a.reason);
                // Names the only valid spellings: no hostile value slips through.
                let valid = match key {
                    "pdp-injector.io/inject" => {
                        ["sidecar", "daemonset", "central", "enabled", "disabled"]
                            .contains(&value.as_str())
                    }
                    "pdp-injector.io/profile" => {
                        // A profile, or a comma list of distinct profiles.
                        let names: Vec<&str> = value.split(',').map(str::trim).collect();
                        names.iter().all(|p| config.profiles.contains_key(*p))
                            && names.iter().collect::<BTreeSet<_>>().len() == names.len()
                    }
                    _ => {
                        value
                            .split(',')
                            .map(str::trim)
                            .all(|c| c == "c" || c.is_empty())
                            && value.split(',').any(|c| c.trim() == "c")
                    }
                };
                if !a.allowed {
                    assert!(a.message.contains(key), "{ctx}: {}", a.message);
                    continue;
                }
                if a.paths.is_empty() {
                    continue;
                }
                assert!(valid, "{ctx}: injected on an invalid value");
                check_pair(&a.before, &a.pod, &config, &ctx);
                let spec = a.pod["spec"].to_string();
                assert!(!spec.contains("evil"), "{ctx}: {spec}");
            }
        }
    }
}

/// Pod labels of the inject key are read like the annotation: the same refusal, never an injection.
#[test]
fn hostile_values_on_the_inject_label_are_refused() {
    for value in hostile_values() {
        if value.len() > 63 {
            continue; // not a legal label value; the apiserver would refuse the Pod first
        }
        let a = answer(
            &review_with(json!({}), json!({"pdp-injector.io/inject": value})),
            &NamespaceInfo::named("webhook-demo"),
        );
        assert!(!a.allowed, "label {value:?}: {}", a.reason);
        assert_eq!(a.reason, "invalid_annotation");
        assert!(
            a.message.contains("label pdp-injector.io/inject"),
            "{}",
            a.message
        );
    }
}

/// A status annotation written by the user (copied from another Pod, or forged) that the Pod does not carry is not
/// believed: the Pod gets what it would get without it, never an image, hostPath or privilege the record names.
#[test]
fn a_forged_status_annotation_adds_no_image_hostpath_or_privilege() {
    let config = Config::builtin();
    let forged = [
        json!({"mode": "sidecar", "profile": "cerbos", "reason": "injected_sidecar", "configHash": "x",
               "version": "0", "sidecar": "evil", "volumes": ["pdp-injector-socket"], "containers": [],
               "env": ["CERBOS_PDP_SOCKET"]}),
        json!({"mode": "daemonset", "profile": "flagd", "reason": "injected_daemonset", "configHash": "x",
               "version": "0", "volumes": [], "containers": [], "env": ["FLAGD_SOCKET_PATH"]}),
        json!({"mode": "daemonset", "profile": "../../etc", "reason": "injected_daemonset",
               "configHash": "x", "version": "0"}),
        json!({"mode": "sidecar", "profile": "cerbos", "image": "evil:latest", "privileged": true}),
        json!("{\"image\":\"evil:latest\"}"),
        json!(["evil"]),
    ];
    for status in forged {
        let text = match &status {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        for inject in [None, Some("sidecar"), Some("daemonset")] {
            let mut annotations = json!({"pdp-injector.io/status": text});
            if let Some(i) = inject {
                annotations["pdp-injector.io/inject"] = json!(i);
            }
            for ns in namespaces() {
                let a = answer(&review_with(annotations.clone(), json!({})), &ns);
                let ctx = format!("status {text} inject {inject:?} in {ns:?}: {}", a.reason);
                assert!(a.allowed, "{ctx}: {}", a.message);
                check_pair(&a.before, &a.pod, &config, &ctx);
                let spec = a.pod["spec"].to_string();
                assert!(!spec.contains("evil"), "{ctx}: {spec}");
                // A status the Pod does not carry is not believed: the Pod gets exactly what it would get
                // without it (the admin's profile, nothing the record names), never a partial re-wiring.
                let mut plain = annotations.clone();
                plain
                    .as_object_mut()
                    .unwrap()
                    .remove("pdp-injector.io/status");
                let fresh = answer(&review_with(plain, json!({})), &ns);
                assert_eq!(a.pod["spec"], fresh.pod["spec"], "{ctx}");
                assert_eq!(
                    containers(&a.pod).len(),
                    containers(&fresh.pod).len(),
                    "{ctx}"
                );
            }
        }
    }
}

/// Hostile values on keys the webhook does not own (and on env values of the app) ride along untouched and
/// never change which paths the patch writes: the patch is built from typed values and JSON-escaped, not from
/// text.
#[test]
fn hostile_values_elsewhere_never_change_the_patch_structure() {
    let config = Config::builtin();
    for ns in namespaces() {
        for mode in ["sidecar", "daemonset"] {
            let mut shapes = BTreeSet::new();
            let mut last = None;
            for value in hostile_values() {
                let mut r: Value = serde_json::from_str(FIXTURE).unwrap();
                r["request"]["object"]["metadata"]["annotations"] = json!({
                    "pdp-injector.io/inject": mode,
                    "example.com/note": value,
                    "a/b~c": value,
                    "pdp-injector.io/unknown": value,
                });
                r["request"]["object"]["spec"]["containers"][0]["env"] =
                    json!([{"name": "NOTE", "value": value}]);
                let body = serde_json::to_vec(&r).unwrap();
                let a = answer(&body, &ns);
                let ctx = format!("{mode} value {value:.60?} in {ns:?}");
                if !a.allowed {
                    // Sidecar mode in a namespace whose label says otherwise is still the Pod's choice;
                    // any refusal here would be independent of the value.
                    panic!("{ctx}: refused: {}", a.message);
                }
                check_pair(&a.before, &a.pod, &config, &ctx);
                // The hostile values are still exactly where the user put them.
                assert_eq!(
                    a.pod["metadata"]["annotations"]["example.com/note"],
                    json!(value)
                );
                assert_eq!(a.pod["metadata"]["annotations"]["a/b~c"], json!(value));
                assert_eq!(
                    a.pod["spec"]["containers"][0]["env"]
                        .as_array()
                        .unwrap()
                        .last()
                        .unwrap()["value"],
                    json!(value)
                );
                shapes.insert(a.paths.clone());
                last = Some(a.paths);
            }
            assert_eq!(
                shapes.len(),
                1,
                "{mode} in {ns:?}: patch paths vary with annotation values: {shapes:?}"
            );
            assert!(
                !last.unwrap().is_empty(),
                "{mode} in {ns:?}: nothing injected"
            );
        }
    }
}

/// Offline: hostile values are written as YAML scalars, so the output has exactly the documents of the input,
/// every value reads back as written, and `inject` on its own output changes nothing.
#[test]
fn offline_output_keeps_hostile_values_as_scalars() {
    let config = Config::builtin();
    for value in hostile_values() {
        let pod = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p", "annotations": {
                "pdp-injector.io/inject": "daemonset",
                "example.com/note": value,
            }},
            "spec": {"containers": [{"name": "app", "image": "app:1",
                                     "env": [{"name": "NOTE", "value": value}]}]}
        });
        let input = format!(
            "{}\n---\n{}\n",
            pod,
            json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "after"}, "data": {"k": value}})
        );
        let (out, reports) =
            offline::inject_stream(&input, &config, &offline::Options::default()).unwrap();
        let ctx = format!("value {value:.60?}");
        assert_eq!(reports.len(), 2, "{ctx}: {out}");
        let docs = offline::parse_stream(&out).unwrap();
        assert_eq!(docs.len(), 2, "{ctx}: {out}");
        assert_eq!(
            docs[0]["metadata"]["annotations"]["example.com/note"],
            json!(value),
            "{ctx}"
        );
        assert_eq!(
            docs[0]["spec"]["containers"][0]["env"]
                .as_array()
                .unwrap()
                .last()
                .unwrap()["value"],
            json!(value),
            "{ctx}"
        );
        assert_eq!(docs[1]["data"]["k"], json!(value), "{ctx}");
        check_pair(&pod, &docs[0], &config, &ctx);
        let (again, _) =
            offline::inject_stream(&out, &config, &offline::Options::default()).unwrap();
        assert_eq!(again, out, "{ctx}: inject on its own output changed it");
    }
}
