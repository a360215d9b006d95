//! Whether the cluster has the node plugin's CSIDriver (`csi.pdp-injector.io`): with `socketVolume: auto`, the
//! webhook then gives daemonset-wired Pods the socket as a CSI volume. Read at start and then every
//! [`POLL`] (one GET of one object), because an install may create the driver after the webhook started (Helm
//! applies kinds it does not know, such as CSIDriver, last); a change re-applies the config.

use std::time::Duration;

use tokio::sync::watch;

use k8s_openapi::api::storage::v1::CSIDriver;
use kube::Api;
use tracing::{info, warn};

use pdp_core::names::CSI_DRIVER;

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

/// How often the CSIDriver is read again.
pub const POLL: Duration = Duration::from_secs(30);

/// Reads the CSIDriver now, then every [`POLL`] in the background; the receiver holds the latest answer (a
/// failed read keeps the last one).
pub async fn watch(client: &kube::Client) -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(installed(client).await);
    let client = client.clone();
    tokio::spawn(async move {
        let api: Api<CSIDriver> = Api::all(client);
        loop {
            tokio::time::sleep(POLL).await;
            if tx.is_closed() {
                return;
            }
            if let Ok(Ok(found)) =
                tokio::time::timeout(Duration::from_secs(10), api.get_opt(CSI_DRIVER)).await
            {
                let now = found.is_some();
                if *tx.borrow() != now {
                    info!(
                        driver = CSI_DRIVER,
                        installed = now,
                        "the node plugin's CSIDriver changed"
                    );
                    tx.send_replace(now);
                }
            }
        }
    });
    rx
}
