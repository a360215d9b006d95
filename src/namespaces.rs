//! Where the webhook learns a namespace's labels. The request path only reads memory: no API call per request.

use std::future::Future;
use std::pin::Pin;

use crate::decision::NamespaceInfo;

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
