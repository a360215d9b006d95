//! The Pods section: Pods whose wiring differs from what the webhook would do now, by workload.

use super::*;

pub(super) fn in_scope(view: &ClusterView, namespace: Option<&str>) -> bool {
    match &view.scope {
        None => true,
        Some(s) => namespace == Some(s.as_str()),
    }
}

/// Whether some entry of the webhook configuration sends this Pod's CREATE to the webhook.
pub(super) fn selected(
    view: &ClusterView,
    ns_labels: &BTreeMap<String, String>,
    pod: &Pod,
) -> bool {
    let Ok(Some(mwc)) = &view.webhook else {
        return false;
    };
    let pod_labels = pod.metadata.labels.clone().unwrap_or_default();
    mwc.webhooks
        .iter()
        .flatten()
        .filter(|w| ENTRIES.iter().any(|(n, _)| *n == w.name))
        .any(|w| {
            selects_pods_on_create(w)
                && selectors::matches(w.namespace_selector.as_ref(), ns_labels)
                && selectors::matches(w.object_selector.as_ref(), &pod_labels)
        })
}

/// Pods whose wiring differs from what the webhook would do now, by workload.
pub(super) fn pods_section(
    view: &ClusterView,
    config: Option<&Config>,
    all: &[Namespace],
    section: &mut Section,
) {
    let pods = match &view.pods {
        Err(e) => {
            section.push(Finding::new(
                Severity::Error,
                Code::PodsUnreadable,
                "pods",
                format!("cannot list Pods: {e}"),
            ));
            return;
        }
        Ok(p) => p,
    };
    let Some(config) = config else {
        section.summary = format!(
            "{} not compared: no usable config",
            plural(pods.len(), "Pod")
        );
        return;
    };
    let labels: BTreeMap<&str, BTreeMap<String, String>> = all
        .iter()
        .filter_map(|n| Some((n.metadata.name.as_deref()?, labels_of(n))))
        .collect();
    let mut groups: BTreeMap<(Drift, Workload), (Vec<String>, String, bool)> = BTreeMap::new();
    let (mut compared, mut done) = (0, 0);
    let mut unstopped: Vec<(String, String)> = Vec::new();
    for pod in pods {
        if is_done(pod) {
            done += 1;
            continue;
        }
        compared += 1;
        if let Some(apps) = classic_sidecars::apps_done(pod)
            && ended_before(
                pod,
                view.now
                    - match pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref()) {
                        Some("OnFailure") => CLASSIC_STOP_GRACE_ON_FAILURE,
                        _ => CLASSIC_STOP_GRACE,
                    },
            )
        {
            unstopped.push((pod_name(pod), apps));
        }
        let ns_name = pod.metadata.namespace.clone().unwrap_or_default();
        let empty = BTreeMap::new();
        let ns_labels = labels.get(ns_name.as_str()).unwrap_or(&empty);
        let info = NamespaceInfo::from_labels(&ns_name, ns_labels);
        let Some(d) = pods::compare(pod, &info, config) else {
            continue;
        };
        let unselected = d.drift == Drift::NotWired && !selected(view, ns_labels, pod);
        let w = workloads::workload_of(pod, &view.owners);
        let entry = groups
            .entry((d.drift, w))
            .or_insert_with(|| (Vec::new(), d.detail.clone(), false));
        entry.0.push(pod.metadata.name.clone().unwrap_or_default());
        entry.2 |= unselected;
    }
    for ((drift, w), (names, detail, unselected)) in groups {
        let severity = if drift == Drift::StatusUnreadable {
            Severity::Warning
        } else {
            Severity::Error
        };
        let mut message = format!(
            "{} {}: {detail}",
            plural(names.len(), "Pod"),
            drift.meaning()
        );
        let mut fix = workloads::fix(&w, &names);
        if unselected {
            message.push_str(
                "; no entry of the webhook configuration selects it, so new Pods would not be wired either",
            );
            fix = "label the Pod template pdp-injector.io/inject=<mode> (the configuration's objectSelector \
                   needs the label), then: "
                .to_string()
                + &fix;
        }
        let mut f = Finding::new(severity, drift, w.to_string(), message).fix(fix);
        f.pods = names
            .iter()
            .map(|n| format!("{}/{n}", w.namespace))
            .collect();
        section.push(f);
    }
    if let Some((first, apps)) = unstopped.first() {
        let mut f = Finding::new(
            Severity::Error,
            Code::ClassicSidecarNotStopped,
            "classic sidecars",
            format!(
                "{} whose app containers ended over {CLASSIC_STOP_GRACE} s ago ({CLASSIC_STOP_GRACE_ON_FAILURE} s under \
                 OnFailure) still {} a running PDP sidecar, \
                 so the Pod (and its Job) cannot complete ({first}: {apps}); the Pod's watch container \
                 ({WATCH_PREFIX}<PDP container>) stops it once no app process is left",
                plural(unstopped.len(), "Pod"),
                if unstopped.len() == 1 { "has" } else { "have" },
            ),
        )
        .fix(
            "read the log of the Pod's watch container (kubectl logs POD -c pdp-injector-watch-cerbos-pdp): a \
             process left in the Pod's shared process namespace (another sidecar) keeps the PDP running; under \
             OnFailure the stop comes 330 s after the apps ended",
        );
        f.pods = unstopped.into_iter().map(|(name, _)| name).collect();
        section.push(f);
    }
    section.summary = format!(
        "{} compared{}",
        plural(compared, "Pod"),
        if done > 0 {
            format!(", {done} finished or terminating skipped")
        } else {
            String::new()
        }
    );
}

pub(super) fn controlled_by(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    kind: &str,
    name: &str,
) -> bool {
    workloads::controller_of(meta).is_some_and(|(k, n)| k == kind && n == name)
}
