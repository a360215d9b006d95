//! The PDP container of sidecar mode: its native form (an init container that keeps running) and its classic
//! form for clusters without native sidecars (first among the containers, held by a `postStart` hook, stopped
//! by a watch container in a Pod that runs to completion).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EmptyDirVolumeSource, ExecAction, HTTPGetAction, Lifecycle,
    LifecycleHandler, Probe, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::config::{Config, Profile, restricted_security_context};
use crate::names::{
    INIT_TOOLS, STATE_DIR, TOOLS_BINARY_IN_IMAGE, TOOLS_DIR, VOLUME_SOCKET, VOLUME_STATE,
    VOLUME_TOOLS, WATCH_PREFIX,
};

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
pub(super) struct Classic {
    /// The init container that copies `pdp-await`.
    pub(super) init: Container,
    /// The emptyDir of the helper, and in a Pod that runs to completion the shared state emptyDir.
    pub(super) volumes: Vec<Volume>,
    /// In a Pod that runs to completion: the watch container, last among the containers.
    pub(super) watch: Option<Container>,
}

/// Turns the PDP container into the classic form: first among the containers (the caller puts it there), with
/// a `postStart` hook that returns only once its health check answers (the kubelet starts the next container
/// only after that hook), and in a Pod that runs to completion a liveness probe that fails once the watch
/// container (last, so started after the apps) has seen no app process left in the Pod's shared process
/// namespace: the kubelet then stops the PDP and, under `Never`/`OnFailure`, leaves it stopped (Cerbos exits 0
/// on SIGTERM, so the Pod succeeds). Nothing here needs an API call or a Pod write right.
pub(super) fn classic_sidecar(
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
            volume_mounts: Some(vec![state_mount]),
            ..helper_container(
                &format!("{WATCH_PREFIX}{}", container.name),
                config,
                vec![
                    TOOLS_BINARY_IN_IMAGE.into(),
                    "watch".into(),
                    format!("--state={STATE_DIR}"),
                    format!("--stop={stop}"),
                    format!("--grace={grace}"),
                ],
            )
        });
    }
    let init = Container {
        volume_mounts: Some(vec![VolumeMount {
            name: VOLUME_TOOLS.into(),
            mount_path: TOOLS_DIR.into(),
            ..Default::default()
        }]),
        ..helper_container(
            INIT_TOOLS,
            config,
            vec![
                TOOLS_BINARY_IN_IMAGE.into(),
                "install".into(),
                TOOLS_DIR.into(),
            ],
        )
    };
    Classic {
        init,
        volumes,
        watch,
    }
}

/// A container of the project's own image running `pdp-await` (the classic sidecar's init and watch containers,
/// the start-up gate): small, restricted, as a non-root user.
pub(super) fn helper_container(name: &str, config: &Config, command: Vec<String>) -> Container {
    Container {
        name: name.into(),
        image: Some(config.tools_image.clone()),
        image_pull_policy: Some("IfNotPresent".into()),
        command: Some(command),
        resources: Some(helper_resources()),
        security_context: Some(restricted_security_context(Some(65532))),
        termination_message_path: Some("/dev/termination-log".into()),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Default::default()
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
