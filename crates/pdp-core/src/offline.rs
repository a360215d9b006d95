//! Offline injection of a multi-document YAML stream (`pdp-injector inject -f`): the same core as the webhook,
//! applied to the Pod template of each workload, for GitOps pipelines and for reviewing what the webhook would do.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use serde::Deserialize;
use serde_json::Value;

use crate::config::Config;
use crate::core::{Form, Outcome, inject_as};
use crate::core::{NamespaceInfo, Reason, Warning};
use crate::names::LABEL_NAMESPACE_INJECTION;

/// Defaults for the documents of one stream (the `inject` command's `--mode` and `--namespace`).
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Namespace default for documents whose namespace the stream does not label: a value of the namespace
    /// label pdp-injector.io/injection (enabled, sidecar, daemonset, central or disabled).
    pub mode: Option<String>,
    /// Namespace of documents that name none.
    pub default_namespace: Option<String>,
    /// Threads that parse, inject and write the documents of a long stream, each a run of them (0 or 1: the
    /// caller's thread only). The output is the same for any number.
    pub workers: usize,
}

/// What happened to one document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DocReport {
    /// Position in the stream, from 1, with `.N` for the items of a List.
    pub index: String,
    /// The document's kind.
    pub kind: String,
    /// The document's name.
    pub name: String,
    /// The reason code, or `None` for a kind that has no Pod template.
    pub reason: Option<Reason>,
    /// Warnings for that document.
    pub warnings: Vec<Warning>,
}

impl DocReport {
    /// `document 2 (Deployment "web")`: how the reports name a document.
    pub fn heading(&self) -> String {
        format!("document {} ({} {:?})", self.index, self.kind, self.name)
    }
}

/// Why a stream could not be injected; nothing is printed then.
#[derive(Debug, thiserror::Error)]
pub enum OfflineError {
    /// The input is not YAML.
    #[error("input is not valid YAML: {0}")]
    Yaml(String),
    /// One document was denied or is not a valid object of its kind.
    #[error("document {index} ({kind} {name:?}): {message}")]
    Document {
        /// Position in the stream.
        index: String,
        /// Its kind.
        kind: String,
        /// Its name.
        name: String,
        /// The denial message or parse error.
        message: String,
    },
}

/// Where the Pod template sits (a JSON pointer) in each kind that has one; `None` for kinds without.
pub fn template_pointer(kind: &str) -> Option<&'static str> {
    match kind {
        "Pod" => Some(""),
        "Deployment"
        | "StatefulSet"
        | "DaemonSet"
        | "ReplicaSet"
        | "Job"
        | "ReplicationController" => Some("/spec/template"),
        "CronJob" => Some("/spec/jobTemplate/spec/template"),
        "PodTemplate" => Some("/template"),
        _ => None,
    }
}

fn str_at<'a>(doc: &'a Value, pointer: &str) -> &'a str {
    doc.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

/// One document of a stream: its value, and its text when it was read on its own (then a document the
/// injector leaves alone is written back as that text, comments and spelling kept).
#[derive(Debug, Clone)]
pub struct Document<'a> {
    /// The document.
    pub value: Value,
    /// Its text, from its `---` line (if it has one) to the next document's.
    pub source: Option<&'a str>,
}

/// The parser's options for `input`, sized so that large inputs are not cut by its defaults.
fn yaml_options(input: &str) -> serde_saphyr::Options {
    // `0755` is octal, as kubectl reads it (file modes are written that way in manifests).
    let mut options = serde_saphyr::Options::default();
    options.legacy_octal_numbers = true;
    // Comments are not kept in values: documents that are written back unchanged keep their text instead.
    options.emit_comments = false;
    if let Some(budget) = options.budget.as_mut() {
        let scale = input.len() / 8 + 1;
        budget.max_documents = budget.max_documents.max(scale);
        budget.max_events = budget.max_events.max(scale * 4);
        budget.max_nodes = budget.max_nodes.max(scale * 2);
        budget.max_depth = 128;
    }
    options
}

/// Whether `line` is a document marker (`---` or `...`, alone or followed by a blank).
fn is_marker(line: &str, marker: &str) -> bool {
    line.strip_prefix(marker)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '\t', '\r', '\n']))
}

/// A piece of the stream that holds at most one document.
struct Piece<'a> {
    text: &'a str,
    /// Lines before it in the stream.
    line: usize,
}

/// Cuts a stream at its document markers. YAML forbids `---` and `...` at the start of a line inside a
/// document (in block and quoted scalars too), so each piece holds at most one document. `None` for what this
/// cut does not cover (directives, a byte order mark): the stream is then read whole.
fn cut(input: &str) -> Option<Vec<Piece<'_>>> {
    let mut pieces = Vec::new();
    let (mut start, mut start_line) = (0, 0);
    let mut at = 0;
    for (n, line) in input.split_inclusive('\n').enumerate() {
        if line.starts_with(['%', '\u{feff}']) {
            return None;
        }
        let next = at + line.len();
        if is_marker(line, "---") {
            pieces.push(Piece {
                text: &input[start..at],
                line: start_line,
            });
            (start, start_line) = (at, n);
        } else if is_marker(line, "...") {
            pieces.push(Piece {
                text: &input[start..next],
                line: start_line,
            });
            (start, start_line) = (next, n + 1);
        }
        at = next;
    }
    pieces.push(Piece {
        text: &input[start..],
        line: start_line,
    });
    pieces.retain(|p| !p.text.is_empty());
    Some(pieces)
}

/// Whether `text` holds no node: only blank lines, comments and markers (alone or with a comment).
fn is_empty_piece(text: &str) -> bool {
    text.lines().all(|l| {
        let rest = ["---", "..."]
            .iter()
            .find(|m| is_marker(l, m))
            .map_or(l, |m| &l[m.len()..])
            .trim();
        rest.is_empty() || rest.starts_with('#')
    })
}

/// Reads a stream into documents, each with its text. An empty document (even a tagged one, which reads as
/// null) is no object and is dropped, as an explicit `null` document is: that keeps the output a fixed point.
pub fn read_stream(input: &str) -> Result<Vec<Document<'_>>, OfflineError> {
    let Some(pieces) = cut(input) else {
        return read_whole(input);
    };
    let mut docs = Vec::with_capacity(pieces.len());
    for piece in pieces {
        match read_piece(piece.text) {
            Ok(None) => {}
            Ok(Some(doc)) => docs.push(doc),
            Err(e) => {
                // The cut is only a shortcut: where the stream read whole holds, its reading stands.
                if let Ok(whole) = read_whole(input) {
                    return Ok(whole);
                }
                // Lines counted in the whole stream.
                let message = e.render_with_options(serde_saphyr::render_options! {
                    line_offset: piece.line as u64,
                });
                return Err(OfflineError::Yaml(format!(
                    "document {}: {message}",
                    docs.len() + 1
                )));
            }
        }
    }
    Ok(docs)
}

/// One piece of a cut stream as a document with its text; `None` for an empty or null one.
fn read_piece(text: &str) -> Result<Option<Document<'_>>, serde_saphyr::Error> {
    if is_empty_piece(text) {
        return Ok(None);
    }
    Ok(
        match serde_saphyr::from_str_with_options::<Value>(text, yaml_options(text))? {
            Value::Null => None,
            value => Some(Document {
                value,
                source: Some(text),
            }),
        },
    )
}

/// Reads the stream as one: for what [`cut`] does not cover, and to check what a piece could not parse.
fn read_whole(input: &str) -> Result<Vec<Document<'_>>, OfflineError> {
    let values = serde_saphyr::from_multiple_with_options::<Value>(input, yaml_options(input))
        .map_err(|e| OfflineError::Yaml(e.to_string()))?;
    Ok(values
        .into_iter()
        .filter(|v| !v.is_null())
        .map(|value| Document {
            value,
            source: None,
        })
        .collect())
}

/// Parses a stream into its documents' values.
pub fn parse_stream(input: &str) -> Result<Vec<Value>, OfflineError> {
    Ok(read_stream(input)?.into_iter().map(|d| d.value).collect())
}

/// Writes documents back as a YAML stream, each printed from its value.
pub fn write_stream(docs: &[Value]) -> String {
    let mut out = String::with_capacity(docs.len() * 1024);
    for doc in docs {
        write_value(&mut out, doc);
    }
    out
}

fn write_value(out: &mut String, doc: &Value) {
    out.push_str("---\n");
    // A JSON value always serializes to YAML.
    out.push_str(&serde_saphyr::to_string(doc).expect("JSON values serialize to YAML"));
    if !out.ends_with('\n') {
        out.push('\n');
    }
}

/// Writes documents back: a document the injector left alone (`changed` false) as its own text when it has
/// one, the others printed from their value.
fn write_documents(docs: &[Document<'_>], changed: &[bool]) -> String {
    let size: usize = docs.iter().map(|d| d.source.map_or(1024, str::len)).sum();
    let mut out = String::with_capacity(size + size / 4);
    for (doc, changed) in docs.iter().zip(changed) {
        write_document(&mut out, doc, *changed);
    }
    out
}

fn write_document(out: &mut String, doc: &Document<'_>, changed: bool) {
    match doc.source {
        Some(text) if !changed => {
            if !is_marker(text, "---") {
                out.push_str("---\n");
            }
            out.push_str(text);
            if !text.ends_with('\n') {
                out.push('\n');
            }
        }
        _ => write_value(out, &doc.value),
    }
}

/// Injects every Pod template of a stream in place; Namespace documents of the stream define their namespaces.
pub fn inject_documents(
    docs: &mut [Value],
    config: &Config,
    options: &Options,
) -> Result<Vec<DocReport>, OfflineError> {
    let mut docs: Vec<&mut Value> = docs.iter_mut().collect();
    inject_all(&mut docs, config, options).map(|(reports, _)| reports)
}

/// Injects every Pod template; with whether each document changed.
fn inject_all(
    docs: &mut [&mut Value],
    config: &Config,
    options: &Options,
) -> Result<(Vec<DocReport>, Vec<bool>), OfflineError> {
    let mut namespaces: HashMap<String, NamespaceInfo> = HashMap::new();
    for doc in docs.iter() {
        collect_namespaces(doc, &mut namespaces);
    }
    let mut reports = Vec::with_capacity(docs.len());
    let mut changed = Vec::with_capacity(docs.len());
    for (i, doc) in docs.iter_mut().enumerate() {
        changed.push(inject_document(
            doc,
            (i + 1).to_string(),
            config,
            options,
            &namespaces,
            &mut reports,
        )?);
    }
    Ok((reports, changed))
}

/// Parses, injects and writes a whole stream. Documents the injector leaves alone keep their text.
pub fn inject_stream(
    input: &str,
    config: &Config,
    options: &Options,
) -> Result<(String, Vec<DocReport>), OfflineError> {
    if let Some(done) = inject_pieces(input, config, options) {
        return Ok(done);
    }
    let mut docs = read_stream(input)?;
    let mut values: Vec<&mut Value> = docs.iter_mut().map(|d| &mut d.value).collect();
    let (reports, changed) = inject_all(&mut values, config, options)?;
    Ok((write_documents(&docs, &changed), reports))
}

/// [`inject_stream`] one document at a time: each piece of the cut stream parsed, injected, written and
/// dropped before the next, so a long stream is never held in memory as values (20,000 documents took 290 MB,
/// and dropping them at the end a tenth of the time). The stream's Namespace documents are read first: only a
/// piece whose text says `Namespace` can define one, or one with a backslash (a YAML escape could spell the
/// word); those are kept until their turn. With `options.workers` above 1, a long stream's pieces are shared out
/// as runs of about equal text, one per thread, and the runs' outputs joined in order. `None` when the stream is
/// not cut, or a piece does not parse or is refused: the whole-stream path then reads it and gives its answer, so
/// errors are found in the same order as before.
fn inject_pieces(
    input: &str,
    config: &Config,
    options: &Options,
) -> Option<(String, Vec<DocReport>)> {
    let pieces = cut(input)?;
    let namespace = memchr::memmem::Finder::new("Namespace");
    let mut namespaces: HashMap<String, NamespaceInfo> = HashMap::new();
    // Each piece with what the first pass read of it (`Some`), so that none is parsed twice.
    let mut work: Vec<(&Piece<'_>, Option<Option<Document<'_>>>)> =
        Vec::with_capacity(pieces.len());
    for piece in &pieces {
        let text = piece.text.as_bytes();
        let early = if namespace.find(text).is_some() || memchr::memchr(b'\\', text).is_some() {
            let doc = read_piece(piece.text).ok()?;
            if let Some(doc) = &doc {
                collect_namespaces(&doc.value, &mut namespaces);
            }
            Some(doc)
        } else {
            None
        };
        work.push((piece, early));
    }
    let runs = share_out(work, |(p, _)| p.text.len(), input.len(), options.workers);
    let one_run = |run| inject_run(run, config, options, &namespaces);
    let done: Vec<Option<Run>> = if runs.len() == 1 {
        runs.into_iter().map(one_run).collect()
    } else {
        std::thread::scope(|scope| {
            let threads: Vec<_> = runs
                .into_iter()
                .map(|run| {
                    // The main thread's stack, not a spawned thread's 2 MiB: a deep document recurses as deep.
                    std::thread::Builder::new()
                        .stack_size(RUN_STACK)
                        .spawn_scoped(scope, move || one_run(run))
                })
                .collect();
            // A thread that could not start or panicked counts as a refusal: the whole-stream path then gives
            // the answer.
            threads
                .into_iter()
                .map(|t| t.ok().and_then(|t| t.join().ok().flatten()))
                .collect()
        })
    };
    let mut out = String::with_capacity(input.len() + input.len() / 4);
    let mut reports = Vec::with_capacity(pieces.len());
    let mut count = 0;
    for run in done {
        let mut run = run?;
        out.push_str(&run.out);
        if count > 0 {
            // The run numbered its documents from 1: shift by those of the runs before.
            for r in &mut run.reports {
                r.index = renumber(&r.index, count);
            }
        }
        reports.append(&mut run.reports);
        count += run.documents;
    }
    Some((out, reports))
}

/// The stack of a thread that injects a run of pieces.
const RUN_STACK: usize = 8 * 1024 * 1024;

/// Streams shorter than this are injected in the caller's thread: a thread costs more than it saves there.
const SHARE_FROM: usize = 256 * 1024;

/// The pieces as `workers` runs of about equal text, in order; one run for a short stream or one worker.
fn share_out<T>(
    work: Vec<T>,
    size: impl Fn(&T) -> usize,
    total: usize,
    workers: usize,
) -> Vec<Vec<T>> {
    let workers = workers.clamp(1, work.len().max(1));
    if workers == 1 || total < SHARE_FROM {
        return vec![work];
    }
    let share = total.div_ceil(workers);
    let mut runs = Vec::with_capacity(workers);
    let mut run = Vec::new();
    let mut taken = 0;
    for item in work {
        taken += size(&item);
        run.push(item);
        if taken >= share && runs.len() + 1 < workers {
            runs.push(std::mem::take(&mut run));
            taken = 0;
        }
    }
    runs.push(run);
    runs
}

/// What one run of pieces gave: its text, its reports (documents numbered from 1) and how many documents it had.
struct Run {
    out: String,
    reports: Vec<DocReport>,
    documents: usize,
}

/// Parses, injects and writes one run of pieces, each dropped before the next; `None` if one does not parse or
/// is refused.
fn inject_run(
    run: Vec<(&Piece<'_>, Option<Option<Document<'_>>>)>,
    config: &Config,
    options: &Options,
    namespaces: &HashMap<String, NamespaceInfo>,
) -> Option<Run> {
    let size: usize = run.iter().map(|(p, _)| p.text.len()).sum();
    let mut done = Run {
        out: String::with_capacity(size + size / 4),
        reports: Vec::with_capacity(run.len()),
        documents: 0,
    };
    for (piece, early) in run {
        let doc = match early {
            Some(doc) => doc,
            None => read_piece(piece.text).ok()?,
        };
        let Some(mut doc) = doc else {
            continue;
        };
        done.documents += 1;
        let changed = inject_document(
            &mut doc.value,
            done.documents.to_string(),
            config,
            options,
            namespaces,
            &mut done.reports,
        );
        write_document(&mut done.out, &doc, changed.ok()?);
    }
    Some(done)
}

/// A report's index (`N`, or `N.M` for an item of a List) with `N` moved on by `by`.
fn renumber(index: &str, by: usize) -> String {
    let (first, rest) = index.split_at(index.find('.').unwrap_or(index.len()));
    match first.parse::<usize>() {
        Ok(n) => format!("{}{rest}", n + by),
        // Not from a run (every run writes numbers): left as it is.
        Err(_) => index.to_string(),
    }
}

fn collect_namespaces(doc: &Value, out: &mut HashMap<String, NamespaceInfo>) {
    match str_at(doc, "/kind") {
        "Namespace" => {
            let name = str_at(doc, "/metadata/name").to_string();
            let labels: Vec<(String, String)> = doc
                .pointer("/metadata/labels")
                .and_then(Value::as_object)
                .map(|m| {
                    m.iter()
                        .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                        .collect()
                })
                .unwrap_or_default();
            out.insert(
                name.clone(),
                NamespaceInfo::from_labels(name, labels.iter().map(|(k, v)| (k, v))),
            );
        }
        "List" => {
            for item in doc
                .get("items")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                collect_namespaces(item, out);
            }
        }
        _ => {}
    }
}

fn inject_document(
    doc: &mut Value,
    index: String,
    config: &Config,
    options: &Options,
    namespaces: &HashMap<String, NamespaceInfo>,
    reports: &mut Vec<DocReport>,
) -> Result<bool, OfflineError> {
    let kind = str_at(doc, "/kind").to_string();
    let name = str_at(doc, "/metadata/name").to_string();
    if kind == "List" {
        let mut changed = false;
        if let Some(items) = doc.get_mut("items").and_then(Value::as_array_mut) {
            for (j, item) in items.iter_mut().enumerate() {
                changed |= inject_document(
                    item,
                    format!("{index}.{}", j + 1),
                    config,
                    options,
                    namespaces,
                    reports,
                )?;
            }
        }
        return Ok(changed);
    }
    let fail = |message: String| OfflineError::Document {
        index: index.clone(),
        kind: kind.clone(),
        name: name.clone(),
        message,
    };
    let Some(pointer) = template_pointer(&kind) else {
        reports.push(DocReport {
            index: index.clone(),
            kind: kind.clone(),
            name: name.clone(),
            reason: None,
            warnings: vec![],
        });
        return Ok(false);
    };
    if !doc.is_object() {
        return Err(fail("a document must be a mapping".into()));
    }
    let ns_name = match str_at(doc, "/metadata/namespace") {
        "" => options.default_namespace.as_deref().unwrap_or("default"),
        ns => ns,
    }
    .to_string();
    let mut ns = namespaces
        .get(&ns_name)
        .cloned()
        .unwrap_or_else(|| NamespaceInfo::named(ns_name.clone()));
    if ns.injection.is_none() {
        ns.injection.clone_from(&options.mode);
    }

    let template = doc
        .pointer_mut(pointer)
        .ok_or_else(|| fail(format!("has no Pod template at {pointer}")))?;
    let pod = if pointer.is_empty() {
        Pod::deserialize(&*template)
    } else {
        PodTemplateSpec::deserialize(&*template).map(|t| Pod {
            metadata: t.metadata.unwrap_or_default(),
            spec: t.spec,
            status: None,
        })
    }
    .map_err(|e| fail(format!("is not a valid {kind}: {e}")))?;

    // The patch is applied below: its values as trees, moved into the document.
    let outcome = inject_as(&pod, &ns, config, Form::Apply);
    let reason = outcome.reason();
    let warnings = outcome.warnings().to_vec();
    let changed = matches!(outcome, Outcome::Injected(_));
    match outcome {
        Outcome::Denied(denial) => {
            let hint = if denial.reason == Reason::InvalidNamespaceLabel {
                format!(" (set by a Namespace document or --mode, as {LABEL_NAMESPACE_INJECTION})")
            } else {
                String::new()
            };
            return Err(fail(format!("{denial}{hint}")));
        }
        Outcome::Injected(injected) => {
            // A template may leave out `metadata` (common in Jobs and CronJobs); the typed Pod always has one,
            // so the patch adds under it: give the template the empty mapping it stands for.
            if let Some(t) = template.as_object_mut()
                && !t.get("metadata").is_some_and(Value::is_object)
            {
                t.insert("metadata".into(), Value::Object(Default::default()));
            }
            // The patch is relative to the Pod, and a Pod template has the same `metadata` and `spec` keys, so
            // the same patch applies to the template and keeps any field the typed structs do not know.
            injected
                .patch
                .apply_into(template)
                .map_err(|e| fail(format!("internal error applying the patch: {e}")))?;
        }
        Outcome::Skipped { .. } => {}
    }
    reports.push(DocReport {
        index,
        kind,
        name,
        reason: Some(reason),
        warnings,
    });
    Ok(changed)
}

#[cfg(test)]
mod tests {
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
        let input =
            "# header\n---\n---\nnull\n---\n# nothing\n---\nkind: Service\n...\n# trailer\n";
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
        let input =
            format!("{SERVICE}---\n{SKIPPED}---\nkind: Pod\nmetadata:\n  name: [unclosed\n");
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
}
