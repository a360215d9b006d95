//! Building a patch: operations appended in the order they apply, their values in the pipeline's one form.

use json_patch::jsonptr::{PointerBuf, Token};
use serde::Serialize;
use serde_json::Value;

use super::escape::{Escaped, escape_into};
use super::{AddOp, Form, JsonPatch, OpValue};

/// Operations in the order they apply, their values in one [`Form`].
#[derive(Debug, Default)]
pub struct PatchBuilder {
    ops: Vec<AddOp>,
    form: Form,
}

/// `list` with `index` appended, written in one buffer of the right size: `PointerBuf::push_back` re-encodes
/// the token and grows a clone of the list's path, the largest cost of writing the operations.
pub(super) fn at_index(list: &PointerBuf, index: usize) -> PointerBuf {
    // The decimal digits, last first (no formatting machinery: this runs for every inserted entry).
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut n = index;
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    let mut text = String::with_capacity(list.as_str().len() + 1 + digits.len() - at);
    text.push_str(list.as_str());
    text.push('/');
    // A number is a token as it is: no `~` or `/` to escape.
    text.push_str(std::str::from_utf8(&digits[at..]).expect("ASCII digits"));
    PointerBuf::parse(text).expect("a pointer with a number appended is a pointer")
}

/// A JSON Pointer from its unescaped tokens.
pub fn pointer<'t, I>(tokens: I) -> PointerBuf
where
    I: IntoIterator<Item = &'t str>,
    I::IntoIter: Clone,
{
    let tokens = tokens.into_iter();
    // One buffer of the right size (escapes aside): growing the pointer token by token reallocated it three or
    // four times, for every operation of every patch.
    let len: usize = tokens.clone().map(|t| t.len() + 1).sum();
    let mut text = String::with_capacity(len);
    for t in tokens {
        text.push('/');
        // Borrowed as it is unless it holds `~` or `/`.
        text.push_str(Token::new(t).encoded());
    }
    PointerBuf::parse(text).expect("tokens encoded are a pointer")
}

impl PatchBuilder {
    /// An empty patch whose values are kept in `form`.
    pub fn new(form: Form) -> PatchBuilder {
        PatchBuilder {
            ops: Vec::new(),
            form,
        }
    }

    /// The form of the values.
    pub fn form(&self) -> Form {
        self.form
    }

    /// `v` as a value of this patch.
    pub fn value<T: Serialize>(&self, v: &T) -> OpValue {
        // Typed Kubernetes objects and string maps always serialize: string keys, finite numbers.
        const WHY: &str = "Kubernetes objects serialize to JSON";
        match self.form {
            Form::Wire => OpValue::Json(serde_json::to_string(v).expect(WHY).into_boxed_str()),
            Form::Apply => OpValue::Tree(serde_json::to_value(v).expect(WHY)),
        }
    }

    /// `v`'s JSON as a string value (an annotation that holds JSON, as the status does), escaped once as it is
    /// written; `None` when that text is `same`, the value already there.
    pub fn json_string<T: Serialize>(&self, v: &T, same: Option<&str>) -> Option<OpValue> {
        const WHY: &str = "the status serializes to JSON";
        match self.form {
            Form::Wire => {
                // Written escaped as it is made, by a formatter that writes each string's quotes and escapes
                // escaped, in one buffer.
                let mut out = Vec::with_capacity(512);
                out.push(b'"');
                let mut writer = serde_json::Serializer::with_formatter(&mut out, Escaped);
                v.serialize(&mut writer).expect(WHY);
                out.push(b'"');
                // Escaping is one-to-one: the text is the annotation already there exactly when their escaped
                // forms are equal (a re-wiring's comparison; a first pass has nothing to compare). Escaping never
                // shortens, so an annotation longer than our text differs without being escaped: the Pod's
                // annotation (any size, any bytes) costs at most a few times our own text.
                if let Some(same) = same.filter(|s| s.len() + 2 <= out.len()) {
                    let mut was = Vec::with_capacity(out.len());
                    was.push(b'"');
                    escape_into(&mut was, same.as_bytes());
                    was.push(b'"');
                    if was == out {
                        return None;
                    }
                }
                // serde_json writes UTF-8, and escaping adds only ASCII.
                let text = String::from_utf8(out).expect("JSON is UTF-8");
                Some(OpValue::Json(text.into_boxed_str()))
            }
            Form::Apply => {
                let text = serde_json::to_string(v).expect(WHY);
                (same != Some(text.as_str())).then_some(OpValue::Tree(Value::String(text)))
            }
        }
    }

    /// An object of `members`, in their order, as a value of this patch.
    pub fn object<'k>(&self, members: impl IntoIterator<Item = (&'k str, OpValue)>) -> OpValue {
        match self.form {
            Form::Wire => {
                let mut out = vec![b'{'];
                for (i, (key, value)) in members.into_iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    out.push(b'"');
                    escape_into(&mut out, key.as_bytes());
                    out.extend_from_slice(b"\":");
                    value.write(&mut out);
                }
                out.push(b'}');
                let text = String::from_utf8(out).expect("JSON is UTF-8");
                OpValue::Json(text.into_boxed_str())
            }
            Form::Apply => OpValue::Tree(Value::Object(
                members
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v.into_tree()))
                    .collect(),
            )),
        }
    }

    /// `add` of `value` (made by this builder) at `path`.
    pub fn push(&mut self, path: PointerBuf, value: OpValue) {
        self.ops.push(AddOp { path, value });
    }

    /// `add` of `v` at `path` (on an existing map member, RFC 6902 `add` replaces it).
    pub fn add<T: Serialize>(&mut self, path: PointerBuf, v: &T) {
        let value = self.value(v);
        self.push(path, value);
    }

    /// Inserts `item` at `index` of the list at `list`.
    pub fn insert<T: Serialize>(&mut self, list: &PointerBuf, index: usize, item: &T) {
        self.add(at_index(list, index), item);
    }

    /// Inserts `value` (made by this builder) at `index` of the list at `list`.
    pub fn insert_value(&mut self, list: &PointerBuf, index: usize, value: OpValue) {
        self.push(at_index(list, index), value);
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

    /// Appends the operations of `other` (a builder of the same form).
    pub fn append(&mut self, other: PatchBuilder) {
        debug_assert_eq!(self.form, other.form, "one patch, one form");
        self.ops.extend(other.ops);
    }

    /// True when there is nothing to do.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// The patch.
    pub fn finish(self) -> JsonPatch {
        JsonPatch(self.ops)
    }
}
