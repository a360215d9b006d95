//! From what was read of the cluster ([`ClusterView`]) to the report: pure, so every judgement `check` makes is
//! tested on fixtures without a cluster. The reads themselves are in the binary's `check::gather`. One file per
//! section of the report: [`install`], [`nodes`], [`namespaces`], [`pod_section`]; what was read is [`view`].

use super::codes::FindingCode as Code;
use super::report::{Finding, Report, Section, Severity};
use crate::config::Config;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use std::collections::BTreeMap;
mod flags;
mod install;
mod namespaces;
mod nodes;
mod pod_section;
mod view;

use crate::check::analyse::flags::flag_sync_section;
use crate::check::analyse::install::{config, install};
use crate::check::analyse::namespaces::namespaces_section;
use crate::check::analyse::nodes::nodes_section;
use crate::check::analyse::pod_section::pods_section;
pub use flags::{FlagSyncView, RelayGeneration};
pub use install::endpoint;
pub use pod_section::PodTally;
pub use view::{
    ClusterView, ConfigSource, ENTRIES, FRONT_COMPONENT_LABEL, LiveProbe, Names,
    PDP_COMPONENT_LABEL, Read,
};

const DAY: i64 = 86_400;
/// A certificate is renewed when a third of its life is left (cert-manager's default; self-managed: a third,
/// or 30 days); with less than this left, renewal is late: a warning at a quarter of its life (at most 21 days),
/// an error at a tenth (at most 7 days). Relative, so short-lived certificates are judged fairly too.
const EXPIRY_WARNING: (i64, i64) = (4, 21 * DAY);
const EXPIRY_ERROR: (i64, i64) = (10, 7 * DAY);

fn labels_of(ns: &Namespace) -> BTreeMap<String, String> {
    let mut labels = ns.metadata.labels.clone().unwrap_or_default();
    // 1.21+ sets this label on every namespace; older servers do not, and the selectors rely on it.
    if let Some(name) = &ns.metadata.name {
        labels
            .entry("kubernetes.io/metadata.name".into())
            .or_insert_with(|| name.clone());
    }
    labels
}

fn pod_name(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or(""),
        pod.metadata.name.as_deref().unwrap_or("")
    )
}

/// A Pod that will not run again (finished, or being deleted): restarting its workload means nothing for it.
fn is_done(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
        || matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        )
}

/// How long after its app containers ended a classic sidecar may still run before `check` says so: the webhook
/// marks the Pod within seconds, and the kubelet's liveness probe follows every 2 s.
const CLASSIC_STOP_GRACE: i64 = 60;
/// The same under `restartPolicy: OnFailure`, where the watch container waits 330 s (longer than the kubelet's
/// restart back-off) before it stops the PDP.
const CLASSIC_STOP_GRACE_ON_FAILURE: i64 = 400;

/// True when every container of the Pod that has ended did so before `at` (Unix seconds), and one has.
fn ended_before(pod: &Pod, at: i64) -> bool {
    let ends: Vec<i64> = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|c| c.state.as_ref()?.terminated.as_ref())
        .map(|t| t.finished_at.as_ref().map_or(i64::MAX, |f| f.0.as_second()))
        .collect();
    !ends.is_empty() && ends.iter().all(|t| *t < at)
}

/// The Pod's `Ready` condition is true.
pub fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn plural(n: usize, word: &str) -> String {
    format!("{n} {word}{}", if n == 1 { "" } else { "s" })
}

fn days(seconds: i64) -> String {
    let d = seconds / DAY;
    if seconds < 0 {
        format!("expired {} ago", plural((-seconds / DAY) as usize, "day"))
    } else {
        format!("expires in {}", plural(d as usize, "day"))
    }
}

/// The report for what was read, with the Pods of `view.pods` (read in advance: fixtures, small clusters).
pub fn analyse(view: &ClusterView) -> Report {
    let mut judge = Judge::new(view);
    match &view.pods {
        Ok(pods) => judge.pods(pods),
        Err(e) => judge.pods_failed(e.clone()),
    }
    judge.report()
}

/// The judging of one cluster with its Pods fed a page at a time ([`Judge::pods`]), so that `check` holds one
/// page of Pods and the findings, whatever the cluster's size; `view.pods` is not read.
pub struct Judge<'v> {
    view: &'v ClusterView,
    /// The config the webhook uses in this cluster, `None` when none is usable.
    config: Option<Config>,
    /// The Install section's findings about the config.
    install: Section,
    /// The namespaces' labels.
    labels: BTreeMap<String, BTreeMap<String, String>>,
    tally: PodTally,
}

impl<'v> Judge<'v> {
    /// Starts judging what was read.
    pub fn new(view: &'v ClusterView) -> Judge<'v> {
        let mut install = Section::new("install");
        let config = config(view, &mut install);
        let labels = view
            .namespaces
            .as_deref()
            .unwrap_or_default()
            .iter()
            .filter_map(|n| Some((n.metadata.name.clone()?, labels_of(n))))
            .collect();
        Judge {
            view,
            config,
            install,
            labels,
            tally: PodTally::default(),
        }
    }

    /// Judges a page of Pods.
    pub fn pods(&mut self, page: &[Pod]) {
        for pod in page {
            self.tally
                .add(self.view, self.config.as_ref(), &self.labels, pod);
        }
    }

    /// The Pods could not be listed: the Pods section says so.
    pub fn pods_failed(&mut self, why: String) {
        self.tally.failed(why);
    }

    /// The report.
    pub fn report(self) -> Report {
        let view = self.view;
        let mut install = self.install;
        let mut nodes = Section::new("nodes");
        let mut namespaces = Section::new("namespaces");
        let mut pods = Section::new("pods");
        let all: &[Namespace] = match &view.namespaces {
            Ok(n) => n,
            Err(e) => {
                namespaces.push(Finding::new(
                    Severity::Error,
                    Code::NamespacesUnreadable,
                    "namespaces",
                    format!("cannot list namespaces: {e}"),
                ));
                &[]
            }
        };
        self::install(view, &mut install, all);
        install.summary = format!("webhook namespace {}", view.names.namespace);
        let config = self.config.as_ref();
        nodes_section(view, config, all, &self.tally, &mut nodes);
        flag_sync_section(view, &mut nodes);
        namespaces_section(view, config, all, &mut namespaces);
        pods_section(self.tally, config.is_some(), &mut pods);
        Report::new(vec![install, nodes, namespaces, pods])
    }
}

#[cfg(test)]
mod tests;
