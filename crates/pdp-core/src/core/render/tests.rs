//! Rendering on fixtures: each piece of the wiring, its idempotence, its collisions.

use serde_json::value::RawValue;

use super::env::{OurNames, relevant_env};
use super::*;
use crate::names::{INIT_TOOLS, STATE_DIR, VOLUME_TOOLS};

fn raw(text: &str) -> Box<RawValue> {
    RawValue::from_string(text.to_string()).unwrap()
}

/// [`relevant_env`] of a container with `env` and nothing added: the names of the entries it returns.
fn relevant(
    env: Option<&RawValue>,
    names: &OurNames<'_>,
    what: impl FnOnce() -> String,
) -> Result<Option<Vec<String>>, String> {
    let container = crate::core::view::ContainerView {
        env,
        ..Default::default()
    };
    relevant_env(&container, names, what)
        .map(|l| l.map(|l| l.iter().map(|e| e.name.as_str().to_string()).collect()))
}

#[test]
fn env_lists_are_parsed_only_when_they_may_define_ours() {
    let names = OurNames::new(vec!["CERBOS_PDP_ADDR"]);
    let what = || "env".to_string();
    // Nothing of ours: not parsed (a malformed entry there is the apiserver's to refuse).
    let plain = raw(r#"[{"name":"A","value":"1"},{"name":5}]"#);
    assert!(
        relevant(Some(&plain), &names, what)
            .unwrap()
            .unwrap()
            .is_empty()
    );
    // With spaces around the colon, as a client may write it: still found.
    let spaced = raw(r#"[ { "name" : "CERBOS_PDP_ADDR", "value": "x" } ]"#);
    let env = relevant(Some(&spaced), &names, what).unwrap().unwrap();
    assert_eq!(env.len(), 1);
    // Our name inside a longer string is not ours: not parsed either.
    let longer = raw(r#"[{"name":"XCERBOS_PDP_ADDR","value":"CERBOS_PDP_ADDR_2"},{"name":5}]"#);
    assert!(
        relevant(Some(&longer), &names, what)
            .unwrap()
            .unwrap()
            .is_empty()
    );
    // Ours by name, or spelled with an escape: parsed, and found.
    for text in [
        r#"[{"name":"A","value":"1"},{"name":"CERBOS_PDP_ADDR","value":"x"}]"#,
        r#"[{"name":"CERBOS\u005fPDP_ADDR","value":"x"}]"#,
    ] {
        let list = raw(text);
        let env = relevant(Some(&list), &names, what).unwrap().unwrap();
        assert!(env.iter().any(|e| e == "CERBOS_PDP_ADDR"), "{text}");
    }
    // Our name as a value only defines nothing of ours: not parsed (the malformed entry proves it).
    let value = raw(r#"[{"name":"A","value":"CERBOS_PDP_ADDR"},{"name":5}]"#);
    let env = relevant(Some(&value), &names, what).unwrap().unwrap();
    assert!(env.is_empty());
    // A nested "name" that happens to be ours (a configMapKeyRef): parsed, to be safe, and the entry found.
    let nested = raw(
        r#"[{"name":"A","valueFrom":{"configMapKeyRef":{"name":"CERBOS_PDP_ADDR","key":"k"}}}]"#,
    );
    let env = relevant(Some(&nested), &names, what).unwrap().unwrap();
    assert_eq!(env.len(), 1);
    // A list that is not a list is parsed, and refused.
    let odd = raw(r#""CERBOS_PDP_ADDR""#);
    assert!(relevant(Some(&odd), &names, what).is_err());
    assert!(relevant(None, &names, what).unwrap().is_none());
}

#[test]
fn the_names_shared_prefix_decides_only_when_absent() {
    let what = || "env".to_string();
    let found = |names: &OurNames<'_>, text: &str| {
        let list = raw(text);
        relevant(Some(&list), names, what).unwrap().unwrap().len()
    };
    // Several names with a shared prefix; a malformed entry shows whether the list was parsed.
    let shared = OurNames::new(vec![
        "CERBOS_PDP_HOST",
        "CERBOS_PDP_ADDR",
        "CERBOS_PDP_SOCKET",
    ]);
    assert_eq!(
        found(&shared, r#"[{"name":"A","value":"1"},{"name":5}]"#),
        0
    );
    // The prefix as a value, or as the start of another variable's name: still none of ours, not parsed.
    assert_eq!(
        found(
            &shared,
            r#"[{"name":"A","value":"CERBOS_PDP_HOST"},{"name":"CERBOS_PDP_OTHER"},{"name":5}]"#
        ),
        0
    );
    // One of them, after the first name of the list: parsed and found.
    assert_eq!(
        found(
            &shared,
            r#"[{"name":"A","value":"1"},{"name":"CERBOS_PDP_SOCKET","value":"/s"}]"#
        ),
        2
    );
    // Names with nothing in common (a profile's own extra variable): every "name" key is still compared.
    let apart = OurNames::new(vec!["CERBOS_PDP_ADDR", "APP_PDP_MODE"]);
    assert_eq!(found(&apart, r#"[{"name":"APP_PDP_MODE","value":"x"}]"#), 1);
    assert_eq!(found(&apart, r#"[{"name":"A","value":"1"},{"name":5}]"#), 0);
    // No names at all: nothing to find.
    assert_eq!(
        found(&OurNames::new(vec![]), r#"[{"name":"A"},{"name":5}]"#),
        0
    );
}

fn names_and_values(env: &[EnvVar]) -> Vec<(String, String)> {
    env.iter()
        .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
        .collect()
}

#[test]
fn tls_variables_only_on_the_tcp_path() {
    let config = Config::from_yaml(
        "profiles:\n  cerbos:\n    central: {address: \"cerbos.cerbos.svc:3593\"}\n    tls:\n      secretName: s\n      serverName: pdp.example\n",
    )
    .unwrap();
    let p = &config.profiles["cerbos"];
    assert!(!tls_applies(p, Mode::Sidecar));
    let sidecar = app_env(p, Wiring::of(p, Mode::Sidecar, true));
    assert!(
        sidecar
            .iter()
            .all(|e| !e.name.starts_with("CERBOS_PDP_TLS"))
    );
    // Even a wiring that asks for TLS gets none in sidecar mode.
    let forced = Wiring {
        tls: true,
        ..Wiring::of(p, Mode::Sidecar, false)
    };
    assert_eq!(
        app_env(p, forced),
        app_env(p, Wiring::of(p, Mode::Sidecar, false))
    );
    for mode in [Mode::Daemonset, Mode::Central] {
        let env = names_and_values(&app_env(p, Wiring::of(p, mode, false)));
        let tail: Vec<(&str, &str)> = env[env.len() - 3..]
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            tail,
            [
                ("CERBOS_PDP_TLS", "true"),
                ("CERBOS_PDP_TLS_CA", "/var/run/pdp-injector/tls/ca.crt"),
                ("CERBOS_PDP_TLS_SERVER_NAME", "pdp.example"),
            ],
            "{mode}"
        );
    }
    // A re-wiring of a Pod first wired without TLS stays without it.
    let without = Wiring {
        tls: false,
        ..Wiring::of(p, Mode::Daemonset, false)
    };
    assert!(
        app_env(p, without)
            .iter()
            .all(|e| !e.name.starts_with("CERBOS_PDP_TLS"))
    );
}

#[test]
fn fallback_gives_the_central_addresses_in_daemonset_mode_only() {
    let config = Config::from_yaml(
        "profiles:\n  cerbos:\n    fallback: true\n    central: {address: \"cerbos.pdp-system.svc:3593\"}\n",
    )
    .unwrap();
    let p = &config.profiles["cerbos"];
    let env = names_and_values(&app_env(p, Wiring::of(p, Mode::Daemonset, true)));
    let get = |name: &str| env.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str());
    assert_eq!(
        get("CERBOS_PDP_FALLBACK_ADDR"),
        Some("cerbos.pdp-system.svc:3593")
    );
    assert_eq!(
        get("CERBOS_PDP_FALLBACK_HTTP_ADDR"),
        Some("cerbos.pdp-system.svc:3592")
    );
    assert_eq!(get("CERBOS_PDP_ADDR"), Some("$(CERBOS_PDP_HOST):3593"));
    for mode in [Mode::Sidecar, Mode::Central] {
        let env = app_env(p, Wiring::of(p, mode, false));
        assert!(env.iter().all(|e| !e.name.contains("FALLBACK")), "{mode}");
    }
    // Without `fallback` the variables are never given.
    let plain = &Config::builtin().profiles["cerbos"];
    let env = app_env(plain, Wiring::of(plain, Mode::Daemonset, true));
    assert!(env.iter().all(|e| !e.name.contains("FALLBACK")));
}

/// Injects `pod` in sidecar mode with the classic form (an apiserver before 1.29).
fn classic(pod: serde_json::Value) -> Result<serde_json::Value, Denial> {
    use crate::core::{NamespaceInfo, Outcome, inject_json};
    let config = Config::builtin().with_classic_sidecars();
    match inject_json(&pod.to_string(), &NamespaceInfo::named("shop"), &config) {
        Outcome::Injected(i) => {
            let mut out = pod.clone();
            json_patch::patch(&mut out, &i.patch.to_patch()).unwrap();
            Ok(out)
        }
        Outcome::Denied(d) => Err(d),
        Outcome::Skipped {
            reason: Reason::AlreadyInjected,
            ..
        } => Ok(pod),
        other => panic!("{other:?}"),
    }
}

fn names(list: &serde_json::Value) -> Vec<&str> {
    list.as_array()
        .into_iter()
        .flatten()
        .map(|c| c["name"].as_str().unwrap())
        .collect()
}

#[test]
fn classic_sidecars_go_first_with_their_helper_once_per_pod() {
    let pod = serde_json::json!({
        "metadata": {"name": "p", "namespace": "shop", "labels": {"app": "a"}, "annotations": {
            "pdp-injector.io/inject": "sidecar", "pdp-injector.io/profile": "cerbos,flagd"}},
        "spec": {"restartPolicy": "OnFailure", "initContainers": [{"name": "migrate", "image": "m"}],
                 "containers": [{"name": "app", "image": "a"}, {"name": "worker", "image": "w"}]}});
    let out = classic(pod).unwrap();
    let spec = &out["spec"];
    // Both PDPs ahead of the apps (each profile puts its own first), one helper after the Pod's init, and
    // each PDP's watch container after the apps (the kubelet starts it last).
    assert_eq!(
        names(&spec["containers"]),
        [
            "flagd",
            "cerbos-pdp",
            "app",
            "worker",
            "pdp-injector-watch-cerbos-pdp",
            "pdp-injector-watch-flagd"
        ]
    );
    assert_eq!(spec["shareProcessNamespace"], true);
    let watch = &spec["containers"][4];
    assert_eq!(watch["command"][1], "watch");
    // OnFailure: longer than the kubelet's restart back-off.
    assert_eq!(watch["command"][4], "--grace=330s");
    assert_eq!(
        watch["command"][3],
        format!("--stop={STATE_DIR}/stop-cerbos-pdp")
    );
    assert_eq!(names(&spec["initContainers"]), ["migrate", INIT_TOOLS]);
    let volumes = names(&spec["volumes"]);
    assert_eq!(
        volumes.iter().filter(|v| **v == VOLUME_TOOLS).count(),
        1,
        "{volumes:?}"
    );
    for pdp in &spec["containers"].as_array().unwrap()[..2] {
        let name = pdp["name"].as_str().unwrap();
        let hook = pdp["lifecycle"]["postStart"]["exec"]["command"].to_string();
        assert!(
            hook.contains("\"wait\"")
                && hook.contains(&format!("--record={STATE_DIR}/{name}.pids")),
            "{hook}"
        );
        assert_eq!(
            pdp["livenessProbe"]["exec"]["command"][2],
            format!("{STATE_DIR}/stop-{name}")
        );
    }
    // No label, no annotation for a watch by the webhook: it needs no Pod right.
    assert_eq!(out["metadata"]["labels"], serde_json::json!({"app": "a"}));
    assert_eq!(
        out["metadata"]["annotations"][ANNOTATION_DEFAULT_CONTAINER],
        "app"
    );
    // The wired apps are the Pod's own, found by name after the PDPs moved in front of them.
    assert!(
        spec["containers"][2]["env"]
            .to_string()
            .contains("CERBOS_PDP_ADDR")
    );
    assert!(spec["containers"][3]["env"].to_string().contains("FLAGD_"));
    // Injecting the result again changes nothing (a reinvocation).
    assert_eq!(classic(out.clone()).map_err(|d| d.message), Ok(out));
}

#[test]
fn a_pod_that_turns_off_the_shared_process_namespace_is_refused() {
    let pod = serde_json::json!({
        "metadata": {"name": "p", "namespace": "shop", "annotations": {"pdp-injector.io/inject": "sidecar"}},
        "spec": {"restartPolicy": "Never", "shareProcessNamespace": false,
                 "containers": [{"name": "app", "image": "a"}]}});
    let denial = classic(pod.clone()).unwrap_err();
    assert_eq!(denial.reason, Reason::ProcessNamespaceOff);
    assert!(
        denial.message.contains("shareProcessNamespace: false"),
        "{}",
        denial.message
    );
    // Set to true by the Pod: kept, and not written again.
    let mut on = pod.clone();
    on["spec"]["shareProcessNamespace"] = true.into();
    let out = classic(on).unwrap();
    assert_eq!(out["spec"]["shareProcessNamespace"], true);
    // A Pod that keeps running has no watch container and shares nothing.
    let mut always = pod;
    always["spec"]["restartPolicy"] = "Always".into();
    always["spec"]
        .as_object_mut()
        .unwrap()
        .remove("shareProcessNamespace");
    let out = classic(always).unwrap();
    assert!(out["spec"].get("shareProcessNamespace").is_none());
    assert_eq!(names(&out["spec"]["containers"]), ["cerbos-pdp", "app"]);
}

#[test]
fn a_container_named_like_the_helper_is_a_clash() {
    let pod = serde_json::json!({
        "metadata": {"name": "p", "annotations": {"pdp-injector.io/inject": "sidecar"}},
        "spec": {"initContainers": [{"name": INIT_TOOLS, "image": "x"}],
                 "containers": [{"name": "app", "image": "a"}]}});
    let denial = classic(pod).unwrap_err();
    assert_eq!(denial.reason, Reason::NameCollision);
    assert!(
        denial.message.contains("pdp-injector-tools"),
        "{}",
        denial.message
    );
}

#[test]
fn ipv6_nodes_get_a_bracketed_daemonset_address() {
    let config = Config::builtin();
    let p = &config.profiles["cerbos"];
    let v6 = Wiring {
        family: NodeAddressFamily::IPv6,
        ..Wiring::of(p, Mode::Daemonset, false)
    };
    let addr = |w: Wiring| {
        app_env(p, w)
            .into_iter()
            .find(|e| e.name == "CERBOS_PDP_ADDR")
            .and_then(|e| e.value)
            .unwrap()
    };
    assert_eq!(addr(v6), "[$(CERBOS_PDP_HOST)]:3593");
    assert_eq!(
        addr(Wiring::of(p, Mode::Daemonset, false)),
        "$(CERBOS_PDP_HOST):3593"
    );
    // 127.0.0.1 is on every Pod's loopback, IPv6-only clusters included.
    let sidecar = Wiring {
        family: NodeAddressFamily::IPv6,
        ..Wiring::of(p, Mode::Sidecar, false)
    };
    assert_eq!(addr(sidecar), "127.0.0.1:3593");
}
