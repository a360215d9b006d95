//! `check --pre` on fixtures: a cluster every model can run on, then each finding and what it stops.

use super::*;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Pod, Service};
use serde_json::{Value, json};

fn from<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).unwrap()
}

fn strings(v: &[&str]) -> Option<Vec<String>> {
    Some(v.iter().map(|s| s.to_string()).collect())
}

/// A 1.33 cluster with every API, two nodes, one opted-in restricted namespace, the built-in PriorityClasses.
pub(crate) fn ready() -> PreView {
    PreView {
        version: ("1".into(), "33".into(), "v1.33.1".into()),
        admission_v1: Ok(strings(&[
            "mutatingwebhookconfigurations",
            "validatingwebhookconfigurations",
            "validatingadmissionpolicies",
            "validatingadmissionpolicybindings",
        ])),
        storage_v1: Ok(strings(&["csidrivers", "csinodes", "storageclasses"])),
        namespaces: Ok(vec![
            from(json!({"metadata": {"name": "shop", "labels": {
                "pdp-injector.io/injection": "enabled",
                "pod-security.kubernetes.io/enforce": "restricted"}}})),
            from(json!({"metadata": {"name": "default"}})),
        ]),
        targets: Vec::new(),
        nodes: Ok(vec![
            from(json!({"metadata": {"name": "a"}})),
            from(json!({"metadata": {"name": "b"}})),
        ]),
        port_claims: Ok(Vec::new()),
        priority_classes: Ok(vec![
            from(json!({"metadata": {"name": "system-node-critical"}, "value": 2000001000})),
            from(json!({"metadata": {"name": "system-cluster-critical"}, "value": 2000000000})),
        ]),
        quotas: Ok(Vec::new()),
        kubelet_dir: DEFAULT_KUBELET_DIR.into(),
        models: MODELS.to_vec(),
    }
}

fn codes(r: &Report) -> Vec<&str> {
    r.sections
        .iter()
        .flat_map(|s| &s.findings)
        .map(|f| f.code.as_str())
        .collect()
}

pub(crate) fn find<'r>(r: &'r Report, code: &str) -> &'r super::super::report::Finding {
    r.sections
        .iter()
        .flat_map(|s| &s.findings)
        .find(|f| f.code == code)
        .unwrap_or_else(|| panic!("no {code} in {}", r.to_text(false)))
}

fn verdict<'r>(r: &'r Report, model: &str) -> &'r super::super::report::Finding {
    let s = r.sections.iter().find(|s| s.name == "models").unwrap();
    s.findings
        .iter()
        .find(|f| f.subject == format!("model {model}"))
        .unwrap()
}

fn node_with(kubelet: &str, labels: Value) -> Node {
    from(json!({"metadata": {"name": "k", "labels": labels},
        "status": {"nodeInfo": {"kubeletVersion": kubelet, "architecture": "", "bootID": "", "containerRuntimeVersion": "",
        "kernelVersion": "", "kubeProxyVersion": "", "machineID": "", "operatingSystem": "", "osImage": "", "systemUUID": ""}}}))
}

fn quota(ns: &str, hard: Value, used: Value) -> ResourceQuota {
    from(
        json!({"metadata": {"name": "q", "namespace": ns}, "spec": {"hard": hard}, "status": {"used": used}}),
    )
}

type Change = Box<dyn Fn(&mut PreView)>;

fn none() -> Change {
    Box::new(|_| {})
}

/// Each `check --pre` code, its severity, and the change to [`ready`] that produces it, with the models it
/// stops (empty: none).
pub(crate) fn every_pre_code() -> Vec<(&'static str, Severity, Change, &'static [&'static str])> {
    const ALL: &[&str] = &["central", "daemonset", "sidecar"];
    const DS: &[&str] = &["daemonset"];
    vec![
        ("admission_api", Severity::Ok, none(), &[]),
        (
            "admission_api_missing",
            Severity::Error,
            Box::new(|v| v.admission_v1 = Ok(None)),
            ALL,
        ),
        ("admission_policies", Severity::Ok, none(), &[]),
        (
            "admission_policies_skipped",
            Severity::Info,
            Box::new(|v| v.version = ("1".into(), "20".into(), "v1.20.2".into())),
            &[],
        ),
        (
            "admission_policy_api_missing",
            Severity::Error,
            Box::new(|v| v.admission_v1 = Ok(strings(&["mutatingwebhookconfigurations"]))),
            ALL,
        ),
        ("critical_priority", Severity::Ok, none(), &[]),
        (
            "critical_priority_missing",
            Severity::Error,
            Box::new(|v| {
                if let Ok(c) = v.priority_classes.as_mut() {
                    c.retain(|c| c.metadata.name.as_deref() != Some(NODE_PRIORITY_CLASS));
                }
            }),
            DS,
        ),
        (
            "critical_priority_quota_short",
            Severity::Error,
            Box::new(|v| {
                v.nodes = Ok((0..1001)
                    .map(|i| from(json!({"metadata": {"name": format!("n{i}")}})))
                    .collect())
            }),
            DS,
        ),
        ("csi_api", Severity::Ok, none(), &[]),
        (
            "csi_api_missing",
            Severity::Error,
            Box::new(|v| v.storage_v1 = Ok(strings(&["storageclasses"]))),
            DS,
        ),
        (
            "kubelet_dir",
            Severity::Ok,
            Box::new(|v| v.nodes = Ok(vec![node_with("v1.33.1+k3s1", json!({}))])),
            &[],
        ),
        (
            "kubelet_dir_differs",
            Severity::Error,
            Box::new(|v| v.nodes = Ok(vec![node_with("v1.33.1+k0s", json!({}))])),
            DS,
        ),
        ("kubelet_dir_unknown", Severity::Info, none(), &[]),
        (
            "kubernetes_too_old",
            Severity::Error,
            Box::new(|v| v.version = ("1".into(), "19".into(), "v1.19.16".into())),
            ALL,
        ),
        ("kubernetes_version", Severity::Ok, none(), &[]),
        ("model_can_run", Severity::Ok, none(), &[]),
        (
            "model_cannot_run",
            Severity::Error,
            Box::new(|v| v.admission_v1 = Ok(None)),
            ALL,
        ),
        ("namespace_pod_security", Severity::Ok, none(), &[]),
        (
            "no_namespaces_to_opt_in",
            Severity::Info,
            Box::new(|v| v.namespaces = Ok(Vec::new())),
            &[],
        ),
        (
            "node_port_taken",
            Severity::Error,
            Box::new(|v| {
                v.port_claims = Ok(vec![PortClaim {
                    subject: "Pod mon/agent".into(),
                    port: 3593,
                    how: "hostPort",
                    node: Some("a".into()),
                }])
            }),
            DS,
        ),
        ("node_ports_free", Severity::Ok, none(), &[]),
        (
            "pre_read_failed",
            Severity::Error,
            Box::new(|v| v.port_claims = Err("forbidden".into())),
            DS,
        ),
        (
            "priority_class_exists",
            Severity::Info,
            Box::new(|v| {
                if let Ok(c) = v.priority_classes.as_mut() {
                    c.push(from(json!({"metadata": {"name": WEBHOOK_PRIORITY_CLASS,
                        "annotations": {"meta.helm.sh/release-name": "pdp"}}, "value": 999000000})));
                }
            }),
            &[],
        ),
        (
            "priority_class_taken",
            Severity::Error,
            Box::new(|v| {
                if let Ok(c) = v.priority_classes.as_mut() {
                    c.push(from(
                        json!({"metadata": {"name": WEBHOOK_PRIORITY_CLASS}, "value": 1}),
                    ));
                }
            }),
            ALL,
        ),
        (
            "quota_limits_install",
            Severity::Warning,
            Box::new(|v| {
                v.quotas = Ok(vec![quota(
                    "pdp-system",
                    json!({"requests.cpu": "4"}),
                    json!({}),
                )])
            }),
            &[],
        ),
        (
            "quota_too_small",
            Severity::Error,
            Box::new(|v| {
                v.quotas = Ok(vec![quota(
                    "pdp-node",
                    json!({"pods": "10"}),
                    json!({"pods": "5"}),
                )])
            }),
            DS,
        ),
    ]
}

#[test]
fn every_pre_code_stops_the_models_it_names_and_no_other() {
    for (code, severity, change, stops) in every_pre_code() {
        let mut v = ready();
        change(&mut v);
        let r = pre_report(&v);
        assert_eq!(
            find(&r, code).severity,
            severity,
            "{code}: {}",
            r.to_text(false)
        );
        for m in MODELS {
            let stopped = stops.contains(&m.as_str());
            let f = verdict(&r, m.as_str());
            assert_eq!(
                f.code == "model_cannot_run",
                stopped,
                "{code} and {m}: {}",
                r.to_text(false)
            );
            if stopped && code != "model_cannot_run" {
                assert!(
                    f.message.contains(&format!("[{code}]")),
                    "{code}: {}",
                    f.message
                );
            }
        }
        assert_eq!(
            r.exit_code() == 1,
            !stops.is_empty(),
            "{code}: {}",
            r.to_text(false)
        );
    }
}

#[test]
fn a_ready_cluster_runs_every_model_and_exits_zero() {
    let r = pre_report(&ready());
    assert_eq!(r.exit_code(), 0, "{}", r.to_text(false));
    for m in MODELS {
        assert_eq!(verdict(&r, m.as_str()).code, "model_can_run");
    }
    let ns = find(&r, "namespace_pod_security");
    assert_eq!(ns.subject, "namespace shop");
    assert!(
        ns.message.contains("restricted") && ns.message.contains("CSI volume"),
        "{}",
        ns.message
    );
    assert!(!codes(&r).contains(&"node_port_taken"));
}

#[test]
fn what_stops_only_a_model_not_asked_about_is_a_warning() {
    let mut v = ready();
    v.models = vec![Mode::Central];
    v.port_claims = Ok(vec![PortClaim {
        subject: "Service mon/agent".into(),
        port: 3592,
        how: "nodePort",
        node: None,
    }]);
    let r = pre_report(&v);
    assert_eq!(r.exit_code(), 0, "{}", r.to_text(false));
    assert_eq!(find(&r, "node_port_taken").severity, Severity::Warning);
    let ds = verdict(&r, "daemonset");
    assert_eq!(
        (ds.code.as_str(), ds.severity),
        ("model_cannot_run", Severity::Warning)
    );
    assert!(
        ds.fix.as_deref().unwrap().contains("off port 3592"),
        "{:?}",
        ds.fix
    );
    assert_eq!(verdict(&r, "central").code, "model_can_run");
}

#[test]
fn claims_are_read_from_pods_daemonsets_and_services_but_not_the_projects_own() {
    let mut out = Vec::new();
    let pod: Pod = from(json!({"metadata": {"name": "p", "namespace": "mon"},
        "spec": {"nodeName": "a", "containers": [{"name": "c", "ports": [{"containerPort": 80, "hostPort": 3593}, {"containerPort": 3592}]}]}}));
    pod_claims(&pod, &mut out);
    let host_net: Pod = from(json!({"metadata": {"name": "h", "namespace": "mon"},
        "spec": {"hostNetwork": true, "containers": [{"name": "c", "ports": [{"containerPort": 3592}]}]}}));
    pod_claims(&host_net, &mut out);
    let of_ds: Pod = from(json!({"metadata": {"name": "d", "namespace": "mon",
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "x", "uid": "u"}]},
        "spec": {"containers": [{"name": "c", "ports": [{"containerPort": 1, "hostPort": 3593}]}]}}));
    pod_claims(&of_ds, &mut out);
    let ds: DaemonSet = from(
        json!({"metadata": {"name": "x", "namespace": "mon"}, "spec": {"selector": {},
        "template": {"spec": {"containers": [{"name": "c", "ports": [{"containerPort": 1, "hostPort": 3593}]}]}}}}),
    );
    daemonset_claims(&ds, &mut out);
    let front: DaemonSet = from(
        json!({"metadata": {"name": "pdp-node-front", "namespace": "pdp-node",
        "labels": {"app.kubernetes.io/part-of": "pdp-injector"}}, "spec": {"selector": {},
        "template": {"spec": {"containers": [{"name": "c", "ports": [{"containerPort": 3593, "hostPort": 3593}]}]}}}}),
    );
    daemonset_claims(&front, &mut out);
    let svc: Service = from(json!({"metadata": {"name": "s", "namespace": "mon"},
        "spec": {"type": "NodePort", "ports": [{"port": 80, "nodePort": 3592}, {"port": 81, "nodePort": 30001}]}}));
    service_claims(&svc, &mut out);
    let seen: Vec<(&str, i32, &str)> = out
        .iter()
        .map(|c| (c.subject.as_str(), c.port, c.how))
        .collect();
    assert_eq!(
        seen,
        [
            ("Pod mon/p", 3593, "hostPort"),
            ("Pod mon/h", 3592, "containerPort with hostNetwork"),
            ("DaemonSet mon/x", 3593, "hostPort"),
            ("Service mon/s", 3592, "nodePort"),
        ]
    );
    assert_eq!(out[0].node.as_deref(), Some("a"));
}

#[test]
fn named_namespaces_are_judged_and_a_missing_one_is_said() {
    let mut v = ready();
    v.targets = vec!["default".into(), "gone".into()];
    let r = pre_report(&v);
    let ns = find(&r, "namespace_pod_security");
    assert_eq!(ns.subject, "namespace default");
    assert!(
        ns.message.contains("the config's default"),
        "{}",
        ns.message
    );
    assert_eq!(find(&r, "namespace_not_found").subject, "namespace gone");
    assert!(!r.to_text(false).contains("namespace shop"));
}

#[test]
fn a_kubelet_root_flag_that_matches_the_node_clears_the_finding() {
    let mut v = ready();
    v.nodes = Ok(vec![node_with("v1.30.4+k0s", json!({}))]);
    let r = pre_report(&v);
    assert!(
        find(&r, "kubelet_dir_differs")
            .fix
            .as_deref()
            .unwrap()
            .contains("kubeletDir=/var/lib/k0s/kubelet")
    );
    v.kubelet_dir = "/var/lib/k0s/kubelet/".into();
    let r = pre_report(&v);
    assert_eq!(find(&r, "kubelet_dir").severity, Severity::Ok);
    assert_eq!(r.exit_code(), 0, "{}", r.to_text(false));
}

#[test]
fn the_projects_own_quota_and_a_roomy_one_stop_nothing() {
    let mut v = ready();
    v.quotas = Ok(vec![
        quota("pdp-node", json!({"pods": "3k"}), json!({"pods": "0"})),
        from(json!({"metadata": {"name": "ours", "namespace": "pdp-node",
            "labels": {"app.kubernetes.io/part-of": "pdp-injector"}}, "spec": {"hard": {"pods": "1"}}})),
    ]);
    let r = pre_report(&v);
    assert_eq!(r.exit_code(), 0, "{}", r.to_text(false));
    assert_eq!(
        find(&r, "quota_limits_install").subject,
        "ResourceQuota pdp-node/q"
    );
}
