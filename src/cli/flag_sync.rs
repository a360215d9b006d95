//! `pdp-injector flag-sync`: flagd's gRPC sync source, fed by one watch of the cluster's flag objects (or a
//! directory of flag files), each stream scoped to its caller's namespace.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::http::StatusCode;
use clap::{Args, ValueEnum};
use pdp_flagsync::metrics::Metrics;
use pdp_flagsync::relay::{self as source_relay, RelayService, TokenReviewer};
use pdp_flagsync::server::{Listeners, serve};
use pdp_flagsync::service::{FixedNamespace, Identify, Pods};
use pdp_flagsync::source;
use pdp_flagsync::source::pods::PodIndex;
use pdp_flagsync::{Origin, Store, SyncService};
use prometheus_client::registry::Registry;

use super::{LogArgs, init_logging, runtime, shutdown_signal};
use pdp_core::duration::duration_flag;

/// A kind of flag object the cluster source watches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Kind {
    /// FeatureFlag objects, core.openfeature.dev/v1beta1.
    Featureflags,
    /// ConfigMaps labelled pdp-injector.io/flags=true.
    Configmaps,
}

#[derive(Args)]
pub(crate) struct FlagSyncArgs {
    #[command(flatten)]
    log: LogArgs,
    /// gRPC addresses of flagd.sync.v1 (flagd's sync port is 8015); repeatable or comma-separated.
    #[arg(
        long,
        env = "PDP_FLAG_SYNC_LISTEN",
        value_delimiter = ',',
        default_value = "0.0.0.0:8015"
    )]
    listen: Vec<SocketAddr>,
    /// Unix sockets to serve too; repeatable.
    #[arg(long, env = "PDP_FLAG_SYNC_SOCKET")]
    socket: Vec<PathBuf>,
    /// Address of /healthz, /readyz and /metrics.
    #[arg(
        long,
        env = "PDP_FLAG_SYNC_MANAGEMENT_LISTEN",
        default_value = "0.0.0.0:8014"
    )]
    management_listen: SocketAddr,
    /// Serve DIR/NAMESPACE/NAME.flagd.json files instead of the cluster's flag objects.
    #[arg(long, env = "PDP_FLAG_SYNC_FLAGS_DIR")]
    flags_dir: Option<PathBuf>,
    /// How often the flags directory is scanned.
    #[arg(long, env = "PDP_FLAG_SYNC_POLL_INTERVAL", default_value = "250ms", value_parser = duration_flag)]
    poll_interval: Duration,
    /// The flag object kinds watched in the cluster.
    #[arg(
        long,
        env = "PDP_FLAG_SYNC_KINDS",
        value_enum,
        value_delimiter = ',',
        default_value = "featureflags,configmaps"
    )]
    kinds: Vec<Kind>,
    /// The namespace whose flag sets every caller may read.
    #[arg(
        long,
        env = "PDP_FLAG_SYNC_SHARED_NAMESPACE",
        default_value = "pdp-system"
    )]
    shared_namespace: String,
    /// Count every caller as of this namespace, instead of knowing callers by their Pod's address.
    #[arg(long, env = "PDP_FLAG_SYNC_CALLER_NAMESPACE")]
    caller_namespace: Option<String>,
    /// The most SyncFlags streams served at once.
    #[arg(long, env = "PDP_FLAG_SYNC_MAX_STREAMS", default_value_t = 4096)]
    max_streams: usize,
    /// Relay mode: follow this central source (http://pdp-flag-sync.pdp-system.svc:8015) instead of the API.
    #[arg(long, env = "PDP_FLAG_SYNC_UPSTREAM", conflicts_with = "flags_dir")]
    upstream: Option<String>,
    /// Relay mode: this node's name (the Downward API's spec.nodeName).
    #[arg(long, env = "NODE_NAME", requires = "upstream")]
    node_name: Option<String>,
    /// Relay mode: the projected ServiceAccount token (audience pdp-flag-sync) shown to the source.
    #[arg(
        long,
        env = "PDP_FLAG_SYNC_TOKEN_FILE",
        default_value = "/var/run/secrets/pdp-flag-sync/token"
    )]
    token_file: PathBuf,
    /// The ServiceAccounts whose tokens may follow the node relay stream; repeatable or comma-separated.
    #[arg(
        long,
        env = "PDP_FLAG_SYNC_RELAY_USERS",
        value_delimiter = ',',
        default_value = "system:serviceaccount:pdp-flags:pdp-flag-relay"
    )]
    relay_users: Vec<String>,
}

/// Where the flag sets come from.
enum Mode {
    Files(PathBuf),
    Cluster,
    Relay(source_relay::Upstream),
}

pub(crate) fn run(args: FlagSyncArgs) -> anyhow::Result<()> {
    init_logging(args.log.log_format);
    runtime()?.block_on(run_async(args))
}

async fn run_async(args: FlagSyncArgs) -> anyhow::Result<()> {
    let mode = match (&args.flags_dir, &args.upstream) {
        (Some(dir), _) => Mode::Files(dir.clone()),
        (None, Some(url)) => {
            let node = args
                .node_name
                .clone()
                .context("relay mode needs --node-name (NODE_NAME)")?;
            Mode::Relay(source_relay::Upstream {
                url: url.clone(),
                node,
                token_file: args.token_file.clone(),
            })
        }
        (None, None) => Mode::Cluster,
    };
    let metrics = Arc::new(Metrics::default());
    let pods = Arc::new(PodIndex::default());
    let origins: Vec<Origin> = match &mode {
        Mode::Files(_) => vec![Origin::File],
        Mode::Relay(_) => vec![Origin::FeatureFlag],
        Mode::Cluster => args
            .kinds
            .iter()
            .map(|k| match k {
                Kind::Featureflags => Origin::FeatureFlag,
                Kind::Configmaps => Origin::ConfigMap,
            })
            .collect(),
    };
    let store = Arc::new(Store::new(&origins));
    tokio::spawn(source::track(store.clone(), metrics.clone()));

    let needs_cluster = matches!(mode, Mode::Cluster)
        || (matches!(mode, Mode::Files(_)) && args.caller_namespace.is_none());
    let client = if needs_cluster {
        Some(kube::Client::try_default().await.context(
            "flag-sync needs the cluster (in-cluster config or KUBECONFIG), unless it relays (--upstream) or serves files to one namespace (--flags-dir and --caller-namespace)",
        )?)
    } else {
        None
    };
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let mut relay_service = None;
    match (&mode, &client) {
        (Mode::Files(dir), _) => {
            tokio::spawn(source::dir::run(
                dir.clone(),
                args.poll_interval,
                store.clone(),
                metrics.clone(),
            ));
        }
        (Mode::Relay(upstream), _) => {
            tokio::spawn(source_relay::follow(
                upstream.clone(),
                store.clone(),
                pods.clone(),
                metrics.clone(),
            ));
        }
        (Mode::Cluster, Some(client)) => {
            for origin in &origins {
                let (c, s, m) = (client.clone(), store.clone(), metrics.clone());
                match origin {
                    Origin::FeatureFlag => tokio::spawn(source::kube::feature_flags(c, s, m)),
                    _ => tokio::spawn(source::kube::config_maps(c, s, m)),
                };
            }
            let reviewer = Arc::new(TokenReviewer::new(client.clone(), args.relay_users.clone()));
            relay_service = Some(RelayService::new(
                store.clone(),
                pods.clone(),
                reviewer,
                stop.clone(),
            ));
        }
        (Mode::Cluster, None) => unreachable!("the cluster mode always has a client"),
    }
    let identify: Arc<dyn Identify> = match (&args.caller_namespace, &client, &mode) {
        (Some(ns), _, _) => Arc::new(FixedNamespace(ns.clone())),
        (None, _, Mode::Relay(_)) => Arc::new(Pods(pods.clone())),
        (None, Some(client), _) => {
            tokio::spawn(source::pods::follow(client.clone(), pods.clone()));
            Arc::new(Pods(pods.clone()))
        }
        (None, None, _) => unreachable!(
            "without a caller namespace the cluster client or the relay knows the Pods"
        ),
    };
    let service = SyncService::new(
        store.clone(),
        identify,
        args.shared_namespace.clone(),
        metrics.clone(),
        args.max_streams,
        stop.clone(),
    );
    let mut registry = Registry::default();
    metrics.register(&mut registry);
    let management = management(args.management_listen, store.clone(), Arc::new(registry)).await?;
    let listeners = Listeners {
        tcp: args.listen,
        sockets: args.socket,
    };
    let server = tokio::spawn(serve(service, relay_service, listeners, stop));
    tokio::select! {
        _ = shutdown_signal() => {}
        done = management => {
            done.context("management server")?.context("management server")?;
        }
    }
    stop_tx.send_replace(true);
    server.await.context("flag sync server")??;
    Ok(())
}

/// Serves /healthz, /readyz (true once every source has listed its flag sets) and /metrics.
async fn management(
    addr: SocketAddr,
    store: Arc<Store>,
    registry: Arc<Registry>,
) -> anyhow::Result<tokio::task::JoinHandle<std::io::Result<()>>> {
    let app = super::management::router(registry).route(
        "/readyz",
        axum::routing::get(move || {
            let ready = store.current().ready;
            async move {
                if ready {
                    (StatusCode::OK, "ready")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "flag sets not listed yet")
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    tracing::info!(%addr, "flag sync management listening");
    Ok(tokio::spawn(
        async move { axum::serve(listener, app).await },
    ))
}
