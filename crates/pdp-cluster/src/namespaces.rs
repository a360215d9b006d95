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
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tokio::time::Instant;
use tracing::{info, warn};

use super::ClusterCounters;
use pdp_core::core::NamespaceInfo;

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

/// What one fetch of a namespace found: its facts, `None` when it does not exist, or why it could not be read.
pub type Fetched = Result<Option<NamespaceInfo>, String>;

/// Fetches the apiserver may see per second, at most, whatever clients send (review requests are not
/// authenticated: random namespace names must not become as many GETs as the webhook's account).
pub const FETCHES_PER_SECOND: u32 = 10;

/// How long a namespace the apiserver said does not exist is believed missing without asking again. Short: a
/// namespace created meanwhile reaches the watch within that time, and the watch is asked first.
pub const MISSING_FOR: Duration = Duration::from_secs(5);

/// Names remembered as missing at most (a flood of random names must not grow memory).
pub const MISSING_REMEMBERED: usize = 4096;

/// Bounds what cache misses make the webhook ask the apiserver: a short negative cache, one fetch at a time per
/// name (the others wait for its answer), and a token bucket of [`FETCHES_PER_SECOND`] (a burst as large).
/// A fetch over the rate is not made: it is an error, which the caller answers as doubt (never "not opted in").
pub struct FetchGuard {
    missing: Mutex<HashMap<String, Instant>>,
    in_flight: Mutex<HashMap<String, Arc<tokio::sync::OnceCell<Fetched>>>>,
    bucket: Mutex<(f64, Instant)>,
    rate: f64,
}

impl Default for FetchGuard {
    fn default() -> Self {
        FetchGuard::new(FETCHES_PER_SECOND)
    }
}

impl FetchGuard {
    /// At most `per_second` fetches a second (and as many at once).
    pub fn new(per_second: u32) -> Self {
        let rate = f64::from(per_second.max(1));
        FetchGuard {
            missing: Mutex::default(),
            in_flight: Mutex::default(),
            bucket: Mutex::new((rate, Instant::now())),
            rate,
        }
    }

    fn take_token(&self) -> bool {
        let mut bucket = self.bucket.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let (tokens, at) = *bucket;
        let tokens = (tokens + now.duration_since(at).as_secs_f64() * self.rate).min(self.rate);
        if tokens >= 1.0 {
            *bucket = (tokens - 1.0, now);
            true
        } else {
            *bucket = (tokens, now);
            false
        }
    }

    fn known_missing(&self, name: &str) -> bool {
        let missing = self.missing.lock().unwrap_or_else(|p| p.into_inner());
        missing
            .get(name)
            .is_some_and(|at| at.elapsed() < MISSING_FOR)
    }

    fn remember_missing(&self, name: &str) {
        let mut missing = self.missing.lock().unwrap_or_else(|p| p.into_inner());
        if missing.len() >= MISSING_REMEMBERED {
            missing.retain(|_, at| at.elapsed() < MISSING_FOR);
            if missing.len() >= MISSING_REMEMBERED {
                // All recent: forgetting them costs at most more fetches, which the rate bounds anyway.
                missing.clear();
            }
        }
        missing.insert(name.to_string(), Instant::now());
    }

    /// `fetch` for `name`, within the bounds: the remembered answer for a missing namespace, the answer of a
    /// fetch already under way for it, or a new fetch if the rate allows one.
    pub async fn fetch<F, Fut>(&self, name: &str, fetch: F) -> Fetched
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Fetched>,
    {
        if self.known_missing(name) {
            return Ok(None);
        }
        let cell = self
            .in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(name.to_string())
            .or_default()
            .clone();
        // Whoever runs the fetch removes the entry when it ends, also when its request is cut off by its deadline
        // (the next caller then fetches anew).
        struct Done<'a>(
            &'a FetchGuard,
            &'a str,
            &'a Arc<tokio::sync::OnceCell<Fetched>>,
        );
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                let mut map = self.0.in_flight.lock().unwrap_or_else(|p| p.into_inner());
                if map.get(self.1).is_some_and(|c| Arc::ptr_eq(c, self.2)) {
                    map.remove(self.1);
                }
            }
        }
        let result = cell
            .get_or_init(|| async {
                let _done = Done(self, name, &cell);
                if !self.take_token() {
                    return Err(format!(
                        "not asked: namespace reads are limited to {} a second and the webhook is receiving more \
                         reviews for namespaces it does not know",
                        self.rate
                    ));
                }
                let result = fetch().await;
                if let Ok(None) = result {
                    self.remember_missing(name);
                }
                result
            })
            .await;
        result.clone()
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
    guard: Arc<FetchGuard>,
    counters: ClusterCounters,
}

impl ClusterNamespaces {
    /// Starts the watch in the background. `synced()` turns true after the first complete list.
    pub fn spawn(client: kube::Client, counters: ClusterCounters) -> Self {
        // `Api<PartialObjectMeta<_>>` makes metadata-only requests: labels, never specs.
        let api: Api<PartialObjectMeta<Namespace>> = Api::all(client.clone());
        let (store, writer) = reflector::store();
        let synced = Arc::new(AtomicBool::new(false));
        // Only the name and labels are read: annotations and managedFields are dropped before the store keeps
        // them, so what a namespace's owner writes there costs the webhook nothing.
        let stream = reflector::reflector(
            writer,
            watcher::watcher(api, watcher::Config::default())
                .default_backoff()
                .modify(|ns| labels_only(&mut ns.metadata)),
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
            guard: Arc::default(),
            counters,
        }
    }
}

/// What the namespace cache keeps of a namespace's metadata: everything but its annotations and managedFields.
fn labels_only(meta: &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) {
    meta.annotations = None;
    meta.managed_fields = None;
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
        Box::pin(self.guard.fetch(name, move || async move {
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
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn the_cache_keeps_name_and_labels_but_no_annotations_or_managed_fields() {
        let mut meta: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta =
            serde_json::from_value(serde_json::json!({
                "name": "shop", "labels": {"pdp-injector.io/injection": "enabled"},
                "annotations": {"big": "x".repeat(200_000)},
                "managedFields": [{"manager": "kubectl", "operation": "Apply"}]
            }))
            .unwrap();
        labels_only(&mut meta);
        assert_eq!(meta.name.as_deref(), Some("shop"));
        assert_eq!(meta.labels.unwrap()["pdp-injector.io/injection"], "enabled");
        assert!(meta.annotations.is_none() && meta.managed_fields.is_none());
    }

    #[tokio::test]
    async fn fetches_are_coalesced_remembered_when_missing_and_rate_limited() {
        let guard = FetchGuard::new(5);
        let gets = AtomicUsize::new(0);
        let get = || async {
            gets.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(20)).await;
            Ok(None)
        };
        // 50 reviews of one unknown name at once: one GET, every caller gets its answer.
        let answers =
            futures_util::future::join_all((0..50).map(|_| guard.fetch("gone", get))).await;
        assert!(answers.iter().all(|a| *a == Ok(None)), "{answers:?}");
        assert_eq!(gets.load(Ordering::SeqCst), 1);
        // Known missing for a while: no GET.
        assert_eq!(guard.fetch("gone", get).await, Ok(None));
        assert_eq!(gets.load(Ordering::SeqCst), 1);
        // Many different names: the bucket's burst, then errors that say why (never "not there").
        let started = Instant::now();
        let guard = &guard;
        let answers = futures_util::future::join_all((0..1000).map(|i| {
            let name = format!("n{i}");
            async move { guard.fetch(&name, get).await }
        }))
        .await;
        let allowed = 5 + (5.0 * started.elapsed().as_secs_f64()).ceil() as usize;
        let made = gets.load(Ordering::SeqCst) - 1;
        assert!(made <= allowed, "{made} GETs, at most {allowed} allowed");
        let limited = answers.iter().filter(|a| a.is_err()).count();
        assert!(limited >= 1000 - allowed, "{limited}");
        assert!(answers.iter().flatten().all(|found| found.is_none()));
        let err = answers.iter().find_map(|a| a.clone().err()).unwrap();
        assert!(err.contains("limited to 5 a second"), "{err}");
    }
}
