//! The Pod addresses of the cluster (one watch), so that a TCP caller's namespace is its Pod's.

use std::collections::HashMap;
use std::net::IpAddr;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};

use crate::service::PodAddresses;

/// Namespace by address.
type Addresses = HashMap<IpAddr, String>;
/// Addresses by `namespace/name`.
type ByPod = HashMap<String, Vec<IpAddr>>;

/// The addresses a Pod answers from, with its namespace; none for hostNetwork Pods (their address is the node's,
/// shared by every such Pod) and for Pods that have ended.
pub fn addresses_of(pod: &Pod) -> Vec<IpAddr> {
    let host_network = pod
        .spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false);
    let Some(status) = pod.status.as_ref() else {
        return vec![];
    };
    let ended = matches!(status.phase.as_deref(), Some("Succeeded" | "Failed"));
    if host_network || ended {
        return vec![];
    }
    let mut ips: Vec<IpAddr> = status
        .pod_ips
        .iter()
        .flatten()
        .filter_map(|p| p.ip.parse().ok())
        .collect();
    if let Some(ip) = status.pod_ip.as_deref().and_then(|s| s.parse().ok())
        && !ips.contains(&ip)
    {
        ips.push(ip);
    }
    ips
}

/// Keeps `index` at the cluster's Pod addresses; `field_selector` narrows the watch (`spec.nodeName=NODE`).
pub async fn follow(client: Client, field_selector: Option<String>, index: PodAddresses) {
    let api: Api<Pod> = Api::all(client);
    let mut config = watcher::Config::default();
    if let Some(fields) = field_selector.as_deref() {
        config = config.fields(fields);
    }
    let mut events = watcher(api, config).default_backoff().boxed();
    let mut listing: Option<(Addresses, ByPod)> = None;
    let mut by_pod = ByPod::new();
    while let Some(event) = events.next().await {
        let key = |pod: &Pod| format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any());
        let mut map = index.0.write().unwrap_or_else(|p| p.into_inner());
        match event {
            Ok(watcher::Event::Init) => listing = Some(Default::default()),
            Ok(watcher::Event::InitApply(pod)) => {
                if let Some((ips, pods)) = listing.as_mut() {
                    let own = addresses_of(&pod);
                    for ip in &own {
                        ips.insert(*ip, pod.namespace().unwrap_or_default());
                    }
                    pods.insert(key(&pod), own);
                }
            }
            Ok(watcher::Event::InitDone) => {
                (*map, by_pod) = listing.take().unwrap_or_default();
            }
            Ok(watcher::Event::Apply(pod)) => {
                for old in by_pod.remove(&key(&pod)).unwrap_or_default() {
                    map.remove(&old);
                }
                let ips = addresses_of(&pod);
                for ip in &ips {
                    map.insert(*ip, pod.namespace().unwrap_or_default());
                }
                by_pod.insert(key(&pod), ips);
            }
            Ok(watcher::Event::Delete(pod)) => {
                let ips = by_pod
                    .remove(&key(&pod))
                    .unwrap_or_else(|| addresses_of(&pod));
                for ip in ips {
                    if map.get(&ip) == pod.namespace().as_ref() {
                        map.remove(&ip);
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "Pod watch failed; retrying"),
        }
    }
}
