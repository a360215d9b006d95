//! One flag set: its identity, and its flags and evaluators as flagd's JSON has them.

use std::fmt;

use serde_json::{Map, Value};

pub use pdp_core::flag_sets::Origin;

/// A flag set's identity: kind, namespace, name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SetId {
    pub origin: Origin,
    pub namespace: String,
    pub name: String,
}

impl fmt::Display for SetId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}/{}",
            self.origin.prefix(),
            self.namespace,
            self.name
        )
    }
}

/// Why a flag set was not taken (the store keeps the set's last good version).
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SetError {
    /// Not JSON at all.
    #[error("not JSON: {0}")]
    Json(String),
    /// JSON, but not of flagd's shape.
    #[error("{0}")]
    Shape(String),
}

/// The flags and evaluators of one set, each an object keyed by name.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FlagSet {
    pub flags: Map<String, Value>,
    pub evaluators: Map<String, Value>,
}

impl FlagSet {
    /// Reads flagd's JSON document (`{"flags": {...}, "$evaluators": {...}}`).
    pub fn from_json(text: &str) -> Result<FlagSet, SetError> {
        let value: Value = serde_json::from_str(text).map_err(|e| SetError::Json(e.to_string()))?;
        FlagSet::from_value(value)
    }

    /// Reads a FeatureFlag's `spec.flagSpec`, or a parsed flagd document: both have `flags` and `$evaluators`.
    pub fn from_value(value: Value) -> Result<FlagSet, SetError> {
        let Value::Object(mut doc) = value else {
            return Err(SetError::Shape(
                "a flag set must be a JSON object with \"flags\"".into(),
            ));
        };
        let flags = match doc.remove("flags") {
            Some(Value::Object(flags)) => flags,
            Some(_) => {
                return Err(SetError::Shape(
                    "\"flags\" must be an object keyed by flag name".into(),
                ));
            }
            None => return Err(SetError::Shape("a flag set needs \"flags\"".into())),
        };
        for (name, flag) in &flags {
            check_flag(name, flag)?;
        }
        let evaluators = match doc.remove("$evaluators") {
            Some(Value::Object(e)) => e,
            None | Some(Value::Null) => Map::new(),
            Some(_) => return Err(SetError::Shape("\"$evaluators\" must be an object".into())),
        };
        Ok(FlagSet { flags, evaluators })
    }

    /// Adds `other`'s flags and evaluators; a name present in both takes `other`'s.
    pub fn merge(&mut self, other: &FlagSet) {
        for (k, v) in &other.flags {
            self.flags.insert(k.clone(), v.clone());
        }
        for (k, v) in &other.evaluators {
            self.evaluators.insert(k.clone(), v.clone());
        }
    }

    /// flagd's JSON document of this set, as a sync stream sends it.
    pub fn to_json(&self) -> String {
        let mut doc = Map::new();
        doc.insert("flags".into(), Value::Object(self.flags.clone()));
        if !self.evaluators.is_empty() {
            doc.insert("$evaluators".into(), Value::Object(self.evaluators.clone()));
        }
        Value::Object(doc).to_string()
    }
}

/// The parts every provider needs of a flag: a state, variants and a default variant that is one of them.
fn check_flag(name: &str, flag: &Value) -> Result<(), SetError> {
    let bad = |what: &str| Err(SetError::Shape(format!("flag {name:?}: {what}")));
    let Value::Object(flag) = flag else {
        return bad("must be an object");
    };
    match flag.get("state").and_then(Value::as_str) {
        Some("ENABLED" | "DISABLED") => {}
        _ => return bad("\"state\" must be \"ENABLED\" or \"DISABLED\""),
    }
    let Some(Value::Object(variants)) = flag.get("variants") else {
        return bad("\"variants\" must be an object");
    };
    match flag.get("defaultVariant") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(v)) if variants.contains_key(v) => Ok(()),
        Some(Value::String(v)) => bad(&format!(
            "\"defaultVariant\" {v:?} is not one of its variants"
        )),
        Some(_) => bad("\"defaultVariant\" must be a variant's name"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_flags_and_evaluators_and_refuses_bad_shapes() {
        let set = FlagSet::from_json(
            r#"{"flags":{"a":{"state":"ENABLED","variants":{"on":true,"off":false},"defaultVariant":"on"}},
                "$evaluators":{"e":{"in":["x","y"]}}}"#,
        )
        .unwrap();
        assert_eq!(set.flags.len(), 1);
        assert_eq!(set.evaluators.len(), 1);
        assert!(matches!(FlagSet::from_json("{"), Err(SetError::Json(_))));
        assert_eq!(
            FlagSet::from_json(
                r#"{"flags":{"a":{"state":"ENABLED","variants":{"on":true},"defaultVariant":"off"}}}"#
            ),
            Err(SetError::Shape(
                "flag \"a\": \"defaultVariant\" \"off\" is not one of its variants".into()
            ))
        );
        assert!(FlagSet::from_json(r#"{"flags":[]}"#).is_err());
        assert!(FlagSet::from_json(r#"{"flagz":{}}"#).is_err());
    }

    #[test]
    fn merge_takes_the_later_set_for_a_shared_name() {
        let mut a = FlagSet::from_json(
            r#"{"flags":{"x":{"state":"ENABLED","variants":{"a":1},"defaultVariant":"a"}}}"#,
        )
        .unwrap();
        let b = FlagSet::from_json(
            r#"{"flags":{"x":{"state":"ENABLED","variants":{"b":2},"defaultVariant":"b"}}}"#,
        )
        .unwrap();
        a.merge(&b);
        assert_eq!(a.flags["x"]["defaultVariant"], "b");
        assert_eq!(FlagSet::from_json(&a.to_json()).unwrap(), a);
    }
}
