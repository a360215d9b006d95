//! Every name pdp-injector reads or writes on Kubernetes objects, in one place, so that the contract in
//! SPEC.md and the code cannot drift apart silently.

/// Prefix of every annotation and label that belongs to pdp-injector.
pub const PREFIX: &str = "pdp-injector.io/";

/// Pod annotation (or Pod label) that opts a Pod in or out and picks its mode.
pub const ANNOTATION_INJECT: &str = "pdp-injector.io/inject";
/// Pod annotation naming an admin-owned profile from the config.
pub const ANNOTATION_PROFILE: &str = "pdp-injector.io/profile";
/// Pod annotation listing the app containers to wire (comma separated).
pub const ANNOTATION_CONTAINERS: &str = "pdp-injector.io/containers";
/// Annotation the webhook writes on every Pod it injected: JSON describing what it did.
pub const ANNOTATION_STATUS: &str = "pdp-injector.io/status";
/// Pod annotation naming the flag sets the Pod reads (`pdp_core::flag_sets`), given to its app containers as the
/// profile's `envNames.selector` (flagd's `FLAGD_SOURCE_SELECTOR`).
pub const ANNOTATION_FLAG_SETS: &str = "pdp-injector.io/flag-sets";
/// Namespace label that opts a whole namespace in or out and picks its mode.
pub const LABEL_NAMESPACE_INJECTION: &str = "pdp-injector.io/injection";
/// Namespace label (value `"true"`) that makes injection required: no Pod opt-out, no status annotation the Pod
/// does not carry, no container named like the PDP.
pub const LABEL_NAMESPACE_REQUIRED: &str = "pdp-injector.io/required";

/// Namespace label read by the Pod Security admission plugin.
pub const LABEL_PSS_ENFORCE: &str = "pod-security.kubernetes.io/enforce";
/// Annotation the kubelet puts on mirror Pods of static Pods: never mutated (the kubelet owns them).
pub const ANNOTATION_MIRROR: &str = "kubernetes.io/config.mirror";
/// Cluster-autoscaler annotation listing local volumes that do not block a scale-down.
pub const ANNOTATION_SAFE_TO_EVICT_LOCAL_VOLUMES: &str =
    "cluster-autoscaler.kubernetes.io/safe-to-evict-local-volumes";

/// Volume holding the PDP's Unix socket (hostPath in daemonset mode, in-memory emptyDir in sidecar mode).
pub const VOLUME_SOCKET: &str = "pdp-injector-socket";

/// The project's CSI node plugin (`pdp-injector csi-node`): the driver of the socket's inline volume.
pub const CSI_DRIVER: &str = "csi.pdp-injector.io";

/// The socket directory the plugin's default profile serves (the shipped `--profile name=cerbos`): a profile
/// with this socket directory needs no `csiProfile`.
pub const CSI_DEFAULT_SOCKET_DIR: &str = "/var/run/cerbos";

/// The volume attribute that names the plugin's profile (the only attribute the plugin accepts).
pub const CSI_PROFILE_ATTRIBUTE: &str = "profile";
/// Volume holding the optional mTLS client material mounted into app containers.
pub const VOLUME_MTLS: &str = "pdp-injector-mtls";
/// Volume holding the TLS material of the profile's `tls` (CA, optionally a client certificate and key),
/// mounted into app containers in the modes that reach the PDP over TCP (daemonset, central).
pub const VOLUME_TLS: &str = "pdp-injector-tls";

/// Classic sidecars (Kubernetes < 1.29) only: the emptyDir into which the init container [`INIT_TOOLS`] copies
/// `pdp-await`, the helper the PDP container waits with (its `postStart` hook) and stops with (its liveness
/// probe, in a Pod that runs to completion).
pub const VOLUME_TOOLS: &str = "pdp-injector-tools";
/// The init container that copies `pdp-await` into [`VOLUME_TOOLS`].
pub const INIT_TOOLS: &str = "pdp-injector-tools";

/// Daemonset mode with the profile's `awaitNode`: the init container, first of the Pod's, that holds the app
/// until its node's PDP answers its health check through the node's HTTP port (the CSI volume's publish does
/// this for Pods that get the socket by CSI).
pub const INIT_AWAIT: &str = "pdp-injector-await";
/// Where the PDP container (and the init container) mount [`VOLUME_TOOLS`].
pub const TOOLS_DIR: &str = "/var/run/pdp-injector/tools";
/// Where `pdp-await` is in the injector's image.
pub const TOOLS_BINARY_IN_IMAGE: &str = "/usr/local/bin/pdp-await";
/// Classic sidecars in a Pod that runs to completion: the emptyDir the PDP container and the watch container
/// share (the PDP's process list, the stop file its liveness probe reads).
pub const VOLUME_STATE: &str = "pdp-injector-state";
/// Where the PDP container and the watch container mount [`VOLUME_STATE`].
pub const STATE_DIR: &str = "/var/run/pdp-injector/state";
/// The watch container of a run-to-completion Pod with a classic sidecar: this prefix and the PDP container's
/// name. It is last among the containers, so the kubelet starts it after the apps.
pub const WATCH_PREFIX: &str = "pdp-injector-watch-";
/// kubectl's annotation naming the container that `kubectl logs` and `exec` pick by default: a classic sidecar
/// goes first in `containers`, where kubectl would otherwise pick it.
pub const ANNOTATION_DEFAULT_CONTAINER: &str = "kubectl.kubernetes.io/default-container";

/// Namespaces that are never injected, whatever the config says: the control plane's own.
pub const ALWAYS_EXCLUDED_NAMESPACES: [&str; 3] = ["kube-system", "kube-public", "kube-node-lease"];

/// Version written into the status annotation, so a Pod tells which injector wired it.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The names an install gives its pieces (manifests/, the Helm chart): the defaults of every flag that names one.
pub const DEFAULT_NAMESPACE: &str = "pdp-system";
/// The webhook's Service, Deployment and MutatingWebhookConfiguration.
pub const DEFAULT_NAME: &str = "pdp-injector";
/// The Secret with the serving certificate.
pub const DEFAULT_SECRET: &str = "pdp-injector-tls";
/// The ConfigMap with `config.yaml`.
pub const DEFAULT_CONFIG_MAP: &str = "pdp-injector-config";

/// The webhook's own PriorityClass (manifests/overlays/daemonset/webhook/priorityclass.yaml): the webhook refuses every other Pod that
/// names it, in every namespace it is called for.
pub const PRIORITY_CLASS_WEBHOOK: &str = "pdp-injector-webhook";
