//! The sync source's metrics, registered under `pdp_flag_sync_*`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Why a stream or a call was refused.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Refusal {
    /// The gRPC status: `permission_denied`, `invalid_argument`, `resource_exhausted`, `unavailable`.
    pub code: &'static str,
}

/// What the service and its sources count.
#[derive(Debug)]
pub struct Metrics {
    /// Open SyncFlags streams.
    pub subscribers: Gauge,
    /// Flag sets in the newest snapshot.
    pub flag_sets: Gauge,
    /// The newest snapshot's generation.
    pub generation: Gauge,
    /// Configurations sent on streams.
    pub sent: Counter,
    /// From a snapshot's making to its configuration's sending on a stream, in seconds.
    pub update_lag: Histogram,
    /// Streams and calls refused, by status.
    pub refused: Family<Refusal, Counter>,
    /// Objects a source could not read as a flag set (their last good version is kept).
    pub rejected_sets: Counter,
    /// On a relay: the generation of its source's newest state it has (0: none yet).
    pub upstream_generation: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            subscribers: Gauge::default(),
            flag_sets: Gauge::default(),
            generation: Gauge::default(),
            sent: Counter::default(),
            update_lag: Histogram::new([0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5]),
            refused: Family::default(),
            rejected_sets: Counter::default(),
            upstream_generation: Gauge::default(),
        }
    }
}

impl Metrics {
    /// Registers every metric in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("pdp_flag_sync");
        r.register(
            "subscribers",
            "Open SyncFlags streams",
            self.subscribers.clone(),
        );
        r.register(
            "flag_sets",
            "Flag sets in the newest snapshot",
            self.flag_sets.clone(),
        );
        r.register(
            "generation",
            "Generation of the newest snapshot",
            self.generation.clone(),
        );
        r.register(
            "sent",
            "Flag configurations sent on SyncFlags streams",
            self.sent.clone(),
        );
        r.register(
            "update_lag_seconds",
            "From a flag change to its configuration sent on a stream",
            self.update_lag.clone(),
        );
        r.register(
            "refused",
            "Streams and calls refused, by gRPC status",
            self.refused.clone(),
        );
        r.register(
            "rejected_sets",
            "Objects not readable as a flag set",
            self.rejected_sets.clone(),
        );
        r.register(
            "upstream_generation",
            "On a relay: the generation of its source's newest state",
            self.upstream_generation.clone(),
        );
    }

    /// Counts one refusal.
    pub fn refuse(&self, code: &'static str) {
        self.refused.get_or_create(&Refusal { code }).inc();
    }
}
