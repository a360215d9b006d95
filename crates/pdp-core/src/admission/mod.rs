//! `admission.k8s.io/v1` AdmissionReview in, AdmissionReview out: decoding, the core, encoding. No I/O, so the
//! webhook handler, the benchmarks and the tests all run exactly this.
//!
//! One parse path: the envelope is derived with borrowed strings and the object read as the core's
//! [`PodView`](crate::core::PodView) in the same pass, so the answer never depends on the order of the
//! request's keys and the object is scanned once (see [`review`]).

use std::collections::BTreeMap;

use base64::Engine;
use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::config::Config;
use crate::core::{
    Denial, NamespaceInfo, Outcome, PodView, Reason, Warning, inject_json, inject_view,
};

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
struct ReviewIn<'a, R> {
    #[serde(borrow, default)]
    api_version: Option<&'a str>,
    #[serde(borrow, default)]
    kind: Option<&'a str>,
    #[serde(default = "none")]
    request: Option<R>,
}

fn none<T>() -> Option<T> {
    None
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RequestIn<'a, O> {
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
    #[serde(default = "none")]
    object: Option<O>,
}

impl<O> RequestIn<'_, O> {
    fn head(&self) -> RequestHead<'_> {
        RequestHead {
            uid: &self.uid,
            namespace: self.namespace.clone().unwrap_or_default(),
            name: self.name.as_deref(),
            operation: self.operation.as_deref(),
            dry_run: self.dry_run,
        }
    }
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

/// Writes one small part of the answer (a string, the status, a string list or map) into its buffer.
fn put<T: Serialize + ?Sized>(bytes: &mut Vec<u8>, value: &T) {
    // Strings, numbers and string maps: writing them to memory cannot fail.
    serde_json::to_writer(bytes, value).expect("the answer's parts serialize");
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

impl Gvk<'_> {
    fn is_pod(&self) -> bool {
        self.group.is_empty() && self.version == "v1" && self.kind == "Pod"
    }
}

/// The request fields an answer needs, whichever path decoded them.
struct RequestHead<'a> {
    uid: &'a str,
    namespace: String,
    name: Option<&'a str>,
    operation: Option<&'a str>,
    dry_run: Option<bool>,
}

fn checked<R>(input: ReviewIn<'_, R>) -> Result<R, ReviewError> {
    match input.kind {
        Some("AdmissionReview") => {}
        other => return Err(ReviewError::WrongKind(other.unwrap_or("").to_string())),
    }
    match input.api_version {
        Some(API_VERSION) => {}
        other => return Err(ReviewError::WrongVersion(other.unwrap_or("").to_string())),
    }
    input.request.ok_or(ReviewError::MissingRequest)
}

const NOT_A_POD_CREATE: Outcome = Outcome::Skipped {
    reason: Reason::NotAPodCreate,
    warnings: vec![],
};

/// Decodes the envelope with the object as `O`: the core's view of a Pod, a slice of the body, or nothing.
fn decode<'a, O: Deserialize<'a>>(body: &'a [u8]) -> Result<RequestIn<'a, O>, ReviewError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ReviewError::Empty);
    }
    // One check of the whole body, then the parser reads text: `from_slice` checks again each string it borrows
    // and each slice it keeps raw (the env lists), which together cost more than this one pass.
    let text = match simdutf8::basic::from_utf8(body) {
        Ok(text) => text,
        // The fast check says only whether: std's says where, for the message.
        Err(_) => std::str::from_utf8(body)
            .map_err(|e| ReviewError::Malformed(format!("not UTF-8: {e}")))?,
    };
    let input: ReviewIn<'_, RequestIn<'_, O>> =
        crate::json::from_str(text).map_err(|e| ReviewError::Malformed(e.to_string()))?;
    let request = checked(input)?;
    if request.uid.is_empty() {
        return Err(ReviewError::MissingUid);
    }
    Ok(request)
}

impl<O> RequestIn<'_, O> {
    fn is_pod_create(&self) -> bool {
        self.kind.as_ref().is_some_and(Gvk::is_pod)
            && self.resource.as_ref().is_none_or(|r| r.resource == "pods")
            && self.sub_resource.is_none_or(str::is_empty)
            && self.operation.as_deref() == Some("CREATE")
    }
}

fn no_object() -> Outcome {
    Outcome::Denied(Denial {
        reason: Reason::InvalidObject,
        message: "the request carries no object".into(),
    })
}

/// Answers one AdmissionReview body. `namespace` turns a namespace name into what the core needs to know of it.
///
/// One pass: the envelope and, whatever the request, its object as the core's [`PodView`] (a few fields; the
/// rest of the object is skipped without allocating, and `oldObject` entirely), so the order of the keys never
/// matters. Only when that pass fails is the body decoded again, with the object as an unparsed slice, to tell
/// a request that is not a Pod CREATE (answered as usual) from a Pod whose fields are not of the Pod's shape
/// (denied with the parser's message); both passes read the object with the same type.
pub fn review(
    body: &[u8],
    config: &Config,
    namespace: &dyn Fn(&str) -> NamespaceInfo,
) -> Result<(Vec<u8>, ReviewSummary), ReviewError> {
    let request = match decode::<PodView<'_>>(body) {
        Ok(request) => request,
        Err(ReviewError::Malformed(_)) => {
            let request = decode::<&RawValue>(body)?;
            let head = request.head();
            let outcome = match request.object {
                _ if !request.is_pod_create() => NOT_A_POD_CREATE,
                Some(raw) => inject_json(raw.get(), &namespace(&head.namespace), config),
                None => no_object(),
            };
            return Ok(respond(&head, &outcome));
        }
        Err(e) => return Err(e),
    };
    let head = request.head();
    let outcome = match &request.object {
        _ if !request.is_pod_create() => NOT_A_POD_CREATE,
        Some(pod) => inject_view(pod, &namespace(&head.namespace), config),
        None => no_object(),
    };
    Ok(respond(&head, &outcome))
}

/// The first stage of [`review`] alone: the one-pass decode of the envelope with the object as the core's
/// [`PodView`]. For the benchmark tools (bench/), which time the stages one at a time.
pub fn decode_stage(body: &[u8]) -> Result<(), ReviewError> {
    decode::<PodView<'_>>(body).map(drop)
}

/// Whether `body` is an AdmissionReview of a Pod CREATE (the only request whose answer depends on its
/// namespace's labels); false for anything that does not decode.
pub fn is_pod_create(body: &[u8]) -> bool {
    decode::<IgnoredAny>(body).is_ok_and(|r| r.is_pod_create())
}

/// The last stage of [`review`] alone: the AdmissionReview answer for `outcome` (patch JSON, base64, envelope).
/// For the benchmark tools.
pub fn encode_stage(uid: &str, outcome: &Outcome) -> Vec<u8> {
    let head = RequestHead {
        uid,
        namespace: String::new(),
        name: None,
        operation: Some("CREATE"),
        dry_run: None,
    };
    respond(&head, outcome).0
}

/// Refuses the Pod CREATE in `body` with `denial`, whatever the core would decide: for what the webhook, not
/// the Pod, cannot answer (the namespace of a `Fail`-entry request could not be read). Any other request is
/// answered by [`review`] as usual, since refusing it would block more than the Pod in doubt.
pub fn refuse(
    body: &[u8],
    config: &Config,
    namespace: &dyn Fn(&str) -> NamespaceInfo,
    denial: Denial,
) -> Result<(Vec<u8>, ReviewSummary), ReviewError> {
    let request = decode::<IgnoredAny>(body)?;
    if !request.is_pod_create() {
        return review(body, config, namespace);
    }
    Ok(respond(&request.head(), &Outcome::Denied(denial)))
}

/// The response AdmissionReview and the summary for logs and metrics.
fn respond(request: &RequestHead<'_>, outcome: &Outcome) -> (Vec<u8>, ReviewSummary) {
    let mut summary = ReviewSummary {
        uid: request.uid.to_string(),
        namespace: request.namespace.clone(),
        name: request.name.unwrap_or_default().to_string(),
        operation: request.operation.unwrap_or_default().to_string(),
        decision: outcome.decision(),
        reason: outcome.reason(),
        dry_run: request.dry_run.unwrap_or(false),
        warnings: outcome.warnings().len(),
        patch_ops: 0,
    };
    let warnings: Vec<String> = outcome.warnings().iter().map(Warning::text).collect();
    let audit = BTreeMap::from([
        ("decision", outcome.decision()),
        ("reason", outcome.reason().code()),
    ]);
    let mut status = None;
    let patch = match outcome {
        Outcome::Injected(injected) => {
            summary.patch_ops = injected.patch.len();
            Some(&injected.patch)
        }
        Outcome::Skipped { .. } => None,
        Outcome::Denied(denial) => {
            // The Pod is fine and a retry may succeed: say so, as the apiserver's own errors do.
            let (code, reason) = match denial.reason {
                Reason::NamespaceUnreadable => (503, "ServiceUnavailable"),
                _ => (400, "BadRequest"),
            };
            status = Some(StatusOut {
                code,
                reason,
                message: denial.to_string(),
            });
            None
        }
    };
    // The answer is written in one buffer: the patch's JSON once, its base64 straight after the envelope's
    // head, and the small parts through serde (strings escaped as any JSON writer would).
    let patch_json = patch.map(|p| {
        let mut json = Vec::with_capacity(p.json_len());
        p.write_json(&mut json);
        json
    });
    let b64 = base64::engine::general_purpose::STANDARD;
    // The envelope's fixed parts fit in 256 bytes; the warnings and a denial's message are counted (unescaped:
    // a hint), so that the answer is not copied to a larger buffer halfway.
    let capacity = 256
        + patch_json.as_ref().map_or(0, |j| j.len() / 3 * 4 + 4)
        + warnings.iter().map(|w| w.len() + 3).sum::<usize>()
        + status.as_ref().map_or(0, |s| s.message.len() + 64);
    let mut bytes = Vec::with_capacity(capacity);
    bytes.extend_from_slice(br#"{"apiVersion":""#);
    bytes.extend_from_slice(API_VERSION.as_bytes());
    bytes.extend_from_slice(br#"","kind":"AdmissionReview","response":{"uid":"#);
    put(&mut bytes, request.uid);
    bytes.extend_from_slice(if status.is_none() {
        br#","allowed":true"#
    } else {
        br#","allowed":false"#
    });
    if let Some(status) = &status {
        bytes.extend_from_slice(br#","status":"#);
        put(&mut bytes, status);
    }
    if let Some(json) = &patch_json {
        bytes.extend_from_slice(br#","patch":""#);
        let start = bytes.len();
        bytes.resize(
            start + base64::encoded_len(json.len(), true).expect("a patch fits in memory"),
            0,
        );
        let written = b64
            .encode_slice(json, &mut bytes[start..])
            .expect("the buffer has the encoded length");
        bytes.truncate(start + written);
        bytes.extend_from_slice(br#"","patchType":"JSONPatch""#);
    }
    if !warnings.is_empty() {
        bytes.extend_from_slice(br#","warnings":"#);
        put(&mut bytes, &warnings);
    }
    bytes.extend_from_slice(br#","auditAnnotations":"#);
    put(&mut bytes, &audit);
    bytes.extend_from_slice(b"}}");
    (bytes, summary)
}
