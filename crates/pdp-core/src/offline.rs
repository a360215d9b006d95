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

/// Parses a stream into documents, sized so that large streams are not cut by the parser's defaults.
pub fn parse_stream(input: &str) -> Result<Vec<Value>, OfflineError> {
    // `0755` is octal, as kubectl reads it (file modes are written that way in manifests).
    let mut options = serde_saphyr::Options::default();
    options.legacy_octal_numbers = true;
    if let Some(budget) = options.budget.as_mut() {
        let scale = input.len() / 8 + 1;
        budget.max_documents = budget.max_documents.max(scale);
        budget.max_events = budget.max_events.max(scale * 4);
        budget.max_nodes = budget.max_nodes.max(scale * 2);
        budget.max_depth = 128;
    }
    let mut docs = serde_saphyr::from_multiple_with_options::<Value>(input, options)
        .map_err(|e| OfflineError::Yaml(e.to_string()))?;
    // An empty document (even a tagged one, which reads as null) is no object: dropping it keeps the output a
    // fixed point, as an explicit `null` document is already skipped when read.
    docs.retain(|d| !d.is_null());
    Ok(docs)
}

/// Writes documents back as a YAML stream.
pub fn write_stream(docs: &[Value]) -> String {
    let mut out = String::with_capacity(docs.len() * 1024);
    for doc in docs {
        out.push_str("---\n");
        // A JSON value always serializes to YAML.
        out.push_str(&serde_saphyr::to_string(doc).expect("JSON values serialize to YAML"));
        if !out.ends_with('\n') {
            out.push('\n');
        }
    }
    out
}

/// Injects every Pod template of a stream in place; Namespace documents of the stream define their namespaces.
pub fn inject_documents(
    docs: &mut [Value],
    config: &Config,
    options: &Options,
) -> Result<Vec<DocReport>, OfflineError> {
    let mut namespaces: HashMap<String, NamespaceInfo> = HashMap::new();
    for doc in docs.iter() {
        collect_namespaces(doc, &mut namespaces);
    }
    let mut reports = Vec::with_capacity(docs.len());
    for (i, doc) in docs.iter_mut().enumerate() {
        inject_document(
            doc,
            (i + 1).to_string(),
            config,
            options,
            &namespaces,
            &mut reports,
        )?;
    }
    Ok(reports)
}

/// Parses, injects and writes a whole stream.
pub fn inject_stream(
    input: &str,
    config: &Config,
    options: &Options,
) -> Result<(String, Vec<DocReport>), OfflineError> {
    let mut docs = parse_stream(input)?;
    let reports = inject_documents(&mut docs, config, options)?;
    Ok((write_stream(&docs), reports))
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
) -> Result<(), OfflineError> {
    let kind = str_at(doc, "/kind").to_string();
    let name = str_at(doc, "/metadata/name").to_string();
    if kind == "List" {
        if let Some(items) = doc.get_mut("items").and_then(Value::as_array_mut) {
            for (j, item) in items.iter_mut().enumerate() {
                inject_document(
                    item,
                    format!("{index}.{}", j + 1),
                    config,
                    options,
                    namespaces,
                    reports,
                )?;
            }
        }
        return Ok(());
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
        return Ok(());
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
    Ok(())
}
