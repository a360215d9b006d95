//! The JSON Patch that rendering writes as it goes.
//!
//! Rendering only ever *adds*: keys to the annotations, entries to lists (the variables it prepends, the mounts
//! and volumes it appends, the sidecar). So a patch is a list of RFC 6902 `add` operations at positions of the
//! input, each carrying only a value rendering made: a handful of operations that never rewrite a user's field,
//! and never carry a part of the Pod the parser skipped. A list or map that did not exist is added whole.

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation};
use serde::Serialize;

/// Operations in the order they apply.
#[derive(Debug, Default)]
pub struct PatchBuilder(Vec<PatchOperation>);

fn value<T: Serialize>(v: &T) -> serde_json::Value {
    // Typed Kubernetes objects and string maps always serialize: string keys, finite numbers.
    serde_json::to_value(v).expect("Kubernetes objects serialize to JSON")
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
        self.0.push(PatchOperation::Add(AddOperation {
            path,
            value: value(v),
        }));
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
    pub fn finish(self) -> Patch {
        Patch(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn apply(mut doc: serde_json::Value, b: PatchBuilder) -> serde_json::Value {
        json_patch::patch(&mut doc, &b.finish()).unwrap();
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
        let ops = serde_json::to_value(Patch(b.0.clone())).unwrap();
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
}
