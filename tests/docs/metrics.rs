//! Metrics: the generated table of the exposition, and metric names, alert-rule matchers and the scrape job in
//! the docs against what the webhook exports and the manifests serve.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use pdp_webhook::metrics::Metrics;
use serde_json::Value;

use crate::support::{markdown_files, read};

/// Families of the Prometheus exposition: name -> (type, help, label -> values).
type Families = BTreeMap<String, (String, String, BTreeMap<String, BTreeSet<String>>)>;

fn metric_families() -> Families {
    let text = Metrics::default().render();
    let mut families: Families = BTreeMap::new();
    let mut order = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap();
            order.push(name.to_string());
            families.entry(name.into()).or_default().1 = help.into();
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            families.entry(name.into()).or_default().0 = kind.into();
        } else if !line.is_empty() {
            let series = line.split(' ').next().unwrap();
            let (name, labels) = match series.split_once('{') {
                Some((n, l)) => (n, l.trim_end_matches('}')),
                None => (series, ""),
            };
            let family = order
                .iter()
                .rev()
                .find(|f| {
                    name == f.as_str()
                        || name
                            .strip_prefix(f.as_str())
                            .is_some_and(|s| ["_bucket", "_sum", "_count"].contains(&s))
                })
                .unwrap_or_else(|| panic!("sample {name} without a family"))
                .clone();
            for pair in labels.split(',').filter(|p| !p.is_empty()) {
                let (k, v) = pair.split_once('=').unwrap();
                if k != "le" {
                    families
                        .get_mut(&family)
                        .unwrap()
                        .2
                        .entry(k.into())
                        .or_default()
                        .insert(v.trim_matches('"').into());
                }
            }
        }
    }
    families
}

pub fn metrics_table() -> String {
    let mut s = String::from("| metric | type | labels | what |\n|---|---|---|---|\n");
    for (name, (kind, help, labels)) in metric_families() {
        let labels: Vec<String> = labels
            .iter()
            .map(|(k, values)| {
                if k == "version" {
                    format!("`{k}`")
                } else if values.len() > 8 {
                    format!("`{k}` (a reason code)")
                } else {
                    let values: Vec<String> = values.iter().map(|v| format!("`{v}`")).collect();
                    format!("`{k}`: {}", values.join(", "))
                }
            })
            .collect();
        writeln!(s, "| `{name}` | {kind} | {} | {help} |", labels.join("; ")).unwrap();
    }
    s
}

/// The names `pdp-injector heal` exports on its own /metrics.
fn heal_families() -> BTreeSet<String> {
    let mut registry = prometheus_client::registry::Registry::default();
    pdp_check::heal::HealMetrics::default().register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut text, &registry).unwrap();
    text.lines()
        .filter_map(|l| l.strip_prefix("# HELP "))
        .filter_map(|r| r.split(' ').next())
        .map(String::from)
        .collect()
}

#[test]
fn metrics_named_in_the_docs_exist() {
    let families = metric_families();
    let heal = heal_families();
    assert!(heal.len() >= 4, "{heal:?}");
    let rendered = Metrics::default().render();
    let mut files = markdown_files();
    files.push("docs/examples/prometheus-rules.yaml".into());
    for file in files {
        let text = read(&file);
        for (at, _) in text.match_indices("pdp_injector_") {
            let name: String = text[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .filter(|b| families.contains_key(*b))
                .unwrap_or(&name);
            assert!(
                families.contains_key(base) || heal.contains(base),
                "{file}: metric {name} does not exist"
            );
        }
    }
    // Label matchers in the alert rules name label values the webhook exports.
    let rules = read("docs/examples/prometheus-rules.yaml");
    let doc: Value = serde_saphyr::from_str(&rules).expect("the rules are YAML");
    let exprs: Vec<String> = doc["groups"][0]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["expr"].as_str().unwrap().to_string())
        .collect();
    assert!(exprs.len() >= 5);
    // The scrape job finds the webhook's Pods by the label and port name of the Deployment, and checks the
    // certificate against a name the serving certificate carries.
    let scrape: Value =
        serde_saphyr::from_str(&read("docs/examples/prometheus-scrape.yaml")).unwrap();
    let job = &scrape["scrape_configs"][0];
    assert_eq!(job["metrics_path"], "/metrics");
    assert_eq!(job["scheme"], "https");
    let sans = pdp_tls::certs::service_sans("pdp-injector", "pdp-system");
    assert!(
        sans.iter()
            .any(|s| job["tls_config"]["server_name"] == s.as_str())
    );
    let deployment = read("manifests/overlays/daemonset/webhook/deployment.yaml");
    assert_eq!(job["relabel_configs"][0]["regex"], "pdp-injector;https");
    assert!(deployment.contains("app.kubernetes.io/name: pdp-injector"));
    assert!(deployment.contains("- name: https\n              containerPort: 8443"));
    for expr in exprs {
        for (at, _) in expr.match_indices("=\"") {
            let key: String = expr[..at]
                .trim_end_matches('!')
                .chars()
                .rev()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            let value: String = expr[at + 2..].chars().take_while(|c| *c != '"').collect();
            assert!(
                rendered.contains(&format!("{key}=\"{value}\"")),
                "alert rule matcher {key}=\"{value}\" matches no exported series"
            );
        }
    }
}
