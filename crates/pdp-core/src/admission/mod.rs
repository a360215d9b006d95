//! `admission.k8s.io/v1` AdmissionReview in, AdmissionReview out, as stages: [`decode`] once, the namespace
//! when [`Request::namespace_needed`] says the answer depends on it, [`Request::decide`] (decide and render),
//! [`Request::answer`] (encode). No I/O: the webhook runs these stages with its namespace policy, and
//! [`review`] runs them with a plain lookup for the benchmarks, the fuzzer and the tests.

use std::collections::BTreeMap;

use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::config::Config;
use crate::core::{
    Denial, NamespaceInfo, Outcome, PodView, Reason, Warning, inject_view, reads_namespace,
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

/// Decodes the envelope with the object as `O`: the core's view of a Pod or a slice of the body.
fn decode_as<'a, O: Deserialize<'a>>(body: &'a [u8]) -> Result<RequestIn<'a, O>, ReviewError> {
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

/// What a decoded request carries as its object, read once.
enum Object<'a> {
    /// The Pod of a Pod CREATE, as the core reads it.
    Pod(PodView<'a>),
    /// The object of a Pod CREATE is not of the Pod's shape: the parser's message.
    Invalid(String),
    /// No object, or a request that is not a Pod CREATE (its object is never read).
    Absent,
}

/// One AdmissionReview request, decoded once: the stages after [`decode`] ([`Request::namespace_needed`],
/// [`Request::decide`], [`Request::answer`]) read it and never the body again.
pub struct Request<'a> {
    uid: String,
    namespace: String,
    name: Option<String>,
    operation: Option<String>,
    dry_run: Option<bool>,
    pod_create: bool,
    object: Object<'a>,
}

/// Decodes one AdmissionReview body. One pass reads the envelope and, whatever the request, its object as the
/// core's [`PodView`] (the rest of the object is skipped without allocating, `oldObject` entirely), so the
/// order of the keys never matters. Only when that pass fails is the envelope read again with the object as an
/// unparsed slice, to tell a request that is not a Pod CREATE from a Pod not of the Pod's shape.
pub fn decode(body: &[u8]) -> Result<Request<'_>, ReviewError> {
    match decode_as::<PodView<'_>>(body) {
        Ok(mut request) => {
            let pod_create = request.is_pod_create();
            let object = match request.object.take() {
                Some(pod) if pod_create => Object::Pod(pod),
                _ => Object::Absent,
            };
            Ok(Request::new(request, pod_create, object))
        }
        Err(ReviewError::Malformed(_)) => {
            let mut request = decode_as::<&RawValue>(body)?;
            let pod_create = request.is_pod_create();
            let object = match request.object.take() {
                Some(raw) if pod_create => match PodView::parse(raw.get()) {
                    Ok(pod) => Object::Pod(pod),
                    Err(e) => Object::Invalid(e.to_string()),
                },
                _ => Object::Absent,
            };
            Ok(Request::new(request, pod_create, object))
        }
        Err(e) => Err(e),
    }
}

impl<'a> Request<'a> {
    fn new<O>(request: RequestIn<'_, O>, pod_create: bool, object: Object<'a>) -> Request<'a> {
        Request {
            uid: request.uid,
            namespace: request.namespace.unwrap_or_default(),
            name: request.name,
            operation: request.operation,
            dry_run: request.dry_run,
            pod_create,
            object,
        }
    }

    /// The namespace whose labels the answer depends on; `None` when no label can change it (not a Pod
    /// CREATE, no Pod or not of the Pod's shape, a namespace excluded by name, a mirror Pod).
    pub fn namespace_needed(&self, config: &Config) -> Option<&str> {
        match &self.object {
            Object::Pod(pod) if reads_namespace(pod, &self.namespace, config) => {
                Some(&self.namespace)
            }
            _ => None,
        }
    }

    /// Decides and renders. `namespace` is what is known of the request's namespace; `None` reads it as an
    /// unlabelled namespace of that name (what a request that does not need it, or an offline run, uses).
    pub fn decide(&self, config: &Config, namespace: Option<&NamespaceInfo>) -> Outcome {
        if !self.pod_create {
            return NOT_A_POD_CREATE;
        }
        match &self.object {
            Object::Pod(pod) => match namespace {
                Some(ns) => inject_view(pod, ns, config),
                None => inject_view(pod, &NamespaceInfo::named(&self.namespace), config),
            },
            Object::Invalid(message) => Outcome::Denied(Denial::invalid_object(message)),
            Object::Absent => no_object(),
        }
    }

    /// The response AdmissionReview for `outcome`, and the summary for logs and metrics.
    pub fn answer(&self, outcome: &Outcome) -> (Vec<u8>, ReviewSummary) {
        let head = RequestHead {
            uid: &self.uid,
            namespace: self.namespace.clone(),
            name: self.name.as_deref(),
            operation: self.operation.as_deref(),
            dry_run: self.dry_run,
        };
        respond(&head, outcome)
    }
}

/// Answers one AdmissionReview body: [`decode`], the namespace through `namespace` when the answer depends on
/// it, [`Request::decide`], [`Request::answer`]. The webhook runs the same stages with its own namespace policy.
pub fn review(
    body: &[u8],
    config: &Config,
    namespace: &dyn Fn(&str) -> NamespaceInfo,
) -> Result<(Vec<u8>, ReviewSummary), ReviewError> {
    let request = decode(body)?;
    let known = request.namespace_needed(config).map(namespace);
    Ok(request.answer(&request.decide(config, known.as_ref())))
}

/// The AdmissionReview answer for `outcome` to a request of `uid` (patch JSON, base64, envelope), without a
/// request: for the benchmark tools, which time the stages one at a time.
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
