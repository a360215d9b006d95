//! Offline injection of a multi-document YAML stream (`pdp-injector inject -f`): the same core as the webhook,
//! applied to the Pod template of each workload, for GitOps pipelines and for reviewing what the webhook would do.

mod inject;
mod stream;

use serde_json::Value;

use crate::core::{Reason, Warning};

pub use inject::{inject_documents, inject_stream};
pub use stream::{parse_stream, read_stream, write_stream};

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

#[cfg(test)]
mod tests;
