use super::*;

fn raw(json: &str) -> Box<RawValue> {
    RawValue::from_string(json.to_string()).expect("test JSON")
}

#[test]
fn the_view_reads_as_serde_json_reads_it() {
    // `parse` goes through crate::json's fast path; it must read what serde_json reads, keys given twice,
    // escapes and skipped values included (crate::json's tests compare the two on broken texts).
    let pod = r#"{"metadata":{"labels":{"pdp-injector.io/inject":"a","pdp-injector.io/inject":"b\u0021",
            "other":"x"},"annotations":{"pdp-injector.io/profile":"cerbos","x":"{\"k\":[1,2]}"}},
            "spec":{"containers":[{"name":"app","env":[{"name":"A"}],"volumeMounts":null,"image":"i"},
            {"name":"c\u00e9","resources":{"limits":{"cpu":1.5}}}],"initContainers":[{"name":"i"}],
            "volumes":[{"name":"v","emptyDir":{}}],"hostNetwork":true,"restartPolicy":"Never",
            "shareProcessNamespace":false,"tolerations":[{"key":"k","tolerationSeconds":-3}]}}"#;
    let fast = crate::json::read::<PodView<'_>>(pod).expect("the fast path reads it");
    let slow: PodView<'_> = serde_json::from_str(pod).unwrap();
    assert_eq!(format!("{fast:?}"), format!("{slow:?}"));
    assert_eq!(fast.label("pdp-injector.io/inject"), Some("b!"));
    assert_eq!(fast.containers()[1].name.as_str(), "c\u{e9}");
}

#[test]
fn first_unnamed_counts_only_the_entries_own_names() {
    // A nested `name` (a configMapKeyRef) must not pass for the variable: the forged-status threat.
    let list = raw(
        r#"[{"name":"OTHER","valueFrom":{"configMapKeyRef":{"name":"CERBOS_PDP_ADDR","key":"k"}}},
                {"name":"CERBOS_PDP_HOST","value":"x"}]"#,
    );
    let wanted = ["CERBOS_PDP_HOST", "CERBOS_PDP_ADDR"];
    assert_eq!(first_unnamed(Some(&list), &wanted), Some("CERBOS_PDP_ADDR"));
    let list = raw(
        r#"[{"name":"CERBOS_PDP_ADDR"},{"value":"CERBOS_PDP_HOST"},{"name":"CERBOS_PDP_HOST"}]"#,
    );
    assert_eq!(first_unnamed(Some(&list), &wanted), None);
}

#[test]
fn first_unnamed_reads_escaped_names_and_reports_in_the_order_wanted() {
    let list = raw(r#"[{"name":"A\u0042"},{"name":"C"}]"#);
    assert_eq!(first_unnamed(Some(&list), &["AB", "C"]), None);
    assert_eq!(first_unnamed(Some(&list), &["D", "AB", "E"]), Some("D"));
    assert_eq!(first_unnamed(Some(&list), &["AB", "E", "D"]), Some("E"));
    // A name wanted twice is found by one entry.
    assert_eq!(first_unnamed(Some(&list), &["C", "AB", "C"]), None);
    assert_eq!(first_unnamed(Some(&list), &["C", "X", "C"]), Some("X"));
    let none: [&str; 0] = [];
    assert_eq!(first_unnamed(Some(&list), &none), None);
}

#[test]
fn first_unnamed_counts_a_missing_null_or_broken_list_as_empty() {
    assert_eq!(first_unnamed(None, &["A"]), Some("A"));
    assert_eq!(first_unnamed(Some(&raw("null")), &["A"]), Some("A"));
    assert_eq!(
        first_unnamed(Some(&raw(r#"{"name":"A"}"#)), &["A"]),
        Some("A")
    );
    // What the fast reader declines (an entry written as a list, which serde_json reads as a struct) is read
    // again by serde_json: the answer is serde_json's.
    assert_eq!(
        first_unnamed(Some(&raw(r#"[["A"],{"name":"B"}]"#)), &["A", "B"]),
        None
    );
    // Entries are read up to the last name wanted: a broken entry before it hides what follows, after it
    // changes nothing.
    let list = raw(r#"[{"name":"A"},5,{"name":"B"}]"#);
    assert_eq!(first_unnamed(Some(&list), &["A"]), None);
    assert_eq!(first_unnamed(Some(&list), &["A", "B"]), Some("B"));
}
