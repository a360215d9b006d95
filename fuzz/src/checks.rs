// The properties the fuzz targets check, in one file that two crates compile: the fuzz crate (fuzz/src/lib.rs)
// and the main package's tests/it/fuzz_regressions.rs (through `include!`), so that every input the fuzzer saved
// replays as an ordinary `cargo test`. Only pdp-injector's own dependencies are used here.
//
// A property that does not hold panics, which libFuzzer reports as a crash and saves the input.

use std::sync::OnceLock;

use base64::Engine;
use pdp_core::admission;
use pdp_core::config::{Config, PROFILE_VOLUME_KINDS, restricted_violations};
use pdp_core::core::NamespaceInfo;
use pdp_core::offline;
use serde_json::{Value, json};

/// The namespaces every review is answered in: unlabelled (only annotations opt in), labelled for sidecars in a
/// privileged namespace, and labelled for the daemonset under Pod Security baseline (socket dropped).
pub fn namespace_variants(name: &str) -> [NamespaceInfo; 3] {
    [
        NamespaceInfo::named(name),
        NamespaceInfo {
            name: name.into(),
            injection: Some("sidecar".into()),
            pss_enforce: Some("privileged".into()),
            required: false,
        },
        NamespaceInfo {
            name: name.into(),
            injection: Some("daemonset".into()),
            pss_enforce: Some("baseline".into()),
            required: false,
        },
    ]
}

fn builtin() -> &'static Config {
    static CONFIG: OnceLock<Config> = OnceLock::new();
    CONFIG.get_or_init(Config::builtin)
}

/// Target `review`: an arbitrary body through the whole core, as the webhook handler calls it.
pub fn review(data: &[u8]) {
    json_reader_agrees(data);
    for variant in 0..3 {
        review_in(data, builtin(), variant);
    }
}

/// The webhook's JSON reader (`pdp_core::json`) on its own, against serde_json: whatever serde_json reads, it
/// reads to the same value (or declines). It refuses what serde_json refuses, but for faults of grammar inside
/// an object or list the type skips (a `RawValue`'s text, the fields the view does not read): a text it reads
/// has JSON's structure all the same (`has_structure`). `Value` skips nothing.
pub fn json_reader_agrees(data: &[u8]) {
    use pdp_core::core::PodView;
    use pdp_core::json::{has_structure, read};
    use serde_json::value::RawValue;
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(fast) = read::<Value>(text) {
        let slow: Value = serde_json::from_str(text).expect("serde_json reads what the fast path read");
        assert_eq!(fast, slow);
    }
    let past_fault = |e: serde_json::Error| {
        assert!(has_structure(text), "read past {e} without JSON's structure: {text:?}");
    };
    if let Ok(fast) = read::<&RawValue>(text) {
        match serde_json::from_str::<&RawValue>(text) {
            Ok(slow) => assert_eq!(fast.get(), slow.get()),
            Err(e) => past_fault(e),
        }
    }
    if let Ok(fast) = read::<PodView<'_>>(text) {
        match serde_json::from_str::<PodView<'_>>(text) {
            Ok(slow) => assert_eq!(format!("{fast:?}"), format!("{slow:?}")),
            Err(e) => past_fault(e),
        }
    }
}

/// One body, one namespace variant, one config: never a panic; an answer is a well-formed AdmissionReview whose
/// patch applies to the object it was computed for, keeps what the profile dictates, and is idempotent.
pub fn review_in(data: &[u8], config: &Config, variant: usize) {
    let lookup = |ns: &str| namespace_variants(ns)[variant].clone();
    let Ok((bytes, summary)) = admission::review(data, config, &lookup) else {
        return;
    };
    let out: Value = serde_json::from_slice(&bytes).expect("the answer is JSON");
    assert_eq!(out["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(out["kind"], "AdmissionReview");
    let response = &out["response"];
    assert!(!summary.uid.is_empty());
    assert_eq!(response["uid"], summary.uid.as_str(), "uid echoed");
    let allowed = response["allowed"].as_bool().expect("allowed is a bool");
    assert_eq!(allowed, summary.decision != "deny");
    assert_eq!(
        response["auditAnnotations"]["reason"],
        summary.reason.code()
    );
    if !allowed {
        assert!(response.get("patch").is_none(), "a denial carries no patch");
        let message = response["status"]["message"].as_str().unwrap_or("");
        assert!(!message.is_empty(), "a denial says why");
        return;
    }
    let Some(patch_b64) = response.get("patch") else {
        assert_eq!(summary.patch_ops, 0);
        return;
    };
    assert_eq!(response["patchType"], "JSONPatch");
    let raw = base64::engine::general_purpose::STANDARD
        .decode(patch_b64.as_str().expect("patch is a string"))
        .expect("patch is base64");
    let patch: json_patch::Patch = serde_json::from_slice(&raw).expect("patch is a JSON Patch");
    assert!(!patch.0.is_empty(), "an injection has a non-empty patch");

    // The apiserver applies the patch to the object it sent: it must apply to exactly that JSON. (The apiserver
    // always sends `metadata` and `spec` objects; without them the patch's parents may be missing.)
    // serde_json does not check UTF-8 inside strings it skips (the envelope's userInfo, say), so a body the
    // webhook answered may still not parse as a whole; the apiserver only sends valid JSON, so skip those.
    let Ok(input) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let mut object = input["request"]["object"].clone();
    if !object["metadata"].is_object() || !object["spec"].is_object() {
        return;
    }
    let before = object.clone();
    json_patch::patch(&mut object, &patch)
        .unwrap_or_else(|e| panic!("the patch does not apply to the request's object: {e}"));
    assert_safe(&before, &object, config);

    // Idempotent: the patched object, reviewed again, needs nothing more.
    let mut again = input.clone();
    again["request"]["object"] = object;
    let again = serde_json::to_vec(&again).expect("JSON serializes");
    let (bytes, summary2) =
        admission::review(&again, config, &lookup).expect("the patched review is still a review");
    let out2: Value = serde_json::from_slice(&bytes).expect("the answer is JSON");
    assert!(
        out2["response"].get("patch").is_none(),
        "second pass patched again ({}): {}",
        summary2.reason.code(),
        out2
    );
}

fn containers_of(pod: &Value) -> impl Iterator<Item = &Value> {
    ["containers", "initContainers"]
        .into_iter()
        .flat_map(move |f| pod["spec"][f].as_array().into_iter().flatten())
}

/// A container's name as the typed structs read it (a missing name is "": the apiserver calls mutating
/// webhooks before it validates the object, so such Pods do reach the webhook).
fn name_of(c: &Value) -> &str {
    c["name"].as_str().unwrap_or("")
}

/// A security context as the typed structs read it (`null` fields and a missing context are the same).
fn security_context(c: &Value) -> Option<k8s_openapi::api::core::v1::SecurityContext> {
    serde_json::from_value(c["securityContext"].clone()).ok()
}

/// What the webhook adds comes from the config only: every container it adds runs a profile's image under a
/// `restricted` security context; the only hostPath it adds is a profile's socket directory; app containers keep
/// their own image, security context, and get no new privileges.
pub fn assert_safe(before: &Value, after: &Value, config: &Config) {
    let images: Vec<&str> = config.added_images().collect();
    let socket_dirs: Vec<&str> = config
        .profiles
        .values()
        .map(|p| p.socket.dir.as_str())
        .collect();
    for c in containers_of(after) {
        let name = name_of(c);
        let mut originals = containers_of(before)
            .filter(|o| name_of(o) == name)
            .peekable();
        if originals.peek().is_some() {
            // An app container: its image and security context are what the user wrote (one of them, should
            // the Pod repeat a name).
            assert!(
                originals.any(|o| o["image"].as_str() == c["image"].as_str()
                    && security_context(o) == security_context(c)),
                "image or securityContext of {name:?} changed"
            );
            continue;
        }
        let image = c["image"].as_str().unwrap_or("");
        assert!(images.contains(&image), "added container runs {image:?}");
        let sc = security_context(c).expect("added container has a securityContext");
        let v = restricted_violations(&sc);
        assert!(v.is_empty(), "added container {name}: {v:?}");
    }
    let old_volumes: Vec<&Value> = before["spec"]["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    for v in after["spec"]["volumes"].as_array().into_iter().flatten() {
        if old_volumes.contains(&v) {
            continue;
        }
        if let Some(hp) = v.get("hostPath") {
            assert_eq!(v["name"], "pdp-injector-socket");
            let path = hp["path"].as_str().unwrap_or("");
            assert!(socket_dirs.contains(&path), "added hostPath {path:?}");
        }
    }
    for key in [
        "hostNetwork",
        "hostPID",
        "hostIPC",
        "securityContext",
        "serviceAccountName",
    ] {
        assert_eq!(
            after["spec"].get(key),
            before["spec"].get(key),
            "spec.{key} changed"
        );
    }
}

fn builtin_fixture() -> Value {
    json!({
        "kind": "AdmissionReview",
        "apiVersion": "admission.k8s.io/v1",
        "request": {
            "uid": "fuzz",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "shop",
            "operation": "CREATE",
            "object": {
                "metadata": {"name": "p", "annotations": {}},
                "spec": {
                    "initContainers": [{"name": "init", "image": "init:1"}],
                    "containers": [
                        {"name": "app", "image": "app:1", "env": [{"name": "A", "value": "1"}]},
                        {"name": "other", "image": "other:1"}
                    ],
                    "volumes": [{"name": "data", "emptyDir": {}}]
                }
            }
        }
    })
}

/// Target `config`: config text never panics; a config that loads holds only `restricted` profiles whose
/// volumes each have one allowed source (no hostPath), and renders every profile in both modes without a panic.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(config) = Config::from_yaml(text) else {
        return;
    };
    for (name, p) in &config.profiles {
        let v = restricted_violations(&p.security_context);
        assert!(v.is_empty(), "profile {name} loaded with {v:?}");
        assert!(
            p.volumes.iter().all(|v| v.volume.host_path.is_none()),
            "profile {name} loaded with a hostPath volume"
        );
        for v in &p.volumes {
            let volume = serde_json::to_value(&v.volume).unwrap();
            let sources: Vec<&String> = volume
                .as_object()
                .unwrap()
                .keys()
                .filter(|k| *k != "name")
                .collect();
            assert!(
                sources.len() == 1 && PROFILE_VOLUME_KINDS.contains(&sources[0].as_str()),
                "profile {name} loaded with volume sources {sources:?}"
            );
        }
    }
    let classic = config.clone().with_classic_sidecars();
    for config in [&config, &classic] {
        for profile in config.profiles.keys() {
            for mode in ["sidecar", "daemonset", "central"] {
                let mut review = builtin_fixture();
                review["request"]["object"]["metadata"]["annotations"] = json!({
                    "pdp-injector.io/inject": mode,
                    "pdp-injector.io/profile": profile,
                });
                let body = serde_json::to_vec(&review).expect("JSON serializes");
                review_in(&body, config, 0);
                review_in(&body, config, 2);
            }
        }
    }
}

/// Target `offline`: a YAML stream never panics; when it injects, running `inject` on its own output gives the
/// same output (the README's promise) and injects nothing more.
pub fn offline(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for mode in [None, Some("sidecar".to_string())] {
        let options = offline::Options {
            mode,
            default_namespace: None,
            workers: 1,
        };
        let Ok((out, _reports)) = offline::inject_stream(text, builtin(), &options) else {
            continue;
        };
        let (again, reports) = offline::inject_stream(&out, builtin(), &options)
            .unwrap_or_else(|e| panic!("inject fails on its own output: {e}\n{out}"));
        for r in &reports {
            let code = r.reason.map(|r| r.code()).unwrap_or("");
            assert!(
                !matches!(code, "injected_sidecar" | "injected_daemonset" | "injected_central" | "rewired"),
                "second pass {code} document {}",
                r.index
            );
        }
        assert_eq!(again, out, "inject on its own output changed it");
    }
}
