//! Whether the cluster has the node plugin's CSIDriver (`csi.pdp-injector.io`): with `socketVolume: auto`, the
//! webhook then gives daemonset-wired Pods the socket as a CSI volume. Read once at start, like the apiserver's
//! version: installing or removing the driver takes a restart of the webhook (`kubectl -n pdp-system rollout
//! restart deployment/pdp-injector`; the install order of the shipped manifests creates the driver first).

use std::time::Duration;

use k8s_openapi::api::storage::v1::CSIDriver;
use kube::Api;
use tracing::{info, warn};

use crate::names::CSI_DRIVER;

/// Reads the CSIDriver; on failure (forbidden, timeout) answers absent and says so: the Pods keep the hostPath
/// or TCP wiring, which works without the plugin.
pub async fn installed(client: &kube::Client) -> bool {
    let api: Api<CSIDriver> = Api::all(client.clone());
    match tokio::time::timeout(Duration::from_secs(10), api.get_opt(CSI_DRIVER)).await {
        Ok(Ok(found)) => {
            let installed = found.is_some();
            info!(
                driver = CSI_DRIVER,
                installed, "the node plugin's CSIDriver (socketVolume auto: CSI when installed)"
            );
            installed
        }
        Ok(Err(e)) => {
            warn!(driver = CSI_DRIVER, error = %e, "cannot read the CSIDriver; assuming it is absent (hostPath or TCP)");
            false
        }
        Err(_) => {
            warn!(
                driver = CSI_DRIVER,
                "reading the CSIDriver timed out; assuming it is absent (hostPath or TCP)"
            );
            false
        }
    }
}
