//! What the apiserver's version allows the rendering to use.

use std::time::Duration;

use tracing::{info, warn};

/// Whether the apiserver stores native sidecars (init containers with `restartPolicy: Always` and probes):
/// Kubernetes 1.29 and later. Older servers silently drop the restart policy and refuse the probes.
pub fn supports_native_sidecars(major: &str, minor: &str) -> bool {
    let digits = |s: &str| {
        s.chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse::<u32>()
            .ok()
    };
    match (digits(major), digits(minor)) {
        (Some(1), Some(minor)) => minor >= 29,
        (Some(major), _) => major > 1,
        _ => true,
    }
}

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
    }
}
