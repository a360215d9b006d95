//! Tables generated from the code for the Markdown: the precedence matrix and the environment app containers
//! receive.

use std::fmt::Write as _;

use k8s_openapi::api::core::v1::Pod;
use pdp_core::config::{Config, Mode};
use pdp_core::core::render::{Wiring, app_env};
use pdp_core::core::{NamespaceInfo, Outcome, inject};
use serde_json::json;

fn pod_with(annotation: Option<&str>) -> Pod {
    let mut metadata = json!({"name": "app"});
    if let Some(v) = annotation {
        metadata["annotations"] = json!({ "pdp-injector.io/inject": v });
    }
    serde_json::from_value(json!({
        "metadata": metadata,
        "spec": {"containers": [{"name": "app", "image": "registry.example/app:1"}]}
    }))
    .unwrap()
}

fn describe_outcome(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Injected(i) => format!("**{}**", i.mode),
        Outcome::Skipped { reason, warnings } => {
            let mut s = format!("skip `{reason}`");
            for w in warnings {
                write!(s, " + `{}`", w.code.code()).unwrap();
            }
            s
        }
        Outcome::Denied(d) => format!("deny `{}`", d.reason),
    }
}

/// The built-in config plus the one setting central mode needs (docs/annotations.md says so above the matrix).
const CENTRAL_CERBOS: &str =
    "profiles:\n  cerbos:\n    central:\n      address: cerbos.cerbos.svc.cluster.local:3593\n";

/// The whole precedence table, as the core applies it to every pair of values (built-in config, plus a central
/// address for cerbos).
pub fn precedence_matrix() -> String {
    let config = Config::from_yaml(CENTRAL_CERBOS).unwrap();
    let values = [
        None,
        Some("enabled"),
        Some("sidecar"),
        Some("daemonset"),
        Some("central"),
        Some("disabled"),
        Some("on"),
    ];
    let show = |v: Option<&str>| v.map_or("(none)".to_string(), |v| format!("`{v}`"));
    let mut s = String::from("| Pod `inject` ↓ · namespace `injection` → |");
    for ns in values {
        write!(s, " {} |", show(ns)).unwrap();
    }
    s.push_str("\n|---|");
    for _ in values {
        s.push_str("---|");
    }
    s.push('\n');
    for pod in values {
        write!(s, "| {} |", show(pod)).unwrap();
        for ns in values {
            let info = NamespaceInfo {
                name: "shop".into(),
                injection: ns.map(String::from),
                pss_enforce: None,
                required: false,
            };
            let outcome = inject(&pod_with(pod), &info, &config);
            write!(s, " {} |", describe_outcome(&outcome)).unwrap();
        }
        s.push('\n');
    }
    s
}

fn env_value(e: &k8s_openapi::api::core::v1::EnvVar) -> String {
    match (
        &e.value,
        e.value_from.as_ref().and_then(|v| v.field_ref.as_ref()),
    ) {
        (_, Some(f)) => format!("Downward API `{}`", f.field_path),
        (Some(v), None) => format!("`{v}`"),
        (None, None) => "`\"\"`".into(),
    }
}

/// What app containers receive, per profile and mode, straight from the renderer.
pub fn env_tables() -> String {
    let config = Config::builtin();
    let mut s = String::new();
    for (name, profile) in &config.profiles {
        // The built-ins name no central Service: show the one an admin would typically set.
        let address = format!("{name}.{name}.svc.cluster.local:{}", profile.address_port);
        let mut with_central = profile.clone();
        with_central.central = Some(pdp_core::config::CentralSpec {
            address: address.clone(),
            http_address: None,
        });
        let columns = [
            app_env(profile, Wiring::of(profile, Mode::Sidecar, false)),
            app_env(profile, Wiring::of(profile, Mode::Sidecar, true)),
            app_env(profile, Wiring::of(profile, Mode::Daemonset, true)),
            app_env(profile, Wiring::of(profile, Mode::Daemonset, false)),
            app_env(
                &with_central,
                Wiring::of(&with_central, Mode::Central, false),
            ),
        ];
        writeln!(s, "Profile `{name}`:\n").unwrap();
        writeln!(s, "| variable | sidecar | sidecar, `sidecar.unixSocket: true` | daemonset | daemonset, namespace not `privileged` | central, `central.address: {address}` |").unwrap();
        s.push_str("|---|---|---|---|---|---|\n");
        for var in &columns[2] {
            write!(s, "| `{}` |", var.name).unwrap();
            for column in &columns {
                let cell = column
                    .iter()
                    .find(|e| e.name == var.name)
                    .map_or("—".to_string(), env_value);
                write!(s, " {cell} |").unwrap();
            }
            s.push('\n');
        }
        s.push('\n');
    }
    s
}
