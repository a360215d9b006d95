//! The injector's configuration: one YAML file, admin-owned, with built-in defaults so that no file is needed.
//!
//! Pod annotations only *choose* among the profiles defined here; everything that matters for security (image,
//! hostPath, capabilities, user) comes from this file or the built-ins, never from a Pod.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;

use k8s_openapi::api::core::v1::{EnvVar, Volume};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::names::{ALWAYS_EXCLUDED_NAMESPACES, DEFAULT_NAMESPACE};

mod builtins;
mod fit;
mod profile;
mod security;
#[cfg(test)]
mod tests;
mod validate;

pub use builtins::builtin_profiles;
pub use fit::ClusterFit;
pub use profile::Profile;
use profile::{ProfileFile, merge_profile};
pub use security::{SELINUX_TYPES_ALLOWED, restricted_security_context, restricted_violations};
pub use validate::PROFILE_VOLUME_KINDS;
use validate::{check_volume_keys, validate_name, validate_profile};

/// How a Pod is wired to its PDP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// A PDP container inside the Pod (native sidecar).
    Sidecar,
    /// The node-local PDP of a DaemonSet, reached through the Downward API and a hostPath socket.
    Daemonset,
    /// A PDP behind a Service that the profile names (`central.address`): no container, no hostPath.
    Central,
}

impl Mode {
    /// The spelling used in annotations, labels and the status annotation.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Sidecar => "sidecar",
            Mode::Daemonset => "daemonset",
            Mode::Central => "central",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A Pod Security Standards level, ordered from the most to the least permissive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PssLevel {
    /// Anything goes, hostPath included.
    Privileged,
    /// Forbids hostPath, host namespaces and privileged containers.
    Baseline,
    /// Baseline plus non-root, no privilege escalation, dropped capabilities, seccomp.
    Restricted,
}

impl PssLevel {
    /// Reads a `pod-security.kubernetes.io/enforce` value. Anything unknown counts as `restricted`, the level the
    /// Pod Security admission plugin itself falls back to, so a typo never widens what the webhook allows.
    pub fn from_label(value: &str) -> PssLevel {
        match value {
            "privileged" => PssLevel::Privileged,
            "baseline" => PssLevel::Baseline,
            _ => PssLevel::Restricted,
        }
    }

    /// The spelling used in the namespace label.
    pub fn as_str(self) -> &'static str {
        match self {
            PssLevel::Privileged => "privileged",
            PssLevel::Baseline => "baseline",
            PssLevel::Restricted => "restricted",
        }
    }
}

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
    fn is_ipv4(&self) -> bool {
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
    /// its node's PDP answers. A profile the plugin does not serve (see [`Profile::csi_serves`]) falls back to `hostPath`.
    Csi,
    /// `hostPath` in `privileged` namespaces; elsewhere `csi` where the cluster has the CSIDriver object (the
    /// webhook reads it at start and every 30 s; `check` reads it too; offline `inject --csi-driver`), TCP only
    /// where it has not (`downgraded_pss`).
    #[default]
    Auto,
}

impl SocketVolume {
    fn is_auto(&self) -> bool {
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

impl Config {
    /// How a daemonset-mode Pod of `profile` in a namespace of level `pss` gets its node's socket.
    pub fn socket_by(&self, profile: &Profile, pss: PssLevel) -> SocketBy {
        if !profile.host_socket {
            return SocketBy::NotServed;
        }
        let privileged = pss == PssLevel::Privileged;
        let csi = profile.csi_serves()
            && match self.socket_volume {
                SocketVolume::Csi => true,
                // As shared/SPEC.md says: hostPath where the level allows it, CSI elsewhere.
                SocketVolume::Auto => self.csi_driver && !privileged,
                SocketVolume::HostPath => false,
            };
        match (csi, privileged) {
            (true, _) => SocketBy::Csi,
            (false, true) => SocketBy::HostPath,
            (false, false) => SocketBy::Downgraded,
        }
    }
}

/// Where central mode points: a PDP that runs as an ordinary Deployment behind a Service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CentralSpec {
    /// `host:port` of the Service, for example `cerbos.cerbos.svc.cluster.local:3593`; an IPv6 host is written
    /// in brackets (`[fd00::1]:3593`).
    pub address: String,
    /// `host:port` of the Service's HTTP port, for the profile's HTTP address variable. Unset: the host of
    /// `address` with the profile's `httpPort` (the shipped Service serves both). Serialized only when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_address: Option<String>,
}

impl CentralSpec {
    /// The HTTP address of the Service: `httpAddress`, or the host of `address` with `http_port`.
    pub fn http_address(&self, http_port: u16) -> String {
        match &self.http_address {
            Some(a) => a.clone(),
            None => {
                let host = self.address.rsplit_once(':').map_or("", |(h, _)| h);
                format!("{host}:{http_port}")
            }
        }
    }

    /// The host (without brackets) and the port of `address`, or why it is not a usable `host:port`.
    pub fn host_port(&self) -> Result<(&str, u16), String> {
        let a = self.address.as_str();
        let (host, port) = a
            .rsplit_once(':')
            .ok_or_else(|| format!("{a:?} is not host:port (no port)"))?;
        let port: u16 = port
            .parse()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("{a:?} has no valid port (1-65535) after the last ':'"))?;
        let host = match host.strip_prefix('[') {
            Some(rest) => {
                let inner = rest
                    .strip_suffix(']')
                    .ok_or_else(|| format!("{a:?}: an IPv6 host needs its closing ']'"))?;
                inner
                    .parse::<std::net::Ipv6Addr>()
                    .map_err(|_| format!("{a:?}: {inner:?} is not an IPv6 address"))?;
                inner
            }
            None if host.contains(':') => {
                return Err(format!(
                    "{a:?}: an IPv6 host must be written in brackets, as in [{host}]:{port}"
                ));
            }
            None => {
                // A DNS name or an IPv4 address: lowercase labels of letters, digits and '-', dot-separated.
                // Anything else (spaces, '$(', '/', a scheme) would end up verbatim in the app's variables.
                if !is_dns_name(host) {
                    return Err(format!(
                        "{a:?}: host {host:?} is not a DNS name or an IP address (lowercase letters, digits, '-' and '.')"
                    ));
                }
                host
            }
        };
        Ok((host, port))
    }
}

/// A DNS name or an IPv4 address as Kubernetes writes them: dot-separated labels of lowercase letters, digits
/// and '-', at most 253 characters.
pub fn is_dns_name(host: &str) -> bool {
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    };
    host.len() <= 253 && host.split('.').all(label_ok)
}

/// The file as written.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ConfigFile {
    default_mode: Option<Mode>,
    default_profile: Option<String>,
    inject_by_default: Option<bool>,
    webhook_namespace: Option<String>,
    excluded_namespaces: Option<Vec<String>>,
    default_pod_security_level: Option<PssLevel>,
    node_address_family: Option<NodeAddressFamily>,
    tools_image: Option<String>,
    socket_volume: Option<SocketVolume>,
    profiles: Option<BTreeMap<String, ProfileFile>>,
}

/// The resolved configuration the core works from.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Config {
    /// Mode for `enabled` opt-ins.
    pub default_mode: Mode,
    /// Profile for Pods without a profile annotation.
    pub default_profile: String,
    /// Inject Pods that neither they nor their namespace opted in or out.
    pub inject_by_default: bool,
    /// The webhook's own namespace: never injected.
    pub webhook_namespace: String,
    /// Namespaces never injected (the control plane's, the webhook's own, and any listed in the file).
    pub excluded_namespaces: BTreeSet<String>,
    /// The Pod Security level of a namespace without an enforce label (or unknown, as offline).
    pub default_pod_security_level: PssLevel,
    /// The IP family of `status.hostIP`: how daemonset mode writes the node's address. Serialized only when
    /// not the default IPv4, so existing configs keep their hash.
    #[serde(skip_serializing_if = "NodeAddressFamily::is_ipv4")]
    pub node_address_family: NodeAddressFamily,
    /// The image of the init container that gives a classic sidecar (Kubernetes < 1.29) its helper `pdp-await`:
    /// the injector's own image by default. Serialized only when set otherwise, so existing configs keep their
    /// hash.
    #[serde(skip_serializing_if = "is_default_tools_image")]
    pub tools_image: String,
    /// How daemonset mode delivers the node's socket. Serialized only when not the default `auto`, so existing
    /// configs keep their hash.
    #[serde(skip_serializing_if = "SocketVolume::is_auto")]
    pub socket_volume: SocketVolume,
    /// Whether the cluster has the CSIDriver object of the node plugin: a fact of the cluster
    /// ([`ClusterFit`]), not of the file. Serialized only when true, so a Pod wired before the driver was
    /// installed has another config hash than one wired after (`check` names it stale).
    #[serde(skip_serializing_if = "is_false")]
    pub csi_driver: bool,
    /// Named profiles.
    pub profiles: BTreeMap<String, Profile>,
    /// Short hash of everything above, written into the status annotation.
    #[serde(skip)]
    pub hash: String,
}

/// Why a config file was refused. The last good config stays in force.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not YAML.
    #[error("config is not valid YAML: {0}")]
    Syntax(String),
    /// A key is unknown or a value has the wrong type; `path` names the key (for example `profiles.cerbos.imge`).
    #[error("config key {path}: {message}")]
    Field {
        /// Dotted path of the offending key.
        path: String,
        /// What is wrong with it.
        message: String,
    },
    /// The values parse but do not make a usable config.
    #[error("config is invalid: {0}")]
    Invalid(String),
}

impl Default for Config {
    fn default() -> Self {
        Config::builtin()
    }
}

impl Config {
    /// The configuration with no file: both built-in profiles, daemonset mode, opt-in only.
    pub fn builtin() -> Config {
        Self::resolve(ConfigFile::default()).expect("the built-in config is valid")
    }

    /// Reads and resolves a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_yaml(&text)
    }

    /// Parses and resolves config text. Unknown keys are errors naming their path.
    pub fn from_yaml(text: &str) -> Result<Config, ConfigError> {
        let tree: serde_json::Value = if text.trim().is_empty() {
            serde_json::Value::Null
        } else {
            serde_saphyr::from_str(text).map_err(|e| ConfigError::Syntax(e.to_string()))?
        };
        let file: ConfigFile = if tree.is_null() {
            ConfigFile::default()
        } else {
            check_volume_keys(&tree)?;
            serde_path_to_error::deserialize(tree).map_err(|e| ConfigError::Field {
                path: e.path().to_string(),
                message: e.inner().to_string(),
            })?
        };
        Self::resolve(file)
    }

    fn resolve(file: ConfigFile) -> Result<Config, ConfigError> {
        let mut profiles = builtin_profiles();
        for (name, overlay) in file.profiles.unwrap_or_default() {
            validate_name("profile name", &name)?;
            let base_name = overlay.extends.clone().unwrap_or_else(|| name.clone());
            let base = match profiles.get(&base_name) {
                Some(p) => Some(p.clone()),
                None if overlay.extends.is_some() => {
                    return Err(ConfigError::Invalid(format!(
                        "profile {name:?} extends unknown profile {base_name:?}"
                    )));
                }
                None => None,
            };
            let profile = merge_profile(&name, base, overlay)?;
            profiles.insert(name, profile);
        }
        for (name, profile) in &profiles {
            validate_profile(name, profile)?;
        }
        let default_profile = file.default_profile.unwrap_or_else(|| "cerbos".into());
        if !profiles.contains_key(&default_profile) {
            return Err(ConfigError::Invalid(format!(
                "defaultProfile {default_profile:?} is not a profile; profiles are {}",
                profiles.keys().cloned().collect::<Vec<_>>().join(", ")
            )));
        }
        let default_mode = file.default_mode.unwrap_or(Mode::Daemonset);
        if default_mode == Mode::Central && profiles[&default_profile].central.is_none() {
            return Err(ConfigError::Invalid(format!(
                "defaultMode is central but the default profile {default_profile:?} has no central.address: \
                 set profiles.{default_profile}.central.address (host:port of the PDP's Service)"
            )));
        }
        let webhook_namespace = file
            .webhook_namespace
            .unwrap_or_else(|| DEFAULT_NAMESPACE.into());
        let mut excluded: BTreeSet<String> = ALWAYS_EXCLUDED_NAMESPACES
            .iter()
            .map(|s| s.to_string())
            .collect();
        excluded.insert(webhook_namespace.clone());
        excluded.extend(file.excluded_namespaces.unwrap_or_default());
        let mut config = Config {
            default_mode,
            default_profile,
            inject_by_default: file.inject_by_default.unwrap_or(false),
            webhook_namespace,
            excluded_namespaces: excluded,
            default_pod_security_level: file
                .default_pod_security_level
                // Fail safe: assuming more than the cluster allows gets Pods rejected; less only drops the socket.
                .unwrap_or(PssLevel::Baseline),
            node_address_family: file.node_address_family.unwrap_or_default(),
            tools_image: match file.tools_image {
                Some(image) if image.trim().is_empty() || image.contains(char::is_whitespace) => {
                    return Err(ConfigError::Invalid(format!(
                        "toolsImage {image:?} is not an image reference"
                    )));
                }
                Some(image) => image,
                None => default_tools_image(),
            },
            socket_volume: file.socket_volume.unwrap_or_default(),
            csi_driver: false,
            profiles,
            hash: String::new(),
        };
        config.hash = hash_of(&config);
        Ok(config)
    }

    /// The same config in a cluster with (or without) the node plugin's CSIDriver: `socketVolume: auto` then
    /// means CSI. The hash changes with it.
    pub fn with_csi_driver(mut self, installed: bool) -> Config {
        self.csi_driver = installed;
        self.hash = hash_of(&self);
        self
    }

    /// The same config for an apiserver without native sidecars (before 1.29): every sidecar becomes a classic
    /// container. The hash changes with it, so the status annotation tells which form a Pod got.
    pub fn with_classic_sidecars(mut self) -> Config {
        for profile in self.profiles.values_mut() {
            profile.sidecar.native = false;
        }
        self.hash = hash_of(&self);
        self
    }

    /// Every image a container the injector adds may run: the profiles' PDPs, and its own image for a classic
    /// sidecar's helper (`toolsImage`).
    pub fn added_images(&self) -> impl Iterator<Item = &str> {
        self.profiles
            .values()
            .map(|p| p.image.as_str())
            .chain([self.tools_image.as_str()])
    }

    /// Names of the profiles, for error messages.
    pub fn profile_names(&self) -> String {
        self.profiles.keys().cloned().collect::<Vec<_>>().join(", ")
    }
}

/// The injector's own image, of this version: it carries `pdp-await` at [`crate::names::TOOLS_BINARY_IN_IMAGE`].
pub fn default_tools_image() -> String {
    format!(
        "ghcr.io/pdp-injector/pdp-injector:{}",
        crate::names::VERSION
    )
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_default_tools_image(image: &String) -> bool {
    *image == default_tools_image()
}

/// What a classic sidecar gets besides its container (the `pdp-await` helper, its `postStart` wait, the end
/// with a Job's app): part of the hash of any config with a classic sidecar, so that Pods wired with an earlier
/// classic form (the sidecar appended after the apps, nothing that waited) read as wired by another config.
const CLASSIC_FORM: &str = "classic-form-2";

fn hash_of(config: &Config) -> String {
    // A config of strings, numbers and maps with string keys always serializes.
    let mut canonical = serde_json::to_vec(config).expect("config serializes to JSON");
    if config.profiles.values().any(|p| !p.sidecar.native) {
        canonical.extend_from_slice(CLASSIC_FORM.as_bytes());
        canonical.extend_from_slice(config.tools_image.as_bytes());
    }
    let digest = Sha256::digest(&canonical);
    digest[..6].iter().map(|b| format!("{b:02x}")).collect()
}
