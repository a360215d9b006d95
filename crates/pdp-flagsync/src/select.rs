//! What one stream may read: its selector resolved against its caller's namespace.
//!
//! The selector's syntax is `pdp_core::flag_sets` (the webhook checks the same annotation at admission). An empty
//! selector means every set of the caller's namespace and of the shared namespace. A set of any other namespace
//! is refused, whatever else the selector names.

use pdp_core::flag_sets::{self, SyntaxError};

use crate::set::{Origin, SetId};

pub use pdp_core::flag_sets::MAX_ITEMS;

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
    /// It is not of the selector's form, or names too many sets.
    #[error(transparent)]
    Syntax(#[from] SyntaxError),
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
        let items = flag_sets::parse(selector)?;
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
            if item.namespace != caller.namespace && item.namespace != shared {
                return Err(SelectorError::Forbidden {
                    item: item.text.to_string(),
                    namespace: item.namespace.to_string(),
                    caller: caller.namespace.clone(),
                    shared: shared.to_string(),
                });
            }
            let pattern = Pattern {
                origin: item.origin,
                namespace: item.namespace.to_string(),
                name: Some(item.name.to_string()),
            };
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
                Err(SelectorError::Syntax(SyntaxError::Invalid {
                    item: bad.into()
                })),
                "{bad}"
            );
        }
        let many = vec!["team-a/x"; MAX_ITEMS + 1].join(",");
        assert_eq!(
            Selection::resolve(&many, &team_a(), "pdp-system"),
            Err(SelectorError::Syntax(SyntaxError::TooMany(MAX_ITEMS + 1)))
        );
    }
}
