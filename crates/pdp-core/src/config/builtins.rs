//! The built-in profiles (`cerbos`, `flagd`): what works with no config file.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ResourceRequirements, Volume};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::{
    EnvNames, EnvVar, HealthCheck, HostField, NamedPort, Placement, Profile, ProfileVolume,
    SidecarSpec, SocketSpec, TlsEnvNames, restricted_security_context,
};

fn quantity(s: &str) -> Quantity {
    Quantity(s.to_string())
}

pub(super) fn default_resources() -> ResourceRequirements {
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
        http_port: Some(3592),
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
            http_address: Some("CERBOS_PDP_HTTP_ADDR".into()),
            tls: None,
            tls_ca: None,
            tls_server_name: None,
            tls_cert: None,
            tls_key: None,
            fallback_address: Some("CERBOS_PDP_FALLBACK_ADDR".into()),
            fallback_http_address: Some("CERBOS_PDP_FALLBACK_HTTP_ADDR".into()),
            selector: None,
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
        central: None,
        app_env: vec![],
        host_socket: true,
        tls: None,
        csi_profile: None,
        await_node: true,
        fallback: false,
        tls_env_defaults: Some(TlsEnvNames {
            flag: "CERBOS_PDP_TLS".into(),
            ca: "CERBOS_PDP_TLS_CA".into(),
            server_name: "CERBOS_PDP_TLS_SERVER_NAME".into(),
            cert: "CERBOS_PDP_TLS_CERT".into(),
            key: "CERBOS_PDP_TLS_KEY".into(),
        }),
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
        // flagd's evaluation port speaks gRPC and HTTP (Connect) alike: no separate HTTP address.
        http_port: None,
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
            http_address: None,
            tls: None,
            tls_ca: None,
            tls_server_name: None,
            tls_cert: None,
            tls_key: None,
            fallback_address: None,
            fallback_http_address: None,
            selector: Some("FLAGD_SOURCE_SELECTOR".into()),
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
        central: None,
        app_env: vec![],
        host_socket: true,
        tls: None,
        csi_profile: None,
        await_node: false,
        fallback: false,
        // The names flagd's OpenFeature providers read (FLAGD_TLS, FLAGD_SERVER_CERT_PATH), and the same
        // prefix for the rest.
        tls_env_defaults: Some(TlsEnvNames {
            flag: "FLAGD_TLS".into(),
            ca: "FLAGD_SERVER_CERT_PATH".into(),
            server_name: "FLAGD_TLS_SERVER_NAME".into(),
            cert: "FLAGD_TLS_CERT_PATH".into(),
            key: "FLAGD_TLS_KEY_PATH".into(),
        }),
    };
    BTreeMap::from([("cerbos".into(), cerbos), ("flagd".into(), flagd)])
}
