//! The Pod's volumes and the app containers' mounts: the PDP's socket, its own files, the client and server
//! certificates; each ensured (left alone when already there, refused when something else has its name).

use k8s_openapi::api::core::v1::{
    CSIVolumeSource, ConfigMapProjection, EmptyDirVolumeSource, HostPathVolumeSource, KeyToPath,
    ProjectedVolumeSource, SecretProjection, SecretVolumeSource, Volume, VolumeMount,
    VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::collision;
use crate::config::{Mode, Profile, SocketBy};
use crate::core::Denial;
use crate::core::view::{MountEntry, VolumeBody, VolumeEntry};
use crate::names::{CSI_DRIVER, CSI_PROFILE_ATTRIBUTE, VOLUME_MTLS, VOLUME_SOCKET, VOLUME_TLS};

/// The socket volume for the mode, or `None` when the mode has no socket (TCP only).
pub(super) fn socket_volume(profile: &Profile, mode: Mode, by: SocketBy) -> Option<Volume> {
    match (mode, by) {
        (Mode::Daemonset, SocketBy::HostPath) => Some(Volume {
            name: VOLUME_SOCKET.into(),
            host_path: Some(HostPathVolumeSource {
                path: profile.socket.dir.clone(),
                type_: Some("Directory".into()),
            }),
            ..Default::default()
        }),
        // The node plugin mounts its profile's directory (never a path from here) read-only; the kubelet
        // starts the app containers only once the plugin published it, after the node's PDP answered.
        (Mode::Daemonset, SocketBy::Csi) => Some(Volume {
            name: VOLUME_SOCKET.into(),
            csi: Some(CSIVolumeSource {
                driver: CSI_DRIVER.into(),
                read_only: Some(true),
                volume_attributes: profile.csi_profile.as_ref().map(|p| {
                    [(CSI_PROFILE_ATTRIBUTE.to_string(), p.clone())]
                        .into_iter()
                        .collect()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        (Mode::Sidecar, _) if profile.sidecar.unix_socket => Some(Volume {
            name: VOLUME_SOCKET.into(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: Some("Memory".into()),
                size_limit: Some(Quantity("1Mi".into())),
            }),
            ..Default::default()
        }),
        _ => None,
    }
}

pub(super) fn mtls_volume(profile: &Profile) -> Option<Volume> {
    profile.mtls.as_ref().map(|m| Volume {
        name: VOLUME_MTLS.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(m.secret_name.clone()),
            default_mode: Some(0o440),
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// The profile's TLS Secret, projected to the keys the app needs: `ca.crt`, and the client certificate and key
/// only when the PDP asks for them, so a key the Secret holds anyway (cert-manager always writes `tls.key`) is
/// not handed to apps that do not use it. With `caConfigMap`, `ca.crt` comes from that ConfigMap instead (the
/// server's CA, apart from the client CA), in one projected volume with the Secret's keys. A missing key,
/// Secret or ConfigMap holds the Pod in ContainerCreating: the app never starts without the TLS it was
/// configured for. Mode 0444: app containers run as users of their own, usually without an fsGroup, and must
/// read the files; the Secret is the app's own material.
pub(super) fn tls_volume(profile: &Profile) -> Option<Volume> {
    let t = profile.tls.as_ref()?;
    let items = |keys: &[&str]| {
        Some(
            keys.iter()
                .map(|k| KeyToPath {
                    key: (*k).into(),
                    path: (*k).into(),
                    mode: None,
                })
                .collect(),
        )
    };
    let Some(map) = &t.ca_config_map else {
        return Some(Volume {
            name: VOLUME_TLS.into(),
            secret: Some(SecretVolumeSource {
                secret_name: t.secret_name.clone(),
                default_mode: Some(0o444),
                items: items(t.keys()),
                optional: None,
            }),
            ..Default::default()
        });
    };
    let mut sources = vec![VolumeProjection {
        config_map: Some(ConfigMapProjection {
            name: map.clone(),
            items: items(&["ca.crt"]),
            optional: None,
        }),
        ..Default::default()
    }];
    if let Some(secret) = t.secret_name.as_ref().filter(|_| t.client_certificate) {
        sources.push(VolumeProjection {
            secret: Some(SecretProjection {
                name: secret.clone(),
                items: items(t.keys()),
                optional: None,
            }),
            ..Default::default()
        });
    }
    Some(Volume {
        name: VOLUME_TLS.into(),
        projected: Some(ProjectedVolumeSource {
            default_mode: Some(0o444),
            sources: Some(sources),
        }),
        ..Default::default()
    })
}

/// Adds `volume` unless an identical one is already there; a different volume of that name is a clash.
pub(super) fn ensure_volume(
    existing: &[VolumeEntry<'_>],
    added: &mut Vec<Volume>,
    volume: Volume,
    purpose: &str,
) -> Result<(), Denial> {
    let clash = || {
        collision(format!(
            "the Pod already has a volume named {:?}, which pdp-injector needs for {purpose}: rename the Pod's volume",
            volume.name
        ))
    };
    if let Some(v) = existing.iter().find(|v| v.name.as_str() == volume.name) {
        // Only a volume of the same name is parsed whole, to compare.
        let same = match v.body {
            VolumeBody::Raw(raw) => {
                serde_json::from_str::<Volume>(raw.get()).is_ok_and(|v| v == volume)
            }
            VolumeBody::Added(v) => *v == volume,
        };
        return if same { Ok(()) } else { Err(clash()) };
    }
    match added.iter().find(|v| v.name == volume.name) {
        None => added.push(volume),
        Some(v) if *v == volume => {}
        Some(_) => return Err(clash()),
    }
    Ok(())
}

/// Appends a mount to an app container unless it is already there; a different mount at the same path is a
/// clash. `added` holds the mounts this rendering appends to the container.
pub(super) fn ensure_mount(
    container: &str,
    existing: &[MountEntry<'_>],
    added: &mut Vec<VolumeMount>,
    mount: VolumeMount,
) -> Result<(), Denial> {
    let all = existing
        .iter()
        .map(|m| (m.name.as_str(), m.mount_path.as_str()))
        .chain(
            added
                .iter()
                .map(|m| (m.name.as_str(), m.mount_path.as_str())),
        );
    let mut same_name = false;
    for (name, path) in all {
        if path == mount.mount_path {
            if name == mount.name {
                return Ok(());
            }
            return Err(collision(format!(
                "container {container:?} already mounts volume {name:?} at {}, where pdp-injector mounts {:?}",
                mount.mount_path, mount.name
            )));
        }
        same_name |= name == mount.name;
    }
    if !same_name {
        added.push(mount);
    }
    Ok(())
}
