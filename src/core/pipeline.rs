//! The core pipeline shared by the webhook, the offline `inject` command and the tests:
//! decide -> render onto a copy -> patch = diff(before, after). Synchronous, no I/O.

use k8s_openapi::api::core::v1::Pod;

use crate::config::{Config, Mode, Profile, PssLevel};
use crate::core::decide::{pod_profiles, status_key};
use crate::core::patch::diff_pods;
use crate::core::render::{app_env, render};
use crate::core::{
    Decision, Denial, NamespaceInfo, Plan, Reason, Status, Warning, WarningCode, decide,
};
use crate::names::ANNOTATION_STATUS;

/// A Pod that gets wired.
#[derive(Debug, Clone)]
pub struct Injected {
    /// `injected_sidecar`, `injected_daemonset`, `injected_central` or `rewired`.
    pub reason: Reason,
    /// The wiring.
    pub mode: Mode,
    /// The profile used (the first, when the Pod lists several).
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

/// Renders a plan that [`decide`] made for `pod`, then each further profile the Pod lists.
pub fn wire(pod: &Pod, plan: Plan, config: &Config) -> Outcome {
    let rendered = match render(pod, &plan, config) {
        Ok(r) => r,
        Err(denial) => return Outcome::Denied(denial),
    };
    let (out, warnings) = match wire_more(rendered.pod, rendered.warnings, pod, &plan, config) {
        Ok(r) => r,
        Err(denial) => return Outcome::Denied(denial),
    };
    let patch = diff_pods(pod, &out);
    if patch.0.is_empty() {
        return Outcome::Skipped {
            reason: Reason::AlreadyInjected,
            warnings,
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
        pod: out,
        patch,
        warnings,
    }))
}

/// Wires the profiles after the first of a `pdp-injector.io/profile` comma list, each as if it were alone: its
/// own plan (the first profile's mode, containers and Pod Security level), its own status annotation
/// ([`status_key`]) and its own reinvocation. `current` is the Pod with the first profile rendered. Two profiles
/// that would write the same variable, container, port or volume are refused, naming both.
fn wire_more(
    mut current: Pod,
    mut warnings: Vec<Warning>,
    input: &Pod,
    plan: &Plan,
    config: &Config,
) -> Result<(Pod, Vec<Warning>), Denial> {
    // The list as the Pod gives it; decide has checked it. A re-wiring's first profile is the recorded one.
    let Ok(listed) = pod_profiles(input, config) else {
        return Ok((current, warnings));
    };
    if listed.len() < 2 {
        return Ok((current, warnings));
    }
    let mut done: Vec<&str> = vec![plan.profile.as_str()];
    for name in listed.iter().filter(|p| **p != plan.profile) {
        let profile = &config.profiles[name];
        for other in &done {
            if let Some(why) = clash(&config.profiles[*other], profile, plan.mode, plan.pss) {
                return Err(Denial {
                    reason: Reason::NameCollision,
                    message: format!(
                        "profiles {other:?} and {name:?} cannot both be wired into this Pod in {} mode: {why}",
                        plan.mode
                    ),
                });
            }
        }
        done.push(name);
        let key = status_key(name);
        let annotations = current
            .metadata
            .annotations
            .get_or_insert_with(Default::default);
        let previous: Option<Status> = match annotations.get(&key) {
            None => None,
            Some(raw) => match serde_json::from_str(raw) {
                Ok(s) => Some(s),
                Err(e) => {
                    warnings.push(Warning {
                        code: WarningCode::StatusUnreadable,
                        message: format!(
                            "annotation {key} is not valid JSON ({e}); profile {name:?} is left as it is"
                        ),
                    });
                    continue;
                }
            },
        };
        let sub = Plan {
            mode: previous.as_ref().map_or(plan.mode, |s| s.mode),
            profile: name.clone(),
            containers: plan.containers.clone(),
            pss: plan.pss,
            previous,
            warnings: vec![],
        };
        // render reads and writes pdp-injector.io/status: lend it this profile's status for the call.
        let first = annotations.remove(ANNOTATION_STATUS);
        if let Some(raw) = annotations.remove(&key) {
            annotations.insert(ANNOTATION_STATUS.into(), raw);
        }
        let mut out = render(&current, &sub, config)?;
        let annotations = out
            .pod
            .metadata
            .annotations
            .get_or_insert_with(Default::default);
        if let Some(raw) = annotations.remove(ANNOTATION_STATUS) {
            annotations.insert(key, raw);
        }
        if let Some(raw) = first {
            annotations.insert(ANNOTATION_STATUS.into(), raw);
        }
        warnings.extend(out.warnings);
        current = out.pod;
    }
    Ok((current, warnings))
}

/// What two profiles wired into one Pod in `mode` would both claim, if anything.
fn clash(a: &Profile, b: &Profile, mode: Mode, pss: PssLevel) -> Option<String> {
    let names = |p: &Profile| -> Vec<String> {
        app_env(p, Mode::Sidecar, true)
            .into_iter()
            .map(|e| e.name)
            .collect()
    };
    let theirs = names(b);
    if let Some(var) = names(a).into_iter().find(|n| theirs.contains(n)) {
        return Some(format!("both set {var} in app containers"));
    }
    if a.mtls.is_some() && b.mtls.is_some() {
        return Some("both mount a client mTLS Secret as volume pdp-injector-mtls".into());
    }
    match mode {
        Mode::Sidecar => {
            if a.container_name == b.container_name {
                return Some(format!("both add a container named {:?}", a.container_name));
            }
            let ports = |p: &Profile| {
                let mut v: Vec<u16> = p.ports.iter().map(|n| n.port).collect();
                v.push(p.health.port);
                v
            };
            let theirs = ports(b);
            if let Some(port) = ports(a).into_iter().find(|n| theirs.contains(n)) {
                return Some(format!("both sidecars listen on port {port} of the Pod"));
            }
            if let Some(v) = a
                .volumes
                .iter()
                .find(|v| b.volumes.iter().any(|w| w.volume.name == v.volume.name))
            {
                return Some(format!("both add a volume named {:?}", v.volume.name));
            }
            if a.sidecar.unix_socket && b.sidecar.unix_socket {
                return Some("both share their socket as volume pdp-injector-socket".into());
            }
        }
        Mode::Daemonset if pss == PssLevel::Privileged && a.host_socket && b.host_socket => {
            return Some(
                "both mount their node's socket as volume pdp-injector-socket; use a profile without it \
                 (hostSocket: false, as flagd-node) for one of them"
                    .into(),
            );
        }
        Mode::Daemonset | Mode::Central => {}
    }
    None
}
