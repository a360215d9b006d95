//! The fast path against serde_json: on every text, valid or broken, either it declines or it reads what
//! serde_json reads. What serde_json refuses it refuses too, but for faults of JSON's grammar inside an object
//! or list the type skips: a text it reads then still has JSON's structure (`has_structure`), and the values
//! read around the fault are those of the text before it was broken.

use std::fmt::Debug;

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::value::RawValue;

use super::{Fallback, from_str, has_structure, read};

/// A small review with something of everything the grammar has: escapes (also surrogate pairs), numbers of
/// each shape, literals, empty and nested containers, whitespace, raw lists, and fields the view skips.
const SAMPLE: &str = r#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{"uid":"u-1",
 "object":{"metadata":{"name":"p","labels":{"app":"a\"b","x\u002fy":"\ud83d\ude00"},
 "annotations":{"pdp-injector.io/inject":"daemonset","n":"\\ \/ \b\f\n\r\t"}},
 "spec":{"containers":[{"name":"app","image":"i:1","env":[{"name":"A","value":"1"},{"name":"B",
 "valueFrom":{"fieldRef":{"fieldPath":"status.hostIP"}}}],"ports":[{"containerPort":8080}],
 "resources":{"limits":{"cpu":-1.5e-3,"memory":0,"x":12E+2,"y":0.25}},"volumeMounts":[]}],
 "initContainers":[],"volumes":[ {"name":"v","emptyDir":{}} ],"hostNetwork":false,
 "restartPolicy":"Always","tolerations":[[],[[]],{},null,true,"s"]}},"oldObject":null,"dryRun":true}}"#;

/// Typed readers the webhook uses, each compared as its `Debug` text.
#[derive(Debug, Deserialize)]
#[allow(dead_code)] // Read through `Debug`.
struct Envelope<'a> {
    #[serde(borrow)]
    request: Option<Request<'a>>,
    #[serde(borrow)]
    kind: Option<&'a str>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)] // Read through `Debug`.
struct Request<'a> {
    uid: Option<String>,
    #[serde(borrow)]
    object: Option<Object<'a>>,
    #[serde(borrow)]
    old_object: Option<&'a RawValue>,
    dry_run: Option<bool>,
}

/// The shape of the core's view of a Pod (`core::PodView`, compared in `core::view`'s tests and by the fuzz
/// checks): maps of strings, lists of structs, raw lists, a bool.
#[derive(Debug, Deserialize)]
#[allow(dead_code)] // Read through `Debug`.
struct Object<'a> {
    #[serde(borrow)]
    metadata: Option<Meta<'a>>,
    #[serde(borrow)]
    spec: Option<Spec<'a>>,
}

#[derive(Debug, Deserialize)]
#[allow(dead_code)] // Read through `Debug`.
struct Meta<'a> {
    #[serde(borrow)]
    name: Option<std::borrow::Cow<'a, str>>,
    labels: Option<std::collections::BTreeMap<String, String>>,
    annotations: Option<std::collections::BTreeMap<String, String>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)] // Read through `Debug`.
struct Spec<'a> {
    #[serde(borrow)]
    containers: Option<Vec<Container<'a>>>,
    #[serde(borrow)]
    volumes: Option<&'a RawValue>,
    host_network: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[allow(dead_code)] // Read through `Debug`.
struct Container<'a> {
    #[serde(default)]
    name: String,
    #[serde(borrow)]
    env: Option<&'a RawValue>,
}

/// Whether a type skips objects or lists (`IgnoredAny`, `RawValue`, unknown fields), where only the structure
/// is checked, or reads every value with the whole grammar (`serde_json::Value`).
#[derive(Clone, Copy, PartialEq)]
enum Skips {
    Yes,
    No,
}

/// How the fast path's reading of `text` as `T` compares with serde_json's.
#[derive(Debug, PartialEq)]
enum Agreement {
    /// Declined (serde_json then reads and decides).
    Declined,
    /// Read, as serde_json reads it.
    Same,
    /// Read where serde_json refuses: a fault inside a skipped object or list.
    ReadPastFault,
}

fn agree<'a, T: Deserialize<'a> + Debug>(text: &'a str, skips: Skips) -> Agreement {
    let fast = read::<T>(text);
    let slow = serde_json::from_str::<T>(text);
    match (&fast, &slow) {
        (Err(Fallback), _) => Agreement::Declined,
        (Ok(f), Ok(s)) => {
            assert_eq!(format!("{f:?}"), format!("{s:?}"), "{text:?}");
            Agreement::Same
        }
        (Ok(f), Err(e)) => {
            assert!(
                skips == Skips::Yes && has_structure(text),
                "fast path accepted what serde_json refuses ({e}) outside a skipped value: {f:?} from {text:?}"
            );
            Agreement::ReadPastFault
        }
    }
}

/// Every reader compared; whether the envelope was read.
fn agree_all(text: &str) -> bool {
    let envelope = agree::<Envelope<'_>>(text, Skips::Yes);
    agree::<IgnoredAny>(text, Skips::Yes);
    agree::<&RawValue>(text, Skips::Yes);
    agree::<serde_json::Value>(text, Skips::No);
    agree::<Vec<&RawValue>>(text, Skips::Yes);
    agree::<Object<'_>>(text, Skips::Yes);
    envelope != Agreement::Declined
}

#[test]
fn the_sample_is_read_by_the_fast_path_as_serde_json_reads_it() {
    assert!(agree_all(SAMPLE));
    assert!(read::<IgnoredAny>(SAMPLE).is_ok());
    assert!(read::<Envelope<'_>>(SAMPLE).is_ok());
}

#[test]
fn every_truncation_and_one_byte_change_of_the_sample_agrees() {
    // A broken text must be refused by the fast path (serde_json then says why), never read differently.
    let bytes = SAMPLE.as_bytes();
    let mut read_fast = 0;
    for end in 0..bytes.len() {
        if let Ok(text) = std::str::from_utf8(&bytes[..end]) {
            agree_all(text);
        }
    }
    let swaps: &[u8] = b"\"\\,:[]{}0-.eE+ \x01\nxtfnu/";
    for at in 0..bytes.len() {
        let mut removed = bytes.to_vec();
        removed.remove(at);
        if let Ok(text) = std::str::from_utf8(&removed) {
            agree_all(text);
        }
        for &swap in swaps {
            let mut changed = bytes.to_vec();
            changed[at] = swap;
            if let Ok(text) = std::str::from_utf8(&changed)
                && agree_all(text)
            {
                read_fast += 1;
            }
        }
    }
    // Most changes leave valid JSON (a letter in a string): the fast path must still take those.
    assert!(read_fast > bytes.len() * swaps.len() / 4, "{read_fast}");
}

#[test]
fn the_fixture_review_agrees() {
    let text = include_str!("../../../../tests/fixtures/admissionreview-v1-pod-create.json");
    assert!(agree_all(text));
    for end in (0..text.len()).step_by(7) {
        if let Some(prefix) = text.get(..end) {
            agree_all(prefix);
        }
    }
}

#[test]
fn raw_values_are_read_here() {
    // The serde protocol of serde_json's RawValue, followed by the fast path (no fallback).
    let list = read::<Vec<&RawValue>>(" [ 1 , {\"a\" : [2,\"]\"]} ,\"s\",null ] ").unwrap();
    let texts: Vec<&str> = list.iter().map(|r| r.get()).collect();
    assert_eq!(texts, ["1", "{\"a\" : [2,\"]\"]}", "\"s\"", "null"]);
}

#[test]
fn strings_are_lent_or_unescaped_as_serde_json_does() {
    for text in [
        r#""plain""#,
        r#""a\u0042\n\"\\\/\ud83d\ude00""#,
        r#""é ü 日本""#,
    ] {
        assert_eq!(
            read::<String>(text),
            Ok(serde_json::from_str::<String>(text).unwrap())
        );
    }
    let borrowed: &str = read(r#""lent""#).unwrap();
    assert_eq!(borrowed, "lent");
    // Refused by both: lone surrogates read as text, control characters, bad escapes, unclosed strings.
    for text in [
        r#""\ud83d""#,
        r#""\ude00x""#,
        r#""\ud83d\u0041""#,
        "\"a\u{1}b\"",
        r#""\x""#,
        r#""\u12g4""#,
        r#""open"#,
    ] {
        assert_eq!(read::<String>(text), Err(Fallback), "{text}");
        assert!(serde_json::from_str::<String>(text).is_err(), "{text}");
    }
    // A skipped string's \u escapes are only checked to be hexadecimal, as serde_json checks them.
    assert!(read::<IgnoredAny>(r#""\ud83d""#).is_ok());
    assert!(serde_json::from_str::<IgnoredAny>(r#""\ud83d""#).is_ok());
}

#[test]
fn grammar_errors_in_values_read_or_scalars_are_refused() {
    // A scalar is checked whole wherever it is; a container read as a value, by the whole grammar.
    for text in [
        "01", "-", "1.", "1e", "1e+", ".5", "+1", "tru", "nul", "", " ", "1 2", "\"a\"x", "[1]]",
    ] {
        assert_eq!(read::<IgnoredAny>(text), Err(Fallback), "{text:?}");
        assert!(
            serde_json::from_str::<IgnoredAny>(text).is_err(),
            "{text:?}"
        );
    }
    for text in BROKEN_GRAMMAR.iter().chain(BROKEN_STRUCTURE) {
        assert_eq!(read::<serde_json::Value>(text), Err(Fallback), "{text:?}");
        assert!(
            serde_json::from_str::<serde_json::Value>(text).is_err(),
            "{text:?}"
        );
    }
    for text in [
        "0",
        "-0",
        "1.5e-3",
        "12E+2",
        "0.25",
        "[]",
        "{}",
        " [ [ ] , { } ] ",
        "{\"a\":[1,{\"b\":null}]}",
        "true",
        "false",
        "null",
        "\"\"",
        "{\"a\":\"b\",\"c\":\"d\",\"e\":\"f\"}",
        "{\"a\":\"b\",\"c\" : \"d\" ,\"e\":1,\"f\":\"g\",\"h\":[\"i\",\"j\"]}",
        "[{\"a\":\"b\",\"c\":{\"d\":\"e\",\"f\":\"g\"}},\"h\",\"i\"]",
    ] {
        assert_eq!(read::<IgnoredAny>(text).map(drop), Ok(()), "{text:?}");
    }
}

/// Objects and lists that break JSON's grammar but keep its structure.
const BROKEN_GRAMMAR: &[&str] = &[
    "[1,]",
    "[,1]",
    "{\"a\":1,}",
    "{\"a\"1}",
    "{1:2}",
    "[1 2]",
    "{\"a\":1 \"b\":2}",
    "{\"a\":}",
    "[\"a\",]",
    "{,}",
    "[01, tru, -]",
    // The run of compact string members (`,"key":"value"`), broken at each of its steps.
    "{\"a\":\"b\",}",
    "{\"a\":\"b\",\"c\"}",
    "{\"a\":\"b\",\"c\":}",
    "{\"a\":\"b\",\"c\":\"d\" \"e\":\"f\"}",
];

/// Objects and lists whose structure is broken: where they end is not known.
const BROKEN_STRUCTURE: &[&str] = &[
    "[",
    "{",
    "]",
    "[}",
    "{]",
    "[[]",
    "{\"a\":\"b\",\"c\":\"d\"",
    "{\"a\":\"b\",\"c\":\"d\",",
    "{\"a\":\"b\",\"c\":\"d\"]",
    "{\"a\":\"b\",\"c\":\"d\u{1}\"}",
    "[{\"a\":\"b\",\"c\":\"d\"}}",
    "[\"\\x\"]",
    "[\"\\u12g4\"]",
    "[\\\"]",
    "[1, \\ 2]",
    "[\"open]",
];

#[test]
fn a_skipped_container_is_checked_for_structure_only() {
    for text in BROKEN_GRAMMAR {
        assert_eq!(read::<IgnoredAny>(text).map(drop), Ok(()), "{text:?}");
        assert_eq!(
            read::<&RawValue>(text).map(|r| r.get()),
            Ok(*text),
            "{text:?}"
        );
        assert!(
            serde_json::from_str::<IgnoredAny>(text).is_err(),
            "{text:?}"
        );
        assert!(has_structure(text), "{text:?}");
        // Read as a field the type skips, with the field after it read as usual.
        let review = format!("{{\"skip\":{text},\"kind\":\"k\"}}");
        let envelope = read::<Envelope<'_>>(&review).unwrap();
        assert_eq!(envelope.kind, Some("k"), "{review}");
        assert_eq!(
            agree::<Envelope<'_>>(&review, Skips::Yes),
            Agreement::ReadPastFault
        );
    }
    for text in BROKEN_STRUCTURE {
        assert_eq!(read::<IgnoredAny>(text), Err(Fallback), "{text:?}");
        assert_eq!(
            read::<&RawValue>(text).map(|r| r.get()),
            Err(Fallback),
            "{text:?}"
        );
        assert!(
            serde_json::from_str::<IgnoredAny>(text).is_err(),
            "{text:?}"
        );
        assert!(!has_structure(text), "{text:?}");
    }
    // The bytes the bracket class also finds are refused outside a string (a fault of grammar, not structure,
    // but the skip cannot tell them from a bracket without another compare), and read inside one.
    for byte in ["Y", "_", "y", "\u{7f}"] {
        assert_eq!(
            read::<IgnoredAny>(&format!("[{byte}]")),
            Err(Fallback),
            "{byte:?}"
        );
        assert!(
            read::<IgnoredAny>(&format!("[\"{byte}\"]")).is_ok(),
            "{byte:?}"
        );
    }
}

#[test]
fn deep_nesting_is_left_to_serde_json() {
    // Past 128 levels the fast path declines; serde_json walks a skipped value without a limit.
    let deep = "[".repeat(200) + &"]".repeat(200);
    assert_eq!(read::<IgnoredAny>(&deep), Err(Fallback));
    assert!(from_str::<IgnoredAny>(&deep).is_ok());
    let shallow = "[".repeat(100) + &"]".repeat(100);
    assert!(read::<IgnoredAny>(&shallow).is_ok());
}

#[test]
fn errors_are_serde_json_s_own() {
    let text = r#"{"metadata": {"labels": {"a": 1}}}"#;
    let fast = from_str::<Object<'_>>(text).unwrap_err().to_string();
    let slow = serde_json::from_str::<Object<'_>>(text)
        .unwrap_err()
        .to_string();
    assert_eq!(fast, slow);
    // What the fast path declines but serde_json accepts still reads: a struct written as a list.
    assert_eq!(read::<Object<'_>>("[null, null]").map(drop), Err(Fallback));
    let listed: serde_json::Result<Object<'_>> = from_str("[null, null]");
    assert!(listed.is_ok());
}

#[test]
fn a_block_s_stops_are_its_quotes_backslashes_and_control_characters() {
    // Every byte value at every place in the block, against the byte-by-byte definition.
    for at in 0..64 {
        for byte in 0..=255u8 {
            let mut block = [b'a'; 64];
            block[at] = byte;
            let expected = if byte == b'"' || byte == b'\\' || byte < 0x20 {
                1u64 << at
            } else {
                0
            };
            assert_eq!(
                super::blocks::stop_mask(&block),
                expected,
                "byte {byte:#04x} at {at}"
            );
        }
    }
    let mixed: Vec<u8> = (0..64u8)
        .map(|i| [b'"', b'x', b'\\', 0x1f, 0x20, 0x7f, 0xff][usize::from(i) % 7])
        .collect();
    let block: &[u8; 64] = mixed.as_slice().try_into().unwrap();
    let expected = (0..64)
        .filter(|&i| [0, 2, 3].contains(&(i % 7)))
        .fold(0u64, |m, i| m | 1 << i);
    assert_eq!(super::blocks::stop_mask(block), expected);
}

/// A skipped list whose blocks (64 bytes from its `[`) start `shift` bytes further into the same content each
/// time: escapes and backslash runs, quotes, strings, numbers and literals land on every place of a block,
/// also its last byte (a backslash there escapes the next block's first).
fn shifted(shift: usize, content: &str) -> String {
    format!(
        r#"{{"kind":"k","skip":["{}",{content}],"request":{{"uid":"u"}}}}"#,
        "p".repeat(shift)
    )
}

const ACROSS_BLOCKS: &str = r#""\\","\\\\","\\\"\\\\\"",
"a\"b\\\"c\\\\\"d","\u00e9\uD83D\uDE00\/\b\f\n\r\t",{"k":[1,-0,2.5e+3,0.0,true,false,null]},
"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\\\\\\\\\\\\\\\\\"",
[[],{},[{}],{"a":{"b":[]}}] , { "s" : "t" } ,12345678901234567890,"é日本",
"{\"nested\":\"json\",\"in\":[\"a\",\"string\"]}""#;

#[test]
fn skipped_containers_agree_across_block_boundaries() {
    let content = ACROSS_BLOCKS.replace('\n', "");
    // The content itself is valid JSON in a list, and read by the fast path at every shift.
    for shift in 0..64 {
        let text = shifted(shift, &content);
        assert!(agree_all(&text), "shift {shift}: {text}");
    }
    // Every one-byte change at every shift: refused by both, read alike, or read past a fault in the skipped
    // list as the text before it was broken.
    let swaps: &[u8] = b"\"\\,:[]{}0-.e \x01\tu/x";
    let mut past_fault = 0;
    for shift in (0..64).step_by(3) {
        let text = shifted(shift, &content);
        let original = format!("{:?}", read::<Envelope<'_>>(&text).unwrap());
        let bytes = text.as_bytes();
        for at in 0..bytes.len() {
            for &swap in swaps {
                let mut changed = bytes.to_vec();
                changed[at] = swap;
                if let Ok(changed) = std::str::from_utf8(&changed) {
                    past_fault += read_alike(changed, &original);
                    agree::<IgnoredAny>(changed, Skips::Yes);
                }
            }
            let mut removed = bytes.to_vec();
            removed.remove(at);
            if let Ok(removed) = std::str::from_utf8(&removed) {
                past_fault += read_alike(removed, &original);
            }
        }
    }
    // Most changes inside the skipped list that break its grammar keep its structure.
    assert!(past_fault > 1000, "{past_fault}");
}

/// A review broken inside its skipped list and read all the same is read as before it was broken: the list
/// ends where it ended, and the fields after it are the same. 1 when it was read so.
fn read_alike(text: &str, original: &str) -> usize {
    match agree::<Envelope<'_>>(text, Skips::Yes) {
        Agreement::ReadPastFault => {
            let read = read::<Envelope<'_>>(text).unwrap();
            assert_eq!(format!("{read:?}"), original, "{text}");
            1
        }
        _ => 0,
    }
}

#[test]
fn a_block_s_classes_are_its_bytes() {
    // Every byte value at every place in the block, against the byte-by-byte definitions.
    for at in 0..64 {
        for byte in 0..=255u8 {
            let mut block = [b'a'; 64];
            block[at] = byte;
            let c = super::blocks::classify(&block);
            let bit = |yes: bool| if yes { 1u64 << at } else { 0 };
            let what = format!("byte {byte:#04x} at {at}");
            assert_eq!(c.quote, bit(byte == b'"'), "{what}");
            assert_eq!(c.backslash, bit(byte == b'\\'), "{what}");
            assert_eq!(c.bracket, bit(b"{}[]Y_y\x7f".contains(&byte)), "{what}");
            assert_eq!(c.control, bit(byte < 0x20), "{what}");
        }
    }
}

#[test]
fn escaped_bytes_follow_backslash_runs_into_the_next_block() {
    let mut carry = 0;
    // `\\` escapes its second backslash; `\\\` at the block's end escapes the next block's first byte.
    let backslash = 0b11 | (0b111 << 61);
    let escaped = super::blocks::escaped_bytes(backslash, &mut carry);
    assert_eq!(escaped, 0b10 | (1 << 62));
    assert_eq!(carry, 1);
    assert_eq!(super::blocks::escaped_bytes(0, &mut carry), 1);
    assert_eq!(carry, 0);
    // An escaped backslash at bit 0 escapes nothing.
    let mut carry = 1;
    assert_eq!(super::blocks::escaped_bytes(0b1, &mut carry), 0b1);
    assert_eq!(carry, 0);
}
