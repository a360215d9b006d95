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

use json_patch::jsonptr::{Pointer, PointerBuf, Token};
use json_patch::{AddOperation, Patch, PatchOperation};
use serde::Serialize;
use serde_json::Value;

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

/// The length of `s` written as a JSON string, quotes included.
fn json_string_len(s: &str) -> usize {
    if !needs_escape(s.as_bytes()) {
        return s.len() + 2;
    }
    let escaped: usize = s
        .bytes()
        .map(|b| match escape(b) {
            None => 1,
            Some(e) => e.len(),
        })
        .sum();
    escaped + 2
}

/// How serde_json writes byte `b` inside a JSON string, when not as itself: quote, backslash and the control
/// characters (short forms where JSON has one). Every other byte, UTF-8 included, is written as it is.
fn escape(b: u8) -> Option<&'static [u8]> {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    // `\u00XX` for every control character, built once.
    const CONTROL: [[u8; 6]; 32] = {
        let mut t = [[0u8; 6]; 32];
        let mut i = 0;
        while i < 32 {
            t[i] = [b'\\', b'u', b'0', b'0', HEX[i >> 4], HEX[i & 15]];
            i += 1;
        }
        t
    };
    match b {
        b'"' => Some(br#"\""#),
        b'\\' => Some(br"\\"),
        b'\n' => Some(br"\n"),
        b'\r' => Some(br"\r"),
        b'\t' => Some(br"\t"),
        0x08 => Some(br"\b"),
        0x0c => Some(br"\f"),
        b if b < 0x20 => Some(&CONTROL[b as usize]),
        _ => None,
    }
}

/// Whether any byte of `bytes` is escaped in a JSON string. Most texts (every pointer rendering writes) have
/// none: a count without branches, which the compiler vectorises, says so faster than a test of each byte.
fn needs_escape(bytes: &[u8]) -> bool {
    bytes
        .iter()
        .filter(|&&b| b < 0x20 || b == b'"' || b == b'\\')
        .count()
        > 0
}

/// Appends `bytes` as the content of a JSON string (no quotes), escaped as serde_json escapes.
fn escape_into(out: &mut Vec<u8>, bytes: &[u8]) {
    if !needs_escape(bytes) {
        out.extend_from_slice(bytes);
        return;
    }
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if let Some(e) = escape(b) {
            out.extend_from_slice(&bytes[start..i]);
            out.extend_from_slice(e);
            start = i + 1;
        }
    }
    out.extend_from_slice(&bytes[start..]);
}

/// serde_json's compact JSON, written as the content of a JSON string: what [`escape_into`] makes of
/// serde_json's output, in one pass. serde_json hands strings over in fragments without quotes, backslashes or
/// control characters, so only the strings' quotes and their escapes' backslashes change.
struct Escaped;

impl serde_json::ser::Formatter for Escaped {
    fn begin_string<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(br#"\""#)
    }

    fn end_string<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(br#"\""#)
    }

    fn write_char_escape<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        escape: serde_json::ser::CharEscape,
    ) -> std::io::Result<()> {
        // The escape as serde_json writes it (at most six bytes: `\u001f`), then escaped itself.
        let mut json = [0u8; 6];
        let mut rest = &mut json[..];
        serde_json::ser::CompactFormatter.write_char_escape(&mut rest, escape)?;
        let len = 6 - rest.len();
        let mut out = Vec::with_capacity(12);
        escape_into(&mut out, &json[..len]);
        w.write_all(&out)
    }

    fn write_raw_fragment<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        fragment: &str,
    ) -> std::io::Result<()> {
        let mut out = Vec::with_capacity(fragment.len() + 16);
        escape_into(&mut out, fragment.as_bytes());
        w.write_all(&out)
    }
}

/// Operations in the order they apply, their values in one [`Form`].
#[derive(Debug, Default)]
pub struct PatchBuilder {
    ops: Vec<AddOp>,
    form: Form,
}

/// `list` with `index` appended, written in one buffer of the right size: `PointerBuf::push_back` re-encodes
/// the token and grows a clone of the list's path, the largest cost of writing the operations.
fn at_index(list: &PointerBuf, index: usize) -> PointerBuf {
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::collections::BTreeMap;

    const FORMS: [Form; 2] = [Form::Wire, Form::Apply];

    #[test]
    fn a_pointer_is_its_tokens_encoded() {
        let tokens = ["metadata", "annotations", "a/b~c", "", "~1"];
        assert_eq!(pointer(tokens), PointerBuf::from_tokens(tokens));
        assert_eq!(
            pointer(tokens).as_str(),
            "/metadata/annotations/a~1b~0c//~01"
        );
        assert_eq!(pointer([]), PointerBuf::new());
    }

    #[test]
    fn an_index_is_appended_as_its_decimal_token() {
        let list = pointer(["spec", "containers", "0", "env"]);
        for index in [0, 7, 10, 99, 100, 4096, usize::MAX] {
            let mut expected = list.clone();
            expected.push_back(index.to_string());
            assert_eq!(at_index(&list, index), expected, "{index}");
        }
        assert_eq!(at_index(&PointerBuf::new(), 3).as_str(), "/3");
    }

    #[test]
    fn the_status_string_is_escaped_once_and_absent_when_unchanged() {
        let status = json!({"profile": "a\"b", "env": ["X"], "n": 1});
        let text = status.to_string();
        for form in FORMS {
            let b = PatchBuilder::new(form);
            let v = b.json_string(&status, None).expect("a new value");
            let mut out = Vec::new();
            v.write(&mut out);
            // The value is a JSON string holding the status's JSON, as serde_json writes it.
            assert_eq!(
                serde_json::from_slice::<String>(&out).unwrap(),
                text,
                "{form:?}"
            );
            assert_eq!(out, serde_json::to_vec(&text).unwrap(), "{form:?}");
            assert!(b.json_string(&status, Some(&text)).is_none(), "{form:?}");
            assert!(
                b.json_string(&status, Some(&text[1..])).is_some(),
                "{form:?}"
            );
        }
    }

    fn sample(form: Form) -> PatchBuilder {
        let mut b = PatchBuilder::new(form);
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
        b
    }

    #[test]
    fn lists_are_extended_in_place_or_added_whole_and_keys_escaped() {
        for form in FORMS {
            let patch = sample(form).finish();
            let ops = serde_json::to_value(patch.to_patch()).unwrap();
            assert_eq!(
                ops.as_array().unwrap().len(),
                4,
                "the empty extension adds nothing"
            );
            assert_eq!(ops[3]["path"], "/metadata/annotations/x~1y~0z");
            let doc = json!({"metadata": {"annotations": {}}, "spec": {"volumes": [{"name": "a"}], "env": [{"name": "X"}]}});
            let want = json!({"metadata": {"annotations": {"x/y~z": "1"}},
                   "spec": {"volumes": [{"name": "a"}, {"name": "b"}], "env": [{"name": "H"}, {"name": "X"}],
                            "initContainers": [{"name": "s"}]}});
            let mut by_json_patch = doc.clone();
            json_patch::patch(&mut by_json_patch, &patch.to_patch()).unwrap();
            assert_eq!(by_json_patch, want, "{form:?}");
            let mut applied = doc.clone();
            patch.apply(&mut applied).unwrap();
            assert_eq!(applied, want, "{form:?}");
            let mut moved = doc;
            patch.apply_into(&mut moved).unwrap();
            assert_eq!(moved, want, "{form:?}");
        }
    }

    #[test]
    fn the_json_written_is_json_patchs_to_the_byte_in_either_form() {
        let mut written = Vec::new();
        for form in FORMS {
            let mut b = PatchBuilder::new(form);
            for key in [
                "plain",
                "quote\"back\\slash",
                "tab\tnew\nline\u{1}\u{7f}",
                "ünïcode/~",
                "",
            ] {
                b.add(pointer(["metadata", "annotations", key]), &key);
            }
            b.extend(
                pointer(["spec", "volumes"]),
                Some(2),
                &[json!({"name": "v", "n": 1.5, "a": [true, null]})],
            );
            let status = b.json_string(&json!({"z": "a\"b", "a": ["\\", "é\n"]}), None);
            b.push(pointer(["metadata", "annotations", "s"]), status.unwrap());
            let map = b.object([("k\"", b.value(&"v")), ("a", b.value(&json!({"b": 1})))]);
            b.push(pointer(["metadata"]), map);
            let patch = b.finish();
            let mut raw = Vec::new();
            patch.write_json(&mut raw);
            assert_eq!(
                raw,
                serde_json::to_vec(&patch.to_patch()).unwrap(),
                "{form:?}"
            );
            assert_eq!(raw.len(), patch.json_len(), "{form:?}");
            written.push(raw);
        }
        assert_eq!(written[0], written[1], "both forms write the same bytes");
        let empty = JsonPatch::default();
        let mut raw = Vec::new();
        empty.write_json(&mut raw);
        assert_eq!(raw, b"[]");
        assert_eq!(empty.json_len(), 2);
    }

    #[test]
    fn a_json_string_escapes_raw_json_as_serde_json_writes_it() {
        // A RawValue is written as it is, whitespace and escapes included: its text is escaped like the rest.
        let raw =
            serde_json::value::RawValue::from_string("{ \"a\" :\t[\"\\\"\\n\"]\n}".into()).unwrap();
        let v = BTreeMap::from([("raw", raw)]);
        let text = serde_json::to_string(&v).unwrap();
        let value = PatchBuilder::new(Form::Wire).json_string(&v, None).unwrap();
        let mut out = Vec::new();
        value.write(&mut out);
        assert_eq!(out, serde_json::to_vec(&text).unwrap());
    }

    #[test]
    fn a_json_string_is_the_json_as_text_and_none_when_already_there() {
        let v =
            json!({"mode": "sidecar", "q": "say \"hi\"\\", "ctl": "\u{0}\u{1f}\t", "u": "日本"});
        let text = serde_json::to_string(&v).unwrap();
        for form in FORMS {
            let b = PatchBuilder::new(form);
            let value = b.json_string(&v, None).unwrap();
            let mut out = Vec::new();
            value.write(&mut out);
            assert_eq!(out, serde_json::to_vec(&text).unwrap(), "{form:?}");
            assert_eq!(value.into_tree(), json!(text), "{form:?}");
            assert!(b.json_string(&v, Some(&text)).is_none(), "{form:?}");
            // A prefix, a longer text, another text: all differ.
            for other in [&text[..text.len() - 1], &format!("{text} "), "{}", ""] {
                assert!(
                    b.json_string(&v, Some(other)).is_some(),
                    "{form:?} {other:?}"
                );
            }
        }
    }

    #[test]
    fn apply_accepts_and_refuses_what_json_patch_does() {
        let doc = json!({"a": {"l": [1, 2]}, "s": "x"});
        for path in [
            "/a/l/0", "/a/l/2", "/a/l/-", "/a/l/3", "/a/l/01", "/a/l/x", "/a/m", "/a/l/0/z",
            "/b/c", "/s/t", "",
        ] {
            let path = PointerBuf::parse(path).unwrap();
            for form in FORMS {
                let mut b = PatchBuilder::new(form);
                b.add(path.clone(), &json!({"new": true}));
                let patch = b.finish();
                let mut theirs = doc.clone();
                let want = json_patch::patch(&mut theirs, &patch.to_patch());
                let mut ours = doc.clone();
                let got = patch.apply(&mut ours);
                assert_eq!(
                    got.is_ok(),
                    want.is_ok(),
                    "{path} {form:?}: {got:?} {want:?}"
                );
                match got {
                    Ok(()) => assert_eq!(ours, theirs, "{path} {form:?}"),
                    Err(e) => assert!(e.contains(path.as_str()), "{path}: the error names it"),
                }
            }
        }
    }
}
