//! The JSON Patch that rendering writes as it goes.
//!
//! Rendering only ever *adds*: keys to the annotations, entries to lists (the variables it prepends, the mounts
//! and volumes it appends, the sidecar). So a patch is a list of RFC 6902 `add` operations at positions of the
//! input, each carrying only a value rendering made: a handful of operations that never rewrite a user's field,
//! and never carry a part of the Pod the parser skipped. A list or map that did not exist is added whole.

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation};
use serde::Serialize;
use serde_json::value::RawValue;

/// One `add` operation: where, and the value as JSON, written once from the typed object (no
/// `serde_json::Value` in between: the webhook's answer copies these bytes).
#[derive(Debug, Clone)]
pub struct AddOp {
    /// Where.
    pub path: PointerBuf,
    /// What, as compact JSON.
    pub value: Box<RawValue>,
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
            // A pointer's text is a JSON string like any other (keys may hold quotes or backslashes).
            serde_json::to_writer(&mut *out, op.path.as_str())
                .expect("writing to a Vec cannot fail");
            out.extend_from_slice(br#","value":"#);
            out.extend_from_slice(op.value.get().as_bytes());
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
                19 + json_string_len(op.path.as_str()) + 9 + op.value.get().len() + 1
            })
            .sum();
        2 + ops + self.0.len().saturating_sub(1)
    }

    /// As `json_patch`'s type, to apply it to a document (the offline command, the tests, further profiles).
    pub fn to_patch(&self) -> Patch {
        Patch(
            self.0
                .iter()
                .map(|op| {
                    PatchOperation::Add(AddOperation {
                        path: op.path.clone(),
                        value: serde_json::from_str(op.value.get())
                            .expect("the core wrote valid JSON"),
                    })
                })
                .collect(),
        )
    }
}

/// The length of `s` written as a JSON string, quotes included.
fn json_string_len(s: &str) -> usize {
    let escaped: usize = s
        .chars()
        .map(|c| match c {
            '"' | '\\' | '\n' | '\r' | '\t' | '\u{08}' | '\u{0c}' => 2,
            c if (c as u32) < 0x20 => 6,
            c => c.len_utf8(),
        })
        .sum();
    escaped + 2
}

/// Operations in the order they apply.
#[derive(Debug, Default)]
pub struct PatchBuilder(Vec<AddOp>);

fn value<T: Serialize>(v: &T) -> Box<RawValue> {
    // Typed Kubernetes objects and string maps always serialize: string keys, finite numbers.
    serde_json::value::to_raw_value(v).expect("Kubernetes objects serialize to JSON")
}

/// A JSON Pointer from its unescaped tokens.
pub fn pointer<'t>(tokens: impl IntoIterator<Item = &'t str>) -> PointerBuf {
    let mut p = PointerBuf::new();
    for t in tokens {
        p.push_back(t);
    }
    p
}

impl PatchBuilder {
    /// `add` of `v` at `path` (on an existing map member, RFC 6902 `add` replaces it).
    pub fn add<T: Serialize>(&mut self, path: PointerBuf, v: &T) {
        self.0.push(AddOp {
            path,
            value: value(v),
        });
    }

    /// Inserts `item` at `index` of the list at `list`.
    pub fn insert<T: Serialize>(&mut self, list: &PointerBuf, index: usize, item: &T) {
        let mut path = list.clone();
        path.push_back(index.to_string());
        self.add(path, item);
    }

    /// Appends `items` to the list at `list`, which has `len` entries, or adds the list whole when it does not
    /// exist (`None`).
    pub fn extend<T: Serialize>(&mut self, list: PointerBuf, len: Option<usize>, items: &[T]) {
        if items.is_empty() {
            return;
        }
        match len {
            None => self.add(list, &items),
            Some(len) => {
                for (i, item) in items.iter().enumerate() {
                    self.insert(&list, len + i, item);
                }
            }
        }
    }

    /// Appends the operations of `other`.
    pub fn append(&mut self, other: PatchBuilder) {
        self.0.extend(other.0);
    }

    /// True when there is nothing to do.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The patch.
    pub fn finish(self) -> JsonPatch {
        JsonPatch(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn apply(mut doc: serde_json::Value, b: PatchBuilder) -> serde_json::Value {
        json_patch::patch(&mut doc, &b.finish().to_patch()).unwrap();
        doc
    }

    #[test]
    fn lists_are_extended_in_place_or_added_whole_and_keys_escaped() {
        let mut b = PatchBuilder::default();
        b.extend(
            pointer(["spec", "volumes"]),
            Some(1),
            &[json!({"name": "b"})],
        );
        b.extend(
            pointer(["spec", "initContainers"]),
            None,
            &[json!({"name": "s"})],
        );
        b.extend::<serde_json::Value>(pointer(["spec", "x"]), None, &[]);
        b.insert(&pointer(["spec", "env"]), 0, &json!({"name": "H"}));
        b.add(pointer(["metadata", "annotations", "x/y~z"]), &"1");
        let ops = serde_json::to_value(JsonPatch(b.0.clone()).to_patch()).unwrap();
        assert_eq!(
            ops.as_array().unwrap().len(),
            4,
            "the empty extension adds nothing"
        );
        assert_eq!(ops[3]["path"], "/metadata/annotations/x~1y~0z");
        let out = apply(
            json!({"metadata": {"annotations": {}}, "spec": {"volumes": [{"name": "a"}], "env": [{"name": "X"}]}}),
            b,
        );
        assert_eq!(
            out,
            json!({"metadata": {"annotations": {"x/y~z": "1"}},
                   "spec": {"volumes": [{"name": "a"}, {"name": "b"}], "env": [{"name": "H"}, {"name": "X"}],
                            "initContainers": [{"name": "s"}]}})
        );
    }

    #[test]
    fn the_json_written_is_json_patchs_to_the_byte() {
        let mut b = PatchBuilder::default();
        for key in [
            "plain",
            "quote\"back\\slash",
            "tab\tnew\nline\u{1}",
            "ünïcode/~",
            "",
        ] {
            b.add(pointer(["metadata", "annotations", key]), &key);
        }
        b.extend(
            pointer(["spec", "volumes"]),
            Some(2),
            &[json!({"name": "v", "n": 1.5})],
        );
        let patch = b.finish();
        let mut raw = Vec::new();
        patch.write_json(&mut raw);
        assert_eq!(raw, serde_json::to_vec(&patch.to_patch()).unwrap());
        assert_eq!(raw.len(), patch.json_len());
        let empty = JsonPatch::default();
        let mut raw = Vec::new();
        empty.write_json(&mut raw);
        assert_eq!(raw, b"[]");
        assert_eq!(empty.json_len(), 2);
    }
}
