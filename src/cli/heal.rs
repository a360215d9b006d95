//! `pdp-injector heal`: the opt-in reconciler that replaces, through their controllers, the Pods admitted unwired
//! (while the webhook was not called) or wired by an older config. Off unless installed (chart `heal.enabled`).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use prometheus_client::registry::Registry;

use super::{LogArgs, init_logging, runtime, shutdown_signal};
use pdp_check::heal::{HealMetrics, Healer, Options};
use pdp_core::check::heal::HEALED;
use pdp_core::check::pods::Drift;

#[derive(Args)]
pub(crate) struct HealArgs {
    /// The webhook's config file (its ConfigMap, mounted), read again at every round.
    #[arg(
        long,
        env = "PDP_INJECTOR_CONFIG",
        default_value = "/etc/pdp-injector/config.yaml"
    )]
    config: PathBuf,
    /// Time between rounds.
    #[arg(long, default_value = "15s", value_parser = pdp_core::duration::duration_flag)]
    interval: Duration,
    /// Evictions in any minute, in all namespaces.
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u32).range(1..=600))]
    max_evictions_per_minute: u32,
    /// The webhook's Service, NAMESPACE/NAME: nothing is evicted while it has no ready endpoint.
    #[arg(long, default_value = "pdp-system/pdp-injector", value_parser = service_flag)]
    webhook_service: (String, String),
    /// Also replace Pods wired by another config (stale_config), not only Pods not wired.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    stale_config: bool,
    /// Address of /healthz and /metrics.
    #[arg(long, default_value = "0.0.0.0:8081")]
    management_listen: SocketAddr,
    #[command(flatten)]
    log: LogArgs,
}

fn service_flag(text: &str) -> Result<(String, String), String> {
    match text.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((ns.into(), name.into()))
        }
        _ => Err(format!("{text:?} is not NAMESPACE/NAME")),
    }
}

pub(crate) fn run(args: HealArgs) -> anyhow::Result<()> {
    init_logging(args.log.log_format);
    runtime()?.block_on(run_async(args))
}

async fn run_async(args: HealArgs) -> anyhow::Result<()> {
    let client = kube::Client::try_default()
        .await
        .context("no cluster (in-cluster ServiceAccount or kubeconfig)")?;
    let metrics = HealMetrics::default();
    let mut registry = Registry::default();
    metrics.register(&mut registry);
    let listener = tokio::net::TcpListener::bind(args.management_listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.management_listen))?;
    let registry = std::sync::Arc::new(registry);
    let app = super::management::router(registry);
    tokio::spawn(async move { axum::serve(listener, app).await });
    let mut drifts: BTreeSet<Drift> = HEALED.into_iter().collect();
    if !args.stale_config {
        drifts.remove(&Drift::StaleConfig);
    }
    let options = Options {
        config: args.config,
        webhook_service: args.webhook_service,
        per_minute: args.max_evictions_per_minute as usize,
        drifts,
    };
    tracing::info!(interval = ?args.interval, per_minute = options.per_minute,
                   drifts = ?options.drifts.iter().map(|d| d.code()).collect::<Vec<_>>(), "heal started");
    let mut healer = Healer::new(client, options, metrics).await;
    let mut tick = tokio::time::interval(args.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let stop = shutdown_signal();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => return Ok(()),
            _ = tick.tick() => healer.round().await,
        }
    }
}
