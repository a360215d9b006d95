//! What the apiserver's version allows the rendering to use.

use std::time::Duration;

use tracing::{info, warn};

use pdp_core::config::supports_native_sidecars;

/// Asks the apiserver for its version; on failure assumes a current server (native sidecars) and says so.
pub async fn native_sidecars(client: &kube::Client) -> bool {
    match tokio::time::timeout(Duration::from_secs(10), client.apiserver_version()).await {
        Ok(Ok(info)) => {
            let native = supports_native_sidecars(&info.major, &info.minor);
            info!(
                version = %info.git_version,
                native_sidecars = native,
                "connected to the apiserver"
            );
            if !native {
                warn!("apiserver older than 1.29: sidecars are rendered as classic containers");
            }
            native
        }
        Ok(Err(e)) => {
            warn!(error = %e, "cannot read the apiserver version; assuming native sidecars are supported");
            true
        }
        Err(_) => {
            warn!("apiserver version request timed out; assuming native sidecars are supported");
            true
        }
    }
}
