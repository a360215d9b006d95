//! The Namespaces section: opted-in namespaces, their mode as the core parses it, their Pod Security level and
//! what it means for the socket.

use k8s_openapi::api::core::v1::Namespace;

use crate::check::analyse::install::fail_entry;
use crate::check::analyse::labels_of;
use crate::check::analyse::pod_section::in_scope;
use crate::check::codes::FindingCode as Code;
use crate::check::report::{Finding, Section, Severity};
use crate::check::{ClusterView, selectors};
use crate::config::{Config, Mode, PssLevel};
use crate::core::NamespaceInfo;
use crate::names::LABEL_NAMESPACE_INJECTION;

/// The mode a namespace label asks for, `Ok(None)` for `disabled`, `Err` for a value the webhook refuses.
/// The namespace label judged by the core's own parser (without a readable config: the built-in one's).
pub(super) fn namespace_mode(value: &str, config: Option<&Config>) -> Result<Option<Mode>, String> {
    match config {
        Some(c) => crate::core::decide::namespace_mode(value, c),
        None => crate::core::decide::namespace_mode(value, &Config::builtin()),
    }
}

/// Opted-in namespaces: their mode, Pod Security level and what the level means for the socket.
pub(super) fn namespaces_section(
    view: &ClusterView,
    config: Option<&Config>,
    all: &[Namespace],
    section: &mut Section,
) {
    let fail = fail_entry(view);
    let (mut opted_in, mut opted_out) = (0, 0);
    for ns in all
        .iter()
        .filter(|n| in_scope(view, n.metadata.name.as_deref()))
    {
        let name = ns.metadata.name.clone().unwrap_or_default();
        let labels = labels_of(ns);
        let Some(value) = labels.get(LABEL_NAMESPACE_INJECTION) else {
            continue;
        };
        let subject = format!("namespace {name}");
        if config.is_some_and(|c| c.excluded_namespaces.contains(&name)) {
            section.push(Finding::new(
                Severity::Warning,
                Code::NamespaceExcluded,
                &subject,
                format!("labelled {LABEL_NAMESPACE_INJECTION}={value} but excluded by the config: never injected"),
            ));
            continue;
        }
        let mode = match namespace_mode(value, config) {
            Err(valid) => {
                section.push(
                    Finding::new(
                        Severity::Error,
                        Code::InvalidNamespaceLabel,
                        &subject,
                        format!(
                            "{LABEL_NAMESPACE_INJECTION}={value} is not a valid value: the webhook refuses its Pods \
                             ({valid})"
                        ),
                    )
                    .fix(format!("kubectl label namespace {name} {LABEL_NAMESPACE_INJECTION}=enabled --overwrite")),
                );
                continue;
            }
            Ok(None) => {
                opted_out += 1;
                section.push(Finding::new(
                    Severity::Info,
                    Code::NamespaceOptedOut,
                    &subject,
                    "disabled: no Pod is wired",
                ));
                continue;
            }
            Ok(Some(m)) => m,
        };
        opted_in += 1;
        let info = NamespaceInfo::from_labels(&name, &labels);
        let level = config.map_or(PssLevel::Baseline, |c| info.pss_level(c));
        let source = if info.pss_enforce.is_some() {
            ""
        } else {
            " (no enforce label: the config's default)"
        };
        // How the default profile's Pods get the node's socket here.
        let by = config.and_then(|c| {
            c.profiles
                .get(&c.default_profile)
                .map(|p| c.socket_by(p, level))
        });
        let meaning = match (mode, level) {
            (Mode::Sidecar, _) => "the sidecar meets every level".to_string(),
            (Mode::Central, _) => {
                "central wiring: variables only, which every level allows".to_string()
            }
            (Mode::Daemonset, _) if by == Some(crate::config::SocketBy::Csi) => {
                "daemonset wiring with the node's socket (the node plugin's CSI volume, which every level allows) and TCP"
                    .to_string()
            }
            (Mode::Daemonset, PssLevel::Privileged) => {
                "daemonset wiring with the node's socket and TCP".to_string()
            }
            (Mode::Daemonset, l) => format!(
                "daemonset wiring over TCP only: {} forbids hostPath, so the socket is dropped (downgraded_pss); install \
                 the node plugin's CSIDriver csi.pdp-injector.io (socketVolume auto or csi), or label the namespace \
                 pod-security.kubernetes.io/enforce=privileged, to get it",
                l.as_str()
            ),
        };
        section.push(Finding::new(
            Severity::Ok,
            Code::NamespaceOptedIn,
            &subject,
            format!(
                "{value} ({mode} mode), Pod Security {}{source}: {meaning}",
                level.as_str()
            ),
        ));
        if let Some(w) = fail
            && !selectors::matches(w.namespace_selector.as_ref(), &labels)
        {
            section.push(
                Finding::new(
                    Severity::Error,
                    Code::NamespaceNotSelected,
                    &subject,
                    format!("opted in, but webhook entry {} does not select it: its Pods are not sent to the webhook", w.name),
                )
                .fix("kubectl apply -k manifests/overlays/daemonset (or the overlay you installed)"),
            );
        }
    }
    if let Some(scope) = &view.scope
        && view.namespaces.is_ok()
        && !all.iter().any(|n| n.metadata.name.as_ref() == Some(scope))
    {
        section.push(Finding::new(
            Severity::Warning,
            Code::NamespaceNotFound,
            format!("namespace {scope}"),
            "does not exist: nothing to check in it",
        ));
    }
    section.summary = format!("{opted_in} opted in, {opted_out} opted out");
}
