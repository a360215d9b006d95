//! The injector's configuration: one YAML file, admin-owned, with built-in defaults so that no file is needed.
//!
//! Pod annotations only *choose* among the profiles defined here; everything that matters for security (image,
//! hostPath, capabilities, user) comes from this file or the built-ins, never from a Pod.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;

use k8s_openapi::api::core::v1::EnvVar;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::names::{ALWAYS_EXCLUDED_NAMESPACES, DEFAULT_NAMESPACE};

mod builtins;
mod central;
mod fit;
mod profile;
mod security;
mod specs;
#[cfg(test)]
mod tests;
mod validate;

pub use builtins::builtin_profiles;
pub use central::{CentralSpec, is_dns_name};
pub use fit::{ClusterFit, supports_native_sidecars, version_part};
pub use profile::Profile;
use profile::{ProfileFile, merge_profile};
pub use security::{SELINUX_TYPES_ALLOWED, restricted_security_context, restricted_violations};
pub use specs::{
    DEFAULT_TLS_MOUNT_PATH, EnvNames, HealthCheck, HostField, MtlsSpec, NamedPort,
    NodeAddressFamily, Placement, ProfileVolume, SidecarSpec, SocketBy, SocketSpec, SocketVolume,
    TlsEnvNames, TlsSpec,
};
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
