//! The AdmissionReview layer without HTTP: the webhook handler runs exactly `admission::review`.

use base64::Engine;
use pdp_core::admission::{self, ReviewError, review};
use pdp_core::config::Config;
use pdp_core::core::NamespaceInfo;
use serde_json::{Value, json};

const FIXTURE: &str = include_str!("../fixtures/admissionreview-v1-pod-create.json");

/// An opted-in namespace that allows the node socket (Pod Security privileged).
fn labelled(label: &'static str) -> impl Fn(&str) -> NamespaceInfo {
    move |name| NamespaceInfo {
        name: name.into(),
        injection: Some(label.into()),
        pss_enforce: Some("privileged".into()),
        required: false,
    }
}

fn unlabelled(name: &str) -> NamespaceInfo {
    NamespaceInfo::named(name)
}

fn answer(body: &[u8], ns: &dyn Fn(&str) -> NamespaceInfo) -> Value {
    let (bytes, _) = review(body, &Config::builtin(), ns).expect("well-formed review");
    serde_json::from_slice(&bytes).unwrap()
}

fn fixture() -> Value {
    serde_json::from_str(FIXTURE).unwrap()
}

#[test]
fn real_review_in_an_enabled_namespace_gets_a_patch_that_applies() {
    let out = answer(FIXTURE.as_bytes(), &labelled("enabled"));
    assert_eq!(out["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(out["kind"], "AdmissionReview");
    let resp = &out["response"];
    assert_eq!(resp["uid"], "2c11f9f4-347e-4028-9bdb-2d01a3c0650c");
    assert_eq!(resp["allowed"], true);
    assert_eq!(resp["patchType"], "JSONPatch");
    assert_eq!(resp["auditAnnotations"]["reason"], "injected_daemonset");
    let patch = base64::engine::general_purpose::STANDARD
        .decode(resp["patch"].as_str().unwrap())
        .unwrap();
    let patch: json_patch::Patch = serde_json::from_slice(&patch).unwrap();
    let mut pod = fixture()["request"]["object"].clone();
    json_patch::patch(&mut pod, &patch).unwrap();
    let env = &pod["spec"]["containers"][0]["env"];
    assert_eq!(env[0]["name"], "CERBOS_PDP_HOST");
    assert_eq!(
        env[0]["valueFrom"]["fieldRef"]["fieldPath"],
        "status.hostIP"
    );
    assert_eq!(env[1]["value"], "$(CERBOS_PDP_HOST):3593");
    assert_eq!(
        pod["spec"]["volumes"][0]["hostPath"]["path"],
        "/var/run/cerbos"
    );
    // managedFields, tolerations and every other field of the real object survive the patch
    assert_eq!(
        pod["metadata"]["managedFields"],
        fixture()["request"]["object"]["metadata"]["managedFields"]
    );
    assert_eq!(
        pod["spec"]["tolerations"],
        fixture()["request"]["object"]["spec"]["tolerations"]
    );
}

#[test]
fn skipped_pod_is_allowed_without_patch() {
    let (bytes, summary) = review(FIXTURE.as_bytes(), &Config::builtin(), &unlabelled).unwrap();
    let out: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(out["response"]["allowed"], true);
    assert!(out["response"].get("patch").is_none());
    assert!(out["response"].get("patchType").is_none());
    assert_eq!(summary.reason.code(), "not_opted_in");
    assert_eq!(summary.decision, "skip");
    assert_eq!(summary.namespace, "webhook-demo");
    assert_eq!(summary.name, "mutated");
}

#[test]
fn dry_run_gets_the_same_answer() {
    let mut dry = fixture();
    dry["request"]["dryRun"] = json!(true);
    let a = answer(FIXTURE.as_bytes(), &labelled("sidecar"));
    let (bytes, summary) = review(
        dry.to_string().as_bytes(),
        &Config::builtin(),
        &labelled("sidecar"),
    )
    .unwrap();
    assert!(summary.dry_run);
    assert_eq!(serde_json::from_slice::<Value>(&bytes).unwrap(), a);
}

#[test]
fn denial_carries_the_message_and_http_semantics() {
    let mut r = fixture();
    r["request"]["object"]["metadata"]["annotations"] =
        json!({"pdp-injector.io/inject": "sidecars"});
    let out = answer(r.to_string().as_bytes(), &unlabelled);
    let resp = &out["response"];
    assert_eq!(resp["allowed"], false);
    assert_eq!(resp["uid"], "2c11f9f4-347e-4028-9bdb-2d01a3c0650c");
    assert_eq!(resp["status"]["code"], 400);
    let msg = resp["status"]["message"].as_str().unwrap();
    assert!(
        msg.contains("pdp-injector.io/inject")
            && msg.contains("\"sidecars\"")
            && msg.contains("daemonset"),
        "{msg}"
    );
    assert!(resp.get("patch").is_none());
}

#[test]
fn warnings_reach_the_response() {
    let ns = |name: &str| NamespaceInfo {
        name: name.into(),
        injection: Some("daemonset".into()),
        pss_enforce: Some("baseline".into()),
        required: false,
    };
    let out = answer(FIXTURE.as_bytes(), &ns);
    let warnings = out["response"]["warnings"].as_array().unwrap();
    assert_eq!(warnings.len(), 1);
    assert!(
        warnings[0]
            .as_str()
            .unwrap()
            .starts_with("pdp-injector downgraded_pss:"),
        "{warnings:?}"
    );
}

#[test]
fn update_other_kinds_and_subresources_are_allowed_untouched() {
    let mut update = fixture();
    update["request"]["operation"] = json!("UPDATE");
    let mut deployment = fixture();
    deployment["request"]["kind"] = json!({"group": "apps", "version": "v1", "kind": "Deployment"});
    deployment["request"]["resource"] =
        json!({"group": "apps", "version": "v1", "resource": "deployments"});
    deployment["request"]["object"] = json!({"kind": "Deployment", "spec": {"replicas": 1}});
    let mut sub = fixture();
    sub["request"]["subResource"] = json!("ephemeralcontainers");
    for r in [update, deployment, sub] {
        let (bytes, summary) = review(
            r.to_string().as_bytes(),
            &Config::builtin(),
            &labelled("sidecar"),
        )
        .unwrap();
        let out: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(out["response"]["allowed"], true);
        assert!(out["response"].get("patch").is_none());
        assert_eq!(summary.reason.code(), "not_a_pod_create");
    }
}

/// The namespace is asked for only where its labels can change the answer: a Pod CREATE of a Pod, outside an
/// excluded namespace, that is not a mirror Pod. Every other request is answered without it.
#[test]
fn only_a_pod_create_whose_answer_depends_on_labels_needs_its_namespace() {
    let config = Config::builtin();
    let body = |edit: &dyn Fn(&mut Value)| {
        let mut r = fixture();
        edit(&mut r);
        r.to_string()
    };
    let namespace = fixture()["request"]["namespace"]
        .as_str()
        .unwrap()
        .to_string();
    let plain = body(&|_| {});
    assert_eq!(
        admission::decode(plain.as_bytes())
            .unwrap()
            .namespace_needed(&config),
        Some(namespace.as_str())
    );
    let excluded = config.excluded_namespaces.iter().next().unwrap().clone();
    for (what, text) in [
        (
            "an UPDATE",
            body(&|r| r["request"]["operation"] = json!("UPDATE")),
        ),
        (
            "an excluded namespace",
            body(&|r| r["request"]["namespace"] = json!(excluded)),
        ),
        (
            "a mirror Pod",
            body(&|r| {
                r["request"]["object"]["metadata"]["annotations"]["kubernetes.io/config.mirror"] =
                    json!("x")
            }),
        ),
        (
            "an object not of the Pod's shape",
            body(&|r| r["request"]["object"]["spec"]["containers"] = json!("not a list")),
        ),
        ("no object", body(&|r| r["request"]["object"] = json!(null))),
    ] {
        let request = admission::decode(text.as_bytes()).unwrap();
        assert_eq!(request.namespace_needed(&config), None, "{what}");
        // Answered without it, as the webhook does.
        let (_, summary) = request.answer(&request.decide(&config, None));
        assert_ne!(summary.reason.code(), "injected_daemonset", "{what}");
    }
}

#[test]
fn an_object_that_is_not_a_pod_is_denied_with_200_semantics() {
    let mut r = fixture();
    r["request"]["object"]["spec"]["containers"] = json!("not a list");
    let out = answer(r.to_string().as_bytes(), &labelled("sidecar"));
    assert_eq!(out["response"]["allowed"], false);
    assert!(
        out["response"]["status"]["message"]
            .as_str()
            .unwrap()
            .contains("invalid_object")
    );
}

#[test]
fn bad_bodies_are_errors_not_panics() {
    let config = Config::builtin();
    let deep = "[".repeat(10_000) + &"]".repeat(10_000);
    let deep_object = format!(
        "{{\"kind\":\"AdmissionReview\",\"apiVersion\":\"admission.k8s.io/v1\",\"request\":{}}}",
        "{\"a\":".repeat(1_000_000) + "1" + &"}".repeat(1_000_000)
    );
    type Check = fn(&ReviewError) -> bool;
    let cases: Vec<(Vec<u8>, Check)> = vec![
        (b"".to_vec(), |e| *e == ReviewError::Empty),
        (b"  \n".to_vec(), |e| *e == ReviewError::Empty),
        (b"not json".to_vec(), |e| matches!(e, ReviewError::Malformed(_))),
        (b"\xff\xfe".to_vec(), |e| matches!(e, ReviewError::Malformed(_))),
        // Not UTF-8 in a field the webhook skips: JSON text is UTF-8, and the whole body is checked.
        (b"{\"kind\":\"AdmissionReview\",\"apiVersion\":\"admission.k8s.io/v1\",\"request\":{\"uid\":\"x\",\"userInfo\":{\"username\":\"\xff\"}}}".to_vec(),
            |e| matches!(e, ReviewError::Malformed(m) if m.contains("UTF-8") && m.contains("from index 106"))),
        (b"[]".to_vec(), |e| matches!(e, ReviewError::WrongKind(k) if k.is_empty())),
        (deep.into_bytes(), |e| matches!(e, ReviewError::Malformed(_))),
        // Nesting inside fields the webhook skips is walked without recursion: still a clean error.
        (deep_object.into_bytes(), |e| matches!(e, ReviewError::Malformed(_) | ReviewError::MissingUid)),
        (br#"{"kind":"Pod","apiVersion":"v1"}"#.to_vec(), |e| matches!(e, ReviewError::WrongKind(k) if k == "Pod")),
        (br#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1beta1","request":{"uid":"x"}}"#.to_vec(), |e| matches!(e, ReviewError::WrongVersion(v) if v == "admission.k8s.io/v1beta1")),
        (br#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1"}"#.to_vec(), |e| *e == ReviewError::MissingRequest),
        (br#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{}}"#.to_vec(), |e| *e == ReviewError::MissingUid),
    ];
    for (body, check) in cases {
        let err = review(&body, &config, &unlabelled).expect_err("bad body accepted");
        assert!(
            check(&err),
            "{:?} -> {err:?}",
            String::from_utf8_lossy(&body[..body.len().min(40)])
        );
    }
}

#[test]
fn patch_pointers_escape_slash_and_tilde() {
    // Through the webhook's own path: the annotation keys it writes hold `/`, and the keys of a Pod it extends
    // can hold `~` and `/` too; the patch must address them escaped and apply to exactly those keys.
    let mut r = fixture();
    r["request"]["object"]["metadata"]["annotations"] = json!({
        "pdp-injector.io/inject": "sidecar",
        "pdp-injector.io/profile": "cerbos,flagd",
        "x/y~z": "kept",
    });
    let out = answer(r.to_string().as_bytes(), &unlabelled);
    let resp = &out["response"];
    assert_eq!(resp["allowed"], true, "{resp}");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(resp["patch"].as_str().unwrap())
        .unwrap();
    let text = String::from_utf8(bytes.clone()).unwrap();
    assert!(
        text.contains("\"/metadata/annotations/pdp-injector.io~1status"),
        "{text}"
    );
    assert!(
        !text.contains("/metadata/annotations/pdp-injector.io/"),
        "{text}"
    );
    let patch: json_patch::Patch = serde_json::from_slice(&bytes).unwrap();
    let mut pod = r["request"]["object"].clone();
    json_patch::patch(&mut pod, &patch).unwrap();
    let annotations = pod["metadata"]["annotations"].as_object().unwrap();
    assert_eq!(annotations["x/y~z"], "kept");
    let ours: Vec<&String> = annotations
        .keys()
        .filter(|k| k.starts_with("pdp-injector.io/status"))
        .collect();
    assert!(ours.len() >= 2, "a status per profile: {ours:?}");
    for key in ours {
        let status: Value = serde_json::from_str(annotations[key].as_str().unwrap()).unwrap();
        assert!(status["profile"].is_string(), "{key}: {status}");
    }
}

#[test]
fn deep_nesting_inside_the_pod_is_a_denial_not_a_crash() {
    let mut r = fixture();
    r["request"]["object"]["metadata"]["annotations"] = json!({"x": "y"});
    let text = r.to_string().replace(
        "\"annotations\":{\"x\":\"y\"}",
        &format!(
            "\"annotations\":{{\"x\":{}1{}}}",
            "[".repeat(200_000),
            "]".repeat(200_000)
        ),
    );
    let (bytes, summary) =
        review(text.as_bytes(), &Config::builtin(), &labelled("sidecar")).unwrap();
    let out: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(out["response"]["allowed"], false);
    assert_eq!(summary.reason.code(), "invalid_object");
}

/// The answer is written by hand around the patch: every part is still JSON as a parser reads it, escapes and
/// all, with exactly the keys of an AdmissionReview response.
#[test]
fn the_written_answer_is_exact_json_for_every_outcome() {
    let uid = "u\"id\\\n\u{1}é";
    for (label, keys) in [
        (
            "enabled",
            vec!["allowed", "auditAnnotations", "patch", "patchType", "uid"],
        ),
        ("disabled", vec!["allowed", "auditAnnotations", "uid"]),
        (
            "bogus",
            vec!["allowed", "auditAnnotations", "status", "uid"],
        ),
    ] {
        let mut body = fixture();
        body["request"]["uid"] = json!(uid);
        let text = serde_json::to_vec(&body).unwrap();
        let (bytes, _) = review(&text, &Config::builtin(), &labelled(label)).unwrap();
        let out: Value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|e| panic!("{label}: {e}: {}", String::from_utf8_lossy(&bytes)));
        let resp = out["response"].as_object().unwrap();
        assert_eq!(resp["uid"], uid, "{label}");
        let mut found: Vec<&str> = resp.keys().map(String::as_str).collect();
        found.retain(|k| *k != "warnings");
        found.sort();
        assert_eq!(found, keys, "{label}");
        assert_eq!(
            out.as_object().unwrap().keys().collect::<Vec<_>>(),
            ["apiVersion", "kind", "response"]
        );
        if let Some(patch) = resp.get("patch") {
            let json = base64::engine::general_purpose::STANDARD
                .decode(patch.as_str().unwrap())
                .unwrap();
            let ops: Vec<Value> = serde_json::from_slice(&json).unwrap();
            assert!(ops.iter().all(|op| op["op"] == "add"), "{label}");
        }
    }
}
