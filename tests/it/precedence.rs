//! The precedence table of SPEC.md, row by row:
//! namespace `disabled` > Pod `disabled` > Pod mode > namespace mode > config default.

use k8s_openapi::api::core::v1::Pod;
use pdp_core::config::{Config, Mode};
use pdp_core::core::{Decision, NamespaceInfo, Outcome, Reason, decide_pod, inject_json};

fn pod(annotation: Option<&str>, label: Option<&str>) -> Pod {
    let mut meta = serde_json::json!({"name": "p"});
    if let Some(a) = annotation {
        meta["annotations"] = serde_json::json!({"pdp-injector.io/inject": a});
    }
    if let Some(l) = label {
        meta["labels"] = serde_json::json!({"pdp-injector.io/inject": l});
    }
    serde_json::from_value(serde_json::json!({
        "metadata": meta,
        "spec": {"containers": [{"name": "app", "image": "x"}]}
    }))
    .unwrap()
}

fn ns(label: Option<&str>) -> NamespaceInfo {
    NamespaceInfo {
        name: "team".into(),
        injection: label.map(String::from),
        pss_enforce: None,
        required: false,
    }
}

#[derive(Debug, PartialEq)]
enum Want {
    Inject(Mode),
    Skip(Reason),
    Deny(Reason),
}

fn run(ns_label: Option<&str>, pod_value: Option<&str>, config: &Config) -> Want {
    match decide_pod(&pod(pod_value, None), &ns(ns_label), config) {
        Decision::Inject(plan) => Want::Inject(plan.mode),
        Decision::Skip(r, _) => Want::Skip(r),
        Decision::Deny(d) => Want::Deny(d.reason),
    }
}

#[test]
fn precedence_table() {
    use Mode::*;
    use Want::*;
    let config = Config::builtin(); // default mode daemonset, opt-in only
    let rows: &[(Option<&str>, Option<&str>, Want)] = &[
        // namespace disabled wins over everything
        (
            Some("disabled"),
            Some("sidecar"),
            Skip(Reason::NamespaceOptedOut),
        ),
        (
            Some("disabled"),
            Some("daemonset"),
            Skip(Reason::NamespaceOptedOut),
        ),
        (
            Some("disabled"),
            Some("enabled"),
            Skip(Reason::NamespaceOptedOut),
        ),
        (
            Some("disabled"),
            Some("bogus"),
            Skip(Reason::NamespaceOptedOut),
        ),
        (Some("disabled"), None, Skip(Reason::NamespaceOptedOut)),
        // Pod disabled wins over namespace modes
        (Some("enabled"), Some("disabled"), Skip(Reason::OptedOut)),
        (Some("sidecar"), Some("disabled"), Skip(Reason::OptedOut)),
        (Some("daemonset"), Some("disabled"), Skip(Reason::OptedOut)),
        (None, Some("disabled"), Skip(Reason::OptedOut)),
        // Pod mode wins over namespace mode
        (Some("daemonset"), Some("sidecar"), Inject(Sidecar)),
        (Some("sidecar"), Some("daemonset"), Inject(Daemonset)),
        (Some("enabled"), Some("sidecar"), Inject(Sidecar)),
        (None, Some("sidecar"), Inject(Sidecar)),
        (None, Some("daemonset"), Inject(Daemonset)),
        // Pod enabled: namespace mode, else config default
        (Some("sidecar"), Some("enabled"), Inject(Sidecar)),
        (Some("daemonset"), Some("enabled"), Inject(Daemonset)),
        (Some("enabled"), Some("enabled"), Inject(Daemonset)),
        (None, Some("enabled"), Inject(Daemonset)),
        // No Pod value: namespace decides
        (Some("sidecar"), None, Inject(Sidecar)),
        (Some("daemonset"), None, Inject(Daemonset)),
        (Some("enabled"), None, Inject(Daemonset)),
        (None, None, Skip(Reason::NotOptedIn)),
        // Invalid values are denied, not guessed
        (None, Some("Sidecar"), Deny(Reason::InvalidAnnotation)),
        (
            Some("enabled"),
            Some("true"),
            Deny(Reason::InvalidAnnotation),
        ),
        (Some("yes"), None, Deny(Reason::InvalidNamespaceLabel)),
        (
            Some("yes"),
            Some("sidecar"),
            Deny(Reason::InvalidNamespaceLabel),
        ),
        (Some("yes"), Some("disabled"), Skip(Reason::OptedOut)),
    ];
    for (ns_label, pod_value, want) in rows {
        assert_eq!(
            &run(*ns_label, *pod_value, &config),
            want,
            "namespace {ns_label:?}, Pod {pod_value:?}"
        );
    }
}

#[test]
fn config_default_mode_and_inject_by_default() {
    let config = Config::from_yaml("defaultMode: sidecar\ninjectByDefault: true\n").unwrap();
    assert_eq!(run(None, None, &config), Want::Inject(Mode::Sidecar));
    assert_eq!(
        run(Some("enabled"), None, &config),
        Want::Inject(Mode::Sidecar)
    );
    assert_eq!(
        run(Some("daemonset"), None, &config),
        Want::Inject(Mode::Daemonset)
    );
    assert_eq!(
        run(None, Some("disabled"), &config),
        Want::Skip(Reason::OptedOut)
    );
    assert_eq!(
        run(Some("disabled"), None, &config),
        Want::Skip(Reason::NamespaceOptedOut)
    );
}

#[test]
fn annotation_beats_label_of_the_same_key() {
    let config = Config::builtin();
    let decision = decide_pod(&pod(Some("daemonset"), Some("sidecar")), &ns(None), &config);
    assert!(matches!(decision, Decision::Inject(p) if p.mode == Mode::Daemonset));
    let decision = decide_pod(&pod(None, Some("sidecar")), &ns(None), &config);
    assert!(matches!(decision, Decision::Inject(p) if p.mode == Mode::Sidecar));
    let Decision::Deny(d) = decide_pod(&pod(None, Some("on")), &ns(None), &config) else {
        panic!("invalid label value not denied");
    };
    assert!(
        d.message.contains("label pdp-injector.io/inject"),
        "{}",
        d.message
    );
    assert!(d.message.contains("\"on\""), "{}", d.message);
    assert!(
        d.message
            .contains("sidecar, daemonset, central, enabled, disabled"),
        "{}",
        d.message
    );
}

#[test]
fn denial_messages_name_key_value_and_valid_values() {
    let config = Config::builtin();
    let Decision::Deny(d) = decide_pod(&pod(Some("sidecars"), None), &ns(None), &config) else {
        panic!()
    };
    assert_eq!(
        d.message,
        "invalid value \"sidecars\" for annotation pdp-injector.io/inject: valid values are sidecar, daemonset, central, enabled, disabled"
    );
    assert_eq!(d.reason.code(), "invalid_annotation");
}

#[test]
fn excluded_namespaces_and_mirror_pods_come_first() {
    let config = Config::builtin();
    for name in [
        "kube-system",
        "kube-public",
        "kube-node-lease",
        "pdp-system",
    ] {
        let mut n = ns(Some("sidecar"));
        n.name = name.into();
        // even an invalid Pod value is not looked at in an excluded namespace
        let d = decide_pod(&pod(Some("bogus"), None), &n, &config);
        assert_eq!(
            d,
            Decision::Skip(Reason::ExcludedNamespace, vec![]),
            "{name}"
        );
    }
    let mut mirror = pod(Some("sidecar"), None);
    mirror
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert("kubernetes.io/config.mirror".into(), "x".into());
    assert_eq!(
        decide_pod(&mirror, &ns(None), &config),
        Decision::Skip(Reason::MirrorPod, vec![])
    );
}

#[test]
fn reason_codes_are_unique_snake_case() {
    let mut seen = std::collections::BTreeSet::new();
    for r in Reason::ALL {
        let code = r.code();
        assert!(
            code.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
            "{code}"
        );
        assert!(seen.insert(code), "duplicate {code}");
        assert_eq!(serde_json::to_value(r).unwrap(), serde_json::json!(code));
    }
}

/// `check` judges the namespace label with `core::decide::namespace_mode`; the webhook decides with `decide`.
/// Every value, valid or not, must mean the same to both (a second parser once called `central` invalid).
#[test]
fn namespace_label_means_the_same_to_the_decision_and_to_check() {
    use pdp_core::core::decide::namespace_mode;
    let mut sidecar_default = Config::builtin();
    sidecar_default.default_mode = Mode::Sidecar;
    let values = [
        "enabled",
        "sidecar",
        "daemonset",
        "central",
        "disabled",
        "",
        "Enabled",
        "CENTRAL",
        "true",
        " sidecar",
        "daemonset,sidecar",
        "none",
    ];
    for config in [&Config::builtin(), &sidecar_default] {
        for value in values {
            let decided = run(Some(value), None, config);
            let judged = namespace_mode(value, config);
            match (&decided, &judged) {
                (Want::Inject(m), Ok(Some(j))) => assert_eq!(m, j, "{value:?}"),
                (Want::Skip(Reason::NamespaceOptedOut), Ok(None)) => {}
                (Want::Deny(Reason::InvalidNamespaceLabel), Err(msg)) => {
                    assert!(msg.contains("central"), "{value:?}: {msg}")
                }
                _ => panic!("{value:?}: decide gives {decided:?}, check's parser {judged:?}"),
            }
        }
    }
}
fn required(label: &str) -> NamespaceInfo {
    let labels = [
        ("pdp-injector.io/injection".to_string(), label.to_string()),
        ("pdp-injector.io/required".to_string(), "true".to_string()),
    ];
    NamespaceInfo::from_labels("team", labels.iter().map(|(k, v)| (k, v)))
}

/// The outcome for a Pod's JSON, read as the webhook reads the apiserver's (its text, not a typed Pod).
fn outcome_of(p: serde_json::Value, ns: &NamespaceInfo) -> pdp_core::core::Outcome {
    let text = p.to_string();
    let view = pdp_core::core::PodView::parse(&text).unwrap();
    pdp_core::core::inject_view(&view, ns, &Config::builtin())
}

fn wired_status(annotations: serde_json::Value) -> serde_json::Value {
    let p = serde_json::json!({
        "metadata": {"name": "p", "annotations": annotations},
        "spec": {"containers": [{"name": "app", "image": "x"}]}
    });
    let typed: Pod = serde_json::from_value(p.clone()).unwrap();
    match pdp_core::core::inject(&typed, &ns(None), &Config::builtin()) {
        pdp_core::core::Outcome::Injected(i) => {
            serde_json::to_value(pdp_core::core::patched(&typed, &i.patch).unwrap()).unwrap()
        }
        other => panic!("fixture not injected: {other:?}"),
    }
}

#[test]
fn a_namespace_that_requires_injection_refuses_every_way_out() {
    use pdp_core::core::Outcome;
    let reason = |o: &Outcome| o.reason();
    let app = serde_json::json!([{"name": "app", "image": "x"}]);
    // Opt-outs, by annotation and by label, and the precedence table's skip elsewhere.
    for (key, meta) in [
        (
            "annotation",
            serde_json::json!({"name": "p", "annotations": {"pdp-injector.io/inject": "disabled"}}),
        ),
        (
            "label",
            serde_json::json!({"name": "p", "labels": {"pdp-injector.io/inject": "disabled"}}),
        ),
    ] {
        let p = serde_json::json!({"metadata": meta, "spec": {"containers": app}});
        let o = outcome_of(p.clone(), &required("daemonset"));
        let Outcome::Denied(d) = &o else {
            panic!("{key}: {o:?}")
        };
        assert_eq!(d.reason, Reason::RequiredOptOut);
        assert!(
            d.message
                .contains(&format!("{key} pdp-injector.io/inject=disabled"))
                && d.message.contains("\"team\""),
            "{}",
            d.message
        );
        assert_eq!(
            reason(&outcome_of(p, &ns(Some("daemonset")))),
            Reason::OptedOut
        );
    }
    // Without an opt-in label, the required label alone changes nothing.
    let p = serde_json::json!({"metadata": {"name": "p", "annotations": {"pdp-injector.io/inject": "disabled"}}, "spec": {"containers": app}});
    let mut only_required = required("disabled");
    assert_eq!(
        reason(&outcome_of(p.clone(), &only_required)),
        Reason::NamespaceOptedOut
    );
    only_required.injection = None;
    assert_eq!(reason(&outcome_of(p, &only_required)), Reason::OptedOut);

    // A container named like the chosen profile's PDP: refused here, skipped elsewhere. Another profile's
    // container name (flagd) does not count anywhere.
    let named = |name: &str| serde_json::json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "app", "image": "x"}, {"name": name, "image": "x"}]}});
    assert_eq!(
        reason(&outcome_of(named("cerbos-pdp"), &required("sidecar"))),
        Reason::PdpContainerNamed
    );
    assert_eq!(
        reason(&outcome_of(named("cerbos-pdp"), &ns(Some("sidecar")))),
        Reason::AlreadyInjected
    );
    assert_eq!(
        reason(&outcome_of(named("flagd"), &required("sidecar"))),
        Reason::InjectedSidecar
    );
    assert_eq!(
        reason(&outcome_of(named("flagd"), &ns(Some("daemonset")))),
        Reason::InjectedDaemonset
    );

    // A status copied onto an unwired template, an unreadable one, and one of an unknown profile: refused here,
    // wired afresh elsewhere. The wired Pod itself passes in both.
    let wired = wired_status(serde_json::json!({"pdp-injector.io/inject": "daemonset"}));
    let status = wired["metadata"]["annotations"]["pdp-injector.io/status"].clone();
    assert_eq!(
        reason(&outcome_of(wired.clone(), &required("daemonset"))),
        Reason::AlreadyInjected
    );
    for forged in [status, "{\"mode\":".into(), status_of_profile("nosuch")] {
        let p = serde_json::json!({"metadata": {"name": "p", "annotations": {"pdp-injector.io/status": forged}}, "spec": {"containers": app}});
        let o = outcome_of(p.clone(), &required("daemonset"));
        let Outcome::Denied(d) = &o else {
            panic!("{forged}: {o:?}")
        };
        assert_eq!(d.reason, Reason::ForgedStatus, "{}", d.message);
        assert_eq!(
            reason(&outcome_of(p, &ns(Some("daemonset")))),
            Reason::InjectedDaemonset,
            "{forged}"
        );
    }

    // The status of a further profile (cerbos,flagd) is checked the same way.
    let both = serde_json::json!({"pdp-injector.io/inject": "daemonset", "pdp-injector.io/profile": "cerbos,flagd"});
    let wired = wired_status(both.clone());
    assert_eq!(
        reason(&outcome_of(wired.clone(), &required("daemonset"))),
        Reason::AlreadyInjected
    );
    let second = wired["metadata"]["annotations"]["pdp-injector.io/status-flagd"].clone();
    assert!(second.is_string(), "{wired}");
    let mut annotations = both.clone();
    annotations["pdp-injector.io/status-flagd"] = second;
    let p = serde_json::json!({"metadata": {"name": "p", "annotations": annotations}, "spec": {"containers": app}});
    let o = outcome_of(p.clone(), &required("daemonset"));
    let Outcome::Denied(d) = &o else {
        panic!("{o:?}")
    };
    assert!(
        d.reason == Reason::ForgedStatus && d.message.contains("pdp-injector.io/status-flagd"),
        "{}",
        d.message
    );
    let o = outcome_of(p, &ns(Some("daemonset")));
    assert_eq!(reason(&o), Reason::InjectedDaemonset);
    assert!(
        o.warnings()
            .iter()
            .any(|w| w.code.code() == "status_not_carried"),
        "{o:?}"
    );
}

fn status_of_profile(profile: &str) -> serde_json::Value {
    serde_json::json!({"mode": "daemonset", "profile": profile, "reason": "injected_daemonset", "configHash": "x",
        "version": "0.1.0", "containers": ["app"], "env": ["CERBOS_PDP_HOST", "CERBOS_PDP_ADDR"]})
    .to_string()
    .into()
}

#[test]
fn a_status_recording_a_variable_its_profile_never_writes_is_wired_once() {
    use pdp_core::core::Outcome;
    // Found by fuzzing: a status claiming no container yet recording a misspelt variable. The re-wiring recorded
    // every container as carrying it, and the next pass, checking that claim, wired the Pod again. A name the
    // profile never writes is no claim of ours: the status is believed, and the Pod is wired once.
    let forged = serde_json::json!({"mode": "daemonset", "profile": "cerbos", "reason": "injected_daemonset",
        "configHash": "x", "version": "0.1.0", "containers": [],
        "env": ["CERBOS_PDP_HOST", "CERBOS_PDP_ADDR", "CERBOS_PPD_SOCKET"]})
    .to_string();
    let p = serde_json::json!({
        "metadata": {"name": "p", "annotations": {"pdp-injector.io/inject": "daemonset", "pdp-injector.io/status": forged}},
        "spec": {"containers": [{"name": "app", "image": "x"}]}
    });
    let o = outcome_of(p.clone(), &ns(None));
    let Outcome::Injected(injected) = &o else {
        panic!("{o:?}")
    };
    assert!(o.warnings().is_empty(), "{o:?}");
    let typed: Pod = serde_json::from_value(p).unwrap();
    let wired = pdp_core::core::patched(&typed, &injected.patch).unwrap();
    let again = outcome_of(serde_json::to_value(wired).unwrap(), &ns(None));
    assert_eq!(again.reason(), Reason::AlreadyInjected, "{again:?}");
}

#[test]
fn a_status_recording_tls_variables_without_tls_s_flag_is_not_believed() {
    use pdp_core::core::Outcome;
    // A re-wiring gives the containers it adds TLS only where the status lists TLS's flag: a status that lists
    // the CA's variable without it would be claimed of containers without the CA, and the next pass would wire
    // the Pod again. It is not believed, and the Pod is wired afresh, once.
    let config = Config::load(std::path::Path::new("tests/golden/tls/config.yaml")).unwrap();
    let inject = |p: &serde_json::Value| {
        let typed: Pod = serde_json::from_value(p.clone()).unwrap();
        (pdp_core::core::inject(&typed, &ns(None), &config), typed)
    };
    let pod = serde_json::json!({
        "metadata": {"name": "p", "annotations": {"pdp-injector.io/inject": "daemonset"}},
        "spec": {"containers": [{"name": "app", "image": "x"}]}
    });
    let (Outcome::Injected(first), typed) = inject(&pod) else {
        panic!("not injected")
    };
    let mut wired =
        serde_json::to_value(pdp_core::core::patched(&typed, &first.patch).unwrap()).unwrap();
    let key = "pdp-injector.io/status";
    let mut status: serde_json::Value =
        serde_json::from_str(wired["metadata"]["annotations"][key].as_str().unwrap()).unwrap();
    let env = status["env"].as_array_mut().unwrap();
    let before = env.len();
    env.retain(|n| n != "CERBOS_PDP_TLS");
    assert_eq!(env.len(), before - 1, "the flag's name: {status}");
    assert!(
        env.iter().any(|n| n.as_str().unwrap().contains("CA")),
        "{status}"
    );
    wired["metadata"]["annotations"][key] = status.to_string().into();
    wired["spec"]["containers"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"name": "second", "image": "x"}));
    let (o, typed) = inject(&wired);
    let Outcome::Injected(again) = &o else {
        panic!("{o:?}")
    };
    assert!(
        o.warnings()
            .iter()
            .any(|w| w.code.code() == "status_not_carried"),
        "{o:?}"
    );
    let rewired =
        serde_json::to_value(pdp_core::core::patched(&typed, &again.patch).unwrap()).unwrap();
    let (third, _) = inject(&rewired);
    assert_eq!(third.reason(), Reason::AlreadyInjected, "{third:?}");
}

/// A namespace opted in to daemonset mode, at Pod Security level `privileged` (the node's socket by hostPath) or
/// the default `baseline`, requiring injection or not.
fn daemonset_ns(privileged: bool, required: bool) -> NamespaceInfo {
    let mut labels = vec![
        ("pdp-injector.io/injection", "daemonset"),
        (
            "pdp-injector.io/required",
            if required { "true" } else { "false" },
        ),
    ];
    if privileged {
        labels.push(("pod-security.kubernetes.io/enforce", "privileged"));
    }
    let labels: Vec<(String, String)> = labels
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    NamespaceInfo::from_labels("team", labels.iter().map(|(k, v)| (k, v)))
}

/// A status is believed value by value, not from the names it claims: a Pod that carries every variable,
/// volume and mount its status names, one of them with another value than the profile gives, is not skipped
/// as already wired; where injection is required it is refused.
#[test]
fn a_status_whose_names_are_carried_with_other_values_is_not_believed() {
    use pdp_core::core::Outcome;
    use serde_json::{Value, json};
    // cerbos alone where the socket is a hostPath; cerbos,flagd (a second status) where it is not.
    let wired = |profiles: &str, privileged: bool| {
        let p = json!({
            "metadata": {"name": "p", "annotations": {"pdp-injector.io/profile": profiles}},
            "spec": {"containers": [{"name": "app", "image": "x"}]}
        });
        let typed: Pod = serde_json::from_value(p).unwrap();
        let ns = daemonset_ns(privileged, false);
        match pdp_core::core::inject(&typed, &ns, &Config::builtin()) {
            Outcome::Injected(i) => {
                serde_json::to_value(pdp_core::core::patched(&typed, &i.patch).unwrap()).unwrap()
            }
            other => panic!("fixture not injected: {other:?}"),
        }
    };
    let fixtures = [
        (wired("cerbos", true), true),
        (wired("cerbos,flagd", false), false),
    ];
    // The Pods as wired are believed everywhere.
    for (pod, privileged) in &fixtures {
        for required in [false, true] {
            let o = outcome_of(pod.clone(), &daemonset_ns(*privileged, required));
            assert_eq!(o.reason(), Reason::AlreadyInjected, "{o:?}");
        }
    }
    // Its last definition of `name` (the one the kubelet uses).
    fn var<'a>(pod: &'a mut Value, name: &str) -> &'a mut Value {
        let env = pod["spec"]["containers"][0]["env"].as_array_mut().unwrap();
        env.iter_mut().rev().find(|e| e["name"] == name).unwrap()
    }
    fn socket_mount(pod: &mut Value) -> &mut Value {
        let mounts = pod["spec"]["containers"][0]["volumeMounts"]
            .as_array_mut()
            .unwrap();
        mounts
            .iter_mut()
            .find(|m| m["name"] == "pdp-injector-socket")
            .unwrap()
    }
    type Tamper = fn(&mut Value);
    // An entry of the app's that does not read as a variable leaves the others believed.
    let mut odd = fixtures[0].0.clone();
    odd["spec"]["containers"][0]["env"]
        .as_array_mut()
        .unwrap()
        .insert(0, json!({"name": "APP_PORT", "value": 8080}));
    let o = outcome_of(odd, &daemonset_ns(true, true));
    assert_eq!(o.reason(), Reason::AlreadyInjected, "{o:?}");
    let tampered: [(&str, usize, Tamper); 8] = [
        ("an address elsewhere", 0, |p| {
            var(p, "CERBOS_PDP_ADDR")["value"] = json!("attacker.example:3593")
        }),
        ("the host from another field", 0, |p| {
            var(p, "CERBOS_PDP_HOST")["valueFrom"]["fieldRef"]["fieldPath"] = json!("metadata.name")
        }),
        ("the second profile's host elsewhere", 1, |p| {
            *var(p, "FLAGD_HOST") = json!({"name": "FLAGD_HOST", "value": "attacker.example"});
        }),
        ("a later definition overriding the address", 0, |p| {
            let env = p["spec"]["containers"][0]["env"].as_array_mut().unwrap();
            env.push(json!({"name": "CERBOS_PDP_ADDR", "value": "attacker.example:3593"}));
        }),
        (
            "a later definition of the address that is not a variable",
            0,
            |p| {
                let env = p["spec"]["containers"][0]["env"].as_array_mut().unwrap();
                env.push(json!({"name": "CERBOS_PDP_ADDR", "value": 3593}));
            },
        ),
        ("the socket volume from another directory", 0, |p| {
            let volumes = p["spec"]["volumes"].as_array_mut().unwrap();
            let socket = volumes
                .iter_mut()
                .find(|v| v["name"] == "pdp-injector-socket")
                .unwrap();
            socket["hostPath"]["path"] = json!("/var/run/attacker");
        }),
        ("the socket mounted elsewhere", 0, |p| {
            socket_mount(p)["mountPath"] = json!("/var/run/elsewhere")
        }),
        ("the socket mounted writable", 0, |p| {
            socket_mount(p)["readOnly"] = json!(false)
        }),
    ];
    for (what, fixture, tamper) in tampered {
        let (pod, privileged) = &fixtures[fixture];
        let mut p = pod.clone();
        tamper(&mut p);
        let o = outcome_of(p.clone(), &daemonset_ns(*privileged, true));
        let Outcome::Denied(d) = &o else {
            panic!("{what}: {o:?}")
        };
        assert_eq!(d.reason, Reason::ForgedStatus, "{what}: {}", d.message);
        // Elsewhere wired as if it had no status (or refused, where the Pod's own volume takes our name).
        let o = outcome_of(p, &daemonset_ns(*privileged, false));
        assert_ne!(o.reason(), Reason::AlreadyInjected, "{what}: {o:?}");
        assert!(
            matches!(o, Outcome::Denied(_))
                || o.warnings()
                    .iter()
                    .any(|w| w.code.code() == "status_not_carried"),
            "{what}: {o:?}"
        );
    }
}

#[test]
fn the_webhooks_own_priority_class_is_refused_to_every_other_pod() {
    let pod = |class: &str, annotations: serde_json::Value| {
        serde_json::json!({
            "metadata": {"name": "p", "annotations": annotations},
            "spec": {"priorityClassName": class, "containers": [{"name": "app", "image": "x"}]}
        })
    };
    // Opted in or not, in any namespace the webhook is called for: refused, with what to change.
    for (annotations, namespace) in [
        (serde_json::json!({}), ns(None)),
        (
            serde_json::json!({"pdp-injector.io/inject": "sidecar"}),
            ns(None),
        ),
        (serde_json::json!({}), ns(Some("enabled"))),
    ] {
        let o = outcome_of(pod("pdp-injector-webhook", annotations), &namespace);
        assert_eq!(o.reason(), Reason::ReservedPriorityClass, "{o:?}");
        let pdp_core::core::Outcome::Denied(d) = &o else {
            panic!("{o:?}")
        };
        assert!(
            d.message.contains("choose another priorityClassName"),
            "{d:?}"
        );
    }
    // Another class is the Pod's own business.
    let o = outcome_of(pod("high", serde_json::json!({})), &ns(None));
    assert_eq!(o.reason(), Reason::NotOptedIn, "{o:?}");
}

#[test]
fn flag_sets_annotation_reaches_the_selector_variable_or_is_refused_when_malformed() {
    let config = Config::builtin();
    let pod = |profile: &str, flag_sets: &str| {
        serde_json::json!({
            "metadata": {"name": "p", "annotations": {
                "pdp-injector.io/inject": "daemonset", "pdp-injector.io/profile": profile,
                "pdp-injector.io/flag-sets": flag_sets}},
            "spec": {"containers": [{"name": "app", "image": "x"}]}
        })
        .to_string()
    };
    let field = "metadata.annotations['pdp-injector.io/flag-sets']";
    let Outcome::Injected(ok) = inject_json(
        &pod("flagd", "team/app, configmap/team/more"),
        &ns(None),
        &config,
    ) else {
        panic!("a well-formed flag sets annotation was not wired");
    };
    let patch = patch_text(&ok);
    assert!(
        patch.contains("FLAGD_SOURCE_SELECTOR") && patch.contains(field),
        "{patch}"
    );

    let Outcome::Denied(d) = inject_json(&pod("flagd", "team/app,team"), &ns(None), &config) else {
        panic!("a malformed flag sets annotation was admitted");
    };
    assert_eq!(d.reason, Reason::InvalidAnnotation);
    assert!(
        d.message.contains("pdp-injector.io/flag-sets")
            && d.message.contains("\"team\" is not a flag set"),
        "{}",
        d.message
    );
    // A profile without a selector variable ignores the annotation: cerbos gets no such variable.
    let Outcome::Injected(cerbos) = inject_json(&pod("cerbos", "team"), &ns(None), &config) else {
        panic!("the cerbos profile judged a flag sets annotation it does not use");
    };
    assert!(!patch_text(&cerbos).contains(field));
}

fn patch_text(injected: &pdp_core::core::Injected) -> String {
    let mut out = Vec::new();
    injected.patch.write_json(&mut out);
    String::from_utf8(out).unwrap()
}
