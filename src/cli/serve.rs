//! `pdp-injector serve`: the webhook, with its certificate source (files, self-managed Secret, or self-signed
//! for local runs) and its cluster connection chosen from the flags.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, ValueEnum};

use super::{LogArgs, init_logging, runtime, shutdown_signal};
use pdp_cluster::{NamespaceSource, NoCluster, selfcerts};
use pdp_tls::certs;
use pdp_tls::{TlsFiles, TlsMaterial};
use pdp_webhook::server::{self, ServeFlags, ServeOptions, TlsSource};

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum ClusterMode {
    /// Connect when a kubeconfig or in-cluster config is found, else run without a cluster.
    Auto,
    /// Never connect: namespaces count as unlabelled.
    Off,
}

#[derive(Args)]
pub(crate) struct ServeArgs {
    /// Serving certificate chain (PEM); without --cert and --key, a self-signed CA and certificate are generated.
    #[arg(long, env = "PDP_INJECTOR_CERT", requires = "key")]
    cert: Option<PathBuf>,
    /// Private key of the serving certificate (PEM).
    #[arg(long, env = "PDP_INJECTOR_KEY", requires = "cert")]
    key: Option<PathBuf>,
    /// CA for client certificates: when set, clients without a valid certificate are refused (mTLS).
    #[arg(long, env = "PDP_INJECTOR_CLIENT_CA")]
    client_ca: Option<PathBuf>,
    #[command(flatten)]
    log: LogArgs,
    /// Keep the CA and serving certificate in a Secret (create, renew, patch caBundle) instead of files.
    #[arg(long, env = "PDP_INJECTOR_SELF_MANAGED_CERTS", conflicts_with_all = ["cert", "key"])]
    self_managed_certs: bool,
    /// Cluster connection (KUBECONFIG or in-cluster) for namespace labels and the apiserver version.
    #[arg(long, env = "PDP_INJECTOR_CLUSTER", value_enum, default_value = "auto")]
    cluster: ClusterMode,
    /// Where the self-signed CA and certificate are written when no --cert/--key are given.
    #[arg(long, env = "PDP_INJECTOR_SELF_SIGNED_DIR", default_value_os_t = std::env::temp_dir().join("pdp-injector"))]
    self_signed_dir: PathBuf,
    #[command(flatten)]
    server: ServeFlags,
    #[command(flatten)]
    pub(crate) certificates: selfcerts::Settings,
    #[command(flatten)]
    pub(crate) old_namespace: super::OldNamespaceFlag,
}

/// The cluster client, or `None` (said in the log) when there is no cluster to talk to.
async fn connect(mode: ClusterMode) -> Option<kube::Client> {
    if mode == ClusterMode::Off {
        tracing::info!("--cluster off: namespaces count as unlabelled; Pods opt in by annotation");
        return None;
    }
    match kube::Config::infer().await {
        Ok(config) => match kube::Client::try_from(config) {
            Ok(client) => Some(client),
            Err(e) => {
                tracing::warn!(error = %e, "cluster config found but unusable; running without a cluster");
                None
            }
        },
        Err(_) => {
            tracing::info!(
                "no cluster (no kubeconfig, not in a Pod): namespaces count as unlabelled; Pods opt in by annotation"
            );
            None
        }
    }
}

/// The first self-managed certificate: retried until the API answers (the server cannot start without one).
async fn first_certificate(client: &kube::Client, settings: &selfcerts::Settings) -> TlsMaterial {
    let mut delay = Duration::from_millis(500);
    loop {
        match selfcerts::reconcile(client, settings).await {
            Ok(material) => return material,
            Err(e) => {
                tracing::warn!(error = %e, retry_in = ?delay, "self-managed certificates not ready");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(30));
            }
        }
    }
}

/// A CA and a certificate for localhost and the webhook's Service, written where the user can find the CA.
fn self_signed(
    dir: &std::path::Path,
    webhook: &certs::ServiceName,
    client_ca_pem: Option<Vec<u8>>,
) -> anyhow::Result<TlsMaterial> {
    let mut sans = vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
    ];
    sans.extend(webhook.sans());
    let bundle = certs::generate(&sans, 30, 30)?;
    certs::write_bundle(&bundle, dir)?;
    let ca = dir.join("ca.crt");
    tracing::warn!(
        ca = %ca.display(),
        "no --cert/--key: serving a generated self-signed certificate for localhost; trust it with --cacert {}",
        ca.display()
    );
    Ok(TlsMaterial {
        cert_pem: bundle.cert_pem.into_bytes(),
        key_pem: bundle.key_pem.into_bytes(),
        client_ca_pem,
    })
}

pub(crate) fn run(mut args: ServeArgs) -> anyhow::Result<()> {
    init_logging(args.log.log_format);
    args.old_namespace
        .apply(&mut args.certificates.names.webhook);
    let client_ca_pem = match &args.client_ca {
        Some(p) => Some(
            std::fs::read(p).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", p.display()))?,
        ),
        None => None,
    };
    let files = match (&args.cert, &args.key) {
        (Some(cert), Some(key)) => Some(TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: args.client_ca.clone(),
        }),
        _ => None,
    };
    runtime()?.block_on(async {
        let client = connect(args.cluster).await;
        let counters = pdp_cluster::ClusterCounters::default();
        let tls_source = match files {
            Some(files) => TlsSource::Files(files),
            None if args.self_managed_certs => {
                let Some(client) = client.clone() else {
                    anyhow::bail!(
                        "--self-managed-certs needs a cluster connection (in-cluster or KUBECONFIG)"
                    );
                };
                let mut settings = args.certificates.clone();
                settings.client_ca_pem = client_ca_pem;
                let material = first_certificate(&client, &settings).await;
                let (tx, rx) = tokio::sync::watch::channel(material);
                tokio::spawn(selfcerts::keep_reconciling(
                    client,
                    settings,
                    tx,
                    counters.clone(),
                ));
                TlsSource::Watched(rx)
            }
            None => TlsSource::Fixed(self_signed(
                &args.self_signed_dir,
                &args.certificates.names.webhook,
                client_ca_pem,
            )?),
        };
        let mut options = ServeOptions::with_flags(args.server.clone(), tls_source);
        options.fit.own_namespace = Some(args.certificates.names.webhook.namespace.clone());
        options.cluster_counters = counters.clone();
        let namespaces: Arc<dyn NamespaceSource> = match &client {
            Some(client) => {
                options.fit.native_sidecars = pdp_cluster::versions::native_sidecars(client).await;
                options.csi_driver = Some(pdp_cluster::csi_driver::watch(client).await);
                Arc::new(pdp_cluster::ClusterNamespaces::spawn(
                    client.clone(),
                    counters.clone(),
                ))
            }
            None => Arc::new(NoCluster),
        };
        let running = server::start(options, namespaces).await?;
        shutdown_signal().await;
        running.shutdown().await?;
        anyhow::Ok(())
    })
}
