//! What `check` read of the cluster, in one value ([`ClusterView`]), and where it looked ([`Names`]).

use std::collections::BTreeMap;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::storage::v1::CSINode;

use crate::check::analyse::FlagSyncView;
use crate::check::certs;
use crate::check::workloads::Owners;
use crate::config::Config;
use crate::names::{DEFAULT_CONFIG_MAP, DEFAULT_NAME, DEFAULT_NAMESPACE, DEFAULT_SECRET};

/// A read that may have failed (forbidden, unreachable): `Err` says why, and the report says what it could
/// not check instead of guessing.
pub type Read<T> = Result<T, String>;

/// The two entries of the shipped MutatingWebhookConfiguration and the failure policy each must have.
pub const ENTRIES: [(&str, &str); 2] = [
    ("namespaces.pdp-injector.io", "Fail"),
    ("pods.pdp-injector.io", "Ignore"),
];

/// Labels that mark the node-local PDP DaemonSets of the chart's templates/cerbos-node.
pub const PDP_COMPONENT_LABEL: (&str, &str) = ("app.kubernetes.io/component", "pdp");
/// The label of the node-local front's DaemonSet (templates/cerbos-node/front.yaml, pdp-node-front).
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
            namespace: DEFAULT_NAMESPACE.into(),
            webhook_config: DEFAULT_NAME.into(),
            deployment: DEFAULT_NAME.into(),
            secret: DEFAULT_SECRET.into(),
            config_map: DEFAULT_CONFIG_MAP.into(),
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
    /// Whether the CSIDriver of the node plugin (`csi.pdp-injector.io`) exists: the webhook reads the same at
    /// start, and `socketVolume: auto` means CSI then.
    pub csi_driver: Read<bool>,
    /// The nodes' CSINode objects: which node has the plugin registered.
    pub csi_nodes: Read<Vec<CSINode>>,
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
    /// The Pods in scope, when read in advance ([`analyse`](super::analyse)); `check` leaves it empty and feeds
    /// them to a [`Judge`](super::Judge) a page at a time.
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
    /// The flag sync source and its node relays, `None` when no source is installed.
    pub flag_sync: Option<FlagSyncView>,
}
