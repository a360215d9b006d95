//! The Pods that flag sync callers are: by address (TCP callers) and by UID (socket callers), with their node.
//! The central source keeps it from one cluster-wide Pod watch; a node's relay from its source's stream.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tokio::sync::watch;

/// One Pod as a caller: its namespace, node and addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodEntry {
    pub namespace: String,
    pub node: String,
    pub ips: Vec<IpAddr>,
}

/// The Pods by UID, their addresses, and a counter that moves at every change.
#[derive(Debug)]
pub struct PodIndex {
    inner: std::sync::RwLock<Inner>,
    changed: watch::Sender<u64>,
}

#[derive(Debug, Default)]
struct Inner {
    pods: HashMap<String, PodEntry>,
    by_ip: HashMap<IpAddr, String>,
}

impl Default for PodIndex {
    fn default() -> Self {
        PodIndex {
            inner: Default::default(),
            changed: watch::channel(0).0,
        }
    }
}

impl Inner {
    fn remove(&mut self, uid: &str) {
        if let Some(old) = self.pods.remove(uid) {
            for ip in old.ips {
                if self.by_ip.get(&ip).is_some_and(|u| u == uid) {
                    self.by_ip.remove(&ip);
                }
            }
        }
    }

    fn insert(&mut self, uid: String, entry: PodEntry) {
        self.remove(&uid);
        for ip in &entry.ips {
            self.by_ip.insert(*ip, uid.clone());
        }
        self.pods.insert(uid, entry);
    }
}

impl PodIndex {
    fn edit(&self, f: impl FnOnce(&mut Inner)) {
        f(&mut self.inner.write().unwrap_or_else(|p| p.into_inner()));
        self.changed.send_modify(|n| *n += 1);
    }

    /// Sets (`Some`) or removes (`None`) one Pod.
    pub fn apply(&self, uid: &str, entry: Option<PodEntry>) {
        self.edit(|inner| match entry {
            Some(entry) => inner.insert(uid.to_string(), entry),
            None => inner.remove(uid),
        });
    }

    /// Replaces every Pod (a full listing).
    pub fn replace_all(&self, pods: HashMap<String, PodEntry>) {
        self.edit(|inner| {
            *inner = Inner::default();
            for (uid, entry) in pods {
                inner.insert(uid, entry);
            }
        });
    }

    /// The namespace of the Pod that has `ip`.
    pub fn namespace_of_ip(&self, ip: IpAddr) -> Option<String> {
        let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
        inner
            .by_ip
            .get(&ip)
            .and_then(|uid| inner.pods.get(uid))
            .map(|p| p.namespace.clone())
    }

    /// The namespace of the Pod with `uid`.
    pub fn namespace_of_uid(&self, uid: &str) -> Option<String> {
        let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
        inner.pods.get(uid).map(|p| p.namespace.clone())
    }

    /// The Pods of `node`, by UID.
    pub fn on_node(&self, node: &str) -> BTreeMap<String, PodEntry> {
        let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
        inner
            .pods
            .iter()
            .filter(|(_, p)| p.node == node)
            .map(|(u, p)| (u.clone(), p.clone()))
            .collect()
    }

    /// A receiver woken at every change.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }
}

/// A Pod as a caller; `None` for hostNetwork Pods (their address is the node's, shared by every such Pod) and
/// for Pods that have ended or have no address yet.
pub fn entry_of(pod: &Pod) -> Option<PodEntry> {
    let spec = pod.spec.as_ref()?;
    let status = pod.status.as_ref()?;
    if spec.host_network == Some(true)
        || matches!(status.phase.as_deref(), Some("Succeeded" | "Failed"))
    {
        return None;
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
    if ips.is_empty() {
        return None;
    }
    Some(PodEntry {
        namespace: pod.namespace().unwrap_or_default(),
        node: spec.node_name.clone()?,
        ips,
    })
}

/// Keeps `index` at the cluster's Pods (one watch, every namespace).
pub async fn follow(client: Client, index: std::sync::Arc<PodIndex>) {
    let api: Api<Pod> = Api::all(client);
    let mut events = watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut listing: Option<HashMap<String, PodEntry>> = None;
    while let Some(event) = events.next().await {
        let uid = |pod: &Pod| pod.uid().unwrap_or_default();
        match event {
            Ok(watcher::Event::Init) => listing = Some(HashMap::new()),
            Ok(watcher::Event::InitApply(pod)) => {
                if let (Some(listing), Some(entry)) = (listing.as_mut(), entry_of(&pod)) {
                    listing.insert(uid(&pod), entry);
                }
            }
            Ok(watcher::Event::InitDone) => index.replace_all(listing.take().unwrap_or_default()),
            Ok(watcher::Event::Apply(pod)) => index.apply(&uid(&pod), entry_of(&pod)),
            Ok(watcher::Event::Delete(pod)) => index.apply(&uid(&pod), None),
            Err(e) => tracing::warn!(error = %e, "Pod watch failed; retrying"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_reused_by_another_pod_belongs_to_the_newer_one() {
        let index = PodIndex::default();
        let ip: IpAddr = "10.0.0.5".parse().unwrap();
        let entry = |ns: &str| PodEntry {
            namespace: ns.into(),
            node: "n1".into(),
            ips: vec![ip],
        };
        index.apply("uid-a", Some(entry("team-a")));
        index.apply("uid-b", Some(entry("team-b")));
        index.apply("uid-a", None);
        assert_eq!(index.namespace_of_ip(ip).as_deref(), Some("team-b"));
        assert_eq!(index.on_node("n1").len(), 1);
        assert!(index.on_node("n2").is_empty());
    }
}
