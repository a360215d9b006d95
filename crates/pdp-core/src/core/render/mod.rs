//! Render a [`Plan`] as a JSON Patch against the Pod, with typed Kubernetes objects for what it adds.
//!
//! Every step *ensures* rather than appends: a piece that is already there (identical, or recorded as ours in the
//! status annotation) is left alone, so rendering an injected Pod again changes nothing. Defaults that the
//! apiserver would fill in are written explicitly, so the stored object equals what we returned and a
//! reinvocation compares like with like.

mod apps;
mod env;
mod pdp;
mod sidecar;
#[cfg(test)]
mod tests;
mod volumes;

use std::collections::BTreeMap;

use apps::{pod_volumes, wire_app_containers};
use k8s_openapi::api::core::v1::{Container, EnvVar, Volume};
use pdp::{gate_container, pdp_container, place_pdp};
use sidecar::Classic;
use volumes::{mtls_volume, socket_volume, tls_volume};

use crate::config::{Config, Mode, NodeAddressFamily, Profile, SocketBy};
use crate::core::patch::{Form, JsonPatch, OpValue, PatchBuilder, pointer};
use crate::core::view::PodView;
use crate::core::{Denial, Plan, Reason, Status, Warning, WarningCode};
use crate::names::{
    ANNOTATION_DEFAULT_CONTAINER, ANNOTATION_SAFE_TO_EVICT_LOCAL_VOLUMES, ANNOTATION_STATUS,
    INIT_AWAIT, VERSION, VOLUME_MTLS, VOLUME_SOCKET, VOLUME_TLS,
};

pub use env::{app_env, same_source};
pub use sidecar::sidecar_container;

/// A Pod with its PDP wiring applied.
#[derive(Debug, Clone)]
pub struct Rendered {
    /// The JSON Patch that applies the wiring to the Pod; empty when the Pod already has all of it.
    pub patch: JsonPatch,
    /// Warnings for the user.
    pub warnings: Vec<Warning>,
    /// What was written into the status annotation.
    pub status: Status,
}

/// What an app container is wired with besides the profile: decided once for the Pod by the first pass, and
/// kept by a re-wiring so that a new container gets exactly what the others got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wiring {
    /// The mode.
    pub mode: Mode,
    /// The PDP's Unix socket is mounted (its path variable is set).
    pub socket: bool,
    /// The profile's `tls` is wired (its Secret mounted, its variables set). Never in sidecar mode.
    pub tls: bool,
    /// The HTTP address variable is set (where the profile has an `httpPort`); a re-wiring of a Pod wired
    /// before it existed leaves it out, so that every container of the Pod gets the same variables.
    pub http: bool,
    /// How the node's address is written in daemonset mode.
    pub family: NodeAddressFamily,
}

impl Wiring {
    /// The wiring of `mode` with the socket as given, TLS wherever the profile has it and the mode uses it,
    /// and IPv4 node addresses: what the built-in config gives.
    pub fn of(profile: &Profile, mode: Mode, socket: bool) -> Wiring {
        Wiring {
            mode,
            socket,
            tls: tls_applies(profile, mode),
            http: true,
            family: NodeAddressFamily::IPv4,
        }
    }

    /// The wiring a status records, which a re-wiring gives the containers it adds: the socket, TLS and the
    /// HTTP address each where the status lists its variable.
    pub fn recorded(profile: &Profile, status: &Status, family: NodeAddressFamily) -> Wiring {
        let listed = |name: &String| status.env.contains(name);
        Wiring {
            mode: status.mode,
            socket: listed(&profile.env_names.socket),
            tls: profile.tls.is_some() && profile.tls_env_names().is_some_and(|t| listed(&t.flag)),
            http: profile.env_names.http_address.as_ref().is_none_or(listed),
            family,
        }
    }
}

/// Whether the profile's `tls` is wired in `mode`: on the TCP path only (daemonset, central). In sidecar mode
/// the app reaches its PDP on 127.0.0.1 inside the Pod, where TLS protects nothing.
pub fn tls_applies(profile: &Profile, mode: Mode) -> bool {
    profile.tls.is_some() && mode != Mode::Sidecar
}

fn collision(message: String) -> Denial {
    Denial {
        reason: Reason::NameCollision,
        message,
    }
}

fn invalid(message: String) -> Denial {
    Denial::invalid_object(message)
}

/// Renders `plan` for `pod` with its `profile` (resolved, and the plan judged possible, by
/// [`decide::plan_profile`](crate::core::decide::plan_profile)). Each step is a function: the wiring of the
/// app containers, the PDP container, the volumes, the app containers' variables and mounts, the PDP's place,
/// the status and annotations. The denials left here are collisions with what the Pod already has. The patch's
/// values are kept in `form`, the caller's use of it.
pub fn render(
    pod: &PodView<'_>,
    plan: &Plan,
    profile: &Profile,
    config: &Config,
    form: Form,
) -> Result<Rendered, Denial> {
    let spec = pod.spec.as_ref().ok_or_else(|| Denial {
        reason: Reason::InvalidObject,
        message: "the Pod has no spec".into(),
    })?;
    let mut warnings = plan.warnings.clone();
    let (wiring, socket) = wiring(plan, profile, config, &mut warnings);
    let by_csi = socket.as_ref().is_some_and(|v| v.csi.is_some());
    let gate = gate_container(pod, plan, profile, config, by_csi || wiring.tls)?;
    let mut pdp = pdp_container(spec, plan, profile, config);
    let volumes = pod_volumes(pod, spec, plan, profile, wiring, socket, pdp.as_mut())?;
    let ours = app_env(profile, wiring);
    let mut containers_ops = PatchBuilder::new(form);
    let wired = wire_app_containers(
        pod,
        plan,
        profile,
        wiring,
        &ours,
        &mut containers_ops,
        &mut warnings,
    )?;
    let classic_added = pdp.as_ref().is_some_and(|p| p.classic.is_some());
    let placed = place_pdp(
        spec,
        profile,
        pdp,
        volumes.add_tools_init,
        &mut containers_ops,
    )?;
    let mut status = status_of(
        plan,
        config,
        placed.sidecar,
        &volumes,
        &wired,
        &ours,
        &warnings,
    );
    let mut gate_ops = PatchBuilder::new(form);
    match gate {
        Some(Gate::Add(gate)) => {
            status.gate = Some(gate.name.clone());
            // First: the app's own init containers may call the PDP too.
            let list = pointer(["spec", "initContainers"]);
            match spec.init_containers.as_ref().map(Vec::len) {
                Some(n) if n > 0 => gate_ops.insert(&list, 0, &*gate),
                n => gate_ops.extend(list, n, &[*gate]),
            }
        }
        Some(Gate::Present) => status.gate = Some(INIT_AWAIT.into()),
        None => {}
    }

    let mut patch = PatchBuilder::new(form);
    if plan.previous.is_none() || !wired.is_empty() {
        annotate(pod, &status, &volumes.added, classic_added, &mut patch);
    }
    if placed.share_processes {
        patch.add(pointer(["spec", "shareProcessNamespace"]), &true);
    }
    patch.append(gate_ops);
    patch.append(placed.init_ops);
    patch.append(containers_ops);
    patch.extend(pointer(["spec", "volumes"]), volumes.count, &volumes.new);
    Ok(Rendered {
        patch: patch.finish(),
        warnings,
        status,
    })
}

/// The volume named `name` as a first pass with `profile` renders it in the wiring `status` records, when it is
/// one of the volumes that carry the wiring (the socket, the client and server certificates, the PDP's own
/// files); `None` for another name (the classic sidecar's helper emptyDirs, compared by name only).
pub fn rendered_volume(profile: &Profile, status: &Status, name: &str) -> Option<Volume> {
    let by = match status.socket_volume.as_deref() {
        Some("csi") => SocketBy::Csi,
        _ => SocketBy::HostPath,
    };
    let volumes = [
        socket_volume(profile, status.mode, by),
        mtls_volume(profile),
        tls_volume(profile),
    ];
    volumes
        .into_iter()
        .flatten()
        .chain(
            (status.mode == Mode::Sidecar)
                .then(|| profile.volumes.iter().map(|v| v.volume.clone()))
                .into_iter()
                .flatten(),
        )
        .find(|v| v.name == name)
}

/// Where a first pass with `profile` mounts volume `name` in app containers, read-only: the socket's
/// directory, the client or server certificates' path.
pub fn rendered_mount_path<'p>(profile: &'p Profile, name: &str) -> Option<&'p str> {
    match name {
        VOLUME_SOCKET => Some(&profile.socket.dir),
        VOLUME_MTLS => profile.mtls.as_ref().map(|m| m.mount_path.as_str()),
        VOLUME_TLS => profile.tls.as_ref().map(|t| t.mount_path.as_str()),
        _ => None,
    }
}

/// The app containers' wiring, and the socket volume when the Pod gets one. A re-wiring gives new containers
/// exactly what the first pass gave the others.
fn wiring(
    plan: &Plan,
    profile: &Profile,
    config: &Config,
    warnings: &mut Vec<Warning>,
) -> (Wiring, Option<Volume>) {
    let previous = plan.previous.as_ref();
    let by = config.socket_by(profile, plan.pss);
    if plan.mode == Mode::Daemonset && by == SocketBy::Downgraded && previous.is_none() {
        warnings.push(Warning {
            code: WarningCode::DowngradedPss,
            message: format!(
                "Pod Security level {:?} forbids hostPath: the PDP socket {} is not mounted; use {} (TCP){}",
                plan.pss.as_str(),
                profile.socket.path(),
                profile.env_names.address,
                match (&profile.env_names.http_address, profile.http_port) {
                    (Some(http), Some(_)) => format!(", or {http} for the HTTP API"),
                    _ => String::new(),
                }
            ),
        });
    }
    // A profile whose node-local PDP serves no socket: TCP only, and nothing to warn about.
    let socket = socket_volume(profile, plan.mode, by);
    let wiring = match previous {
        Some(prev) => Wiring {
            mode: plan.mode,
            ..Wiring::recorded(profile, prev, config.node_address_family)
        },
        None => Wiring {
            mode: plan.mode,
            socket: socket.is_some(),
            tls: tls_applies(profile, plan.mode),
            http: true,
            family: config.node_address_family,
        },
    };
    (wiring, socket)
}

/// The start-up gate a pass gives: added, or already there from an earlier wiring.
enum Gate {
    Add(Box<Container>),
    Present,
}

/// The PDP container a first sidecar-mode pass adds, with what its classic form needs besides.
struct PdpContainer {
    container: Container,
    classic: Option<Classic>,
}

/// The volumes a first pass adds to the Pod.
struct PodVolumes {
    /// The volumes to add, in order.
    new: Vec<Volume>,
    /// Their names.
    added: Vec<String>,
    /// The Pod's own volumes, `None` when it has no list.
    count: Option<usize>,
    /// Whether the classic sidecar's helper init container is added (an earlier profile of this Pod,
    /// `cerbos,flagd`, may have added it already).
    add_tools_init: bool,
}

/// Where the PDP container went.
struct Placed {
    /// Its name, when one was added.
    sidecar: Option<String>,
    /// The init containers' patch.
    init_ops: PatchBuilder,
    /// `spec.shareProcessNamespace` is to be set (the classic form's watch container needs it).
    share_processes: bool,
}

/// The status annotation's value: the previous one with the newly wired containers, or a fresh one.
fn status_of(
    plan: &Plan,
    config: &Config,
    sidecar: Option<String>,
    volumes: &PodVolumes,
    wired: &[String],
    ours: &[EnvVar],
    warnings: &[Warning],
) -> Status {
    if let Some(prev) = &plan.previous {
        let mut s = prev.clone();
        s.containers.extend(wired.iter().cloned());
        return s;
    }
    Status {
        mode: plan.mode,
        profile: plan.profile.clone(),
        reason: match plan.mode {
            Mode::Sidecar => Reason::InjectedSidecar,
            Mode::Daemonset => Reason::InjectedDaemonset,
            Mode::Central => Reason::InjectedCentral,
        },
        config_hash: config.hash.clone(),
        version: VERSION.into(),
        sidecar,
        volumes: volumes.added.clone(),
        containers: wired.to_vec(),
        env: ours.iter().map(|e| e.name.clone()).collect(),
        warnings: warnings.iter().map(|w| w.code).collect(),
        socket_volume: volumes
            .new
            .iter()
            .any(|v| v.name == VOLUME_SOCKET && v.csi.is_some())
            .then(|| "csi".to_string()),
        gate: None,
    }
}

/// The annotations the wiring sets: the status, the socket's entry in the autoscaler's safe-to-evict list, and
/// the default container of a Pod whose first container is now a classic sidecar.
fn annotate(
    pod: &PodView<'_>,
    status: &Status,
    added_volumes: &[String],
    classic_added: bool,
    patch: &mut PatchBuilder,
) {
    // Sorted by key, as the map a missing `annotations` is added as.
    let mut changed: BTreeMap<&str, OpValue> = BTreeMap::new();
    // The status's JSON is written once, compared with the value already there, and escaped as the
    // annotation's string.
    if let Some(value) = patch.json_string(status, pod.annotation(ANNOTATION_STATUS)) {
        changed.insert(ANNOTATION_STATUS, value);
    }
    if added_volumes.iter().any(|v| v == VOLUME_SOCKET) {
        let mut entry = pod
            .annotation(ANNOTATION_SAFE_TO_EVICT_LOCAL_VOLUMES)
            .unwrap_or_default()
            .to_string();
        if !entry.split(',').any(|v| v.trim() == VOLUME_SOCKET) {
            if !entry.is_empty() {
                entry.push(',');
            }
            entry.push_str(VOLUME_SOCKET);
            changed.insert(ANNOTATION_SAFE_TO_EVICT_LOCAL_VOLUMES, patch.value(&entry));
        }
    }
    // A classic sidecar is first among the containers, where `kubectl logs` and `exec` would pick it.
    if classic_added
        && pod.annotation(ANNOTATION_DEFAULT_CONTAINER).is_none()
        && let Some(first) = pod.containers().first()
    {
        changed.insert(ANNOTATION_DEFAULT_CONTAINER, patch.value(&first.name));
    }
    let meta = pod.metadata.as_ref();
    match (meta, meta.and_then(|m| m.annotations.as_ref())) {
        _ if changed.is_empty() => {}
        (None, _) => {
            let annotations = patch.object(changed);
            let metadata = patch.object([("annotations", annotations)]);
            patch.push(pointer(["metadata"]), metadata);
        }
        (Some(_), None) => {
            let annotations = patch.object(changed);
            patch.push(pointer(["metadata", "annotations"]), annotations);
        }
        (Some(_), Some(_)) => {
            for (key, value) in changed {
                patch.push(pointer(["metadata", "annotations", key]), value);
            }
        }
    }
}
