//! The config as the webhook uses it in one cluster: `serve` applies it to every review and `check` judges
//! Pods by the same, so the hashes `check` compares are the ones the webhook writes.

use super::Config;

/// Facts about the cluster that adapt every config, the first and each reloaded one.
#[derive(Debug, Clone)]
pub struct ClusterFit {
    /// False on apiservers older than 1.29: every profile's sidecar is rendered as a classic container.
    pub native_sidecars: bool,
    /// The namespace the webhook runs in: never injected, whatever the config file says.
    pub own_namespace: Option<String>,
    /// Whether the cluster has the CSIDriver `csi.pdp-injector.io` (`socketVolume: auto` then means CSI).
    /// Unknown counts as absent: the Pod keeps the hostPath or TCP wiring it had before the driver existed.
    pub csi_driver: bool,
}

impl Default for ClusterFit {
    fn default() -> Self {
        ClusterFit {
            native_sidecars: true,
            own_namespace: None,
            csi_driver: false,
        }
    }
}

impl ClusterFit {
    /// The config as the webhook uses it in this cluster (`check` judges Pods by the same).
    pub fn apply(&self, mut config: Config) -> Config {
        if let Some(ns) = &self.own_namespace {
            config.excluded_namespaces.insert(ns.clone());
        }
        if self.csi_driver {
            config = config.with_csi_driver(true);
        }
        if self.native_sidecars {
            config
        } else {
            config.with_classic_sidecars()
        }
    }
}
