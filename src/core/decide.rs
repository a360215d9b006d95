//! Decide whether a Pod is wired, how, and why: the precedence table of SPEC.md as one pure function.

use crate::config::{Config, Mode, PssLevel};
use crate::core::codes::{Denial, Reason, Warning, WarningCode};
use crate::core::status::Status;
use crate::core::view::PodView;
use crate::names::*;

/// What the core knows about the Pod's namespace (from the namespace cache, an offline stream, or nothing).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NamespaceInfo {
    /// Namespace name.
    pub name: String,
    /// Value of the `pdp-injector.io/injection` label.
    pub injection: Option<String>,
    /// Value of the `pod-security.kubernetes.io/enforce` label.
    pub pss_enforce: Option<String>,
}

impl NamespaceInfo {
    /// A namespace known only by name.
    pub fn named(name: impl Into<String>) -> Self {
        NamespaceInfo {
            name: name.into(),
            ..Default::default()
        }
    }

    /// Reads the two labels that matter from a label map.
    pub fn from_labels<'a>(
        name: impl Into<String>,
        labels: impl IntoIterator<Item = (&'a String, &'a String)>,
    ) -> Self {
        let mut ns = NamespaceInfo::named(name);
        for (k, v) in labels {
            if k == LABEL_NAMESPACE_INJECTION {
                ns.injection = Some(v.clone());
            } else if k == LABEL_PSS_ENFORCE {
                ns.pss_enforce = Some(v.clone());
            }
        }
        ns
    }

    /// Whether the namespace's injection label opts its Pods in (any value but `disabled` that the webhook
    /// knows): what the apiserver's selector for the `Fail` entry matches.
    pub fn opted_in(&self) -> bool {
        matches!(
            self.injection.as_deref().and_then(parse_choice),
            Some(PodChoice::Mode(_) | PodChoice::Enabled)
        )
    }

    /// The namespace's enforced Pod Security level, or the config's default when it has none.
    pub fn pss_level(&self, config: &Config) -> PssLevel {
        self.pss_enforce
            .as_deref()
            .map(PssLevel::from_label)
            .unwrap_or(config.default_pod_security_level)
    }
}

/// The values of `pdp-injector.io/inject`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PodChoice {
    Mode(Mode),
    Enabled,
    Disabled,
}

const POD_VALUES: &str = "sidecar, daemonset, central, enabled, disabled";
const NAMESPACE_VALUES: &str = "enabled, sidecar, daemonset, central, disabled";

/// Checks a value of the namespace label `pdp-injector.io/injection` (the `inject` command's `--mode` stands
/// for it), with the message that lists the valid values.
pub fn namespace_label_value(value: &str) -> Result<String, String> {
    match parse_choice(value) {
        Some(_) => Ok(value.to_string()),
        None => Err(format!("valid values are {NAMESPACE_VALUES}")),
    }
}

/// The mode a value of the namespace label asks for: `None` for `disabled`, the config's default mode for
/// `enabled`, an error listing the valid values otherwise. `decide` and `check` judge the label with this one
/// parser, so the two cannot disagree on a value.
pub fn namespace_mode(value: &str, config: &Config) -> Result<Option<Mode>, String> {
    match parse_choice(value) {
        Some(PodChoice::Mode(m)) => Ok(Some(m)),
        Some(PodChoice::Enabled) => Ok(Some(config.default_mode)),
        Some(PodChoice::Disabled) => Ok(None),
        None => Err(format!("valid values are {NAMESPACE_VALUES}")),
    }
}

fn parse_choice(value: &str) -> Option<PodChoice> {
    match value {
        "sidecar" => Some(PodChoice::Mode(Mode::Sidecar)),
        "daemonset" => Some(PodChoice::Mode(Mode::Daemonset)),
        "central" => Some(PodChoice::Mode(Mode::Central)),
        "enabled" => Some(PodChoice::Enabled),
        "disabled" => Some(PodChoice::Disabled),
        _ => None,
    }
}

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

/// True when the Pod carries a container named like the PDP container of any profile.
fn has_pdp_container(pod: &PodView<'_>, config: &Config) -> bool {
    pod.containers()
        .iter()
        .chain(pod.init_containers())
        .any(|c| {
            config
                .profiles
                .values()
                .any(|p| p.container_name == c.name.as_str())
        })
}

/// Applies the precedence table: namespace `disabled` > Pod `disabled` > Pod mode > namespace mode > config default.
///
/// Reads the Pod's annotations, labels and container names from its [`PodView`].
pub fn decide(pod: &PodView<'_>, ns: &NamespaceInfo, config: &Config) -> Decision {
    if config.excluded_namespaces.contains(&ns.name) {
        return Decision::Skip(Reason::ExcludedNamespace, vec![]);
    }
    if pod.annotation(ANNOTATION_MIRROR).is_some() {
        return Decision::Skip(Reason::MirrorPod, vec![]);
    }
    if let Some(raw) = pod.annotation(ANNOTATION_STATUS) {
        return decide_rewire(pod, ns, config, raw);
    }
    if has_pdp_container(pod, config) {
        return Decision::Skip(Reason::AlreadyInjected, vec![]);
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
        let mut warnings = vec![];
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
        return Decision::Skip(Reason::OptedOut, vec![]);
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
        (None, _) => return Decision::Skip(Reason::NotOptedIn, vec![]),
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
        warnings: vec![],
    }))
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
/// recorded mode and profile, and wire only what is missing.
fn decide_rewire(pod: &PodView<'_>, ns: &NamespaceInfo, config: &Config, raw: &str) -> Decision {
    let unreadable = |why: String| {
        Decision::Skip(
            Reason::AlreadyInjected,
            vec![Warning {
                code: WarningCode::StatusUnreadable,
                message: format!("annotation {ANNOTATION_STATUS} {why}; the Pod is left as it is"),
            }],
        )
    };
    let status: Status = match serde_json::from_str(raw) {
        Ok(s) => s,
        Err(e) => return unreadable(format!("is not valid JSON ({e})")),
    };
    if !config.profiles.contains_key(&status.profile) {
        return unreadable(format!(
            "names profile {:?}, which the config no longer has",
            status.profile
        ));
    }
    let containers = match select_containers(pod, config) {
        Ok(c) => c,
        Err(d) => return Decision::Deny(d),
    };
    // Re-wiring only ever wires containers the first pass did not: none new, nothing to do.
    if containers.iter().all(|c| status.containers.contains(c)) {
        return Decision::Skip(Reason::AlreadyInjected, vec![]);
    }
    Decision::Inject(Box::new(Plan {
        mode: status.mode,
        profile: status.profile.clone(),
        containers,
        pss: ns.pss_level(config),
        previous: Some(status),
        warnings: vec![],
    }))
}

/// The app containers to wire: all of them, or those named by the containers annotation. A PDP container (a
/// classic sidecar lives among `containers`) is never an app container.
fn select_containers(pod: &PodView<'_>, config: &Config) -> Result<Vec<String>, Denial> {
    let names: Vec<&str> = pod
        .containers()
        .iter()
        .map(|c| c.name.as_str())
        .filter(|n| !config.profiles.values().any(|p| p.container_name == *n))
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
    let unknown: Vec<&str> = wanted
        .iter()
        .copied()
        .filter(|w| !names.contains(w))
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
