//! The heart of `check`: what the webhook would do with a Pod now, compared with what the Pod carries.
//!
//! The decision is the core's own ([`core::inject`]), with the same config and the namespace's labels, so
//! `check` can never disagree with the webhook about who is opted in. A wired Pod is first stripped of what its
//! status annotation says the injector added, so the core sees the Pod as its owner wrote it.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;

use crate::config::Config;
use crate::core::{self, NamespaceInfo, Outcome, Reason, Status};
use crate::names::{
    ANNOTATION_MIRROR, ANNOTATION_STATUS, INIT_TOOLS, VOLUME_STATE, VOLUME_TOOLS, WATCH_PREFIX,
};

/// How a Pod's wiring differs from what the webhook would give it now. The codes are stable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Drift {
    /// The webhook would wire it, but it carries no wiring: created while the webhook was not called (not
    /// registered, down behind the `Ignore` entry) or before its namespace opted in.
    NotWired,
    /// Wired, but the webhook would not wire it now (opted out, namespace opted out or excluded since).
    NotWanted,
    /// Wired in another mode or with another profile than it would get now.
    OtherMode,
    /// Wired by a config with another hash: a restart picks up the change.
    StaleConfig,
    /// Wired by another injector version.
    StaleVersion,
    /// Same mode, profile, config and version, but other pieces than now (for example the socket, which
    /// depends on the namespace's Pod Security level).
    OtherWiring,
    /// The webhook would refuse this Pod now: its next replacement will not be created.
    WouldBeDenied,
    /// Its status annotation cannot be read: nothing can be compared.
    StatusUnreadable,
    /// Its status annotation claims a wiring the Pod does not carry (a copied or forged status): it runs
    /// without (part of) its PDP while the claim says otherwise.
    StatusNotCarried,
}

impl Drift {
    /// The stable code.
    pub fn code(self) -> &'static str {
        match self {
            Drift::NotWired => "not_wired",
            Drift::NotWanted => "not_wanted",
            Drift::OtherMode => "other_mode",
            Drift::StaleConfig => "stale_config",
            Drift::StaleVersion => "stale_version",
            Drift::OtherWiring => "other_wiring",
            Drift::WouldBeDenied => "would_be_denied",
            Drift::StatusUnreadable => "status_unreadable",
            Drift::StatusNotCarried => "status_not_carried",
        }
    }

    /// One line on what the drift means, for the report.
    pub fn meaning(self) -> &'static str {
        match self {
            Drift::NotWired => "opted in but not wired",
            Drift::NotWanted => "wired but no longer opted in",
            Drift::OtherMode => "wired in another mode or profile than now",
            Drift::StaleConfig => "wired by another config",
            Drift::StaleVersion => "wired by another injector version",
            Drift::OtherWiring => "wired with other pieces than now",
            Drift::WouldBeDenied => "the webhook would refuse it now",
            Drift::StatusUnreadable => "status annotation unreadable",
            Drift::StatusNotCarried => "status annotation claims a wiring the Pod does not carry",
        }
    }

    /// Every drift, for documentation.
    pub const ALL: [Drift; 9] = [
        Drift::NotWired,
        Drift::NotWanted,
        Drift::OtherMode,
        Drift::StaleConfig,
        Drift::StaleVersion,
        Drift::OtherWiring,
        Drift::WouldBeDenied,
        Drift::StatusUnreadable,
        Drift::StatusNotCarried,
    ];
}

/// A Pod that is not wired as the webhook would wire it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodDrift {
    /// What kind of difference.
    pub drift: Drift,
    /// The specifics: modes, hashes, the reason code of the decision.
    pub detail: String,
}

fn drift(drift: Drift, detail: String) -> Option<PodDrift> {
    Some(PodDrift { drift, detail })
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// The Pod without what `status` says the injector added (status annotation, PDP container, start-up gate, its
/// volumes and their mounts). Environment variables stay: the app may have set the same names itself (`env_kept`), and the
/// core leaves identical variables alone when it renders again.
pub fn unwire(pod: &Pod, status: &Status) -> Pod {
    let mut out = pod.clone();
    if let Some(a) = out.metadata.annotations.as_mut() {
        a.remove(ANNOTATION_STATUS);
    }
    let Some(spec) = out.spec.as_mut() else {
        return out;
    };
    if let Some(sidecar) = &status.sidecar {
        spec.containers.retain(|c| &c.name != sidecar);
        if let Some(inits) = spec.init_containers.as_mut() {
            inits.retain(|c| &c.name != sidecar);
        }
    }
    if let (Some(gate), Some(inits)) = (&status.gate, spec.init_containers.as_mut()) {
        inits.retain(|c| &c.name != gate);
    }
    let ours = |name: &str| status.volumes.iter().any(|v| v == name);
    // A classic sidecar's helper comes with its volume, and its watch container with the state volume.
    if ours(VOLUME_TOOLS)
        && let Some(inits) = spec.init_containers.as_mut()
    {
        inits.retain(|c| c.name != INIT_TOOLS);
    }
    if ours(VOLUME_STATE) {
        spec.containers
            .retain(|c| !c.name.starts_with(WATCH_PREFIX));
        if spec.share_process_namespace == Some(true) {
            spec.share_process_namespace = None;
        }
    }
    if let Some(volumes) = spec.volumes.as_mut() {
        volumes.retain(|v| !ours(&v.name));
    }
    for c in spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten())
    {
        if let Some(mounts) = c.volume_mounts.as_mut() {
            mounts.retain(|m| !ours(&m.name));
        }
    }
    out
}

pub(super) fn status_of(pod: &Pod) -> Option<Status> {
    serde_json::from_str(annotation(pod, ANNOTATION_STATUS)?).ok()
}

fn set(items: &[String]) -> BTreeSet<&str> {
    items.iter().map(String::as_str).collect()
}

/// Describes what differs between two sets of names (`volumes a, b no longer added; c added now`).
fn set_change(what: &str, before: &[String], now: &[String]) -> Option<String> {
    let (b, n) = (set(before), set(now));
    if b == n {
        return None;
    }
    let gone: Vec<&str> = b.difference(&n).copied().collect();
    let new: Vec<&str> = n.difference(&b).copied().collect();
    let mut parts = Vec::new();
    if !gone.is_empty() {
        parts.push(format!("{what} {} no longer", gone.join(", ")));
    }
    if !new.is_empty() {
        parts.push(format!("{what} {} now", new.join(", ")));
    }
    Some(parts.join("; "))
}

/// Compares one Pod with what the webhook would do with it now. `None`: in order (or not the webhook's
/// business: mirror Pods, Pods that carry a PDP container someone else added).
pub fn compare(pod: &Pod, ns: &NamespaceInfo, config: &Config) -> Option<PodDrift> {
    if annotation(pod, ANNOTATION_MIRROR).is_some() {
        return None;
    }
    let Some(raw) = annotation(pod, ANNOTATION_STATUS) else {
        return match core::inject(pod, ns, config) {
            Outcome::Injected(i) => drift(
                Drift::NotWired,
                format!(
                    "would get {} mode (profile {}) but has no PDP: created while the webhook was not called, or \
                     before its namespace opted in",
                    i.mode, i.profile
                ),
            ),
            Outcome::Denied(d) => drift(Drift::WouldBeDenied, d.to_string()),
            Outcome::Skipped { .. } => None,
        };
    };
    let was: Status = match serde_json::from_str(raw) {
        Ok(s) => s,
        Err(e) => {
            return drift(
                Drift::StatusUnreadable,
                format!("annotation {ANNOTATION_STATUS} is not a status the injector wrote ({e})"),
            );
        }
    };
    // The real objects, not the claim: a status copied onto an unwired template must not pass.
    let json = core::view::pod_json(pod);
    if config.profiles.contains_key(&was.profile)
        && let Ok(view) = core::PodView::parse(&json)
        && let Some(what) = core::decide::missing_wiring(&view, &was, config)
    {
        return drift(
            Drift::StatusNotCarried,
            format!(
                "annotation {ANNOTATION_STATUS} claims {} mode (profile {}), but {what} is missing",
                was.mode, was.profile
            ),
        );
    }
    let pristine = unwire(pod, &was);
    let wired = format!("wired in {} mode (profile {})", was.mode, was.profile);
    let now = match core::inject(&pristine, ns, config) {
        Outcome::Denied(d) => return drift(Drift::WouldBeDenied, format!("{wired}; now: {d}")),
        // Someone else's PDP container (or ours under a name the status does not record): not ours to judge.
        Outcome::Skipped {
            reason: Reason::AlreadyInjected | Reason::MirrorPod | Reason::NotAPodCreate,
            ..
        } => return None,
        Outcome::Skipped { reason, .. } => {
            return drift(
                Drift::NotWanted,
                format!("{wired}, but the webhook would not wire it now ({reason})"),
            );
        }
        // The core always writes its status on a first injection; without one nothing can be compared.
        Outcome::Injected(i) => i.status,
    };
    if (was.mode, &was.profile) != (now.mode, &now.profile) {
        return drift(
            Drift::OtherMode,
            format!(
                "{wired}, would get {} mode (profile {}) now",
                now.mode, now.profile
            ),
        );
    }
    if was.config_hash != now.config_hash {
        let version = if was.version != now.version {
            format!(", injector {} (now {})", was.version, now.version)
        } else {
            String::new()
        };
        return drift(
            Drift::StaleConfig,
            format!(
                "wired by config {} (now {}){version}",
                was.config_hash, now.config_hash
            ),
        );
    }
    if was.version != now.version {
        return drift(
            Drift::StaleVersion,
            format!("wired by injector {} (now {})", was.version, now.version),
        );
    }
    let sidecar = |s: &Status| s.sidecar.iter().cloned().collect::<Vec<_>>();
    let changes: Vec<String> = [
        set_change("volumes", &was.volumes, &now.volumes),
        set_change("containers", &was.containers, &now.containers),
        set_change("sidecar", &sidecar(&was), &sidecar(&now)),
    ]
    .into_iter()
    .flatten()
    .collect();
    if changes.is_empty() {
        return None;
    }
    drift(
        Drift::OtherWiring,
        format!("{wired}; {}", changes.join("; ")),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Mode;
    use serde_json::json;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    fn plain(annotations: serde_json::Value) -> Pod {
        pod(json!({
            "metadata": {"name": "app", "namespace": "shop", "annotations": annotations},
            "spec": {"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.9"}]}
        }))
    }

    fn ns(labels: &[(&str, &str)]) -> NamespaceInfo {
        let labels: std::collections::BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        NamespaceInfo::from_labels("shop", &labels)
    }

    /// A Pod as the webhook stored it: the core's own output for `p` in `n` with `config`.
    fn wired(p: &Pod, n: &NamespaceInfo, config: &Config) -> Pod {
        match core::inject(p, n, config) {
            Outcome::Injected(i) => core::patched(p, &i.patch).expect("the core's patch applies"),
            other => panic!("fixture not injected: {other:?}"),
        }
    }

    fn other_config() -> Config {
        Config::from_yaml("profiles:\n  cerbos:\n    image: ghcr.io/cerbos/cerbos:0.43.0\n")
            .unwrap()
    }

    #[test]
    fn plain_pod_that_never_opted_in_is_in_order() {
        let config = Config::builtin();
        assert_eq!(compare(&plain(json!({})), &ns(&[]), &config), None);
    }

    #[test]
    fn wired_pod_in_order() {
        let config = Config::builtin();
        let n = ns(&[("pdp-injector.io/injection", "enabled")]);
        let p = wired(&plain(json!({})), &n, &config);
        assert_eq!(compare(&p, &n, &config), None);
        // A sidecar too: the PDP container is stripped before the core decides again.
        let p = wired(
            &plain(json!({"pdp-injector.io/inject": "sidecar"})),
            &ns(&[]),
            &config,
        );
        assert_eq!(compare(&p, &ns(&[]), &config), None);
        // The classic form (before 1.29): its helper init container goes with it.
        let classic = Config::builtin().with_classic_sidecars();
        let p = wired(
            &plain(json!({"pdp-injector.io/inject": "sidecar"})),
            &ns(&[]),
            &classic,
        );
        let inits = p.spec.as_ref().unwrap().init_containers.as_ref().unwrap();
        assert_eq!(inits[0].name, INIT_TOOLS);
        assert_eq!(compare(&p, &ns(&[]), &classic), None);
    }

    #[test]
    fn a_status_that_claims_more_than_the_pod_carries_is_flagged() {
        let config = Config::builtin();
        let n = ns(&[("pdp-injector.io/injection", "enabled")]);
        for inject in ["sidecar", "daemonset"] {
            let p = wired(
                &plain(json!({"pdp-injector.io/inject": inject})),
                &n,
                &config,
            );
            assert_eq!(compare(&p, &n, &config), None, "{inject}");
            // The status copied onto the unwired template: the claim alone does not pass.
            let raw = annotation(&p, ANNOTATION_STATUS).unwrap();
            let copied = plain(json!({"pdp-injector.io/inject": inject, ANNOTATION_STATUS: raw}));
            let d = compare(&copied, &n, &config).unwrap();
            assert_eq!(d.drift, Drift::StatusNotCarried, "{inject}: {d:?}");
            assert!(d.detail.contains("is missing"), "{d:?}");
            // One variable taken out of the wired Pod is enough.
            let mut partial = p.clone();
            let app = &mut partial.spec.as_mut().unwrap().containers[0];
            app.env
                .as_mut()
                .unwrap()
                .retain(|e| e.name != "CERBOS_PDP_ADDR");
            let d = compare(&partial, &n, &config).unwrap();
            assert_eq!(d.drift, Drift::StatusNotCarried, "{inject}: {d:?}");
            assert!(d.detail.contains("CERBOS_PDP_ADDR"), "{d:?}");
        }
    }

    #[test]
    fn namespace_opted_in_after_its_pods_existed() {
        let d = compare(
            &plain(json!({})),
            &ns(&[("pdp-injector.io/injection", "daemonset")]),
            &Config::builtin(),
        )
        .unwrap();
        assert_eq!(d.drift, Drift::NotWired);
        assert!(
            d.detail.contains("daemonset mode (profile cerbos)"),
            "{d:?}"
        );
    }

    #[test]
    fn annotated_pod_created_while_the_webhook_was_away() {
        let d = in_unlabelled(json!({"pdp-injector.io/inject": "sidecar"}));
        assert_eq!(d.drift, Drift::NotWired);
    }

    #[test]
    fn config_change_makes_wired_pods_stale() {
        let n = ns(&[("pdp-injector.io/injection", "enabled")]);
        let before = Config::builtin();
        let p = wired(&plain(json!({})), &n, &before);
        let after = other_config();
        let d = compare(&p, &n, &after).unwrap();
        assert_eq!(d.drift, Drift::StaleConfig);
        assert!(d.detail.contains(&before.hash) && d.detail.contains(&after.hash));
    }

    #[test]
    fn other_injector_version_is_stale() {
        let config = Config::builtin();
        let n = ns(&[("pdp-injector.io/injection", "enabled")]);
        let mut p = wired(&plain(json!({})), &n, &config);
        let mut s = status_of(&p).unwrap();
        s.version = "0.0.1".into();
        p.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(ANNOTATION_STATUS.into(), serde_json::to_string(&s).unwrap());
        let d = compare(&p, &n, &config).unwrap();
        assert_eq!(d.drift, Drift::StaleVersion);
        assert!(d.detail.contains("0.0.1"), "{d:?}");
    }

    /// How `check` judges a Pod with `annotations` in an unlabelled namespace, by the built-in config.
    fn in_unlabelled(annotations: serde_json::Value) -> PodDrift {
        compare(&plain(annotations), &ns(&[]), &Config::builtin()).unwrap()
    }

    /// A Pod wired in a namespace labelled `before`, compared once the label is `after`.
    fn relabelled(before: &str, after: &str) -> (Pod, PodDrift) {
        let config = Config::builtin();
        let label = "pdp-injector.io/injection";
        let p = wired(&plain(json!({})), &ns(&[(label, before)]), &config);
        let d = compare(&p, &ns(&[(label, after)]), &config).unwrap();
        (p, d)
    }

    #[test]
    fn namespace_opted_out_after_wiring() {
        let config = Config::builtin();
        let (p, d) = relabelled("enabled", "disabled");
        assert_eq!(d.drift, Drift::NotWanted);
        assert!(d.detail.contains("namespace_opted_out"), "{d:?}");
        // The label removed: not opted in any more.
        let d = compare(&p, &ns(&[]), &config).unwrap();
        assert!(d.detail.contains("not_opted_in"), "{d:?}");
    }

    #[test]
    fn pod_annotated_disabled_after_wiring() {
        let config = Config::builtin();
        let mut p = wired(
            &plain(json!({"pdp-injector.io/inject": "daemonset"})),
            &ns(&[]),
            &config,
        );
        p.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert("pdp-injector.io/inject".into(), "disabled".into());
        let d = compare(&p, &ns(&[]), &config).unwrap();
        assert_eq!(d.drift, Drift::NotWanted);
        assert!(d.detail.contains("opted_out"), "{d:?}");
    }

    #[test]
    fn namespace_mode_changed_after_wiring() {
        let (_, d) = relabelled("sidecar", "daemonset");
        assert_eq!(d.drift, Drift::OtherMode);
        assert!(
            d.detail.contains("sidecar mode") && d.detail.contains("daemonset mode"),
            "{d:?}"
        );
    }

    #[test]
    fn pod_security_level_changed_after_wiring() {
        let config = Config::builtin();
        let privileged = ns(&[
            ("pdp-injector.io/injection", "daemonset"),
            ("pod-security.kubernetes.io/enforce", "privileged"),
        ]);
        let p = wired(&plain(json!({})), &privileged, &config);
        assert_eq!(compare(&p, &privileged, &config), None);
        let baseline = ns(&[
            ("pdp-injector.io/injection", "daemonset"),
            ("pod-security.kubernetes.io/enforce", "baseline"),
        ]);
        let d = compare(&p, &baseline, &config).unwrap();
        assert_eq!(d.drift, Drift::OtherWiring);
        assert!(
            d.detail.contains("volumes pdp-injector-socket no longer"),
            "{d:?}"
        );
    }

    #[test]
    fn invalid_opt_in_that_slipped_past_is_reported() {
        let d = in_unlabelled(json!({"pdp-injector.io/inject": "sidecars"}));
        assert_eq!(d.drift, Drift::WouldBeDenied);
        assert!(d.detail.contains("invalid_annotation"), "{d:?}");
    }

    #[test]
    fn unreadable_status_is_reported_not_guessed() {
        let p = plain(json!({"pdp-injector.io/status": "{not json"}));
        assert_eq!(
            compare(&p, &ns(&[]), &Config::builtin()).unwrap().drift,
            Drift::StatusUnreadable
        );
    }

    #[test]
    fn mirror_pods_and_foreign_pdp_containers_are_left_alone() {
        let config = Config::builtin();
        let mirror =
            plain(json!({"kubernetes.io/config.mirror": "x", "pdp-injector.io/inject": "sidecar"}));
        assert_eq!(compare(&mirror, &ns(&[]), &config), None);
        let by_hand = pod(json!({
            "metadata": {"name": "app", "annotations": {"pdp-injector.io/inject": "sidecar"}},
            "spec": {"containers": [{"name": "app"}, {"name": "cerbos-pdp"}]}
        }));
        assert_eq!(compare(&by_hand, &ns(&[]), &config), None);
    }

    #[test]
    fn excluded_namespace_after_wiring_is_not_wanted() {
        let n = ns(&[("pdp-injector.io/injection", "enabled")]);
        let p = wired(&plain(json!({})), &n, &Config::builtin());
        let config = Config::from_yaml("excludedNamespaces: [shop]\n").unwrap();
        let d = compare(&p, &n, &config).unwrap();
        assert_eq!(d.drift, Drift::NotWanted);
        assert!(d.detail.contains("excluded_namespace"), "{d:?}");
    }

    #[test]
    fn unwire_strips_only_what_the_status_records() {
        let config = Config::builtin();
        let p = plain(json!({"pdp-injector.io/inject": "sidecar", "keep": "me"}));
        let w = wired(&p, &ns(&[]), &config);
        let s = status_of(&w).unwrap();
        assert_eq!(s.mode, Mode::Sidecar);
        let u = unwire(&w, &s);
        let spec = u.spec.as_ref().unwrap();
        assert!(
            spec.init_containers
                .iter()
                .flatten()
                .chain(&spec.containers)
                .all(|c| Some(&c.name) != s.sidecar.as_ref())
        );
        assert!(
            spec.volumes
                .iter()
                .flatten()
                .all(|v| !s.volumes.contains(&v.name))
        );
        let a = u.metadata.annotations.as_ref().unwrap();
        assert!(!a.contains_key(ANNOTATION_STATUS) && a.contains_key("keep"));
    }
}
