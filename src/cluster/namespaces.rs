//! Where the webhook learns a namespace's labels: the [`NamespaceSource`] the request path asks, and its
//! implementation over the cluster (a metadata-only watch feeding an in-memory store, so the request path makes
//! no API call, and a read of one namespace when the store cannot answer).

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use tracing::{info, warn};

use super::ClusterCounters;
use crate::core::NamespaceInfo;

/// What [`NamespaceSource::fetch`] returns.
pub type FetchFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Option<NamespaceInfo>, String>> + Send + 'a>>;

/// A source of namespace facts for the core.
pub trait NamespaceSource: Send + Sync {
    /// What is known of `name` now, from memory; `None` when the namespace is not (yet) known.
    fn lookup(&self, name: &str) -> Option<NamespaceInfo>;
    /// True once the source has its first complete view (readiness waits for it).
    fn synced(&self) -> bool;
    /// Asks the cluster for a namespace the cache does not have yet (created a moment ago) or may have stale
    /// (labelled a moment ago): without this, a Pod in a freshly labelled namespace would be taken as not opted
    /// in. `Ok(None)`: the namespace does not exist; `Err`: the cluster could not be asked (sources without a
    /// cluster cannot ask anyone).
    fn fetch<'a>(&'a self, _name: &'a str) -> FetchFuture<'a> {
        Box::pin(std::future::ready(Err("no cluster to ask".to_string())))
    }
}

/// No cluster (local `serve`, tests): every namespace is unlabelled, so only Pod annotations opt in and the
/// config's default Pod Security level applies.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoCluster;

impl NamespaceSource for NoCluster {
    fn lookup(&self, name: &str) -> Option<NamespaceInfo> {
        Some(NamespaceInfo::named(name))
    }

    fn synced(&self) -> bool {
        true
    }
}

/// A fixed set of namespaces, for tests and for running against a known layout.
#[derive(Debug, Default, Clone)]
pub struct Static(pub std::collections::HashMap<String, NamespaceInfo>);

impl NamespaceSource for Static {
    fn lookup(&self, name: &str) -> Option<NamespaceInfo> {
        Some(
            self.0
                .get(name)
                .cloned()
                .unwrap_or_else(|| NamespaceInfo::named(name)),
        )
    }

    fn synced(&self) -> bool {
        true
    }
}

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
