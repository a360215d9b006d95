//! What the webhook keeps in step with the cluster, in the background: namespace labels, the apiserver's
//! version, and the self-managed certificates. Nothing here runs on the request path except in-memory reads.

pub mod csi_driver;
pub mod install;
pub mod namespaces;
pub mod selfcerts;
pub mod versions;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

pub use install::InstallNames;
pub use namespaces::{ClusterNamespaces, FetchFuture, NamespaceSource, NoCluster, Static};

/// The `result` label of the counters of work that succeeds or fails.
pub type ResultLabel = [(&'static str, &'static str); 1];

pub fn result(ok: bool) -> ResultLabel {
    [("result", if ok { "success" } else { "failure" })]
}

/// What the webhook's background work against the cluster counts: the certificate reconcile loop and the
/// namespace cache. Shared with those tasks (clones count into the same series).
#[derive(Debug, Clone, Default)]
pub struct ClusterCounters {
    cert_reconciles: Family<ResultLabel, Counter>,
    namespace_fetches: Family<ResultLabel, Counter>,
    watch_errors: Family<[(&'static str, &'static str); 1], Counter>,
}

impl ClusterCounters {
    /// A self-managed certificate reconcile pass succeeded or failed.
    pub fn cert_reconcile(&self, ok: bool) {
        self.cert_reconciles.get_or_create(&result(ok)).inc();
    }

    /// The watch of the certificate Secret failed (it retries with backoff).
    pub fn watch_error(&self) {
        self.watch_errors
            .get_or_create(&[("resource", "secrets")])
            .inc();
    }

    /// The namespace watch failed (it retries with backoff).
    pub fn namespace_watch_error(&self) {
        self.watch_errors
            .get_or_create(&[("resource", "namespaces")])
            .inc();
    }

    /// A namespace was fetched from the apiserver because the cache could not answer.
    pub fn namespace_fetch(&self, ok: bool) {
        self.namespace_fetches.get_or_create(&result(ok)).inc();
    }

    /// Registers the series (at zero) with the webhook's registry.
    pub fn register(&self, registry: &mut Registry) {
        // Every series exists from the start, at zero, so alerts and rates see it before the first event.
        for ok in [true, false] {
            drop(self.cert_reconciles.get_or_create(&result(ok)));
            drop(self.namespace_fetches.get_or_create(&result(ok)));
        }
        for resource in ["namespaces", "secrets"] {
            drop(self.watch_errors.get_or_create(&[("resource", resource)]));
        }
        registry.register(
            "pdp_injector_certificate_reconciles",
            "Self-managed certificate reconcile passes (Secret and caBundle), by result",
            self.cert_reconciles.clone(),
        );
        registry.register(
            "pdp_injector_namespace_fetches",
            "Namespaces read from the apiserver because the cache could not answer, by result",
            self.namespace_fetches.clone(),
        );
        registry.register(
            "pdp_injector_watch_errors",
            "Errors of the watches the webhook keeps (they retry with backoff), by watched resource",
            self.watch_errors.clone(),
        );
    }
}
