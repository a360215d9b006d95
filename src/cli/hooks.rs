//! The chart's hook Jobs, run from the project's own image (no shell, no kubectl):
//!
//! - `wait-ready` (post-install, post-upgrade): waits until the webhook answers as the apiserver calls it. Reads
//!   one object (its MutatingWebhookConfiguration, for the Service and the caBundle), then asks GET /readyz
//!   through that Service with the caBundle as the only trust, until 200 or the timeout.
//! - `unregister` (pre-delete): deletes the MutatingWebhookConfiguration before Helm deletes the webhook's Pods,
//!   so that Pod creation in opted-in namespaces (failurePolicy Fail) never meets a webhook that is gone.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use kube::api::{Api, DeleteParams};
use rustls_pki_types::ServerName;

use super::runtime;
use pdp_core::check::analyse::endpoint;
use pdp_core::check::certs;
use pdp_core::names::DEFAULT_NAME;
use pdp_tls as tls;

#[derive(Args)]
pub(crate) struct WaitReadyArgs {
    /// The MutatingWebhookConfiguration whose Service and caBundle are used.
    #[arg(long, env = "PDP_INJECTOR_WEBHOOK_CONFIG", default_value = DEFAULT_NAME)]
    webhook_config: String,
    /// Give up after this long (exit status 1, with the last reason).
    #[arg(long, default_value = "180s", value_parser = pdp_core::duration::duration_flag)]
    timeout: Duration,
    /// Pause between attempts.
    #[arg(long, default_value = "2s", value_parser = pdp_core::duration::duration_flag)]
    interval: Duration,
    /// Bound on each connection, handshake and answer.
    #[arg(long, default_value = "3s", value_parser = pdp_core::duration::duration_flag)]
    attempt_timeout: Duration,
}

/// Exit status 0 once /readyz answered 200 through a trusted handshake; 1 at the timeout.
pub(crate) fn run(args: WaitReadyArgs) -> anyhow::Result<u8> {
    let start = Instant::now();
    let rt = runtime()?;
    let client = rt.block_on(kube::Client::try_default()).map_err(|e| {
        anyhow::anyhow!("no cluster (in-cluster ServiceAccount or kubeconfig): {e}")
    })?;
    let api = Api::<MutatingWebhookConfiguration>::all(client);
    let mut last = String::new();
    loop {
        let reason = match rt.block_on(api.get_opt(&args.webhook_config)) {
            Err(e) => format!(
                "cannot read MutatingWebhookConfiguration {}: {e}",
                args.webhook_config
            ),
            Ok(None) => format!(
                "MutatingWebhookConfiguration {} does not exist",
                args.webhook_config
            ),
            Ok(Some(mwc)) => match target(&mwc) {
                Err(why) => why,
                Ok((name, dial, bundle)) => {
                    match readyz(&dial, &name, &bundle, args.attempt_timeout) {
                        Ok(()) => {
                            println!(
                                "ready: https://{dial}/readyz answered 200 with a certificate the caBundle of {} trusts ({}s)",
                                args.webhook_config,
                                start.elapsed().as_secs()
                            );
                            return Ok(0);
                        }
                        Err(why) => format!("https://{dial}/readyz: {why}"),
                    }
                }
            },
        };
        if reason != last {
            eprintln!("waiting ({}s): {reason}", start.elapsed().as_secs());
            last = reason;
        }
        if start.elapsed() + args.interval >= args.timeout {
            eprintln!(
                "FAIL: the webhook did not answer within {}s: {last}. Look at `kubectl -n <namespace> get pods,events` \
                 and `kubectl -n <namespace> logs deploy/pdp-injector` in the webhook's namespace",
                args.timeout.as_secs()
            );
            return Ok(1);
        }
        std::thread::sleep(args.interval);
    }
}

/// The Service's server name, the address to dial and the caBundle of the configuration's first webhook.
fn target(mwc: &MutatingWebhookConfiguration) -> Result<(String, String, Vec<u8>), String> {
    let w = mwc
        .webhooks
        .iter()
        .flatten()
        .next()
        .ok_or("the configuration has no webhook")?;
    let (name, dial) = endpoint(w).ok_or("the first webhook names no Service or https URL")?;
    match &w.client_config.ca_bundle {
        Some(b) if !b.0.is_empty() => Ok((name, dial, b.0.clone())),
        // Self-managed certificates: the webhook patches it once it has generated its CA.
        _ => Err("its caBundle is still empty".into()),
    }
}

/// One GET /readyz over TLS trusting only `ca_bundle` for `server_name`: Ok on status 200.
fn readyz(
    dial: &str,
    server_name: &str,
    ca_bundle: &[u8],
    timeout: Duration,
) -> Result<(), String> {
    let roots = certs::roots(ca_bundle).map_err(|e| format!("unusable caBundle: {e}"))?;
    let addr = dial
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve: {e}"))?
        .next()
        .ok_or("no address")?;
    let mut sock =
        TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("cannot connect: {e}"))?;
    sock.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    sock.set_write_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    let name = ServerName::try_from(server_name.to_string()).map_err(|e| e.to_string())?;
    let config = rustls::ClientConfig::builder_with_provider(tls::provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let mut conn =
        rustls::ClientConnection::new(Arc::new(config), name).map_err(|e| e.to_string())?;
    let mut stream = rustls::Stream::new(&mut conn, &mut sock);
    let request =
        format!("GET /readyz HTTP/1.1\r\nHost: {server_name}\r\nConnection: close\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .map_err(|e| match e.kind() {
            ErrorKind::InvalidData => {
                format!("TLS handshake failed (is the caBundle the serving CA?): {e}")
            }
            _ => e.to_string(),
        })?;
    // The status line is all that is needed: read until it is complete (or the server closes).
    let mut head = Vec::new();
    let mut buf = [0u8; 256];
    while !head.contains(&b'\n') && head.len() < 4096 {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
            Err(e) => return Err(e.to_string()),
        }
    }
    let line = String::from_utf8_lossy(&head);
    let line = line.lines().next().unwrap_or("").trim();
    match line.split_whitespace().nth(1) {
        Some("200") => Ok(()),
        Some(_) => Err(format!("answered {line:?}")),
        None => Err("no HTTP answer".into()),
    }
}

#[derive(Args)]
pub(crate) struct UnregisterArgs {
    /// The MutatingWebhookConfiguration to delete.
    #[arg(long, env = "PDP_INJECTOR_WEBHOOK_CONFIG", default_value = DEFAULT_NAME)]
    webhook_config: String,
}

/// Deletes the configuration; one that is already gone is success.
pub(crate) fn unregister(args: UnregisterArgs) -> anyhow::Result<()> {
    runtime()?.block_on(async {
        let client = kube::Client::try_default().await.map_err(|e| {
            anyhow::anyhow!("no cluster (in-cluster ServiceAccount or kubeconfig): {e}")
        })?;
        let api = Api::<MutatingWebhookConfiguration>::all(client);
        match api
            .delete(&args.webhook_config, &DeleteParams::default())
            .await
        {
            Ok(_) => println!(
                "deleted MutatingWebhookConfiguration {}",
                args.webhook_config
            ),
            Err(kube::Error::Api(s)) if s.is_not_found() => {
                println!(
                    "MutatingWebhookConfiguration {} is already gone",
                    args.webhook_config
                )
            }
            Err(e) => anyhow::bail!(
                "cannot delete MutatingWebhookConfiguration {}: {e}",
                args.webhook_config
            ),
        }
        anyhow::Ok(())
    })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::ByteString;
    use k8s_openapi::api::admissionregistration::v1::{
        MutatingWebhook, ServiceReference, WebhookClientConfig,
    };

    use super::*;

    fn config(ca_bundle: Option<&[u8]>) -> MutatingWebhookConfiguration {
        MutatingWebhookConfiguration {
            webhooks: Some(vec![MutatingWebhook {
                name: "pods.pdp-injector.io".into(),
                client_config: WebhookClientConfig {
                    service: Some(ServiceReference {
                        name: "pdp-injector".into(),
                        namespace: "pdp-system".into(),
                        port: Some(443),
                        ..Default::default()
                    }),
                    ca_bundle: ca_bundle.map(|b| ByteString(b.to_vec())),
                    ..Default::default()
                },
                ..Default::default()
            }]),
            ..Default::default()
        }
    }

    #[test]
    fn the_target_is_the_first_webhooks_service_once_it_has_a_ca_bundle() {
        let (name, dial, bundle) = target(&config(Some(b"PEM"))).unwrap();
        assert_eq!(name, "pdp-injector.pdp-system.svc");
        assert_eq!(dial, "pdp-injector.pdp-system.svc:443");
        assert_eq!(bundle, b"PEM");
        assert_eq!(
            target(&config(None)).unwrap_err(),
            "its caBundle is still empty"
        );
        assert_eq!(
            target(&config(Some(b""))).unwrap_err(),
            "its caBundle is still empty"
        );
        assert!(target(&MutatingWebhookConfiguration::default()).is_err());
    }
}
