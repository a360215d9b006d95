//! The PDP's containers a pass adds: the start-up gate, the PDP container, and its place among the Pod's.

use k8s_openapi::api::core::v1::Container;

use super::env::{node_address, node_host_var};
use super::sidecar::{classic_sidecar, helper_container, sidecar_container};
use super::{Gate, PdpContainer, Placed, collision};
use crate::config::{Config, Mode, Placement, Profile};
use crate::core::patch::{PatchBuilder, pointer};
use crate::core::view::{PodView, SpecView};
use crate::core::{Denial, Plan, Reason};
use crate::names::{INIT_AWAIT, TOOLS_BINARY_IN_IMAGE};

/// The init container that holds the app until its node's PDP answers (the profile's `awaitNode`), on a first
/// daemonset-mode pass of a Pod whose socket does not come by CSI (whose publish already waits for the PDP) and
/// that is not wired with TLS (the gate asks in plaintext; `held` is true in both cases).
/// It asks for the profile's health check on the node's HTTP port, which the node's front forwards to the
/// newest PDP instance: it passes once a PDP serves, not merely once the front listens.
pub(super) fn gate_container(
    pod: &PodView<'_>,
    plan: &Plan,
    profile: &Profile,
    config: &Config,
    held: bool,
) -> Result<Option<Gate>, Denial> {
    if plan.mode != Mode::Daemonset || plan.previous.is_some() || !profile.await_node || held {
        return Ok(None);
    }
    let target = format!(
        "{}{}",
        node_address(profile, config.node_address_family, profile.health.port),
        profile.health.path
    );
    let gate = Container {
        env: Some(vec![node_host_var(profile)]),
        // Bounded: past it the container fails and the kubelet starts it again after its back-off (a Pod that
        // never restarts fails instead of starting without its PDP).
        ..helper_container(
            INIT_AWAIT,
            config,
            vec![
                TOOLS_BINARY_IN_IMAGE.into(),
                "wait".into(),
                "--http".into(),
                target,
                "--timeout".into(),
                "300s".into(),
            ],
        )
    };
    let mut same_name = pod
        .init_containers()
        .iter()
        .chain(pod.containers())
        .filter(|c| c.name.as_str() == INIT_AWAIT);
    match same_name.next() {
        None => Ok(Some(Gate::Add(Box::new(gate)))),
        // The gate of an earlier wiring whose status was not believed: kept, and recorded again.
        Some(c)
            if pod.init_containers().iter().any(|i| std::ptr::eq(i, c))
                && c.command
                    .and_then(|raw| serde_json::from_str::<Vec<String>>(raw.get()).ok())
                    == gate.command =>
        {
            Ok(Some(Gate::Present))
        }
        Some(_) => Err(collision(format!(
            "the Pod already has a container named {INIT_AWAIT:?}, which pdp-injector adds to hold the app \
             until its node's PDP answers (the profile's awaitNode): rename that container"
        ))),
    }
}

pub(super) fn pdp_container(
    spec: &SpecView<'_>,
    plan: &Plan,
    profile: &Profile,
    config: &Config,
) -> Option<PdpContainer> {
    if plan.mode != Mode::Sidecar || plan.previous.is_some() {
        return None;
    }
    let policy = spec.restart_policy.as_ref().map(|p| p.as_str());
    let run_to_completion = matches!(policy, Some("Never" | "OnFailure"));
    let on_failure = policy == Some("OnFailure");
    let mut container = sidecar_container(profile);
    let classic = (!profile.sidecar.native).then(|| {
        classic_sidecar(
            &mut container,
            profile,
            config,
            run_to_completion,
            on_failure,
        )
    });
    Some(PdpContainer { container, classic })
}

/// Puts the PDP container in its place: a native sidecar among the init containers, a classic one first
/// among the containers with its watch container last and its helper's init container.
pub(super) fn place_pdp(
    spec: &SpecView<'_>,
    profile: &Profile,
    pdp: Option<PdpContainer>,
    add_tools_init: bool,
    containers_ops: &mut PatchBuilder,
) -> Result<Placed, Denial> {
    let mut placed = Placed {
        sidecar: None,
        init_ops: PatchBuilder::new(containers_ops.form()),
        share_processes: false,
    };
    let Some(PdpContainer { container, classic }) = pdp else {
        return Ok(placed);
    };
    placed.sidecar = Some(container.name.clone());
    let init_ops = &mut placed.init_ops;
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
        return Ok(placed);
    }
    // First among the containers: the kubelet starts them in order, each only once the previous one's
    // postStart hook has returned. After the app containers' patches, whose indices are the Pod's own.
    let list = pointer(["spec", "containers"]);
    let n = spec.containers.as_ref().map(Vec::len);
    match n {
        Some(n) if n > 0 => containers_ops.insert(&list, 0, &container),
        n => containers_ops.extend(list.clone(), n, &[container]),
    }
    let Some(c) = classic else {
        return Ok(placed);
    };
    if let Some(watch) = c.watch {
        // Last among the containers: the kubelet starts it after every app container.
        containers_ops.insert(&list, n.unwrap_or(0) + 1, &watch);
        match spec.share_process_namespace {
            Some(true) => {}
            None => placed.share_processes = true,
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
        placed
            .init_ops
            .extend(pointer(["spec", "initContainers"]), n, &[c.init]);
    }
    Ok(placed)
}
