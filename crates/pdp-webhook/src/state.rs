//! What every request of the webhook shares: the config in force, the namespace source, the metrics and the
//! bounds. The server builds it; the admission path reads it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use pdp_cluster::namespaces::NamespaceSource;
use pdp_core::config::Config;
use tokio::sync::Semaphore;

use crate::limits::{ConnectionLimit, MemoryBounds};
use crate::metrics::Metrics;

/// Shared by every request.
pub struct AppState {
    pub(crate) config: RwLock<Arc<Config>>,
    pub(crate) namespaces: Arc<dyn NamespaceSource>,
    /// The process's metrics.
    pub metrics: Metrics,
    pub(crate) bound: AtomicBool,
    pub(crate) shutting_down: AtomicBool,
    /// Reviews being computed.
    pub(crate) permits: Arc<Semaphore>,
    /// Requests being received (body still arriving) or computed: four times `permits`, so that slow bodies
    /// cannot take the permits that finished requests need.
    pub(crate) readers: Arc<Semaphore>,
    pub(crate) body_limit: usize,
    /// Bytes of request bodies held at once, across all requests.
    pub(crate) body_budget: Arc<Semaphore>,
    pub(crate) bounds: MemoryBounds,
    pub(crate) connections: ConnectionLimit,
    pub(crate) request_timeout: Duration,
}

impl AppState {
    /// The config in force.
    pub fn config(&self) -> Arc<Config> {
        self.config
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    pub(crate) fn set_config(&self, config: Config) {
        *self
            .config
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Arc::new(config);
    }

    /// Ready: bound, not shutting down, namespaces synced (certs and config were valid to get here).
    pub fn ready(&self) -> Result<(), &'static str> {
        if self.shutting_down.load(Ordering::SeqCst) {
            Err("shutting down")
        } else if !self.bound.load(Ordering::SeqCst) {
            Err("not listening yet")
        } else if !self.namespaces.synced() {
            Err("namespace cache not synced yet")
        } else {
            Ok(())
        }
    }
}
