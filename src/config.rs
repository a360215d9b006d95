//! The injector's configuration: one YAML file, admin-owned, with built-in defaults so that no file is needed.
//!
//! Pod annotations only *choose* among the profiles defined here; everything that matters for security (image,
//! hostPath, capabilities, user) comes from this file or the built-ins, never from a Pod.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;

use k8s_openapi::api::core::v1::{
    Capabilities, EnvVar, ResourceRequirements, SeccompProfile, SecurityContext, Volume,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::names::ALWAYS_EXCLUDED_NAMESPACES;

/// How a Pod is wired to its PDP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// A PDP container inside the Pod (native sidecar).
    Sidecar,
    /// The node-local PDP of a DaemonSet, reached through the Downward API and a hostPath socket.
    Daemonset,
}

impl Mode {
    /// The spelling used in annotations, labels and the status annotation.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Sidecar => "sidecar",
            Mode::Daemonset => "daemonset",
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

/// Everything pdp-injector needs to wire a Pod to one kind of PDP. Admin-owned.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Profile {
    /// PDP image for the sidecar.
    pub image: String,
    /// Pull policy of that image.
    pub image_pull_policy: String,
    /// Name of the sidecar container; its presence marks a Pod as already wired.
    pub container_name: String,
    /// Arguments of the sidecar.
    pub args: Vec<String>,
    /// Extra environment of the sidecar.
    pub env: Vec<EnvVar>,
    /// Ports the PDP listens on.
    pub ports: Vec<NamedPort>,
    /// The port the address variable points at.
    pub address_port: u16,
    /// Health endpoint for the sidecar's probes.
    pub health: HealthCheck,
    /// Resources of the sidecar.
    pub resources: ResourceRequirements,
    /// Security context of the sidecar; must meet Pod Security `restricted`.
    pub security_context: SecurityContext,
    /// Names of the variables app containers receive.
    pub env_names: EnvNames,
    /// Downward API field for the host in daemonset mode.
    pub host_field: HostField,
    /// The PDP's socket.
    pub socket: SocketSpec,
    /// Sidecar shape and placement.
    pub sidecar: SidecarSpec,
    /// Volumes of the sidecar (config, policies).
    pub volumes: Vec<ProfileVolume>,
    /// Optional client mTLS Secret mounted into app containers.
    pub mtls: Option<MtlsSpec>,
}

/// A profile as written in the file: every field optional, laid over the profile it `extends` (by default the
/// built-in of the same name, if there is one).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ProfileFile {
    extends: Option<String>,
    image: Option<String>,
    image_pull_policy: Option<String>,
    container_name: Option<String>,
    args: Option<Vec<String>>,
    env: Option<Vec<EnvVar>>,
    ports: Option<Vec<NamedPort>>,
    address_port: Option<u16>,
    health: Option<HealthCheck>,
    resources: Option<ResourceRequirements>,
    security_context: Option<SecurityContext>,
    env_names: Option<EnvNames>,
    host_field: Option<HostField>,
    socket: Option<SocketSpec>,
    sidecar: Option<SidecarSpec>,
    volumes: Option<Vec<ProfileVolume>>,
    mtls: Option<MtlsSpec>,
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
        let webhook_namespace = file
            .webhook_namespace
            .unwrap_or_else(|| "pdp-system".into());
        let mut excluded: BTreeSet<String> = ALWAYS_EXCLUDED_NAMESPACES
            .iter()
            .map(|s| s.to_string())
            .collect();
        excluded.insert(webhook_namespace.clone());
        excluded.extend(file.excluded_namespaces.unwrap_or_default());
        let mut config = Config {
            default_mode: file.default_mode.unwrap_or(Mode::Daemonset),
            default_profile,
            inject_by_default: file.inject_by_default.unwrap_or(false),
            webhook_namespace,
            excluded_namespaces: excluded,
            default_pod_security_level: file
                .default_pod_security_level
                // Fail safe: assuming more than the cluster allows gets Pods rejected; less only drops the socket.
                .unwrap_or(PssLevel::Baseline),
            profiles,
            hash: String::new(),
        };
        let canonical =
            serde_json::to_vec(&config).map_err(|e| ConfigError::Invalid(e.to_string()))?;
        let digest = Sha256::digest(&canonical);
        config.hash = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
        Ok(config)
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

    /// Names of the profiles, for error messages.
    pub fn profile_names(&self) -> String {
        self.profiles.keys().cloned().collect::<Vec<_>>().join(", ")
    }
}

fn hash_of(config: &Config) -> String {
    // A config of strings, numbers and maps with string keys always serializes.
    let canonical = serde_json::to_vec(config).expect("config serializes to JSON");
    let digest = Sha256::digest(&canonical);
    digest[..6].iter().map(|b| format!("{b:02x}")).collect()
}

fn merge_profile(
    name: &str,
    base: Option<Profile>,
    o: ProfileFile,
) -> Result<Profile, ConfigError> {
    let missing = |field: &str| {
        ConfigError::Invalid(format!(
            "profile {name:?} has no {field} (a new profile must set it or `extends` a profile that does)"
        ))
    };
    match base {
        Some(b) => Ok(Profile {
            image: o.image.unwrap_or(b.image),
            image_pull_policy: o.image_pull_policy.unwrap_or(b.image_pull_policy),
            container_name: o.container_name.unwrap_or(b.container_name),
            args: o.args.unwrap_or(b.args),
            env: o.env.unwrap_or(b.env),
            ports: o.ports.unwrap_or(b.ports),
            address_port: o.address_port.unwrap_or(b.address_port),
            health: o.health.unwrap_or(b.health),
            resources: o.resources.unwrap_or(b.resources),
            security_context: o
                .security_context
                .map(overlay_security_context)
                .unwrap_or(b.security_context),
            env_names: o.env_names.unwrap_or(b.env_names),
            host_field: o.host_field.unwrap_or(b.host_field),
            socket: o.socket.unwrap_or(b.socket),
            sidecar: o.sidecar.unwrap_or(b.sidecar),
            volumes: o.volumes.unwrap_or(b.volumes),
            mtls: o.mtls.or(b.mtls),
        }),
        None => {
            let ports = o.ports.ok_or_else(|| missing("ports"))?;
            let address_port = o
                .address_port
                .or_else(|| ports.first().map(|p| p.port))
                .ok_or_else(|| missing("addressPort"))?;
            Ok(Profile {
                image: o.image.ok_or_else(|| missing("image"))?,
                image_pull_policy: o.image_pull_policy.unwrap_or_else(|| "IfNotPresent".into()),
                container_name: o.container_name.unwrap_or_else(|| format!("{name}-pdp")),
                args: o.args.unwrap_or_default(),
                env: o.env.unwrap_or_default(),
                ports,
                address_port,
                health: o.health.ok_or_else(|| missing("health"))?,
                resources: o.resources.unwrap_or_else(default_resources),
                security_context: overlay_security_context(o.security_context.unwrap_or_default()),
                env_names: o.env_names.ok_or_else(|| missing("envNames"))?,
                host_field: o.host_field.unwrap_or(HostField::HostIp),
                socket: o.socket.ok_or_else(|| missing("socket"))?,
                sidecar: o.sidecar.unwrap_or(SidecarSpec {
                    placement: Placement::AfterInit,
                    native: true,
                    unix_socket: false,
                }),
                volumes: o.volumes.unwrap_or_default(),
                mtls: o.mtls,
            })
        }
    }
}

/// Lays an admin's security context over the restricted baseline, so that an admin who only sets a user does not
/// lose the rest of the hardening.
fn overlay_security_context(admin: SecurityContext) -> SecurityContext {
    let base = restricted_security_context(None);
    SecurityContext {
        allow_privilege_escalation: admin
            .allow_privilege_escalation
            .or(base.allow_privilege_escalation),
        capabilities: admin.capabilities.or(base.capabilities),
        privileged: admin.privileged.or(base.privileged),
        read_only_root_filesystem: admin
            .read_only_root_filesystem
            .or(base.read_only_root_filesystem),
        run_as_non_root: admin.run_as_non_root.or(base.run_as_non_root),
        seccomp_profile: admin.seccomp_profile.or(base.seccomp_profile),
        ..admin
    }
}

/// The hardening every injected container gets: Pod Security `restricted`.
pub fn restricted_security_context(user: Option<i64>) -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            add: None,
        }),
        privileged: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        run_as_user: user,
        run_as_group: user,
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            localhost_profile: None,
        }),
        ..Default::default()
    }
}

/// SELinux types that Pod Security `baseline` (and so `restricted`) allows on a container, unset included.
/// `container_engine_t` is allowed only from Kubernetes 1.31 on; the install supports 1.30, where Pod Security
/// admission refuses it, and a PDP runs no container engine: it is refused here.
pub const SELINUX_TYPES_ALLOWED: [&str; 4] =
    ["", "container_t", "container_init_t", "container_kvm_t"];

/// Checks a container security context against Pod Security `restricted` (which includes `baseline`), as the
/// Pod Security admission plugin would: every control of the Pod Security Standards page that a container's
/// `securityContext` can break. Returns one message per violation, each naming the field and its value.
pub fn restricted_violations(sc: &SecurityContext) -> Vec<String> {
    let mut v = Vec::new();
    // baseline: Privileged Containers.
    if sc.privileged == Some(true) {
        v.push("privileged is true".to_string());
    }
    // restricted: Privilege Escalation.
    if sc.allow_privilege_escalation != Some(false) {
        v.push("allowPrivilegeEscalation is not false".to_string());
    }
    // restricted: Running as Non-root, Running as Non-root user.
    if sc.run_as_non_root != Some(true) {
        v.push("runAsNonRoot is not true".to_string());
    }
    if sc.run_as_user == Some(0) {
        v.push("runAsUser is 0".to_string());
    }
    // restricted: Capabilities (drop ALL, add at most NET_BIND_SERVICE; stricter than baseline's list).
    let caps = sc.capabilities.as_ref();
    let drops_all = caps
        .and_then(|c| c.drop.as_ref())
        .is_some_and(|d| d.iter().any(|c| c == "ALL"));
    if !drops_all {
        v.push("capabilities.drop does not contain ALL".to_string());
    }
    if let Some(add) = caps.and_then(|c| c.add.as_ref()) {
        let extra: Vec<&str> = add
            .iter()
            .map(String::as_str)
            .filter(|c| *c != "NET_BIND_SERVICE")
            .collect();
        if !extra.is_empty() {
            v.push(format!(
                "capabilities.add holds {} (only NET_BIND_SERVICE is allowed)",
                extra.join(", ")
            ));
        }
    }
    // restricted: Seccomp (baseline only forbids Unconfined; restricted requires a profile).
    match sc.seccomp_profile.as_ref().map(|s| s.type_.as_str()) {
        Some("RuntimeDefault") | Some("Localhost") => {}
        Some(other) => v.push(format!(
            "seccompProfile.type is {other:?} (allowed: RuntimeDefault, Localhost)"
        )),
        None => {
            v.push("seccompProfile.type is unset (allowed: RuntimeDefault, Localhost)".to_string())
        }
    }
    // baseline: /proc Mount Type.
    if let Some(mount) = sc.proc_mount.as_deref()
        && mount != "Default"
    {
        v.push(format!(
            "procMount is {mount:?} (allowed: Default or unset)"
        ));
    }
    // baseline: SELinux (type from a fixed list; user and role never set).
    if let Some(se) = &sc.se_linux_options {
        if let Some(t) = se.type_.as_deref()
            && !SELINUX_TYPES_ALLOWED.contains(&t)
        {
            v.push(format!(
                "seLinuxOptions.type is {t:?} (allowed: unset, \"\", container_t, container_init_t, container_kvm_t)"
            ));
        }
        for (field, value) in [("user", &se.user), ("role", &se.role)] {
            if let Some(value) = value.as_deref()
                && !value.is_empty()
            {
                v.push(format!(
                    "seLinuxOptions.{field} is {value:?} (must be unset or \"\")"
                ));
            }
        }
    }
    // baseline: AppArmor.
    if let Some(profile) = &sc.app_armor_profile
        && !matches!(profile.type_.as_str(), "RuntimeDefault" | "Localhost")
    {
        v.push(format!(
            "appArmorProfile.type is {:?} (allowed: RuntimeDefault, Localhost, or no appArmorProfile)",
            profile.type_
        ));
    }
    // baseline: HostProcess (Windows).
    if sc
        .windows_options
        .as_ref()
        .and_then(|w| w.host_process)
        .unwrap_or(false)
    {
        v.push("windowsOptions.hostProcess is true".to_string());
    }
    v
}

fn validate_name(what: &str, name: &str) -> Result<(), ConfigError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(ConfigError::Invalid(format!(
            "{what} {name:?} is not a DNS label (lowercase letters, digits and '-', at most 63)"
        )))
    }
}

fn validate_env_name(profile: &str, name: &str) -> Result<(), ConfigError> {
    let ok = !name.is_empty()
        && !name.as_bytes()[0].is_ascii_digit()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(ConfigError::Invalid(format!(
            "profile {profile:?}: {name:?} is not a valid environment variable name"
        )))
    }
}

fn validate_profile(name: &str, p: &Profile) -> Result<(), ConfigError> {
    let bad = |msg: String| Err(ConfigError::Invalid(format!("profile {name:?}: {msg}")));
    validate_name("container name", &p.container_name)?;
    if p.image.trim().is_empty() {
        return bad("image is empty".into());
    }
    if p.ports.is_empty() {
        return bad("ports is empty".into());
    }
    for port in &p.ports {
        if port.port == 0 {
            return bad(format!("port {:?} is 0", port.name));
        }
        validate_name("port name", &port.name)?;
        if port.name.len() > 15 {
            return bad(format!(
                "port name {:?} is longer than 15 characters",
                port.name
            ));
        }
    }
    if !p.ports.iter().any(|port| port.port == p.address_port) {
        return bad(format!(
            "addressPort {} is not one of its ports",
            p.address_port
        ));
    }
    if !p.health.path.starts_with('/') {
        return bad(format!(
            "health.path {:?} must start with '/'",
            p.health.path
        ));
    }
    let names = [&p.env_names.host, &p.env_names.address, &p.env_names.socket];
    for n in names.iter().copied().chain(p.env_names.port.as_ref()) {
        validate_env_name(name, n)?;
    }
    let distinct: BTreeSet<&String> = names
        .iter()
        .copied()
        .chain(p.env_names.port.as_ref())
        .collect();
    if distinct.len() != 3 + usize::from(p.env_names.port.is_some()) {
        return bad("envNames must be distinct".into());
    }
    for (what, path) in [("socket.dir", &p.socket.dir)]
        .into_iter()
        .chain(p.mtls.as_ref().map(|m| ("mtls.mountPath", &m.mount_path)))
        .chain(
            p.volumes
                .iter()
                .map(|v| ("volumes[].mountPath", &v.mount_path)),
        )
    {
        if !path.starts_with('/') || path.split('/').any(|seg| seg == "..") {
            return bad(format!(
                "{what} {path:?} must be an absolute path without '..'"
            ));
        }
    }
    if p.socket.file.is_empty() || p.socket.file.contains('/') {
        return bad(format!(
            "socket.file {:?} must be a plain file name",
            p.socket.file
        ));
    }
    if let Some(problem) = socket_dir_problem(&p.socket.dir) {
        return bad(format!("socket.dir {:?} {problem}", p.socket.dir));
    }
    let mut volume_names = BTreeSet::from([crate::names::VOLUME_SOCKET, crate::names::VOLUME_MTLS]);
    for v in &p.volumes {
        validate_name("volume name", &v.volume.name)?;
        if let Some(problem) = volume_source_problem(&v.volume) {
            return bad(format!("volume {:?} {problem}", v.volume.name));
        }
        if !volume_names.insert(v.volume.name.as_str()) {
            return bad(format!(
                "volume name {:?} is used twice or reserved",
                v.volume.name
            ));
        }
    }
    if let Some(m) = &p.mtls {
        validate_name("mtls.secretName", &m.secret_name)?;
    }
    let violations = restricted_violations(&p.security_context);
    if !violations.is_empty() {
        return bad(format!(
            "securityContext does not meet Pod Security restricted: {}",
            violations.join("; ")
        ));
    }
    Ok(())
}

/// The volume sources a profile may give its sidecar: data the apiserver or kubelet hands the Pod, nothing that
/// reaches the node's filesystem (hostPath), network or cluster storage (persistentVolumeClaim, csi, ephemeral,
/// nfs, iscsi, image, ...), and nothing unknown. Field names as in the Kubernetes Volume.
pub const PROFILE_VOLUME_KINDS: [&str; 5] = [
    "configMap",
    "secret",
    "emptyDir",
    "projected",
    "downwardAPI",
];

/// What is wrong with a profile volume's source, if anything: it must have exactly one, from
/// [`PROFILE_VOLUME_KINDS`].
fn volume_source_problem(volume: &Volume) -> Option<String> {
    let allowed = PROFILE_VOLUME_KINDS.join(", ");
    // Every source the typed Volume knows, by its field name: the JSON keys other than `name`.
    let sources: Vec<String> = match serde_json::to_value(volume) {
        Ok(serde_json::Value::Object(map)) => map
            .into_iter()
            .map(|(k, _)| k)
            .filter(|k| k != "name")
            .collect(),
        _ => {
            return Some(format!(
                "cannot be read; sidecar volumes may only be {allowed}"
            ));
        }
    };
    if let Some(kind) = sources
        .iter()
        .find(|k| !PROFILE_VOLUME_KINDS.contains(&k.as_str()))
    {
        return Some(format!(
            "is a {kind} volume; sidecar volumes may only be {allowed} (nothing that reaches into the node or \
             cluster storage)"
        ));
    }
    match sources.len() {
        1 => None,
        0 => Some(format!(
            "has no volume source; sidecar volumes must be one of {allowed}"
        )),
        _ => Some(format!(
            "has several volume sources ({}); a volume has exactly one",
            sources.join(", ")
        )),
    }
}

/// Keys of profile volumes in the file that the typed Volume would drop silently (an unknown or misspelt
/// source, or one newer than this build's Kubernetes types): refused, with their path, instead of leaving a
/// volume without its source.
fn check_volume_keys(tree: &serde_json::Value) -> Result<(), ConfigError> {
    let Some(profiles) = tree.get("profiles").and_then(serde_json::Value::as_object) else {
        return Ok(());
    };
    for (name, profile) in profiles {
        let Some(volumes) = profile.get("volumes").and_then(serde_json::Value::as_array) else {
            continue;
        };
        for (i, v) in volumes.iter().enumerate() {
            let Some(volume) = v.get("volume").and_then(serde_json::Value::as_object) else {
                continue;
            };
            // The keys the typed Volume keeps; a volume that does not even parse is reported by the
            // deserializer, with its path, and a known but forbidden source by validate_profile.
            let Ok(typed) =
                serde_json::from_value::<Volume>(serde_json::Value::Object(volume.clone()))
            else {
                continue;
            };
            let kept = serde_json::to_value(&typed).unwrap_or_default();
            for key in volume.keys() {
                if kept.get(key).is_none() {
                    return Err(ConfigError::Field {
                        path: format!("profiles.{name}.volumes[{i}].volume.{key}"),
                        message: format!(
                            "{key:?} is not a volume source this injector knows; sidecar volumes may only be {}",
                            PROFILE_VOLUME_KINDS.join(", ")
                        ),
                    });
                }
            }
        }
    }
    Ok(())
}

/// Directories that hold other directories of their own: `socket.dir` may be below them, never them or above.
const SOCKET_DIR_PARENTS: [&str; 5] = ["/", "/run", "/var/run", "/var", "/var/lib"];

/// Trees of the node that belong to the system, the kubelet or the container runtime (with its sockets):
/// `socket.dir` may be none of them, nor above, nor inside one. In daemonset mode `socket.dir` is a hostPath
/// of the node, mounted into every wired Pod (and created, made writable, by the PDP's DaemonSet).
/// `/var/run` is a symlink to `/run` on most nodes: both spellings are listed.
const SOCKET_DIR_SYSTEM_TREES: [&str; 23] = [
    "/etc",
    "/proc",
    "/sys",
    "/dev",
    "/boot",
    "/home",
    "/root",
    "/usr",
    "/var/log",
    "/var/lib/kubelet",
    "/var/lib/etcd",
    "/var/lib/containerd",
    "/var/lib/containers",
    "/var/lib/docker",
    "/run/containerd",
    "/var/run/containerd",
    "/run/crio",
    "/var/run/crio",
    "/run/docker.sock",
    "/var/run/docker.sock",
    "/run/cri-dockerd.sock",
    "/var/run/cri-dockerd.sock",
    "/run/dockershim.sock",
];

/// `path` with duplicate and trailing slashes and `.` segments removed (`//var/./run/` is `/var/run`).
fn normalise_dir(path: &str) -> String {
    let segments: Vec<&str> = path
        .split('/')
        .filter(|s| !s.is_empty() && *s != ".")
        .collect();
    format!("/{}", segments.join("/"))
}

/// Whether `dir` is a parent of `other` (both normalised).
fn is_parent(dir: &str, other: &str) -> bool {
    dir != other && (dir == "/" || other.starts_with(&format!("{dir}/")))
}

/// What is wrong with `socket.dir` as a node directory, if anything (it is already absolute and without `..`).
fn socket_dir_problem(dir: &str) -> Option<String> {
    let norm = normalise_dir(dir);
    let shown = if norm == dir {
        String::new()
    } else {
        format!(" (that is {norm})")
    };
    let hint = "in daemonset mode it is a hostPath of every node, mounted into every wired Pod: use a directory \
                of the PDP's own, like /var/run/cerbos";
    let system = || SOCKET_DIR_PARENTS.iter().chain(&SOCKET_DIR_SYSTEM_TREES);
    if let Some(dir) = system().find(|s| norm == **s) {
        return Some(
            format!("{shown} is the node's {dir}; {hint}")
                .trim_start()
                .to_string(),
        );
    }
    if let Some(dir) = system().find(|s| is_parent(&norm, s)) {
        return Some(
            format!("{shown} contains the node's {dir}; {hint}")
                .trim_start()
                .to_string(),
        );
    }
    if let Some(tree) = SOCKET_DIR_SYSTEM_TREES.iter().find(|t| is_parent(t, &norm)) {
        return Some(
            format!("{shown} is inside the node's {tree}; {hint}")
                .trim_start()
                .to_string(),
        );
    }
    if norm.matches('/').count() < 2 {
        return Some(
            format!("{shown} must be at least two levels deep; {hint}")
                .trim_start()
                .to_string(),
        );
    }
    None
}

fn quantity(s: &str) -> Quantity {
    Quantity(s.to_string())
}

fn default_resources() -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_string(), quantity("50m")),
            ("memory".to_string(), quantity("64Mi")),
        ])),
        limits: Some(BTreeMap::from([("memory".to_string(), quantity("256Mi"))])),
        ..Default::default()
    }
}

fn config_map_volume(volume: &str, config_map: &str) -> Volume {
    Volume {
        name: volume.into(),
        config_map: Some(k8s_openapi::api::core::v1::ConfigMapVolumeSource {
            name: config_map.into(),
            optional: Some(true),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The two profiles that work with no config file.
pub fn builtin_profiles() -> BTreeMap<String, Profile> {
    let cerbos = Profile {
        image: "ghcr.io/cerbos/cerbos:0.42.0".into(),
        image_pull_policy: "IfNotPresent".into(),
        container_name: "cerbos-pdp".into(),
        args: vec![
            "server".into(),
            "--set=server.httpListenAddr=:3592".into(),
            "--set=server.grpcListenAddr=:3593".into(),
            "--set=storage.driver=disk".into(),
            "--set=storage.disk.directory=/policies".into(),
            "--set=storage.disk.watchForChanges=true".into(),
        ],
        // Cerbos sends usage telemetry to its vendor unless told not to: off in everything we ship
        // (docs/operations.md says how to turn it on).
        env: vec![EnvVar {
            name: "CERBOS_NO_TELEMETRY".into(),
            value: Some("1".into()),
            value_from: None,
        }],
        ports: vec![
            NamedPort {
                name: "http".into(),
                port: 3592,
            },
            NamedPort {
                name: "grpc".into(),
                port: 3593,
            },
        ],
        address_port: 3593,
        health: HealthCheck {
            path: "/_cerbos/health".into(),
            port: 3592,
        },
        resources: default_resources(),
        security_context: restricted_security_context(Some(10001)),
        env_names: EnvNames {
            host: "CERBOS_PDP_HOST".into(),
            address: "CERBOS_PDP_ADDR".into(),
            socket: "CERBOS_PDP_SOCKET".into(),
            port: None,
        },
        host_field: HostField::HostIp,
        socket: SocketSpec {
            dir: "/var/run/cerbos".into(),
            file: "cerbos.sock".into(),
        },
        sidecar: SidecarSpec {
            placement: Placement::AfterInit,
            native: true,
            unix_socket: false,
        },
        volumes: vec![ProfileVolume {
            volume: config_map_volume("cerbos-policies", "cerbos-policies"),
            mount_path: "/policies".into(),
        }],
        mtls: None,
    };
    let flagd = Profile {
        image: "ghcr.io/open-feature/flagd:v0.12.9".into(),
        image_pull_policy: "IfNotPresent".into(),
        container_name: "flagd".into(),
        args: vec![
            "start".into(),
            "--port=8013".into(),
            "--management-port=8014".into(),
            "--uri=file:/etc/flagd/flags.flagd.json".into(),
        ],
        env: vec![],
        ports: vec![
            NamedPort {
                name: "flagd".into(),
                port: 8013,
            },
            NamedPort {
                name: "flagd-mgmt".into(),
                port: 8014,
            },
        ],
        address_port: 8013,
        health: HealthCheck {
            path: "/healthz".into(),
            port: 8014,
        },
        resources: default_resources(),
        security_context: restricted_security_context(Some(65532)),
        env_names: EnvNames {
            host: "FLAGD_HOST".into(),
            address: "FLAGD_ADDR".into(),
            socket: "FLAGD_SOCKET_PATH".into(),
            port: Some("FLAGD_PORT".into()),
        },
        host_field: HostField::HostIp,
        socket: SocketSpec {
            dir: "/var/run/flagd".into(),
            file: "flagd.sock".into(),
        },
        sidecar: SidecarSpec {
            placement: Placement::AfterInit,
            native: true,
            unix_socket: false,
        },
        volumes: vec![ProfileVolume {
            volume: config_map_volume("flagd-flags", "flagd-flags"),
            mount_path: "/etc/flagd".into(),
        }],
        mtls: None,
    };
    BTreeMap::from([("cerbos".into(), cerbos), ("flagd".into(), flagd)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_config_has_both_profiles_and_safe_defaults() {
        let c = Config::builtin();
        assert_eq!(c.default_mode, Mode::Daemonset);
        assert_eq!(c.default_profile, "cerbos");
        assert!(!c.inject_by_default);
        assert_eq!(c.profile_names(), "cerbos, flagd");
        for ns in [
            "kube-system",
            "kube-public",
            "kube-node-lease",
            "pdp-system",
        ] {
            assert!(c.excluded_namespaces.contains(ns), "{ns}");
        }
        assert_eq!(c.hash.len(), 12);
    }

    #[test]
    fn empty_file_equals_builtin() {
        assert_eq!(Config::from_yaml("").unwrap(), Config::builtin());
        assert_eq!(Config::from_yaml("# nothing\n").unwrap(), Config::builtin());
    }

    #[test]
    fn unknown_key_names_its_path() {
        let err = Config::from_yaml("profiles:\n  cerbos:\n    imagee: x\n").unwrap_err();
        let text = err.to_string();
        assert!(text.contains("profiles.cerbos"), "{text}");
        assert!(text.contains("imagee"), "{text}");
        let err = Config::from_yaml("defaultMod: sidecar\n").unwrap_err();
        assert!(err.to_string().contains("defaultMod"), "{err}");
    }

    #[test]
    fn wrong_type_names_its_path() {
        let err = Config::from_yaml("defaultMode: sidecars\n").unwrap_err();
        assert!(
            err.to_string().starts_with("config key defaultMode:"),
            "{err}"
        );
    }

    #[test]
    fn overlay_keeps_builtin_fields_and_changes_the_hash() {
        let c = Config::from_yaml(
            "defaultMode: sidecar\nprofiles:\n  cerbos:\n    image: registry.local/cerbos:1\n",
        )
        .unwrap();
        assert_eq!(c.default_mode, Mode::Sidecar);
        let p = &c.profiles["cerbos"];
        assert_eq!(p.image, "registry.local/cerbos:1");
        assert_eq!(p.address_port, 3593);
        assert_ne!(c.hash, Config::builtin().hash);
    }

    #[test]
    fn new_profile_extends_and_requires_fields() {
        let c = Config::from_yaml(
            "profiles:\n  cerbos-tenant:\n    extends: cerbos\n    containerName: tenant-pdp\n",
        )
        .unwrap();
        assert_eq!(c.profiles["cerbos-tenant"].container_name, "tenant-pdp");
        let err =
            Config::from_yaml("profiles:\n  opa:\n    image: openpolicyagent/opa\n").unwrap_err();
        assert!(
            err.to_string().contains("profile \"opa\" has no ports"),
            "{err}"
        );
        let err = Config::from_yaml("profiles:\n  x:\n    extends: nope\n").unwrap_err();
        assert!(
            err.to_string().contains("unknown profile \"nope\""),
            "{err}"
        );
    }

    #[test]
    fn unsafe_profiles_are_refused() {
        let err = Config::from_yaml(
            "profiles:\n  cerbos:\n    securityContext:\n      allowPrivilegeEscalation: true\n",
        )
        .unwrap_err();
        assert!(err.to_string().contains("restricted"), "{err}");
        let err = Config::from_yaml(
            "profiles:\n  cerbos:\n    volumes:\n    - mountPath: /x\n      volume:\n        name: host\n        hostPath:\n          path: /\n",
        )
        .unwrap_err();
        assert!(err.to_string().contains("hostPath"), "{err}");
        let err = Config::from_yaml("defaultProfile: opa\n").unwrap_err();
        assert!(err.to_string().contains("cerbos, flagd"), "{err}");
        let err = Config::from_yaml("profiles:\n  cerbos:\n    addressPort: 1\n").unwrap_err();
        assert!(err.to_string().contains("addressPort 1"), "{err}");
    }

    #[test]
    fn admin_security_context_keeps_the_hardening_it_does_not_mention() {
        let c = Config::from_yaml(
            "profiles:\n  cerbos:\n    securityContext:\n      runAsUser: 4242\n",
        )
        .unwrap();
        let sc = &c.profiles["cerbos"].security_context;
        assert_eq!(sc.run_as_user, Some(4242));
        assert!(restricted_violations(sc).is_empty());
    }

    #[test]
    fn builtin_contexts_meet_restricted() {
        for p in builtin_profiles().values() {
            assert!(restricted_violations(&p.security_context).is_empty());
        }
        let open = SecurityContext::default();
        assert_eq!(restricted_violations(&open).len(), 4);
    }

    /// A profile `cerbos` whose securityContext is `sc` (YAML flow mapping), laid over the restricted baseline.
    fn with_security_context(sc: &str) -> Result<Config, ConfigError> {
        Config::from_yaml(&format!(
            "profiles:\n  cerbos:\n    securityContext: {sc}\n"
        ))
    }

    #[test]
    fn restricted_checker_refuses_every_container_level_escape() {
        // Each line: a securityContext that Pod Security admission refuses at `restricted`, and the words the
        // refusal must contain (the field and its value).
        let refused = [
            ("{procMount: Unmasked}", "procMount is \"Unmasked\""),
            (
                "{seLinuxOptions: {type: spc_t}}",
                "seLinuxOptions.type is \"spc_t\"",
            ),
            (
                "{seLinuxOptions: {type: container_engine_t}}",
                "seLinuxOptions.type is \"container_engine_t\"",
            ),
            (
                "{seLinuxOptions: {type: unconfined_t}}",
                "seLinuxOptions.type is \"unconfined_t\"",
            ),
            (
                "{seLinuxOptions: {user: system_u}}",
                "seLinuxOptions.user is \"system_u\"",
            ),
            (
                "{seLinuxOptions: {role: system_r}}",
                "seLinuxOptions.role is \"system_r\"",
            ),
            (
                "{appArmorProfile: {type: Unconfined}}",
                "appArmorProfile.type is \"Unconfined\"",
            ),
            (
                "{appArmorProfile: {type: unconfined}}",
                "appArmorProfile.type is \"unconfined\"",
            ),
            (
                "{windowsOptions: {hostProcess: true}}",
                "windowsOptions.hostProcess is true",
            ),
            (
                "{capabilities: {drop: [ALL], add: [SYS_ADMIN]}}",
                "capabilities.add holds SYS_ADMIN",
            ),
            (
                "{capabilities: {drop: [ALL], add: [NET_BIND_SERVICE, NET_RAW]}}",
                "capabilities.add holds NET_RAW",
            ),
            (
                "{capabilities: {add: [NET_BIND_SERVICE]}}",
                "capabilities.drop does not contain ALL",
            ),
            (
                "{seccompProfile: {type: Unconfined}}",
                "seccompProfile.type is \"Unconfined\"",
            ),
            ("{privileged: true}", "privileged is true"),
            ("{runAsUser: 0}", "runAsUser is 0"),
            ("{runAsNonRoot: false}", "runAsNonRoot is not true"),
            (
                "{allowPrivilegeEscalation: true}",
                "allowPrivilegeEscalation is not false",
            ),
        ];
        for (sc, words) in refused {
            let err = with_security_context(sc).unwrap_err().to_string();
            assert!(
                err.contains(
                    "profile \"cerbos\": securityContext does not meet Pod Security restricted"
                ) && err.contains(words),
                "{sc}: {err}"
            );
        }
        // What restricted allows for the same fields.
        let allowed = [
            "{procMount: Default}",
            "{seLinuxOptions: {type: container_t, level: \"s0:c123,c456\"}}",
            "{seLinuxOptions: {type: container_init_t}}",
            "{seLinuxOptions: {type: container_kvm_t, user: \"\", role: \"\"}}",
            "{seLinuxOptions: {type: \"\"}}",
            "{seLinuxOptions: {level: s0}}",
            "{appArmorProfile: {type: RuntimeDefault}}",
            "{appArmorProfile: {type: Localhost, localhostProfile: k8s-pdp}}",
            "{windowsOptions: {hostProcess: false, runAsUserName: pdp}}",
            "{capabilities: {drop: [ALL], add: [NET_BIND_SERVICE]}}",
            "{seccompProfile: {type: Localhost, localhostProfile: pdp.json}}",
        ];
        for sc in allowed {
            let c = with_security_context(sc).unwrap_or_else(|e| panic!("{sc}: {e}"));
            assert!(restricted_violations(&c.profiles["cerbos"].security_context).is_empty());
        }
        // The checker on its own: every violation is reported, not only the first.
        let sc: SecurityContext = serde_json::from_value(serde_json::json!({
            "allowPrivilegeEscalation": false, "runAsNonRoot": true, "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"}, "procMount": "Unmasked",
            "seLinuxOptions": {"type": "spc_t", "user": "u", "role": "r"},
            "appArmorProfile": {"type": "Unconfined"}, "windowsOptions": {"hostProcess": true}
        }))
        .unwrap();
        assert_eq!(
            restricted_violations(&sc).len(),
            6,
            "{:?}",
            restricted_violations(&sc)
        );
    }

    /// A profile `cerbos` with one sidecar volume `v` of the given source (YAML flow mapping entries).
    fn with_volume(source: &str) -> Result<Config, ConfigError> {
        Config::from_yaml(&format!(
            "profiles:\n  cerbos:\n    volumes:\n    - mountPath: /data\n      volume: {{name: v, {source}}}\n"
        ))
    }

    #[test]
    fn profile_volumes_are_an_allow_list() {
        for source in [
            "configMap: {name: policies}",
            "secret: {secretName: pdp-tls}",
            "emptyDir: {medium: Memory}",
            "projected: {sources: [{configMap: {name: a}}, {downwardAPI: {items: [{path: ns, fieldRef: {fieldPath: metadata.namespace}}]}}]}",
            "downwardAPI: {items: [{path: labels, fieldRef: {fieldPath: metadata.labels}}]}",
        ] {
            with_volume(source).unwrap_or_else(|e| panic!("{source}: {e}"));
        }
        // Everything that reaches the node, its network or cluster storage is refused, naming the volume, its
        // kind and the allowed kinds.
        for (source, kind) in [
            ("hostPath: {path: /}", "hostPath"),
            (
                "persistentVolumeClaim: {claimName: data}",
                "persistentVolumeClaim",
            ),
            ("csi: {driver: secrets-store.csi.k8s.io}", "csi"),
            (
                "ephemeral: {volumeClaimTemplate: {spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}}}",
                "ephemeral",
            ),
            ("nfs: {server: nfs.local, path: /exports}", "nfs"),
            (
                "iscsi: {targetPortal: 10.0.0.1, iqn: iqn.2001-04.com.example:storage, lun: 0}",
                "iscsi",
            ),
            ("image: {reference: registry.local/policies:1}", "image"),
            (
                "gitRepo: {repository: https://example.invalid/p.git}",
                "gitRepo",
            ),
            ("rbd: {monitors: [10.0.0.1], image: pdp}", "rbd"),
            ("flexVolume: {driver: example/driver}", "flexVolume"),
        ] {
            let err = with_volume(source).unwrap_err().to_string();
            assert!(
                err.contains(&format!(
                    "profile \"cerbos\": volume \"v\" is a {kind} volume"
                )) && err.contains("configMap, secret, emptyDir, projected, downwardAPI"),
                "{source}: {err}"
            );
        }
        // A source the Volume type does not know (misspelt or newer) is not dropped silently.
        let err = with_volume("configMap: {name: p}, hostPathh: {path: /}")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("profiles.cerbos.volumes[0].volume.hostPathh")
                && err.contains("configMap, secret, emptyDir, projected, downwardAPI"),
            "{err}"
        );
        // No source at all, or two.
        let err = Config::from_yaml(
            "profiles:\n  cerbos:\n    volumes:\n    - mountPath: /data\n      volume: {name: v}\n",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("volume \"v\" has no volume source"), "{err}");
        let err = with_volume("configMap: {name: p}, emptyDir: {}")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("volume \"v\" has several volume sources"),
            "{err}"
        );
    }

    fn with_socket_dir(dir: &str) -> Result<Config, ConfigError> {
        Config::from_yaml(&format!(
            "profiles:\n  cerbos:\n    socket: {{dir: \"{dir}\", file: cerbos.sock}}\n"
        ))
    }

    #[test]
    fn socket_dir_is_a_directory_of_its_own() {
        // Refused, with the words the message must contain.
        let refused = [
            ("/", "is the node's /"),
            ("//", "(that is /) is the node's /"),
            ("/run", "is the node's /run"),
            ("/var/run", "is the node's /var/run"),
            ("/var/run/", "(that is /var/run) is the node's /var/run"),
            ("//var//run//", "(that is /var/run) is the node's /var/run"),
            ("/var/./run", "(that is /var/run) is the node's /var/run"),
            ("/var", "is the node's /var"),
            ("/etc", "is the node's /etc"),
            ("/proc", "is the node's /proc"),
            ("/sys", "is the node's /sys"),
            ("/dev", "is the node's /dev"),
            ("/home", "is the node's /home"),
            ("/root", "is the node's /root"),
            ("/usr", "is the node's /usr"),
            ("/var/lib", "is the node's /var/lib"),
            ("/var/lib/kubelet", "is the node's /var/lib/kubelet"),
            (
                "/var/lib/kubelet/",
                "(that is /var/lib/kubelet) is the node's /var/lib/kubelet",
            ),
            ("/var/log", "is the node's /var/log"),
            ("/var/run/docker.sock", "is the node's /var/run/docker.sock"),
            ("/run/docker.sock", "is the node's /run/docker.sock"),
            (
                "/var/run/cri-dockerd.sock",
                "is the node's /var/run/cri-dockerd.sock",
            ),
            ("/run/containerd", "is the node's /run/containerd"),
            ("/var/run/containerd", "is the node's /var/run/containerd"),
            ("/run/crio", "is the node's /run/crio"),
            (
                "/var/run/crio/",
                "(that is /var/run/crio) is the node's /var/run/crio",
            ),
            // Inside the kubelet's, the runtime's or the kernel's trees.
            (
                "/var/lib/kubelet/pods",
                "is inside the node's /var/lib/kubelet",
            ),
            (
                "/run/containerd/pdp",
                "is inside the node's /run/containerd",
            ),
            ("/var/log/pods", "is inside the node's /var/log"),
            ("/proc/self", "is inside the node's /proc"),
            ("/etc/cerbos", "is inside the node's /etc"),
            // One level only.
            ("/cerbos", "must be at least two levels deep"),
            (
                "/cerbos/",
                "(that is /cerbos) must be at least two levels deep",
            ),
            ("/tmp", "must be at least two levels deep"),
        ];
        for (dir, words) in refused {
            let err = with_socket_dir(dir).unwrap_err().to_string();
            assert!(
                err.contains(&format!("profile \"cerbos\": socket.dir {dir:?} {words}"))
                    && err.contains("like /var/run/cerbos"),
                "{dir}: {err}"
            );
        }
        for dir in [
            "/var/run/cerbos",
            "/var/run/cerbos/",
            "/run/flagd",
            "/run/pdp/cerbos",
            "/var/lib/cerbos",
            "/opt/pdp",
            "/var/run/containerd-pdp",
        ] {
            with_socket_dir(dir).unwrap_or_else(|e| panic!("{dir}: {e}"));
        }
    }

    #[test]
    fn builtin_and_shipped_configs_pass_every_check() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut configs = vec![("built-in".to_string(), Config::builtin())];
        for file in [
            "manifests/base/config.yaml",
            "manifests/overlays/sidecar-only/config.yaml",
            "tests/golden/custom/config.yaml",
            "fuzz/seeds/config/every-key.yaml",
        ] {
            let config = Config::load(&root.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
            configs.push((file.to_string(), config));
        }
        for (source, config) in &configs {
            for (name, p) in &config.profiles {
                assert!(
                    restricted_violations(&p.security_context).is_empty(),
                    "{source}: {name}"
                );
                assert_eq!(socket_dir_problem(&p.socket.dir), None, "{source}: {name}");
                for v in &p.volumes {
                    assert_eq!(volume_source_problem(&v.volume), None, "{source}: {name}");
                }
            }
        }
    }

    #[test]
    fn pss_levels_parse_strictly() {
        assert_eq!(PssLevel::from_label("privileged"), PssLevel::Privileged);
        assert_eq!(PssLevel::from_label("baseline"), PssLevel::Baseline);
        assert_eq!(PssLevel::from_label("restricted"), PssLevel::Restricted);
        assert_eq!(PssLevel::from_label("Privileged"), PssLevel::Restricted);
    }
}
