use crate::config::Config;

use super::inject::{RUN_STACK, SHARE_FROM, renumber, share_out};
use super::stream::cut;
use super::*;

const SERVICE: &str = "# the shop's front\napiVersion: v1\nkind: Service\nmetadata: {name: web}  # flow style\nspec:\n  ports: [{port: 0080}]\n";
const SKIPPED: &str = "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: plain\nspec:\n  template:\n    spec:\n      containers:\n      - name: app\n        image: 'app:1'   # quoted\n";
const WIRED: &str = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: wired  # kept?\n  annotations:\n    pdp-injector.io/inject: sidecar\nspec:\n  containers:\n  - name: app\n    image: app:1\n";

fn run(input: &str) -> Result<(String, Vec<DocReport>), OfflineError> {
    inject_stream(input, &Config::builtin(), &Options::default())
}

#[test]
fn documents_left_alone_come_out_as_their_own_text() {
    let input = format!("{SERVICE}---\n{SKIPPED}--- # a marker with a comment\n{WIRED}");
    let (out, reports) = run(&input).unwrap();
    assert_eq!(reports.len(), 3);
    assert_eq!(reports[2].reason, Some(Reason::InjectedSidecar));
    // The first two byte for byte, comments, quotes and spelling kept; the wired Pod printed anew.
    let head = format!("---\n{SERVICE}---\n{SKIPPED}");
    assert!(out.starts_with(&head), "{out}");
    let wired = &out[head.len()..];
    assert!(
        wired.starts_with("---\n") && !wired.contains("# kept?"),
        "{wired}"
    );
    let docs = parse_stream(wired).unwrap();
    assert_eq!(docs.len(), 1);
    assert!(
        docs[0].pointer("/spec/initContainers/0").is_some(),
        "{wired}"
    );
    // And that is a fixed point.
    let (again, _) = run(&out).unwrap();
    assert_eq!(again, out);
}

#[test]
fn a_marker_inside_a_scalar_or_with_content_is_read_as_yaml_says() {
    // `---` indented in a block scalar is content; `--- {...}` starts a document on its own line.
    let input = "kind: ConfigMap\nmetadata: {name: a}\ndata:\n  x: |\n    ---\n    y\n--- {kind: Service, metadata: {name: b}}\n...\n";
    let docs = read_stream(input).unwrap();
    assert_eq!(docs.len(), 2, "{docs:?}");
    assert_eq!(docs[0].value["data"]["x"], "---\ny\n");
    assert_eq!(docs[1].value["kind"], "Service");
    let (out, _) = run(input).unwrap();
    assert_eq!(out, format!("---\n{input}"));
}

#[test]
fn empty_and_null_documents_are_dropped() {
    let input = "# header\n---\n---\nnull\n---\n# nothing\n---\nkind: Service\n...\n# trailer\n";
    let docs = read_stream(input).unwrap();
    assert_eq!(docs.len(), 1, "{docs:?}");
    assert_eq!(docs[0].value["kind"], "Service");
}

#[test]
fn a_stream_with_directives_is_read_whole_and_printed() {
    let input = "%YAML 1.2\n---\nkind: Service\nmetadata: {name: a}\n";
    let docs = read_stream(input).unwrap();
    assert_eq!(docs.len(), 1);
    assert!(docs[0].source.is_none());
    let (out, _) = run(input).unwrap();
    assert!(out.starts_with("---\n") && !out.contains("%YAML"), "{out}");
    assert_eq!(parse_stream(&out).unwrap()[0]["metadata"]["name"], "a");
}

#[test]
fn bad_yaml_is_named_by_its_document_and_its_line_in_the_stream() {
    let input = format!("{SERVICE}---\n{SKIPPED}---\nkind: Pod\nmetadata:\n  name: [unclosed\n");
    let err = run(&input).unwrap_err().to_string();
    let line = SERVICE.lines().count() + SKIPPED.lines().count() + 2 + 3;
    assert!(
        err.starts_with("input is not valid YAML: document 3: "),
        "{err}"
    );
    assert!(err.contains(&format!("line {line}")), "line {line}: {err}");
}

#[test]
fn a_namespace_of_the_stream_counts_wherever_it_is_and_however_its_kind_is_spelt() {
    let pod = "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: shop}\nspec:\n  containers:\n  - {name: app, image: 'app:1'}\n";
    let labels = "metadata:\n  name: shop\n  labels: {pdp-injector.io/injection: sidecar}\n";
    let reason = |input: &str| run(input).unwrap().1[0].reason;
    assert_eq!(reason(pod), Some(Reason::NotOptedIn));
    // After the Pod it labels, and with its kind written with a YAML escape (no `Namespace` in the text).
    let list = "kind: List\nitems:\n- {kind: Namespace, metadata: {name: shop, labels: {pdp-injector.io/injection: sidecar}}}\n";
    for namespace in [
        format!("apiVersion: v1\nkind: Namespace\n{labels}"),
        format!("apiVersion: v1\nkind: \"Name\\x73pace\"\n{labels}"),
        format!("apiVersion: v1\n{list}"),
    ] {
        let input = format!("{pod}---\n{namespace}");
        assert_eq!(reason(&input), Some(Reason::InjectedSidecar), "{input}");
    }
}

/// A stream long enough to be shared out: documents of every sort, a Namespace that labels Pods before it, an
/// injected List, empty and null documents, and an injected Pod last.
fn long_stream() -> String {
    let pod = |i: usize, ns: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: p{i}, namespace: {ns}}}\nspec:\n  containers:\n  - {{name: app, image: 'app:1'}}\n"
        )
    };
    let mut docs = vec![];
    for i in 0..2400 {
        docs.push(match i % 6 {
            0 => pod(i, "shop"),
            1 => SERVICE.to_string(),
            2 => SKIPPED.to_string(),
            3 => WIRED.to_string(),
            4 => format!(
                "kind: List\nitems:\n- {}\n- {{kind: Service, metadata: {{name: s}}}}\n",
                pod(i, "shop").replace('\n', "\n  ").trim_end()
            ),
            _ => ["# nothing\n", "null\n"][i / 6 % 2].to_string(),
        });
    }
    docs.push("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: shop\n  labels: {pdp-injector.io/injection: sidecar}\n".into());
    docs.push(WIRED.to_string());
    // As deep as the reader allows, in the last run: a thread's stack holds it as the main thread's does.
    docs.push(format!(
        "kind: ConfigMap\nmetadata: {{name: deep}}\ndata: {}1{}\n",
        "{a: ".repeat(120),
        "}".repeat(120)
    ));
    let stream = docs.join("---\n");
    assert!(stream.len() > SHARE_FROM, "{}", stream.len());
    stream
}

/// [`inject_stream`] with `workers`, called from a thread with the stack of the command's main thread (a test
/// thread's 2 MiB do not hold the deep document in a debug build).
fn run_with(input: &str, workers: usize) -> Result<(String, Vec<DocReport>), OfflineError> {
    let options = Options {
        workers,
        ..Options::default()
    };
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .stack_size(RUN_STACK)
            .spawn_scoped(scope, || inject_stream(input, &Config::builtin(), &options))
            .unwrap()
            .join()
            .unwrap()
    })
}

#[test]
fn a_long_stream_shared_out_gives_the_output_of_one_thread() {
    let input = long_stream();
    let (one, one_reports) = run_with(&input, 1).unwrap();
    // Every kind of report is there, numbered through the whole stream.
    assert!(
        one_reports.iter().any(|r| r.index == "500.1"),
        "{:?}",
        &one_reports[..8]
    );
    assert_eq!(one_reports.last().unwrap().index, "2003");
    let injected = one_reports
        .iter()
        .filter(|r| r.reason == Some(Reason::InjectedSidecar))
        .count();
    assert_eq!(
        injected, 1201,
        "the shop's Pods and Lists, and the wired Pods"
    );
    for workers in [2, 3, 7] {
        let (out, reports) = run_with(&input, workers).unwrap();
        assert_eq!(reports, one_reports, "{workers} workers");
        assert!(out == one, "{workers} workers: the output differs");
    }
    // A run per worker, of about equal text, in order.
    let pieces = cut(&input).unwrap();
    let runs = share_out(pieces.iter().collect(), |p| p.text.len(), input.len(), 3);
    assert_eq!(runs.len(), 3);
    assert_eq!(runs.iter().map(Vec::len).sum::<usize>(), pieces.len());
    for run in &runs {
        let size: usize = run.iter().map(|p| p.text.len()).sum();
        assert!(size < input.len() / 2, "{size} of {}", input.len());
    }
}

#[test]
fn a_long_stream_shared_out_fails_as_one_thread_does() {
    let input = long_stream();
    let refused = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  annotations: {pdp-injector.io/inject: bogus}\nspec:\n  containers:\n  - {name: app, image: 'app:1'}\n";
    let (head, tail) = input.split_at(input.len() * 3 / 4);
    let at = head.len() + tail.find("\n---\n").unwrap() + 5;
    for (bad, yaml) in [(refused, false), ("kind: [unclosed\n", true)] {
        let input = format!("{}{bad}---\n{}", &input[..at], &input[at..]);
        let one = run_with(&input, 1).unwrap_err().to_string();
        assert_eq!(one.starts_with("input is not valid YAML"), yaml, "{one}");
        // Named by its place in the whole stream, in the last run's part of it.
        let n: String = one
            .split("document ")
            .nth(1)
            .unwrap()
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        assert!(
            (1400..=1600).contains(&n.parse::<usize>().unwrap()),
            "{one}"
        );
        assert_eq!(run_with(&input, 2).unwrap_err().to_string(), one);
    }
}

#[test]
fn a_report_index_moves_on_by_the_documents_before_its_run() {
    assert_eq!(renumber("3", 10), "13");
    assert_eq!(renumber("3.2", 10), "13.2");
    assert_eq!(renumber("3.2.1", 0), "3.2.1");
}

#[test]
fn errors_are_found_in_the_order_of_the_whole_stream() {
    // A refused document before one that is not YAML: the YAML error is the answer, as when the stream is
    // read whole before any document is injected.
    let refused = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  annotations: {pdp-injector.io/inject: bogus}\nspec:\n  containers:\n  - {name: app, image: 'app:1'}\n";
    assert!(matches!(run(refused), Err(OfflineError::Document { .. })));
    let input = format!("{refused}---\nkind: [unclosed\n");
    let err = run(&input).unwrap_err();
    assert!(matches!(err, OfflineError::Yaml(_)), "{err}");
    assert!(err.to_string().contains("document 2"), "{err}");
}

#[test]
fn a_template_is_read_from_its_own_text_and_keeps_what_the_typed_structs_do_not_know() {
    // A Job template without `metadata`, opted in by its namespace, with a field no Kubernetes type has.
    let job = "apiVersion: batch/v1\nkind: Job\nmetadata: {name: j, namespace: shop}\nspec:\n  template:\n    spec:\n      restartPolicy: Never\n      containers:\n      - {name: app, image: 'app:1', x-future-field: kept}\n";
    let ns = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: shop\n  labels: {pdp-injector.io/injection: sidecar}\n";
    let (out, reports) = run(&format!("{ns}---\n{job}")).unwrap();
    assert_eq!(reports[1].reason, Some(Reason::InjectedSidecar), "{out}");
    let docs = parse_stream(&out).unwrap();
    let template = &docs[1]["spec"]["template"];
    assert!(template["metadata"].is_object(), "{out}");
    assert_eq!(
        template["spec"]["containers"][0]["x-future-field"], "kept",
        "{out}"
    );
    assert!(
        template.pointer("/spec/initContainers/0").is_some(),
        "{out}"
    );
}

#[test]
fn a_template_of_the_wrong_shape_is_named_by_its_field() {
    let bad = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\nspec:\n  template:\n    spec:\n      containers:\n      - {name: [app], image: 'app:1'}\n";
    let err = run(bad).unwrap_err().to_string();
    assert!(err.contains("is not a valid Deployment"), "{err}");
    assert!(err.contains("spec.containers[0].name"), "{err}");
}
