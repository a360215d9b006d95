//! The judging on fixtures: a cluster in order, then each way it can be out of order.

use std::collections::BTreeSet;

use k8s_openapi::api::admissionregistration::v1::{MutatingWebhook, MutatingWebhookConfiguration};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::CSINode;
use serde_json::{Value, json};

use super::*;
use crate::check::workloads::Owners;
use crate::core::{self, NamespaceInfo, Outcome};
use crate::names::{CSI_DRIVER, LABEL_NAMESPACE_INJECTION};
use crate::pki as tlsgen;

const NOW: i64 = 1_900_000_000;

fn from<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).unwrap()
}

/// The shipped configuration, registered with a caBundle.
fn registered(ca_pem: &str) -> MutatingWebhookConfiguration {
    let text = include_str!(
        "../../../../../manifests/overlays/daemonset/webhook/mutatingwebhookconfiguration.yaml"
    );
    let mut v: Value = serde_saphyr::from_str(text).unwrap();
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    for w in v["webhooks"].as_array_mut().unwrap() {
        w["clientConfig"]["caBundle"] = json!(b64);
    }
    from(v)
}

fn namespace(name: &str, labels: Value) -> Namespace {
    from(json!({"metadata": {"name": name, "labels": labels}}))
}

fn ready_pod(v: Value) -> Pod {
    let mut p: Value = v;
    p["status"] = json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]});
    from(p)
}

fn node(name: &str) -> Node {
    from(json!({"metadata": {"name": name}}))
}

fn pdp_pod(node: &str, revision: &str) -> Pod {
    ready_pod(
        json!({"metadata": {"name": format!("cerbos-pdp-{node}"), "namespace": "pdp-node",
        "labels": {"controller-revision-hash": revision},
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "cerbos-pdp", "uid": "d", "controller": true}]},
        "spec": {"nodeName": node, "containers": [{"name": "cerbos"}]}}),
    )
}

/// A Pod of Deployment `web` (through ReplicaSet web-1), as the webhook would store it in `ns`.
fn app_pod(name: &str, ns: &NamespaceInfo, node: &str, config: &Config) -> Pod {
    let p: Pod = from(json!({"metadata": {"name": name, "namespace": ns.name,
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-1", "uid": "r", "controller": true}]},
        "spec": {"nodeName": node, "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.9"}]}}));
    let mut p = match core::inject(&p, ns, config) {
        Outcome::Injected(i) => core::patched(&p, &i.patch).expect("the core's patch applies"),
        _ => p,
    };
    p.status = ready_pod(json!({})).status;
    p
}

/// A cluster in order: the shipped webhook configuration, trusted certificate, ready Deployment, one
/// opted-in namespace whose Pods are wired, a PDP on every node.
fn in_order() -> ClusterView {
    let bundle =
        tlsgen::generate(&tlsgen::service_sans("pdp-injector", "pdp-system"), 365, 90).unwrap();
    let config = Config::builtin();
    let shop = NamespaceInfo::from_labels(
        "shop",
        &BTreeMap::from([(LABEL_NAMESPACE_INJECTION.to_string(), "enabled".to_string())]),
    );
    let mut owners = Owners::default();
    owners.record(
        "ReplicaSet",
        &from(json!({"name": "web-1", "namespace": "shop",
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": "x", "controller": true}]})),
    );
    ClusterView {
        names: Names::default(),
        scope: None,
        now: time::OffsetDateTime::now_utc().unix_timestamp(),
        native_sidecars: true,
        csi_driver: Ok(false),
        csi_nodes: Ok(Vec::new()),
        config: Some(ConfigSource::Installed(Ok(Some(String::new())))),
        webhook: Ok(Some(registered(&bundle.ca_cert_pem))),
        serving_cert: Ok(Some(bundle.cert_pem.clone().into_bytes())),
        live: None,
        deployment: Ok(Some(from(
            json!({"metadata": {"name": "pdp-injector", "namespace": "pdp-system"},
            "spec": {"replicas": 2, "selector": {}, "template": {}}, "status": {"readyReplicas": 2}}),
        ))),
        namespaces: Ok(vec![
            namespace("kube-system", json!({})),
            namespace("pdp-system", json!({})),
            namespace("shop", json!({LABEL_NAMESPACE_INJECTION: "enabled"})),
            namespace("plain", json!({})),
        ]),
        pods: Ok(vec![
            app_pod("web-1-a", &shop, "n1", &config),
            app_pod("web-1-b", &shop, "n2", &config),
        ]),
        owners,
        nodes: Ok(vec![node("n1"), node("n2")]),
        daemonsets: Ok(vec![from(
            json!({"metadata": {"name": "cerbos-pdp", "namespace": "pdp-node",
            "labels": {"app.kubernetes.io/component": "pdp"}},
            "spec": {"selector": {}, "template": {"spec": {"containers": []}}}}),
        )]),
        pdp_pods: Ok(vec![pdp_pod("n1", "v2"), pdp_pod("n2", "v2")]),
        revisions: Ok(vec![
            from(
                json!({"metadata": {"name": "r1", "namespace": "pdp-node", "labels": {"controller-revision-hash": "v1"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "cerbos-pdp", "uid": "d", "controller": true}]}, "revision": 1}),
            ),
            from(
                json!({"metadata": {"name": "r2", "namespace": "pdp-node", "labels": {"controller-revision-hash": "v2"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "cerbos-pdp", "uid": "d", "controller": true}]}, "revision": 2}),
            ),
        ]),
        flag_sync: None,
    }
}

fn codes(r: &Report, severity: Severity) -> Vec<String> {
    r.sections
        .iter()
        .flat_map(|s| &s.findings)
        .filter(|f| f.severity == severity)
        .map(|f| f.code.clone())
        .collect()
}

fn find<'a>(r: &'a Report, code: &str) -> &'a Finding {
    r.sections
        .iter()
        .flat_map(|s| &s.findings)
        .find(|f| f.code == code)
        .unwrap_or_else(|| panic!("no {code} in {}", r.to_text(false)))
}

#[test]
fn a_cluster_in_order_reports_nothing_to_do() {
    let r = analyse(&in_order());
    assert!(r.ok, "{}", r.to_text(false));
    assert_eq!(r.exit_code(), 0);
    assert!(
        codes(&r, Severity::Warning).is_empty(),
        "{}",
        r.to_text(false)
    );
    for code in [
        "config_loaded",
        "webhook_registered",
        "serving_cert_trusted",
        "webhook_ready",
        "pdp_daemonset",
        "namespace_opted_in",
    ] {
        find(&r, code);
    }
    assert!(
        find(&r, "namespace_opted_in")
            .message
            .contains("socket is dropped")
    );
}

#[test]
fn every_valid_namespace_label_is_judged_as_the_webhook_decides() {
    // check's judgement of the label is the core's: central is a mode, not an error; a bad value is one.
    for (value, error) in [
        ("central", false),
        ("sidecar", false),
        ("daemonset", false),
        ("enabled", false),
        ("disabled", false),
        ("centrall", true),
    ] {
        let mut v = in_order();
        if let Ok(all) = v.namespaces.as_mut() {
            all.push(namespace(
                "moving",
                json!({LABEL_NAMESPACE_INJECTION: value}),
            ));
        }
        let r = analyse(&v);
        let errors = codes(&r, Severity::Error);
        assert_eq!(
            errors.contains(&"invalid_namespace_label".to_string()),
            error,
            "{value}: {}",
            r.to_text(false)
        );
        if error {
            assert!(r.to_text(false).contains("central"), "{}", r.to_text(false));
        }
    }
}

#[test]
fn missing_webhook_and_no_ready_replica_need_action() {
    let mut v = in_order();
    v.webhook = Ok(None);
    v.deployment = Ok(Some(from(
        json!({"metadata": {"name": "pdp-injector"}, "spec": {"replicas": 2, "selector": {}, "template": {}}}),
    )));
    let r = analyse(&v);
    assert_eq!(r.exit_code(), 1);
    let errors = codes(&r, Severity::Error);
    assert!(
        errors.contains(&"webhook_missing".into()) && errors.contains(&"webhook_not_ready".into()),
        "{errors:?}"
    );
    // Without a webhook configuration, the wired Pods are still in order; nothing selects new ones.
    assert!(!errors.contains(&"not_wired".into()));
}

#[test]
fn untrusted_or_expiring_certificates() {
    let mut v = in_order();
    let other =
        tlsgen::generate(&tlsgen::service_sans("pdp-injector", "pdp-system"), 365, 10).unwrap();
    v.serving_cert = Ok(Some(other.cert_pem.into_bytes()));
    let r = analyse(&v);
    assert!(
        find(&r, "serving_cert_untrusted")
            .message
            .contains("pdp-injector.pdp-system.svc")
    );
    // A 10-day certificate: in order with 10 days left, late below a quarter, an error below a tenth.
    assert_eq!(find(&r, "certificate_expiry").severity, Severity::Ok);
    v.now += 8 * DAY;
    assert_eq!(
        find(&analyse(&v), "certificate_expiry").severity,
        Severity::Warning
    );
    v.now += DAY + DAY / 2;
    assert_eq!(
        find(&analyse(&v), "certificate_expiry").severity,
        Severity::Error
    );
    v.now += DAY;
    assert!(
        find(&analyse(&v), "certificate_expiry")
            .message
            .starts_with("expired")
    );
    // A 90-day certificate with 20 days left: late (renewal at 30), a warning.
    let mut w = in_order();
    w.now += 70 * DAY;
    assert_eq!(
        find(&analyse(&w), "certificate_expiry").severity,
        Severity::Warning
    );
    v.live = Some(LiveProbe::Untrusted {
        endpoint: "a:443".into(),
        error: "UnknownIssuer".into(),
    });
    assert_eq!(
        find(&analyse(&v), "endpoint_untrusted").severity,
        Severity::Error
    );
    v.live = Some(LiveProbe::Unreachable {
        endpoint: "a:443".into(),
        error: "cannot resolve".into(),
    });
    assert_eq!(
        find(&analyse(&v), "endpoint_unreachable").severity,
        Severity::Info
    );
    let _ = NOW;
}

#[test]
fn webhook_entry_that_reaches_kube_system_is_an_error() {
    let mut v = in_order();
    if let Ok(Some(m)) = v.webhook.as_mut() {
        m.webhooks.as_mut().unwrap()[1].namespace_selector = None;
        m.webhooks.as_mut().unwrap()[0].failure_policy = Some("Ignore".into());
    }
    let r = analyse(&v);
    let msgs: Vec<&str> = r.sections[0]
        .findings
        .iter()
        .filter(|f| f.code == "webhook_entry_differs")
        .map(|f| f.message.as_str())
        .collect();
    assert_eq!(msgs.len(), 2, "{}", r.to_text(false));
    assert!(
        msgs.iter()
            .any(|m| m.contains("failurePolicy Ignore (manifests: Fail)"))
    );
    assert!(
        msgs.iter()
            .any(|m| m.contains("selects namespace kube-system") && m.contains("pdp-system"))
    );
}

#[test]
fn nodes_without_pdp_and_outdated_pdp() {
    let mut v = in_order();
    v.pdp_pods = Ok(vec![pdp_pod("n1", "v1")]);
    v.nodes.as_mut().unwrap().push(node("n3"));
    let r = analyse(&v);
    let missing: Vec<&Finding> = r.sections[1]
        .findings
        .iter()
        .filter(|f| f.code == "node_without_pdp")
        .collect();
    assert_eq!(missing.len(), 2, "{}", r.to_text(false));
    assert_eq!(missing[0].subject, "node n2");
    assert_eq!(missing[0].pods, vec!["shop/web-1-b".to_string()]);
    assert!(missing[1].message.contains("would have no PDP"));
    assert_eq!(find(&r, "pdp_outdated").severity, Severity::Warning);
    // No DaemonSet at all.
    v.daemonsets = Ok(vec![]);
    assert_eq!(
        find(&analyse(&v), "pdp_daemonset_missing").severity,
        Severity::Error
    );
    // No profile in daemonset mode: no node is judged.
    let mut v = in_order();
    v.pods = Ok(vec![]);
    v.namespaces = Ok(vec![namespace(
        "shop",
        json!({LABEL_NAMESPACE_INJECTION: "sidecar"}),
    )]);
    v.daemonsets = Ok(vec![]);
    let r = analyse(&v);
    assert_eq!(r.sections[1].summary, "no profile in daemonset mode");
    assert!(r.ok, "{}", r.to_text(false));
}

/// The node front's DaemonSet (revisions f1 and f2, f2 current) beside the PDP's, a ready front Pod at `revision`
/// on each node.
fn with_front(v: &mut ClusterView, revision: &str) {
    let owner = json!([{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "pdp-node-front", "uid": "f", "controller": true}]);
    v.daemonsets.as_mut().unwrap().push(from(
        json!({"metadata": {"name": "pdp-node-front", "namespace": "pdp-node",
        "labels": {"app.kubernetes.io/component": "pdp-front"}},
        "spec": {"selector": {}, "template": {"spec": {"containers": []}}}}),
    ));
    for (n, hash) in [(1, "f1"), (2, "f2")] {
        v.revisions.as_mut().unwrap().push(from(json!({"metadata": {"name": format!("front-r{n}"),
            "namespace": "pdp-node", "labels": {"controller-revision-hash": hash}, "ownerReferences": owner},
            "revision": n})));
    }
    for node in ["n1", "n2"] {
        v.pdp_pods.as_mut().unwrap().push(ready_pod(
            json!({"metadata": {"name": format!("pdp-node-front-{node}"), "namespace": "pdp-node",
            "labels": {"controller-revision-hash": revision}, "ownerReferences": owner},
            "spec": {"nodeName": node, "containers": [{"name": "front"}]}}),
        ));
    }
}

#[test]
fn a_node_without_its_front_is_a_node_without_its_pdp() {
    let mut v = in_order();
    with_front(&mut v, "f2");
    // Every node has both: in order, and the front is reported beside the PDP.
    let r = analyse(&v);
    assert!(r.ok, "{}", r.to_text(false));
    assert!(
        find(&r, "pdp_front")
            .message
            .contains("ready front on 2 nodes")
    );
    // n2 lost its front: its wired Pod cannot reach the PDP, though the PDP runs there.
    v.pdp_pods.as_mut().unwrap().pop();
    let r = analyse(&v);
    assert!(!r.ok);
    let f = find(&r, "node_without_front");
    assert_eq!(f.severity, Severity::Error);
    assert_eq!(f.subject, "node n2");
    assert_eq!(f.pods, vec!["shop/web-1-b".to_string()]);
    assert!(f.message.contains("no pdp-node-front Pod"), "{}", f.message);
    assert!(
        !r.sections[1]
            .findings
            .iter()
            .any(|f| f.code == "node_without_pdp")
    );
}

#[test]
fn namespaces_invalid_unselected_and_privileged() {
    let mut v = in_order();
    v.namespaces.as_mut().unwrap().extend([
        namespace("typo", json!({LABEL_NAMESPACE_INJECTION: "enable"})),
        namespace("ds", json!({LABEL_NAMESPACE_INJECTION: "daemonset", "pod-security.kubernetes.io/enforce": "privileged"})),
    ]);
    if let Ok(Some(m)) = v.webhook.as_mut() {
        m.webhooks.as_mut().unwrap()[0].namespace_selector =
            Some(from(json!({"matchLabels": {"only": "this"}})));
    }
    let r = analyse(&v);
    assert_eq!(
        find(&r, "invalid_namespace_label").subject,
        "namespace typo"
    );
    assert_eq!(
        r.sections[2]
            .findings
            .iter()
            .filter(|f| f.code == "namespace_not_selected")
            .count(),
        2
    );
    let ds = r.sections[2]
        .findings
        .iter()
        .find(|f| f.subject == "namespace ds" && f.code == "namespace_opted_in")
        .unwrap();
    assert!(
        ds.message.contains("with the node's socket"),
        "{}",
        ds.message
    );
}

#[test]
fn pods_grouped_by_workload_with_the_fix() {
    let mut v = in_order();
    // The config changed since the Pods were wired: both Pods of web are stale, one finding.
    v.config = Some(ConfigSource::Installed(Ok(Some(
        "excludedNamespaces: [other]\n".into(),
    ))));
    // A plain Pod in a namespace that opted in after it existed, and a finished one (skipped).
    let late: Pod = ready_pod(
        json!({"metadata": {"name": "solo", "namespace": "shop"}, "spec": {"containers": [{"name": "a"}]}}),
    );
    let mut done = late.clone();
    done.metadata.name = Some("finished".into());
    done.status.as_mut().unwrap().phase = Some("Succeeded".into());
    v.pods.as_mut().unwrap().extend([late, done]);
    let r = analyse(&v);
    let stale = find(&r, "stale_config");
    assert_eq!(stale.subject, "Deployment shop/web");
    assert_eq!(
        stale.pods,
        vec!["shop/web-1-a".to_string(), "shop/web-1-b".to_string()]
    );
    assert_eq!(
        stale.fix.as_deref(),
        Some("kubectl rollout restart deployment/web -n shop")
    );
    let not_wired = find(&r, "not_wired");
    assert_eq!(not_wired.subject, "Pod shop/solo");
    assert!(
        !not_wired.message.contains("no entry"),
        "{}",
        not_wired.message
    );
    assert_eq!(
        r.sections[3].summary,
        "3 Pods compared, 1 finished or terminating skipped"
    );
    assert_eq!(r.exit_code(), 1);
}

#[test]
fn annotation_opt_in_that_no_entry_selects() {
    let mut v = in_order();
    // The label-selected overlay: outside opted-in namespaces only labelled Pods reach the webhook.
    if let Ok(Some(m)) = v.webhook.as_mut() {
        m.webhooks.as_mut().unwrap()[1].object_selector = Some(from(
            json!({"matchExpressions": [{"key": "pdp-injector.io/inject", "operator": "Exists"}]}),
        ));
    }
    let p = ready_pod(json!({"metadata": {"name": "a", "namespace": "plain",
        "annotations": {"pdp-injector.io/inject": "sidecar"}}, "spec": {"containers": [{"name": "a"}]}}));
    v.pods = Ok(vec![p]);
    let f = analyse(&v).sections[3].findings[0].clone();
    assert_eq!(f.code, "not_wired");
    assert!(
        f.message
            .contains("no entry of the webhook configuration selects it"),
        "{}",
        f.message
    );
    assert!(f.fix.unwrap().starts_with("label the Pod template"));
}

#[test]
fn config_that_does_not_load_stops_the_pod_comparison() {
    let mut v = in_order();
    v.config = Some(ConfigSource::Installed(Ok(Some(
        "defaultMode: nope\n".into(),
    ))));
    let r = analyse(&v);
    assert!(find(&r, "config_invalid").message.contains("defaultMode"));
    assert_eq!(
        r.sections[3].summary,
        "2 Pods not compared: no usable config"
    );
    v.config = Some(ConfigSource::Installed(Ok(None)));
    let r = analyse(&v);
    assert_eq!(find(&r, "config_missing").severity, Severity::Warning);
    // What loads is the built-in config, not the ConfigMap that is not there.
    let loaded = &find(&r, "config_loaded").message;
    assert!(
        loaded.starts_with("the built-in config loads: hash "),
        "{loaded}"
    );
}

#[test]
fn classic_sidecars_change_the_hash_as_the_webhook_does() {
    let mut v = in_order();
    v.native_sidecars = false;
    let r = analyse(&v);
    let hash = Config::builtin().with_classic_sidecars().hash;
    assert!(find(&r, "config_loaded").message.contains(&hash));
    // Pods wired on a native-sidecar config are stale against it.
    assert_eq!(find(&r, "stale_config").pods.len(), 2);
}

/// A Job's Pod in namespace batch, wired in the classic form, whose app ended `ago` seconds before `now`.
fn classic_job_pod(now: i64, name: &str, ago: i64) -> Pod {
    let classic = Config::builtin().with_classic_sidecars();
    let ns = NamespaceInfo::named("batch");
    let p: Pod = from(
        json!({"metadata": {"name": name, "namespace": "batch", "annotations": {"pdp-injector.io/inject": "sidecar"}},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "app", "image": "i"}]}}),
    );
    let Outcome::Injected(i) = core::inject(&p, &ns, &classic) else {
        panic!("not injected")
    };
    let mut p = core::patched(&p, &i.patch).unwrap();
    let ended = time::OffsetDateTime::from_unix_timestamp(now - ago).unwrap();
    let ended = format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        ended.year(),
        u8::from(ended.month()),
        ended.day(),
        ended.hour(),
        ended.minute(),
        ended.second()
    );
    p.status = Some(from(json!({"phase": "Running", "containerStatuses": [
        {"name": "cerbos-pdp", "state": {"running": {}}, "ready": true, "restartCount": 0, "image": "c", "imageID": ""},
        {"name": "app", "state": {"terminated": {"exitCode": 0, "finishedAt": ended}}, "ready": false,
         "restartCount": 0, "image": "i", "imageID": ""}]})));
    p
}

#[test]
fn a_classic_sidecar_still_running_long_after_its_job_ended_is_said() {
    let mut v = in_order();
    v.native_sidecars = false;
    v.pods.as_mut().unwrap().extend([
        classic_job_pod(v.now, "stuck", 300),
        // Ended a moment ago: the watch container has not had its few seconds yet.
        classic_job_pod(v.now, "just-ended", 5),
    ]);
    let r = analyse(&v);
    let f = find(&r, "classic_sidecar_not_stopped");
    assert_eq!(f.pods, vec!["batch/stuck".to_string()]);
    assert_eq!(f.severity, Severity::Error);
    assert!(f.message.contains("app: exit 0"), "{}", f.message);
    assert!(
        f.fix
            .as_deref()
            .unwrap()
            .contains("pdp-injector-watch-cerbos-pdp")
    );
}

#[test]
fn a_namespace_in_scope_that_does_not_exist_is_said() {
    let mut v = in_order();
    v.scope = Some("shpo".into());
    let r = analyse(&v);
    assert_eq!(find(&r, "namespace_not_found").subject, "namespace shpo");
    v.scope = Some("shop".into());
    assert!(analyse(&v).ok);
}

#[test]
fn endpoints_from_url_and_service() {
    let w = |cc: Value| -> MutatingWebhook {
        from(
            json!({"name": "x", "admissionReviewVersions": ["v1"], "sideEffects": "None", "clientConfig": cc}),
        )
    };
    assert_eq!(
        endpoint(&w(json!({"url": "https://127.0.0.1:8443/mutate"}))),
        Some(("127.0.0.1".into(), "127.0.0.1:8443".into()))
    );
    assert_eq!(
        endpoint(&w(json!({"url": "https://hook.example/mutate"}))),
        Some(("hook.example".into(), "hook.example:443".into()))
    );
    assert_eq!(
        endpoint(&w(json!({"url": "https://[::1]:9443/m"}))),
        Some(("::1".into(), "[::1]:9443".into()))
    );
    assert_eq!(
        endpoint(&w(
            json!({"service": {"name": "pdp-injector", "namespace": "pdp-system", "port": 443}})
        )),
        Some((
            "pdp-injector.pdp-system.svc".into(),
            "pdp-injector.pdp-system.svc:443".into()
        ))
    );
    assert_eq!(endpoint(&w(json!({"url": "http://plain/"}))), None);
}

#[test]
fn with_the_csi_driver_a_node_without_the_plugin_is_an_error_and_older_pods_are_stale() {
    let csi_node = |name: &str, drivers: Value| -> CSINode {
        from(json!({"metadata": {"name": name}, "spec": {"drivers": drivers}}))
    };
    let mut v = in_order();
    // Without the driver nothing is asked of the nodes' CSINodes.
    v.csi_nodes = Err("forbidden".into());
    assert!(analyse(&v).ok);
    // The driver exists: the config's hash is the one the webhook writes then, and Pods wired before are stale.
    v.csi_driver = Ok(true);
    v.csi_nodes = Ok(vec![
        csi_node("n1", json!([{"name": CSI_DRIVER, "nodeID": "n1"}])),
        csi_node("n2", json!([{"name": "other.csi.example", "nodeID": "n2"}])),
    ]);
    let r = analyse(&v);
    let hash = Config::builtin().with_csi_driver(true).hash;
    assert!(find(&r, "config_loaded").message.contains(&hash));
    assert_eq!(find(&r, "stale_config").pods.len(), 2);
    let f = find(&r, "node_without_csi_driver");
    assert_eq!(
        (f.severity, f.subject.as_str()),
        (Severity::Error, "node n2")
    );
    assert_eq!(f.pods, vec!["shop/web-1-b".to_string()]);
    assert!(
        f.message
            .ends_with("(cerbos) stays in ContainerCreating on this node"),
        "{}",
        f.message
    );
    assert_eq!(
        r.sections[1]
            .findings
            .iter()
            .filter(|f| f.code == "node_without_csi_driver")
            .count(),
        1
    );
    // An unreadable CSINode list is said, not guessed.
    v.csi_nodes = Err("forbidden".into());
    assert_eq!(
        find(&analyse(&v), "csi_nodes_unreadable").severity,
        Severity::Warning
    );
}

/// Sets the caBundle of every entry of the registered webhook configuration (None: removes it).
fn set_ca_bundle(v: &mut ClusterView, bundle: Option<&[u8]>) {
    if let Ok(Some(m)) = v.webhook.as_mut() {
        for w in m.webhooks.as_mut().unwrap() {
            w.client_config.ca_bundle = bundle.map(|b| k8s_openapi::ByteString(b.to_vec()));
        }
    }
}

fn with_ready_replicas(v: &mut ClusterView, ready: i32) {
    v.deployment = Ok(Some(from(
        json!({"metadata": {"name": "pdp-injector", "namespace": "pdp-system"},
        "spec": {"replicas": 2, "selector": {}, "template": {}}, "status": {"readyReplicas": ready}}),
    )));
}

/// Each finding code, the change to a cluster in order that produces it, and its severity there. Every code of
/// [`Code::ALL`] has a row (checked below), so a new code comes with the fixture that produces it.
#[allow(clippy::type_complexity)]
fn every_code() -> Vec<(&'static str, Severity, Box<dyn Fn(&mut ClusterView)>)> {
    let installed = |text: &str| {
        let text = text.to_string();
        Box::new(move |v: &mut ClusterView| {
            v.config = Some(ConfigSource::Installed(Ok(Some(text.clone()))))
        }) as Box<dyn Fn(&mut ClusterView)>
    };
    let labelled = |value: &'static str| {
        Box::new(move |v: &mut ClusterView| {
            v.namespaces.as_mut().unwrap().push(namespace(
                "other",
                json!({LABEL_NAMESPACE_INJECTION: value}),
            ))
        }) as Box<dyn Fn(&mut ClusterView)>
    };
    let live = |probe: fn() -> LiveProbe| {
        Box::new(move |v: &mut ClusterView| v.live = Some(probe())) as Box<dyn Fn(&mut ClusterView)>
    };
    let none = || Box::new(|_: &mut ClusterView| {}) as Box<dyn Fn(&mut ClusterView)>;
    vec![
        (
            "ca_bundle_invalid",
            Severity::Error,
            Box::new(|v| set_ca_bundle(v, Some(b"not a certificate"))),
        ),
        (
            "ca_bundle_missing",
            Severity::Error,
            Box::new(|v| set_ca_bundle(v, None)),
        ),
        ("certificate_expiry", Severity::Ok, none()),
        (
            "classic_sidecar_not_stopped",
            Severity::Error,
            Box::new(|v| {
                v.native_sidecars = false;
                let stuck = classic_job_pod(v.now, "stuck", 300);
                v.pods.as_mut().unwrap().push(stuck);
            }),
        ),
        (
            "config_invalid",
            Severity::Error,
            installed("defaultMode: nope\n"),
        ),
        ("config_loaded", Severity::Ok, none()),
        (
            "config_missing",
            Severity::Warning,
            Box::new(|v| v.config = Some(ConfigSource::Installed(Ok(None)))),
        ),
        (
            "config_unreadable",
            Severity::Error,
            Box::new(|v| v.config = Some(ConfigSource::Installed(Err("forbidden".into())))),
        ),
        (
            "deployment_missing",
            Severity::Error,
            Box::new(|v| v.deployment = Ok(None)),
        ),
        (
            "deployment_unreadable",
            Severity::Error,
            Box::new(|v| v.deployment = Err("forbidden".into())),
        ),
        (
            "endpoint_trusted",
            Severity::Ok,
            live(|| LiveProbe::Verified {
                endpoint: "a:443".into(),
                validity: None,
            }),
        ),
        (
            "endpoint_unreachable",
            Severity::Info,
            live(|| LiveProbe::Unreachable {
                endpoint: "a:443".into(),
                error: "refused".into(),
            }),
        ),
        (
            "endpoint_untrusted",
            Severity::Error,
            live(|| LiveProbe::Untrusted {
                endpoint: "a:443".into(),
                error: "UnknownIssuer".into(),
            }),
        ),
        (
            "flag_relay_behind",
            Severity::Warning,
            Box::new(|v| with_relays(v, Ok(3), Ok(2))),
        ),
        (
            "flag_relays_current",
            Severity::Ok,
            Box::new(|v| with_relays(v, Ok(3), Ok(3))),
        ),
        (
            "flag_sync_unreadable",
            Severity::Warning,
            Box::new(|v| with_relays(v, Ok(3), Err("no answer within 5 s".into()))),
        ),
        (
            "front_outdated",
            Severity::Warning,
            Box::new(|v| with_front(v, "f1")),
        ),
        (
            "invalid_namespace_label",
            Severity::Error,
            labelled("centrall"),
        ),
        (
            "namespace_excluded",
            Severity::Warning,
            installed("excludedNamespaces: [shop]\n"),
        ),
        (
            "namespace_not_found",
            Severity::Warning,
            Box::new(|v| v.scope = Some("shpo".into())),
        ),
        (
            "namespace_not_selected",
            Severity::Error,
            Box::new(|v| {
                if let Ok(Some(m)) = v.webhook.as_mut() {
                    m.webhooks.as_mut().unwrap()[0].namespace_selector =
                        Some(from(json!({"matchLabels": {"only": "this"}})));
                }
            }),
        ),
        ("namespace_opted_in", Severity::Ok, none()),
        ("namespace_opted_out", Severity::Info, labelled("disabled")),
        (
            "namespaces_unreadable",
            Severity::Error,
            Box::new(|v| v.namespaces = Err("forbidden".into())),
        ),
        (
            "csi_nodes_unreadable",
            Severity::Warning,
            Box::new(|v| {
                v.csi_driver = Ok(true);
                v.csi_nodes = Err("forbidden".into());
            }),
        ),
        (
            "node_without_csi_driver",
            Severity::Error,
            Box::new(|v| {
                v.csi_driver = Ok(true);
                v.csi_nodes = Ok(vec![from(
                    json!({"metadata": {"name": "n1"}, "spec": {"drivers": []}}),
                )]);
            }),
        ),
        (
            "node_without_front",
            Severity::Error,
            Box::new(|v| {
                with_front(v, "f2");
                v.pdp_pods.as_mut().unwrap().pop();
            }),
        ),
        (
            "node_without_pdp",
            Severity::Error,
            Box::new(|v| v.pdp_pods = Ok(vec![pdp_pod("n1", "v2")])),
        ),
        (
            "nodes_unreadable",
            Severity::Error,
            Box::new(|v| v.nodes = Err("forbidden".into())),
        ),
        ("pdp_daemonset", Severity::Ok, none()),
        (
            "pdp_daemonset_missing",
            Severity::Error,
            Box::new(|v| v.daemonsets = Ok(vec![])),
        ),
        ("pdp_front", Severity::Ok, Box::new(|v| with_front(v, "f2"))),
        (
            "pdp_outdated",
            Severity::Warning,
            Box::new(|v| v.pdp_pods = Ok(vec![pdp_pod("n1", "v1"), pdp_pod("n2", "v2")])),
        ),
        (
            "pdp_unreadable",
            Severity::Error,
            Box::new(|v| v.daemonsets = Err("forbidden".into())),
        ),
        (
            "pods_unreadable",
            Severity::Error,
            Box::new(|v| v.pods = Err("forbidden".into())),
        ),
        (
            "serving_cert_invalid",
            Severity::Error,
            Box::new(|v| v.serving_cert = Ok(Some(b"not a certificate".to_vec()))),
        ),
        ("serving_cert_trusted", Severity::Ok, none()),
        (
            "serving_cert_untrusted",
            Severity::Error,
            Box::new(|v| {
                let other =
                    tlsgen::generate(&tlsgen::service_sans("pdp-injector", "pdp-system"), 365, 90)
                        .unwrap();
                v.serving_cert = Ok(Some(other.cert_pem.into_bytes()));
            }),
        ),
        (
            "serving_secret_missing",
            Severity::Warning,
            Box::new(|v| v.serving_cert = Ok(None)),
        ),
        (
            "serving_secret_unreadable",
            Severity::Info,
            Box::new(|v| v.serving_cert = Err("forbidden".into())),
        ),
        (
            "webhook_degraded",
            Severity::Warning,
            Box::new(|v| with_ready_replicas(v, 1)),
        ),
        (
            "webhook_entry_differs",
            Severity::Error,
            Box::new(|v| {
                if let Ok(Some(m)) = v.webhook.as_mut() {
                    m.webhooks.as_mut().unwrap()[0].failure_policy = Some("Ignore".into());
                }
            }),
        ),
        (
            "webhook_entry_missing",
            Severity::Error,
            Box::new(|v| {
                if let Ok(Some(m)) = v.webhook.as_mut() {
                    m.webhooks.as_mut().unwrap().remove(1);
                }
            }),
        ),
        (
            "webhook_missing",
            Severity::Error,
            Box::new(|v| v.webhook = Ok(None)),
        ),
        (
            "webhook_not_ready",
            Severity::Error,
            Box::new(|v| with_ready_replicas(v, 0)),
        ),
        ("webhook_ready", Severity::Ok, none()),
        ("webhook_registered", Severity::Ok, none()),
        (
            "webhook_unreadable",
            Severity::Error,
            Box::new(|v| v.webhook = Err("forbidden".into())),
        ),
    ]
}

/// A flag sync source at `source` and one relay on n1 at `relay`.
fn with_relays(v: &mut ClusterView, source: Read<u64>, relay: Read<u64>) {
    v.flag_sync = Some(FlagSyncView {
        source_name: "pdp-system/pdp-flag-sync".into(),
        source,
        relays: Ok(vec![RelayGeneration {
            node: "n1".into(),
            pod: "pdp-flag-relay-a".into(),
            generation: relay,
        }]),
    });
}

#[test]
fn every_finding_code_is_produced_by_its_fixture() {
    let table = every_code();
    // `check --pre`'s codes have their rows beside its own fixture.
    let pre = crate::check::pre::tests::every_pre_code();
    let names = table.iter().map(|(code, ..)| *code);
    let rows: BTreeSet<&str> = names.chain(pre.iter().map(|(code, ..)| *code)).collect();
    let all: BTreeSet<&str> = Code::ALL.iter().map(|c| c.code()).collect();
    assert_eq!(rows, all, "the tables and FindingCode::ALL differ");
    assert_eq!(rows.len(), table.len() + pre.len(), "a code has two rows");
    for (code, severity, change, _) in &pre {
        let mut v = crate::check::pre::tests::ready();
        change(&mut v);
        let r = crate::check::pre::pre_report(&v);
        assert_eq!(
            crate::check::pre::tests::find(&r, code).severity,
            *severity,
            "{code}"
        );
    }
    for (code, severity, change) in &table {
        let mut v = in_order();
        change(&mut v);
        let r = analyse(&v);
        let f = find(&r, code);
        assert_eq!(f.severity, *severity, "{code}: {}", r.to_text(false));
        // A fault is reported as one: exit status 1 with any error.
        assert_eq!(
            r.exit_code() == 1,
            !codes(&r, Severity::Error).is_empty(),
            "{code}: {}",
            r.to_text(false)
        );
    }
}

#[test]
fn a_missing_or_invalid_ca_bundle_or_secret_and_a_missing_entry_are_said_precisely() {
    let mut v = in_order();
    set_ca_bundle(&mut v, None);
    let r = analyse(&v);
    assert_eq!(r.exit_code(), 1);
    assert!(
        find(&r, "ca_bundle_missing")
            .message
            .contains("cannot trust")
    );
    // Without a caBundle the Secret's certificate cannot be judged trusted.
    assert!(!r.to_text(false).contains("serving_cert_trusted"));

    let mut v = in_order();
    set_ca_bundle(
        &mut v,
        Some(b"-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n"),
    );
    let r = analyse(&v);
    assert_eq!(find(&r, "ca_bundle_invalid").subject, "caBundle");
    assert_eq!(r.exit_code(), 1);

    let mut v = in_order();
    let second = ENTRIES[1].0;
    if let Ok(Some(m)) = v.webhook.as_mut() {
        m.webhooks.as_mut().unwrap().retain(|w| w.name != second);
    }
    let r = analyse(&v);
    let f = find(&r, "webhook_entry_missing");
    assert!(f.message.contains(second), "{}", f.message);
    assert!(f.fix.is_some());
    assert!(!r.to_text(false).contains("webhook_registered"));

    let mut v = in_order();
    v.serving_cert = Ok(None);
    let r = analyse(&v);
    let f = find(&r, "serving_secret_missing");
    assert_eq!(f.subject, "Secret pdp-system/pdp-injector-tls");
    // The live endpoint verified by the caBundle makes the missing Secret a note, not a warning.
    v.live = Some(LiveProbe::Verified {
        endpoint: "a:443".into(),
        validity: None,
    });
    assert_eq!(
        find(&analyse(&v), "serving_secret_missing").severity,
        Severity::Info
    );
}

#[test]
fn a_relay_behind_its_source_is_named_with_both_generations() {
    let relay = |node: &str, generation: Read<u64>| RelayGeneration {
        node: node.into(),
        pod: format!("pdp-flag-relay-{node}"),
        generation,
    };
    let mut view = in_order();
    let with = |source: Read<u64>, relays: Read<Vec<RelayGeneration>>| FlagSyncView {
        source_name: "pdp-system/pdp-flag-sync".into(),
        source,
        relays,
    };
    view.flag_sync = Some(with(
        Ok(7),
        Ok(vec![relay("n1", Ok(7)), relay("n2", Ok(7))]),
    ));
    let r = analyse(&view);
    assert!(
        find(&r, "flag_relays_current")
            .message
            .contains("2 node relays at the source's generation 7")
    );
    assert!(!codes(&r, Severity::Warning).contains(&"flag_relay_behind".to_string()));

    view.flag_sync = Some(with(
        Ok(9),
        Ok(vec![
            relay("n1", Ok(9)),
            relay("n2", Ok(7)),
            relay("n3", Err("no answer".into())),
        ]),
    ));
    let r = analyse(&view);
    let behind = find(&r, "flag_relay_behind");
    assert_eq!(behind.severity, Severity::Warning);
    assert!(
        behind.subject.contains("n2")
            && behind.message.contains("generation 7")
            && behind.message.contains("at 9"),
        "{behind:?}"
    );
    assert!(find(&r, "flag_sync_unreadable").subject.contains("n3"));
    assert!(!codes(&r, Severity::Ok).contains(&"flag_relays_current".to_string()));

    view.flag_sync = Some(with(Err("forbidden".into()), Ok(vec![relay("n1", Ok(1))])));
    let r = analyse(&view);
    assert!(
        find(&r, "flag_sync_unreadable")
            .message
            .contains("forbidden")
    );
    view.flag_sync = None;
    let r = analyse(&view);
    assert!(
        r.sections
            .iter()
            .flat_map(|s| &s.findings)
            .all(|f| !f.code.starts_with("flag_"))
    );
}
