//! Where the webhook learns a namespace's labels. The request path only reads memory: no API call per request.

use crate::decision::NamespaceInfo;

/// A source of namespace facts for the core.
pub trait NamespaceSource: Send + Sync {
    /// What is known of `name` now. An unknown namespace yields a bare [`NamespaceInfo`] (no labels).
    fn lookup(&self, name: &str) -> NamespaceInfo;
    /// True once the source has its first complete view (readiness waits for it).
    fn synced(&self) -> bool;
}

/// No cluster (local `serve`, tests): every namespace is unlabelled, so only Pod annotations opt in and the
/// config's default Pod Security level applies.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoCluster;

impl NamespaceSource for NoCluster {
    fn lookup(&self, name: &str) -> NamespaceInfo {
        NamespaceInfo::named(name)
    }

    fn synced(&self) -> bool {
        true
    }
}

/// A fixed set of namespaces, for tests and for running against a known layout.
#[derive(Debug, Default, Clone)]
pub struct Static(pub std::collections::HashMap<String, NamespaceInfo>);

impl NamespaceSource for Static {
    fn lookup(&self, name: &str) -> NamespaceInfo {
        self.0
            .get(name)
            .cloned()
            .unwrap_or_else(|| NamespaceInfo::named(name))
    }

    fn synced(&self) -> bool {
        true
    }
}
