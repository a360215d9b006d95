//! Decide whether a Pod is wired, how, and why: the precedence table of SPEC.md as one pure function.

mod carried;
mod namespace;

use namespace::{NAMESPACE_VALUES, POD_VALUES, PodChoice, parse_choice};

use crate::config::{Config, Mode, Profile, PssLevel};
use crate::core::codes::{Denial, Reason, Warning, WarningCode};
use crate::core::status::Status;
use crate::core::view::PodView;
use crate::names::{
    ANNOTATION_CONTAINERS, ANNOTATION_FLAG_SETS, ANNOTATION_INJECT, ANNOTATION_MIRROR,
    ANNOTATION_PROFILE, ANNOTATION_STATUS, LABEL_NAMESPACE_INJECTION, LABEL_NAMESPACE_REQUIRED,
    PRIORITY_CLASS_WEBHOOK, WATCH_PREFIX,
};

pub use carried::missing_wiring;
pub use namespace::{NamespaceInfo, namespace_label_value, namespace_mode};

/// What to do with a Pod that gets wired.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The wiring.
    pub mode: Mode,
    /// The profile's name (present in the config).
    pub profile: String,
    /// App containers to wire, in the Pod's order.
    pub containers: Vec<String>,
    /// The namespace's Pod Security level.
    pub pss: PssLevel,
    /// The status annotation the Pod already carries, when this is a re-wiring.
    pub previous: Option<Status>,
    /// Warnings from the decision itself.
    pub warnings: Vec<Warning>,
    /// The namespace's name when it requires injection (`pdp-injector.io/required`): a status annotation of a
    /// further profile that is not believed is then refused rather than replaced.
    pub required: Option<String>,
}

/// The decision, before anything is rendered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Wire the Pod.
    Inject(Box<Plan>),
    /// Leave the Pod alone, for this reason.
    Skip(Reason, Vec<Warning>),
    /// Refuse the Pod.
    Deny(Denial),
}

fn quote_list<'a>(items: impl IntoIterator<Item = &'a str>) -> String {
    items
        .into_iter()
        .map(|s| format!("{s:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The Pod's container named like the PDP container of a profile the Pod gets, with that profile: only the
/// chosen profiles count (a `flagd` container that another webhook added does not stop the Cerbos wiring).
fn pdp_named_container<'p>(pod: &'p PodView<'_>, config: &Config) -> Option<(&'p str, String)> {
    let profiles = pod_profiles(pod, config).ok()?;
    pod.containers()
        .iter()
        .chain(pod.init_containers())
        .find_map(|c| {
            profiles
                .iter()
                .find(|p| config.profiles[p.as_str()].container_name == c.name.as_str())
                .map(|p| (c.name.as_str(), p.clone()))
        })
}

/// The refusal of what a namespace that requires injection does not allow.
pub(crate) fn required_denial(reason: Reason, namespace: &str, what: String, fix: &str) -> Denial {
    Denial {
        reason,
        message: format!(
            "namespace {namespace:?} requires injection (label {LABEL_NAMESPACE_REQUIRED}=true), which does not allow {what}: {fix}"
        ),
    }
}

/// The refusal of a status annotation that is not believed, in a namespace that requires injection.
pub(crate) fn forged_status(namespace: &str, key: &str, doubt: impl std::fmt::Display) -> Denial {
    required_denial(
        Reason::ForgedStatus,
        namespace,
        format!("a status annotation {key} that {doubt}"),
        "remove the annotation from the Pod's template, and the webhook wires the Pod",
    )
}

/// Whether the labels of the namespace `name` can change what [`decide`] answers for `pod`: not in a namespace
/// excluded by name, nor for a mirror Pod (both skipped whatever the labels). Only then does the webhook look
/// the namespace up, or ask the apiserver for it.
pub fn reads_namespace(pod: &PodView<'_>, name: &str, config: &Config) -> bool {
    !config.excluded_namespaces.contains(name) && pod.annotation(ANNOTATION_MIRROR).is_none()
}

/// Applies the precedence table: namespace `disabled` > Pod `disabled` > Pod mode > namespace mode > config default.
///
/// Reads the Pod's annotations, labels and container names from its [`PodView`].
pub fn decide(pod: &PodView<'_>, ns: &NamespaceInfo, config: &Config) -> Decision {
    if config.excluded_namespaces.contains(&ns.name) {
        return Decision::Skip(Reason::ExcludedNamespace, vec![]);
    }
    if pod
        .spec
        .as_ref()
        .and_then(|s| s.priority_class_name.as_ref())
        .map(|p| p.as_str())
        == Some(PRIORITY_CLASS_WEBHOOK)
    {
        return Decision::Deny(Denial {
            reason: Reason::ReservedPriorityClass,
            message: format!(
                "PriorityClass {PRIORITY_CLASS_WEBHOOK:?} is pdp-injector's own (it preempts every ordinary \
                 workload): choose another priorityClassName"
            ),
        });
    }
    if pod.annotation(ANNOTATION_MIRROR).is_some() {
        return Decision::Skip(Reason::MirrorPod, vec![]);
    }
    let mut warnings = vec![];
    if let Some(raw) = pod.annotation(ANNOTATION_STATUS) {
        match decide_rewire(pod, ns, config, raw) {
            Ok(decision) => return decision,
            // Not believed: wired as if it had no status (the fresh status replaces it), or refused.
            Err(doubt) if ns.requires_injection() => {
                return Decision::Deny(forged_status(&ns.name, ANNOTATION_STATUS, doubt));
            }
            Err(doubt) => warnings.push(doubt.warning(ANNOTATION_STATUS)),
        }
    }
    if let Some((container, profile)) = pdp_named_container(pod, config) {
        if ns.requires_injection() {
            return Decision::Deny(required_denial(
                Reason::PdpContainerNamed,
                &ns.name,
                format!(
                    "container {container:?}, named like the PDP container of profile {profile:?}"
                ),
                "rename the container",
            ));
        }
        return Decision::Skip(Reason::AlreadyInjected, warnings);
    }

    let ns_choice = ns.injection.as_deref().map(|v| (v, parse_choice(v)));
    let (pod_key, pod_value) = match pod.annotation(ANNOTATION_INJECT) {
        Some(v) => (format!("annotation {ANNOTATION_INJECT}"), Some(v)),
        None => (
            format!("label {ANNOTATION_INJECT}"),
            pod.label(ANNOTATION_INJECT),
        ),
    };

    if let Some((_, Some(PodChoice::Disabled))) = ns_choice {
        if let Some(v) = pod_value.filter(|v| *v != "disabled") {
            warnings.push(Warning {
                code: WarningCode::NamespaceOverride,
                message: format!(
                    "the Pod asks for {ANNOTATION_INJECT}={v} but namespace {:?} has {LABEL_NAMESPACE_INJECTION}=disabled, which wins: no PDP is wired",
                    ns.name
                ),
            });
        }
        return Decision::Skip(Reason::NamespaceOptedOut, warnings);
    }

    let pod_choice = match pod_value {
        None => None,
        Some(v) => match parse_choice(v) {
            Some(c) => Some(c),
            None => {
                return Decision::Deny(Denial {
                    reason: Reason::InvalidAnnotation,
                    message: format!(
                        "invalid value {v:?} for {pod_key}: valid values are {POD_VALUES}"
                    ),
                });
            }
        },
    };
    if pod_choice == Some(PodChoice::Disabled) {
        if ns.requires_injection() {
            return Decision::Deny(required_denial(
                Reason::RequiredOptOut,
                &ns.name,
                format!("the opt-out {pod_key}=disabled"),
                "remove it, or run the Pod in another namespace",
            ));
        }
        return Decision::Skip(Reason::OptedOut, warnings);
    }
    let ns_choice = match ns_choice {
        None => None,
        Some((_, Some(c))) => Some(c),
        Some((v, None)) => {
            return Decision::Deny(Denial {
                reason: Reason::InvalidNamespaceLabel,
                message: format!(
                    "namespace {:?} has invalid value {v:?} for label {LABEL_NAMESPACE_INJECTION}: valid values are {NAMESPACE_VALUES}",
                    ns.name
                ),
            });
        }
    };

    let mode = match (pod_choice, ns_choice) {
        (Some(PodChoice::Mode(m)), _) => m,
        (Some(PodChoice::Enabled), Some(PodChoice::Mode(m))) => m,
        (Some(PodChoice::Enabled), _) => config.default_mode,
        (None, Some(PodChoice::Mode(m))) => m,
        (None, Some(PodChoice::Enabled)) => config.default_mode,
        (None, _) if config.inject_by_default => config.default_mode,
        (None, _) => return Decision::Skip(Reason::NotOptedIn, warnings),
        (Some(PodChoice::Disabled), _) => unreachable!("handled above"),
    };

    // A comma list wires each profile independently (core::pipeline); the plan carries the first.
    let profile = match pod_profiles(pod, config) {
        Ok(mut list) => list.swap_remove(0),
        Err(d) => return Decision::Deny(d),
    };
    let containers = match select_containers(pod, config) {
        Ok(c) => c,
        Err(d) => return Decision::Deny(d),
    };
    Decision::Inject(Box::new(Plan {
        mode,
        profile,
        containers,
        pss: ns.pss_level(config),
        previous: None,
        warnings,
        required: ns.requires_injection().then(|| ns.name.clone()),
    }))
}

/// The profile of `plan`, or why the plan cannot wire this Pod: an unknown profile, a sidecar in a Pod on the
/// host's network (it would listen on the node's ports), central mode without the address of the PDP's
/// Service. Asked before rendering, for the plan and for each further profile of the Pod.
pub fn plan_profile<'c>(
    pod: &PodView<'_>,
    plan: &Plan,
    config: &'c Config,
) -> Result<&'c Profile, Denial> {
    let profile = config.profiles.get(&plan.profile).ok_or_else(|| Denial {
        reason: Reason::UnknownProfile,
        message: format!(
            "unknown profile {:?}: valid profiles are {}",
            plan.profile,
            config.profile_names()
        ),
    })?;
    let host_network = pod.spec.as_ref().and_then(|s| s.host_network) == Some(true);
    if plan.mode == Mode::Sidecar && plan.previous.is_none() && host_network {
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
    if profile.env_names.selector.is_some()
        && let Some(value) = pod.annotation(ANNOTATION_FLAG_SETS)
        && let Err(e) = crate::flag_sets::parse(value)
    {
        return Err(Denial {
            reason: Reason::InvalidAnnotation,
            message: format!("invalid value {value:?} for annotation {ANNOTATION_FLAG_SETS}: {e}"),
        });
    }
    Ok(profile)
}

/// Why a status annotation is not believed.
pub(crate) enum StatusDoubt {
    /// Not JSON of a status, or a profile the config does not have.
    Unreadable(String),
    /// It claims a piece of wiring the Pod does not carry.
    NotCarried(String),
}

impl std::fmt::Display for StatusDoubt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StatusDoubt::Unreadable(why) => f.write_str(why),
            StatusDoubt::NotCarried(what) => {
                write!(
                    f,
                    "claims a wiring the Pod does not carry ({what} is missing)"
                )
            }
        }
    }
}

impl StatusDoubt {
    /// The warning of a Pod wired as if the status annotation `key` were absent.
    pub(crate) fn warning(&self, key: &str) -> Warning {
        Warning {
            code: match self {
                StatusDoubt::Unreadable(_) => WarningCode::StatusUnreadable,
                StatusDoubt::NotCarried(_) => WarningCode::StatusNotCarried,
            },
            message: format!("annotation {key} {self}; the Pod is wired as if it had none"),
        }
    }
}

/// The profiles the Pod asks for, in its order: the `pdp-injector.io/profile` annotation (one name, or a comma
/// list), else the config's default profile. Never empty; each name is a profile of the config, listed once.
pub fn pod_profiles(pod: &PodView<'_>, config: &Config) -> Result<Vec<String>, Denial> {
    let Some(value) = pod.annotation(ANNOTATION_PROFILE) else {
        return Ok(vec![config.default_profile.clone()]);
    };
    let names: Vec<&str> = value.split(',').map(str::trim).collect();
    let mut out: Vec<String> = Vec::with_capacity(names.len());
    for p in &names {
        if p.is_empty() {
            return Err(Denial {
                reason: Reason::InvalidAnnotation,
                message: format!(
                    "invalid value {value:?} for annotation {ANNOTATION_PROFILE}: an empty profile name; valid values are a profile or a comma list of profiles: {}",
                    config.profile_names()
                ),
            });
        }
        if !config.profiles.contains_key(*p) {
            return Err(Denial {
                reason: Reason::UnknownProfile,
                message: format!(
                    "unknown profile {p:?} in annotation {ANNOTATION_PROFILE}: valid profiles are {}",
                    config.profile_names()
                ),
            });
        }
        if out.iter().any(|o| o == p) {
            return Err(Denial {
                reason: Reason::InvalidAnnotation,
                message: format!(
                    "invalid value {value:?} for annotation {ANNOTATION_PROFILE}: profile {p:?} is listed twice"
                ),
            });
        }
        // Each further profile records its status under its own key, whose name part has at most 63 characters.
        if names.len() > 1 && status_key(p).len() - "pdp-injector.io/".len() > 63 {
            return Err(Denial {
                reason: Reason::InvalidAnnotation,
                message: format!(
                    "invalid value {value:?} for annotation {ANNOTATION_PROFILE}: profile name {p:?} is too long to be one of several (at most 56 characters)"
                ),
            });
        }
        out.push(p.to_string());
    }
    Ok(out)
}

/// The annotation holding the status of `profile` when it is not the Pod's first profile: the first keeps
/// `pdp-injector.io/status`, so a Pod with one profile looks exactly as before.
pub fn status_key(profile: &str) -> String {
    format!("{ANNOTATION_STATUS}-{profile}")
}

/// A Pod that carries our status annotation was injected before (a reinvocation, or a copied manifest): keep its
/// recorded mode and profile, and wire only what is missing. `Err`: the status is not believed (unreadable, or
/// claiming what the Pod does not carry), and the caller decides as if it were absent.
fn decide_rewire(
    pod: &PodView<'_>,
    ns: &NamespaceInfo,
    config: &Config,
    raw: &str,
) -> Result<Decision, StatusDoubt> {
    let status: Status = serde_json::from_str(raw)
        .map_err(|e| StatusDoubt::Unreadable(format!("is not valid JSON ({e})")))?;
    if !config.profiles.contains_key(&status.profile) {
        return Err(StatusDoubt::Unreadable(format!(
            "names profile {:?}, which the config does not have",
            status.profile
        )));
    }
    if let Some(what) = missing_wiring(pod, &status, config) {
        return Err(StatusDoubt::NotCarried(what));
    }
    let containers = match select_containers(pod, config) {
        Ok(c) => c,
        Err(d) => return Ok(Decision::Deny(d)),
    };
    // Re-wiring only ever wires containers the first pass did not: none new, nothing to do. A Pod with further
    // profiles goes on to the pipeline, which judges their statuses too.
    let wired: std::collections::BTreeSet<&str> =
        status.containers.iter().map(String::as_str).collect();
    let several = pod_profiles(pod, config).is_ok_and(|p| p.len() > 1);
    if !several && containers.iter().all(|c| wired.contains(c.as_str())) {
        return Ok(Decision::Skip(Reason::AlreadyInjected, vec![]));
    }
    Ok(Decision::Inject(Box::new(Plan {
        mode: status.mode,
        profile: status.profile.clone(),
        containers,
        pss: ns.pss_level(config),
        previous: Some(status),
        warnings: vec![],
        required: ns.requires_injection().then(|| ns.name.clone()),
    })))
}

/// The app containers to wire: all of them, or those named by the containers annotation. A PDP container (a
/// classic sidecar lives among `containers`) is never an app container.
fn select_containers(pod: &PodView<'_>, config: &Config) -> Result<Vec<String>, Denial> {
    let names: Vec<&str> = pod
        .containers()
        .iter()
        .map(|c| c.name.as_str())
        .filter(|n| {
            !config.profiles.values().any(|p| p.container_name == *n)
                && !n.starts_with(WATCH_PREFIX)
        })
        .collect();
    let Some(raw) = pod.annotation(ANNOTATION_CONTAINERS) else {
        return Ok(names.into_iter().map(String::from).collect());
    };
    let wanted: Vec<&str> = raw
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if wanted.is_empty() {
        return Err(Denial {
            reason: Reason::InvalidAnnotation,
            message: format!(
                "invalid value {raw:?} for annotation {ANNOTATION_CONTAINERS}: valid values are a comma-separated list of the Pod's containers: {}",
                quote_list(names.iter().copied())
            ),
        });
    }
    // Sets, so that a long list against many containers stays linear.
    let known: std::collections::BTreeSet<&str> = names.iter().copied().collect();
    let unknown: Vec<&str> = wanted
        .iter()
        .copied()
        .filter(|w| !known.contains(w))
        .collect();
    if !unknown.is_empty() {
        return Err(Denial {
            reason: Reason::UnknownContainer,
            message: format!(
                "annotation {ANNOTATION_CONTAINERS} names {} that the Pod does not have: valid values are the Pod's containers: {}",
                quote_list(unknown),
                quote_list(names.iter().copied())
            ),
        });
    }
    let wanted: std::collections::BTreeSet<&str> = wanted.into_iter().collect();
    Ok(names
        .into_iter()
        .filter(|n| wanted.contains(n))
        .map(String::from)
        .collect())
}

/// [`decide`] for a typed Pod (the offline command, tests): through the Pod's JSON and its view, so exactly the
/// webhook's path.
pub fn decide_pod(
    pod: &k8s_openapi::api::core::v1::Pod,
    ns: &NamespaceInfo,
    config: &Config,
) -> Decision {
    let json = crate::core::view::pod_json(pod);
    match PodView::parse(&json) {
        Ok(view) => decide(&view, ns, config),
        Err(e) => Decision::Deny(Denial::invalid_object(e)),
    }
}

#[cfg(test)]
mod tests;
