//! A profile: everything pdp-injector needs to wire a Pod to one kind of PDP, and how the file lays one over the
//! profile it extends. Each field is written once, in the `profile_and_overlay!` call below: the macro makes
//! [`Profile`], the file's form (every field optional) and the overlay, so a new field cannot be left out of one.

use k8s_openapi::api::core::v1::{EnvVar, ResourceRequirements, SecurityContext};
use serde::{Deserialize, Serialize};

use super::builtins::default_resources;
use super::security::overlay_security_context;
use super::{
    CentralSpec, ConfigError, EnvNames, HealthCheck, HostField, MtlsSpec, NamedPort, Placement,
    ProfileVolume, SidecarSpec, SocketSpec, TlsEnvNames, TlsSpec,
};

/// Defines [`Profile`] from its fields, and `ProfileFile`: the same fields, each optional (a field of type
/// `Option<T>` becomes `Option<Option<T>>`, where `null` and absence both keep the base's value), with its
/// `overlay`, which takes a field from the file where it is set (through the field's `=> function`, if any) and
/// from the base elsewhere. `extra` fields are code, not configuration: always the base's.
macro_rules! profile_and_overlay {
    (
        $(#[$meta:meta])*
        pub struct Profile {
            $( $(#[$fmeta:meta])* pub $field:ident : $ty:ty $(=> $map:path)? , )*
        }
        extra {
            $( $(#[$xmeta:meta])* pub $xfield:ident : $xty:ty , )*
        }
    ) => {
        $(#[$meta])*
        pub struct Profile {
            $( $(#[$fmeta])* pub $field: $ty, )*
            $( $(#[$xmeta])* pub $xfield: $xty, )*
        }

        /// A profile as written in the file: every field optional, laid over the profile it `extends` (by
        /// default the built-in of the same name, if there is one).
        #[derive(Debug, Default, Deserialize)]
        #[serde(rename_all = "camelCase", deny_unknown_fields)]
        pub(super) struct ProfileFile {
            pub(super) extends: Option<String>,
            $( $field: Option<$ty>, )*
        }

        impl ProfileFile {
            /// The base with this file's fields laid over it.
            fn overlay(self, base: Profile) -> Profile {
                Profile {
                    $( $field: match self.$field {
                        Some(v) => profile_and_overlay!(@map v $(, $map)?),
                        None => base.$field,
                    }, )*
                    $( $xfield: base.$xfield, )*
                }
            }
        }
    };
    (@map $v:ident) => { $v };
    (@map $v:ident, $map:path) => { $map($v) };
}

profile_and_overlay! {
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
        /// The port of the PDP's HTTP API, which `envNames.httpAddress` points at (Cerbos 3592; the node's front
        /// serves it too). Unset: no HTTP address variable. Serialized only when set, so hashes stay put.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub http_port: Option<u16>,
        /// Health endpoint for the sidecar's probes.
        pub health: HealthCheck,
        /// Resources of the sidecar.
        pub resources: ResourceRequirements,
        /// Security context of the sidecar; must meet Pod Security `restricted`.
        pub security_context: SecurityContext => overlay_security_context,
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
        /// The Service of central mode; without it, central mode is refused for this profile. Left out of the
        /// serialized config when unset, so configs without it keep their hash.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub central: Option<CentralSpec>,
        /// Fixed variables app containers get besides the address (flagd's `FLAGD_RESOLVER=in-process`, for a
        /// provider that must sync instead of calling per evaluation). Plain values only: nothing from the Pod.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pub app_env: Vec<EnvVar>,
        /// `false`: daemonset mode gives the TCP address only, never the node's socket, for a node-local PDP that
        /// serves no socket (the shipped node-local flagd). Serialized only when `false`, so hashes stay put.
        #[serde(skip_serializing_if = "is_true")]
        pub host_socket: bool,
        /// TLS on the TCP path (daemonset and central modes). Serialized only when set, so hashes stay put.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub tls: Option<TlsSpec>,
        /// The node plugin's profile (its `--profile name=...`) that serves this profile's socket directory,
        /// written into the CSI volume's `profile` attribute. Unset: the plugin's default profile, which serves
        /// `/var/run/cerbos`; a profile with another socket directory and no `csiProfile` is not served by CSI
        /// (hostPath in privileged namespaces, TCP elsewhere). Serialized only when set, so hashes stay put.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub csi_profile: Option<String>,
        /// Daemonset mode, Pods whose socket does not come by CSI (TCP only, or a hostPath): an init container
        /// first in the Pod holds the app until its node's PDP answers `health` on the node (which needs
        /// `health.port` to be `httpPort`, the port the node's front serves). On in the built-in `cerbos`.
        #[serde(default, skip_serializing_if = "is_false")]
        pub await_node: bool,
        /// Daemonset mode: app containers also get the central Service's address (`central.address`) in
        /// `envNames.fallbackAddress`, for a client to dial when its node's front refuses. Serialized when set.
        #[serde(default, skip_serializing_if = "is_false")]
        pub fallback: bool,
    }
    extra {
        /// The TLS variable names of the built-in profile this one descends from, used where `envNames` sets
        /// none. Code, not configuration: left out of the hash like the rest of the built-ins' defaults that no
        /// Pod sees until `tls` is set (and then the resolved names are in `envNames`' place in every Pod).
        #[serde(skip)]
        pub tls_env_defaults: Option<TlsEnvNames>,
    }
}

impl Profile {
    /// Whether the node plugin serves this profile's socket directory (see `csi_profile`).
    pub fn csi_serves(&self) -> bool {
        self.csi_profile.is_some() || self.socket.dir == crate::names::CSI_DEFAULT_SOCKET_DIR
    }

    /// The TLS variable names: `envNames` where it sets them, the built-in defaults elsewhere; `None` when a
    /// name has neither (a profile that extends no built-in and names no TLS variables).
    pub fn tls_env_names(&self) -> Option<TlsEnvNames> {
        let n = &self.env_names;
        let d = self.tls_env_defaults.as_ref();
        let pick =
            |own: &Option<String>, default: Option<&String>| own.clone().or(default.cloned());
        Some(TlsEnvNames {
            flag: pick(&n.tls, d.map(|d| &d.flag))?,
            ca: pick(&n.tls_ca, d.map(|d| &d.ca))?,
            server_name: pick(&n.tls_server_name, d.map(|d| &d.server_name))?,
            cert: pick(&n.tls_cert, d.map(|d| &d.cert))?,
            key: pick(&n.tls_key, d.map(|d| &d.key))?,
        })
    }
}

fn is_true(b: &bool) -> bool {
    *b
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// The profile named `name` from the file's `o`, laid over `base` (the profile it extends), or over the
/// defaults of a new profile when it extends none.
pub(super) fn merge_profile(
    name: &str,
    base: Option<Profile>,
    o: ProfileFile,
) -> Result<Profile, ConfigError> {
    let base = match base {
        Some(base) => base,
        None => new_profile(name, &o)?,
    };
    Ok(o.overlay(base))
}

/// The base of a profile that extends nothing: the defaults, and what has none taken from the file (an error
/// when the file does not set it).
fn new_profile(name: &str, o: &ProfileFile) -> Result<Profile, ConfigError> {
    fn required<T: Clone>(name: &str, value: &Option<T>, field: &str) -> Result<T, ConfigError> {
        value.clone().ok_or_else(|| {
            ConfigError::Invalid(format!(
                "profile {name:?} has no {field} (a new profile must set it or `extends` a profile that does)"
            ))
        })
    }
    let ports = required(name, &o.ports, "ports")?;
    let address_port = required(
        name,
        &o.address_port.or(ports.first().map(|p| p.port)),
        "addressPort",
    )?;
    Ok(Profile {
        image: required(name, &o.image, "image")?,
        image_pull_policy: "IfNotPresent".into(),
        container_name: format!("{name}-pdp"),
        args: Vec::new(),
        env: Vec::new(),
        ports,
        address_port,
        http_port: None,
        health: required(name, &o.health, "health")?,
        resources: default_resources(),
        security_context: overlay_security_context(SecurityContext::default()),
        env_names: required(name, &o.env_names, "envNames")?,
        host_field: HostField::HostIp,
        socket: required(name, &o.socket, "socket")?,
        sidecar: SidecarSpec {
            placement: Placement::AfterInit,
            native: true,
            unix_socket: false,
        },
        volumes: Vec::new(),
        mtls: None,
        central: None,
        app_env: Vec::new(),
        host_socket: true,
        tls: None,
        csi_profile: None,
        await_node: false,
        fallback: false,
        tls_env_defaults: None,
    })
}
