//! The syntax of a flag set selector: the Pod annotation `pdp-injector.io/flag-sets`, which apps receive as
//! flagd's `FLAGD_SOURCE_SELECTOR` and the flag sync source reads from each stream. The webhook refuses a
//! malformed annotation at admission; the sync source checks the same syntax, then the caller's namespace.
//!
//! A selector is a comma list of `NAMESPACE/NAME` (a set of any kind) or `KIND/NAMESPACE/NAME`, KIND an
//! [`Origin`]'s prefix; empty means every set the caller may read.

/// Where a flag set comes from; a selector may name the kind (`core.openfeature.dev/NS/NAME`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Origin {
    /// A FeatureFlag object, `core.openfeature.dev/v1beta1` (the OpenFeature operator's CRD).
    FeatureFlag,
    /// A ConfigMap labelled `pdp-injector.io/flags: "true"`, its `*.flagd.json` keys.
    ConfigMap,
    /// A file `DIR/NAMESPACE/NAME.flagd.json` of the sync source's directory.
    File,
}

impl Origin {
    /// Every kind, in the order a selector's prefix is tried.
    pub const ALL: [Origin; 3] = [Origin::FeatureFlag, Origin::ConfigMap, Origin::File];

    /// The selector prefix that names this kind (flagd's own spelling for a FeatureFlag).
    pub fn prefix(self) -> &'static str {
        match self {
            Origin::FeatureFlag => "core.openfeature.dev",
            Origin::ConfigMap => "configmap",
            Origin::File => "file",
        }
    }
}

/// The most sets one selector may name.
pub const MAX_ITEMS: usize = 64;

/// One named set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Item<'a> {
    /// As the selector writes it.
    pub text: &'a str,
    /// `None`: a set of any kind.
    pub origin: Option<Origin>,
    pub namespace: &'a str,
    pub name: &'a str,
}

/// Why a selector is malformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SyntaxError {
    #[error(
        "selector {item:?} is not a flag set: use NAMESPACE/NAME, core.openfeature.dev/NAMESPACE/NAME, configmap/NAMESPACE/NAME or file/NAMESPACE/NAME"
    )]
    Invalid { item: String },
    #[error("the selector names {0} flag sets; at most {MAX_ITEMS} are allowed")]
    TooMany(usize),
}

/// The sets `selector` names, in its order; empty items (`a/b,,c/d`, a trailing comma) are ignored. The items
/// are counted before any is kept, so an annotation of a million commas costs no allocation.
pub fn parse(selector: &str) -> Result<Vec<Item<'_>>, SyntaxError> {
    let items = || selector.split(',').map(str::trim).filter(|s| !s.is_empty());
    let count = items().count();
    if count > MAX_ITEMS {
        return Err(SyntaxError::TooMany(count));
    }
    items().map(parse_item).collect()
}

fn parse_item(item: &str) -> Result<Item<'_>, SyntaxError> {
    let invalid = || SyntaxError::Invalid {
        item: item.to_string(),
    };
    let (origin, rest) = Origin::ALL
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
    Ok(Item {
        text: item,
        origin,
        namespace,
        name,
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

    #[test]
    fn kinds_namespaces_and_names_in_order() {
        let items =
            parse("configmap/team-a/x, team-a/y,,core.openfeature.dev/pdp-system/z,").unwrap();
        let got: Vec<(Option<Origin>, &str, &str)> = items
            .iter()
            .map(|i| (i.origin, i.namespace, i.name))
            .collect();
        assert_eq!(
            got,
            [
                (Some(Origin::ConfigMap), "team-a", "x"),
                (None, "team-a", "y"),
                (Some(Origin::FeatureFlag), "pdp-system", "z"),
            ]
        );
        assert_eq!(parse(" , ").unwrap(), []);
    }

    #[test]
    fn malformed_items_and_too_many_are_named() {
        for bad in [
            "team-a",
            "team-a/",
            "/x",
            "Team-A/x",
            "team-a/x/y",
            "configmap/x",
        ] {
            assert_eq!(
                parse(&format!("team-a/ok,{bad}")),
                Err(SyntaxError::Invalid { item: bad.into() }),
                "{bad}"
            );
        }
        let many = vec!["team-a/x"; MAX_ITEMS + 1].join(",");
        assert_eq!(parse(&many), Err(SyntaxError::TooMany(MAX_ITEMS + 1)));
        assert!(parse(&vec!["team-a/x"; MAX_ITEMS].join(",")).is_ok());
        // A Pod's whole annotation budget of items is refused by its count.
        let huge = "a/b,".repeat(250_000);
        assert_eq!(parse(&huge), Err(SyntaxError::TooMany(250_000)));
    }
}
