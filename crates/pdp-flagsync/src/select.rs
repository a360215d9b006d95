//! What one stream may read: its selector resolved against its caller's namespace.
//!
//! A selector is a comma list of flag sets, each `NAMESPACE/NAME` (any kind) or prefixed with its kind:
//! `core.openfeature.dev/NAMESPACE/NAME` (flagd's own spelling for a FeatureFlag), `configmap/...`, `file/...`.
//! An empty selector means every set of the caller's namespace and of the shared namespace. A set of any other
//! namespace is refused, whatever else the selector names.

use crate::set::{Origin, SetId};

/// The most sets one selector may name.
pub const MAX_ITEMS: usize = 64;

/// The identity a stream is scoped to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The caller's namespace: it reads its own sets and the shared namespace's.
    pub namespace: String,
}

/// Why a selector was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SelectorError {
    /// It names a set of a namespace the caller may not read.
    #[error(
        "selector {item:?} names a flag set of namespace {namespace:?}; a caller in namespace {caller:?} may read its own namespace's flag sets and those of {shared:?} only"
    )]
    Forbidden {
        item: String,
        namespace: String,
        caller: String,
        shared: String,
    },
    /// It is not of the selector's form.
    #[error(
        "selector {item:?} is not a flag set: use NAMESPACE/NAME, core.openfeature.dev/NAMESPACE/NAME, configmap/NAMESPACE/NAME or file/NAMESPACE/NAME"
    )]
    Invalid { item: String },
    /// It names more sets than [`MAX_ITEMS`].
    #[error("the selector names {0} flag sets; at most {MAX_ITEMS} are allowed")]
    TooMany(usize),
}

/// One element of a selection: a kind (or any), a namespace, a name (or every set of the namespace).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Pattern {
    origin: Option<Origin>,
    namespace: String,
    name: Option<String>,
}

impl Pattern {
    fn matches(&self, id: &SetId) -> bool {
        self.origin.is_none_or(|o| o == id.origin)
            && self.namespace == id.namespace
            && self.name.as_ref().is_none_or(|n| *n == id.name)
    }
}

/// The sets of one stream, in order: a set named later overrides a flag of the same name named earlier.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Selection(Vec<Pattern>);

impl Selection {
    /// Resolves `selector` for `caller`, `shared` being the namespace whose sets every caller may read.
    pub fn resolve(
        selector: &str,
        caller: &Caller,
        shared: &str,
    ) -> Result<Selection, SelectorError> {
        let items: Vec<&str> = selector
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        if items.len() > MAX_ITEMS {
            return Err(SelectorError::TooMany(items.len()));
        }
        if items.is_empty() {
            let mut all = vec![Pattern {
                origin: None,
                namespace: shared.to_string(),
                name: None,
            }];
            if caller.namespace != shared {
                all.push(Pattern {
                    origin: None,
                    namespace: caller.namespace.clone(),
                    name: None,
                });
            }
            return Ok(Selection(all));
        }
        let mut patterns = Vec::with_capacity(items.len());
        for item in items {
            let pattern = parse_item(item)?;
            if pattern.namespace != caller.namespace && pattern.namespace != shared {
                return Err(SelectorError::Forbidden {
                    item: item.to_string(),
                    namespace: pattern.namespace,
                    caller: caller.namespace.clone(),
                    shared: shared.to_string(),
                });
            }
            patterns.push(pattern);
        }
        Ok(Selection(patterns))
    }

    /// The ids of `ids` this selection takes, in its order, each once.
    pub fn pick<'a>(&self, ids: impl Iterator<Item = &'a SetId> + Clone) -> Vec<&'a SetId> {
        let mut picked: Vec<&SetId> = Vec::new();
        for pattern in &self.0 {
            for id in ids.clone().filter(|id| pattern.matches(id)) {
                picked.retain(|p| *p != id);
                picked.push(id);
            }
        }
        picked
    }
}

fn parse_item(item: &str) -> Result<Pattern, SelectorError> {
    let invalid = || SelectorError::Invalid {
        item: item.to_string(),
    };
    let (origin, rest) = [Origin::FeatureFlag, Origin::ConfigMap, Origin::File]
        .into_iter()
        .find_map(|o| {
            item.strip_prefix(o.prefix())
                .and_then(|r| r.strip_prefix('/'))
                .map(|r| (Some(o), r))
        })
        .unwrap_or((None, item));
    let (namespace, name) = rest.split_once('/').ok_or_else(invalid)?;
    if !is_name(namespace) || !is_name(name) {
        return Err(invalid());
    }
    Ok(Pattern {
        origin,
        namespace: namespace.to_string(),
        name: Some(name.to_string()),
    })
}

/// A Kubernetes object name: DNS subdomain characters, at most 253.
fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(origin: Origin, ns: &str, name: &str) -> SetId {
        SetId {
            origin,
            namespace: ns.into(),
            name: name.into(),
        }
    }

    fn team_a() -> Caller {
        Caller {
            namespace: "team-a".into(),
        }
    }

    #[test]
    fn empty_selector_is_the_shared_sets_then_the_callers() {
        let ids = [
            id(Origin::FeatureFlag, "team-a", "mine"),
            id(Origin::FeatureFlag, "team-b", "theirs"),
            id(Origin::ConfigMap, "pdp-system", "shared"),
        ];
        let s = Selection::resolve("", &team_a(), "pdp-system").unwrap();
        let picked: Vec<String> = s.pick(ids.iter()).iter().map(|i| i.to_string()).collect();
        assert_eq!(
            picked,
            [
                "configmap/pdp-system/shared",
                "core.openfeature.dev/team-a/mine"
            ]
        );
    }

    #[test]
    fn named_sets_in_order_with_kind_prefixes() {
        let ids = [
            id(Origin::FeatureFlag, "team-a", "x"),
            id(Origin::ConfigMap, "team-a", "x"),
            id(Origin::FeatureFlag, "team-a", "y"),
        ];
        let s =
            Selection::resolve("configmap/team-a/x, team-a/y", &team_a(), "pdp-system").unwrap();
        let picked: Vec<String> = s.pick(ids.iter()).iter().map(|i| i.to_string()).collect();
        assert_eq!(
            picked,
            ["configmap/team-a/x", "core.openfeature.dev/team-a/y"]
        );
        let s =
            Selection::resolve("core.openfeature.dev/team-a/x", &team_a(), "pdp-system").unwrap();
        assert_eq!(s.pick(ids.iter()), [&ids[0]]);
    }

    #[test]
    fn another_namespace_is_refused_and_bad_items_named() {
        let e = Selection::resolve(
            "team-a/x,core.openfeature.dev/team-b/y",
            &team_a(),
            "pdp-system",
        )
        .unwrap_err();
        assert!(
            matches!(&e, SelectorError::Forbidden { namespace, .. } if namespace == "team-b"),
            "{e}"
        );
        assert!(e.to_string().contains("team-b"));
        for bad in ["team-a", "team-a/", "/x", "Team-A/x", "team-a/x/y"] {
            assert_eq!(
                Selection::resolve(bad, &team_a(), "pdp-system"),
                Err(SelectorError::Invalid { item: bad.into() }),
                "{bad}"
            );
        }
        let many = vec!["team-a/x"; MAX_ITEMS + 1].join(",");
        assert_eq!(
            Selection::resolve(&many, &team_a(), "pdp-system"),
            Err(SelectorError::TooMany(MAX_ITEMS + 1))
        );
    }
}
