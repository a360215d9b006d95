//! The namespace the Pod is in, and the values of the namespace label and the Pod annotation that choose a mode.

use crate::config::{Config, Mode, PssLevel};
use crate::names::{LABEL_NAMESPACE_INJECTION, LABEL_NAMESPACE_REQUIRED, LABEL_PSS_ENFORCE};

/// What the core knows about the Pod's namespace (from the namespace cache, an offline stream, or nothing).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NamespaceInfo {
    /// Namespace name.
    pub name: String,
    /// Value of the `pdp-injector.io/injection` label.
    pub injection: Option<String>,
    /// Value of the `pod-security.kubernetes.io/enforce` label.
    pub pss_enforce: Option<String>,
    /// The `pdp-injector.io/required` label is `"true"`.
    pub required: bool,
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
            } else if k == LABEL_NAMESPACE_REQUIRED {
                ns.required = v == "true";
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

    /// Whether the namespace may not opt out: labelled `pdp-injector.io/required: "true"` and opted in.
    pub fn requires_injection(&self) -> bool {
        self.required && self.opted_in()
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
pub(super) enum PodChoice {
    Mode(Mode),
    Enabled,
    Disabled,
}

pub(super) const POD_VALUES: &str = "sidecar, daemonset, central, enabled, disabled";
pub(super) const NAMESPACE_VALUES: &str = "enabled, sidecar, daemonset, central, disabled";

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

pub(super) fn parse_choice(value: &str) -> Option<PodChoice> {
    match value {
        "sidecar" => Some(PodChoice::Mode(Mode::Sidecar)),
        "daemonset" => Some(PodChoice::Mode(Mode::Daemonset)),
        "central" => Some(PodChoice::Mode(Mode::Central)),
        "enabled" => Some(PodChoice::Enabled),
        "disabled" => Some(PodChoice::Disabled),
        _ => None,
    }
}
