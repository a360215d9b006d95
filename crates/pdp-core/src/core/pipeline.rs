//! The core pipeline shared by the webhook, the offline `inject` command and the tests:
//! view of the Pod -> decide -> render the wiring as a patch. Synchronous, no I/O.

use k8s_openapi::api::core::v1::Pod;

use crate::config::{Config, Mode, Profile, PssLevel};
use crate::core::decide::{
    StatusDoubt, forged_status, missing_wiring, plan_profile, pod_profiles, status_key,
};
use crate::core::patch::{Form, JsonPatch};
use crate::core::render::{Wiring, app_env, render, tls_applies};
use crate::core::view::{PodView, Str, pod_json};
use crate::core::{Decision, Denial, NamespaceInfo, Plan, Reason, Status, Warning, decide};
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
    /// What the status annotation records after this wiring.
    pub status: crate::core::Status,
    /// RFC 6902 patch from the input Pod to `pod`; never empty.
    pub patch: JsonPatch,
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
    inject_json_as(pod, ns, config, Form::Wire)
}

fn inject_json_as(pod: &str, ns: &NamespaceInfo, config: &Config, form: Form) -> Outcome {
    match PodView::parse(pod) {
        Ok(view) => inject_view_as(&view, ns, config, form),
        Err(e) => Outcome::Denied(Denial::invalid_object(e)),
    }
}

/// Decides and renders for one typed Pod (tests, `check`): through its JSON, so exactly the webhook's path.
pub fn inject(pod: &Pod, ns: &NamespaceInfo, config: &Config) -> Outcome {
    inject_as(pod, ns, config, Form::Wire)
}

/// [`inject`] with the patch's values in `form`: [`Form::Apply`] for a caller that applies the patch.
pub fn inject_as(pod: &Pod, ns: &NamespaceInfo, config: &Config, form: Form) -> Outcome {
    inject_json_as(&pod_json(pod), ns, config, form)
}

/// Containers and init containers together that a Pod may have to be wired. Real Pods have a handful (a
/// sidecar-heavy Pod a dozen or two); the bound keeps what one review costs small (SECURITY.md, "Cost of one
/// review") whatever the body limit lets in: about 100,000 containers fit in the apiserver's 3 MiB.
pub const MAX_CONTAINERS: usize = 128;

/// Operations one wiring's patch may have: far above what [`MAX_CONTAINERS`] containers need (a few each).
pub const MAX_PATCH_OPS: usize = 4096;

/// Bytes one wiring's patch may take as JSON (the response carries it in base64, a third more).
pub const MAX_PATCH_BYTES: usize = 1024 * 1024;

/// Decides and renders for the view of a Pod (the webhook's answer copies the patch).
pub fn inject_view(pod: &PodView<'_>, ns: &NamespaceInfo, config: &Config) -> Outcome {
    inject_view_as(pod, ns, config, Form::Wire)
}

/// [`inject_view`] with the patch's values in `form`.
pub fn inject_view_as(
    pod: &PodView<'_>,
    ns: &NamespaceInfo,
    config: &Config,
    form: Form,
) -> Outcome {
    let plan = match decide(pod, ns, config) {
        Decision::Skip(reason, warnings) => return Outcome::Skipped { reason, warnings },
        Decision::Deny(denial) => return Outcome::Denied(denial),
        Decision::Inject(plan) => *plan,
    };
    // Only a Pod that would be wired is bounded: the others cost a parse and are none of the injector's business.
    let containers = pod.containers().len() + pod.init_containers().len();
    if containers > MAX_CONTAINERS {
        return Outcome::Denied(Denial::pod_too_large(format!(
            "the Pod has {containers} containers and init containers, more than {MAX_CONTAINERS}"
        )));
    }
    wire(pod, plan, config, form)
}

/// Renders a plan that [`decide`] made for `pod`, then each further profile the Pod lists; the patch's values in
/// `form`.
pub fn wire(pod: &PodView<'_>, plan: Plan, config: &Config, form: Form) -> Outcome {
    // The list as the Pod gives it; decide has checked it. A re-wiring's first profile is the recorded one.
    let listed = pod_profiles(pod, config).unwrap_or_default();
    // Further profiles are rendered against the Pod with the patch so far applied: its values as trees, so that
    // applying it parses nothing back (they are written as the same bytes).
    let form = if listed.len() > 1 { Form::Apply } else { form };
    let rendered =
        match plan_profile(pod, &plan, config).and_then(|p| render(pod, &plan, p, config, form)) {
            Ok(r) => r,
            Err(denial) => return Outcome::Denied(denial),
        };
    let (patch, warnings) = match wire_more(
        rendered.patch,
        rendered.warnings,
        pod,
        &listed,
        &plan,
        config,
    ) {
        Ok(r) => r,
        Err(denial) => return Outcome::Denied(denial),
    };
    if patch.is_empty() {
        return Outcome::Skipped {
            reason: Reason::AlreadyInjected,
            warnings,
        };
    }
    if patch.len() > MAX_PATCH_OPS {
        return Outcome::Denied(Denial::pod_too_large(format!(
            "wiring the Pod takes {} patch operations, more than {MAX_PATCH_OPS}",
            patch.len()
        )));
    }
    let bytes = patch.json_len();
    if bytes > MAX_PATCH_BYTES {
        return Outcome::Denied(Denial::pod_too_large(format!(
            "wiring the Pod takes a patch of {bytes} bytes, more than {MAX_PATCH_BYTES}"
        )));
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
        status: rendered.status,
        patch,
        warnings,
    }))
}

/// Wires the profiles after the first of a `pdp-injector.io/profile` comma list, each as if it were alone: its
/// own plan (the first profile's mode, containers and Pod Security level), its own status annotation
/// ([`status_key`]) and its own reinvocation. Each is rendered against the Pod's sections with the patches so
/// far applied, so its operations apply in sequence after them. Two profiles that would write the same
/// variable, container, port or volume are refused, naming both.
fn wire_more(
    first: JsonPatch,
    mut warnings: Vec<Warning>,
    input: &PodView<'_>,
    listed: &[String],
    plan: &Plan,
    config: &Config,
) -> Result<(JsonPatch, Vec<Warning>), Denial> {
    if listed.len() < 2 {
        return Ok((first, warnings));
    }
    let internal = Denial::invalid_object;
    // One view of the Pod for every further profile, borrowing the input's: each patch is recorded in it,
    // so nothing of the Pod is copied or parsed again.
    let mut current = input.overlay();
    current.apply(&first).map_err(internal)?;
    let mut ops = first.0;
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
        // The status of this profile is the Pod's own: judged against the Pod as it came.
        let own = input.annotation(&key);
        let previous: Option<Status> = match own {
            None => None,
            Some(raw) => {
                let doubt = match serde_json::from_str::<Status>(raw) {
                    Ok(s) if s.profile != *name => Err(StatusDoubt::Unreadable(format!(
                        "names profile {:?}, not {name:?}",
                        s.profile
                    ))),
                    Ok(s) => match missing_wiring(input, &s, config) {
                        None => Ok(s),
                        Some(what) => Err(StatusDoubt::NotCarried(what)),
                    },
                    Err(_) => Err(StatusDoubt::Unreadable("is not a valid status".into())),
                };
                match doubt {
                    Ok(s) => Some(s),
                    Err(doubt) => match &plan.required {
                        Some(ns) => return Err(forged_status(ns, &key, doubt)),
                        None => {
                            warnings.push(doubt.warning(&key));
                            None
                        }
                    },
                }
            }
        };
        let sub = Plan {
            mode: previous.as_ref().map_or(plan.mode, |s| s.mode),
            profile: name.clone(),
            containers: plan.containers.clone(),
            pss: plan.pss,
            previous,
            warnings: vec![],
            required: plan.required.clone(),
        };
        // render reads and writes pdp-injector.io/status: lend it this profile's status for the call, and move
        // what it writes there to the profile's own key.
        let lent = lend_status(&mut current, &key, own);
        let out = plan_profile(&current, &sub, config)
            .and_then(|p| render(&current, &sub, p, config, Form::Apply));
        restore_status(&mut current, lent);
        let out = out?;
        // Pointers from their tokens (RFC 6901 escapes `~` and `/`), as every other path of the patch.
        let status_path = super::patch::pointer(["metadata", "annotations", ANNOTATION_STATUS]);
        let own_path = super::patch::pointer(["metadata", "annotations", key.as_str()]);
        let mut moved = out.patch;
        for op in &mut moved.0 {
            if op.path == status_path {
                op.path = own_path.clone();
            }
        }
        current.apply(&moved).map_err(internal)?;
        ops.extend(moved.0);
        warnings.extend(out.warnings);
    }
    Ok((JsonPatch(ops), warnings))
}

/// What [`lend_status`] took from the view's annotations, to put back.
type Lent<'a> = Vec<(Str<'a>, Str<'a>)>;

/// Puts `value` (the status under `key`) in the view as `pdp-injector.io/status`, taking out what was there.
fn lend_status<'a>(view: &mut PodView<'a>, key: &str, value: Option<&'a str>) -> Lent<'a> {
    let Some(map) = view.metadata.as_mut().and_then(|m| m.annotations.as_mut()) else {
        return Vec::new();
    };
    let (taken, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut map.0)
        .into_iter()
        .partition(|(k, _)| k.as_str() == ANNOTATION_STATUS || k.as_str() == key);
    map.0 = kept;
    if let Some(v) = value {
        map.0.push((
            Str(std::borrow::Cow::Borrowed(ANNOTATION_STATUS)),
            Str(std::borrow::Cow::Borrowed(v)),
        ));
    }
    taken
}

/// Undoes [`lend_status`].
fn restore_status<'a>(view: &mut PodView<'a>, lent: Lent<'a>) {
    if let Some(map) = view.metadata.as_mut().and_then(|m| m.annotations.as_mut()) {
        map.0.retain(|(k, _)| k.as_str() != ANNOTATION_STATUS);
        map.0.extend(lent);
    }
}

/// What two profiles wired into one Pod in `mode` would both claim, if anything.
fn clash(a: &Profile, b: &Profile, mode: Mode, pss: PssLevel) -> Option<String> {
    // Every name the profile may write in this mode: the sidecar's set (host, port, address, socket, appEnv)
    // and, on the TCP path, the TLS variables.
    let names = |p: &Profile| -> Vec<String> {
        let mut names: Vec<String> = app_env(p, Wiring::of(p, Mode::Sidecar, true))
            .into_iter()
            .map(|e| e.name)
            .collect();
        if tls_applies(p, mode)
            && let Some(t) = p.tls_env_names()
        {
            names.extend([t.flag, t.ca, t.server_name, t.cert, t.key]);
        }
        names
    };
    let theirs = names(b);
    if let Some(var) = names(a).into_iter().find(|n| theirs.contains(n)) {
        return Some(format!("both set {var} in app containers"));
    }
    if a.mtls.is_some() && b.mtls.is_some() {
        return Some("both mount a client mTLS Secret as volume pdp-injector-mtls".into());
    }
    if tls_applies(a, mode) && tls_applies(b, mode) {
        return Some(format!(
            "both mount a TLS Secret as volume {}: give the TLS to one of them only",
            crate::names::VOLUME_TLS
        ));
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

/// `pod` with `patch` applied, as the apiserver would store it (the offline command and tests show it).
pub fn patched(pod: &Pod, patch: &JsonPatch) -> Result<Pod, String> {
    let mut doc = serde_json::to_value(pod).map_err(|e| e.to_string())?;
    patch
        .apply(&mut doc)
        .map_err(|e| format!("the patch does not apply: {e}"))?;
    serde_json::from_value(doc).map_err(|e| format!("the patched object is not a Pod: {e}"))
}
