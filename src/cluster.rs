//! What the webhook learns from the cluster: namespace labels (a metadata-only watch feeding an in-memory
//! store, so the request path makes no API call) and whether the apiserver supports native sidecars.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tracing::{info, warn};

use crate::decision::NamespaceInfo;
use crate::metrics::ClusterCounters;
use crate::namespaces::{FetchFuture, NamespaceSource};

/// Namespace labels from a reflector over `PartialObjectMeta<Namespace>` (labels only, no specs).
#[derive(Clone)]
pub struct ClusterNamespaces {
    store: Store<PartialObjectMeta<Namespace>>,
    synced: Arc<AtomicBool>,
    client: kube::Client,
    /// Namespaces fetched on a cache miss, until the watch catches up with them.
    fetched: Arc<RwLock<HashMap<String, NamespaceInfo>>>,
    counters: ClusterCounters,
}

impl ClusterNamespaces {
    /// Starts the watch in the background. `synced()` turns true after the first complete list.
    pub fn spawn(client: kube::Client, counters: ClusterCounters) -> Self {
        // `Api<PartialObjectMeta<_>>` makes metadata-only requests: labels, never specs.
        let api: Api<PartialObjectMeta<Namespace>> = Api::all(client.clone());
        let (store, writer) = reflector::store();
        let synced = Arc::new(AtomicBool::new(false));
        let stream = reflector::reflector(
            writer,
            watcher::watcher(api, watcher::Config::default()).default_backoff(),
        );
        let watch_counters = counters.clone();
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                if let Err(e) = event {
                    watch_counters.namespace_watch_error();
                    warn!(error = %e, "namespace watch error; retrying with backoff");
                }
            }
            warn!("namespace watch ended");
        });
        let ready_store = store.clone();
        let ready_flag = synced.clone();
        tokio::spawn(async move {
            if ready_store.wait_until_ready().await.is_ok() {
                ready_flag.store(true, Ordering::SeqCst);
                info!(namespaces = ready_store.len(), "namespace cache synced");
            }
        });
        ClusterNamespaces {
            store,
            synced,
            client,
            fetched: Arc::default(),
            counters,
        }
    }
}

fn info_of(meta: &PartialObjectMeta<Namespace>, name: &str) -> NamespaceInfo {
    match &meta.metadata.labels {
        Some(labels) => NamespaceInfo::from_labels(name, labels),
        None => NamespaceInfo::named(name),
    }
}

impl NamespaceSource for ClusterNamespaces {
    fn lookup(&self, name: &str) -> Option<NamespaceInfo> {
        if let Some(meta) = self.store.get(&ObjectRef::new(name)) {
            return Some(info_of(&meta, name));
        }
        self.fetched
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
    }

    fn synced(&self) -> bool {
        self.synced.load(Ordering::SeqCst)
    }

    fn fetch<'a>(&'a self, name: &'a str) -> FetchFuture<'a> {
        Box::pin(async move {
            let api: Api<Namespace> = Api::all(self.client.clone());
            let result = api.get_metadata_opt(name).await;
            self.counters.namespace_fetch(result.is_ok());
            match result {
                Ok(Some(meta)) => {
                    let info = info_of(&meta, name);
                    self.fetched
                        .write()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(name.to_string(), info.clone());
                    Ok(Some(info))
                }
                Ok(None) => Ok(None),
                Err(e) => {
                    warn!(namespace = name, error = %e, "cannot fetch a namespace from the apiserver");
                    Err(e.to_string())
                }
            }
        })
    }
}

/// Whether the apiserver stores native sidecars (init containers with `restartPolicy: Always` and probes):
/// Kubernetes 1.29 and later. Older servers silently drop the restart policy and refuse the probes.
pub fn supports_native_sidecars(major: &str, minor: &str) -> bool {
    let digits = |s: &str| {
        s.chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse::<u32>()
            .ok()
    };
    match (digits(major), digits(minor)) {
        (Some(1), Some(minor)) => minor >= 29,
        (Some(major), _) => major > 1,
        _ => true,
    }
}

/// Asks the apiserver for its version; on failure assumes a current server (native sidecars) and says so.
pub async fn native_sidecars(client: &kube::Client) -> bool {
    match tokio::time::timeout(Duration::from_secs(10), client.apiserver_version()).await {
        Ok(Ok(info)) => {
            let native = supports_native_sidecars(&info.major, &info.minor);
            info!(
                version = %info.git_version,
                native_sidecars = native,
                "connected to the apiserver"
            );
            if !native {
                warn!("apiserver older than 1.29: sidecars are rendered as classic containers");
            }
            native
        }
        Ok(Err(e)) => {
            warn!(error = %e, "cannot read the apiserver version; assuming native sidecars are supported");
            true
        }
        Err(_) => {
            warn!("apiserver version request timed out; assuming native sidecars are supported");
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn native_sidecars_from_1_29() {
        assert!(!supports_native_sidecars("1", "20"));
        assert!(!supports_native_sidecars("1", "28+"));
        assert!(supports_native_sidecars("1", "29"));
        assert!(supports_native_sidecars("1", "33+"));
        assert!(supports_native_sidecars("2", "0"));
        assert!(supports_native_sidecars("", ""));
    }
}
