//! Render a [`Plan`] onto a copy of the Pod with typed Kubernetes objects.
//!
//! Every step *ensures* rather than appends: a piece that is already there (identical, or recorded as ours in the
//! status annotation) is left alone, so rendering an injected Pod again changes nothing. Defaults that the
//! apiserver would fill in are written explicitly, so the stored object equals what we returned and a
//! reinvocation compares like with like.

use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource, HTTPGetAction,
    HostPathVolumeSource, ObjectFieldSelector, Pod, Probe, SecretVolumeSource, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::config::{Config, Mode, Placement, Profile, PssLevel};
use crate::core::{Denial, Plan, Reason, Status, Warning, WarningCode};
use crate::names::*;

/// A Pod with its PDP wiring applied.
#[derive(Debug, Clone)]
pub struct Rendered {
    /// The mutated copy.
    pub pod: Pod,
    /// Warnings for the user.
    pub warnings: Vec<Warning>,
    /// What was written into the status annotation.
    pub status: Status,
}

/// The variables an app container receives, in the order they are prepended.
///
/// Central mode takes host and port from the profile's `central.address`; a profile without one gives no
/// variables at all, and [`render`] refuses such a Pod before it gets here.
pub fn app_env(profile: &Profile, mode: Mode, with_socket: bool) -> Vec<EnvVar> {
    let names = &profile.env_names;
    let value = |name: &str, value: String| EnvVar {
        name: name.to_string(),
        value: Some(value),
        value_from: None,
    };
    if mode == Mode::Central {
        let Some((central, Ok((host, port)))) =
            profile.central.as_ref().map(|c| (c, c.host_port()))
        else {
            return vec![];
        };
        let mut env = vec![value(&names.host, host.to_string())];
        if let Some(port_name) = &names.port {
            env.push(value(port_name, port.to_string()));
        }
        // The address as the admin wrote it (brackets kept for IPv6), so that it is a valid host:port.
        env.push(value(&names.address, central.address.clone()));
        env.extend(profile.app_env.iter().cloned());
        return env;
    }
    // Sidecar and daemonset from here (central returned above; its arms below are for exhaustiveness only).
    let port = profile.address_port;
    let mut env = Vec::with_capacity(4);
    env.push(match mode {
        Mode::Sidecar | Mode::Central => value(&names.host, "127.0.0.1".into()),
        Mode::Daemonset => EnvVar {
            name: names.host.clone(),
            value: None,
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    api_version: Some("v1".into()),
                    field_path: profile.host_field.field_path().into(),
                }),
                ..Default::default()
            }),
        },
    });
    if let Some(port_name) = &names.port {
        env.push(value(port_name, port.to_string()));
    }
    env.push(match mode {
        Mode::Sidecar | Mode::Central => value(&names.address, format!("127.0.0.1:{port}")),
        Mode::Daemonset => value(&names.address, format!("$({}):{port}", names.host)),
    });
    if with_socket {
        env.push(value(&names.socket, profile.socket.path()));
    }
    env.extend(profile.app_env.iter().cloned());
    env
}

fn same_env(a: &EnvVar, b: &EnvVar) -> bool {
    let field = |e: &EnvVar| {
        e.value_from
            .as_ref()
            .and_then(|v| v.field_ref.as_ref())
            .map(|f| f.field_path.clone())
    };
    a.name == b.name
        && a.value.as_deref().unwrap_or("") == b.value.as_deref().unwrap_or("")
        && field(a) == field(b)
        && (a.value_from.is_none() == b.value_from.is_none())
}

fn describe_env(e: &EnvVar) -> String {
    match (
        &e.value,
        e.value_from.as_ref().and_then(|v| v.field_ref.as_ref()),
    ) {
        (_, Some(f)) => format!("from {}", f.field_path),
        (Some(v), None) => format!("{v:?}"),
        (None, None) => "\"\"".into(),
    }
}

/// The socket volume for the mode, or `None` when the mode has no socket (TCP only).
fn socket_volume(profile: &Profile, mode: Mode, downgraded: bool) -> Option<Volume> {
    match mode {
        Mode::Daemonset if !downgraded => Some(Volume {
            name: VOLUME_SOCKET.into(),
            host_path: Some(HostPathVolumeSource {
                path: profile.socket.dir.clone(),
                type_: Some("Directory".into()),
            }),
            ..Default::default()
        }),
        Mode::Sidecar if profile.sidecar.unix_socket => Some(Volume {
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

fn mtls_volume(profile: &Profile) -> Option<Volume> {
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

fn http_probe(profile: &Profile, period: i32, failures: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(profile.health.path.clone()),
            port: IntOrString::Int(i32::from(profile.health.port)),
            scheme: Some("HTTP".into()),
            ..Default::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        success_threshold: Some(1),
        timeout_seconds: Some(1),
        ..Default::default()
    }
}

/// The PDP container of sidecar mode.
pub fn sidecar_container(profile: &Profile) -> Container {
    let mut mounts: Vec<VolumeMount> = profile
        .volumes
        .iter()
        .map(|v| VolumeMount {
            name: v.volume.name.clone(),
            mount_path: v.mount_path.clone(),
            read_only: Some(true),
            ..Default::default()
        })
        .collect();
    if profile.sidecar.unix_socket {
        mounts.push(VolumeMount {
            name: VOLUME_SOCKET.into(),
            mount_path: profile.socket.dir.clone(),
            ..Default::default()
        });
    }
    let native = profile.sidecar.native;
    Container {
        name: profile.container_name.clone(),
        image: Some(profile.image.clone()),
        image_pull_policy: Some(profile.image_pull_policy.clone()),
        args: (!profile.args.is_empty()).then(|| profile.args.clone()),
        env: (!profile.env.is_empty()).then(|| profile.env.clone()),
        ports: Some(
            profile
                .ports
                .iter()
                .map(|p| ContainerPort {
                    name: Some(p.name.clone()),
                    container_port: i32::from(p.port),
                    protocol: Some("TCP".into()),
                    ..Default::default()
                })
                .collect(),
        ),
        resources: Some(profile.resources.clone()),
        security_context: Some(profile.security_context.clone()),
        // Native sidecar: the kubelet starts app containers only once this probe passes, and a Job completes
        // when its app containers end, whatever the sidecar does.
        restart_policy: native.then(|| "Always".to_string()),
        startup_probe: Some(http_probe(profile, 1, 120)),
        readiness_probe: Some(http_probe(profile, 5, 3)),
        volume_mounts: (!mounts.is_empty()).then_some(mounts),
        termination_message_path: Some("/dev/termination-log".into()),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Default::default()
    }
}

fn collision(message: String) -> Denial {
    Denial {
        reason: Reason::NameCollision,
        message,
    }
}

/// Adds `volume` unless an identical one is already there; a different volume of that name is a clash.
fn ensure_volume(
    volumes: &mut Option<Vec<Volume>>,
    volume: Volume,
    purpose: &str,
    added: &mut Vec<String>,
) -> Result<(), Denial> {
    match volumes
        .as_ref()
        .and_then(|vs| vs.iter().find(|v| v.name == volume.name))
    {
        None => {
            added.push(volume.name.clone());
            volumes.get_or_insert_with(Vec::new).push(volume);
            Ok(())
        }
        Some(existing) if *existing == volume => Ok(()),
        Some(_) => Err(collision(format!(
            "the Pod already has a volume named {:?}, which pdp-injector needs for {purpose}: rename the Pod's volume",
            volume.name
        ))),
    }
}

/// Adds a mount to an app container unless it is already there; a different mount at the same path is a clash.
fn ensure_mount(container: &mut Container, mount: VolumeMount) -> Result<(), Denial> {
    let mounts = container.volume_mounts.get_or_insert_with(Vec::new);
    if let Some(m) = mounts.iter().find(|m| m.mount_path == mount.mount_path) {
        if m.name == mount.name {
            return Ok(());
        }
        return Err(collision(format!(
            "container {:?} already mounts volume {:?} at {}, where pdp-injector mounts {:?}",
            container.name, m.name, mount.mount_path, mount.name
        )));
    }
    if mounts.iter().any(|m| m.name == mount.name) {
        return Ok(());
    }
    mounts.push(mount);
    Ok(())
}

/// Prepends the variables the container lacks, so that its own variables can use them as `$(VAR)`; a variable
/// the container already defines differently is kept and reported.
fn ensure_env(
    container: &mut Container,
    ours: &[EnvVar],
    dependent: Option<(&str, &str)>,
    warnings: &mut Vec<Warning>,
) {
    let existing = container.env.as_deref().unwrap_or(&[]);
    let mut missing = Vec::new();
    for var in ours {
        match existing.iter().find(|e| e.name == var.name) {
            None => missing.push(var.clone()),
            Some(e) if same_env(e, var) => {}
            Some(e) => warnings.push(Warning {
                code: WarningCode::EnvKept,
                message: format!(
                    "container {:?} keeps its own {} ({}) instead of the injected value ({})",
                    container.name,
                    var.name,
                    describe_env(e),
                    describe_env(var)
                ),
            }),
        }
    }
    if missing.is_empty() {
        return;
    }
    let mut env = container.env.take().unwrap_or_default();
    let mut at = 0;
    for var in missing {
        // The address refers to the host variable: when the app defines the host itself, the address must
        // come after the app's definition for `$(HOST)` to expand.
        let after = dependent
            .filter(|(dep, _)| *dep == var.name)
            .and_then(|(_, host)| env.iter().position(|e| e.name == host))
            .filter(|&h| h >= at);
        match after {
            Some(h) => env.insert(h + 1, var),
            None => {
                env.insert(at, var);
                at += 1;
            }
        }
    }
    container.env = Some(env);
}

/// Renders the plan onto a copy of `pod`.
pub fn render(pod: &Pod, plan: &Plan, config: &Config) -> Result<Rendered, Denial> {
    let profile = config.profiles.get(&plan.profile).ok_or_else(|| Denial {
        reason: Reason::UnknownProfile,
        message: format!(
            "unknown profile {:?}: valid profiles are {}",
            plan.profile,
            config.profile_names()
        ),
    })?;
    let previous = plan.previous.as_ref();
    let mut out = pod.clone();
    let mut warnings = plan.warnings.clone();
    let spec = out.spec.as_mut().ok_or_else(|| Denial {
        reason: Reason::InvalidObject,
        message: "the Pod has no spec".into(),
    })?;

    if plan.mode == Mode::Sidecar && previous.is_none() && spec.host_network == Some(true) {
        let ports: Vec<String> = profile.ports.iter().map(|p| p.port.to_string()).collect();
        return Err(Denial {
            reason: Reason::HostNetworkSidecar,
            message: format!(
                "the Pod uses hostNetwork, so a sidecar PDP would listen on the node's ports {}: set annotation {ANNOTATION_INJECT}=daemonset",
                ports.join(",")
            ),
        });
    }

    if plan.mode == Mode::Central
        && profile
            .central
            .as_ref()
            .is_none_or(|c| c.host_port().is_err())
    {
        return Err(Denial {
            reason: Reason::NoCentralAddress,
            message: format!(
                "{ANNOTATION_INJECT}=central needs the address of the PDP's Service, but profile {:?} has no \
                 central.address in the pdp-injector config: ask the cluster admin to set \
                 profiles.{}.central.address (host:port), or use mode sidecar or daemonset",
                plan.profile, plan.profile
            ),
        });
    }

    let downgraded = plan.mode == Mode::Daemonset && plan.pss > PssLevel::Privileged;
    if downgraded && previous.is_none() && profile.host_socket {
        warnings.push(Warning {
            code: WarningCode::DowngradedPss,
            message: format!(
                "Pod Security level {:?} forbids hostPath: the PDP socket {} is not mounted; use {} (TCP)",
                plan.pss.as_str(),
                profile.socket.path(),
                profile.env_names.address
            ),
        });
    }
    // A profile whose node-local PDP serves no socket: TCP only, and nothing to warn about.
    let socket = socket_volume(profile, plan.mode, downgraded || !profile.host_socket);
    // A re-wiring gives new containers exactly what the first pass gave the others.
    let with_socket = match previous {
        Some(prev) => prev.env.contains(&profile.env_names.socket),
        None => socket.is_some(),
    };

    let mut added_volumes = Vec::new();
    if previous.is_none() {
        if let Some(v) = socket {
            ensure_volume(&mut spec.volumes, v, "the PDP socket", &mut added_volumes)?;
        }
        if plan.mode == Mode::Sidecar {
            for v in &profile.volumes {
                ensure_volume(
                    &mut spec.volumes,
                    v.volume.clone(),
                    "the PDP's own files",
                    &mut added_volumes,
                )?;
            }
        }
        if let Some(v) = mtls_volume(profile) {
            ensure_volume(
                &mut spec.volumes,
                v,
                "the mTLS client certificate",
                &mut added_volumes,
            )?;
        }
    }

    let ours = app_env(profile, plan.mode, with_socket);
    let dependent = (plan.mode == Mode::Daemonset).then_some((
        profile.env_names.address.as_str(),
        profile.env_names.host.as_str(),
    ));
    let mut wired = Vec::new();
    for container in spec.containers.iter_mut() {
        if !plan.containers.contains(&container.name)
            || previous.is_some_and(|s| s.containers.contains(&container.name))
        {
            continue;
        }
        ensure_env(container, &ours, dependent, &mut warnings);
        if with_socket {
            ensure_mount(
                container,
                VolumeMount {
                    name: VOLUME_SOCKET.into(),
                    mount_path: profile.socket.dir.clone(),
                    read_only: Some(true),
                    ..Default::default()
                },
            )?;
        }
        if let Some(m) = &profile.mtls {
            ensure_mount(
                container,
                VolumeMount {
                    name: VOLUME_MTLS.into(),
                    mount_path: m.mount_path.clone(),
                    read_only: Some(true),
                    ..Default::default()
                },
            )?;
        }
        wired.push(container.name.clone());
    }

    let mut sidecar = None;
    if plan.mode == Mode::Sidecar && previous.is_none() {
        let container = sidecar_container(profile);
        sidecar = Some(container.name.clone());
        if profile.sidecar.native {
            let inits = spec.init_containers.get_or_insert_with(Vec::new);
            match profile.sidecar.placement {
                Placement::AfterInit => inits.push(container),
                Placement::First => inits.insert(0, container),
            }
        } else {
            spec.containers.push(container);
        }
    }

    let status = match previous {
        Some(prev) => {
            let mut s = prev.clone();
            s.containers.extend(wired.iter().cloned());
            s
        }
        None => Status {
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
            volumes: added_volumes.clone(),
            containers: wired.clone(),
            env: ours.iter().map(|e| e.name.clone()).collect(),
            warnings: warnings.iter().map(|w| w.code).collect(),
        },
    };
    if previous.is_none() || !wired.is_empty() {
        let annotations = out
            .metadata
            .annotations
            .get_or_insert_with(Default::default);
        annotations.insert(
            ANNOTATION_STATUS.into(),
            serde_json::to_string(&status).expect("status serializes"),
        );
        if added_volumes.iter().any(|v| v == VOLUME_SOCKET) {
            let entry = annotations
                .entry(ANNOTATION_SAFE_TO_EVICT_LOCAL_VOLUMES.into())
                .or_default();
            if !entry.split(',').any(|v| v.trim() == VOLUME_SOCKET) {
                if !entry.is_empty() {
                    entry.push(',');
                }
                entry.push_str(VOLUME_SOCKET);
            }
        }
    }
    Ok(Rendered {
        pod: out,
        warnings,
        status,
    })
}
