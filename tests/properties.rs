//! Properties of the core over generated Pods and namespaces (a seeded generator, so failures reproduce):
//! injecting twice changes nothing, the patch applied to the input gives the rendered Pod, every input field
//! survives, and what is injected meets Pod Security `restricted`.

use k8s_openapi::api::core::v1::{Container, EnvVar, Pod, PodSpec, Volume, VolumeMount};
use pdp_injector::config::{Config, restricted_violations};
use pdp_injector::core::decide::PodHead;
use pdp_injector::core::{NamespaceInfo, Reason, decide};
use pdp_injector::core::{Outcome, inject};
use std::collections::BTreeMap;

mod common {
    include!("common/contains.rs");
}

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

        // The webhook decides from the Pod's head: it must reach the same decision as from the whole Pod.
        let head: PodHead = serde_json::from_value(serde_json::to_value(&pod).unwrap()).unwrap();
        assert_eq!(
            decide(&head.to_pod(), &ns, &config),
            decide(&pod, &ns, &config),
            "case {case}"
        );
        if let Outcome::Injected(done) = &outcome {
            let head: PodHead =
                serde_json::from_value(serde_json::to_value(&done.pod).unwrap()).unwrap();
            assert_eq!(
                decide(&head.to_pod(), &ns, &config),
                decide(&done.pod, &ns, &config),
                "case {case}, injected"
            );
        }
        let Outcome::Injected(done) = outcome else {
            continue;
        };
        injected += 1;
        let ctx = || format!("case {case}: {pod:?} in {ns:?}");

        // The patch applied to the input is exactly the rendered Pod.
        let mut patched = serde_json::to_value(&pod).unwrap();
        json_patch::patch(&mut patched, &done.patch).unwrap_or_else(|e| panic!("{e}: {}", ctx()));
        assert_eq!(
            patched,
            serde_json::to_value(&done.pod).unwrap(),
            "{}",
            ctx()
        );

        // Every input field survives.
        let input = serde_json::to_value(&pod).unwrap();
        if let Err(path) = common::contains(&patched, &input, "") {
            panic!("{path} lost: {}", ctx());
        }

        // Idempotent: the output injected again yields nothing to do.
        match inject(&done.pod, &ns, &config) {
            Outcome::Skipped {
                reason: Reason::AlreadyInjected,
                ..
            } => {}
            other => panic!("second pass gave {:?}: {}", other.reason(), ctx()),
        }

        // Safe output: injected containers meet restricted, and the only hostPath is the socket dir.
        let spec = done.pod.spec.as_ref().unwrap();
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
        for op in &done.patch.0 {
            let v = serde_json::to_value(op).unwrap();
            let path = v["path"].as_str().unwrap();
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
            .map(|op| {
                serde_json::to_value(op).unwrap()["path"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
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

/// Fields the one-pass decoder skips, so that the reference path (which parses them) has something to lose.
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

#[test]
fn one_pass_review_answers_exactly_like_the_reference() {
    use pdp_injector::admission::{review, review_reference};
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
        let mut pods = vec![with_unread_fields(&pod)];
        if let Outcome::Injected(done) = inject(&pod, &ns, &config) {
            injected += 1;
            pods.push(with_unread_fields(&done.pod));
            let mut grown = done.pod.clone();
            let spec = grown.spec.as_mut().unwrap();
            spec.containers.push(Container {
                name: "late".into(),
                image: Some("registry.example/late:1".into()),
                ..Default::default()
            });
            pods.push(with_unread_fields(&grown));
        }
        for (i, value) in pods.iter().enumerate() {
            for (operation, object_first) in
                [("CREATE", false), ("CREATE", true), ("UPDATE", false)]
            {
                let body = review_body(value, &ns.name, operation, object_first);
                let fast = review(body.as_bytes(), &config, &lookup).unwrap();
                let reference = review_reference(body.as_bytes(), &config, &lookup).unwrap();
                assert_eq!(
                    String::from_utf8_lossy(&fast.0),
                    String::from_utf8_lossy(&reference.0),
                    "case {case}/{i} {operation} object_first={object_first}: {value}"
                );
                assert_eq!(fast.1, reference.1, "case {case}/{i}");
            }
        }
    }
    assert!(
        injected > 200,
        "only {injected} generated Pods were injected"
    );
}

#[test]
fn one_pass_review_reads_only_what_it_needs() {
    // The apiserver validates the whole object; the webhook reads what it decides and renders from. A field it
    // does not read is not parsed (the reference path, which parses the Pod whole, rejects this one), and the
    // answer for the fields it does read is the same.
    use pdp_injector::admission::{review, review_reference};
    let config = Config::builtin();
    let pod: serde_json::Value = serde_json::json!({
        "metadata": {"name": "p", "annotations": {"pdp-injector.io/inject": "daemonset"}},
        "spec": {"containers": [{"name": "app", "image": "x", "resources": "not an object"}]}
    });
    let body = review_body(&pod, "shop", "CREATE", false);
    let lookup = |name: &str| NamespaceInfo::named(name);
    let (_, fast) = review(body.as_bytes(), &config, &lookup).unwrap();
    assert_eq!(fast.reason, Reason::InjectedDaemonset);
    let (_, reference) = review_reference(body.as_bytes(), &config, &lookup).unwrap();
    assert_eq!(reference.reason, Reason::InvalidObject);
    // A field it reads that is malformed goes to the reference path and gets its precise denial.
    let pod = serde_json::json!({
        "metadata": {"name": "p", "annotations": {"pdp-injector.io/inject": "daemonset"}},
        "spec": {"containers": [{"name": "app", "volumeMounts": [{"name": 5}]}]}
    });
    let body = review_body(&pod, "shop", "CREATE", false);
    let (bytes, summary) = review(body.as_bytes(), &config, &lookup).unwrap();
    assert_eq!(summary.reason, Reason::InvalidObject);
    assert!(String::from_utf8_lossy(&bytes).contains("not a valid v1 Pod"));
}

#[test]
fn one_pass_review_keeps_an_app_value_of_a_fixed_profile_variable() {
    // appEnv variables (the shipped flagd-node profile's FLAGD_RESOLVER) are injected like the address: a
    // container that defines one keeps its value on the one-pass path exactly as on the reference path.
    use pdp_injector::admission::{review, review_reference};
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = Config::load(&root.join("manifests/base/config.yaml")).unwrap();
    let pod = serde_json::json!({
        "metadata": {"name": "p", "annotations": {
            "pdp-injector.io/inject": "daemonset", "pdp-injector.io/profile": "flagd-in-process"}},
        "spec": {"containers": [{"name": "app", "image": "x",
            "env": [{"name": "FLAGD_RESOLVER", "value": "rpc"}, {"name": "FLAGD_SYNC_PORT", "value": "9"}]}]}
    });
    let body = review_body(&pod, "shop", "CREATE", false);
    let lookup = |name: &str| NamespaceInfo::named(name);
    let fast = review(body.as_bytes(), &config, &lookup).unwrap();
    let reference = review_reference(body.as_bytes(), &config, &lookup).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&fast.0),
        String::from_utf8_lossy(&reference.0)
    );
    assert_eq!(fast.1, reference.1);
}
