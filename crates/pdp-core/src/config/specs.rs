//! The parts a profile is made of: ports, health check, variables' names, socket, sidecar, volumes and TLS.

use k8s_openapi::api::core::v1::Volume;
use serde::{Deserialize, Serialize};

/// Which Downward API field gives app containers the address of their node's PDP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum HostField {
    /// The node's IP (`status.hostIP`): works without cluster DNS for node names.
    #[serde(rename = "status.hostIP")]
    HostIp,
    /// The node's name (`spec.nodeName`): for clusters where node names resolve and IPs change.
    #[serde(rename = "spec.nodeName")]
    NodeName,
}

impl HostField {
    /// The Downward API field path.
    pub fn field_path(self) -> &'static str {
        match self {
            HostField::HostIp => "status.hostIP",
            HostField::NodeName => "spec.nodeName",
        }
    }
}

/// Where the sidecar goes among the Pod's init containers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Placement {
    /// After the Pod's own init containers: they run before the PDP starts (the default, as with Istio).
    AfterInit,
    /// Before the Pod's own init containers, so that they can already call the PDP.
    First,
}

/// A named port the PDP listens on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NamedPort {
    /// Port name (at most 15 characters, as Kubernetes requires).
    pub name: String,
    /// Port number.
    pub port: u16,
}

/// The PDP's HTTP health endpoint, used for the sidecar's startup and readiness probes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HealthCheck {
    /// HTTP path that answers 200 once the PDP serves decisions.
    pub path: String,
    /// Port of that endpoint.
    pub port: u16,
}

/// Names of the environment variables app containers receive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EnvNames {
    /// Host of the PDP (`127.0.0.1` in sidecar mode, the node from the Downward API in daemonset mode).
    pub host: String,
    /// `host:port` of the PDP: the one variable an app needs, identical in name in both modes.
    pub address: String,
    /// Path of the PDP's Unix socket, when the mode provides one.
    pub socket: String,
    /// Port of the PDP on its own, for SDKs that read host and port separately (flagd's `FLAGD_PORT`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<String>,
    /// With `httpPort`: `host:port` of the PDP's HTTP API (Cerbos's `CERBOS_PDP_HTTP_ADDR`, port 3592), for
    /// HTTP clients where the socket is not mounted. Serialized only when set, so configs without it keep
    /// their hash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_address: Option<String>,
    /// With `tls`: the flag that turns TLS on (`CERBOS_PDP_TLS=true`). Unset: the profile's built-in name. The
    /// TLS names are serialized only when set, so configs without them keep their hash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<String>,
    /// With `tls`: the path of the CA bundle that signs the PDP's serving certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_ca: Option<String>,
    /// With `tls`: the name to verify in the PDP's certificate (the address is the node's IP, which no
    /// certificate names).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_server_name: Option<String>,
    /// With `tls.clientCertificate`: the path of the app's client certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_cert: Option<String>,
    /// With `tls.clientCertificate`: the path of the app's client key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_key: Option<String>,
    /// With the profile's `fallback`: `host:port` of the central Service, for a client to dial when its node's
    /// address refuses (Cerbos `CERBOS_PDP_FALLBACK_ADDR`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback_address: Option<String>,
    /// With `fallback` and `httpPort`: the central Service's HTTP `host:port` (`CERBOS_PDP_FALLBACK_HTTP_ADDR`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback_http_address: Option<String>,
    /// The variable that carries the Pod's `pdp-injector.io/flag-sets` annotation (by the Downward API, empty
    /// when the Pod has none), for providers that choose flag sets (flagd's `FLAGD_SOURCE_SELECTOR`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
}

/// The names of the TLS variables, resolved: what `envNames` sets, else the built-in profile's names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsEnvNames {
    /// `true` when the app must dial with TLS.
    pub flag: String,
    /// Path of the CA bundle.
    pub ca: String,
    /// Name in the PDP's serving certificate.
    pub server_name: String,
    /// Path of the client certificate.
    pub cert: String,
    /// Path of the client key.
    pub key: String,
}

/// Where the PDP's Unix socket lives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SocketSpec {
    /// Directory of the socket: the hostPath in daemonset mode and the mount path in app containers.
    pub dir: String,
    /// File name of the socket inside `dir`.
    pub file: String,
}

impl SocketSpec {
    /// Full path of the socket as app containers see it.
    pub fn path(&self) -> String {
        format!("{}/{}", self.dir.trim_end_matches('/'), self.file)
    }
}

/// How the sidecar is added in sidecar mode.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SidecarSpec {
    /// Where the native sidecar goes among init containers.
    pub placement: Placement,
    /// `true`: a native sidecar (init container with `restartPolicy: Always`, Kubernetes 1.29+).
    /// `false`: a classic container appended to `containers`, for older clusters.
    pub native: bool,
    /// Share the PDP's socket directory with app containers through an in-memory emptyDir.
    pub unix_socket: bool,
}

/// A volume the PDP container needs (its config or policies), mounted only into the PDP container.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProfileVolume {
    /// The Pod volume; its name must not collide with the Pod's own volumes.
    pub volume: Volume,
    /// Where the PDP container sees it.
    pub mount_path: String,
}

/// Client TLS material that app containers use to talk to the PDP over mTLS.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MtlsSpec {
    /// Secret in the Pod's namespace holding the client certificate, key and CA.
    pub secret_name: String,
    /// Where app containers see it (read-only).
    pub mount_path: String,
}

/// TLS on the TCP path (daemonset and central modes): the CA, optionally a client certificate, mounted
/// read-only into app containers from a Secret in the Pod's namespace, and the variables an SDK needs to dial
/// with TLS. Sidecar mode talks to 127.0.0.1 inside the Pod and gets none of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TlsSpec {
    /// Secret in the Pod's namespace, as cert-manager writes it: `ca.crt` (unless `caConfigMap` gives it), and
    /// with `clientCertificate` `tls.crt` and `tls.key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_name: Option<String>,
    /// ConfigMap in the Pod's namespace whose `ca.crt` is the CA of the PDP's serving certificate, when that CA
    /// is not the one that signs the app's client certificate (the Secret's `ca.crt` is then the client CA, which
    /// must not be trusted for the server: whoever may get a client certificate could otherwise pose as the PDP).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_config_map: Option<String>,
    /// Where app containers see those files (read-only).
    #[serde(default = "default_tls_mount_path")]
    pub mount_path: String,
    /// The DNS name in the PDP's serving certificate, which the app verifies instead of the address.
    pub server_name: String,
    /// `true`: the PDP requires client certificates; the app also gets the paths of `tls.crt` and `tls.key`.
    #[serde(default)]
    pub client_certificate: bool,
}

/// Where the TLS Secret is mounted when the profile does not say.
pub const DEFAULT_TLS_MOUNT_PATH: &str = "/var/run/pdp-injector/tls";

fn default_tls_mount_path() -> String {
    DEFAULT_TLS_MOUNT_PATH.into()
}

impl TlsSpec {
    /// The Secret's keys the app gets, in the order they are projected.
    pub fn keys(&self) -> &'static [&'static str] {
        match (self.ca_config_map.is_some(), self.client_certificate) {
            (false, true) => &["ca.crt", "tls.crt", "tls.key"],
            (false, false) => &["ca.crt"],
            (true, true) => &["tls.crt", "tls.key"],
            (true, false) => &[],
        }
    }

    /// Path of one of the Secret's keys as app containers see it.
    pub fn file(&self, key: &str) -> String {
        format!("{}/{key}", self.mount_path.trim_end_matches('/'))
    }
}

/// The IP family of the nodes' addresses (`status.hostIP`, a node's first InternalIP), which decides how
/// daemonset mode writes the address: `10.0.0.7:3593` or `[fd00::7]:3593`. Dual-stack clusters use the family
/// the nodes list first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum NodeAddressFamily {
    /// `$(HOST):port`.
    #[default]
    IPv4,
    /// `[$(HOST)]:port`, the only valid `host:port` around an IPv6 address.
    IPv6,
}

impl NodeAddressFamily {
    pub(super) fn is_ipv4(&self) -> bool {
        *self == NodeAddressFamily::IPv4
    }
}

/// How daemonset mode delivers the node's socket to app containers (`socketVolume` in the config).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum SocketVolume {
    /// A read-only hostPath: only in `privileged` namespaces (Pod Security baseline forbids hostPath);
    /// elsewhere TCP only (`downgraded_pss`).
    HostPath,
    /// A read-only CSI inline volume of the project's node plugin (driver [`crate::names::CSI_DRIVER`]), in
    /// every namespace, privileged ones too: allowed by every Pod Security level, and the Pod starts only once
    /// its node's PDP answers. A profile the plugin does not serve (see [`Profile::csi_serves`](super::Profile::csi_serves)) falls back to `hostPath`.
    Csi,
    /// `hostPath` in `privileged` namespaces; elsewhere `csi` where the cluster has the CSIDriver object (the
    /// webhook reads it at start and every 30 s; `check` reads it too; offline `inject --csi-driver`), TCP only
    /// where it has not (`downgraded_pss`).
    #[default]
    Auto,
}

impl SocketVolume {
    pub(super) fn is_auto(&self) -> bool {
        *self == SocketVolume::Auto
    }
}

/// How one Pod gets its node's socket, decided from the config, the profile and the namespace's level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SocketBy {
    /// The read-only hostPath.
    HostPath,
    /// The read-only CSI inline volume.
    Csi,
    /// No socket: the Pod Security level forbids hostPath and CSI does not serve (`downgraded_pss`).
    Downgraded,
    /// No socket: the profile's node-local PDP serves none (`hostSocket: false`); nothing to warn about.
    NotServed,
}
