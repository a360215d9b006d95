//! The stable codes of every outcome: why the injector did what it did ([`Reason`]), what a warning is about
//! ([`WarningCode`]), and the refusal a user reads ([`Denial`]). They show up unchanged in logs, metrics labels,
//! the status annotation and the AdmissionResponse, so "why was my Pod (not) injected" always has one answer.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Why the injector did what it did. The codes are a public contract: never rename one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// A PDP sidecar was added.
    InjectedSidecar,
    /// The Pod was wired to its node's PDP.
    InjectedDaemonset,
    /// The Pod was wired to the central PDP Service its profile names.
    InjectedCentral,
    /// An already injected Pod got a container wired that another webhook added after us.
    Rewired,
    /// Not a Pod, not a CREATE, or a subresource: nothing to do.
    NotAPodCreate,
    /// The namespace is never injected (control plane, the webhook's own, or listed in the config).
    ExcludedNamespace,
    /// A mirror Pod of a static Pod: the kubelet owns it.
    MirrorPod,
    /// The Pod already has its PDP (our status annotation or the PDP container).
    AlreadyInjected,
    /// Neither the Pod nor its namespace opted in.
    NotOptedIn,
    /// The Pod opted out (`pdp-injector.io/inject: disabled`).
    OptedOut,
    /// The namespace opted out (`pdp-injector.io/injection: disabled`); it overrides the Pod.
    NamespaceOptedOut,
    /// A `pdp-injector.io/*` annotation or Pod label has a value outside its valid set.
    InvalidAnnotation,
    /// The namespace's `pdp-injector.io/injection` label has a value outside its valid set.
    InvalidNamespaceLabel,
    /// The profile annotation names a profile the config does not have.
    UnknownProfile,
    /// The containers annotation names a container the Pod does not have.
    UnknownContainer,
    /// A volume or mount the injector must add clashes with one of the Pod's own.
    NameCollision,
    /// Sidecar mode for a hostNetwork Pod: the PDP would listen on the node's ports.
    HostNetworkSidecar,
    /// The admission request's object is not a valid Pod.
    InvalidObject,
    /// Central mode was asked for, but the profile names no Service (`central.address`): the Pod is refused
    /// rather than run without a PDP address.
    NoCentralAddress,
    /// The apiserver sent the Pod through the entry for opted-in namespaces, but the webhook could not read the
    /// namespace to confirm it: the Pod is refused rather than run without its PDP (the controller retries).
    NamespaceUnreadable,
    /// The Pod opts out (`pdp-injector.io/inject: disabled`) in a namespace that requires injection
    /// (`pdp-injector.io/required: "true"`).
    RequiredOptOut,
    /// In a namespace that requires injection, the Pod carries a status annotation that is unreadable, names a
    /// profile the config does not have, or claims a wiring the Pod does not carry.
    ForgedStatus,
    /// In a namespace that requires injection, the Pod has a container named like the PDP container of a
    /// profile it gets.
    PdpContainerNamed,
    /// A run-to-completion Pod that gets a classic sidecar (Kubernetes < 1.29) sets `shareProcessNamespace:
    /// false`, which the container that stops the sidecar after the apps needs.
    ProcessNamespaceOff,
    /// The Pod has more containers, or its wiring would need a larger patch, than the webhook wires: a bound on
    /// what one review may cost (no real Pod comes near it).
    PodTooLarge,
    /// The Pod names the webhook's own PriorityClass, which only pdp-injector's Pods may use: it would preempt
    /// every ordinary workload.
    ReservedPriorityClass,
}

impl Reason {
    /// The stable code.
    pub fn code(self) -> &'static str {
        match self {
            Reason::InjectedSidecar => "injected_sidecar",
            Reason::InjectedDaemonset => "injected_daemonset",
            Reason::InjectedCentral => "injected_central",
            Reason::Rewired => "rewired",
            Reason::NotAPodCreate => "not_a_pod_create",
            Reason::ExcludedNamespace => "excluded_namespace",
            Reason::MirrorPod => "mirror_pod",
            Reason::AlreadyInjected => "already_injected",
            Reason::NotOptedIn => "not_opted_in",
            Reason::OptedOut => "opted_out",
            Reason::NamespaceOptedOut => "namespace_opted_out",
            Reason::InvalidAnnotation => "invalid_annotation",
            Reason::InvalidNamespaceLabel => "invalid_namespace_label",
            Reason::UnknownProfile => "unknown_profile",
            Reason::UnknownContainer => "unknown_container",
            Reason::NameCollision => "name_collision",
            Reason::HostNetworkSidecar => "host_network_sidecar",
            Reason::InvalidObject => "invalid_object",
            Reason::NamespaceUnreadable => "namespace_unreadable",
            Reason::RequiredOptOut => "required_opt_out",
            Reason::ForgedStatus => "forged_status",
            Reason::PdpContainerNamed => "pdp_container_named",
            Reason::ProcessNamespaceOff => "process_namespace_off",
            Reason::NoCentralAddress => "no_central_address",
            Reason::PodTooLarge => "pod_too_large",
            Reason::ReservedPriorityClass => "reserved_priority_class",
        }
    }

    /// `inject`, `skip` or `deny`: the decision each reason belongs to.
    pub fn decision(self) -> &'static str {
        match self {
            Reason::InjectedSidecar
            | Reason::InjectedDaemonset
            | Reason::InjectedCentral
            | Reason::Rewired => "inject",
            Reason::NotAPodCreate
            | Reason::ExcludedNamespace
            | Reason::MirrorPod
            | Reason::AlreadyInjected
            | Reason::NotOptedIn
            | Reason::OptedOut
            | Reason::NamespaceOptedOut => "skip",
            Reason::InvalidAnnotation
            | Reason::InvalidNamespaceLabel
            | Reason::UnknownProfile
            | Reason::UnknownContainer
            | Reason::NameCollision
            | Reason::HostNetworkSidecar
            | Reason::InvalidObject
            | Reason::NamespaceUnreadable
            | Reason::NoCentralAddress
            | Reason::RequiredOptOut
            | Reason::ForgedStatus
            | Reason::PdpContainerNamed
            | Reason::ProcessNamespaceOff
            | Reason::PodTooLarge
            | Reason::ReservedPriorityClass => "deny",
        }
    }

    /// Every reason, for documentation and for metrics that must show zeros.
    pub const ALL: [Reason; 26] = [
        Reason::InjectedSidecar,
        Reason::InjectedDaemonset,
        Reason::InjectedCentral,
        Reason::Rewired,
        Reason::NotAPodCreate,
        Reason::ExcludedNamespace,
        Reason::MirrorPod,
        Reason::AlreadyInjected,
        Reason::NotOptedIn,
        Reason::OptedOut,
        Reason::NamespaceOptedOut,
        Reason::InvalidAnnotation,
        Reason::InvalidNamespaceLabel,
        Reason::UnknownProfile,
        Reason::UnknownContainer,
        Reason::NameCollision,
        Reason::HostNetworkSidecar,
        Reason::InvalidObject,
        Reason::NamespaceUnreadable,
        Reason::NoCentralAddress,
        Reason::RequiredOptOut,
        Reason::ForgedStatus,
        Reason::PdpContainerNamed,
        Reason::ProcessNamespaceOff,
        Reason::PodTooLarge,
        Reason::ReservedPriorityClass,
    ];
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

/// What a warning is about; a stable code like [`Reason`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WarningCode {
    /// Daemonset mode in a namespace whose Pod Security level forbids hostPath: TCP only, no socket.
    DowngradedPss,
    /// An app container already defines a variable the injector would add; the app's value is kept.
    EnvKept,
    /// The Pod asked for injection but its namespace opted out.
    NamespaceOverride,
    /// The status annotation could not be read (or names a profile the config does not have): the Pod is wired
    /// as if it had none.
    StatusUnreadable,
    /// The status annotation claims a wiring the Pod does not carry (a copied or forged status): the Pod is
    /// wired as if it had none.
    StatusNotCarried,
}

impl WarningCode {
    /// Every warning code, for documentation.
    pub const ALL: [WarningCode; 5] = [
        WarningCode::DowngradedPss,
        WarningCode::EnvKept,
        WarningCode::NamespaceOverride,
        WarningCode::StatusUnreadable,
        WarningCode::StatusNotCarried,
    ];

    /// The stable code.
    pub fn code(self) -> &'static str {
        match self {
            WarningCode::DowngradedPss => "downgraded_pss",
            WarningCode::EnvKept => "env_kept",
            WarningCode::NamespaceOverride => "namespace_override",
            WarningCode::StatusUnreadable => "status_unreadable",
            WarningCode::StatusNotCarried => "status_not_carried",
        }
    }
}

/// A warning for the user who created the Pod (shown by kubectl) and for the logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    /// Stable code.
    pub code: WarningCode,
    /// One line for a human.
    pub message: String,
}

/// The line a user sees for a warning or a denial, `pdp-injector <code>: <message>`, written to `out`: one
/// definition for `Display` and for [`Warning::text`].
fn write_line(out: &mut impl fmt::Write, code: &str, message: &str) -> fmt::Result {
    out.write_str("pdp-injector ")?;
    out.write_str(code)?;
    out.write_str(": ")?;
    out.write_str(message)
}

impl Warning {
    /// The warning as shown to the user (its `Display`), in one buffer of the right size: `to_string` grows
    /// its buffer three or four times for a warning of a line.
    pub fn text(&self) -> String {
        let code = self.code.code();
        let mut text =
            String::with_capacity("pdp-injector : ".len() + code.len() + self.message.len());
        write_line(&mut text, code, &self.message).expect("writing to a String cannot fail");
        text
    }
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_line(f, self.code.code(), &self.message)
    }
}

/// A refusal: the Pod is not admitted, and `message` tells the user exactly what to fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    /// Stable code.
    pub reason: Reason,
    /// Names the key, the bad value and the valid values.
    pub message: String,
}

impl Denial {
    /// The refusal of an object that is not a valid v1 Pod (`invalid_object`); `why` names the field.
    pub fn invalid_object(why: impl std::fmt::Display) -> Denial {
        Denial {
            reason: Reason::InvalidObject,
            message: format!("the object is not a valid v1 Pod: {why}"),
        }
    }

    /// The refusal of a Pod whose namespace the apiserver matched as opted in (the `Fail` entry) but that the
    /// webhook could not confirm: the Pod is not run without its PDP.
    pub fn namespace_unreadable(namespace: &str, why: &str) -> Denial {
        Denial {
            reason: Reason::NamespaceUnreadable,
            message: format!(
                "namespace {namespace:?} is opted in (the apiserver sent this Pod through the webhook entry for \
                 opted-in namespaces), but its labels could not be read from the apiserver ({why}): the Pod is \
                 refused rather than run without its PDP; its controller retries"
            ),
        }
    }

    /// The error of the generic entry (`/mutate`) when the Pod's namespace cannot be read: sent as an HTTP 503,
    /// so the entry's failure policy decides (`Ignore` admits the Pod unwired, `Fail` refuses it).
    pub fn namespace_doubt(namespace: &str, why: &str) -> Denial {
        Denial {
            reason: Reason::NamespaceUnreadable,
            message: format!(
                "the labels of namespace {namespace:?} could not be read from the apiserver ({why}), so whether \
                 the Pod must be wired is unknown: answered with an error, which the webhook entry's failure \
                 policy turns into a refusal (Fail) or an admission without the PDP (Ignore)"
            ),
        }
    }

    /// The refusal of a Pod beyond the webhook's size bounds (`pod_too_large`); `what` says which bound.
    pub fn pod_too_large(what: impl std::fmt::Display) -> Denial {
        Denial {
            reason: Reason::PodTooLarge,
            message: format!(
                "{what}: the injector wires Pods within this bound only, so that no single Pod can make it slow or \
                 run it out of memory for every other Pod; split the workload into several Pods"
            ),
        }
    }
}

impl fmt::Display for Denial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_line(f, self.reason.code(), &self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_warnings_text_is_its_display() {
        for code in WarningCode::ALL {
            for message in [
                "",
                "the app's CERBOS_PDP_ADDR is kept",
                "ünïcode \"quoted\"\n",
            ] {
                let w = Warning {
                    code,
                    message: message.to_string(),
                };
                let text = w.text();
                assert_eq!(text, w.to_string());
                assert_eq!(
                    text.len(),
                    text.capacity(),
                    "{text}: one buffer of the right size"
                );
            }
        }
    }
}
