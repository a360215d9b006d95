//! The Nodes section: for each profile in daemonset use, the nodes without a ready PDP (or front) Pod and the
//! Pods at an older revision.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};

use crate::check::ClusterView;
use crate::check::analyse::namespaces::namespace_mode;
use crate::check::analyse::pod_section::{controlled_by, in_scope};
use crate::check::analyse::{
    FRONT_COMPONENT_LABEL, Names, PDP_COMPONENT_LABEL, PodTally, is_done, plural, pod_ready,
};
use crate::check::codes::FindingCode as Code;
use crate::check::report::{Finding, Section, Severity};
use crate::config::{Config, Mode};
use crate::names::{CSI_DRIVER, LABEL_NAMESPACE_INJECTION};

/// The PDP DaemonSet of a profile: the one named by `--pdp-daemonset`, else `<profile>-pdp` labelled as a PDP.
pub(super) fn pdp_daemonset<'a>(
    names: &Names,
    profile: &str,
    all: &'a [DaemonSet],
) -> Option<&'a DaemonSet> {
    if let Some((ns, name)) = names.pdp_daemonsets.get(profile) {
        return all.iter().find(|d| {
            d.metadata.namespace.as_ref() == Some(ns) && d.metadata.name.as_ref() == Some(name)
        });
    }
    let want = format!("{profile}-pdp");
    all.iter().find(|d| {
        d.metadata.name.as_deref() == Some(want.as_str()) && labelled(d, PDP_COMPONENT_LABEL)
    })
}

/// True when the DaemonSet carries the label `key=value`.
pub(super) fn labelled(ds: &DaemonSet, (key, value): (&str, &str)) -> bool {
    ds.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(key))
        .is_some_and(|v| v == value)
}

/// The `controller-revision-hash` of a DaemonSet's newest ControllerRevision: the revision its Pods should run.
pub(super) fn current_revision(ds: &DaemonSet, revisions: &[ControllerRevision]) -> Option<String> {
    let (ns, name) = (
        ds.metadata.namespace.as_deref()?,
        ds.metadata.name.as_deref()?,
    );
    revisions
        .iter()
        .filter(|r| {
            r.metadata.namespace.as_deref() == Some(ns)
                && controlled_by(&r.metadata, "DaemonSet", name)
        })
        .max_by_key(|r| r.revision)
        .and_then(|r| {
            r.metadata
                .labels
                .as_ref()?
                .get("controller-revision-hash")
                .cloned()
        })
}

/// For each profile in daemonset use: nodes without a ready PDP Pod, and PDP Pods not at the current revision.
pub(super) fn nodes_section(
    view: &ClusterView,
    config: Option<&Config>,
    all: &[Namespace],
    tally: &PodTally,
    section: &mut Section,
) {
    // Profiles in daemonset use: those of daemonset-wired Pods, and the default profile where a namespace in
    // scope asks for daemonset mode.
    let mut profiles = tally.daemonset_profiles.clone();
    let wired_on = &tally.wired_on;
    if let Some(config) = config {
        for ns in all
            .iter()
            .filter(|n| in_scope(view, n.metadata.name.as_deref()))
        {
            let value = ns
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(LABEL_NAMESPACE_INJECTION));
            if let Some(Ok(Some(Mode::Daemonset))) = value.map(|v| namespace_mode(v, Some(config)))
            {
                profiles.insert(config.default_profile.clone());
            }
        }
    }
    if profiles.is_empty() {
        section.summary = "no profile in daemonset mode".into();
        return;
    }
    let nodes = match &view.nodes {
        Err(e) => {
            section.push(Finding::new(
                Severity::Error,
                Code::NodesUnreadable,
                "nodes",
                format!("cannot list nodes: {e}"),
            ));
            return;
        }
        Ok(n) => n,
    };
    section.summary = format!(
        "{}; daemonset mode: {}",
        plural(nodes.len(), "node"),
        profiles.iter().cloned().collect::<Vec<_>>().join(", ")
    );
    let daemonsets = match &view.daemonsets {
        Err(e) => {
            section.push(Finding::new(
                Severity::Error,
                Code::PdpUnreadable,
                "PDP DaemonSets",
                format!("cannot list DaemonSets: {e}"),
            ));
            return;
        }
        Ok(d) => d,
    };
    let pdp_pods = view.pdp_pods.as_deref().unwrap_or_default();
    let revisions = view.revisions.as_deref().unwrap_or_default();
    for profile in &profiles {
        let Some(ds) = pdp_daemonset(&view.names, profile, daemonsets) else {
            section.push(
                Finding::new(
                    Severity::Error,
                    Code::PdpDaemonsetMissing,
                    format!("profile {profile}"),
                    format!(
                        "used in daemonset mode, but no PDP DaemonSet found (looked for {profile}-pdp labelled {}={}): \
                         daemonset-wired Pods have no PDP",
                        PDP_COMPONENT_LABEL.0, PDP_COMPONENT_LABEL.1
                    ),
                )
                .fix("kubectl apply -k manifests/overlays/daemonset, or name yours: --pdp-daemonset PROFILE=NAMESPACE/NAME"),
            );
            continue;
        };
        let covered = node_coverage(
            section, nodes, wired_on, profile, ds, pdp_pods, revisions, &PDP_ROLE,
        );
        let (ds_ns, ds_name) = (
            ds.metadata.namespace.clone().unwrap_or_default(),
            ds.metadata.name.clone().unwrap_or_default(),
        );
        section.push(Finding::new(
            Severity::Ok,
            Code::PdpDaemonset,
            format!("DaemonSet {ds_ns}/{ds_name}"),
            format!(
                "profile {profile}: ready PDP on {}, {} not at the current revision",
                plural(covered.0, "node"),
                covered.1
            ),
        ));
        // The node-local front of the same namespace (the chart's templates/cerbos-node): it owns the node's port and
        // socket, so a node without it leaves its apps without a PDP as surely as a node without the PDP.
        if let Some(front) = daemonsets.iter().find(|d| {
            d.metadata.namespace.as_deref() == Some(ds_ns.as_str())
                && labelled(d, FRONT_COMPONENT_LABEL)
        }) {
            let covered = node_coverage(
                section,
                nodes,
                wired_on,
                profile,
                front,
                pdp_pods,
                revisions,
                &FRONT_ROLE,
            );
            section.push(Finding::new(
                Severity::Ok,
                Code::PdpFront,
                format!(
                    "DaemonSet {ds_ns}/{}",
                    front.metadata.name.as_deref().unwrap_or_default()
                ),
                format!(
                    "profile {profile}: ready front on {}, {} not at the current revision",
                    plural(covered.0, "node"),
                    covered.1
                ),
            ));
        }
    }
    if let Some(config) = config {
        csi_coverage(view, config, &profiles, nodes, wired_on, section);
    }
}

/// Where Pods get their socket as the node plugin's CSI volume: every node must have the plugin registered
/// (its CSINode lists the driver), or such a Pod scheduled there stays in ContainerCreating.
fn csi_coverage(
    view: &ClusterView,
    config: &Config,
    profiles: &BTreeSet<String>,
    nodes: &[Node],
    wired_on: &BTreeMap<(String, String), Vec<String>>,
    section: &mut Section,
) {
    let by_csi = |p: &String| {
        config.profiles.get(p).is_some_and(|p| {
            config.socket_by(p, crate::config::PssLevel::Restricted) == crate::config::SocketBy::Csi
        })
    };
    let users: Vec<&String> = profiles.iter().filter(|p| by_csi(p)).collect();
    if users.is_empty() {
        return;
    }
    let csi_nodes = match &view.csi_nodes {
        Ok(n) => n,
        Err(e) => {
            section.push(Finding::new(
                Severity::Warning,
                Code::CsiNodesUnreadable,
                "CSI nodes",
                format!(
                    "cannot list CSINodes ({e}): which nodes serve the socket volume is not checked"
                ),
            ));
            return;
        }
    };
    for node in nodes {
        let name = node.metadata.name.clone().unwrap_or_default();
        let registered = csi_nodes.iter().any(|c| {
            c.metadata.name.as_deref() == Some(name.as_str())
                && c.spec.drivers.iter().any(|d| d.name == CSI_DRIVER)
        });
        if registered {
            continue;
        }
        let wired: Vec<String> = users
            .iter()
            .filter_map(|p| wired_on.get(&((*p).clone(), name.clone())))
            .flatten()
            .cloned()
            .collect();
        let mut f = Finding::new(
            Severity::Error,
            Code::NodeWithoutCsiDriver,
            format!("node {name}"),
            format!(
                "the CSI driver {CSI_DRIVER} is not registered here: a Pod wired with the socket volume ({}) \
                 stays in ContainerCreating on this node",
                users.iter().map(|p| p.as_str()).collect::<Vec<_>>().join(", ")
            ),
        )
        .fix(format!(
            "kubectl -n pdp-node get pods -l app.kubernetes.io/name=pdp-csi-node -o wide --field-selector spec.nodeName={name}"
        ));
        f.pods = wired;
        section.push(f);
    }
}

/// What a per-node DaemonSet is to the apps wired to it, in findings.
pub(super) struct NodeRole {
    /// Finding code for a node without a ready Pod of it.
    missing: Code,
    /// Finding code for a Pod of it at an older revision.
    outdated: Code,
    /// What the wired Pods lack without it.
    lack: &'static str,
    /// The same, for a Pod that would be scheduled there.
    would: &'static str,
}

pub(super) const PDP_ROLE: NodeRole = NodeRole {
    missing: Code::NodeWithoutPdp,
    outdated: Code::PdpOutdated,
    lack: "have no PDP",
    would: "would have no PDP",
};

pub(super) const FRONT_ROLE: NodeRole = NodeRole {
    missing: Code::NodeWithoutFront,
    outdated: Code::FrontOutdated,
    lack: "cannot reach their PDP (the node's port 3593 and socket are the front's)",
    would: "could not reach its PDP (the node's port 3593 and socket are the front's)",
};

/// Checks that every node a DaemonSet targets, or where Pods are wired to it, runs a ready Pod of it at the
/// current revision; returns (nodes covered, nodes at an older revision).
#[allow(clippy::too_many_arguments)]
pub(super) fn node_coverage(
    section: &mut Section,
    nodes: &[Node],
    wired_on: &BTreeMap<(String, String), Vec<String>>,
    profile: &str,
    ds: &DaemonSet,
    pdp_pods: &[Pod],
    revisions: &[ControllerRevision],
    role: &NodeRole,
) -> (usize, usize) {
    let (ds_ns, ds_name) = (
        ds.metadata.namespace.clone().unwrap_or_default(),
        ds.metadata.name.clone().unwrap_or_default(),
    );
    let current = current_revision(ds, revisions);
    let node_selector = ds
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|s| s.node_selector.clone())
        .unwrap_or_default();
    let mine: Vec<&Pod> = pdp_pods
        .iter()
        .filter(|p| {
            p.metadata.namespace.as_deref() == Some(ds_ns.as_str())
                && controlled_by(&p.metadata, "DaemonSet", &ds_name)
                && !is_done(p)
        })
        .collect();
    let (mut covered, mut outdated) = (0, 0);
    for node in nodes {
        let node_name = node.metadata.name.clone().unwrap_or_default();
        let node_labels = node.metadata.labels.clone().unwrap_or_default();
        let wired = wired_on.get(&(profile.to_string(), node_name.clone()));
        let targeted = node_selector
            .iter()
            .all(|(k, v)| node_labels.get(k) == Some(v));
        if !targeted && wired.is_none() {
            continue;
        }
        let here: Vec<&&Pod> = mine
            .iter()
            .filter(|p| {
                p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node_name.as_str())
            })
            .collect();
        let ready = here.iter().find(|p| pod_ready(p));
        let subject = format!("node {node_name}");
        let Some(ready) = ready else {
            let not_ready = here
                .iter()
                .map(|p| p.metadata.name.clone().unwrap_or_default())
                .collect::<Vec<_>>();
            let mut message = if not_ready.is_empty() {
                format!("no {ds_name} Pod")
            } else {
                format!("{ds_name} Pod {} not ready", not_ready.join(", "))
            };
            if let Some(w) = wired {
                message.push_str(&format!(
                    ": {} wired to it here {}",
                    plural(w.len(), "Pod"),
                    role.lack
                ));
            } else {
                message.push_str(&format!(
                    ": a daemonset-wired Pod scheduled here {}",
                    role.would
                ));
            }
            let mut f = Finding::new(Severity::Error, role.missing, subject, message).fix(format!(
                "kubectl -n {ds_ns} describe daemonset {ds_name}; kubectl -n {ds_ns} get pods -o wide --field-selector spec.nodeName={node_name}"
            ));
            f.pods = wired.cloned().unwrap_or_default();
            section.push(f);
            continue;
        };
        covered += 1;
        let running = ready
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("controller-revision-hash"));
        if let (Some(cur), Some(run)) = (&current, running)
            && cur != run
        {
            outdated += 1;
            section.push(
                Finding::new(
                    Severity::Warning,
                    role.outdated,
                    subject,
                    format!("{} runs revision {run}, the DaemonSet's current revision is {cur}", ready.metadata.name.as_deref().unwrap_or("")),
                )
                .fix(format!("kubectl -n {ds_ns} rollout status daemonset/{ds_name} (a rollout is under way or stuck)")),
            );
        }
    }
    (covered, outdated)
}
