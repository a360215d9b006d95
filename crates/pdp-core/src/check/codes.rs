//! The codes of `check`'s findings: stable `snake_case` names for scripts and alerts, each documented in
//! docs/operations.md (tests/docs reads [`FindingCode::ALL`], so a section moved to another file keeps its check).
//! The Pods section's codes are [`Drift`](super::pods::Drift)s.

use super::pods::Drift;

/// What a finding is about, as a stable code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FindingCode {
    /// `ca_bundle_invalid`
    CaBundleInvalid,
    /// `ca_bundle_missing`
    CaBundleMissing,
    /// `certificate_expiry`
    CertificateExpiry,
    /// `classic_sidecar_not_stopped`
    ClassicSidecarNotStopped,
    /// `config_invalid`
    ConfigInvalid,
    /// `config_loaded`
    ConfigLoaded,
    /// `config_missing`
    ConfigMissing,
    /// `config_unreadable`
    ConfigUnreadable,
    /// `deployment_missing`
    DeploymentMissing,
    /// `deployment_unreadable`
    DeploymentUnreadable,
    /// `endpoint_trusted`
    EndpointTrusted,
    /// `endpoint_unreachable`
    EndpointUnreachable,
    /// `endpoint_untrusted`
    EndpointUntrusted,
    /// `flag_relay_behind`
    FlagRelayBehind,
    /// `flag_relays_current`
    FlagRelaysCurrent,
    /// `flag_sync_unreadable`
    FlagSyncUnreadable,
    /// `front_outdated`
    FrontOutdated,
    /// `invalid_namespace_label`
    InvalidNamespaceLabel,
    /// `namespace_excluded`
    NamespaceExcluded,
    /// `namespace_not_found`
    NamespaceNotFound,
    /// `namespace_not_selected`
    NamespaceNotSelected,
    /// `namespace_opted_in`
    NamespaceOptedIn,
    /// `namespace_opted_out`
    NamespaceOptedOut,
    /// `namespaces_unreadable`
    NamespacesUnreadable,
    /// `csi_nodes_unreadable`
    CsiNodesUnreadable,
    /// `node_without_csi_driver`
    NodeWithoutCsiDriver,
    /// `node_without_front`
    NodeWithoutFront,
    /// `node_without_pdp`
    NodeWithoutPdp,
    /// `nodes_unreadable`
    NodesUnreadable,
    /// `pdp_daemonset`
    PdpDaemonset,
    /// `pdp_daemonset_missing`
    PdpDaemonsetMissing,
    /// `pdp_front`
    PdpFront,
    /// `pdp_outdated`
    PdpOutdated,
    /// `pdp_unreadable`
    PdpUnreadable,
    /// `pods_unreadable`
    PodsUnreadable,
    /// `serving_cert_invalid`
    ServingCertInvalid,
    /// `serving_cert_trusted`
    ServingCertTrusted,
    /// `serving_cert_untrusted`
    ServingCertUntrusted,
    /// `serving_secret_missing`
    ServingSecretMissing,
    /// `serving_secret_unreadable`
    ServingSecretUnreadable,
    /// `webhook_degraded`
    WebhookDegraded,
    /// `webhook_entry_differs`
    WebhookEntryDiffers,
    /// `webhook_entry_missing`
    WebhookEntryMissing,
    /// `webhook_missing`
    WebhookMissing,
    /// `webhook_not_ready`
    WebhookNotReady,
    /// `webhook_ready`
    WebhookReady,
    /// `webhook_registered`
    WebhookRegistered,
    /// `webhook_unreadable`
    WebhookUnreadable,
    /// `admission_api` (`check --pre`)
    AdmissionApi,
    /// `admission_api_missing` (`check --pre`)
    AdmissionApiMissing,
    /// `admission_policies` (`check --pre`)
    AdmissionPolicies,
    /// `admission_policies_skipped` (`check --pre`)
    AdmissionPoliciesSkipped,
    /// `admission_policy_api_missing` (`check --pre`)
    AdmissionPolicyApiMissing,
    /// `critical_priority` (`check --pre`)
    CriticalPriority,
    /// `critical_priority_missing` (`check --pre`)
    CriticalPriorityMissing,
    /// `critical_priority_quota_short` (`check --pre`)
    CriticalPriorityQuotaShort,
    /// `csi_api` (`check --pre`)
    CsiApi,
    /// `csi_api_missing` (`check --pre`)
    CsiApiMissing,
    /// `kubelet_dir` (`check --pre`)
    KubeletDir,
    /// `kubelet_dir_differs` (`check --pre`)
    KubeletDirDiffers,
    /// `kubelet_dir_unknown` (`check --pre`)
    KubeletDirUnknown,
    /// `kubernetes_too_old` (`check --pre`)
    KubernetesTooOld,
    /// `kubernetes_version` (`check --pre`)
    KubernetesVersion,
    /// `model_can_run` (`check --pre`)
    ModelCanRun,
    /// `model_cannot_run` (`check --pre`)
    ModelCannotRun,
    /// `namespace_pod_security` (`check --pre`)
    NamespacePodSecurity,
    /// `no_namespaces_to_opt_in` (`check --pre`)
    NoNamespacesToOptIn,
    /// `node_port_taken` (`check --pre`)
    NodePortTaken,
    /// `node_ports_free` (`check --pre`)
    NodePortsFree,
    /// `pre_read_failed` (`check --pre`)
    PreReadFailed,
    /// `priority_class_exists` (`check --pre`)
    PriorityClassExists,
    /// `priority_class_taken` (`check --pre`)
    PriorityClassTaken,
    /// `quota_limits_install` (`check --pre`)
    QuotaLimitsInstall,
    /// `quota_too_small` (`check --pre`)
    QuotaTooSmall,
}

impl FindingCode {
    /// Every code: `check`'s in alphabetical order, then `check --pre`'s.
    pub const ALL: &[FindingCode] = &[
        FindingCode::CaBundleInvalid,
        FindingCode::CaBundleMissing,
        FindingCode::CertificateExpiry,
        FindingCode::ClassicSidecarNotStopped,
        FindingCode::ConfigInvalid,
        FindingCode::ConfigLoaded,
        FindingCode::ConfigMissing,
        FindingCode::ConfigUnreadable,
        FindingCode::DeploymentMissing,
        FindingCode::DeploymentUnreadable,
        FindingCode::EndpointTrusted,
        FindingCode::EndpointUnreachable,
        FindingCode::EndpointUntrusted,
        FindingCode::FlagRelayBehind,
        FindingCode::FlagRelaysCurrent,
        FindingCode::FlagSyncUnreadable,
        FindingCode::FrontOutdated,
        FindingCode::InvalidNamespaceLabel,
        FindingCode::NamespaceExcluded,
        FindingCode::NamespaceNotFound,
        FindingCode::NamespaceNotSelected,
        FindingCode::NamespaceOptedIn,
        FindingCode::NamespaceOptedOut,
        FindingCode::NamespacesUnreadable,
        FindingCode::CsiNodesUnreadable,
        FindingCode::NodeWithoutCsiDriver,
        FindingCode::NodeWithoutFront,
        FindingCode::NodeWithoutPdp,
        FindingCode::NodesUnreadable,
        FindingCode::PdpDaemonset,
        FindingCode::PdpDaemonsetMissing,
        FindingCode::PdpFront,
        FindingCode::PdpOutdated,
        FindingCode::PdpUnreadable,
        FindingCode::PodsUnreadable,
        FindingCode::ServingCertInvalid,
        FindingCode::ServingCertTrusted,
        FindingCode::ServingCertUntrusted,
        FindingCode::ServingSecretMissing,
        FindingCode::ServingSecretUnreadable,
        FindingCode::WebhookDegraded,
        FindingCode::WebhookEntryDiffers,
        FindingCode::WebhookEntryMissing,
        FindingCode::WebhookMissing,
        FindingCode::WebhookNotReady,
        FindingCode::WebhookReady,
        FindingCode::WebhookRegistered,
        FindingCode::WebhookUnreadable,
        FindingCode::AdmissionApi,
        FindingCode::AdmissionApiMissing,
        FindingCode::AdmissionPolicies,
        FindingCode::AdmissionPoliciesSkipped,
        FindingCode::AdmissionPolicyApiMissing,
        FindingCode::CriticalPriority,
        FindingCode::CriticalPriorityMissing,
        FindingCode::CriticalPriorityQuotaShort,
        FindingCode::CsiApi,
        FindingCode::CsiApiMissing,
        FindingCode::KubeletDir,
        FindingCode::KubeletDirDiffers,
        FindingCode::KubeletDirUnknown,
        FindingCode::KubernetesTooOld,
        FindingCode::KubernetesVersion,
        FindingCode::ModelCanRun,
        FindingCode::ModelCannotRun,
        FindingCode::NamespacePodSecurity,
        FindingCode::NoNamespacesToOptIn,
        FindingCode::NodePortTaken,
        FindingCode::NodePortsFree,
        FindingCode::PreReadFailed,
        FindingCode::PriorityClassExists,
        FindingCode::PriorityClassTaken,
        FindingCode::QuotaLimitsInstall,
        FindingCode::QuotaTooSmall,
    ];

    /// The stable code.
    pub fn code(self) -> &'static str {
        match self {
            FindingCode::CaBundleInvalid => "ca_bundle_invalid",
            FindingCode::CaBundleMissing => "ca_bundle_missing",
            FindingCode::CertificateExpiry => "certificate_expiry",
            FindingCode::ClassicSidecarNotStopped => "classic_sidecar_not_stopped",
            FindingCode::ConfigInvalid => "config_invalid",
            FindingCode::ConfigLoaded => "config_loaded",
            FindingCode::ConfigMissing => "config_missing",
            FindingCode::ConfigUnreadable => "config_unreadable",
            FindingCode::DeploymentMissing => "deployment_missing",
            FindingCode::DeploymentUnreadable => "deployment_unreadable",
            FindingCode::EndpointTrusted => "endpoint_trusted",
            FindingCode::EndpointUnreachable => "endpoint_unreachable",
            FindingCode::EndpointUntrusted => "endpoint_untrusted",
            FindingCode::FlagRelayBehind => "flag_relay_behind",
            FindingCode::FlagRelaysCurrent => "flag_relays_current",
            FindingCode::FlagSyncUnreadable => "flag_sync_unreadable",
            FindingCode::FrontOutdated => "front_outdated",
            FindingCode::InvalidNamespaceLabel => "invalid_namespace_label",
            FindingCode::NamespaceExcluded => "namespace_excluded",
            FindingCode::NamespaceNotFound => "namespace_not_found",
            FindingCode::NamespaceNotSelected => "namespace_not_selected",
            FindingCode::NamespaceOptedIn => "namespace_opted_in",
            FindingCode::NamespaceOptedOut => "namespace_opted_out",
            FindingCode::NamespacesUnreadable => "namespaces_unreadable",
            FindingCode::CsiNodesUnreadable => "csi_nodes_unreadable",
            FindingCode::NodeWithoutCsiDriver => "node_without_csi_driver",
            FindingCode::NodeWithoutFront => "node_without_front",
            FindingCode::NodeWithoutPdp => "node_without_pdp",
            FindingCode::NodesUnreadable => "nodes_unreadable",
            FindingCode::PdpDaemonset => "pdp_daemonset",
            FindingCode::PdpDaemonsetMissing => "pdp_daemonset_missing",
            FindingCode::PdpFront => "pdp_front",
            FindingCode::PdpOutdated => "pdp_outdated",
            FindingCode::PdpUnreadable => "pdp_unreadable",
            FindingCode::PodsUnreadable => "pods_unreadable",
            FindingCode::ServingCertInvalid => "serving_cert_invalid",
            FindingCode::ServingCertTrusted => "serving_cert_trusted",
            FindingCode::ServingCertUntrusted => "serving_cert_untrusted",
            FindingCode::ServingSecretMissing => "serving_secret_missing",
            FindingCode::ServingSecretUnreadable => "serving_secret_unreadable",
            FindingCode::WebhookDegraded => "webhook_degraded",
            FindingCode::WebhookEntryDiffers => "webhook_entry_differs",
            FindingCode::WebhookEntryMissing => "webhook_entry_missing",
            FindingCode::WebhookMissing => "webhook_missing",
            FindingCode::WebhookNotReady => "webhook_not_ready",
            FindingCode::WebhookReady => "webhook_ready",
            FindingCode::WebhookRegistered => "webhook_registered",
            FindingCode::WebhookUnreadable => "webhook_unreadable",
            FindingCode::AdmissionApi => "admission_api",
            FindingCode::AdmissionApiMissing => "admission_api_missing",
            FindingCode::AdmissionPolicies => "admission_policies",
            FindingCode::AdmissionPoliciesSkipped => "admission_policies_skipped",
            FindingCode::AdmissionPolicyApiMissing => "admission_policy_api_missing",
            FindingCode::CriticalPriority => "critical_priority",
            FindingCode::CriticalPriorityMissing => "critical_priority_missing",
            FindingCode::CriticalPriorityQuotaShort => "critical_priority_quota_short",
            FindingCode::CsiApi => "csi_api",
            FindingCode::CsiApiMissing => "csi_api_missing",
            FindingCode::KubeletDir => "kubelet_dir",
            FindingCode::KubeletDirDiffers => "kubelet_dir_differs",
            FindingCode::KubeletDirUnknown => "kubelet_dir_unknown",
            FindingCode::KubernetesTooOld => "kubernetes_too_old",
            FindingCode::KubernetesVersion => "kubernetes_version",
            FindingCode::ModelCanRun => "model_can_run",
            FindingCode::ModelCannotRun => "model_cannot_run",
            FindingCode::NamespacePodSecurity => "namespace_pod_security",
            FindingCode::NoNamespacesToOptIn => "no_namespaces_to_opt_in",
            FindingCode::NodePortTaken => "node_port_taken",
            FindingCode::NodePortsFree => "node_ports_free",
            FindingCode::PreReadFailed => "pre_read_failed",
            FindingCode::PriorityClassExists => "priority_class_exists",
            FindingCode::PriorityClassTaken => "priority_class_taken",
            FindingCode::QuotaLimitsInstall => "quota_limits_install",
            FindingCode::QuotaTooSmall => "quota_too_small",
        }
    }
}

/// A finding's code: one of [`FindingCode`], or a Pod's [`Drift`].
impl From<FindingCode> for &'static str {
    fn from(code: FindingCode) -> &'static str {
        code.code()
    }
}

impl From<Drift> for &'static str {
    fn from(drift: Drift) -> &'static str {
        drift.code()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_unique_snake_case_and_apart_from_the_drifts() {
        let mut seen = std::collections::BTreeSet::new();
        for code in FindingCode::ALL {
            let c = code.code();
            assert!(
                c.chars().all(|ch| ch.is_ascii_lowercase() || ch == '_'),
                "{c}"
            );
            assert!(seen.insert(c), "{c} twice");
        }
        for drift in Drift::ALL {
            assert!(
                !seen.contains(drift.code()),
                "{} is a drift and a finding",
                drift.code()
            );
        }
    }
}
