//! Label selectors evaluated the way the apiserver evaluates a webhook's `namespaceSelector` and
//! `objectSelector`, so `check` can tell whether a namespace or a Pod reaches the webhook at all.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// Whether `selector` selects an object with `labels`. An absent selector selects everything, as in the
/// webhook configuration; an operator the apiserver would refuse selects nothing (it cannot be stored anyway).
pub fn matches(selector: Option<&LabelSelector>, labels: &BTreeMap<String, String>) -> bool {
    let Some(selector) = selector else {
        return true;
    };
    let labels_ok = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let expressions_ok = selector.match_expressions.iter().flatten().all(|e| {
        let values = e.values.as_deref().unwrap_or_default();
        let value = labels.get(&e.key);
        match e.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            // NotIn also matches objects without the key (the base configuration relies on it).
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => false,
        }
    });
    labels_ok && expressions_ok
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn expr(key: &str, op: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|s| s.to_string()).collect()),
        }
    }

    #[test]
    fn operators_as_the_apiserver_reads_them() {
        let sel = LabelSelector {
            match_expressions: Some(vec![
                expr("inj", "In", &["enabled", "sidecar"]),
                expr("name", "NotIn", &["kube-system"]),
            ]),
            match_labels: None,
        };
        assert!(matches(Some(&sel), &labels(&[("inj", "enabled")])));
        assert!(!matches(Some(&sel), &labels(&[("inj", "disabled")])));
        assert!(!matches(Some(&sel), &labels(&[])));
        assert!(!matches(
            Some(&sel),
            &labels(&[("inj", "sidecar"), ("name", "kube-system")])
        ));
        let exists = LabelSelector {
            match_expressions: Some(vec![expr("x", "Exists", &[])]),
            match_labels: Some(BTreeMap::from([("a".into(), "b".into())])),
        };
        assert!(matches(Some(&exists), &labels(&[("x", ""), ("a", "b")])));
        assert!(!matches(Some(&exists), &labels(&[("x", "")])));
        let absent = LabelSelector {
            match_expressions: Some(vec![expr("x", "DoesNotExist", &[])]),
            match_labels: None,
        };
        assert!(matches(Some(&absent), &labels(&[])));
        assert!(matches(None, &labels(&[])));
        let bogus = LabelSelector {
            match_expressions: Some(vec![expr("x", "Near", &[])]),
            match_labels: None,
        };
        assert!(!matches(Some(&bogus), &labels(&[])));
    }
}
