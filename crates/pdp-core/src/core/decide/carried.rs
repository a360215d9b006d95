//! Whether a Pod carries the wiring its status annotation claims ("already wired" is believed only then).

use crate::config::{Config, Mode, Profile};
use crate::core::codes::WarningCode;
use crate::core::render::{Wiring, app_env, rendered_mount_path, rendered_volume, same_source};
use crate::core::status::Status;
use crate::core::view::{EnvEntry, MountEntry, NameEntry, PodView, each_entry, first_unnamed};
use crate::names::{VOLUME_MTLS, VOLUME_SOCKET, VOLUME_TLS};

/// What of the wiring `status` claims the Pod does not carry, if anything: "already wired" is believed only when
/// the PDP container, the volumes, and in every wired app container the variables and mounts it names are
/// there, and it names at least what its mode always gives.
pub fn missing_wiring(pod: &PodView<'_>, status: &Status, config: &Config) -> Option<String> {
    let Some(profile) = config.profiles.get(&status.profile) else {
        return Some(format!(
            "profile {:?}, which the config does not have",
            status.profile
        ));
    };
    let named = |n: &str| {
        pod.containers()
            .iter()
            .chain(pod.init_containers())
            .any(|c| c.name.as_str() == n)
    };
    if status.mode == Mode::Sidecar
        && status.sidecar.as_deref() != Some(profile.container_name.as_str())
    {
        return Some(format!(
            "sidecar mode without recording the PDP container {:?}",
            profile.container_name
        ));
    }
    if let Some(sidecar) = status.sidecar.as_deref().filter(|s| !named(s)) {
        return Some(format!("the PDP container {sidecar:?}"));
    }
    if let Some(gate) = status.gate.as_deref().filter(|g| !named(g)) {
        return Some(format!(
            "the init container {gate:?} that waits for the node's PDP"
        ));
    }
    if let Some(what) = volume_not_carried(pod, profile, status) {
        return Some(what);
    }
    let least = app_env(
        profile,
        Wiring {
            mode: status.mode,
            socket: false,
            tls: false,
            // Pods wired before the HTTP address existed are wired all the same.
            http: false,
            family: config.node_address_family,
        },
    );
    if let Some(var) = least.iter().find(|e| !status.env.contains(&e.name)) {
        return Some(format!(
            "{} mode without recording variable {}",
            status.mode, var.name
        ));
    }
    // A re-wiring gives the containers it adds what the recorded variables say the first pass gave, and then
    // records them as wired. A variable of the profile's that it would not give them (TLS's CA without TLS's
    // flag, say) would be claimed of containers without it, and the next pass would not believe the status it
    // wrote. A name the profile never writes is no claim of ours: it is not checked.
    let wiring = Wiring::recorded(profile, status, config.node_address_family);
    let recorded = app_env(profile, wiring);
    let ours = |name: &str| recorded.iter().any(|e| e.name == name);
    // Only a status with names a re-wiring would not write needs the profile's whole list (the status of a Pod
    // this webhook wired has none: it is read on every review of an injected Pod).
    let mut foreign = status.env.iter().filter(|n| !ours(n)).peekable();
    if foreign.peek().is_some() {
        let most = app_env(
            profile,
            Wiring {
                mode: status.mode,
                socket: true,
                tls: true,
                http: true,
                family: config.node_address_family,
            },
        );
        if let Some(var) = foreign.find(|n| most.iter().any(|e| e.name == **n)) {
            return Some(format!(
                "variable {var}, which a re-wiring from it would not write,"
            ));
        }
    }
    let claimed: Vec<&str> = status
        .env
        .iter()
        .map(String::as_str)
        .filter(|n| ours(n))
        .collect();
    let mounted: Vec<&str> = status
        .volumes
        .iter()
        .map(String::as_str)
        .filter(|v| [VOLUME_SOCKET, VOLUME_MTLS, VOLUME_TLS].contains(v))
        .collect();
    // The same for the mounts a re-wiring gives the containers it adds.
    let given = |v: &str| match v {
        VOLUME_SOCKET => wiring.socket,
        VOLUME_TLS => wiring.tls,
        _ => profile.mtls.is_some(),
    };
    if let Some(v) = mounted.iter().find(|v| !given(v)) {
        return Some(format!(
            "the mounts of volume {v:?}, which a re-wiring from it would not give,"
        ));
    }
    // Each container once: the status is the Pod author's, and may name one container many times.
    let kept = status.warnings.contains(&WarningCode::EnvKept);
    let mut seen = std::collections::BTreeSet::new();
    for name in status.containers.iter().filter(|n| seen.insert(n.as_str())) {
        let Some(c) = pod.containers().iter().find(|c| c.name.as_str() == name) else {
            return Some(format!("app container {name:?}"));
        };
        if let Some(var) = first_unnamed(c.env, &claimed) {
            return Some(format!("variable {var} in container {name:?}"));
        }
        if let Some(what) = env_not_carried(c.env, &claimed, &recorded, kept) {
            return Some(format!("{what} in container {name:?}"));
        }
        if let Some(v) = first_unnamed(c.volume_mounts, &mounted) {
            return Some(format!("the mount of volume {v:?} in container {name:?}"));
        }
        for v in &mounted {
            let Some(path) = rendered_mount_path(profile, v) else {
                continue;
            };
            let mut found = false;
            each_entry(c.volume_mounts, |raw| {
                found = crate::json::from_str::<MountEntry<'_>>(raw.get()).is_ok_and(|m| {
                    m.name.as_str() == *v
                        && m.mount_path.as_str() == path
                        && m.read_only == Some(true)
                });
                found
            });
            if !found {
                return Some(format!(
                    "the read-only mount of volume {v:?} at {path} in container {name:?}"
                ));
            }
        }
    }
    None
}

/// The first claimed variable whose last definition in `env` (the one the kubelet uses) has another value than
/// the recorded wiring gives. A first pass keeps a variable the app defines itself and records `env_kept`: such a
/// status is believed with the app's values, which a fresh wiring would keep as well.
fn env_not_carried(
    env: Option<&serde_json::value::RawValue>,
    claimed: &[&str],
    recorded: &[k8s_openapi::api::core::v1::EnvVar],
    kept: bool,
) -> Option<String> {
    if kept {
        return None;
    }
    // Each claimed variable's last definition; `Some(None)` when that entry does not read as a variable.
    let mut last: Vec<Option<Option<EnvEntry<'_>>>> = claimed.iter().map(|_| None).collect();
    let at = |name: &str| claimed.iter().position(|c| *c == name);
    // One pass of the core's reader when every entry reads as a variable, as the apiserver sends them; entry by
    // entry otherwise (each with serde_json behind it), so that an entry of another shape is passed over instead
    // of failing the list.
    match env.map(|e| crate::json::read::<Vec<EnvEntry<'_>>>(e.get())) {
        None => {}
        Some(Ok(entries)) => {
            for e in entries {
                if let Some(i) = at(e.name.as_str()) {
                    last[i] = Some(Some(e));
                }
            }
        }
        Some(Err(_)) => each_entry(env, |raw| {
            if let Ok(e) = crate::json::from_str::<NameEntry<'_>>(raw.get())
                && let Some(i) = at(e.name.as_str())
            {
                last[i] = Some(crate::json::from_str::<EnvEntry<'_>>(raw.get()).ok());
            }
            false
        }),
    }
    for (name, definition) in claimed.iter().zip(last) {
        let Some(ours) = recorded.iter().find(|e| e.name == *name) else {
            continue;
        };
        let theirs = definition.flatten();
        let wanted = match theirs.as_ref().map(|t| same_source(t, ours)) {
            Some(Ok(())) => continue,
            Some(Err(wanted)) => wanted,
            None => format!("{:?}", ours.value.as_deref().unwrap_or_default()),
        };
        return Some(format!("variable {name} as the profile sets it ({wanted})"));
    }
    None
}

/// The first volume the status names that the Pod lacks, or has with another source than the profile renders.
fn volume_not_carried(pod: &PodView<'_>, profile: &Profile, status: &Status) -> Option<String> {
    let volumes = pod.spec.as_ref().and_then(|s| s.volumes);
    if let Some(v) = first_unnamed(volumes, &status.volumes) {
        return Some(format!("volume {v:?}"));
    }
    for name in &status.volumes {
        let Some(wanted) = rendered_volume(profile, status, name) else {
            continue;
        };
        let mut same = false;
        each_entry(volumes, |raw| {
            let named = crate::json::from_str::<NameEntry<'_>>(raw.get())
                .is_ok_and(|e| e.name.as_str() == name);
            if named {
                same = serde_json::from_str::<serde_json::Value>(raw.get())
                    .is_ok_and(|found| same_volume(found, &wanted));
            }
            named
        });
        if !same {
            return Some(format!("volume {name:?} as the profile renders it"));
        }
    }
    None
}

/// Whether a volume as the Pod has it is `wanted`, once the fields the apiserver defaults and the profile does not
/// set are left out (a ConfigMap, Secret, projected or Downward API volume's `defaultMode` 420, hostPath's `type`
/// ""): the Pod the webhook sees again on reinvocation, and `check` reads, carries them.
pub(super) fn same_volume(
    mut found: serde_json::Value,
    wanted: &k8s_openapi::api::core::v1::Volume,
) -> bool {
    let Ok(wanted) = serde_json::to_value(wanted) else {
        return false;
    };
    for (source, field, default) in [
        ("configMap", "defaultMode", serde_json::json!(420)),
        ("secret", "defaultMode", serde_json::json!(420)),
        ("projected", "defaultMode", serde_json::json!(420)),
        ("downwardAPI", "defaultMode", serde_json::json!(420)),
        ("hostPath", "type", serde_json::json!("")),
    ] {
        let unset = wanted.get(source).is_some_and(|w| w.get(field).is_none());
        if let Some(obj) = found.get_mut(source).and_then(|f| f.as_object_mut())
            && unset
            && obj.get(field) == Some(&default)
        {
            obj.remove(field);
        }
    }
    serde_json::from_value::<k8s_openapi::api::core::v1::Volume>(found)
        .is_ok_and(|v| serde_json::to_value(&v).ok() == Some(wanted))
}
