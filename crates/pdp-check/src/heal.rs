//! `pdp-injector heal`: every round, the Pods that are not wired as the webhook would wire them now are replaced
//! through their controller, with the Eviction API (so PodDisruptionBudgets hold), one controller at a time per
//! namespace and at most a few a minute; bare Pods and Jobs' Pods are reported, never deleted. The decisions are
//! the core's ([`pdp_core::check::heal`]); this module lists, evicts, records Events and counts.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Endpoints, Event, EventSource, Namespace, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::api::{Api, ListParams, PostParams};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tracing::{info, warn};

use pdp_core::check::heal::{self, Action, Memory, Seen};
use pdp_core::check::pods::Drift;
use pdp_core::config::Config;

/// What a round is told.
#[derive(Debug, Clone)]
pub struct Options {
    /// The webhook's config file (the ConfigMap it mounts), read at every round.
    pub config: PathBuf,
    /// The webhook's Service (namespace, name): nothing is evicted unless it has a ready endpoint.
    pub webhook_service: (String, String),
    /// Evictions in any minute, in all.
    pub per_minute: usize,
    /// The drifts healed.
    pub drifts: BTreeSet<Drift>,
}

/// The counters of `heal` (`pdp_injector_heal_*`).
#[derive(Clone, Default)]
pub struct HealMetrics {
    evictions: Family<[(&'static str, &'static str); 1], Counter>,
    reported: Counter,
    to_heal: Gauge,
    rounds: Family<[(&'static str, &'static str); 1], Counter>,
}

impl HealMetrics {
    /// Registers the families, each labelled series at zero so that a scrape shows them before they move.
    pub fn register(&self, registry: &mut Registry) {
        for result in ["evicted", "blocked_by_pdb", "gone", "failed"] {
            drop(self.evictions.get_or_create(&[("result", result)]));
        }
        for outcome in ["acted", "webhook_not_ready", "failed"] {
            drop(self.rounds.get_or_create(&[("outcome", outcome)]));
        }
        registry.register(
            "pdp_injector_heal_evictions",
            "Pods evicted to be wired again, by result (evicted, blocked_by_pdb, gone, failed)",
            self.evictions.clone(),
        );
        registry.register(
            "pdp_injector_heal_reported",
            "Pods not wired that heal never evicts (bare Pods, Jobs' Pods), each reported once",
            self.reported.clone(),
        );
        registry.register(
            "pdp_injector_heal_pods_to_heal",
            "Pods of the last round that are not wired as the webhook would wire them now",
            self.to_heal.clone(),
        );
        registry.register(
            "pdp_injector_heal_rounds",
            "Rounds, by outcome (acted, webhook_not_ready, failed)",
            self.rounds.clone(),
        );
    }
}

/// The rounds' state: what was reported, when each eviction happened.
pub struct Healer {
    client: kube::Client,
    options: Options,
    metrics: HealMetrics,
    memory: Memory,
    evicted_at: VecDeque<Instant>,
    /// `policy/v1` (Kubernetes 1.22+) or `policy/v1beta1`.
    eviction_version: &'static str,
}

impl Healer {
    pub async fn new(client: kube::Client, options: Options, metrics: HealMetrics) -> Healer {
        let eviction_version = match client.apiserver_version().await {
            Ok(v)
                if v.major == "1"
                    && v.minor
                        .trim_end_matches('+')
                        .parse::<u32>()
                        .is_ok_and(|m| m < 22) =>
            {
                "policy/v1beta1"
            }
            _ => "policy/v1",
        };
        Healer {
            client,
            options,
            metrics,
            memory: Memory::default(),
            evicted_at: VecDeque::new(),
            eviction_version,
        }
    }

    /// One round; errors are logged and counted, and the next round tries again.
    pub async fn round(&mut self) {
        let outcome = match self.try_round().await {
            Ok(o) => o,
            Err(e) => {
                warn!(error = %e, "heal round failed");
                "failed"
            }
        };
        self.metrics
            .rounds
            .get_or_create(&[("outcome", outcome)])
            .inc();
    }

    async fn try_round(&mut self) -> anyhow::Result<&'static str> {
        let config = Config::load(&self.options.config)
            .map_err(|e| anyhow::anyhow!("config {}: {e}", self.options.config.display()))?;
        let (ns, name) = &self.options.webhook_service;
        let endpoints = Api::<Endpoints>::namespaced(self.client.clone(), ns)
            .get_opt(name)
            .await?;
        let ready = endpoints
            .and_then(|e| e.subsets)
            .into_iter()
            .flatten()
            .any(|s| s.addresses.is_some_and(|a| !a.is_empty()));
        if !ready {
            info!(service = %format!("{ns}/{name}"), "webhook not ready: nothing is evicted this round");
            return Ok("webhook_not_ready");
        }
        let labels: BTreeMap<String, BTreeMap<String, String>> =
            Api::<Namespace>::all(self.client.clone())
                .list(&ListParams::default())
                .await?
                .items
                .into_iter()
                .filter_map(|n| Some((n.metadata.name?, n.metadata.labels.unwrap_or_default())))
                .collect();
        let empty = BTreeMap::new();
        let mut seen: Vec<Seen> = Vec::new();
        let pods = Api::<Pod>::all(self.client.clone());
        crate::gather::each_page(pods, ListParams::default(), |page| {
            for pod in &page {
                let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
                seen.extend(heal::see(
                    pod,
                    labels.get(ns).unwrap_or(&empty),
                    &config,
                    &self.options.drifts,
                ));
            }
        })
        .await
        .map_err(|e| anyhow::anyhow!("listing Pods: {e}"))?;
        self.metrics
            .to_heal
            .set(seen.iter().filter(|s| s.drift.is_some()).count() as i64);
        let now = Instant::now();
        while self
            .evicted_at
            .front()
            .is_some_and(|t| now.duration_since(*t) >= Duration::from_secs(60))
        {
            self.evicted_at.pop_front();
        }
        let budget = self
            .options
            .per_minute
            .saturating_sub(self.evicted_at.len());
        for action in heal::plan(&seen, &mut self.memory, budget) {
            match action {
                Action::Evict {
                    namespace,
                    pod,
                    controller,
                    drift,
                } => {
                    let result = self.evict(&namespace, &pod).await;
                    self.metrics
                        .evictions
                        .get_or_create(&[("result", result)])
                        .inc();
                    if result == "evicted" {
                        self.evicted_at.push_back(Instant::now());
                        info!(pod = %format!("{namespace}/{pod}"), controller = %format!("{}/{}", controller.0, controller.1),
                              drift = drift.code(), "evicted: its controller replaces it and the webhook wires the new Pod");
                        self.event(&namespace, &pod, "Normal", "PdpInjectorRestarted", &format!(
                            "evicted by pdp-injector heal ({}): {} {} replaces it and the webhook wires the new Pod",
                            drift.code(), controller.0, controller.1)).await;
                    }
                }
                Action::Report {
                    namespace,
                    pod,
                    drift,
                    why,
                } => {
                    self.metrics.reported.inc();
                    warn!(pod = %format!("{namespace}/{pod}"), drift = drift.code(), why, "not wired, not evicted");
                    self.event(
                        &namespace,
                        &pod,
                        "Warning",
                        "PdpInjectorNotWired",
                        &format!("not wired ({}): {why}", drift.code()),
                    )
                    .await;
                }
            }
        }
        Ok("acted")
    }

    /// Evicts one Pod; the result label.
    async fn evict(&self, namespace: &str, pod: &str) -> &'static str {
        let body = serde_json::json!({
            "apiVersion": self.eviction_version,
            "kind": "Eviction",
            "metadata": {"name": pod, "namespace": namespace},
        });
        let request = http::Request::post(format!(
            "/api/v1/namespaces/{namespace}/pods/{pod}/eviction"
        ))
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(body.to_string().into_bytes());
        let request = match request {
            Ok(r) => r,
            Err(e) => {
                warn!(pod = %format!("{namespace}/{pod}"), error = %e, "eviction request not built");
                return "failed";
            }
        };
        match self.client.request_text(request).await {
            Ok(_) => "evicted",
            Err(kube::Error::Api(s)) if s.code == 429 => {
                info!(pod = %format!("{namespace}/{pod}"), message = %s.message,
                      "eviction refused by a PodDisruptionBudget: tried again next round");
                "blocked_by_pdb"
            }
            Err(kube::Error::Api(s)) if s.code == 404 => "gone",
            Err(e) => {
                warn!(pod = %format!("{namespace}/{pod}"), error = %e, "eviction failed");
                "failed"
            }
        }
    }

    /// Records an Event on the Pod; a failure is only logged.
    async fn event(&self, namespace: &str, pod: &str, type_: &str, reason: &str, message: &str) {
        let now = k8s_openapi::jiff::Timestamp::now();
        let event = Event {
            metadata: ObjectMeta {
                generate_name: Some(format!("{pod}.")),
                namespace: Some(namespace.into()),
                ..Default::default()
            },
            involved_object: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(pod.into()),
                namespace: Some(namespace.into()),
                ..Default::default()
            },
            reason: Some(reason.into()),
            message: Some(message.into()),
            type_: Some(type_.into()),
            source: Some(EventSource {
                component: Some("pdp-injector-heal".into()),
                ..Default::default()
            }),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            event_time: Some(MicroTime(now)),
            reporting_component: Some("pdp-injector-heal".into()),
            reporting_instance: Some(std::env::var("POD_NAME").unwrap_or_else(|_| "heal".into())),
            action: Some(if type_ == "Normal" { "Evict" } else { "Report" }.into()),
            count: Some(1),
            ..Default::default()
        };
        if let Err(e) = Api::<Event>::namespaced(self.client.clone(), namespace)
            .create(&PostParams::default(), &event)
            .await
        {
            warn!(pod = %format!("{namespace}/{pod}"), error = %e, "event not recorded");
        }
    }
}
