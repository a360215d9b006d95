//! From what was read of the cluster ([`ClusterView`]) to the report: pure, so every judgement `check` makes is
//! tested on fixtures without a cluster. The reads themselves are in [`super::gather`].

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::admissionregistration::v1::{MutatingWebhook, MutatingWebhookConfiguration};
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};

use super::certs;
use super::pods::{self, Drift};
use super::report::{Finding, Report, Section, Severity};
use super::selectors;
use super::workloads::{self, Owners, Workload};
use crate::check::classic_sidecars;
use crate::config::{Config, Mode, PssLevel};
use crate::core::NamespaceInfo;
use crate::names::{LABEL_NAMESPACE_INJECTION, WATCH_PREFIX};

/// A read that may have failed (forbidden, unreachable): `Err` says why, and the report says what it could
/// not check instead of guessing.
pub type Read<T> = Result<T, String>;

/// The two entries of the shipped MutatingWebhookConfiguration and the failure policy each must have.
pub const ENTRIES: [(&str, &str); 2] = [
    ("namespaces.pdp-injector.io", "Fail"),
    ("pods.pdp-injector.io", "Ignore"),
];

/// Labels that mark the node-local PDP DaemonSets of manifests/components/pdp-daemonset.
pub const PDP_COMPONENT_LABEL: (&str, &str) = ("app.kubernetes.io/component", "pdp");
/// The label of the node-local front's DaemonSet (components/pdp-daemonset, pdp-node-front).
pub const FRONT_COMPONENT_LABEL: (&str, &str) = ("app.kubernetes.io/component", "pdp-front");

/// Where the installed pieces are (flags of `check`, defaults from manifests/).
#[derive(Debug, Clone)]
pub struct Names {
    /// The webhook's namespace.
    pub namespace: String,
    /// The MutatingWebhookConfiguration.
    pub webhook_config: String,
    /// The webhook Deployment.
    pub deployment: String,
    /// The Secret holding the serving certificate (`tls.crt`).
    pub secret: String,
    /// The ConfigMap holding `config.yaml`.
    pub config_map: String,
    /// PDP DaemonSet per profile when not `<profile>-pdp` labelled [`PDP_COMPONENT_LABEL`]: profile ->
    /// (namespace, name).
    pub pdp_daemonsets: BTreeMap<String, (String, String)>,
}

impl Default for Names {
    fn default() -> Self {
        Names {
            namespace: "pdp-system".into(),
            webhook_config: "pdp-injector".into(),
            deployment: "pdp-injector".into(),
            secret: "pdp-injector-tls".into(),
            config_map: "pdp-injector-config".into(),
            pdp_daemonsets: BTreeMap::new(),
        }
    }
}

/// Where the config came from.
#[derive(Debug, Clone)]
pub enum ConfigSource {
    /// `--config FILE`, already loaded (a file that does not load stops `check` before any read).
    File(String, Box<Config>),
    /// The installed ConfigMap's `config.yaml`: `Ok(None)` when the ConfigMap or the key is absent.
    Installed(Read<Option<String>>),
}

/// What the live endpoint showed when `check` connected to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LiveProbe {
    /// The handshake succeeded with the `caBundle` as the only trust: expiry of the presented certificate.
    Verified {
        /// `host:port` dialled.
        endpoint: String,
        /// Validity of the presented leaf.
        validity: Option<certs::Validity>,
    },
    /// Connected, but the presented certificate is not trusted by the `caBundle` for that name.
    Untrusted {
        /// `host:port` dialled.
        endpoint: String,
        /// The TLS error.
        error: String,
    },
    /// Not reachable from here (a Service name outside the cluster): only the Secret's certificate counts.
    Unreachable {
        /// `host:port` dialled.
        endpoint: String,
        /// Why.
        error: String,
    },
}

/// Everything `check` read, in one value.
#[derive(Debug, Clone)]
pub struct ClusterView {
    /// Where the installed pieces are.
    pub names: Names,
    /// The namespace `check` covers, or `None` for all (`-A`).
    pub scope: Option<String>,
    /// Now, Unix seconds.
    pub now: i64,
    /// False on apiservers before 1.29 (the webhook then renders classic sidecars, and hashes that config).
    pub native_sidecars: bool,
    /// The config to judge Pods by.
    pub config: Option<ConfigSource>,
    /// The MutatingWebhookConfiguration.
    pub webhook: Read<Option<MutatingWebhookConfiguration>>,
    /// `tls.crt` of the serving certificate's Secret (`Ok(None)`: no such Secret).
    pub serving_cert: Read<Option<Vec<u8>>>,
    /// The live endpoint, when there is a `caBundle` to dial it with.
    pub live: Option<LiveProbe>,
    /// The webhook Deployment.
    pub deployment: Read<Option<Deployment>>,
    /// Every namespace (selectors are judged against all of them).
    pub namespaces: Read<Vec<Namespace>>,
    /// The Pods in scope.
    pub pods: Read<Vec<Pod>>,
    /// Controllers of the ReplicaSets and Jobs in scope.
    pub owners: Owners,
    /// Every node.
    pub nodes: Read<Vec<Node>>,
    /// Candidate PDP DaemonSets.
    pub daemonsets: Read<Vec<DaemonSet>>,
    /// Pods in the PDP DaemonSets' namespaces.
    pub pdp_pods: Read<Vec<Pod>>,
    /// ControllerRevisions in the PDP DaemonSets' namespaces.
    pub revisions: Read<Vec<ControllerRevision>>,
}

const DAY: i64 = 86_400;
/// A certificate is renewed when a third of its life is left (cert-manager's default; self-managed: a third,
/// or 30 days); with less than this left, renewal is late: a warning at a quarter of its life (at most 21 days),
/// an error at a tenth (at most 7 days). Relative, so short-lived certificates are judged fairly too.
const EXPIRY_WARNING: (i64, i64) = (4, 21 * DAY);
const EXPIRY_ERROR: (i64, i64) = (10, 7 * DAY);

fn labels_of(ns: &Namespace) -> BTreeMap<String, String> {
    let mut labels = ns.metadata.labels.clone().unwrap_or_default();
    // 1.21+ sets this label on every namespace; older servers do not, and the selectors rely on it.
    if let Some(name) = &ns.metadata.name {
        labels
            .entry("kubernetes.io/metadata.name".into())
            .or_insert_with(|| name.clone());
    }
    labels
}

fn pod_name(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or(""),
        pod.metadata.name.as_deref().unwrap_or("")
    )
}

/// A Pod that will not run again (finished, or being deleted): restarting its workload means nothing for it.
fn is_done(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
        || matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        )
}

/// How long after its app containers ended a classic sidecar may still run before `check` says so: the webhook
/// marks the Pod within seconds, and the kubelet's liveness probe follows every 2 s.
const CLASSIC_STOP_GRACE: i64 = 60;
/// The same under `restartPolicy: OnFailure`, where the watch container waits 330 s (longer than the kubelet's
/// restart back-off) before it stops the PDP.
const CLASSIC_STOP_GRACE_ON_FAILURE: i64 = 400;

/// True when every container of the Pod that has ended did so before `at` (Unix seconds), and one has.
fn ended_before(pod: &Pod, at: i64) -> bool {
    let ends: Vec<i64> = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|c| c.state.as_ref()?.terminated.as_ref())
        .map(|t| t.finished_at.as_ref().map_or(i64::MAX, |f| f.0.as_second()))
        .collect();
    !ends.is_empty() && ends.iter().all(|t| *t < at)
}

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn plural(n: usize, word: &str) -> String {
    format!("{n} {word}{}", if n == 1 { "" } else { "s" })
}

fn days(seconds: i64) -> String {
    let d = seconds / DAY;
    if seconds < 0 {
        format!("expired {} ago", plural((-seconds / DAY) as usize, "day"))
    } else {
        format!("expires in {}", plural(d as usize, "day"))
    }
}

fn expiry_finding(what: &str, (not_before, not_after): certs::Validity, now: i64) -> Finding {
    let left = not_after - now;
    let life = (not_after - not_before).max(1);
    let late = |(part, cap): (i64, i64)| left < (life / part).min(cap);
    let date = time::OffsetDateTime::from_unix_timestamp(not_after)
        .map(|t| t.date().to_string())
        .unwrap_or_default();
    let message = format!("{} ({date})", days(left));
    let severity = if left < 0 || now < not_before || late(EXPIRY_ERROR) {
        Severity::Error
    } else if late(EXPIRY_WARNING) {
        Severity::Warning
    } else {
        Severity::Ok
    };
    let f = Finding::new(severity, "certificate_expiry", what, message);
    if severity == Severity::Ok {
        f
    } else {
        f.fix(
            "the certificate was not renewed: see the webhook's log (self-managed) or the Certificate's events \
             (cert-manager)",
        )
    }
}

/// The config the webhook uses in this cluster, and the Install findings about it.
fn config(view: &ClusterView, install: &mut Section) -> Option<Config> {
    let names = &view.names;
    let where_ = format!("ConfigMap {}/{}", names.namespace, names.config_map);
    let (source, loaded) = match &view.config {
        None => return None,
        Some(ConfigSource::File(path, config)) => (path.clone(), (**config).clone()),
        Some(ConfigSource::Installed(Err(e))) => {
            install.push(Finding::new(
                Severity::Error,
                "config_unreadable",
                "config",
                format!("cannot read {where_}: {e}; Pods are not compared (or pass --config FILE)"),
            ));
            return None;
        }
        Some(ConfigSource::Installed(Ok(None))) => {
            install.push(Finding::new(
                Severity::Warning,
                "config_missing",
                "config",
                format!("{where_} (key config.yaml) not found: judging by the built-in config"),
            ));
            (where_, Config::builtin())
        }
        Some(ConfigSource::Installed(Ok(Some(text)))) => match Config::from_yaml(text) {
            Ok(c) => (where_, c),
            Err(e) => {
                install.push(
                    Finding::new(
                        Severity::Error,
                        "config_invalid",
                        "config",
                        format!(
                            "{where_} does not load ({e}): the webhook keeps its last good config, which \
                             check cannot see; Pods are not compared"
                        ),
                    )
                    .fix(format!(
                        "fix the file and check it offline: pdp-injector inject --config config.yaml -f pod.yaml; \
                         then kubectl apply it to {where_}"
                    )),
                );
                return None;
            }
        },
    };
    // The same adaptation as the webhook's, so the hash is the one it writes into the status annotation.
    let fit = crate::config::ClusterFit {
        native_sidecars: view.native_sidecars,
        own_namespace: Some(names.namespace.clone()),
    };
    let config = fit.apply(loaded);
    install.push(Finding::new(
        Severity::Ok,
        "config_loaded",
        "config",
        format!(
            "{source} loads: hash {}{}",
            config.hash,
            if view.native_sidecars {
                ""
            } else {
                " (classic sidecars: the apiserver is older than 1.29)"
            }
        ),
    ));
    Some(config)
}

fn selects_pods_on_create(w: &MutatingWebhook) -> bool {
    w.rules.iter().flatten().any(|r| {
        let has = |list: &Option<Vec<String>>, want: &[&str]| {
            list.iter().flatten().any(|v| want.contains(&v.as_str()))
        };
        has(&r.operations, &["CREATE", "*"])
            && has(&r.api_groups, &["", "*"])
            && has(&r.resources, &["pods", "*"])
    })
}

/// The name the apiserver verifies the serving certificate for, and the endpoint it dials.
pub fn endpoint(w: &MutatingWebhook) -> Option<(String, String)> {
    let cc = &w.client_config;
    if let Some(url) = &cc.url {
        let authority = url.strip_prefix("https://")?.split('/').next()?;
        let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
            let (h, after) = rest.split_once(']')?;
            (h, after.strip_prefix(':').unwrap_or("443"))
        } else {
            authority.split_once(':').unwrap_or((authority, "443"))
        };
        let dial = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        return Some((host.to_string(), dial));
    }
    let svc = cc.service.as_ref()?;
    let host = format!("{}.{}.svc", svc.name, svc.namespace);
    let port = svc.port.unwrap_or(443);
    Some((host.clone(), format!("{host}:{port}")))
}

/// The webhook configuration, its certificates and the Deployment.
fn install(view: &ClusterView, install: &mut Section, namespaces: &[Namespace]) {
    let names = &view.names;
    let subject = format!("MutatingWebhookConfiguration {}", names.webhook_config);
    let mwc = match &view.webhook {
        Err(e) => {
            install.push(Finding::new(
                Severity::Error,
                "webhook_unreadable",
                &subject,
                format!("cannot read it: {e}"),
            ));
            None
        }
        Ok(None) => {
            install.push(
                Finding::new(
                    Severity::Error,
                    "webhook_missing",
                    &subject,
                    "not found: no Pod is sent to the webhook",
                )
                .fix(
                    "kubectl apply -k manifests/overlays/daemonset (or the overlay you installed)",
                ),
            );
            None
        }
        Ok(Some(m)) => Some(m),
    };
    let mut ca_bundle: Option<Vec<u8>> = None;
    let mut server_name: Option<String> = None;
    if let Some(mwc) = mwc {
        let webhooks = mwc.webhooks.as_deref().unwrap_or_default();
        let mut good = true;
        for (entry, policy) in ENTRIES {
            let Some(w) = webhooks.iter().find(|w| w.name == entry) else {
                good = false;
                install.push(
                    Finding::new(Severity::Error, "webhook_entry_missing", &subject, format!("has no entry {entry}"))
                        .fix("kubectl apply -k manifests/overlays/daemonset (or the overlay you installed)"),
                );
                continue;
            };
            let mut wrong = Vec::new();
            let actual = w.failure_policy.as_deref().unwrap_or("Fail");
            if actual != policy {
                wrong.push(format!("failurePolicy {actual} (manifests: {policy})"));
            }
            if !selects_pods_on_create(w) {
                wrong.push("its rules do not send Pod CREATE".to_string());
            }
            // Never-injected namespaces must not reach the webhook: its own Pods would wait on themselves.
            for ns in namespaces {
                let name = ns.metadata.name.as_deref().unwrap_or("");
                let protected = name == names.namespace
                    || crate::names::ALWAYS_EXCLUDED_NAMESPACES.contains(&name);
                if protected && selectors::matches(w.namespace_selector.as_ref(), &labels_of(ns)) {
                    wrong.push(format!("its namespaceSelector selects namespace {name}"));
                }
            }
            if !wrong.is_empty() {
                good = false;
                install.push(
                    Finding::new(Severity::Error, "webhook_entry_differs", format!("{subject} entry {entry}"), wrong.join("; "))
                        .fix("kubectl apply -k manifests/overlays/daemonset (or the overlay you installed)"),
                );
            }
            if let Some((name, _)) = endpoint(w) {
                server_name.get_or_insert(name);
            }
            if ca_bundle.is_none() {
                ca_bundle = w.client_config.ca_bundle.as_ref().map(|b| b.0.clone());
            }
        }
        if good {
            install.push(Finding::new(
                Severity::Ok,
                "webhook_registered",
                &subject,
                format!(
                    "entries {} and {} select Pod CREATE as the manifests say",
                    ENTRIES[0].0, ENTRIES[1].0
                ),
            ));
        }
    }
    certificates(view, install, ca_bundle.as_deref(), server_name.as_deref());
    deployment(view, install);
}

fn certificates(
    view: &ClusterView,
    install: &mut Section,
    ca_bundle: Option<&[u8]>,
    server_name: Option<&str>,
) {
    let names = &view.names;
    let secret = format!("Secret {}/{}", names.namespace, names.secret);
    let roots = match ca_bundle.filter(|b| !b.is_empty()) {
        None => {
            if view.webhook.as_ref().is_ok_and(Option::is_some) {
                install.push(
                    Finding::new(Severity::Error, "ca_bundle_missing", "caBundle", "empty: the apiserver cannot trust the webhook")
                        .fix("self-managed: check the webhook's log; cert-manager: check the cainjector and the annotation cert-manager.io/inject-ca-from"),
                );
            }
            None
        }
        Some(pem) => match certs::roots(pem) {
            Ok(r) => Some(r),
            Err(e) => {
                install.push(Finding::new(
                    Severity::Error,
                    "ca_bundle_invalid",
                    "caBundle",
                    e,
                ));
                None
            }
        },
    };
    let live_verified = matches!(view.live, Some(LiveProbe::Verified { .. }));
    match &view.serving_cert {
        Err(e) => install.push(Finding::new(
            Severity::Info,
            "serving_secret_unreadable",
            &secret,
            format!(
                "cannot read it ({e}): the serving certificate is judged at the live endpoint only"
            ),
        )),
        Ok(None) => install.push(Finding::new(
            if live_verified {
                Severity::Info
            } else {
                Severity::Warning
            },
            "serving_secret_missing",
            &secret,
            "not found (certificates from files, or another Secret: --secret NAME)",
        )),
        Ok(Some(pem)) => {
            if let (Some(roots), Some(name)) = (&roots, server_name) {
                match certs::verify(roots.clone(), pem, name, view.now) {
                    Ok(()) => install.push(Finding::new(
                        Severity::Ok,
                        "serving_cert_trusted",
                        &secret,
                        format!("its certificate is trusted by the caBundle for {name}"),
                    )),
                    Err(e) => install.push(
                        Finding::new(
                            Severity::Error,
                            "serving_cert_untrusted",
                            &secret,
                            format!("its certificate is not trusted by the caBundle for {name}: {e}"),
                        )
                        .fix("self-managed: the webhook patches caBundle on its next pass (see its log); cert-manager: check the cainjector"),
                    ),
                }
            }
            match certs::validity(pem) {
                Ok(v) => install.push(expiry_finding(
                    &format!("{secret} certificate"),
                    v,
                    view.now,
                )),
                Err(e) => install.push(Finding::new(
                    Severity::Error,
                    "serving_cert_invalid",
                    &secret,
                    e,
                )),
            }
        }
    }
    match &view.live {
        None => {}
        Some(LiveProbe::Verified { endpoint, validity }) => {
            install.push(Finding::new(
                Severity::Ok,
                "endpoint_trusted",
                format!("endpoint {endpoint}"),
                "presents a certificate the caBundle verifies",
            ));
            if let Some(v) = validity {
                install.push(expiry_finding(&format!("endpoint {endpoint} certificate"), *v, view.now));
            }
        }
        Some(LiveProbe::Untrusted { endpoint, error }) => install.push(
            Finding::new(
                Severity::Error,
                "endpoint_untrusted",
                format!("endpoint {endpoint}"),
                format!("the certificate it presents is not trusted by the caBundle: {error}; the apiserver refuses it too"),
            )
            .fix("compare the Secret's certificate with caBundle; restart the webhook if it serves an old certificate"),
        ),
        Some(LiveProbe::Unreachable { endpoint, error }) => install.push(Finding::new(
            Severity::Info,
            "endpoint_unreachable",
            format!("endpoint {endpoint}"),
            format!("not reachable from here ({error}); run check inside the cluster to test it"),
        )),
    }
}

fn deployment(view: &ClusterView, install: &mut Section) {
    let names = &view.names;
    let subject = format!("Deployment {}/{}", names.namespace, names.deployment);
    let d = match &view.deployment {
        Err(e) => {
            install.push(Finding::new(
                Severity::Error,
                "deployment_unreadable",
                &subject,
                format!("cannot read it: {e}"),
            ));
            return;
        }
        Ok(None) => {
            install.push(Finding::new(
                Severity::Error,
                "deployment_missing",
                &subject,
                "not found",
            ));
            return;
        }
        Ok(Some(d)) => d,
    };
    let desired = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let ready = d
        .status
        .as_ref()
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0);
    let fix = format!(
        "kubectl -n {} describe deployment {}; kubectl -n {} logs deployment/{}",
        names.namespace, names.deployment, names.namespace, names.deployment
    );
    let message = format!("{ready} of {desired} replicas ready");
    if ready == 0 {
        install.push(
            Finding::new(
                Severity::Error,
                "webhook_not_ready",
                &subject,
                format!("{message}: Pods in opted-in namespaces are refused, annotated Pods elsewhere start without a PDP"),
            )
            .fix(fix),
        );
    } else if ready < desired {
        install
            .push(Finding::new(Severity::Warning, "webhook_degraded", &subject, message).fix(fix));
    } else {
        install.push(Finding::new(
            Severity::Ok,
            "webhook_ready",
            &subject,
            message,
        ));
    }
}

fn fail_entry(view: &ClusterView) -> Option<&MutatingWebhook> {
    let mwc = view.webhook.as_ref().ok()?.as_ref()?;
    mwc.webhooks
        .iter()
        .flatten()
        .find(|w| w.name == ENTRIES[0].0)
}

/// The mode a namespace label asks for, `Ok(None)` for `disabled`, `Err` for a value the webhook refuses.
/// The namespace label judged by the core's own parser (without a readable config: the built-in one's).
fn namespace_mode(value: &str, config: Option<&Config>) -> Result<Option<Mode>, String> {
    match config {
        Some(c) => crate::core::decide::namespace_mode(value, c),
        None => crate::core::decide::namespace_mode(value, &Config::builtin()),
    }
}

/// Opted-in namespaces: their mode, Pod Security level and what the level means for the socket.
fn namespaces_section(
    view: &ClusterView,
    config: Option<&Config>,
    all: &[Namespace],
    section: &mut Section,
) {
    let fail = fail_entry(view);
    let (mut opted_in, mut opted_out) = (0, 0);
    for ns in all
        .iter()
        .filter(|n| in_scope(view, n.metadata.name.as_deref()))
    {
        let name = ns.metadata.name.clone().unwrap_or_default();
        let labels = labels_of(ns);
        let Some(value) = labels.get(LABEL_NAMESPACE_INJECTION) else {
            continue;
        };
        let subject = format!("namespace {name}");
        if config.is_some_and(|c| c.excluded_namespaces.contains(&name)) {
            section.push(Finding::new(
                Severity::Warning,
                "namespace_excluded",
                &subject,
                format!("labelled {LABEL_NAMESPACE_INJECTION}={value} but excluded by the config: never injected"),
            ));
            continue;
        }
        let mode = match namespace_mode(value, config) {
            Err(valid) => {
                section.push(
                    Finding::new(
                        Severity::Error,
                        "invalid_namespace_label",
                        &subject,
                        format!(
                            "{LABEL_NAMESPACE_INJECTION}={value} is not a valid value: the webhook refuses its Pods \
                             ({valid})"
                        ),
                    )
                    .fix(format!("kubectl label namespace {name} {LABEL_NAMESPACE_INJECTION}=enabled --overwrite")),
                );
                continue;
            }
            Ok(None) => {
                opted_out += 1;
                section.push(Finding::new(
                    Severity::Info,
                    "namespace_opted_out",
                    &subject,
                    "disabled: no Pod is wired",
                ));
                continue;
            }
            Ok(Some(m)) => m,
        };
        opted_in += 1;
        let info = NamespaceInfo::from_labels(&name, &labels);
        let level = config.map_or(PssLevel::Baseline, |c| info.pss_level(c));
        let source = if info.pss_enforce.is_some() {
            ""
        } else {
            " (no enforce label: the config's default)"
        };
        let meaning = match (mode, level) {
            (Mode::Sidecar, _) => "the sidecar meets every level".to_string(),
            (Mode::Central, _) => {
                "central wiring: variables only, which every level allows".to_string()
            }
            (Mode::Daemonset, PssLevel::Privileged) => {
                "daemonset wiring with the node's socket and TCP".to_string()
            }
            (Mode::Daemonset, l) => format!(
                "daemonset wiring over TCP only: {} forbids hostPath, so the socket is dropped (downgraded_pss); label \
                 the namespace pod-security.kubernetes.io/enforce=privileged to get it",
                l.as_str()
            ),
        };
        section.push(Finding::new(
            Severity::Ok,
            "namespace_opted_in",
            &subject,
            format!(
                "{value} ({mode} mode), Pod Security {}{source}: {meaning}",
                level.as_str()
            ),
        ));
        if let Some(w) = fail
            && !selectors::matches(w.namespace_selector.as_ref(), &labels)
        {
            section.push(
                Finding::new(
                    Severity::Error,
                    "namespace_not_selected",
                    &subject,
                    format!("opted in, but webhook entry {} does not select it: its Pods are not sent to the webhook", w.name),
                )
                .fix("kubectl apply -k manifests/overlays/daemonset (or the overlay you installed)"),
            );
        }
    }
    if let Some(scope) = &view.scope
        && view.namespaces.is_ok()
        && !all.iter().any(|n| n.metadata.name.as_ref() == Some(scope))
    {
        section.push(Finding::new(
            Severity::Warning,
            "namespace_not_found",
            format!("namespace {scope}"),
            "does not exist: nothing to check in it",
        ));
    }
    section.summary = format!("{opted_in} opted in, {opted_out} opted out");
}

fn in_scope(view: &ClusterView, namespace: Option<&str>) -> bool {
    match &view.scope {
        None => true,
        Some(s) => namespace == Some(s.as_str()),
    }
}

/// Whether some entry of the webhook configuration sends this Pod's CREATE to the webhook.
fn selected(view: &ClusterView, ns_labels: &BTreeMap<String, String>, pod: &Pod) -> bool {
    let Ok(Some(mwc)) = &view.webhook else {
        return false;
    };
    let pod_labels = pod.metadata.labels.clone().unwrap_or_default();
    mwc.webhooks
        .iter()
        .flatten()
        .filter(|w| ENTRIES.iter().any(|(n, _)| *n == w.name))
        .any(|w| {
            selects_pods_on_create(w)
                && selectors::matches(w.namespace_selector.as_ref(), ns_labels)
                && selectors::matches(w.object_selector.as_ref(), &pod_labels)
        })
}

/// Pods whose wiring differs from what the webhook would do now, by workload.
fn pods_section(
    view: &ClusterView,
    config: Option<&Config>,
    all: &[Namespace],
    section: &mut Section,
) {
    let pods = match &view.pods {
        Err(e) => {
            section.push(Finding::new(
                Severity::Error,
                "pods_unreadable",
                "pods",
                format!("cannot list Pods: {e}"),
            ));
            return;
        }
        Ok(p) => p,
    };
    let Some(config) = config else {
        section.summary = format!(
            "{} not compared: no usable config",
            plural(pods.len(), "Pod")
        );
        return;
    };
    let labels: BTreeMap<&str, BTreeMap<String, String>> = all
        .iter()
        .filter_map(|n| Some((n.metadata.name.as_deref()?, labels_of(n))))
        .collect();
    let mut groups: BTreeMap<(Drift, Workload), (Vec<String>, String, bool)> = BTreeMap::new();
    let (mut compared, mut done) = (0, 0);
    let mut unstopped: Vec<(String, String)> = Vec::new();
    for pod in pods {
        if is_done(pod) {
            done += 1;
            continue;
        }
        compared += 1;
        if let Some(apps) = classic_sidecars::apps_done(pod)
            && ended_before(
                pod,
                view.now
                    - match pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref()) {
                        Some("OnFailure") => CLASSIC_STOP_GRACE_ON_FAILURE,
                        _ => CLASSIC_STOP_GRACE,
                    },
            )
        {
            unstopped.push((pod_name(pod), apps));
        }
        let ns_name = pod.metadata.namespace.clone().unwrap_or_default();
        let empty = BTreeMap::new();
        let ns_labels = labels.get(ns_name.as_str()).unwrap_or(&empty);
        let info = NamespaceInfo::from_labels(&ns_name, ns_labels);
        let Some(d) = pods::compare(pod, &info, config) else {
            continue;
        };
        let unselected = d.drift == Drift::NotWired && !selected(view, ns_labels, pod);
        let w = workloads::workload_of(pod, &view.owners);
        let entry = groups
            .entry((d.drift, w))
            .or_insert_with(|| (Vec::new(), d.detail.clone(), false));
        entry.0.push(pod.metadata.name.clone().unwrap_or_default());
        entry.2 |= unselected;
    }
    for ((drift, w), (names, detail, unselected)) in groups {
        let severity = if drift == Drift::StatusUnreadable {
            Severity::Warning
        } else {
            Severity::Error
        };
        let mut message = format!(
            "{} {}: {detail}",
            plural(names.len(), "Pod"),
            drift.meaning()
        );
        let mut fix = workloads::fix(&w, &names);
        if unselected {
            message.push_str(
                "; no entry of the webhook configuration selects it, so new Pods would not be wired either",
            );
            fix = "label the Pod template pdp-injector.io/inject=<mode> (the configuration's objectSelector \
                   needs the label), then: "
                .to_string()
                + &fix;
        }
        let mut f = Finding::new(severity, drift.code(), w.to_string(), message).fix(fix);
        f.pods = names
            .iter()
            .map(|n| format!("{}/{n}", w.namespace))
            .collect();
        section.push(f);
    }
    if let Some((first, apps)) = unstopped.first() {
        let mut f = Finding::new(
            Severity::Error,
            "classic_sidecar_not_stopped",
            "classic sidecars",
            format!(
                "{} whose app containers ended over {CLASSIC_STOP_GRACE} s ago ({CLASSIC_STOP_GRACE_ON_FAILURE} s under \
                 OnFailure) still {} a running PDP sidecar, \
                 so the Pod (and its Job) cannot complete ({first}: {apps}); the Pod's watch container \
                 ({WATCH_PREFIX}<PDP container>) stops it once no app process is left",
                plural(unstopped.len(), "Pod"),
                if unstopped.len() == 1 { "has" } else { "have" },
            ),
        )
        .fix(
            "read the log of the Pod's watch container (kubectl logs POD -c pdp-injector-watch-cerbos-pdp): a \
             process left in the Pod's shared process namespace (another sidecar) keeps the PDP running; under \
             OnFailure the stop comes 330 s after the apps ended",
        );
        f.pods = unstopped.into_iter().map(|(name, _)| name).collect();
        section.push(f);
    }
    section.summary = format!(
        "{} compared{}",
        plural(compared, "Pod"),
        if done > 0 {
            format!(", {done} finished or terminating skipped")
        } else {
            String::new()
        }
    );
}

fn controlled_by(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    kind: &str,
    name: &str,
) -> bool {
    workloads::controller_of(meta).is_some_and(|(k, n)| k == kind && n == name)
}

/// The PDP DaemonSet of a profile: the one named by `--pdp-daemonset`, else `<profile>-pdp` labelled as a PDP.
fn pdp_daemonset<'a>(names: &Names, profile: &str, all: &'a [DaemonSet]) -> Option<&'a DaemonSet> {
    if let Some((ns, name)) = names.pdp_daemonsets.get(profile) {
        return all.iter().find(|d| {
            d.metadata.namespace.as_ref() == Some(ns) && d.metadata.name.as_ref() == Some(name)
        });
    }
    let want = format!("{profile}-pdp");
    all.iter().find(|d| {
        d.metadata.name.as_deref() == Some(want.as_str()) && labelled(d, PDP_COMPONENT_LABEL)
    })
}

/// True when the DaemonSet carries the label `key=value`.
fn labelled(ds: &DaemonSet, (key, value): (&str, &str)) -> bool {
    ds.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(key))
        .is_some_and(|v| v == value)
}

/// The `controller-revision-hash` of a DaemonSet's newest ControllerRevision: the revision its Pods should run.
fn current_revision(ds: &DaemonSet, revisions: &[ControllerRevision]) -> Option<String> {
    let (ns, name) = (
        ds.metadata.namespace.as_deref()?,
        ds.metadata.name.as_deref()?,
    );
    revisions
        .iter()
        .filter(|r| {
            r.metadata.namespace.as_deref() == Some(ns)
                && controlled_by(&r.metadata, "DaemonSet", name)
        })
        .max_by_key(|r| r.revision)
        .and_then(|r| {
            r.metadata
                .labels
                .as_ref()?
                .get("controller-revision-hash")
                .cloned()
        })
}

/// For each profile in daemonset use: nodes without a ready PDP Pod, and PDP Pods not at the current revision.
fn nodes_section(
    view: &ClusterView,
    config: Option<&Config>,
    all: &[Namespace],
    section: &mut Section,
) {
    // Profiles in daemonset use: those of daemonset-wired Pods, and the default profile where a namespace in
    // scope asks for daemonset mode.
    let mut profiles: BTreeSet<String> = BTreeSet::new();
    let mut wired_on: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for pod in view
        .pods
        .as_deref()
        .unwrap_or_default()
        .iter()
        .filter(|p| !is_done(p))
    {
        let Some(s) = pods::status_of(pod).filter(|s| s.mode == Mode::Daemonset) else {
            continue;
        };
        profiles.insert(s.profile.clone());
        if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) {
            wired_on
                .entry((s.profile, node))
                .or_default()
                .push(pod_name(pod));
        }
    }
    if let Some(config) = config {
        for ns in all
            .iter()
            .filter(|n| in_scope(view, n.metadata.name.as_deref()))
        {
            let value = ns
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(LABEL_NAMESPACE_INJECTION));
            if let Some(Ok(Some(Mode::Daemonset))) = value.map(|v| namespace_mode(v, Some(config)))
            {
                profiles.insert(config.default_profile.clone());
            }
        }
    }
    if profiles.is_empty() {
        section.summary = "no profile in daemonset mode".into();
        return;
    }
    let nodes = match &view.nodes {
        Err(e) => {
            section.push(Finding::new(
                Severity::Error,
                "nodes_unreadable",
                "nodes",
                format!("cannot list nodes: {e}"),
            ));
            return;
        }
        Ok(n) => n,
    };
    section.summary = format!(
        "{}; daemonset mode: {}",
        plural(nodes.len(), "node"),
        profiles.iter().cloned().collect::<Vec<_>>().join(", ")
    );
    let daemonsets = match &view.daemonsets {
        Err(e) => {
            section.push(Finding::new(
                Severity::Error,
                "pdp_unreadable",
                "PDP DaemonSets",
                format!("cannot list DaemonSets: {e}"),
            ));
            return;
        }
        Ok(d) => d,
    };
    let pdp_pods = view.pdp_pods.as_deref().unwrap_or_default();
    let revisions = view.revisions.as_deref().unwrap_or_default();
    for profile in &profiles {
        let Some(ds) = pdp_daemonset(&view.names, profile, daemonsets) else {
            section.push(
                Finding::new(
                    Severity::Error,
                    "pdp_daemonset_missing",
                    format!("profile {profile}"),
                    format!(
                        "used in daemonset mode, but no PDP DaemonSet found (looked for {profile}-pdp labelled {}={}): \
                         daemonset-wired Pods have no PDP",
                        PDP_COMPONENT_LABEL.0, PDP_COMPONENT_LABEL.1
                    ),
                )
                .fix("kubectl apply -k manifests/overlays/daemonset, or name yours: --pdp-daemonset PROFILE=NAMESPACE/NAME"),
            );
            continue;
        };
        let covered = node_coverage(
            section, nodes, &wired_on, profile, ds, pdp_pods, revisions, &PDP_ROLE,
        );
        let (ds_ns, ds_name) = (
            ds.metadata.namespace.clone().unwrap_or_default(),
            ds.metadata.name.clone().unwrap_or_default(),
        );
        section.push(Finding::new(
            Severity::Ok,
            "pdp_daemonset",
            format!("DaemonSet {ds_ns}/{ds_name}"),
            format!(
                "profile {profile}: ready PDP on {}, {} not at the current revision",
                plural(covered.0, "node"),
                covered.1
            ),
        ));
        // The node-local front of the same namespace (components/pdp-daemonset): it owns the node's port and
        // socket, so a node without it leaves its apps without a PDP as surely as a node without the PDP.
        if let Some(front) = daemonsets.iter().find(|d| {
            d.metadata.namespace.as_deref() == Some(ds_ns.as_str())
                && labelled(d, FRONT_COMPONENT_LABEL)
        }) {
            let covered = node_coverage(
                section,
                nodes,
                &wired_on,
                profile,
                front,
                pdp_pods,
                revisions,
                &FRONT_ROLE,
            );
            section.push(Finding::new(
                Severity::Ok,
                "pdp_front",
                format!(
                    "DaemonSet {ds_ns}/{}",
                    front.metadata.name.as_deref().unwrap_or_default()
                ),
                format!(
                    "profile {profile}: ready front on {}, {} not at the current revision",
                    plural(covered.0, "node"),
                    covered.1
                ),
            ));
        }
    }
}

/// What a per-node DaemonSet is to the apps wired to it, in findings.
struct NodeRole {
    /// Finding code for a node without a ready Pod of it.
    missing: &'static str,
    /// Finding code for a Pod of it at an older revision.
    outdated: &'static str,
    /// What the wired Pods lack without it.
    lack: &'static str,
    /// The same, for a Pod that would be scheduled there.
    would: &'static str,
}

const PDP_ROLE: NodeRole = NodeRole {
    missing: "node_without_pdp",
    outdated: "pdp_outdated",
    lack: "have no PDP",
    would: "would have no PDP",
};

const FRONT_ROLE: NodeRole = NodeRole {
    missing: "node_without_front",
    outdated: "front_outdated",
    lack: "cannot reach their PDP (the node's port 3593 and socket are the front's)",
    would: "could not reach its PDP (the node's port 3593 and socket are the front's)",
};

/// Checks that every node a DaemonSet targets, or where Pods are wired to it, runs a ready Pod of it at the
/// current revision; returns (nodes covered, nodes at an older revision).
#[allow(clippy::too_many_arguments)]
fn node_coverage(
    section: &mut Section,
    nodes: &[Node],
    wired_on: &BTreeMap<(String, String), Vec<String>>,
    profile: &str,
    ds: &DaemonSet,
    pdp_pods: &[Pod],
    revisions: &[ControllerRevision],
    role: &NodeRole,
) -> (usize, usize) {
    let (ds_ns, ds_name) = (
        ds.metadata.namespace.clone().unwrap_or_default(),
        ds.metadata.name.clone().unwrap_or_default(),
    );
    let current = current_revision(ds, revisions);
    let node_selector = ds
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|s| s.node_selector.clone())
        .unwrap_or_default();
    let mine: Vec<&Pod> = pdp_pods
        .iter()
        .filter(|p| {
            p.metadata.namespace.as_deref() == Some(ds_ns.as_str())
                && controlled_by(&p.metadata, "DaemonSet", &ds_name)
                && !is_done(p)
        })
        .collect();
    let (mut covered, mut outdated) = (0, 0);
    for node in nodes {
        let node_name = node.metadata.name.clone().unwrap_or_default();
        let node_labels = node.metadata.labels.clone().unwrap_or_default();
        let wired = wired_on.get(&(profile.to_string(), node_name.clone()));
        let targeted = node_selector
            .iter()
            .all(|(k, v)| node_labels.get(k) == Some(v));
        if !targeted && wired.is_none() {
            continue;
        }
        let here: Vec<&&Pod> = mine
            .iter()
            .filter(|p| {
                p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node_name.as_str())
            })
            .collect();
        let ready = here.iter().find(|p| is_ready(p));
        let subject = format!("node {node_name}");
        let Some(ready) = ready else {
            let not_ready = here
                .iter()
                .map(|p| p.metadata.name.clone().unwrap_or_default())
                .collect::<Vec<_>>();
            let mut message = if not_ready.is_empty() {
                format!("no {ds_name} Pod")
            } else {
                format!("{ds_name} Pod {} not ready", not_ready.join(", "))
            };
            if let Some(w) = wired {
                message.push_str(&format!(
                    ": {} wired to it here {}",
                    plural(w.len(), "Pod"),
                    role.lack
                ));
            } else {
                message.push_str(&format!(
                    ": a daemonset-wired Pod scheduled here {}",
                    role.would
                ));
            }
            let mut f = Finding::new(Severity::Error, role.missing, subject, message).fix(format!(
                "kubectl -n {ds_ns} describe daemonset {ds_name}; kubectl -n {ds_ns} get pods -o wide --field-selector spec.nodeName={node_name}"
            ));
            f.pods = wired.cloned().unwrap_or_default();
            section.push(f);
            continue;
        };
        covered += 1;
        let running = ready
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("controller-revision-hash"));
        if let (Some(cur), Some(run)) = (&current, running)
            && cur != run
        {
            outdated += 1;
            section.push(
                Finding::new(
                    Severity::Warning,
                    role.outdated,
                    subject,
                    format!("{} runs revision {run}, the DaemonSet's current revision is {cur}", ready.metadata.name.as_deref().unwrap_or("")),
                )
                .fix(format!("kubectl -n {ds_ns} rollout status daemonset/{ds_name} (a rollout is under way or stuck)")),
            );
        }
    }
    (covered, outdated)
}

/// The report for what was read.
pub fn analyse(view: &ClusterView) -> Report {
    let mut install = Section::new("install");
    let mut nodes = Section::new("nodes");
    let mut namespaces = Section::new("namespaces");
    let mut pods = Section::new("pods");
    let config = config(view, &mut install);
    let all: &[Namespace] = match &view.namespaces {
        Ok(n) => n,
        Err(e) => {
            namespaces.push(Finding::new(
                Severity::Error,
                "namespaces_unreadable",
                "namespaces",
                format!("cannot list namespaces: {e}"),
            ));
            &[]
        }
    };
    self::install(view, &mut install, all);
    install.summary = format!("webhook namespace {}", view.names.namespace);
    nodes_section(view, config.as_ref(), all, &mut nodes);
    namespaces_section(view, config.as_ref(), all, &mut namespaces);
    pods_section(view, config.as_ref(), all, &mut pods);
    Report::new(vec![install, nodes, namespaces, pods])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{self, Outcome};
    use crate::pki as tlsgen;
    use serde_json::{Value, json};

    const NOW: i64 = 1_900_000_000;

    fn from<T: serde::de::DeserializeOwned>(v: Value) -> T {
        serde_json::from_value(v).unwrap()
    }

    /// The shipped configuration, registered with a caBundle.
    fn registered(ca_pem: &str) -> MutatingWebhookConfiguration {
        let text = include_str!("../../../../manifests/base/mutatingwebhookconfiguration.yaml");
        let mut v: Value = serde_saphyr::from_str(text).unwrap();
        use base64::Engine;
        let b64 = base64::engine::general_purpose::STANDARD.encode(ca_pem);
        for w in v["webhooks"].as_array_mut().unwrap() {
            w["clientConfig"]["caBundle"] = json!(b64);
        }
        from(v)
    }

    fn namespace(name: &str, labels: Value) -> Namespace {
        from(json!({"metadata": {"name": name, "labels": labels}}))
    }

    fn ready_pod(v: Value) -> Pod {
        let mut p: Value = v;
        p["status"] =
            json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]});
        from(p)
    }

    fn node(name: &str) -> Node {
        from(json!({"metadata": {"name": name}}))
    }

    fn pdp_pod(node: &str, revision: &str) -> Pod {
        ready_pod(
            json!({"metadata": {"name": format!("cerbos-pdp-{node}"), "namespace": "pdp-node",
            "labels": {"controller-revision-hash": revision},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "cerbos-pdp", "uid": "d", "controller": true}]},
            "spec": {"nodeName": node, "containers": [{"name": "cerbos"}]}}),
        )
    }

    /// A Pod of Deployment `web` (through ReplicaSet web-1), as the webhook would store it in `ns`.
    fn app_pod(name: &str, ns: &NamespaceInfo, node: &str, config: &Config) -> Pod {
        let p: Pod = from(json!({"metadata": {"name": name, "namespace": ns.name,
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-1", "uid": "r", "controller": true}]},
            "spec": {"nodeName": node, "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.9"}]}}));
        let mut p = match core::inject(&p, ns, config) {
            Outcome::Injected(i) => core::patched(&p, &i.patch).expect("the core's patch applies"),
            _ => p,
        };
        p.status = ready_pod(json!({})).status;
        p
    }

    /// A cluster in order: the shipped webhook configuration, trusted certificate, ready Deployment, one
    /// opted-in namespace whose Pods are wired, a PDP on every node.
    fn in_order() -> ClusterView {
        let bundle =
            tlsgen::generate(&tlsgen::service_sans("pdp-injector", "pdp-system"), 365, 90).unwrap();
        let config = Config::builtin();
        let shop = NamespaceInfo::from_labels(
            "shop",
            &BTreeMap::from([(LABEL_NAMESPACE_INJECTION.to_string(), "enabled".to_string())]),
        );
        let mut owners = Owners::default();
        owners.record(
            "ReplicaSet",
            &from(json!({"name": "web-1", "namespace": "shop",
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": "x", "controller": true}]})),
        );
        ClusterView {
            names: Names::default(),
            scope: None,
            now: time::OffsetDateTime::now_utc().unix_timestamp(),
            native_sidecars: true,
            config: Some(ConfigSource::Installed(Ok(Some(String::new())))),
            webhook: Ok(Some(registered(&bundle.ca_cert_pem))),
            serving_cert: Ok(Some(bundle.cert_pem.clone().into_bytes())),
            live: None,
            deployment: Ok(Some(from(
                json!({"metadata": {"name": "pdp-injector", "namespace": "pdp-system"},
                "spec": {"replicas": 2, "selector": {}, "template": {}}, "status": {"readyReplicas": 2}}),
            ))),
            namespaces: Ok(vec![
                namespace("kube-system", json!({})),
                namespace("pdp-system", json!({})),
                namespace("shop", json!({LABEL_NAMESPACE_INJECTION: "enabled"})),
                namespace("plain", json!({})),
            ]),
            pods: Ok(vec![
                app_pod("web-1-a", &shop, "n1", &config),
                app_pod("web-1-b", &shop, "n2", &config),
            ]),
            owners,
            nodes: Ok(vec![node("n1"), node("n2")]),
            daemonsets: Ok(vec![from(
                json!({"metadata": {"name": "cerbos-pdp", "namespace": "pdp-node",
                "labels": {"app.kubernetes.io/component": "pdp"}},
                "spec": {"selector": {}, "template": {"spec": {"containers": []}}}}),
            )]),
            pdp_pods: Ok(vec![pdp_pod("n1", "v2"), pdp_pod("n2", "v2")]),
            revisions: Ok(vec![
                from(
                    json!({"metadata": {"name": "r1", "namespace": "pdp-node", "labels": {"controller-revision-hash": "v1"},
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "cerbos-pdp", "uid": "d", "controller": true}]}, "revision": 1}),
                ),
                from(
                    json!({"metadata": {"name": "r2", "namespace": "pdp-node", "labels": {"controller-revision-hash": "v2"},
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "cerbos-pdp", "uid": "d", "controller": true}]}, "revision": 2}),
                ),
            ]),
        }
    }

    fn codes(r: &Report, severity: Severity) -> Vec<String> {
        r.sections
            .iter()
            .flat_map(|s| &s.findings)
            .filter(|f| f.severity == severity)
            .map(|f| f.code.clone())
            .collect()
    }

    fn find<'a>(r: &'a Report, code: &str) -> &'a Finding {
        r.sections
            .iter()
            .flat_map(|s| &s.findings)
            .find(|f| f.code == code)
            .unwrap_or_else(|| panic!("no {code} in {}", r.to_text(false)))
    }

    #[test]
    fn a_cluster_in_order_reports_nothing_to_do() {
        let r = analyse(&in_order());
        assert!(r.ok, "{}", r.to_text(false));
        assert_eq!(r.exit_code(), 0);
        assert!(
            codes(&r, Severity::Warning).is_empty(),
            "{}",
            r.to_text(false)
        );
        for code in [
            "config_loaded",
            "webhook_registered",
            "serving_cert_trusted",
            "webhook_ready",
            "pdp_daemonset",
            "namespace_opted_in",
        ] {
            find(&r, code);
        }
        assert!(
            find(&r, "namespace_opted_in")
                .message
                .contains("socket is dropped")
        );
    }

    #[test]
    fn every_valid_namespace_label_is_judged_as_the_webhook_decides() {
        // check's judgement of the label is the core's: central is a mode, not an error; a bad value is one.
        for (value, error) in [
            ("central", false),
            ("sidecar", false),
            ("daemonset", false),
            ("enabled", false),
            ("disabled", false),
            ("centrall", true),
        ] {
            let mut v = in_order();
            if let Ok(all) = v.namespaces.as_mut() {
                all.push(namespace(
                    "moving",
                    json!({LABEL_NAMESPACE_INJECTION: value}),
                ));
            }
            let r = analyse(&v);
            let errors = codes(&r, Severity::Error);
            assert_eq!(
                errors.contains(&"invalid_namespace_label".to_string()),
                error,
                "{value}: {}",
                r.to_text(false)
            );
            if error {
                assert!(r.to_text(false).contains("central"), "{}", r.to_text(false));
            }
        }
    }

    #[test]
    fn missing_webhook_and_no_ready_replica_need_action() {
        let mut v = in_order();
        v.webhook = Ok(None);
        v.deployment = Ok(Some(from(
            json!({"metadata": {"name": "pdp-injector"}, "spec": {"replicas": 2, "selector": {}, "template": {}}}),
        )));
        let r = analyse(&v);
        assert_eq!(r.exit_code(), 1);
        let errors = codes(&r, Severity::Error);
        assert!(
            errors.contains(&"webhook_missing".into())
                && errors.contains(&"webhook_not_ready".into()),
            "{errors:?}"
        );
        // Without a webhook configuration, the wired Pods are still in order; nothing selects new ones.
        assert!(!errors.contains(&"not_wired".into()));
    }

    #[test]
    fn untrusted_or_expiring_certificates() {
        let mut v = in_order();
        let other =
            tlsgen::generate(&tlsgen::service_sans("pdp-injector", "pdp-system"), 365, 10).unwrap();
        v.serving_cert = Ok(Some(other.cert_pem.into_bytes()));
        let r = analyse(&v);
        assert!(
            find(&r, "serving_cert_untrusted")
                .message
                .contains("pdp-injector.pdp-system.svc")
        );
        // A 10-day certificate: in order with 10 days left, late below a quarter, an error below a tenth.
        assert_eq!(find(&r, "certificate_expiry").severity, Severity::Ok);
        v.now += 8 * DAY;
        assert_eq!(
            find(&analyse(&v), "certificate_expiry").severity,
            Severity::Warning
        );
        v.now += DAY + DAY / 2;
        assert_eq!(
            find(&analyse(&v), "certificate_expiry").severity,
            Severity::Error
        );
        v.now += DAY;
        assert!(
            find(&analyse(&v), "certificate_expiry")
                .message
                .starts_with("expired")
        );
        // A 90-day certificate with 20 days left: late (renewal at 30), a warning.
        let mut w = in_order();
        w.now += 70 * DAY;
        assert_eq!(
            find(&analyse(&w), "certificate_expiry").severity,
            Severity::Warning
        );
        v.live = Some(LiveProbe::Untrusted {
            endpoint: "a:443".into(),
            error: "UnknownIssuer".into(),
        });
        assert_eq!(
            find(&analyse(&v), "endpoint_untrusted").severity,
            Severity::Error
        );
        v.live = Some(LiveProbe::Unreachable {
            endpoint: "a:443".into(),
            error: "cannot resolve".into(),
        });
        assert_eq!(
            find(&analyse(&v), "endpoint_unreachable").severity,
            Severity::Info
        );
        let _ = NOW;
    }

    #[test]
    fn webhook_entry_that_reaches_kube_system_is_an_error() {
        let mut v = in_order();
        if let Ok(Some(m)) = v.webhook.as_mut() {
            m.webhooks.as_mut().unwrap()[1].namespace_selector = None;
            m.webhooks.as_mut().unwrap()[0].failure_policy = Some("Ignore".into());
        }
        let r = analyse(&v);
        let msgs: Vec<&str> = r.sections[0]
            .findings
            .iter()
            .filter(|f| f.code == "webhook_entry_differs")
            .map(|f| f.message.as_str())
            .collect();
        assert_eq!(msgs.len(), 2, "{}", r.to_text(false));
        assert!(
            msgs.iter()
                .any(|m| m.contains("failurePolicy Ignore (manifests: Fail)"))
        );
        assert!(
            msgs.iter()
                .any(|m| m.contains("selects namespace kube-system") && m.contains("pdp-system"))
        );
    }

    #[test]
    fn nodes_without_pdp_and_outdated_pdp() {
        let mut v = in_order();
        v.pdp_pods = Ok(vec![pdp_pod("n1", "v1")]);
        v.nodes.as_mut().unwrap().push(node("n3"));
        let r = analyse(&v);
        let missing: Vec<&Finding> = r.sections[1]
            .findings
            .iter()
            .filter(|f| f.code == "node_without_pdp")
            .collect();
        assert_eq!(missing.len(), 2, "{}", r.to_text(false));
        assert_eq!(missing[0].subject, "node n2");
        assert_eq!(missing[0].pods, vec!["shop/web-1-b".to_string()]);
        assert!(missing[1].message.contains("would have no PDP"));
        assert_eq!(find(&r, "pdp_outdated").severity, Severity::Warning);
        // No DaemonSet at all.
        v.daemonsets = Ok(vec![]);
        assert_eq!(
            find(&analyse(&v), "pdp_daemonset_missing").severity,
            Severity::Error
        );
        // No profile in daemonset mode: no node is judged.
        let mut v = in_order();
        v.pods = Ok(vec![]);
        v.namespaces = Ok(vec![namespace(
            "shop",
            json!({LABEL_NAMESPACE_INJECTION: "sidecar"}),
        )]);
        v.daemonsets = Ok(vec![]);
        let r = analyse(&v);
        assert_eq!(r.sections[1].summary, "no profile in daemonset mode");
        assert!(r.ok, "{}", r.to_text(false));
    }

    #[test]
    fn a_node_without_its_front_is_a_node_without_its_pdp() {
        let front_pod = |node: &str| {
            ready_pod(
                json!({"metadata": {"name": format!("pdp-node-front-{node}"), "namespace": "pdp-node",
                "labels": {"controller-revision-hash": "f1"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "pdp-node-front", "uid": "f", "controller": true}]},
                "spec": {"nodeName": node, "containers": [{"name": "front"}]}}),
            )
        };
        let mut v = in_order();
        v.daemonsets.as_mut().unwrap().push(from(
            json!({"metadata": {"name": "pdp-node-front", "namespace": "pdp-node",
            "labels": {"app.kubernetes.io/component": "pdp-front"}},
            "spec": {"selector": {}, "template": {"spec": {"containers": []}}}}),
        ));
        // Every node has both: in order, and the front is reported beside the PDP.
        v.pdp_pods
            .as_mut()
            .unwrap()
            .extend([front_pod("n1"), front_pod("n2")]);
        let r = analyse(&v);
        assert!(r.ok, "{}", r.to_text(false));
        assert!(
            find(&r, "pdp_front")
                .message
                .contains("ready front on 2 nodes")
        );
        // n2 lost its front: its wired Pod cannot reach the PDP, though the PDP runs there.
        v.pdp_pods.as_mut().unwrap().pop();
        let r = analyse(&v);
        assert!(!r.ok);
        let f = find(&r, "node_without_front");
        assert_eq!(f.severity, Severity::Error);
        assert_eq!(f.subject, "node n2");
        assert_eq!(f.pods, vec!["shop/web-1-b".to_string()]);
        assert!(f.message.contains("no pdp-node-front Pod"), "{}", f.message);
        assert!(
            !r.sections[1]
                .findings
                .iter()
                .any(|f| f.code == "node_without_pdp")
        );
    }

    #[test]
    fn namespaces_invalid_unselected_and_privileged() {
        let mut v = in_order();
        v.namespaces.as_mut().unwrap().extend([
            namespace("typo", json!({LABEL_NAMESPACE_INJECTION: "enable"})),
            namespace("ds", json!({LABEL_NAMESPACE_INJECTION: "daemonset", "pod-security.kubernetes.io/enforce": "privileged"})),
        ]);
        if let Ok(Some(m)) = v.webhook.as_mut() {
            m.webhooks.as_mut().unwrap()[0].namespace_selector =
                Some(from(json!({"matchLabels": {"only": "this"}})));
        }
        let r = analyse(&v);
        assert_eq!(
            find(&r, "invalid_namespace_label").subject,
            "namespace typo"
        );
        assert_eq!(
            r.sections[2]
                .findings
                .iter()
                .filter(|f| f.code == "namespace_not_selected")
                .count(),
            2
        );
        let ds = r.sections[2]
            .findings
            .iter()
            .find(|f| f.subject == "namespace ds" && f.code == "namespace_opted_in")
            .unwrap();
        assert!(
            ds.message.contains("with the node's socket"),
            "{}",
            ds.message
        );
    }

    #[test]
    fn pods_grouped_by_workload_with_the_fix() {
        let mut v = in_order();
        // The config changed since the Pods were wired: both Pods of web are stale, one finding.
        v.config = Some(ConfigSource::Installed(Ok(Some(
            "excludedNamespaces: [other]\n".into(),
        ))));
        // A plain Pod in a namespace that opted in after it existed, and a finished one (skipped).
        let late: Pod = ready_pod(
            json!({"metadata": {"name": "solo", "namespace": "shop"}, "spec": {"containers": [{"name": "a"}]}}),
        );
        let mut done = late.clone();
        done.metadata.name = Some("finished".into());
        done.status.as_mut().unwrap().phase = Some("Succeeded".into());
        v.pods.as_mut().unwrap().extend([late, done]);
        let r = analyse(&v);
        let stale = find(&r, "stale_config");
        assert_eq!(stale.subject, "Deployment shop/web");
        assert_eq!(
            stale.pods,
            vec!["shop/web-1-a".to_string(), "shop/web-1-b".to_string()]
        );
        assert_eq!(
            stale.fix.as_deref(),
            Some("kubectl rollout restart deployment/web -n shop")
        );
        let not_wired = find(&r, "not_wired");
        assert_eq!(not_wired.subject, "Pod shop/solo");
        assert!(
            !not_wired.message.contains("no entry"),
            "{}",
            not_wired.message
        );
        assert_eq!(
            r.sections[3].summary,
            "3 Pods compared, 1 finished or terminating skipped"
        );
        assert_eq!(r.exit_code(), 1);
    }

    #[test]
    fn annotation_opt_in_that_no_entry_selects() {
        let mut v = in_order();
        // The label-selected overlay: outside opted-in namespaces only labelled Pods reach the webhook.
        if let Ok(Some(m)) = v.webhook.as_mut() {
            m.webhooks.as_mut().unwrap()[1].object_selector = Some(from(
                json!({"matchExpressions": [{"key": "pdp-injector.io/inject", "operator": "Exists"}]}),
            ));
        }
        let p = ready_pod(json!({"metadata": {"name": "a", "namespace": "plain",
            "annotations": {"pdp-injector.io/inject": "sidecar"}}, "spec": {"containers": [{"name": "a"}]}}));
        v.pods = Ok(vec![p]);
        let f = analyse(&v).sections[3].findings[0].clone();
        assert_eq!(f.code, "not_wired");
        assert!(
            f.message
                .contains("no entry of the webhook configuration selects it"),
            "{}",
            f.message
        );
        assert!(f.fix.unwrap().starts_with("label the Pod template"));
    }

    #[test]
    fn config_that_does_not_load_stops_the_pod_comparison() {
        let mut v = in_order();
        v.config = Some(ConfigSource::Installed(Ok(Some(
            "defaultMode: nope\n".into(),
        ))));
        let r = analyse(&v);
        assert!(find(&r, "config_invalid").message.contains("defaultMode"));
        assert_eq!(
            r.sections[3].summary,
            "2 Pods not compared: no usable config"
        );
        v.config = Some(ConfigSource::Installed(Ok(None)));
        assert_eq!(
            find(&analyse(&v), "config_missing").severity,
            Severity::Warning
        );
    }

    #[test]
    fn classic_sidecars_change_the_hash_as_the_webhook_does() {
        let mut v = in_order();
        v.native_sidecars = false;
        let r = analyse(&v);
        let hash = Config::builtin().with_classic_sidecars().hash;
        assert!(find(&r, "config_loaded").message.contains(&hash));
        // Pods wired on a native-sidecar config are stale against it.
        assert_eq!(find(&r, "stale_config").pods.len(), 2);
    }

    #[test]
    fn a_classic_sidecar_still_running_long_after_its_job_ended_is_said() {
        let mut v = in_order();
        v.native_sidecars = false;
        let classic = Config::builtin().with_classic_sidecars();
        let ns = NamespaceInfo::named("batch");
        // A Job's Pod, wired in the classic form, whose app ended `ago` seconds before the check.
        let job_pod = |name: &str, ago: i64, annotations: Value| -> Pod {
            let p: Pod = from(
                json!({"metadata": {"name": name, "namespace": "batch", "annotations": annotations},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "app", "image": "i"}]}}),
            );
            let Outcome::Injected(i) = core::inject(&p, &ns, &classic) else {
                panic!("not injected")
            };
            let mut p = core::patched(&p, &i.patch).unwrap();
            let ended = time::OffsetDateTime::from_unix_timestamp(v.now - ago).unwrap();
            let ended = format!(
                "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
                ended.year(),
                u8::from(ended.month()),
                ended.day(),
                ended.hour(),
                ended.minute(),
                ended.second()
            );
            p.status = Some(from(json!({"phase": "Running", "containerStatuses": [
                {"name": "cerbos-pdp", "state": {"running": {}}, "ready": true, "restartCount": 0, "image": "c", "imageID": ""},
                {"name": "app", "state": {"terminated": {"exitCode": 0, "finishedAt": ended}}, "ready": false,
                 "restartCount": 0, "image": "i", "imageID": ""}]})));
            p
        };
        let inject = json!({"pdp-injector.io/inject": "sidecar"});
        v.pods.as_mut().unwrap().extend([
            job_pod("stuck", 300, inject.clone()),
            // Ended a moment ago: the watch container has not had its few seconds yet.
            job_pod("just-ended", 5, inject.clone()),
        ]);
        let r = analyse(&v);
        let f = find(&r, "classic_sidecar_not_stopped");
        assert_eq!(f.pods, vec!["batch/stuck".to_string()]);
        assert_eq!(f.severity, Severity::Error);
        assert!(f.message.contains("app: exit 0"), "{}", f.message);
        assert!(
            f.fix
                .as_deref()
                .unwrap()
                .contains("pdp-injector-watch-cerbos-pdp")
        );
    }

    #[test]
    fn a_namespace_in_scope_that_does_not_exist_is_said() {
        let mut v = in_order();
        v.scope = Some("shpo".into());
        let r = analyse(&v);
        assert_eq!(find(&r, "namespace_not_found").subject, "namespace shpo");
        v.scope = Some("shop".into());
        assert!(analyse(&v).ok);
    }

    #[test]
    fn endpoints_from_url_and_service() {
        let w = |cc: Value| -> MutatingWebhook {
            from(
                json!({"name": "x", "admissionReviewVersions": ["v1"], "sideEffects": "None", "clientConfig": cc}),
            )
        };
        assert_eq!(
            endpoint(&w(json!({"url": "https://127.0.0.1:8443/mutate"}))),
            Some(("127.0.0.1".into(), "127.0.0.1:8443".into()))
        );
        assert_eq!(
            endpoint(&w(json!({"url": "https://hook.example/mutate"}))),
            Some(("hook.example".into(), "hook.example:443".into()))
        );
        assert_eq!(
            endpoint(&w(json!({"url": "https://[::1]:9443/m"}))),
            Some(("::1".into(), "[::1]:9443".into()))
        );
        assert_eq!(
            endpoint(&w(
                json!({"service": {"name": "pdp-injector", "namespace": "pdp-system", "port": 443}})
            )),
            Some((
                "pdp-injector.pdp-system.svc".into(),
                "pdp-injector.pdp-system.svc:443".into()
            ))
        );
        assert_eq!(endpoint(&w(json!({"url": "http://plain/"}))), None);
    }
}
