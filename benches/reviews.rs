// Realistic AdmissionReview bodies for the benchmarks and the load script (shared with the bench/ crate's tools,
// gen-reviews and stages, through `#[path]` in bench/src/lib.rs), so every figure is measured on the same inputs.

use serde_json::{Value, json};

/// The Pod sizes every core-path figure is measured at, with their labels.
pub const SIZES: [(&str, usize); 3] = [
    ("2KiB", 2 * 1024),
    ("22KiB", 22 * 1024),
    ("80KiB", 80 * 1024),
];

/// The request classes of the load mix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Opted in by annotation (daemonset): gets a patch.
    Inject,
    /// Annotated `disabled`.
    OptedOut,
    /// Already carries the status annotation and the wiring.
    AlreadyInjected,
    /// No annotations, volumes or env: not opted in.
    Bare,
    /// An UPDATE of a Pod: not a Pod CREATE.
    Update,
}

fn container(i: usize, env_count: usize) -> Value {
    let env: Vec<Value> = (0..env_count)
        .map(|j| json!({"name": format!("SETTING_{i}_{j}"), "value": format!("value-{j}-{}", "x".repeat(24))}))
        .collect();
    json!({
        "name": format!("app-{i}"),
        "image": format!("registry.example.com/team/app-{i}:1.{i}.0"),
        "imagePullPolicy": "IfNotPresent",
        "ports": [{"containerPort": 8080 + i, "name": format!("http-{i}"), "protocol": "TCP"}],
        "env": env,
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
        "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080 + i, "scheme": "HTTP"}, "periodSeconds": 5,
            "timeoutSeconds": 1, "successThreshold": 1, "failureThreshold": 3},
        "volumeMounts": [{"name": "data", "mountPath": format!("/data/{i}")},
                          {"name": "kube-api-access", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true}],
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "securityContext": {"allowPrivilegeEscalation": false, "runAsNonRoot": true, "capabilities": {"drop": ["ALL"]}}
    })
}

/// A Pod of about `target` bytes of JSON, with `containers` app containers.
pub fn pod(target: usize, class: Class) -> Value {
    let containers = if target < 4096 { 1 } else { 3 };
    let mut env_count = 0;
    loop {
        let mut annotations = json!({"example.com/team": "payments", "example.com/revision": "42"});
        match class {
            Class::Inject | Class::Update => {
                annotations["pdp-injector.io/inject"] = json!("daemonset")
            }
            Class::OptedOut => annotations["pdp-injector.io/inject"] = json!("disabled"),
            _ => {}
        }
        let mut pod = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "payments-7d9c6b7f8d-x2x9q",
                "generateName": "payments-7d9c6b7f8d-",
                "namespace": "payments",
                "labels": {"app": "payments", "pod-template-hash": "7d9c6b7f8d", "version": "v42"},
                "annotations": annotations,
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "payments-7d9c6b7f8d",
                    "uid": "3b1b0c5e-6e4a-4b3f-9f0e-2d7c9a1b2c3d", "controller": true, "blockOwnerDeletion": true}]
            },
            "spec": {
                "containers": (0..containers).map(|i| container(i, env_count)).collect::<Vec<_>>(),
                "volumes": [{"name": "data", "emptyDir": {}},
                            {"name": "kube-api-access", "projected": {"defaultMode": 420, "sources": [
                                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}}]}}],
                "restartPolicy": "Always",
                "terminationGracePeriodSeconds": 30,
                "dnsPolicy": "ClusterFirst",
                "serviceAccountName": "payments",
                "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
                "schedulerName": "default-scheduler",
                "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}],
                "priority": 0,
                "enableServiceLinks": true,
                "preemptionPolicy": "PreemptLowerPriority"
            }
        });
        if class == Class::Bare {
            pod["metadata"]
                .as_object_mut()
                .unwrap()
                .remove("annotations");
            pod["spec"].as_object_mut().unwrap().remove("volumes");
            for c in pod["spec"]["containers"].as_array_mut().unwrap() {
                let c = c.as_object_mut().unwrap();
                c.remove("env");
                c.remove("volumeMounts");
            }
            // pad with labels to reach the size
            let labels = pod["metadata"]["labels"].as_object_mut().unwrap();
            for j in 0..env_count * containers {
                labels.insert(
                    format!("example.com/label-{j}"),
                    json!(format!("value-{j}-{}", "x".repeat(24))),
                );
            }
        }
        if serde_json::to_vec(&pod).unwrap().len() >= target || env_count > 10_000 {
            return pod;
        }
        env_count += 4;
    }
}

/// A full AdmissionReview request body for `pod`.
pub fn review(pod: &Value, class: Class) -> Vec<u8> {
    let (operation, old) = match class {
        Class::Update => ("UPDATE", pod.clone()),
        _ => ("CREATE", Value::Null),
    };
    let body = json!({
        "kind": "AdmissionReview",
        "apiVersion": "admission.k8s.io/v1",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "payments",
            "operation": operation,
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller",
                         "uid": "a3b3c3d3", "groups": ["system:serviceaccounts", "system:authenticated"]},
            "object": pod,
            "oldObject": old,
            "dryRun": false,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}
        }
    });
    serde_json::to_vec(&body).unwrap()
}

/// A review of `target` bytes for a class; the already-injected class injects first so that it carries the
/// real wiring.
pub fn body(target: usize, class: Class) -> Vec<u8> {
    let mut pod = pod(target, class);
    if class == Class::AlreadyInjected {
        pod["metadata"]["annotations"]["pdp-injector.io/inject"] = json!("daemonset");
        let typed: k8s_openapi::api::core::v1::Pod = serde_json::from_value(pod.clone()).unwrap();
        let config = pdp_core::config::Config::builtin();
        let ns = pdp_core::core::NamespaceInfo::named("payments");
        if let pdp_core::core::Outcome::Injected(done) =
            pdp_core::core::inject(&typed, &ns, &config)
        {
            json_patch::patch(&mut pod, &done.patch.to_patch()).unwrap();
        }
    }
    review(&pod, class)
}
