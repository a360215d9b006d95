//! Every read `check` makes: list and get only (manifests/overlays/daemonset/webhook/rbac-check.yaml grants exactly these), and one
//! TLS handshake with the live endpoint. A read that fails is kept as its error, so the report says what it
//! could not check rather than stopping.

use std::collections::BTreeSet;
use std::io::ErrorKind;
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet, Deployment, ReplicaSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod, Secret};
use k8s_openapi::api::storage::v1::{CSIDriver, CSINode};
use kube::api::{Api, ListParams};
use kube::core::NamespaceResourceScope;
use rustls_pki_types::ServerName;
use serde::de::DeserializeOwned;

use pdp_core::check::analyse::{
    ClusterView, ConfigSource, FRONT_COMPONENT_LABEL, FlagSyncView, Judge, LiveProbe, Names,
    PDP_COMPONENT_LABEL, Read, RelayGeneration, endpoint,
};
use pdp_core::check::certs;
use pdp_core::check::workloads::Owners;
use pdp_core::config::Config;
use pdp_core::config::supports_native_sidecars;
use pdp_core::names::CSI_DRIVER;
use pdp_tls as tls;

/// What to read.
#[derive(Debug, Clone)]
pub struct Options {
    /// Where the installed pieces are.
    pub names: Names,
    /// One namespace, or `None` for all.
    pub scope: Option<String>,
    /// `--config FILE`, loaded; `None`: the installed ConfigMap.
    pub config: Option<(String, Config)>,
    /// Bound on connecting to the live endpoint and on its handshake.
    pub probe_timeout: Duration,
}

/// Page size of list calls: bounded memory on the apiserver and here, whatever the cluster's size.
const PAGE: u32 = 500;

fn why(e: kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} ({})", s.message, s.reason),
        other => other.to_string(),
    }
}

/// Lists page by page, handing each page to `each`: what is held at once is one page.
pub(crate) async fn each_page<K>(
    api: Api<K>,
    params: ListParams,
    mut each: impl FnMut(Vec<K>),
) -> Read<()>
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let mut params = params.limit(PAGE);
    loop {
        let page = api.list(&params).await.map_err(why)?;
        each(page.items);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(()),
        }
    }
}

async fn list<K>(api: Api<K>, params: ListParams) -> Read<Vec<K>>
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let mut out = Vec::new();
    each_page(api, params, |items| out.extend(items)).await?;
    Ok(out)
}

/// Feeds the Pods in scope to `judge` a page at a time: `check`'s memory is one page and the findings, not
/// the cluster's Pods (BENCHMARKS.md, "check at cluster scale").
pub async fn judge_pods(client: &kube::Client, scope: &Option<String>, judge: &mut Judge<'_>) {
    let read = each_page(
        scoped::<Pod>(client, scope),
        ListParams::default(),
        |page| judge.pods(&page),
    )
    .await;
    if let Err(e) = read {
        judge.pods_failed(e);
    }
}

fn scoped<K>(client: &kube::Client, scope: &Option<String>) -> Api<K>
where
    K: kube::Resource<Scope = NamespaceResourceScope>,
    <K as kube::Resource>::DynamicType: Default,
{
    match scope {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Reads everything the report needs.
pub async fn gather(client: &kube::Client, options: Options) -> ClusterView {
    let names = options.names;
    let scope = options.scope;
    let ns = names.namespace.clone();
    let native_sidecars = match client.apiserver_version().await {
        Ok(v) => supports_native_sidecars(&v.major, &v.minor),
        // As the webhook does: a current server unless it says otherwise.
        Err(_) => true,
    };
    let config = match options.config {
        Some((path, c)) => ConfigSource::File(path, Box::new(c)),
        None => {
            let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
            ConfigSource::Installed(
                api.get_opt(&names.config_map)
                    .await
                    .map(|cm| cm.and_then(|cm| cm.data?.remove("config.yaml")))
                    .map_err(why),
            )
        }
    };
    let webhook = Api::<MutatingWebhookConfiguration>::all(client.clone())
        .get_opt(&names.webhook_config)
        .await
        .map_err(why);
    let serving_cert = Api::<Secret>::namespaced(client.clone(), &ns)
        .get_opt(&names.secret)
        .await
        .map(|s| s.and_then(|s| s.data?.remove("tls.crt")).map(|b| b.0))
        .map_err(why);
    let deployment = Api::<Deployment>::namespaced(client.clone(), &ns)
        .get_opt(&names.deployment)
        .await
        .map_err(why);
    let live = match &webhook {
        Ok(Some(mwc)) => {
            let first = mwc.webhooks.iter().flatten().find_map(|w| {
                let (name, dial) = endpoint(w)?;
                let bundle = w.client_config.ca_bundle.as_ref()?.0.clone();
                Some((name, dial, bundle))
            });
            match first {
                Some((name, dial, bundle)) => {
                    let timeout = options.probe_timeout;
                    tokio::task::spawn_blocking(move || probe(&dial, &name, &bundle, timeout))
                        .await
                        .ok()
                        .flatten()
                }
                None => None,
            }
        }
        _ => None,
    };
    let namespaces = list(Api::<Namespace>::all(client.clone()), ListParams::default()).await;
    let mut owners = Owners::default();
    // Only what sits between a Pod and its workload, recorded a page at a time; unreadable ones leave the Pod
    // grouped under them.
    let _ = each_page(
        scoped::<ReplicaSet>(client, &scope),
        ListParams::default(),
        |sets| {
            sets.iter()
                .for_each(|r| owners.record("ReplicaSet", &r.metadata))
        },
    )
    .await;
    let _ = each_page(
        scoped::<Job>(client, &scope),
        ListParams::default(),
        |jobs| jobs.iter().for_each(|j| owners.record("Job", &j.metadata)),
    )
    .await;
    let nodes = list(Api::<Node>::all(client.clone()), ListParams::default()).await;
    let csi_driver = Api::<CSIDriver>::all(client.clone())
        .get_opt(CSI_DRIVER)
        .await
        .map(|d| d.is_some())
        .map_err(why);
    let csi_nodes = list(Api::<CSINode>::all(client.clone()), ListParams::default()).await;
    // The PDP DaemonSets and the node-local fronts beside them.
    let selector = format!(
        "{} in ({},{})",
        PDP_COMPONENT_LABEL.0, PDP_COMPONENT_LABEL.1, FRONT_COMPONENT_LABEL.1
    );
    let mut daemonsets = list(
        Api::<DaemonSet>::all(client.clone()),
        ListParams::default().labels(&selector),
    )
    .await;
    if let Ok(found) = daemonsets.as_mut() {
        for (ds_ns, ds_name) in names.pdp_daemonsets.values() {
            let api: Api<DaemonSet> = Api::namespaced(client.clone(), ds_ns);
            let known = found.iter().any(|d| {
                d.metadata.namespace.as_ref() == Some(ds_ns)
                    && d.metadata.name.as_ref() == Some(ds_name)
            });
            if !known && let Ok(Some(d)) = api.get_opt(ds_name).await {
                found.push(d);
            }
        }
    }
    let pdp_namespaces: BTreeSet<String> = daemonsets
        .as_deref()
        .unwrap_or_default()
        .iter()
        .filter_map(|d| d.metadata.namespace.clone())
        .collect();
    let mut pdp_pods: Read<Vec<Pod>> = Ok(Vec::new());
    let mut revisions: Read<Vec<ControllerRevision>> = Ok(Vec::new());
    for pdp_ns in &pdp_namespaces {
        let pods = list(
            Api::<Pod>::namespaced(client.clone(), pdp_ns),
            ListParams::default(),
        )
        .await;
        let revs = list(
            Api::<ControllerRevision>::namespaced(client.clone(), pdp_ns),
            ListParams::default(),
        )
        .await;
        pdp_pods = pdp_pods.and_then(|mut all| {
            all.extend(pods?);
            Ok(all)
        });
        revisions = revisions.and_then(|mut all| {
            all.extend(revs?);
            Ok(all)
        });
    }
    let flag_sync = flag_sync(client).await;
    ClusterView {
        names,
        scope,
        now: time::OffsetDateTime::now_utc().unix_timestamp(),
        native_sidecars,
        csi_driver,
        csi_nodes,
        config: Some(config),
        webhook,
        serving_cert,
        live,
        deployment,
        namespaces,
        // Not read here: `judge_pods` feeds them to the judge a page at a time.
        pods: Ok(Vec::new()),
        owners,
        nodes,
        daemonsets,
        pdp_pods,
        revisions,
        flag_sync,
    }
}

/// The chart's flag sync source (Deployment, its management port) and node relays (DaemonSet, theirs).
const FLAG_SOURCE: (&str, &str, u16) = ("pdp-system", "pdp-flag-sync", 8014);
const FLAG_RELAY: (&str, &str, u16) = ("pdp-flags", "pdp-flag-relay", 8017);
/// A relay's gauge of the source generation it has.
const RELAY_GAUGE: &str = "pdp_flag_sync_upstream_generation";

/// The source's generation and each relay's, from their `/metrics` through the apiserver's Pod proxy (`get` on
/// `pods/proxy` in those two namespaces). A relay behind the source is read once more after 2 s, so that a
/// change still fanning out is not reported. `None` when no source is installed.
async fn flag_sync(client: &kube::Client) -> Option<FlagSyncView> {
    let (ns, name, port) = FLAG_SOURCE;
    let source_name = format!("{ns}/{name}");
    match Api::<Deployment>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
    {
        Ok(None) => return None,
        Ok(Some(_)) => {}
        Err(e) => {
            return Some(FlagSyncView {
                source_name,
                source: Err(why(e)),
                relays: Ok(Vec::new()),
            });
        }
    }
    let source = async {
        let pods = list(
            Api::<Pod>::namespaced(client.clone(), ns),
            ListParams::default().labels(&format!("app.kubernetes.io/name={name}")),
        )
        .await?;
        let ready = pods
            .iter()
            .find(|p| pdp_core::check::analyse::pod_ready(p))
            .ok_or_else(|| "no source Pod is ready".to_string())?;
        let pod = ready.metadata.name.as_deref().unwrap_or_default();
        metric(client, ns, pod, port, "pdp_flag_sync_generation").await
    }
    .await;
    let (rns, rname, rport) = FLAG_RELAY;
    let relays = match list(
        Api::<Pod>::namespaced(client.clone(), rns),
        ListParams::default().labels(&format!("app.kubernetes.io/name={rname}")),
    )
    .await
    {
        Err(e) => Err(e),
        Ok(pods) => {
            let mut out = Vec::new();
            for p in pods
                .iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
            {
                let pod = p.metadata.name.clone().unwrap_or_default();
                out.push(RelayGeneration {
                    node: p
                        .spec
                        .as_ref()
                        .and_then(|s| s.node_name.clone())
                        .unwrap_or_default(),
                    generation: metric(client, rns, &pod, rport, RELAY_GAUGE).await,
                    pod,
                });
            }
            // One wait for all that are behind, then each read again.
            let behind =
                |r: &RelayGeneration| matches!((&r.generation, &source), (Ok(g), Ok(s)) if g < s);
            if out.iter().any(behind) {
                tokio::time::sleep(Duration::from_secs(2)).await;
                for r in out.iter_mut().filter(|r| behind(r)) {
                    r.generation = metric(client, rns, &r.pod, rport, RELAY_GAUGE).await;
                }
            }
            Ok(out)
        }
    };
    Some(FlagSyncView {
        source_name,
        source,
        relays,
    })
}

/// One gauge of a Pod's `/metrics` on `port`, through the apiserver.
async fn metric(client: &kube::Client, ns: &str, pod: &str, port: u16, gauge: &str) -> Read<u64> {
    let request = http::Request::get(format!(
        "/api/v1/namespaces/{ns}/pods/{pod}:{port}/proxy/metrics"
    ))
    .body(Vec::new())
    .map_err(|e| e.to_string())?;
    let text = tokio::time::timeout(Duration::from_secs(5), client.request_text(request))
        .await
        .map_err(|_| format!("{ns}/{pod}:{port}/metrics did not answer within 5 s"))?
        .map_err(why)?;
    text.lines()
        .find_map(|l| l.strip_prefix(gauge)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
        .ok_or_else(|| format!("{ns}/{pod}:{port}/metrics has no {gauge}"))
}

/// One TLS handshake with `dial`, trusting only the `caBundle`, for `server_name`. `None` when the bundle is
/// unusable (the report says so already).
pub fn probe(
    dial: &str,
    server_name: &str,
    ca_bundle: &[u8],
    timeout: Duration,
) -> Option<LiveProbe> {
    let roots = certs::roots(ca_bundle).ok()?;
    let unreachable = |error: String| LiveProbe::Unreachable {
        endpoint: dial.to_string(),
        error,
    };
    let addr = match dial.to_socket_addrs().map(|mut a| a.next()) {
        Ok(Some(a)) => a,
        Ok(None) => return Some(unreachable("no address".into())),
        Err(e) => return Some(unreachable(format!("cannot resolve: {e}"))),
    };
    let mut sock = match TcpStream::connect_timeout(&addr, timeout) {
        Ok(s) => s,
        Err(e) => return Some(unreachable(format!("cannot connect: {e}"))),
    };
    if sock.set_read_timeout(Some(timeout)).is_err()
        || sock.set_write_timeout(Some(timeout)).is_err()
    {
        return Some(unreachable("cannot set socket timeouts".into()));
    }
    let name = match ServerName::try_from(server_name.to_string()) {
        Ok(n) => n,
        Err(e) => {
            return Some(unreachable(format!(
                "{server_name:?} is not a server name: {e}"
            )));
        }
    };
    let config = match rustls::ClientConfig::builder_with_provider(tls::provider())
        .with_safe_default_protocol_versions()
    {
        Ok(b) => b.with_root_certificates(roots).with_no_client_auth(),
        Err(e) => return Some(unreachable(e.to_string())),
    };
    let mut conn = match rustls::ClientConnection::new(Arc::new(config), name) {
        Ok(c) => c,
        Err(e) => return Some(unreachable(e.to_string())),
    };
    while conn.is_handshaking() {
        if let Err(e) = conn.complete_io(&mut sock) {
            let tls_error = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>());
            return Some(match tls_error {
                Some(rustls::Error::InvalidCertificate(c)) => LiveProbe::Untrusted {
                    endpoint: dial.to_string(),
                    error: format!("{c:?}"),
                },
                _ if e.kind() == ErrorKind::InvalidData => {
                    unreachable(format!("TLS handshake failed: {e}"))
                }
                _ => unreachable(e.to_string()),
            });
        }
    }
    let validity = conn
        .peer_certificates()
        .and_then(|c| c.first())
        .and_then(|leaf| certs::validity_der(leaf).ok());
    Some(LiveProbe::Verified {
        endpoint: dial.to_string(),
        validity,
    })
}

/// What `check --pre` is asked.
#[derive(Debug, Clone)]
pub struct PreOptions {
    /// `-n`: the namespaces to opt in (empty: those already labelled).
    pub targets: Vec<String>,
    /// `--kubelet-dir`.
    pub kubelet_dir: String,
    /// `--model`.
    pub models: Vec<pdp_core::config::Mode>,
}

/// The resources a group version serves; `Ok(None)` when it is not served (404).
async fn served(client: &kube::Client, group_version: &str) -> Read<Option<Vec<String>>> {
    match client.list_api_group_resources(group_version).await {
        Ok(list) => Ok(Some(list.resources.into_iter().map(|r| r.name).collect())),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(e) => Err(why(e)),
    }
}

/// Every read of `check --pre` (list and get only): the APIs served, namespaces, nodes, what holds the node
/// ports (Pods a page at a time, DaemonSets, Services), PriorityClasses and the install namespaces' quotas.
pub async fn gather_pre(
    client: &kube::Client,
    options: PreOptions,
    version: &k8s_openapi::apimachinery::pkg::version::Info,
) -> pdp_core::check::pre::PreView {
    use k8s_openapi::api::core::v1::{ResourceQuota, Service};
    use k8s_openapi::api::scheduling::v1::PriorityClass;
    use pdp_core::check::pre::{self, PortClaim};
    let admission_v1 = served(client, "admissionregistration.k8s.io/v1").await;
    let storage_v1 = served(client, "storage.k8s.io/v1").await;
    let namespaces = list(Api::<Namespace>::all(client.clone()), ListParams::default()).await;
    let nodes = list(Api::<Node>::all(client.clone()), ListParams::default()).await;
    let mut claims: Vec<PortClaim> = Vec::new();
    let pods = each_page(
        Api::<Pod>::all(client.clone()),
        ListParams::default(),
        |page| page.iter().for_each(|p| pre::pod_claims(p, &mut claims)),
    )
    .await;
    let sets = each_page(
        Api::<DaemonSet>::all(client.clone()),
        ListParams::default(),
        |page| {
            page.iter()
                .for_each(|d| pre::daemonset_claims(d, &mut claims))
        },
    )
    .await;
    let services = each_page(
        Api::<Service>::all(client.clone()),
        ListParams::default(),
        |page| {
            page.iter()
                .for_each(|s| pre::service_claims(s, &mut claims))
        },
    )
    .await;
    let port_claims = pods.and(sets).and(services).map(|()| claims);
    let priority_classes = list(
        Api::<PriorityClass>::all(client.clone()),
        ListParams::default(),
    )
    .await;
    let mut quotas: Read<Vec<ResourceQuota>> = Ok(Vec::new());
    for (ns, ..) in pre::INSTALL_NAMESPACES {
        let found = list(
            Api::<ResourceQuota>::namespaced(client.clone(), ns),
            ListParams::default(),
        )
        .await;
        quotas = quotas.and_then(|mut all| {
            all.extend(found?);
            Ok(all)
        });
    }
    pre::PreView {
        version: (
            version.major.clone(),
            version.minor.clone(),
            version.git_version.clone(),
        ),
        admission_v1,
        storage_v1,
        namespaces,
        targets: options.targets,
        nodes,
        port_claims,
        priority_classes,
        quotas,
        kubelet_dir: options.kubelet_dir,
        models: options.models,
    }
}
