//! The core pipeline shared by the webhook, the offline `inject` command and the tests:
//! decide -> render onto a copy -> patch = diff(before, after). Synchronous, no I/O.

use k8s_openapi::api::core::v1::Pod;

use crate::config::{Config, Mode};
use crate::core::patch::diff_pods;
use crate::core::render::render;
use crate::core::{Decision, Denial, NamespaceInfo, Plan, Reason, Warning, decide};

/// A Pod that gets wired.
#[derive(Debug, Clone)]
pub struct Injected {
    /// `injected_sidecar`, `injected_daemonset`, `injected_central` or `rewired`.
    pub reason: Reason,
    /// The wiring.
    pub mode: Mode,
    /// The profile used.
    pub profile: String,
    /// The Pod as it will be stored.
    pub pod: Pod,
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

/// Decides and renders for one Pod in one namespace.
pub fn inject(pod: &Pod, ns: &NamespaceInfo, config: &Config) -> Outcome {
    let plan = match decide(pod, ns, config) {
        Decision::Skip(reason, warnings) => return Outcome::Skipped { reason, warnings },
        Decision::Deny(denial) => return Outcome::Denied(denial),
        Decision::Inject(plan) => *plan,
    };
    wire(pod, plan, config)
}

/// Renders a plan that [`decide`] made for `pod`.
pub fn wire(pod: &Pod, plan: Plan, config: &Config) -> Outcome {
    let rendered = match render(pod, &plan, config) {
        Ok(r) => r,
        Err(denial) => return Outcome::Denied(denial),
    };
    let patch = diff_pods(pod, &rendered.pod);
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
        (None, Mode::Central) => Reason::InjectedCentral,
    };
    Outcome::Injected(Box::new(Injected {
        reason,
        mode: plan.mode,
        profile: plan.profile,
        pod: rendered.pod,
        patch,
        warnings: rendered.warnings,
    }))
}
