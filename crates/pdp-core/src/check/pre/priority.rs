//! `check --pre`'s priority section: the PriorityClasses the install uses, and the ResourceQuotas it must fit.

use std::collections::{BTreeMap, BTreeSet};

use super::claims::{object, ours};
use super::{
    INSTALL_NAMESPACES, MODELS, NODE_CRITICAL_QUOTA, NODE_PODS_PER_NODE, NODE_PRIORITY_CLASS, Pre,
    WEBHOOK_PRIORITY_CLASS,
};
use crate::check::codes::FindingCode as Code;
use crate::check::report::{Finding, Section, Severity};
use crate::config::Mode;

fn quantity(q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity) -> Option<i64> {
    let s = q.0.trim();
    match s.strip_suffix('k') {
        Some(n) => n.parse::<i64>().ok().map(|n| n * 1000),
        None => s.parse().ok(),
    }
}

impl Pre<'_> {
    pub(super) fn priority(&mut self, s: &mut Section) {
        let classes = match &self.view.priority_classes {
            Ok(c) => c.as_slice(),
            Err(e) => {
                self.stop(
                    s,
                    Finding::new(
                        Severity::Error,
                        Code::PreReadFailed,
                        "PriorityClasses",
                        format!("cannot list PriorityClasses: {e}"),
                    ),
                    &MODELS,
                );
                return;
            }
        };
        let named = |n: &str| {
            classes
                .iter()
                .find(|c| c.metadata.name.as_deref() == Some(n))
        };
        if let Some(pc) = named(WEBHOOK_PRIORITY_CLASS) {
            let release = pc
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("meta.helm.sh/release-name"));
            match release {
                Some(r) => s.push(Finding::new(
                    Severity::Info,
                    Code::PriorityClassExists,
                    format!("PriorityClass {WEBHOOK_PRIORITY_CLASS}"),
                    format!("exists, from Helm release {r}: an upgrade of that release keeps it"),
                )),
                None => self.stop(
                    s,
                    Finding::new(
                        Severity::Error,
                        Code::PriorityClassTaken,
                        format!("PriorityClass {WEBHOOK_PRIORITY_CLASS}"),
                        "exists and no Helm release owns it: helm install refuses to take it over",
                    )
                    .fix(format!(
                        "kubectl label priorityclass {WEBHOOK_PRIORITY_CLASS} app.kubernetes.io/managed-by=Helm && kubectl \
                         annotate priorityclass {WEBHOOK_PRIORITY_CLASS} meta.helm.sh/release-name=RELEASE \
                         meta.helm.sh/release-namespace=NAMESPACE (or delete it if nothing uses it)"
                    )),
                    &MODELS,
                ),
            }
        }
        if named(NODE_PRIORITY_CLASS).is_none() {
            self.stop(
                s,
                Finding::new(
                    Severity::Error,
                    Code::CriticalPriorityMissing,
                    format!("PriorityClass {NODE_PRIORITY_CLASS}"),
                    "does not exist: the node-local Pods ask for it",
                )
                .fix("helm install ... --set pdp.nodeLocal.priorityClassName=NAME (an existing PriorityClass)"),
                &[Mode::Daemonset],
            );
            return;
        }
        let nodes = self.view.nodes.as_ref().map_or(0, Vec::len) as i64;
        let (quota, hard) = NODE_CRITICAL_QUOTA;
        let needed = nodes * NODE_PODS_PER_NODE;
        if needed > hard {
            self.stop(
                s,
                Finding::new(
                    Severity::Error,
                    Code::CriticalPriorityQuotaShort,
                    format!("ResourceQuota pdp-node/{quota}"),
                    format!(
                        "{NODE_PRIORITY_CLASS} outside kube-system is admitted only within a quota scoped to it: the \
                         shipped one admits {hard} Pods, {nodes} nodes need up to {needed}"
                    ),
                )
                .fix(format!("after install: kubectl -n pdp-node patch resourcequota {quota} -p '{{\"spec\":{{\"hard\":{{\"pods\":\"{needed}\"}}}}}}'")),
                &[Mode::Daemonset],
            );
        } else {
            s.push(Finding::new(
                Severity::Ok,
                Code::CriticalPriority,
                format!("PriorityClass {NODE_PRIORITY_CLASS}"),
                format!(
                    "exists; outside kube-system it is admitted within the chart's ResourceQuota pdp-node/{quota} ({hard} \
                     Pods, {nodes} node(s) need up to {needed})"
                ),
            ));
        }
    }

    pub(super) fn quotas(&mut self, s: &mut Section) {
        let quotas = match &self.view.quotas {
            Ok(q) => q.as_slice(),
            Err(e) => {
                self.stop(
                    s,
                    Finding::new(
                        Severity::Error,
                        Code::PreReadFailed,
                        "ResourceQuotas",
                        format!("cannot list the ResourceQuotas of the install's namespaces: {e}"),
                    ),
                    &MODELS,
                );
                return;
            }
        };
        let nodes = self.view.nodes.as_ref().map_or(0, Vec::len) as i64;
        for q in quotas.iter().filter(|q| !ours(q.metadata.labels.as_ref())) {
            let ns = q.metadata.namespace.as_deref().unwrap_or("");
            let Some((_, model, per)) = INSTALL_NAMESPACES.iter().find(|(n, ..)| *n == ns) else {
                continue;
            };
            let models: Vec<Mode> = model.map_or(MODELS.to_vec(), |m| vec![m]);
            let needed = per.unwrap_or(nodes * NODE_PODS_PER_NODE);
            let subject = object("ResourceQuota", &q.metadata);
            let hard = q.spec.as_ref().and_then(|s| s.hard.as_ref());
            let used = q.status.as_ref().and_then(|s| s.used.as_ref());
            let pods = |m: Option<&BTreeMap<_, _>>| {
                m.and_then(|m: &BTreeMap<String, _>| m.get("pods"))
                    .and_then(quantity)
            };
            let limits: BTreeSet<&str> = hard
                .into_iter()
                .flat_map(|h| h.keys())
                .map(String::as_str)
                .collect();
            match pods(hard) {
                Some(h) if h - pods(used).unwrap_or(0) < needed => self.stop(
                    s,
                    Finding::new(
                        Severity::Error,
                        Code::QuotaTooSmall,
                        &subject,
                        format!(
                            "admits {} more Pod(s) in {ns}; the install needs up to {needed}",
                            h - pods(used).unwrap_or(0)
                        ),
                    )
                    .fix(format!(
                        "raise spec.hard.pods of {subject} to at least {}",
                        pods(used).unwrap_or(0) + needed
                    )),
                    &models,
                ),
                _ => s.push(Finding::new(
                    Severity::Warning,
                    Code::QuotaLimitsInstall,
                    &subject,
                    format!(
                        "limits {} in {ns}: the install's Pods count against it",
                        limits.into_iter().collect::<Vec<_>>().join(", ")
                    ),
                )),
            }
        }
    }
}
