//! The central source's side of a node relay (`pdp.relay.v1.NodeRelay`: every flag set and the node's Pods,
//! to authenticated relays) and the relay's side (following that stream into its own store and Pod index).

use std::collections::{BTreeMap, HashMap};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::Stream;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::{Api, PostParams};
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use crate::metrics::Metrics;
use crate::relay_proto::node_relay_client::NodeRelayClient;
use crate::relay_proto::node_relay_server::NodeRelay;
use crate::relay_proto::{FlagSet as WireSet, NodePod, NodeState, WatchRequest};
use crate::set::{FlagSet, Origin, SetId};
use crate::source::pods::{PodEntry, PodIndex};
use crate::store::Store;

/// The audience of the relays' ServiceAccount tokens.
pub const AUDIENCE: &str = "pdp-flag-sync";
/// How long a reviewed token is believed before it is reviewed again.
const REVIEW_TTL: Duration = Duration::from_secs(60);
/// The most reviewed tokens remembered.
const REVIEW_CACHE: usize = 4096;

/// Who may follow the node relay stream: ServiceAccount tokens reviewed by the apiserver (TokenReview), for
/// the audience [`AUDIENCE`], of one of the allowed users (`system:serviceaccount:NS:NAME`).
pub struct TokenReviewer {
    client: kube::Client,
    allowed: Vec<String>,
    believed: Mutex<HashMap<String, Instant>>,
}

impl TokenReviewer {
    pub fn new(client: kube::Client, allowed: Vec<String>) -> TokenReviewer {
        TokenReviewer {
            client,
            allowed,
            believed: Mutex::default(),
        }
    }

    /// Ok when `token` is an allowed relay's; the status that refuses it otherwise.
    pub async fn check(&self, token: &str) -> Result<(), Status> {
        {
            let believed = self.believed.lock().unwrap_or_else(|p| p.into_inner());
            if believed
                .get(token)
                .is_some_and(|at| at.elapsed() < REVIEW_TTL)
            {
                return Ok(());
            }
        }
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                audiences: Some(vec![AUDIENCE.to_string()]),
            },
            ..TokenReview::default()
        };
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| {
                tracing::warn!(error = %e, "TokenReview failed");
                Status::unavailable("cannot review the relay's token now; retry")
            })?;
        let status = answer.status.unwrap_or_default();
        let user = status.user.and_then(|u| u.username).unwrap_or_default();
        if status.authenticated != Some(true) {
            return Err(Status::unauthenticated(format!(
                "the token is not valid for audience {AUDIENCE:?}: {}",
                status.error.unwrap_or_default()
            )));
        }
        if !self.allowed.contains(&user) {
            return Err(Status::permission_denied(format!(
                "{user} may not follow the node relay stream"
            )));
        }
        let mut believed = self.believed.lock().unwrap_or_else(|p| p.into_inner());
        if believed.len() >= REVIEW_CACHE {
            believed.retain(|_, at| at.elapsed() < REVIEW_TTL);
        }
        if believed.len() < REVIEW_CACHE {
            believed.insert(token.to_string(), Instant::now());
        }
        Ok(())
    }
}

/// The central source's NodeRelay service.
pub struct RelayService {
    store: Arc<Store>,
    pods: Arc<PodIndex>,
    reviewer: Arc<TokenReviewer>,
    stop: watch::Receiver<bool>,
}

impl RelayService {
    pub fn new(
        store: Arc<Store>,
        pods: Arc<PodIndex>,
        reviewer: Arc<TokenReviewer>,
        stop: watch::Receiver<bool>,
    ) -> RelayService {
        RelayService {
            store,
            pods,
            reviewer,
            stop,
        }
    }
}

/// The state of `node` as the relay receives it.
fn node_state(store: &Store, pods: &PodIndex, node: &str) -> Option<NodeState> {
    let snapshot = store.current();
    if !snapshot.ready {
        return None;
    }
    let sets = snapshot
        .each_json()
        .iter()
        .map(|(id, json)| WireSet {
            origin: id.origin.prefix().to_string(),
            namespace: id.namespace.clone(),
            name: id.name.clone(),
            flagd_json: json.clone(),
        })
        .collect();
    let pods = pods
        .on_node(node)
        .into_iter()
        .map(|(uid, p)| NodePod {
            uid,
            namespace: p.namespace,
            ips: p.ips.iter().map(|ip| ip.to_string()).collect(),
        })
        .collect();
    Some(NodeState {
        generation: snapshot.generation,
        sets,
        pods,
    })
}

/// A relay stream.
pub type NodeStream = Pin<Box<dyn Stream<Item = Result<NodeState, Status>> + Send>>;

#[tonic::async_trait]
impl NodeRelay for RelayService {
    type WatchStream = NodeStream;

    async fn watch(&self, request: Request<WatchRequest>) -> Result<Response<NodeStream>, Status> {
        let token = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .ok_or_else(|| {
                Status::unauthenticated("a relay authenticates with authorization: Bearer TOKEN")
            })?
            .to_string();
        self.reviewer.check(&token).await?;
        let node = request.into_inner().node;
        if node.is_empty() || node.len() > 253 {
            return Err(Status::invalid_argument(
                "WatchRequest.node must be the relay's node name",
            ));
        }
        tracing::info!(%node, "node relay following");
        struct State {
            store: Arc<Store>,
            pods: Arc<PodIndex>,
            flags: watch::Receiver<Arc<crate::Snapshot>>,
            pod_changes: watch::Receiver<u64>,
            stop: watch::Receiver<bool>,
            node: String,
            last: Option<NodeState>,
            started: bool,
            ended: bool,
        }
        let state = State {
            flags: self.store.subscribe(),
            pod_changes: self.pods.subscribe(),
            store: self.store.clone(),
            pods: self.pods.clone(),
            stop: self.stop.clone(),
            node,
            last: None,
            started: false,
            ended: false,
        };
        let stream = futures_util::stream::unfold(state, |mut st| async move {
            loop {
                if st.ended {
                    return None;
                }
                if st.started {
                    let stopped = tokio::select! {
                        c = st.flags.changed() => c.is_err(),
                        c = st.pod_changes.changed() => c.is_err(),
                        _ = st.stop.wait_for(|s| *s) => true,
                    };
                    if stopped {
                        st.ended = true;
                        return Some((
                            Err(Status::unavailable(
                                "the sync source is stopping; reconnect",
                            )),
                            st,
                        ));
                    }
                }
                st.started = true;
                st.flags.borrow_and_update();
                st.pod_changes.borrow_and_update();
                let Some(mut now) = node_state(&st.store, &st.pods, &st.node) else {
                    continue;
                };
                // Only a change of what this node sees is sent: the generation alone does not count.
                let same = st
                    .last
                    .as_ref()
                    .is_some_and(|l| l.sets == now.sets && l.pods == now.pods);
                if same {
                    continue;
                }
                now.generation = st.store.current().generation;
                st.last = Some(now.clone());
                return Some((Ok(now), st));
            }
        });
        Ok(Response::new(Box::pin(stream)))
    }
}

/// Where a relay follows its source from.
#[derive(Debug, Clone)]
pub struct Upstream {
    /// The source's URL, `http://pdp-flag-sync.pdp-system.svc:8015`.
    pub url: String,
    /// This node's name.
    pub node: String,
    /// The projected ServiceAccount token (audience [`AUDIENCE`]), read again at every connection.
    pub token_file: std::path::PathBuf,
}

/// Follows `upstream` into `store` and `pods`, reconnecting with a backoff; while it is away, the last state
/// stays served. Runs until the store is dropped by every other holder.
pub async fn follow(
    upstream: Upstream,
    store: Arc<Store>,
    pods: Arc<PodIndex>,
    metrics: Arc<Metrics>,
) {
    let mut backoff = Duration::from_millis(100);
    loop {
        match follow_once(&upstream, &store, &pods, &metrics).await {
            Ok(()) => backoff = Duration::from_millis(100),
            Err(e) => {
                tracing::warn!(upstream = %upstream.url, error = %e, retry_in = ?backoff, "flag relay: source unreachable; serving the last state")
            }
        }
        if Arc::strong_count(&store) == 1 {
            return;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

async fn follow_once(
    upstream: &Upstream,
    store: &Store,
    pods: &PodIndex,
    metrics: &Metrics,
) -> Result<(), String> {
    let token = std::fs::read_to_string(&upstream.token_file)
        .map_err(|e| format!("token {}: {e}", upstream.token_file.display()))?;
    let channel = tonic::transport::Endpoint::from_shared(upstream.url.clone())
        .map_err(|e| format!("{}: {e}", upstream.url))?
        .connect_timeout(Duration::from_secs(5))
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(10))
        .connect()
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let mut request = Request::new(WatchRequest {
        node: upstream.node.clone(),
    });
    let bearer = format!("Bearer {}", token.trim())
        .parse()
        .map_err(|_| "the token is not a header value".to_string())?;
    request.metadata_mut().insert("authorization", bearer);
    let mut stream = NodeRelayClient::new(channel)
        .watch(request)
        .await
        .map_err(|s| s.to_string())?
        .into_inner();
    tracing::info!(upstream = %upstream.url, node = %upstream.node, "flag relay following its source");
    loop {
        let state = match stream.message().await {
            Ok(Some(state)) => state,
            Ok(None) => return Ok(()),
            Err(status) if status.code() == tonic::Code::Unavailable => return Ok(()),
            Err(status) => return Err(status.to_string()),
        };
        apply(state, store, pods, metrics);
    }
}

/// Takes one state: its sets into the store (a set that does not read keeps its last good version), its Pods
/// into the index.
fn apply(state: NodeState, store: &Store, pods: &PodIndex, metrics: &Metrics) {
    let current = store.current();
    let mut sets = BTreeMap::new();
    for wire in state.sets {
        let origin = match wire.origin.as_str() {
            "core.openfeature.dev" => Origin::FeatureFlag,
            "configmap" => Origin::ConfigMap,
            "file" => Origin::File,
            other => {
                tracing::warn!(
                    origin = other,
                    "flag relay: a set of an unknown kind, left out"
                );
                continue;
            }
        };
        let id = SetId {
            origin,
            namespace: wire.namespace,
            name: wire.name,
        };
        match FlagSet::from_json(&wire.flagd_json) {
            Ok(set) => {
                sets.insert(id, set);
            }
            Err(e) => {
                metrics.rejected_sets.inc();
                tracing::warn!(set = %id, error = %e, "flag relay: set not taken; keeping its last good version");
                if let Some(old) = current.get(&id) {
                    sets.insert(id, old);
                }
            }
        }
    }
    store.replace_all(sets);
    let entries: HashMap<String, PodEntry> = state
        .pods
        .into_iter()
        .map(|p| {
            let ips = p.ips.iter().filter_map(|ip| ip.parse().ok()).collect();
            (
                p.uid,
                PodEntry {
                    namespace: p.namespace,
                    node: String::new(),
                    ips,
                },
            )
        })
        .collect();
    pods.replace_all(entries);
    metrics.upstream_generation.set(state.generation as i64);
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str =
        r#"{"flags":{"f":{"state":"ENABLED","variants":{"on":true},"defaultVariant":"on"}}}"#;

    fn wire(ns: &str, json: &str) -> WireSet {
        WireSet {
            origin: "core.openfeature.dev".into(),
            namespace: ns.into(),
            name: "app".into(),
            flagd_json: json.into(),
        }
    }

    #[test]
    fn a_node_sees_every_set_and_only_its_own_pods() {
        let store = Store::new(&[]);
        store.put(
            SetId {
                origin: Origin::FeatureFlag,
                namespace: "a".into(),
                name: "app".into(),
            },
            FlagSet::from_json(GOOD).unwrap(),
        );
        let pods = PodIndex::default();
        let on = |node: &str, ip: &str| {
            Some(PodEntry {
                namespace: "a".into(),
                node: node.into(),
                ips: vec![ip.parse().unwrap()],
            })
        };
        pods.apply("u1", on("n1", "10.0.0.1"));
        pods.apply("u2", on("n2", "10.0.0.2"));
        let state = node_state(&store, &pods, "n1").unwrap();
        assert_eq!(state.sets.len(), 1);
        assert_eq!(
            state.pods,
            vec![NodePod {
                uid: "u1".into(),
                namespace: "a".into(),
                ips: vec!["10.0.0.1".into()]
            }]
        );
    }

    #[test]
    fn a_relay_keeps_a_sets_last_good_version_and_learns_its_pods() {
        let (store, pods, metrics) = (
            Store::new(&[Origin::FeatureFlag]),
            PodIndex::default(),
            Metrics::default(),
        );
        let pod = NodePod {
            uid: "u1".into(),
            namespace: "a".into(),
            ips: vec!["10.0.0.1".into()],
        };
        apply(
            NodeState {
                generation: 7,
                sets: vec![wire("a", GOOD)],
                pods: vec![pod],
            },
            &store,
            &pods,
            &metrics,
        );
        assert!(
            store.current().ready,
            "a relay is ready once it has its source's state"
        );
        assert_eq!(metrics.upstream_generation.get(), 7);
        assert_eq!(
            pods.namespace_of_ip("10.0.0.1".parse().unwrap()).as_deref(),
            Some("a")
        );
        apply(
            NodeState {
                generation: 8,
                sets: vec![wire("a", "{broken")],
                pods: vec![],
            },
            &store,
            &pods,
            &metrics,
        );
        assert_eq!(
            store.current().len(),
            1,
            "the broken set keeps its last good version"
        );
        assert_eq!(metrics.rejected_sets.get(), 1);
        assert_eq!(
            pods.namespace_of_ip("10.0.0.1".parse().unwrap()),
            None,
            "a Pod gone from the node is gone"
        );
    }
}
