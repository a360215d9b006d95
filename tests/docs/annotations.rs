//! docs/annotations.md lists every reason and warning code and holds the exact text of every denial and
//! warning, produced by running the core on the offending input.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Pod;
use pdp_core::admission;
use pdp_core::config::Config;
use pdp_core::core::{NamespaceInfo, Outcome, Reason, WarningCode, inject};
use pdp_core::offline;
use serde_json::{Value, json};

use crate::examples::{Example, examples};
use crate::support::read;

/// The rows of the Markdown tables under a `## heading`, as cells.
fn table_rows(text: &str, heading: &str) -> Vec<Vec<String>> {
    let mut in_section = false;
    let mut rows = Vec::new();
    for line in text.lines() {
        if line.starts_with("## ") {
            in_section = line.trim() == heading;
            continue;
        }
        if in_section && line.starts_with('|') && !line.starts_with("|---") {
            rows.push(
                line.trim()
                    .trim_matches('|')
                    .split('|')
                    .map(|c| c.trim().to_string())
                    .collect(),
            );
        }
    }
    assert!(!rows.is_empty(), "no table under {heading:?}");
    rows
}

#[test]
fn annotations_doc_lists_every_reason_and_warning_code() {
    let text = read("docs/annotations.md");
    let reasons = table_rows(&text, "## Reason codes");
    let mut listed = BTreeMap::new();
    for row in reasons.iter().skip(1) {
        let code = row[0].trim_matches('`').to_string();
        listed.insert(code, row.get(1).cloned().unwrap_or_default());
    }
    for r in Reason::ALL {
        let decision = listed
            .get(r.code())
            .unwrap_or_else(|| panic!("docs/annotations.md: reason {} is not listed", r.code()));
        assert_eq!(
            decision.trim_matches('`'),
            r.decision(),
            "docs/annotations.md: decision of {}",
            r.code()
        );
    }
    let known: BTreeSet<&str> = Reason::ALL.iter().map(|r| r.code()).collect();
    for code in listed.keys() {
        assert!(
            known.contains(code.as_str()),
            "docs/annotations.md lists unknown reason {code}"
        );
    }

    let warnings = table_rows(&text, "## Warnings");
    let listed: BTreeSet<String> = warnings
        .iter()
        .skip(1)
        .map(|row| row[0].trim_matches('`').to_string())
        .collect();
    let known: BTreeSet<String> = WarningCode::ALL
        .iter()
        .map(|w| w.code().to_string())
        .collect();
    assert_eq!(listed, known, "docs/annotations.md: warning codes");
}

/// The Pod of an example stream and what its namespace looks like, as the offline injector sees them.
fn pod_of(example: &Example) -> (Pod, NamespaceInfo) {
    let docs = offline::parse_stream(&read(&example.input())).unwrap();
    let mut namespaces = BTreeMap::new();
    for doc in &docs {
        if doc["kind"] == "Namespace" {
            let name = doc["metadata"]["name"].as_str().unwrap().to_string();
            let labels: BTreeMap<String, String> =
                serde_json::from_value(doc["metadata"]["labels"].clone()).unwrap_or_default();
            namespaces.insert(name.clone(), NamespaceInfo::from_labels(name, &labels));
        }
    }
    let doc = docs
        .iter()
        .find(|d| d["kind"] == "Pod")
        .unwrap_or_else(|| panic!("{}: no Pod", example.input()));
    let ns_name = doc["metadata"]["namespace"].as_str().unwrap_or("default");
    let ns = namespaces
        .get(ns_name)
        .cloned()
        .unwrap_or_else(|| NamespaceInfo::named(ns_name));
    (serde_json::from_value(doc.clone()).unwrap(), ns)
}

#[test]
fn every_denial_message_is_documented_exactly() {
    let text = read("docs/annotations.md");
    let config = Config::builtin();
    let mut covered = BTreeSet::new();
    for example in examples().iter().filter(|e| e.stem.starts_with("deny-")) {
        let (pod, ns) = pod_of(example);
        let Outcome::Denied(denial) = inject(&pod, &ns, &example.config()) else {
            panic!("{}: the core does not deny it", example.input());
        };
        let message = denial.to_string();
        assert!(
            text.contains(&message),
            "docs/annotations.md does not contain the denial of {}:\n{message}",
            example.input()
        );
        covered.insert(denial.reason.code());
    }
    // Denials only the webhook can give: an AdmissionReview whose object is missing or is not a Pod.
    let review = |object: Option<Value>| {
        let mut request = json!({
            "uid": "u", "operation": "CREATE", "namespace": "shop",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"}
        });
        if let Some(o) = object {
            request["object"] = o;
        }
        let body = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request});
        let (bytes, _) =
            admission::review(&serde_json::to_vec(&body).unwrap(), &config, &|n: &str| {
                NamespaceInfo::named(n)
            })
            .unwrap();
        let out: Value = serde_json::from_slice(&bytes).unwrap();
        out["response"]["status"]["message"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let missing = review(None);
    assert!(
        text.contains(&missing),
        "docs/annotations.md lacks {missing:?}"
    );
    let not_a_pod = review(Some(json!({"spec": "x"})));
    let prefix = not_a_pod.split(": spec: invalid type").next().unwrap();
    assert!(
        text.contains(&format!("{prefix}: <field>: <parse error>")),
        "docs/annotations.md lacks {prefix:?}: <field>: <parse error> (from {not_a_pod:?})"
    );
    covered.insert(Reason::InvalidObject.code());
    // The webhook's refusal of a Pod whose opted-in namespace it cannot read (crates/pdp-webhook/src/review.rs).
    let unreadable = pdp_core::core::Denial::namespace_unreadable("shop", "<error>");
    assert!(
        text.contains(&unreadable.to_string()),
        "docs/annotations.md lacks {unreadable}"
    );
    covered.insert(unreadable.reason.code());
    let doubt = pdp_core::core::Denial::namespace_doubt("shop", "<error>");
    assert!(
        text.contains(&doubt.to_string()),
        "docs/annotations.md lacks {doubt}"
    );
    // A Pod over the container bound: generated, since an example file would hold 129 containers.
    let many: Pod = serde_json::from_value(json!({
        "metadata": {"name": "app", "annotations": {"pdp-injector.io/inject": "daemonset"}},
        "spec": {"containers": (0..=pdp_core::core::pipeline::MAX_CONTAINERS)
            .map(|i| json!({"name": format!("c{i}"), "image": "x"}))
            .collect::<Vec<_>>()}
    }))
    .unwrap();
    let Outcome::Denied(too_large) = inject(&many, &NamespaceInfo::named("shop"), &config) else {
        panic!("a Pod over the container bound is not denied");
    };
    assert!(
        text.contains(&too_large.to_string()),
        "docs/annotations.md lacks {too_large}"
    );
    covered.insert(too_large.reason.code());
    // A Pod naming the webhook's own PriorityClass.
    let reserved: Pod = serde_json::from_value(json!({
        "metadata": {"name": "app"},
        "spec": {"priorityClassName": pdp_core::names::PRIORITY_CLASS_WEBHOOK,
                 "containers": [{"name": "app", "image": "x"}]}
    }))
    .unwrap();
    let Outcome::Denied(reserved) = inject(&reserved, &NamespaceInfo::named("shop"), &config)
    else {
        panic!("a Pod naming the webhook's PriorityClass is not denied");
    };
    assert!(
        text.contains(&reserved.to_string()),
        "docs/annotations.md lacks {reserved}"
    );
    covered.insert(reserved.reason.code());

    let deny_codes: BTreeSet<&str> = Reason::ALL
        .iter()
        .filter(|r| r.decision() == "deny")
        .map(|r| r.code())
        .collect();
    assert_eq!(covered, deny_codes, "every deny reason has an example");
}

#[test]
fn every_warning_message_is_documented_exactly() {
    let text = read("docs/annotations.md");
    let mut covered = BTreeSet::new();
    for example in examples() {
        let input = read(&example.input());
        let Ok((_, reports)) =
            offline::inject_stream(&input, &example.config(), &example.options())
        else {
            continue;
        };
        for w in reports.iter().flat_map(|r| &r.warnings) {
            let message = w.to_string();
            assert!(
                text.contains(&message),
                "docs/annotations.md does not contain the warning of {}:\n{message}",
                example.input()
            );
            covered.insert(w.code.code());
        }
    }
    for code in WarningCode::ALL {
        assert!(
            covered.contains(code.code()),
            "no example gives warning {}",
            code.code()
        );
    }
}
