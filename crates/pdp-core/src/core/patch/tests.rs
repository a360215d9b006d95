use super::builder::at_index;
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
    let v = json!({"mode": "sidecar", "q": "say \"hi\"\\", "ctl": "\u{0}\u{1f}\t", "u": "日本"});
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
        "/a/l/0", "/a/l/2", "/a/l/-", "/a/l/3", "/a/l/01", "/a/l/x", "/a/m", "/a/l/0/z", "/b/c",
        "/s/t", "",
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
