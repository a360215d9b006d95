//! `admission.k8s.io/v1` AdmissionReview in, AdmissionReview out: decoding, the core, encoding. No I/O, so the
//! webhook handler, the benchmarks and the tests all run exactly this.
//!
//! The envelope is decoded with borrowed strings and the object as a raw slice; only a Pod CREATE pays for parsing
//! the Pod, straight into typed `k8s-openapi` structs (a generic JSON tree costs several times more).

use std::collections::BTreeMap;

use base64::Engine;
use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::config::Config;
use crate::decision::{Decision, NamespaceInfo, PodHead, Reason, decide};
use crate::inject::{Outcome, inject};

/// The only AdmissionReview version pdp-injector speaks (the MutatingWebhookConfiguration asks for it alone).
pub const API_VERSION: &str = "admission.k8s.io/v1";

/// Why a request body is not an AdmissionReview we can answer. Each maps to a 4xx, never a panic.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ReviewError {
    /// The body is empty.
    #[error("empty body: expected an admission.k8s.io/v1 AdmissionReview")]
    Empty,
    /// The body is not JSON, or not JSON of the AdmissionReview shape (including nesting past the parser's limit).
    #[error("body is not a JSON AdmissionReview: {0}")]
    Malformed(String),
    /// The JSON is some other kind of object.
    #[error("expected kind AdmissionReview, got {0:?}")]
    WrongKind(String),
    /// An AdmissionReview of another version.
    #[error("unsupported AdmissionReview version {0:?}: only admission.k8s.io/v1 is served")]
    WrongVersion(String),
    /// No `request` to answer.
    #[error("AdmissionReview has no request")]
    MissingRequest,
    /// A request without a `uid` cannot be answered.
    #[error("AdmissionReview request has no uid")]
    MissingUid,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReviewIn<'a> {
    #[serde(borrow, default)]
    api_version: Option<&'a str>,
    #[serde(borrow, default)]
    kind: Option<&'a str>,
    #[serde(borrow, default)]
    request: Option<RequestIn<'a>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RequestIn<'a> {
    #[serde(default)]
    uid: String,
    #[serde(borrow, default)]
    kind: Option<Gvk<'a>>,
    #[serde(borrow, default)]
    resource: Option<Gvr<'a>>,
    #[serde(borrow, default)]
    sub_resource: Option<&'a str>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    operation: Option<String>,
    #[serde(default)]
    dry_run: Option<bool>,
    #[serde(borrow, default)]
    object: Option<&'a RawValue>,
}

#[derive(Debug, Deserialize)]
struct Gvk<'a> {
    #[serde(borrow, default)]
    group: &'a str,
    #[serde(borrow, default)]
    version: &'a str,
    #[serde(borrow, default)]
    kind: &'a str,
}

#[derive(Debug, Deserialize)]
struct Gvr<'a> {
    #[serde(borrow, default)]
    resource: &'a str,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ReviewOut<'a> {
    api_version: &'static str,
    kind: &'static str,
    response: ResponseOut<'a>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ResponseOut<'a> {
    uid: &'a str,
    allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<StatusOut>,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch_type: Option<&'static str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    warnings: Vec<String>,
    audit_annotations: BTreeMap<&'static str, &'static str>,
}

#[derive(Debug, Serialize)]
struct StatusOut {
    code: u16,
    reason: &'static str,
    message: String,
}

/// What happened to one review, for the request's log line and metrics. Holds no Pod contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReviewSummary {
    /// The request's uid.
    pub uid: String,
    /// Namespace of the object.
    pub namespace: String,
    /// Name of the object (may be empty for `generateName` Pods).
    pub name: String,
    /// CREATE, UPDATE, ...
    pub operation: String,
    /// `inject`, `skip` or `deny`.
    pub decision: &'static str,
    /// The reason code.
    pub reason: Reason,
    /// Whether the apiserver asked for a dry run (the answer is identical: the webhook has no side effects).
    pub dry_run: bool,
    /// How many warnings were returned.
    pub warnings: usize,
    /// How many patch operations were returned.
    pub patch_ops: usize,
}

/// Answers one AdmissionReview body. `namespace` turns a namespace name into what the core needs to know of it.
pub fn review(
    body: &[u8],
    config: &Config,
    namespace: &dyn Fn(&str) -> NamespaceInfo,
) -> Result<(Vec<u8>, ReviewSummary), ReviewError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ReviewError::Empty);
    }
    let input: ReviewIn<'_> =
        serde_json::from_slice(body).map_err(|e| ReviewError::Malformed(e.to_string()))?;
    match input.kind {
        Some("AdmissionReview") => {}
        other => return Err(ReviewError::WrongKind(other.unwrap_or("").to_string())),
    }
    match input.api_version {
        Some(API_VERSION) => {}
        other => return Err(ReviewError::WrongVersion(other.unwrap_or("").to_string())),
    }
    let request = input.request.ok_or(ReviewError::MissingRequest)?;
    if request.uid.is_empty() {
        return Err(ReviewError::MissingUid);
    }

    let ns_name = request.namespace.clone().unwrap_or_default();
    let is_pod_create = request
        .kind
        .as_ref()
        .is_some_and(|k| k.group.is_empty() && k.version == "v1" && k.kind == "Pod")
        && request
            .resource
            .as_ref()
            .is_none_or(|r| r.resource == "pods")
        && request.sub_resource.is_none_or(str::is_empty)
        && request.operation.as_deref() == Some("CREATE");

    let outcome = if !is_pod_create {
        Outcome::Skipped {
            reason: Reason::NotAPodCreate,
            warnings: vec![],
        }
    } else {
        match request.object {
            Some(raw) => answer_pod(raw.get(), &namespace(&ns_name), config),
            None => invalid_object("the request carries no object".into()),
        }
    };

    let mut summary = ReviewSummary {
        uid: request.uid.clone(),
        namespace: ns_name,
        name: request.name.clone().unwrap_or_default(),
        operation: request.operation.clone().unwrap_or_default(),
        decision: outcome.decision(),
        reason: outcome.reason(),
        dry_run: request.dry_run.unwrap_or(false),
        warnings: outcome.warnings().len(),
        patch_ops: 0,
    };
    let mut response = ResponseOut {
        uid: &request.uid,
        allowed: true,
        status: None,
        patch: None,
        patch_type: None,
        warnings: outcome.warnings().iter().map(ToString::to_string).collect(),
        audit_annotations: BTreeMap::from([
            ("decision", outcome.decision()),
            ("reason", outcome.reason().code()),
        ]),
    };
    match &outcome {
        Outcome::Injected(injected) => {
            summary.patch_ops = injected.patch.0.len();
            let json = serde_json::to_vec(&injected.patch).expect("a JSON Patch serializes");
            response.patch = Some(base64::engine::general_purpose::STANDARD.encode(json));
            response.patch_type = Some("JSONPatch");
        }
        Outcome::Skipped { .. } => {}
        Outcome::Denied(denial) => {
            response.allowed = false;
            response.status = Some(StatusOut {
                code: 400,
                reason: "BadRequest",
                message: denial.to_string(),
            });
        }
    }
    let out = ReviewOut {
        api_version: API_VERSION,
        kind: "AdmissionReview",
        response,
    };
    let bytes = serde_json::to_vec(&out).expect("an AdmissionReview serializes");
    Ok((bytes, summary))
}

/// Decides from the Pod's head first; only a Pod that gets injected is parsed whole.
fn answer_pod(raw: &str, ns: &NamespaceInfo, config: &Config) -> Outcome {
    if let Ok(head) = serde_json::from_str::<PodHead>(raw) {
        match decide(&head.to_pod(), ns, config) {
            Decision::Skip(reason, warnings) => return Outcome::Skipped { reason, warnings },
            Decision::Deny(denial) => return Outcome::Denied(denial),
            Decision::Inject(_) => {}
        }
    }
    match serde_json::from_str::<Pod>(raw) {
        Ok(pod) => inject(&pod, ns, config),
        Err(e) => invalid_object(format!("the object is not a valid v1 Pod: {e}")),
    }
}

fn invalid_object(message: String) -> Outcome {
    Outcome::Denied(crate::decision::Denial {
        reason: Reason::InvalidObject,
        message,
    })
}
