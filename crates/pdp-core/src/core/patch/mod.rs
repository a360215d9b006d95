//! The JSON Patch that rendering writes as it goes.
//!
//! Rendering only ever *adds*: keys to the annotations, entries to lists (the variables it prepends, the mounts
//! and volumes it appends, the sidecar). So a patch is a list of RFC 6902 `add` operations at positions of the
//! input, each carrying only a value rendering made: a handful of operations that never rewrite a user's field,
//! and never carry a part of the Pod the parser skipped. A list or map that did not exist is added whole.
//!
//! Each value is kept in the form its caller uses, chosen once per call of the pipeline ([`Form`]): JSON text
//! that the webhook's answer copies, or a `serde_json::Value` that a caller applying the patch moves into its
//! document. Either way it is written once from the typed object, and the patch's JSON is the same to the byte.

mod builder;
mod escape;

use json_patch::jsonptr::{Pointer, PointerBuf};
use json_patch::{AddOperation, Patch, PatchOperation};
use serde_json::Value;

pub use builder::{PatchBuilder, pointer};
use escape::{escape_into, json_string_len};
/// What the values of a patch are kept as: the caller's use, given to the pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Form {
    /// JSON text, for the webhook's answer (which only copies it).
    #[default]
    Wire,
    /// `serde_json::Value`s, for a caller that applies the patch to a document (the offline command, `check`,
    /// the further profiles of a Pod): no JSON text to parse back.
    Apply,
}

/// An operation's value, in its patch's [`Form`].
#[derive(Debug, Clone)]
pub enum OpValue {
    /// Compact JSON that the core wrote ([`Form::Wire`]).
    Json(Box<str>),
    /// A tree ([`Form::Apply`]).
    Tree(Value),
}

impl OpValue {
    /// The value read as a `T` (the view records what an earlier profile added with it).
    pub fn read<T: serde::de::DeserializeOwned>(&self) -> Result<T, String> {
        match self {
            OpValue::Tree(v) => T::deserialize(v).map_err(|e| e.to_string()),
            OpValue::Json(text) => serde_json::from_str(text).map_err(|e| e.to_string()),
        }
    }

    /// The value as a tree: moved when it is one, parsed when it is JSON text.
    fn into_tree(self) -> Value {
        match self {
            OpValue::Tree(v) => v,
            OpValue::Json(text) => serde_json::from_str(&text).expect("the core wrote valid JSON"),
        }
    }

    fn to_tree(&self) -> Value {
        match self {
            OpValue::Tree(v) => v.clone(),
            OpValue::Json(text) => serde_json::from_str(text).expect("the core wrote valid JSON"),
        }
    }

    /// Appends the value as compact JSON.
    fn write(&self, out: &mut Vec<u8>) {
        match self {
            OpValue::Json(text) => out.extend_from_slice(text.as_bytes()),
            // serde_json writes a Value as it writes the typed object it came from: the same keys in the same
            // order (`preserve_order`), the same numbers and escapes.
            OpValue::Tree(v) => {
                serde_json::to_writer(out, v).expect("writing to a Vec cannot fail")
            }
        }
    }

    /// The length of [`write`](Self::write)'s output.
    fn json_len(&self) -> usize {
        match self {
            OpValue::Json(text) => text.len(),
            OpValue::Tree(v) => {
                let mut n = Counter(0);
                serde_json::to_writer(&mut n, v).expect("counting cannot fail");
                n.0
            }
        }
    }
}

/// A writer that only counts.
struct Counter(usize);

impl std::io::Write for Counter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// One `add` operation: where, and the value.
#[derive(Debug, Clone)]
pub struct AddOp {
    /// Where.
    pub path: PointerBuf,
    /// What.
    pub value: OpValue,
}

/// The patch the core renders: RFC 6902 `add` operations in the order they apply.
#[derive(Debug, Clone, Default)]
pub struct JsonPatch(pub Vec<AddOp>);

impl JsonPatch {
    /// Operations.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when there is nothing to do.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The patch as JSON, what an AdmissionReview answer carries (in base64): the bytes `json_patch` would
    /// write for [`to_patch`](Self::to_patch), written straight from the operations.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        out.push(b'[');
        for (i, op) in self.0.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(br#"{"op":"add","path":"#);
            // A pointer's text is a JSON string like any other (keys may hold quotes or backslashes), escaped
            // as serde_json escapes.
            out.push(b'"');
            escape_into(out, op.path.as_str().as_bytes());
            out.push(b'"');
            out.extend_from_slice(br#","value":"#);
            op.value.write(out);
            out.push(b'}');
        }
        out.push(b']');
    }

    /// The length of [`write_json`](Self::write_json)'s output, without writing it (the patch's size bound).
    pub fn json_len(&self) -> usize {
        let ops: usize = self
            .0
            .iter()
            .map(|op| {
                // `{"op":"add","path":` + path + `,"value":` + value + `}`
                19 + json_string_len(op.path.as_str()) + 9 + op.value.json_len() + 1
            })
            .sum();
        2 + ops + self.0.len().saturating_sub(1)
    }

    /// Applies the operations to `doc` in order, as RFC 6902 (and `json_patch`) applies `add`s: the values are
    /// cloned when they are trees, parsed when they are JSON text. On an error `doc` may hold the operations
    /// before the failing one (callers throw it away).
    pub fn apply(&self, doc: &mut Value) -> Result<(), String> {
        for (i, op) in self.0.iter().enumerate() {
            add(doc, &op.path, op.value.to_tree()).map_err(|e| op_error(i, &op.path, e))?;
        }
        Ok(())
    }

    /// [`apply`](Self::apply), moving the values into `doc`.
    pub fn apply_into(self, doc: &mut Value) -> Result<(), String> {
        for (i, op) in self.0.into_iter().enumerate() {
            add(doc, &op.path, op.value.into_tree()).map_err(|e| op_error(i, &op.path, e))?;
        }
        Ok(())
    }

    /// As `json_patch`'s type (the tests compare with it).
    pub fn to_patch(&self) -> Patch {
        Patch(
            self.0
                .iter()
                .map(|op| {
                    PatchOperation::Add(AddOperation {
                        path: op.path.clone(),
                        value: op.value.to_tree(),
                    })
                })
                .collect(),
        )
    }
}

fn op_error(i: usize, path: &Pointer, why: &str) -> String {
    format!("operation {i} (add at {:?}) failed: {why}", path.as_str())
}

/// RFC 6902 `add`, as `json_patch` does it: the whole document for the empty path; else into the parent, which
/// must exist: a member of an object (set, or replaced in place), or an entry of an array (inserted at an index
/// up to its length, or appended with `-`).
fn add(doc: &mut Value, path: &Pointer, value: Value) -> Result<(), &'static str> {
    let Some((parent, last)) = path.split_back() else {
        *doc = value;
        return Ok(());
    };
    match doc.pointer_mut(parent.as_str()) {
        Some(Value::Object(map)) => {
            map.insert(last.decoded().into_owned(), value);
            Ok(())
        }
        Some(Value::Array(list)) => {
            let at = last
                .to_index()
                .ok()
                .and_then(|i| i.for_len_incl(list.len()).ok())
                .ok_or("no such position in the list")?;
            list.insert(at, value);
            Ok(())
        }
        Some(_) => Err("the parent is neither an object nor a list"),
        None => Err("the parent does not exist"),
    }
}

#[cfg(test)]
mod tests;
