//! Injecting the Pod templates of a stream's documents: the whole stream at once, or piece by piece in runs.

use std::collections::HashMap;

use serde_json::{Map, Value};

use crate::config::Config;
use crate::core::{Form, Outcome, PodView, inject_view_as};
use crate::core::{NamespaceInfo, Reason};
use crate::names::LABEL_NAMESPACE_INJECTION;

use super::stream::{Piece, cut, read_piece, read_stream, write_document, write_documents};
use super::{DocReport, Document, OfflineError, Options, str_at, template_pointer};

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
pub(super) const RUN_STACK: usize = 8 * 1024 * 1024;

/// Streams shorter than this are injected in the caller's thread: a thread costs more than it saves there.
pub(super) const SHARE_FROM: usize = 256 * 1024;

/// The pieces as `workers` runs of about equal text, in order; one run for a short stream or one worker.
pub(super) fn share_out<T>(
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
pub(super) fn renumber(index: &str, by: usize) -> String {
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
        .filter(|t| t.is_object())
        .ok_or_else(|| fail(format!("has no Pod template at {pointer}")))?;
    // The view is parsed from the document's own JSON, as the webhook parses the apiserver's: a Pod template has
    // a Pod's `metadata` and `spec` keys, so the same view, decision and patch apply to it.
    let text = pod_text(template);
    let view = PodView::parse(&text).map_err(|e| fail(format!("is not a valid {kind}: {e}")))?;

    // The patch is applied below: its values as trees, moved into the document.
    let outcome = inject_view_as(&view, &ns, config, Form::Apply);
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
            // The view was given the empty `metadata` a template may leave out (see `pod_text`), so the patch
            // adds under it: give the template that mapping too.
            if let Some(t) = template.as_object_mut()
                && lacks_metadata(t)
            {
                t.insert("metadata".into(), Value::Object(Default::default()));
            }
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

fn lacks_metadata(template: &Map<String, Value>) -> bool {
    !template.get("metadata").is_some_and(Value::is_object)
}

/// The JSON the view of a Pod or Pod template is parsed from. A template may leave out `metadata` (common in
/// Jobs and CronJobs): it stands for the empty mapping, which the text then has.
fn pod_text(template: &Value) -> String {
    match template.as_object() {
        Some(t) if lacks_metadata(t) => {
            let mut t: Map<String, Value> = t.clone();
            t.insert("metadata".into(), Value::Object(Map::new()));
            Value::Object(t).to_string()
        }
        _ => template.to_string(),
    }
}
