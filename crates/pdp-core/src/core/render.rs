//! Render a [`Plan`] as a JSON Patch against the Pod, with typed Kubernetes objects for what it adds.
//!
//! Every step *ensures* rather than appends: a piece that is already there (identical, or recorded as ours in the
//! status annotation) is left alone, so rendering an injected Pod again changes nothing. Defaults that the
//! apiserver would fill in are written explicitly, so the stored object equals what we returned and a
//! reinvocation compares like with like.

use std::collections::{BTreeMap, BTreeSet};

use json_patch::Patch;
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource, ExecAction,
    HTTPGetAction, HostPathVolumeSource, KeyToPath, Lifecycle, LifecycleHandler,
    ObjectFieldSelector, Probe, SecretVolumeSource, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::value::RawValue;

use crate::config::{
    Config, HostField, Mode, NodeAddressFamily, Placement, Profile, PssLevel,
    restricted_security_context,
};
use crate::core::patch::{PatchBuilder, pointer};
use crate::core::view::{
    EnvEntry, MountEntry, PodView, Str, VolumeEntry, parse_list, volume_entries,
};
use crate::core::{Denial, Plan, Reason, Status, Warning, WarningCode};
use crate::names::*;

/// A Pod with its PDP wiring applied.
#[derive(Debug, Clone)]
pub struct Rendered {
    /// The JSON Patch that applies the wiring to the Pod; empty when the Pod already has all of it.
    pub patch: Patch,
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
            family: NodeAddressFamily::IPv4,
        }
    }
}

/// Whether the profile's `tls` is wired in `mode`: on the TCP path only (daemonset, central). In sidecar mode
/// the app reaches its PDP on 127.0.0.1 inside the Pod, where TLS protects nothing.
pub fn tls_applies(profile: &Profile, mode: Mode) -> bool {
    profile.tls.is_some() && mode != Mode::Sidecar
}

/// The variables an app container receives, in the order they are prepended.
///
/// Central mode takes host and port from the profile's `central.address`; a profile without one gives no
/// variables at all, and [`render`] refuses such a Pod before it gets here.
pub fn app_env(profile: &Profile, wiring: Wiring) -> Vec<EnvVar> {
    let Wiring {
        mode,
        socket: with_socket,
        ..
    } = wiring;
    let names = &profile.env_names;
    let value = |name: &str, value: String| EnvVar {
        name: name.to_string(),
        value: Some(value),
        value_from: None,
    };
    let mut env = Vec::with_capacity(9);
    if mode == Mode::Central {
        let Some((central, Ok((host, port)))) =
            profile.central.as_ref().map(|c| (c, c.host_port()))
        else {
            return vec![];
        };
        env.push(value(&names.host, host.to_string()));
        if let Some(port_name) = &names.port {
            env.push(value(port_name, port.to_string()));
        }
        // The address as the admin wrote it (brackets kept for IPv6), so that it is a valid host:port.
        env.push(value(&names.address, central.address.clone()));
    } else {
        let port = profile.address_port;
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
        // The kubelet expands `$(HOST)` and cannot add brackets on its own: an IPv6 node address gets them
        // here. A node name (`spec.nodeName`) is a DNS name and never takes them.
        let bracketed =
            wiring.family == NodeAddressFamily::IPv6 && profile.host_field == HostField::HostIp;
        env.push(match mode {
            Mode::Sidecar | Mode::Central => value(&names.address, format!("127.0.0.1:{port}")),
            Mode::Daemonset if bracketed => {
                value(&names.address, format!("[$({})]:{port}", names.host))
            }
            Mode::Daemonset => value(&names.address, format!("$({}):{port}", names.host)),
        });
        if with_socket {
            env.push(value(&names.socket, profile.socket.path()));
        }
    }
    if wiring.tls
        && mode != Mode::Sidecar
        && let (Some(tls), Some(t)) = (&profile.tls, profile.tls_env_names())
    {
        env.push(value(&t.flag, "true".into()));
        env.push(value(&t.ca, tls.file("ca.crt")));
        env.push(value(&t.server_name, tls.server_name.clone()));
        if tls.client_certificate {
            env.push(value(&t.cert, tls.file("tls.crt")));
            env.push(value(&t.key, tls.file("tls.key")));
        }
    }
    env.extend(profile.app_env.iter().cloned());
    env
}

/// What makes two variables the same for rendering: the value, or the field a value comes from.
#[derive(PartialEq, Eq)]
struct EnvSource<'a> {
    value: &'a str,
    field: Option<&'a str>,
    has_source: bool,
}

impl<'a> EnvSource<'a> {
    fn of_existing(e: &'a EnvEntry<'_>) -> Self {
        EnvSource {
            value: e.value.as_ref().map_or("", Str::as_str),
            field: e
                .value_from
                .as_ref()
                .and_then(|v| v.field_ref.as_ref())
                .map(|f| f.field_path.as_str()),
            has_source: e.value_from.is_some(),
        }
    }

    fn of_ours(e: &'a EnvVar) -> Self {
        EnvSource {
            value: e.value.as_deref().unwrap_or(""),
            field: e
                .value_from
                .as_ref()
                .and_then(|v| v.field_ref.as_ref())
                .map(|f| f.field_path.as_str()),
            has_source: e.value_from.is_some(),
        }
    }

    fn describe(&self) -> String {
        match self.field {
            Some(f) => format!("from {f}"),
            None => format!("{:?}", self.value),
        }
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

/// The profile's TLS Secret, projected to the keys the app needs: `ca.crt`, and the client certificate and key
/// only when the PDP asks for them, so a key the Secret holds anyway (cert-manager always writes `tls.key`) is
/// not handed to apps that do not use it. A missing key or Secret holds the Pod in ContainerCreating: the app
/// never starts without the TLS it was configured for. Mode 0444: app containers run as users of their own,
/// usually without an fsGroup, and must read the files; the Secret is the app's own material.
fn tls_volume(profile: &Profile) -> Option<Volume> {
    profile.tls.as_ref().map(|t| Volume {
        name: VOLUME_TLS.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(t.secret_name.clone()),
            default_mode: Some(0o444),
            items: Some(
                t.keys()
                    .iter()
                    .map(|k| KeyToPath {
                        key: (*k).into(),
                        path: (*k).into(),
                        mode: None,
                    })
                    .collect(),
            ),
            optional: None,
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

/// What a classic sidecar (Kubernetes < 1.29, no native sidecars) needs besides its container, so that it
/// keeps the native form's two promises: the app starts only once the PDP answers, and a Pod that runs to
/// completion completes. The helper `pdp-await` comes from the injector's image (the PDP's image has no tool to
/// wait with), copied by an init container into an emptyDir.
struct Classic {
    /// The init container that copies `pdp-await`.
    init: Container,
    /// The emptyDir of the helper, and in a Pod that runs to completion the shared state emptyDir.
    volumes: Vec<Volume>,
    /// In a Pod that runs to completion: the watch container, last among the containers.
    watch: Option<Container>,
}

/// Turns the PDP container into the classic form: first among the containers (the caller puts it there), with
/// a `postStart` hook that returns only once its health check answers (the kubelet starts the next container
/// only after that hook), and in a Pod that runs to completion a liveness probe that fails once the watch
/// container (last, so started after the apps) has seen no app process left in the Pod's shared process
/// namespace: the kubelet then stops the PDP and, under `Never`/`OnFailure`, leaves it stopped (Cerbos exits 0
/// on SIGTERM, so the Pod succeeds). Nothing here needs an API call or a Pod write right.
fn classic_sidecar(
    container: &mut Container,
    profile: &Profile,
    config: &Config,
    run_to_completion: bool,
    on_failure: bool,
) -> Classic {
    let tool = format!("{TOOLS_DIR}/pdp-await");
    let health = format!("127.0.0.1:{}{}", profile.health.port, profile.health.path);
    container.lifecycle = Some(Lifecycle {
        post_start: Some(LifecycleHandler {
            exec: Some(ExecAction {
                command: Some(
                    vec![
                        tool.clone(),
                        "wait".into(),
                        "--http".into(),
                        health,
                        // As long as the native form's startupProbe allows (120 x 1 s).
                        "--timeout=120s".into(),
                    ]
                    .into_iter()
                    .chain(
                        run_to_completion
                            .then(|| format!("--record={STATE_DIR}/{}.pids", container.name)),
                    )
                    .collect(),
                ),
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    let mounts = container.volume_mounts.get_or_insert_with(Vec::new);
    mounts.push(VolumeMount {
        name: VOLUME_TOOLS.into(),
        mount_path: TOOLS_DIR.into(),
        read_only: Some(true),
        ..Default::default()
    });
    let mut volumes = vec![Volume {
        name: VOLUME_TOOLS.into(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: None,
            size_limit: Some(Quantity("16Mi".into())),
        }),
        ..Default::default()
    }];
    let mut watch = None;
    if run_to_completion {
        let state_mount = VolumeMount {
            name: VOLUME_STATE.into(),
            mount_path: STATE_DIR.into(),
            ..Default::default()
        };
        mounts.push(state_mount.clone());
        volumes.push(Volume {
            name: VOLUME_STATE.into(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: None,
                size_limit: Some(Quantity("1Mi".into())),
            }),
            ..Default::default()
        });
        let stop = format!("{STATE_DIR}/stop-{}", container.name);
        container.liveness_probe = Some(Probe {
            exec: Some(ExecAction {
                command: Some(vec![tool, "apps-done".into(), stop.clone()]),
            }),
            period_seconds: Some(2),
            failure_threshold: Some(1),
            success_threshold: Some(1),
            timeout_seconds: Some(1),
            ..Default::default()
        });
        // Under OnFailure a failed app is restarted after a back-off of at most 5 minutes: only a longer
        // absence of every app process means the apps have ended for good.
        let grace = if on_failure { "330s" } else { "0s" };
        watch = Some(Container {
            name: format!("{WATCH_PREFIX}{}", container.name),
            image: Some(config.tools_image.clone()),
            image_pull_policy: Some("IfNotPresent".into()),
            command: Some(vec![
                TOOLS_BINARY_IN_IMAGE.into(),
                "watch".into(),
                format!("--state={STATE_DIR}"),
                format!("--stop={stop}"),
                format!("--grace={grace}"),
            ]),
            resources: Some(helper_resources()),
            security_context: Some(restricted_security_context(Some(65532))),
            volume_mounts: Some(vec![state_mount]),
            termination_message_path: Some("/dev/termination-log".into()),
            termination_message_policy: Some("FallbackToLogsOnError".into()),
            ..Default::default()
        });
    }
    let init = Container {
        name: INIT_TOOLS.into(),
        image: Some(config.tools_image.clone()),
        image_pull_policy: Some("IfNotPresent".into()),
        command: Some(vec![
            TOOLS_BINARY_IN_IMAGE.into(),
            "install".into(),
            TOOLS_DIR.into(),
        ]),
        resources: Some(helper_resources()),
        security_context: Some(restricted_security_context(Some(65532))),
        volume_mounts: Some(vec![VolumeMount {
            name: VOLUME_TOOLS.into(),
            mount_path: TOOLS_DIR.into(),
            ..Default::default()
        }]),
        termination_message_path: Some("/dev/termination-log".into()),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Default::default()
    };
    Classic {
        init,
        volumes,
        watch,
    }
}

/// What the helper containers (the init container that copies `pdp-await`, the watch container) ask for.
fn helper_resources() -> k8s_openapi::api::core::v1::ResourceRequirements {
    k8s_openapi::api::core::v1::ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_string(), Quantity("10m".into())),
            ("memory".to_string(), Quantity("16Mi".into())),
        ])),
        limits: Some(BTreeMap::from([(
            "memory".to_string(),
            Quantity("32Mi".into()),
        )])),
        ..Default::default()
    }
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

/// Adds `volume` unless an identical one is already there; a different volume of that name is a clash.
fn ensure_volume(
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
        let same = serde_json::from_str::<Volume>(v.raw.get()).is_ok_and(|v| v == volume);
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
fn ensure_mount(
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

/// Where each variable the container lacks goes: prepended, so that the container's own variables can use
/// them as `$(VAR)`; a variable the container already defines differently is kept and reported. Returns the
/// insertions in the order they apply, each at its index in the list as it is at that point.
fn ensure_env<'o>(
    container: &str,
    existing: &[EnvEntry<'_>],
    ours: &'o [EnvVar],
    dependent: Option<(&str, &str)>,
    warnings: &mut Vec<Warning>,
) -> Vec<(usize, &'o EnvVar)> {
    let mut missing = Vec::new();
    for var in ours {
        match existing.iter().find(|e| e.name.as_str() == var.name) {
            None => missing.push(var),
            Some(e) if EnvSource::of_existing(e) == EnvSource::of_ours(var) => {}
            Some(e) => warnings.push(Warning {
                code: WarningCode::EnvKept,
                message: format!(
                    "container {container:?} keeps its own {} ({}) instead of the injected value ({})",
                    var.name,
                    EnvSource::of_existing(e).describe(),
                    EnvSource::of_ours(var).describe()
                ),
            }),
        }
    }
    let mut names: Vec<&str> = existing.iter().map(|e| e.name.as_str()).collect();
    let mut inserts = Vec::with_capacity(missing.len());
    let mut at = 0;
    for var in missing {
        // The address refers to the host variable: when the app defines the host itself, the address must
        // come after the app's definition for `$(HOST)` to expand.
        let after = dependent
            .filter(|(dep, _)| *dep == var.name)
            .and_then(|(_, host)| names.iter().position(|n| *n == host))
            .filter(|&h| h >= at);
        let index = match after {
            Some(h) => h + 1,
            None => {
                at += 1;
                at - 1
            }
        };
        names.insert(index, &var.name);
        inserts.push((index, var));
    }
    inserts
}

/// True when `text` holds `"name"`.
fn contains_quoted(text: &str, name: &str) -> bool {
    text.match_indices(name)
        .any(|(at, _)| text[..at].ends_with('"') && text[at + name.len()..].starts_with('"'))
}

/// The entries of a container's `env` that rendering must compare: those that may define one of `names`.
/// Rendering puts its variables in front of the list, so the other entries matter to nothing but their
/// positions, which a prepend leaves alone. A list whose text has no escape and does not hold `"NAME"` for any
/// of `names` cannot define one (a JSON string without escapes is written literally): none of it is parsed,
/// which is most of the work of wiring a large Pod. Any other list is parsed.
fn relevant_env<'a>(
    raw: Option<&'a RawValue>,
    names: &[&str],
    what: impl Fn() -> String,
) -> Result<Option<Vec<EnvEntry<'a>>>, String> {
    let Some(raw) = raw else {
        return Ok(None);
    };
    let text = raw.get();
    if text.starts_with('[')
        && !text.contains('\\')
        && !names.iter().any(|n| contains_quoted(text, n))
    {
        return Ok(Some(Vec::new()));
    }
    parse_list(Some(raw), &what())
}

/// Renders the plan as a patch against `pod`.
pub fn render(pod: &PodView<'_>, plan: &Plan, config: &Config) -> Result<Rendered, Denial> {
    let profile = config.profiles.get(&plan.profile).ok_or_else(|| Denial {
        reason: Reason::UnknownProfile,
        message: format!(
            "unknown profile {:?}: valid profiles are {}",
            plan.profile,
            config.profile_names()
        ),
    })?;
    let previous = plan.previous.as_ref();
    let mut warnings = plan.warnings.clone();
    let spec = pod.spec.as_ref().ok_or_else(|| Denial {
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
    let with_tls = match previous {
        Some(prev) => profile
            .tls_env_names()
            .is_some_and(|t| prev.env.contains(&t.flag)),
        None => tls_applies(profile, plan.mode),
    };
    let wiring = Wiring {
        mode: plan.mode,
        socket: with_socket,
        tls: with_tls && profile.tls.is_some(),
        family: config.node_address_family,
    };

    // The PDP container of sidecar mode, and what its classic form (Kubernetes < 1.29) needs besides.
    let run_to_completion = matches!(
        spec.restart_policy.as_ref().map(|p| p.as_str()),
        Some("Never" | "OnFailure")
    );
    let on_failure = spec.restart_policy.as_ref().map(|p| p.as_str()) == Some("OnFailure");
    let mut pdp_container =
        (plan.mode == Mode::Sidecar && previous.is_none()).then(|| sidecar_container(profile));
    let classic = match &mut pdp_container {
        Some(c) if !profile.sidecar.native => Some(classic_sidecar(
            c,
            profile,
            config,
            run_to_completion,
            on_failure,
        )),
        _ => None,
    };
    let classic_added = classic.is_some();
    // An earlier profile of this Pod (`cerbos,flagd`) may have added the helper already.
    let mut add_tools_init = classic_added;

    let mut new_volumes = Vec::new();
    let mut volume_count = None;
    if previous.is_none() {
        let entries = volume_entries(spec.volumes).map_err(invalid)?;
        volume_count = entries.as_ref().map(Vec::len);
        let existing = entries.unwrap_or_default();
        let v = &mut new_volumes;
        if let Some(s) = socket {
            ensure_volume(&existing, v, s, "the PDP socket")?;
        }
        if plan.mode == Mode::Sidecar {
            for pv in &profile.volumes {
                ensure_volume(&existing, v, pv.volume.clone(), "the PDP's own files")?;
            }
        }
        if let Some(c) = &classic {
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
            add_tools_init = !named;
        }
        if let Some(m) = mtls_volume(profile) {
            ensure_volume(&existing, v, m, "the mTLS client certificate")?;
        }
        if let Some(t) = tls_volume(profile).filter(|_| wiring.tls) {
            ensure_volume(&existing, v, t, "the PDP's TLS certificates")?;
        }
    }
    let added_volumes: Vec<String> = new_volumes.iter().map(|v| v.name.clone()).collect();

    let ours = app_env(profile, wiring);
    let dependent = (plan.mode == Mode::Daemonset).then_some((
        profile.env_names.address.as_str(),
        profile.env_names.host.as_str(),
    ));
    let our_names: Vec<&str> = ours.iter().map(|e| e.name.as_str()).collect();
    let mut containers_ops = PatchBuilder::default();
    let mut wired = Vec::new();
    // Sets, so that the loop stays linear in the Pod's containers.
    let wanted: BTreeSet<&str> = plan.containers.iter().map(String::as_str).collect();
    let done: BTreeSet<&str> = previous
        .map(|s| s.containers.iter().map(String::as_str).collect())
        .unwrap_or_default();
    for (i, container) in pod.containers().iter().enumerate() {
        let name = container.name.as_str();
        if !wanted.contains(name) || done.contains(name) {
            continue;
        }
        let index = i.to_string();
        let env = relevant_env(container.env, &our_names, || {
            format!("spec.containers[{i}].env")
        })
        .map_err(invalid)?;
        let env_path = pointer(["spec", "containers", &index, "env"]);
        let inserts = ensure_env(
            name,
            env.as_deref().unwrap_or_default(),
            &ours,
            dependent,
            &mut warnings,
        );
        match env {
            None => {
                let mut list: Vec<&EnvVar> = Vec::new();
                for (at, var) in inserts {
                    list.insert(at, var);
                }
                containers_ops.extend(env_path, None, &list);
            }
            Some(_) => {
                for (at, var) in inserts {
                    containers_ops.insert(&env_path, at, var);
                }
            }
        }

        let mounts = parse_list::<MountEntry<'_>>(
            container.volume_mounts,
            &format!("spec.containers[{i}].volumeMounts"),
        )
        .map_err(invalid)?;
        let existing = mounts.as_deref().unwrap_or_default();
        let mut added = Vec::new();
        if with_socket {
            let mount = VolumeMount {
                name: VOLUME_SOCKET.into(),
                mount_path: profile.socket.dir.clone(),
                read_only: Some(true),
                ..Default::default()
            };
            ensure_mount(name, existing, &mut added, mount)?;
        }
        if let Some(m) = &profile.mtls {
            let mount = VolumeMount {
                name: VOLUME_MTLS.into(),
                mount_path: m.mount_path.clone(),
                read_only: Some(true),
                ..Default::default()
            };
            ensure_mount(name, existing, &mut added, mount)?;
        }
        if let Some(t) = profile.tls.as_ref().filter(|_| wiring.tls) {
            let mount = VolumeMount {
                name: VOLUME_TLS.into(),
                mount_path: t.mount_path.clone(),
                read_only: Some(true),
                ..Default::default()
            };
            ensure_mount(name, existing, &mut added, mount)?;
        }
        containers_ops.extend(
            pointer(["spec", "containers", &index, "volumeMounts"]),
            mounts.as_ref().map(Vec::len),
            &added,
        );
        wired.push(name.to_string());
    }

    let mut init_ops = PatchBuilder::default();
    let mut sidecar = None;
    let mut share_processes = false;
    if let Some(container) = pdp_container {
        sidecar = Some(container.name.clone());
        if profile.sidecar.native {
            let list = pointer(["spec", "initContainers"]);
            match (
                spec.init_containers.as_ref().map(Vec::len),
                profile.sidecar.placement,
            ) {
                (None, _) => init_ops.add(list, &[&container]),
                (Some(n), Placement::AfterInit) => init_ops.insert(&list, n, &container),
                (Some(_), Placement::First) => init_ops.insert(&list, 0, &container),
            }
        } else {
            // First among the containers: the kubelet starts them in order, each only once the previous one's
            // postStart hook has returned. After the app containers' patches, whose indices are the Pod's own.
            let list = pointer(["spec", "containers"]);
            let n = spec.containers.as_ref().map(Vec::len);
            match n {
                Some(n) if n > 0 => containers_ops.insert(&list, 0, &container),
                n => containers_ops.extend(list.clone(), n, &[container]),
            }
            if let Some(c) = classic {
                if let Some(watch) = c.watch {
                    // Last among the containers: the kubelet starts it after every app container.
                    containers_ops.insert(&list, n.unwrap_or(0) + 1, &watch);
                    match spec.share_process_namespace {
                        Some(true) => {}
                        None => share_processes = true,
                        Some(false) => {
                            return Err(Denial {
                                reason: Reason::ProcessNamespaceOff,
                                message: format!(
                                    "the Pod sets shareProcessNamespace: false, but the classic sidecar {:?} of a \
                                     Pod that runs to completion (restartPolicy Never or OnFailure) is stopped by \
                                     a container that watches the app's processes in the Pod's shared process \
                                     namespace: remove the field (on Kubernetes 1.29+ the native sidecar needs none \
                                     of this)",
                                    profile.container_name
                                ),
                            });
                        }
                    }
                }
                if add_tools_init {
                    let n = spec.init_containers.as_ref().map(Vec::len);
                    init_ops.extend(pointer(["spec", "initContainers"]), n, &[c.init]);
                }
            }
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

    let mut patch = PatchBuilder::default();
    if previous.is_none() || !wired.is_empty() {
        let mut changed: BTreeMap<&str, String> = BTreeMap::new();
        let status_json = serde_json::to_string(&status).expect("status serializes");
        if pod.annotation(ANNOTATION_STATUS) != Some(status_json.as_str()) {
            changed.insert(ANNOTATION_STATUS, status_json);
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
                changed.insert(ANNOTATION_SAFE_TO_EVICT_LOCAL_VOLUMES, entry);
            }
        }
        // A classic sidecar is first among the containers, where `kubectl logs` and `exec` would pick it.
        if classic_added
            && pod.annotation(ANNOTATION_DEFAULT_CONTAINER).is_none()
            && let Some(first) = pod.containers().first()
        {
            changed.insert(
                ANNOTATION_DEFAULT_CONTAINER,
                first.name.as_str().to_string(),
            );
        }
        let meta = pod.metadata.as_ref();
        match (meta, meta.and_then(|m| m.annotations.as_ref())) {
            _ if changed.is_empty() => {}
            (None, _) => patch.add(
                pointer(["metadata"]),
                &BTreeMap::from([("annotations", &changed)]),
            ),
            (Some(_), None) => patch.add(pointer(["metadata", "annotations"]), &changed),
            (Some(_), Some(_)) => {
                for (key, value) in &changed {
                    patch.add(pointer(["metadata", "annotations", key]), value);
                }
            }
        }
    }
    if share_processes {
        patch.add(pointer(["spec", "shareProcessNamespace"]), &true);
    }
    patch.append(init_ops);
    patch.append(containers_ops);
    patch.extend(pointer(["spec", "volumes"]), volume_count, &new_volumes);
    Ok(Rendered {
        patch: patch.finish(),
        warnings,
        status,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(text: &str) -> Box<RawValue> {
        RawValue::from_string(text.to_string()).unwrap()
    }

    #[test]
    fn env_lists_are_parsed_only_when_they_may_define_ours() {
        let names = ["CERBOS_PDP_ADDR"];
        let what = || "env".to_string();
        // Nothing of ours: not parsed (a malformed entry there is the apiserver's to refuse).
        let plain = raw(r#"[{"name":"A","value":"1"},{"name":5}]"#);
        assert!(
            relevant_env(Some(&plain), &names, what)
                .unwrap()
                .unwrap()
                .is_empty()
        );
        // Ours by name, or spelled with an escape: parsed, and found.
        for text in [
            r#"[{"name":"A","value":"1"},{"name":"CERBOS_PDP_ADDR","value":"x"}]"#,
            r#"[{"name":"CERBOS\u005fPDP_ADDR","value":"x"}]"#,
        ] {
            let list = raw(text);
            let env = relevant_env(Some(&list), &names, what).unwrap().unwrap();
            assert!(
                env.iter().any(|e| e.name.as_str() == "CERBOS_PDP_ADDR"),
                "{text}"
            );
        }
        // Our name as a value only: parsed, nothing found, same answer.
        let value = raw(r#"[{"name":"A","value":"CERBOS_PDP_ADDR"}]"#);
        let env = relevant_env(Some(&value), &names, what).unwrap().unwrap();
        assert_eq!(env.len(), 1);
        // A list that is not a list is parsed, and refused.
        let odd = raw(r#""CERBOS_PDP_ADDR""#);
        assert!(relevant_env(Some(&odd), &names, what).is_err());
        assert!(relevant_env(None, &names, what).unwrap().is_none());
    }

    fn names_and_values(env: &[EnvVar]) -> Vec<(String, String)> {
        env.iter()
            .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
            .collect()
    }

    #[test]
    fn tls_variables_only_on_the_tcp_path() {
        let config = Config::from_yaml(
            "profiles:\n  cerbos:\n    central: {address: \"cerbos.cerbos.svc:3593\"}\n    tls:\n      secretName: s\n      serverName: pdp.example\n",
        )
        .unwrap();
        let p = &config.profiles["cerbos"];
        assert!(!tls_applies(p, Mode::Sidecar));
        let sidecar = app_env(p, Wiring::of(p, Mode::Sidecar, true));
        assert!(
            sidecar
                .iter()
                .all(|e| !e.name.starts_with("CERBOS_PDP_TLS"))
        );
        // Even a wiring that asks for TLS gets none in sidecar mode.
        let forced = Wiring {
            tls: true,
            ..Wiring::of(p, Mode::Sidecar, false)
        };
        assert_eq!(
            app_env(p, forced),
            app_env(p, Wiring::of(p, Mode::Sidecar, false))
        );
        for mode in [Mode::Daemonset, Mode::Central] {
            let env = names_and_values(&app_env(p, Wiring::of(p, mode, false)));
            let tail: Vec<(&str, &str)> = env[env.len() - 3..]
                .iter()
                .map(|(n, v)| (n.as_str(), v.as_str()))
                .collect();
            assert_eq!(
                tail,
                [
                    ("CERBOS_PDP_TLS", "true"),
                    ("CERBOS_PDP_TLS_CA", "/var/run/pdp-injector/tls/ca.crt"),
                    ("CERBOS_PDP_TLS_SERVER_NAME", "pdp.example"),
                ],
                "{mode}"
            );
        }
        // A re-wiring of a Pod first wired without TLS stays without it.
        let without = Wiring {
            tls: false,
            ..Wiring::of(p, Mode::Daemonset, false)
        };
        assert!(
            app_env(p, without)
                .iter()
                .all(|e| !e.name.starts_with("CERBOS_PDP_TLS"))
        );
    }

    /// Injects `pod` in sidecar mode with the classic form (an apiserver before 1.29).
    fn classic(pod: serde_json::Value) -> Result<serde_json::Value, Denial> {
        use crate::core::{NamespaceInfo, Outcome, inject_json};
        let config = Config::builtin().with_classic_sidecars();
        match inject_json(&pod.to_string(), &NamespaceInfo::named("shop"), &config) {
            Outcome::Injected(i) => {
                let mut out = pod.clone();
                json_patch::patch(&mut out, &i.patch).unwrap();
                Ok(out)
            }
            Outcome::Denied(d) => Err(d),
            Outcome::Skipped {
                reason: Reason::AlreadyInjected,
                ..
            } => Ok(pod),
            other => panic!("{other:?}"),
        }
    }

    fn names(list: &serde_json::Value) -> Vec<&str> {
        list.as_array()
            .into_iter()
            .flatten()
            .map(|c| c["name"].as_str().unwrap())
            .collect()
    }

    #[test]
    fn classic_sidecars_go_first_with_their_helper_once_per_pod() {
        let pod = serde_json::json!({
            "metadata": {"name": "p", "namespace": "shop", "labels": {"app": "a"}, "annotations": {
                "pdp-injector.io/inject": "sidecar", "pdp-injector.io/profile": "cerbos,flagd"}},
            "spec": {"restartPolicy": "OnFailure", "initContainers": [{"name": "migrate", "image": "m"}],
                     "containers": [{"name": "app", "image": "a"}, {"name": "worker", "image": "w"}]}});
        let out = classic(pod).unwrap();
        let spec = &out["spec"];
        // Both PDPs ahead of the apps (each profile puts its own first), one helper after the Pod's init, and
        // each PDP's watch container after the apps (the kubelet starts it last).
        assert_eq!(
            names(&spec["containers"]),
            [
                "flagd",
                "cerbos-pdp",
                "app",
                "worker",
                "pdp-injector-watch-cerbos-pdp",
                "pdp-injector-watch-flagd"
            ]
        );
        assert_eq!(spec["shareProcessNamespace"], true);
        let watch = &spec["containers"][4];
        assert_eq!(watch["command"][1], "watch");
        // OnFailure: longer than the kubelet's restart back-off.
        assert_eq!(watch["command"][4], "--grace=330s");
        assert_eq!(
            watch["command"][3],
            format!("--stop={STATE_DIR}/stop-cerbos-pdp")
        );
        assert_eq!(names(&spec["initContainers"]), ["migrate", INIT_TOOLS]);
        let volumes = names(&spec["volumes"]);
        assert_eq!(
            volumes.iter().filter(|v| **v == VOLUME_TOOLS).count(),
            1,
            "{volumes:?}"
        );
        for pdp in &spec["containers"].as_array().unwrap()[..2] {
            let name = pdp["name"].as_str().unwrap();
            let hook = pdp["lifecycle"]["postStart"]["exec"]["command"].to_string();
            assert!(
                hook.contains("\"wait\"")
                    && hook.contains(&format!("--record={STATE_DIR}/{name}.pids")),
                "{hook}"
            );
            assert_eq!(
                pdp["livenessProbe"]["exec"]["command"][2],
                format!("{STATE_DIR}/stop-{name}")
            );
        }
        // No label, no annotation for a watch by the webhook: it needs no Pod right.
        assert_eq!(out["metadata"]["labels"], serde_json::json!({"app": "a"}));
        assert_eq!(
            out["metadata"]["annotations"][ANNOTATION_DEFAULT_CONTAINER],
            "app"
        );
        // The wired apps are the Pod's own, found by name after the PDPs moved in front of them.
        assert!(
            spec["containers"][2]["env"]
                .to_string()
                .contains("CERBOS_PDP_ADDR")
        );
        assert!(spec["containers"][3]["env"].to_string().contains("FLAGD_"));
        // Injecting the result again changes nothing (a reinvocation).
        assert_eq!(classic(out.clone()).map_err(|d| d.message), Ok(out));
    }

    #[test]
    fn a_pod_that_turns_off_the_shared_process_namespace_is_refused() {
        let pod = serde_json::json!({
            "metadata": {"name": "p", "namespace": "shop", "annotations": {"pdp-injector.io/inject": "sidecar"}},
            "spec": {"restartPolicy": "Never", "shareProcessNamespace": false,
                     "containers": [{"name": "app", "image": "a"}]}});
        let denial = classic(pod.clone()).unwrap_err();
        assert_eq!(denial.reason, Reason::ProcessNamespaceOff);
        assert!(
            denial.message.contains("shareProcessNamespace: false"),
            "{}",
            denial.message
        );
        // Set to true by the Pod: kept, and not written again.
        let mut on = pod.clone();
        on["spec"]["shareProcessNamespace"] = true.into();
        let out = classic(on).unwrap();
        assert_eq!(out["spec"]["shareProcessNamespace"], true);
        // A Pod that keeps running has no watch container and shares nothing.
        let mut always = pod;
        always["spec"]["restartPolicy"] = "Always".into();
        always["spec"]
            .as_object_mut()
            .unwrap()
            .remove("shareProcessNamespace");
        let out = classic(always).unwrap();
        assert!(out["spec"].get("shareProcessNamespace").is_none());
        assert_eq!(names(&out["spec"]["containers"]), ["cerbos-pdp", "app"]);
    }

    #[test]
    fn a_container_named_like_the_helper_is_a_clash() {
        let pod = serde_json::json!({
            "metadata": {"name": "p", "annotations": {"pdp-injector.io/inject": "sidecar"}},
            "spec": {"initContainers": [{"name": INIT_TOOLS, "image": "x"}],
                     "containers": [{"name": "app", "image": "a"}]}});
        let denial = classic(pod).unwrap_err();
        assert_eq!(denial.reason, Reason::NameCollision);
        assert!(
            denial.message.contains("pdp-injector-tools"),
            "{}",
            denial.message
        );
    }

    #[test]
    fn ipv6_nodes_get_a_bracketed_daemonset_address() {
        let config = Config::builtin();
        let p = &config.profiles["cerbos"];
        let v6 = Wiring {
            family: NodeAddressFamily::IPv6,
            ..Wiring::of(p, Mode::Daemonset, false)
        };
        let addr = |w: Wiring| {
            app_env(p, w)
                .into_iter()
                .find(|e| e.name == "CERBOS_PDP_ADDR")
                .and_then(|e| e.value)
                .unwrap()
        };
        assert_eq!(addr(v6), "[$(CERBOS_PDP_HOST)]:3593");
        assert_eq!(
            addr(Wiring::of(p, Mode::Daemonset, false)),
            "$(CERBOS_PDP_HOST):3593"
        );
        // 127.0.0.1 is on every Pod's loopback, IPv6-only clusters included.
        let sidecar = Wiring {
            family: NodeAddressFamily::IPv6,
            ..Wiring::of(p, Mode::Sidecar, false)
        };
        assert_eq!(addr(sidecar), "127.0.0.1:3593");
    }
}
