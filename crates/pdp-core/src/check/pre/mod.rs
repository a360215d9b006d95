//! `check --pre`: before install, can this cluster run each model (central, daemonset, sidecar)? What the
//! binary's `check::gather::gather_pre` read ([`PreView`]) becomes a [`Report`] whose last section gives one verdict
//! per model; every finding that stops a model is named in that model's verdict, with its fix.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Namespace, Node, ResourceQuota};
use k8s_openapi::api::scheduling::v1::PriorityClass;

use super::analyse::Read;
use super::codes::FindingCode as Code;
use super::report::{Finding, Report, Section, Severity};
use crate::config::{Config, Mode, PssLevel, version_part};
use crate::core::NamespaceInfo;
use crate::names::{DEFAULT_NAMESPACE, LABEL_NAMESPACE_INJECTION, LABEL_PSS_ENFORCE};

mod claims;
mod nodes;
mod priority;

pub use claims::{PortClaim, daemonset_claims, pod_claims, service_claims};

/// The node ports the node-local front binds (gRPC, HTTP).
pub const NODE_PORTS: [i32; 2] = [3593, 3592];
/// The PriorityClass the chart installs for the webhook.
pub const WEBHOOK_PRIORITY_CLASS: &str = "pdp-injector-webhook";
/// The PriorityClass of the node-local Pods.
pub const NODE_PRIORITY_CLASS: &str = "system-node-critical";
/// The shipped quota that admits [`NODE_PRIORITY_CLASS`] in `pdp-node`: three Pods per node, 1000 nodes.
pub const NODE_CRITICAL_QUOTA: (&str, i64) = ("cerbos-pdp-node-critical", 3000);
/// Pods per node of the daemonset model (front, PDP, a second PDP while it is updated).
const NODE_PODS_PER_NODE: i64 = 3;
/// The kubelet root directory the chart assumes (`pdp.nodeLocal.csi.kubeletDir`).
pub const DEFAULT_KUBELET_DIR: &str = "/var/lib/kubelet";
/// The oldest Kubernetes the chart renders for.
pub const OLDEST: (u32, u32) = (1, 20);
/// From this version on the chart installs its ValidatingAdmissionPolicy guards.
pub const POLICIES_FROM: (u32, u32) = (1, 30);
/// The guards, and the model each comes with (`None`: every model).
pub const GUARDS: [(&str, Option<Mode>); 3] = [
    ("pdp-injector-secret-guard", None),
    ("pdp-injector-webhook-config-guard", None),
    ("pdp-node-port-guard", Some(Mode::Daemonset)),
];
/// Every model, in the order the verdicts are given.
pub const MODELS: [Mode; 3] = [Mode::Central, Mode::Daemonset, Mode::Sidecar];
/// The label of the project's own objects (a previous install), which claim nothing from it.
const PART_OF: (&str, &str) = ("app.kubernetes.io/part-of", "pdp-injector");

/// The namespaces the install creates, and the Pods each needs at least (`None`: per node), by model.
pub const INSTALL_NAMESPACES: [(&str, Option<Mode>, Option<i64>); 3] = [
    (DEFAULT_NAMESPACE, None, Some(3)),
    ("pdp-central", Some(Mode::Central), Some(3)),
    ("pdp-node", Some(Mode::Daemonset), None),
];

/// What `check --pre` read.
#[derive(Debug, Clone)]
pub struct PreView {
    /// The apiserver's `major`, `minor` and `gitVersion`.
    pub version: (String, String, String),
    /// The resources `admissionregistration.k8s.io/v1` serves; `Ok(None)`: the group version is not served.
    pub admission_v1: Read<Option<Vec<String>>>,
    /// The resources `storage.k8s.io/v1` serves.
    pub storage_v1: Read<Option<Vec<String>>>,
    /// Every namespace.
    pub namespaces: Read<Vec<Namespace>>,
    /// `-n`: the namespaces to opt in; empty: those labelled [`LABEL_NAMESPACE_INJECTION`].
    pub targets: Vec<String>,
    /// Every node.
    pub nodes: Read<Vec<Node>>,
    /// What holds [`NODE_PORTS`] (Pods, DaemonSets, Services).
    pub port_claims: Read<Vec<PortClaim>>,
    /// Every PriorityClass.
    pub priority_classes: Read<Vec<PriorityClass>>,
    /// The ResourceQuotas of [`INSTALL_NAMESPACES`] that exist already.
    pub quotas: Read<Vec<ResourceQuota>>,
    /// `--kubelet-dir`: the kubelet root the install will be given.
    pub kubelet_dir: String,
    /// `--model`: the models asked about; what stops one of them is an error, what stops only others a warning.
    pub models: Vec<Mode>,
}

fn version_number(major: &str, minor: &str) -> Option<(u32, u32)> {
    Some((version_part(major)?, version_part(minor)?))
}

/// The judging of a [`PreView`]: findings per section, and what stops which model.
struct Pre<'v> {
    view: &'v PreView,
    /// Per model, what stops it: (subject: message [code], fix).
    stops: BTreeMap<&'static str, Vec<(String, Option<String>)>>,
}

impl Pre<'_> {
    /// A finding that stops `models`: an error when one of them was asked about, else a warning.
    fn stop(&mut self, section: &mut Section, f: Finding, models: &[Mode]) {
        let asked = models.iter().any(|m| self.view.models.contains(m));
        let mut f = f;
        f.severity = if asked {
            Severity::Error
        } else {
            Severity::Warning
        };
        for m in models {
            self.stops.entry(m.as_str()).or_default().push((
                format!("{}: {} [{}]", f.subject, f.message, f.code),
                f.fix.clone(),
            ));
        }
        section.push(f);
    }

    fn cluster(&mut self, s: &mut Section) {
        let (major, minor, git) = &self.view.version;
        let number = version_number(major, minor);
        s.summary = format!("Kubernetes {git}");
        match number {
            Some(v) if v < OLDEST => self.stop(
                s,
                Finding::new(
                    Severity::Error,
                    Code::KubernetesTooOld,
                    "Kubernetes",
                    format!(
                        "{git}: the chart renders for {}.{} or later",
                        OLDEST.0, OLDEST.1
                    ),
                )
                .fix(format!(
                    "upgrade the cluster to {}.{} or later",
                    OLDEST.0, OLDEST.1
                )),
                &MODELS,
            ),
            _ => s.push(Finding::new(
                Severity::Ok,
                Code::KubernetesVersion,
                "Kubernetes",
                format!("{git}: the chart renders what this version supports"),
            )),
        }
        match &self.view.admission_v1 {
            Err(e) => self.stop(
                s,
                Finding::new(
                    Severity::Error,
                    Code::PreReadFailed,
                    "admissionregistration.k8s.io/v1",
                    format!("cannot read the API's resources: {e}"),
                ),
                &MODELS,
            ),
            Ok(resources) => {
                let served = |r: &str| resources.iter().flatten().any(|x| x == r);
                if served("mutatingwebhookconfigurations") {
                    s.push(Finding::new(
                        Severity::Ok,
                        Code::AdmissionApi,
                        "admissionregistration.k8s.io/v1",
                        "MutatingWebhookConfiguration served",
                    ));
                } else {
                    self.stop(
                        s,
                        Finding::new(
                            Severity::Error,
                            Code::AdmissionApiMissing,
                            "admissionregistration.k8s.io/v1",
                            "MutatingWebhookConfiguration is not served: the webhook cannot be registered",
                        )
                        .fix("enable admissionregistration.k8s.io/v1 (kube-apiserver --runtime-config) and the MutatingAdmissionWebhook admission plugin"),
                        &MODELS,
                    );
                }
                let policies = served("validatingadmissionpolicies")
                    && served("validatingadmissionpolicybindings");
                self.policies(s, number, policies);
            }
        }
        match &self.view.storage_v1 {
            Err(e) => self.stop(
                s,
                Finding::new(
                    Severity::Error,
                    Code::PreReadFailed,
                    "storage.k8s.io/v1",
                    format!("cannot read the API's resources: {e}"),
                ),
                &[Mode::Daemonset],
            ),
            Ok(r) if r.iter().flatten().any(|x| x == "csidrivers") => s.push(Finding::new(
                Severity::Ok,
                Code::CsiApi,
                "storage.k8s.io/v1",
                "CSIDriver served: the node plugin can give the node's socket to Pods of every Pod Security level",
            )),
            Ok(_) => self.stop(
                s,
                Finding::new(
                    Severity::Error,
                    Code::CsiApiMissing,
                    "storage.k8s.io/v1",
                    "CSIDriver is not served: the chart's CSIDriver csi.pdp-injector.io cannot be installed",
                )
                .fix("helm install ... --set pdp.nodeLocal.csi.enabled=false (the node's socket only in privileged namespaces)"),
                &[Mode::Daemonset],
            ),
        }
    }

    /// The guards: installed from 1.30 on, which needs the API; below, said what goes without them.
    fn policies(&mut self, s: &mut Section, version: Option<(u32, u32)>, served: bool) {
        let names = |m: Option<Mode>| {
            GUARDS
                .iter()
                .filter(|(_, g)| g.is_none() || *g == m)
                .map(|(n, _)| *n)
                .collect::<Vec<_>>()
                .join(", ")
        };
        let subject = "ValidatingAdmissionPolicy";
        if version.is_some_and(|v| v < POLICIES_FROM) {
            s.push(
                Finding::new(
                    Severity::Info,
                    Code::AdmissionPoliciesSkipped,
                    subject,
                    format!(
                        "below {}.{} the chart leaves out its guards ({}): nothing but RBAC keeps other workloads off \
                         the webhook's Secret and configuration, and only the scheduler keeps other Pods off the nodes' \
                         ports 3592/3593",
                        POLICIES_FROM.0,
                        POLICIES_FROM.1,
                        names(Some(Mode::Daemonset))
                    ),
                )
                .fix(format!("upgrade the cluster to {}.{} or later", POLICIES_FROM.0, POLICIES_FROM.1)),
            );
        } else if served {
            s.push(Finding::new(
                Severity::Ok,
                Code::AdmissionPolicies,
                subject,
                format!(
                    "v1 served: the guards are installed ({})",
                    names(Some(Mode::Daemonset))
                ),
            ));
        } else {
            self.stop(
                s,
                Finding::new(
                    Severity::Error,
                    Code::AdmissionPolicyApiMissing,
                    subject,
                    format!(
                        "admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy(Binding) is not served on {}.{}+, \
                         where the chart installs its guards ({}): the install fails",
                        POLICIES_FROM.0,
                        POLICIES_FROM.1,
                        names(Some(Mode::Daemonset))
                    ),
                )
                .fix("enable admissionregistration.k8s.io/v1 validatingadmissionpolicies (kube-apiserver --runtime-config)"),
                &MODELS,
            );
        }
    }

    fn namespaces(&mut self, s: &mut Section) {
        let all = match &self.view.namespaces {
            Ok(all) => all,
            Err(e) => {
                s.push(Finding::new(
                    Severity::Error,
                    Code::NamespacesUnreadable,
                    "namespaces",
                    format!("cannot list namespaces: {e}"),
                ));
                return;
            }
        };
        let labelled: Vec<&Namespace> = if self.view.targets.is_empty() {
            all.iter()
                .filter(|n| {
                    n.metadata
                        .labels
                        .as_ref()
                        .is_some_and(|l| l.contains_key(LABEL_NAMESPACE_INJECTION))
                })
                .collect()
        } else {
            let mut found = Vec::new();
            for name in &self.view.targets {
                match all.iter().find(|n| n.metadata.name.as_ref() == Some(name)) {
                    Some(n) => found.push(n),
                    None => s.push(Finding::new(
                        Severity::Warning,
                        Code::NamespaceNotFound,
                        format!("namespace {name}"),
                        "does not exist: its Pod Security level is not judged",
                    )),
                }
            }
            found
        };
        if labelled.is_empty() && self.view.targets.is_empty() {
            s.push(Finding::new(
                Severity::Info,
                Code::NoNamespacesToOptIn,
                "namespaces",
                format!(
                    "none labelled {LABEL_NAMESPACE_INJECTION}: name the ones to opt in with -n"
                ),
            ));
        }
        let csi =
            matches!(&self.view.storage_v1, Ok(Some(r)) if r.iter().any(|x| x == "csidrivers"));
        for ns in &labelled {
            let name = ns.metadata.name.as_deref().unwrap_or("");
            let labels = ns.metadata.labels.clone().unwrap_or_default();
            let label = labels.get(LABEL_PSS_ENFORCE);
            // As the webhook judges it: an unlabelled namespace at the config's default level.
            let level = NamespaceInfo::from_labels(name, &labels).pss_level(&Config::builtin());
            let daemonset = match (level, csi) {
                (PssLevel::Privileged, _) => "the node's socket (hostPath or CSI) and TCP",
                (_, true) => "the node's socket through the CSI volume, and TCP",
                (_, false) => "TCP only (this level forbids hostPath, and there is no CSI)",
            };
            let source = if label.is_some() {
                ""
            } else {
                " (no enforce label: the config's default)"
            };
            s.push(Finding::new(
                Severity::Ok,
                Code::NamespacePodSecurity,
                format!("namespace {name}"),
                format!(
                    "Pod Security {}{source}: central and sidecar wiring meet it; daemonset wiring gets {daemonset}",
                    level.as_str()
                ),
            ));
        }
        s.summary = format!("{} to opt in", labelled.len());
    }

    fn verdicts(&self) -> Section {
        let mut s = Section::new("models");
        for m in MODELS {
            let asked = self.view.models.contains(&m);
            let subject = format!("model {m}");
            match self.stops.get(m.as_str()) {
                None => s.push(Finding::new(
                    Severity::Ok,
                    Code::ModelCanRun,
                    subject,
                    "can run on this cluster",
                )),
                Some(why) => {
                    let reasons = why.iter().map(|(r, _)| r.as_str()).collect::<Vec<_>>();
                    let fixes: Vec<&str> = why.iter().filter_map(|(_, f)| f.as_deref()).collect();
                    let mut f = Finding::new(
                        if asked {
                            Severity::Error
                        } else {
                            Severity::Warning
                        },
                        Code::ModelCannotRun,
                        subject,
                        format!("cannot run: {}", reasons.join("; ")),
                    );
                    if !fixes.is_empty() {
                        f = f.fix(fixes.join("; "));
                    }
                    s.push(f);
                }
            }
        }
        s.summary = format!(
            "asked: {}",
            self.view
                .models
                .iter()
                .map(|m| m.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
        s
    }
}

/// The report of `check --pre`: cluster, namespaces, nodes, priority, then one verdict per model.
pub fn pre_report(view: &PreView) -> Report {
    let mut pre = Pre {
        view,
        stops: BTreeMap::new(),
    };
    let mut cluster = Section::new("cluster");
    let mut namespaces = Section::new("namespaces");
    let mut nodes = Section::new("nodes");
    let mut priority = Section::new("priority");
    pre.cluster(&mut cluster);
    pre.namespaces(&mut namespaces);
    pre.nodes(&mut nodes);
    pre.priority(&mut priority);
    pre.quotas(&mut priority);
    priority.summary = "PriorityClasses and ResourceQuotas".into();
    let models = pre.verdicts();
    Report::new(vec![cluster, namespaces, nodes, priority, models])
}

#[cfg(test)]
pub(crate) mod tests;
