//! Properties of the core over generated Pods and namespaces (a seeded generator, so failures reproduce):
//! the patch applied to the input is a valid Pod (the full typed Pod is the oracle) wired as the status
//! annotation says, every input field survives, injecting twice changes nothing, what is injected meets Pod
//! Security `restricted`, and the answer never depends on the order of keys.

use k8s_openapi::api::core::v1::{Container, EnvVar, Pod, PodSpec, Volume, VolumeMount};
use pdp_core::config::{Config, restricted_violations};
use pdp_core::core::{Form, NamespaceInfo, Outcome, Reason, Status, inject, inject_as, patched};
use std::collections::BTreeMap;

/// xorshift64*: small, seeded, good enough to vary Pods.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len() as u64) as usize]
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

const ODD_VALUES: &[&str] = &[
    "plain",
    "with \"quotes\"",
    "multi\nline",
    "{\"json\": [1,2]}",
    "key: yaml\n- list",
    "~/a/b~1",
    "$(CERBOS_PDP_ADDR)/v1",
    "",
];

fn gen_pod(rng: &mut Rng) -> Pod {
    let mut annotations = BTreeMap::new();
    let mut labels = BTreeMap::new();
    labels.insert("app".to_string(), "gen".to_string());
    if rng.chance(60) {
        annotations.insert(
            "pdp-injector.io/inject".to_string(),
            rng.pick(&["sidecar", "daemonset", "central", "enabled", "disabled"])
                .to_string(),
        );
    } else if rng.chance(20) {
        labels.insert(
            "pdp-injector.io/inject".to_string(),
            rng.pick(&["sidecar", "daemonset", "central", "enabled"])
                .to_string(),
        );
    }
    if rng.chance(30) {
        annotations.insert(
            "pdp-injector.io/profile".into(),
            rng.pick(&["cerbos", "flagd", "cerbos,flagd", "flagd, cerbos"])
                .into(),
        );
    }
    for i in 0..rng.below(3) {
        annotations.insert(
            format!("example.com/odd~key/{i}"),
            rng.pick(ODD_VALUES).into(),
        );
    }
    let n = 1 + rng.below(3);
    let mut containers = Vec::new();
    for i in 0..n {
        let mut env = Vec::new();
        for j in 0..rng.below(4) {
            env.push(EnvVar {
                name: format!("VAR_{i}_{j}"),
                value: Some(rng.pick(ODD_VALUES).into()),
                value_from: None,
            });
        }
        if rng.chance(10) {
            env.push(EnvVar {
                name: "CERBOS_PDP_ADDR".into(),
                value: Some("custom:1".into()),
                value_from: None,
            });
        }
        if rng.chance(5) {
            // A user-defined host: the injected address must follow it.
            env.insert(
                0,
                EnvVar {
                    name: rng.pick(&["CERBOS_PDP_HOST", "FLAGD_HOST"]).into(),
                    value: Some("pdp.example".into()),
                    value_from: None,
                },
            );
        }
        let mounts = if rng.chance(40) {
            Some(vec![VolumeMount {
                name: "data".into(),
                mount_path: format!("/data/{i}"),
                ..Default::default()
            }])
        } else {
            None
        };
        containers.push(Container {
            name: format!("c{i}"),
            image: Some("registry.example/app:1".into()),
            env: (!env.is_empty() || rng.chance(20)).then_some(env),
            volume_mounts: mounts,
            ..Default::default()
        });
    }
    if rng.chance(25) {
        let names: Vec<String> = containers
            .iter()
            .filter(|_| rng.chance(60))
            .map(|c| c.name.clone())
            .collect();
        if !names.is_empty() {
            annotations.insert("pdp-injector.io/containers".into(), names.join(","));
        }
    }
    let init = rng.chance(30).then(|| {
        vec![Container {
            name: "init".into(),
            image: Some("registry.example/init:1".into()),
            ..Default::default()
        }]
    });
    Pod {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some("gen".into()),
            annotations: (!annotations.is_empty() || rng.chance(20)).then_some(annotations),
            labels: Some(labels),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers,
            init_containers: init,
            volumes: rng.chance(50).then(|| {
                vec![Volume {
                    name: "data".into(),
                    empty_dir: Some(Default::default()),
                    ..Default::default()
                }]
            }),
            host_network: rng.chance(5).then_some(true),
            ..Default::default()
        }),
        status: None,
    }
}

fn gen_namespace(rng: &mut Rng) -> NamespaceInfo {
    let mut ns = NamespaceInfo::named(rng.pick(&["shop", "team-a", "kube-system"]));
    if rng.chance(40) {
        ns.injection = Some(
            rng.pick(&["enabled", "sidecar", "daemonset", "central", "disabled"])
                .to_string(),
        );
    }
    if rng.chance(40) {
        ns.pss_enforce = Some(
            rng.pick(&["privileged", "baseline", "restricted"])
                .to_string(),
        );
    }
    ns
}

#[test]
fn generated_pods_hold_the_core_properties() {
    // cerbos names a central Service and flagd does not: central mode is both wired and refused.
    let config = Config::from_yaml(
        "profiles:\n  cerbos:\n    central:\n      address: cerbos.cerbos.svc.cluster.local:3593\n",
    )
    .unwrap();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut injected = 0;
    let mut seen = std::collections::BTreeSet::new();
    for case in 0..3000 {
        let pod = gen_pod(&mut rng);
        let ns = gen_namespace(&mut rng);
        let outcome = inject(&pod, &ns, &config);
        seen.insert(outcome.reason().code());

        let Outcome::Injected(done) = outcome else {
            continue;
        };
        injected += 1;
        let ctx = || format!("case {case}: {pod:?} in {ns:?}");

        // The patch applies, and what it gives parses as a whole typed Pod.
        let out = patched(&pod, &done.patch).unwrap_or_else(|e| panic!("{e}: {}", ctx()));
        let patched = serde_json::to_value(&out).unwrap();

        // Every input field survives.
        let input = serde_json::to_value(&pod).unwrap();
        if let Err(path) = crate::common::contains::contains(&patched, &input, "") {
            panic!("{path} lost: {}", ctx());
        }

        // The Pod is wired as its status annotation says: every wired container has every variable, and the
        // sidecar and volumes it names exist.
        let status: Status = serde_json::from_str(
            &out.metadata.annotations.as_ref().unwrap()["pdp-injector.io/status"],
        )
        .unwrap();
        let out_spec = out.spec.as_ref().unwrap();
        for name in &status.containers {
            let c = out_spec
                .containers
                .iter()
                .find(|c| &c.name == name)
                .unwrap();
            for var in &status.env {
                assert!(
                    c.env.iter().flatten().any(|e| &e.name == var),
                    "{name} lacks {var}: {}",
                    ctx()
                );
            }
        }
        for v in &status.volumes {
            assert!(
                out_spec.volumes.iter().flatten().any(|x| &x.name == v),
                "{}",
                ctx()
            );
        }
        if let Some(sidecar) = &status.sidecar {
            assert!(
                out_spec
                    .containers
                    .iter()
                    .chain(out_spec.init_containers.iter().flatten())
                    .any(|c| &c.name == sidecar),
                "{}",
                ctx()
            );
        }

        // Idempotent: the output injected again yields nothing to do.
        match inject(&out, &ns, &config) {
            Outcome::Skipped {
                reason: Reason::AlreadyInjected,
                ..
            } => {}
            other => panic!("second pass gave {:?}: {}", other.reason(), ctx()),
        }

        // Safe output: injected containers meet restricted, and the only hostPath is the socket dir.
        let spec = out_spec;
        let original: Vec<&str> = pod
            .spec
            .as_ref()
            .unwrap()
            .containers
            .iter()
            .chain(pod.spec.as_ref().unwrap().init_containers.iter().flatten())
            .map(|c| c.name.as_str())
            .collect();
        for c in spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
        {
            if original.contains(&c.name.as_str()) {
                continue;
            }
            let sc = c
                .security_context
                .as_ref()
                .expect("injected container has a securityContext");
            assert!(restricted_violations(sc).is_empty(), "{}", ctx());
        }
        for v in spec.volumes.iter().flatten() {
            if let Some(hp) = &v.host_path {
                assert_eq!(v.name, "pdp-injector-socket");
                assert!(
                    hp.path == "/var/run/cerbos" || hp.path == "/var/run/flagd",
                    "{}",
                    ctx()
                );
                assert!(
                    ns.pss_enforce.as_deref().is_none_or(|l| l == "privileged"),
                    "hostPath under Pod Security {:?}: {}",
                    ns.pss_enforce,
                    ctx()
                );
            }
        }
        // Patch paths are JSON pointers into metadata or spec only.
        // The bytes the webhook answers are exactly json_patch's, and their announced length is theirs.
        let mut raw = Vec::new();
        done.patch.write_json(&mut raw);
        assert_eq!(
            raw,
            serde_json::to_vec(&done.patch.to_patch()).unwrap(),
            "{}",
            ctx()
        );
        assert_eq!(raw.len(), done.patch.json_len(), "{}", ctx());
        // A caller that applies the patch gets its values as trees: the same operations, the same bytes, and
        // applied by the core or by json_patch, the same Pod.
        let Outcome::Injected(as_trees) = inject_as(&pod, &ns, &config, Form::Apply) else {
            panic!("the form changes the outcome: {}", ctx());
        };
        let mut tree_raw = Vec::new();
        as_trees.patch.write_json(&mut tree_raw);
        assert_eq!(tree_raw, raw, "{}", ctx());
        assert_eq!(as_trees.patch.json_len(), raw.len(), "{}", ctx());
        let mut by_json_patch = serde_json::to_value(&pod).unwrap();
        json_patch::patch(&mut by_json_patch, &done.patch.to_patch()).unwrap();
        let mut by_core = serde_json::to_value(&pod).unwrap();
        as_trees.patch.apply_into(&mut by_core).unwrap();
        assert_eq!(by_core, by_json_patch, "{}", ctx());
        for op in &done.patch.0 {
            let path = op.path.as_str();
            assert!(
                path.starts_with("/metadata/") || path.starts_with("/spec/"),
                "{path}"
            );
        }
    }
    assert!(
        injected > 500,
        "only {injected} generated Pods were injected"
    );
    for code in [
        "injected_sidecar",
        "injected_daemonset",
        "injected_central",
        "no_central_address",
        "excluded_namespace",
        "opted_out",
        "not_opted_in",
    ] {
        assert!(
            seen.contains(code),
            "generator never produced {code}: {seen:?}"
        );
    }
}

#[test]
fn annotation_values_never_change_the_patch_structure() {
    // Whatever a user writes into annotation values, the patch only ever touches the same paths.
    let config = Config::builtin();
    let ns = NamespaceInfo::named("shop");
    let mut shapes = std::collections::BTreeSet::new();
    for value in ODD_VALUES {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "annotations": {
                "pdp-injector.io/inject": "daemonset",
                "note": value,
                "a/b~c": value,
            }},
            "spec": {"containers": [{"name": "app", "image": "x", "env": [{"name": "V", "value": value}]}]}
        }))
        .unwrap();
        let Outcome::Injected(done) = inject(&pod, &ns, &config) else {
            panic!("not injected for {value:?}");
        };
        let paths: Vec<String> = done
            .patch
            .0
            .iter()
            .map(|op| op.path.as_str().to_string())
            .collect();
        shapes.insert(paths);
    }
    assert_eq!(
        shapes.len(),
        1,
        "patch paths vary with annotation values: {shapes:?}"
    );
}

/// An AdmissionReview body with the request's fields in the apiserver's order (`kind` and `operation` before
/// `object`) or, with `object_first`, the object before everything else.
fn review_body(pod: &serde_json::Value, ns: &str, operation: &str, object_first: bool) -> String {
    let object = pod.to_string();
    let rest = format!(
        r#""uid":"u-1","kind":{{"group":"","version":"v1","kind":"Pod"}},"resource":{{"group":"","version":"v1","resource":"pods"}},"requestKind":{{"group":"","version":"v1","kind":"Pod"}},"name":"gen","namespace":"{ns}","operation":"{operation}","userInfo":{{"username":"system:serviceaccount:kube-system:replicaset-controller","groups":["system:serviceaccounts"]}}"#
    );
    let old = if operation == "CREATE" {
        "null".to_string()
    } else {
        object.clone()
    };
    let request = if object_first {
        format!(r#"{{"object":{object},{rest},"oldObject":{old},"dryRun":false}}"#)
    } else {
        format!(r#"{{{rest},"object":{object},"oldObject":{old},"dryRun":false}}"#)
    };
    format!(
        r#"{{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{request}}}"#
    )
}

/// Fields the core does not read, so that an answer that depended on parsing them would show.
fn with_unread_fields(pod: &Pod) -> serde_json::Value {
    let mut v = serde_json::to_value(pod).unwrap();
    v["metadata"]["ownerReferences"] = serde_json::json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "gen-1", "uid": "x", "controller": true}]);
    v["spec"]["tolerations"] =
        serde_json::json!([{"key": "k", "operator": "Exists", "effect": "NoSchedule"}]);
    for c in v["spec"]["containers"].as_array_mut().unwrap() {
        c["resources"] =
            serde_json::json!({"limits": {"memory": "128Mi"}, "requests": {"cpu": "100m"}});
        c["readinessProbe"] = serde_json::json!({"httpGet": {"path": "/ready", "port": 8080}});
        c["ports"] = serde_json::json!([{"containerPort": 8080, "name": "http"}]);
    }
    v
}

/// The same JSON with the keys of every object in reverse order.
fn reversed(v: &serde_json::Value) -> serde_json::Value {
    match v {
        serde_json::Value::Object(m) => serde_json::Value::Object(
            m.iter()
                .rev()
                .map(|(k, v)| (k.clone(), reversed(v)))
                .collect(),
        ),
        serde_json::Value::Array(a) => serde_json::Value::Array(a.iter().map(reversed).collect()),
        other => other.clone(),
    }
}

#[test]
fn review_answers_do_not_depend_on_key_order_and_match_the_core() {
    use pdp_core::admission::{encode_stage, review};
    let config = Config::builtin();
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let mut injected = 0;
    for case in 0..1500 {
        let pod = gen_pod(&mut rng);
        let ns = gen_namespace(&mut rng);
        let lookup = |name: &str| NamespaceInfo {
            name: name.to_string(),
            ..ns.clone()
        };
        // The Pod as given, and (when it gets injected) the injected Pod again and with a new container, which
        // take the already-injected and re-wiring paths.
        let mut pods = vec![pod.clone()];
        if let Outcome::Injected(done) = inject(&pod, &ns, &config) {
            injected += 1;
            let out = patched(&pod, &done.patch).unwrap();
            pods.push(out.clone());
            let mut grown = out;
            let spec = grown.spec.as_mut().unwrap();
            spec.containers.push(Container {
                name: "late".into(),
                image: Some("registry.example/late:1".into()),
                ..Default::default()
            });
            pods.push(grown);
        }
        for (i, typed) in pods.iter().enumerate() {
            let expected = inject(typed, &ns, &config);
            let core_answer: serde_json::Value =
                serde_json::from_slice(&encode_stage("u-1", &expected)).unwrap();
            let value = with_unread_fields(typed);
            let mut answers = Vec::new();
            for (object, object_first) in [
                (value.clone(), false),
                (value.clone(), true),
                (reversed(&value), false),
            ] {
                let body = review_body(&object, &ns.name, "CREATE", object_first);
                let (bytes, summary) = review(body.as_bytes(), &config, &lookup).unwrap();
                assert_eq!(
                    summary.reason,
                    expected.reason(),
                    "case {case}/{i}: {value}"
                );
                // The whole answer, not only its reason: allowed, patch, warnings, denial message.
                let got: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
                assert_eq!(
                    got, core_answer,
                    "case {case}/{i}: the answer differs from the core's outcome: {value}"
                );
                answers.push(bytes);
            }
            assert!(
                answers.windows(2).all(|w| w[0] == w[1]),
                "case {case}/{i}: the answer depends on key order: {value}"
            );
            let body = review_body(&value, &ns.name, "UPDATE", false);
            let (_, summary) = review(body.as_bytes(), &config, &lookup).unwrap();
            assert_eq!(summary.reason, Reason::NotAPodCreate, "case {case}/{i}");
        }
    }
    assert!(
        injected > 200,
        "only {injected} generated Pods were injected"
    );
}

#[test]
fn review_reads_only_what_it_needs_whatever_the_order() {
    // The apiserver validates the whole object after the webhooks; the webhook reads what it decides and renders
    // from. A malformed field it does not read does not change the answer, wherever it stands.
    use pdp_core::admission::review;
    let config = Config::builtin();
    let lookup = |name: &str| NamespaceInfo::named(name);
    for pod in [
        serde_json::json!({
            "metadata": {"name": "p", "annotations": {"pdp-injector.io/inject": "daemonset"}},
            "spec": {"containers": [{"name": "app", "image": "x", "resources": "not an object"}]}
        }),
        serde_json::json!({
            "spec": {"containers": [{"resources": "not an object", "image": "x", "name": "app"}]},
            "metadata": {"annotations": {"pdp-injector.io/inject": "daemonset"}, "name": "p"}
        }),
    ] {
        for object_first in [false, true] {
            let body = review_body(&pod, "shop", "CREATE", object_first);
            let (_, summary) = review(body.as_bytes(), &config, &lookup).unwrap();
            assert_eq!(summary.reason, Reason::InjectedDaemonset, "{pod}");
        }
    }
    // A field it reads that is malformed gets a precise denial.
    let pod = serde_json::json!({
        "metadata": {"name": "p", "annotations": {"pdp-injector.io/inject": "daemonset"}},
        "spec": {"containers": [{"name": "app", "volumeMounts": [{"name": 5}]}]}
    });
    let body = review_body(&pod, "shop", "CREATE", false);
    let (bytes, summary) = review(body.as_bytes(), &config, &lookup).unwrap();
    assert_eq!(summary.reason, Reason::InvalidObject);
    let text = String::from_utf8_lossy(&bytes);
    assert!(text.contains("not a valid v1 Pod"), "{text}");
    assert!(text.contains("volumeMounts"), "{text}");
    // An object whose read fields are not of the Pod's shape: denied in a Pod CREATE, not read in anything else.
    let odd = serde_json::json!({"metadata": {"name": "p"}, "spec": {"containers": "not a list"}});
    let (bytes, summary) = review(
        review_body(&odd, "shop", "CREATE", true).as_bytes(),
        &config,
        &lookup,
    )
    .unwrap();
    assert_eq!(summary.reason, Reason::InvalidObject);
    assert!(String::from_utf8_lossy(&bytes).contains("containers"));
    let (_, summary) = review(
        review_body(&odd, "shop", "UPDATE", true).as_bytes(),
        &config,
        &lookup,
    )
    .unwrap();
    assert_eq!(summary.reason, Reason::NotAPodCreate);
    // Duplicate keys are refused wherever they stand, not resolved by position.
    let body = review_body(&pod, "shop", "CREATE", false).replacen(
        r#""namespace":"shop""#,
        r#""namespace":"shop","namespace":"other""#,
        1,
    );
    assert!(review(body.as_bytes(), &config, &lookup).is_err());
}

#[test]
fn review_keeps_an_app_value_of_a_fixed_profile_variable() {
    // appEnv variables (the shipped flagd-in-process profile's FLAGD_RESOLVER) are injected like the address: a
    // container that defines one keeps its value, with a warning.
    use base64::Engine;
    use pdp_core::admission::review;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = Config::load(&root.join("manifests/overlays/daemonset/config.yaml")).unwrap();
    let pod = serde_json::json!({
        "metadata": {"name": "p", "annotations": {
            "pdp-injector.io/inject": "daemonset", "pdp-injector.io/profile": "flagd-in-process"}},
        "spec": {"containers": [{"name": "app", "image": "x",
            "env": [{"name": "FLAGD_RESOLVER", "value": "rpc"}, {"name": "FLAGD_SYNC_PORT", "value": "9"}]}]}
    });
    let body = review_body(&pod, "shop", "CREATE", false);
    let lookup = |name: &str| NamespaceInfo::named(name);
    let (bytes, summary) = review(body.as_bytes(), &config, &lookup).unwrap();
    assert_eq!(summary.reason, Reason::InjectedDaemonset);
    assert!(summary.warnings >= 1);
    let out: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    let patch = base64::engine::general_purpose::STANDARD
        .decode(out["response"]["patch"].as_str().unwrap())
        .unwrap();
    let patch: json_patch::Patch = serde_json::from_slice(&patch).unwrap();
    let typed: Pod = serde_json::from_value(pod).unwrap();
    let mut doc = serde_json::to_value(&typed).unwrap();
    json_patch::patch(&mut doc, &patch).unwrap();
    let stored: Pod = serde_json::from_value(doc).unwrap();
    let env = stored.spec.unwrap().containers[0].env.clone().unwrap();
    let resolver: Vec<_> = env.iter().filter(|e| e.name == "FLAGD_RESOLVER").collect();
    assert_eq!(resolver.len(), 1, "{env:?}");
    assert_eq!(resolver[0].value.as_deref(), Some("rpc"));
    assert!(
        out["response"]["warnings"]
            .to_string()
            .contains("FLAGD_RESOLVER")
    );
}
