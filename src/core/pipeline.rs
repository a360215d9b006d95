//! The core pipeline shared by the webhook, the offline `inject` command and the tests:
//! view of the Pod -> decide -> render the wiring as a patch. Synchronous, no I/O.

use k8s_openapi::api::core::v1::Pod;

use crate::config::{Config, Mode};
use crate::core::render::render;
use crate::core::view::{PodView, pod_json};
use crate::core::{Decision, Denial, NamespaceInfo, Plan, Reason, Warning, decide};

/// A Pod that gets wired.
#[derive(Debug, Clone)]
pub struct Injected {
    /// `injected_sidecar`, `injected_daemonset` or `rewired`.
    pub reason: Reason,
    /// The wiring.
    pub mode: Mode,
    /// The profile used.
    pub profile: String,
    /// What the status annotation records after this wiring.
    pub status: crate::core::Status,
    /// RFC 6902 patch from the input Pod to `pod`; never empty.
    pub patch: json_patch::Patch,
    /// Warnings for the user.
    pub warnings: Vec<Warning>,
}

/// What the core decided for one Pod.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// Wired, with a non-empty patch.
    Injected(Box<Injected>),
    /// Left alone.
    Skipped {
        /// Why.
        reason: Reason,
        /// Anything the user should still know.
        warnings: Vec<Warning>,
    },
    /// Refused.
    Denied(Denial),
}

impl Outcome {
    /// The reason code.
    pub fn reason(&self) -> Reason {
        match self {
            Outcome::Injected(i) => i.reason,
            Outcome::Skipped { reason, .. } => *reason,
            Outcome::Denied(d) => d.reason,
        }
    }

    /// `inject`, `skip` or `deny`: the decision label in logs and metrics.
    pub fn decision(&self) -> &'static str {
        match self {
            Outcome::Injected(_) => "inject",
            Outcome::Skipped { .. } => "skip",
            Outcome::Denied(_) => "deny",
        }
    }

    /// The warnings for the user.
    pub fn warnings(&self) -> &[Warning] {
        match self {
            Outcome::Injected(i) => &i.warnings,
            Outcome::Skipped { warnings, .. } => warnings,
            Outcome::Denied(_) => &[],
        }
    }
}

/// Decides and renders for one Pod, given as its JSON, in one namespace: the webhook's path.
pub fn inject_json(pod: &str, ns: &NamespaceInfo, config: &Config) -> Outcome {
    match PodView::parse(pod) {
        Ok(view) => inject_view(&view, ns, config),
        Err(e) => Outcome::Denied(Denial {
            reason: Reason::InvalidObject,
            message: format!("the object is not a valid v1 Pod: {e}"),
        }),
    }
}

/// Decides and renders for one typed Pod (the offline command, tests): through its JSON, so exactly the
/// webhook's path.
pub fn inject(pod: &Pod, ns: &NamespaceInfo, config: &Config) -> Outcome {
    inject_json(&pod_json(pod), ns, config)
}

/// Decides and renders for the view of a Pod.
pub fn inject_view(pod: &PodView<'_>, ns: &NamespaceInfo, config: &Config) -> Outcome {
    let plan = match decide(pod, ns, config) {
        Decision::Skip(reason, warnings) => return Outcome::Skipped { reason, warnings },
        Decision::Deny(denial) => return Outcome::Denied(denial),
        Decision::Inject(plan) => *plan,
    };
    wire(pod, plan, config)
}

/// Renders a plan that [`decide`] made for `pod`.
pub fn wire(pod: &PodView<'_>, plan: Plan, config: &Config) -> Outcome {
    let rendered = match render(pod, &plan, config) {
        Ok(r) => r,
        Err(denial) => return Outcome::Denied(denial),
    };
    let patch = rendered.patch;
    if patch.0.is_empty() {
        return Outcome::Skipped {
            reason: Reason::AlreadyInjected,
            warnings: rendered.warnings,
        };
    }
    let reason = match (&plan.previous, plan.mode) {
        (Some(_), _) => Reason::Rewired,
        (None, Mode::Sidecar) => Reason::InjectedSidecar,
        (None, Mode::Daemonset) => Reason::InjectedDaemonset,
    };
    Outcome::Injected(Box::new(Injected {
        reason,
        mode: plan.mode,
        profile: plan.profile,
        status: rendered.status,
        patch,
        warnings: rendered.warnings,
    }))
}

/// `pod` with `patch` applied, as the apiserver would store it (the offline command and tests show it).
pub fn patched(pod: &Pod, patch: &json_patch::Patch) -> Result<Pod, String> {
    let mut doc = serde_json::to_value(pod).map_err(|e| e.to_string())?;
    json_patch::patch(&mut doc, patch).map_err(|e| format!("the patch does not apply: {e}"))?;
    serde_json::from_value(doc).map_err(|e| format!("the patched object is not a Pod: {e}"))
}
