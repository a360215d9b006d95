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

/// The number at the start of an apiserver version part (`"28+"` is 28); `None` when it has none.
pub fn version_part(part: &str) -> Option<u32> {
    part.chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .ok()
}

/// Whether the apiserver stores native sidecars (init containers with `restartPolicy: Always` and probes):
/// Kubernetes 1.29 and later. Older servers silently drop the restart policy and refuse the probes.
pub fn supports_native_sidecars(major: &str, minor: &str) -> bool {
    match (version_part(major), version_part(minor)) {
        (Some(1), Some(minor)) => minor >= 29,
        (Some(major), _) => major > 1,
        _ => true,
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
        assert_eq!(version_part("28+"), Some(28));
        assert_eq!(version_part("x"), None);
    }
}
