//! What holds the node ports on the cluster already: Pods, DaemonSets and Services, read into [`PortClaim`]s.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Pod, PodSpec, Service};

use super::{NODE_PORTS, PART_OF};

/// Something on the nodes that holds one of [`NODE_PORTS`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortClaim {
    /// `Pod shop/web-1`, `DaemonSet mon/agent`, `Service shop/web`.
    pub subject: String,
    /// The port.
    pub port: i32,
    /// How: `hostPort`, `containerPort with hostNetwork`, `nodePort`.
    pub how: &'static str,
    /// The node, for a Pod that is scheduled.
    pub node: Option<String>,
}

pub(super) fn ours(labels: Option<&BTreeMap<String, String>>) -> bool {
    labels.and_then(|l| l.get(PART_OF.0)).map(String::as_str) == Some(PART_OF.1)
}

fn spec_claims(spec: &PodSpec, subject: &str, node: Option<String>, out: &mut Vec<PortClaim>) {
    let host_network = spec.host_network == Some(true);
    let containers = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten());
    for port in containers.flat_map(|c| c.ports.iter().flatten()) {
        let (held, how) = match port.host_port {
            Some(h) if h != 0 => (h, "hostPort"),
            _ if host_network => (port.container_port, "containerPort with hostNetwork"),
            _ => continue,
        };
        if NODE_PORTS.contains(&held) && !out.iter().any(|c| c.subject == subject && c.port == held)
        {
            out.push(PortClaim {
                subject: subject.to_string(),
                port: held,
                how,
                node: node.clone(),
            });
        }
    }
}

pub(super) fn object(
    kind: &str,
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> String {
    format!(
        "{kind} {}/{}",
        meta.namespace.as_deref().unwrap_or(""),
        meta.name.as_deref().unwrap_or("")
    )
}

/// The node ports a Pod holds; none for the project's own Pods and a DaemonSet's (its DaemonSet says so).
pub fn pod_claims(pod: &Pod, out: &mut Vec<PortClaim>) {
    let by_daemonset = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "DaemonSet");
    if by_daemonset || ours(pod.metadata.labels.as_ref()) {
        return;
    }
    if let Some(spec) = &pod.spec {
        spec_claims(
            spec,
            &object("Pod", &pod.metadata),
            spec.node_name.clone(),
            out,
        );
    }
}

/// The node ports a DaemonSet's Pods hold on every node they run on.
pub fn daemonset_claims(ds: &DaemonSet, out: &mut Vec<PortClaim>) {
    if ours(ds.metadata.labels.as_ref()) {
        return;
    }
    if let Some(spec) = ds.spec.as_ref().and_then(|s| s.template.spec.as_ref()) {
        spec_claims(spec, &object("DaemonSet", &ds.metadata), None, out);
    }
}

/// The node ports a Service opens on every node (`nodePort`).
pub fn service_claims(svc: &Service, out: &mut Vec<PortClaim>) {
    if ours(svc.metadata.labels.as_ref()) {
        return;
    }
    let ports = svc.spec.iter().flat_map(|s| s.ports.iter().flatten());
    for p in ports.filter(|p| p.node_port.is_some_and(|n| NODE_PORTS.contains(&n))) {
        out.push(PortClaim {
            subject: object("Service", &svc.metadata),
            port: p.node_port.unwrap_or_default(),
            how: "nodePort",
            node: None,
        });
    }
}
