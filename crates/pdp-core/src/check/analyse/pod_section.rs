//! The Pods section: Pods whose wiring differs from what the webhook would do now, by workload.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Pod;

use crate::check::analyse::install::selects_pods_on_create;
use crate::check::analyse::{
    CLASSIC_STOP_GRACE, CLASSIC_STOP_GRACE_ON_FAILURE, ENTRIES, ended_before, is_done, plural,
    pod_name,
};
use crate::check::codes::FindingCode as Code;
use crate::check::pods::Drift;
use crate::check::report::{Finding, Section, Severity};
use crate::check::workloads::Workload;
use crate::check::{ClusterView, classic_sidecars, pods, selectors, workloads};
use crate::config::{Config, Mode};
use crate::core::NamespaceInfo;
use crate::names::WATCH_PREFIX;

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

/// What the Pods showed, judged one at a time as they are read (a page at a time), so that memory holds the
/// findings and the tallies and never the cluster's Pods: for 150,000 Pods a list would take gigabytes.
#[derive(Debug, Default)]
pub struct PodTally {
    /// Pods seen.
    seen: usize,
    /// Pods compared with what the webhook would do now.
    compared: usize,
    /// Pods finished or terminating, not compared.
    done: usize,
    /// Pods that differ, by drift and workload: their names, the first one's detail, and whether no entry of
    /// the webhook configuration selects them.
    groups: BTreeMap<(Drift, Workload), (Vec<String>, String, bool)>,
    /// Pods whose classic sidecar outlived its apps: name and what ended.
    unstopped: Vec<(String, String)>,
    /// Profiles of daemonset-wired Pods.
    pub(super) daemonset_profiles: BTreeSet<String>,
    /// The daemonset-wired Pods of each (profile, node).
    pub(super) wired_on: BTreeMap<(String, String), Vec<String>>,
    /// Why the Pods could not be listed.
    failed: Option<String>,
}

impl PodTally {
    /// Judges one Pod: `config` is the webhook's in this cluster (`None`: none usable, Pods are only counted),
    /// `labels` the namespaces' labels.
    pub(super) fn add(
        &mut self,
        view: &ClusterView,
        config: Option<&Config>,
        labels: &BTreeMap<String, BTreeMap<String, String>>,
        pod: &Pod,
    ) {
        self.seen += 1;
        if is_done(pod) {
            self.done += 1;
            return;
        }
        if let Some(s) = pods::status_of(pod).filter(|s| s.mode == Mode::Daemonset) {
            self.daemonset_profiles.insert(s.profile.clone());
            if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) {
                self.wired_on
                    .entry((s.profile, node))
                    .or_default()
                    .push(pod_name(pod));
            }
        }
        let Some(config) = config else {
            return;
        };
        self.compared += 1;
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
            self.unstopped.push((pod_name(pod), apps));
        }
        let ns_name = pod.metadata.namespace.as_deref().unwrap_or_default();
        let empty = BTreeMap::new();
        let ns_labels = labels.get(ns_name).unwrap_or(&empty);
        let info = NamespaceInfo::from_labels(ns_name, ns_labels);
        let Some(d) = pods::compare(pod, &info, config) else {
            return;
        };
        let unselected = d.drift == Drift::NotWired && !selected(view, ns_labels, pod);
        let w = workloads::workload_of(pod, &view.owners);
        let entry = self
            .groups
            .entry((d.drift, w))
            .or_insert_with(|| (Vec::new(), d.detail.clone(), false));
        entry.0.push(pod.metadata.name.clone().unwrap_or_default());
        entry.2 |= unselected;
    }

    /// The Pods could not be listed (or a later page could not be read).
    pub(super) fn failed(&mut self, why: String) {
        self.failed = Some(why);
    }
}

/// Pods whose wiring differs from what the webhook would do now, by workload.
pub(super) fn pods_section(tally: PodTally, config: bool, section: &mut Section) {
    if let Some(e) = &tally.failed {
        section.push(Finding::new(
            Severity::Error,
            Code::PodsUnreadable,
            "pods",
            format!("cannot list Pods: {e}"),
        ));
        return;
    }
    if !config {
        section.summary = format!(
            "{} not compared: no usable config",
            plural(tally.seen, "Pod")
        );
        return;
    }
    for ((drift, w), (names, detail, unselected)) in tally.groups {
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
    let unstopped = tally.unstopped;
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
        plural(tally.compared, "Pod"),
        if tally.done > 0 {
            format!(", {} finished or terminating skipped", tally.done)
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
