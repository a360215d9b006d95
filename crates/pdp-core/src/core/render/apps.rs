//! The volumes a first pass adds to the Pod, and the variables and mounts it lays into the app containers.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{EnvVar, Volume, VolumeMount};

use super::env::{OurNames, ensure_env, relevant_env};
use super::volumes::{ensure_mount, ensure_volume, mtls_volume, tls_volume};
use super::{PdpContainer, PodVolumes, Wiring, collision, invalid};
use crate::config::{Mode, Profile};
use crate::core::patch::{OpValue, PatchBuilder, pointer};
use crate::core::view::{PodView, SpecView};
use crate::core::{Denial, Plan, Warning};
use crate::names::{INIT_TOOLS, VOLUME_MTLS, VOLUME_SOCKET, VOLUME_TLS, VOLUME_TOOLS};

pub(super) fn pod_volumes(
    pod: &PodView<'_>,
    spec: &SpecView<'_>,
    plan: &Plan,
    profile: &Profile,
    wiring: Wiring,
    socket: Option<Volume>,
    pdp: Option<&mut PdpContainer>,
) -> Result<PodVolumes, Denial> {
    let classic = pdp.and_then(|p| p.classic.as_ref());
    let mut out = PodVolumes {
        new: Vec::new(),
        added: Vec::new(),
        count: None,
        add_tools_init: classic.is_some(),
    };
    if plan.previous.is_some() {
        return Ok(out);
    }
    let entries = spec.volume_entries().map_err(invalid)?;
    out.count = entries.as_ref().map(Vec::len);
    let existing = entries.unwrap_or_default();
    let v = &mut out.new;
    if let Some(s) = socket {
        ensure_volume(&existing, v, s, "the PDP socket")?;
    }
    if plan.mode == Mode::Sidecar {
        for pv in &profile.volumes {
            ensure_volume(&existing, v, pv.volume.clone(), "the PDP's own files")?;
        }
    }
    if let Some(c) = classic {
        let had_tools = existing.iter().any(|e| e.name.as_str() == VOLUME_TOOLS);
        for volume in &c.volumes {
            ensure_volume(&existing, v, volume.clone(), "the classic sidecar's helper")?;
        }
        let named = pod
            .init_containers()
            .iter()
            .chain(pod.containers())
            .any(|x| x.name.as_str() == INIT_TOOLS);
        if named && !had_tools {
            return Err(collision(format!(
                "the Pod already has a container named {INIT_TOOLS:?}, which pdp-injector adds for its \
                 classic sidecar: rename the Pod's container"
            )));
        }
        out.add_tools_init = !named;
    }
    if let Some(m) = mtls_volume(profile) {
        ensure_volume(&existing, v, m, "the mTLS client certificate")?;
    }
    if let Some(t) = tls_volume(profile).filter(|_| wiring.tls) {
        ensure_volume(&existing, v, t, "the PDP's TLS certificates")?;
    }
    out.added = out.new.iter().map(|v| v.name.clone()).collect();
    Ok(out)
}

/// Lays the variables and mounts into each app container the plan names and a re-wiring has not wired yet;
/// returns their names.
pub(super) fn wire_app_containers(
    pod: &PodView<'_>,
    plan: &Plan,
    profile: &Profile,
    wiring: Wiring,
    ours: &[EnvVar],
    ops: &mut PatchBuilder,
    warnings: &mut Vec<Warning>,
) -> Result<Vec<String>, Denial> {
    let names = &profile.env_names;
    let depends = [Some(names.address.as_str()), names.http_address.as_deref()];
    let dependent = (plan.mode == Mode::Daemonset).then_some((&depends[..], names.host.as_str()));
    let our_names = OurNames::new(ours.iter().map(|e| e.name.as_str()).collect());
    let mut wired = Vec::new();
    let mut values: Vec<Option<OpValue>> = vec![None; ours.len()];
    // Sets, so that the loop stays linear in the Pod's containers.
    let wanted: BTreeSet<&str> = plan.containers.iter().map(String::as_str).collect();
    let done: BTreeSet<&str> = plan
        .previous
        .as_ref()
        .map(|s| s.containers.iter().map(String::as_str).collect())
        .unwrap_or_default();
    for (i, container) in pod.containers().iter().enumerate() {
        let name = container.name.as_str();
        if !wanted.contains(name) || done.contains(name) {
            continue;
        }
        let index = i.to_string();
        let env = relevant_env(container, &our_names, || {
            format!("spec.containers[{i}].env")
        })
        .map_err(invalid)?;
        let env_path = pointer(["spec", "containers", &index, "env"]);
        let inserts = ensure_env(
            name,
            env.as_deref().unwrap_or_default(),
            ours,
            dependent,
            warnings,
        );
        match env {
            None => {
                let mut list: Vec<&EnvVar> = Vec::new();
                for (at, i) in inserts {
                    list.insert(at, &ours[i]);
                }
                ops.extend(env_path, None, &list);
            }
            Some(_) => {
                for (at, i) in inserts {
                    // Each of ours is written once for the Pod, then copied into each container's insert.
                    let value = values[i].get_or_insert_with(|| ops.value(&ours[i])).clone();
                    ops.insert_value(&env_path, at, value);
                }
            }
        }

        let mounts = container
            .mount_entries(|| format!("spec.containers[{i}].volumeMounts"))
            .map_err(invalid)?;
        let existing = mounts.as_deref().unwrap_or_default();
        let mut added = Vec::new();
        let read_only = |name: &str, mount_path: &str| VolumeMount {
            name: name.into(),
            mount_path: mount_path.into(),
            read_only: Some(true),
            ..Default::default()
        };
        if wiring.socket {
            let mount = read_only(VOLUME_SOCKET, &profile.socket.dir);
            ensure_mount(name, existing, &mut added, mount)?;
        }
        if let Some(m) = &profile.mtls {
            ensure_mount(
                name,
                existing,
                &mut added,
                read_only(VOLUME_MTLS, &m.mount_path),
            )?;
        }
        if let Some(t) = profile.tls.as_ref().filter(|_| wiring.tls) {
            ensure_mount(
                name,
                existing,
                &mut added,
                read_only(VOLUME_TLS, &t.mount_path),
            )?;
        }
        ops.extend(
            pointer(["spec", "containers", &index, "volumeMounts"]),
            mounts.as_ref().map(Vec::len),
            &added,
        );
        wired.push(name.to_string());
    }
    Ok(wired)
}
