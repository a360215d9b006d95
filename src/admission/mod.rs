//! `admission.k8s.io/v1` AdmissionReview in, AdmissionReview out: decoding, the core, encoding. No I/O, so the
//! webhook handler, the benchmarks and the tests all run exactly this.
//!
//! One pass over the body: the envelope is decoded with borrowed strings and, for a Pod CREATE, the Pod straight
//! into the typed sections that deciding and rendering read ([`LitePod`]); everything else in the object, and
//! the whole object of any other request, is skipped without allocating. (A generic JSON tree costs several
//! times more; the whole typed Pod about four times the scan.) The request's fields come in the apiserver's
//! order (`kind` and `operation` before `object`); a body in another order, a Pod the fast path cannot answer
//! exactly, and every malformed body go through [`review_reference`], which parses the Pod whole, so both
//! paths give byte-identical answers (tests/properties.rs checks it).

use std::collections::BTreeMap;

use base64::Engine;
use k8s_openapi::api::core::v1::Pod;
use serde::de::{self, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;

use crate::config::Config;
use crate::core::decide::PodHead;
use crate::core::{Decision, Denial, NamespaceInfo, Outcome, Reason, decide, inject, wire};
use lite::{LitePod, lite_patch_is_exact};

pub mod lite;

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

impl RequestIn<'_> {
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

/// What the one-pass decoder did with `request.object`.
#[derive(Debug, Default)]
enum Object<'a> {
    /// No `object` field.
    #[default]
    Absent,
    /// Not needed: the request is known not to be a Pod CREATE.
    Skipped,
    /// A Pod CREATE: the sections deciding and rendering read.
    Lite(Box<LitePod<'a>>),
    /// The fields that say what the request is came after the object: kept as a slice.
    Raw(&'a RawValue),
}

/// The request as the one-pass decoder reads it.
#[derive(Debug, Default)]
struct FastRequest<'a> {
    uid: String,
    kind: Option<Gvk<'a>>,
    resource: Option<Gvr<'a>>,
    sub_resource: Option<&'a str>,
    name: Option<String>,
    namespace: Option<String>,
    operation: Option<String>,
    dry_run: Option<bool>,
    object: Object<'a>,
}

#[derive(Clone, Copy, Deserialize)]
#[serde(field_identifier, rename_all = "camelCase")]
enum Field {
    Uid,
    Kind,
    Resource,
    SubResource,
    Name,
    Namespace,
    Operation,
    DryRun,
    Object,
    #[serde(other)]
    Other,
}

impl FastRequest<'_> {
    /// Known from the fields read so far to be something other than a Pod CREATE.
    fn surely_not_a_pod_create(&self) -> bool {
        self.operation.as_deref().is_some_and(|op| op != "CREATE")
            || self.kind.as_ref().is_some_and(|k| !k.is_pod())
            || self.resource.as_ref().is_some_and(|r| r.resource != "pods")
            || self.sub_resource.is_some_and(|s| !s.is_empty())
    }

    /// Known from the fields read so far to be a Pod CREATE (`resource` and `subResource` are checked again at
    /// the end, whatever their position).
    fn likely_a_pod_create(&self) -> bool {
        self.operation.as_deref() == Some("CREATE") && self.kind.as_ref().is_some_and(Gvk::is_pod)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for FastRequest<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct RequestVisitor<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for RequestVisitor<'a> {
            type Value = FastRequest<'a>;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an AdmissionRequest object")
            }

            fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Self::Value, M::Error> {
                let mut r = FastRequest::default();
                let mut seen = [false; 9];
                while let Some(field) = map.next_key::<Field>()? {
                    if !matches!(field, Field::Other) {
                        let i = field as usize;
                        if std::mem::replace(&mut seen[i], true) {
                            return Err(de::Error::custom("duplicate field in the request"));
                        }
                    }
                    match field {
                        Field::Uid => {
                            r.uid = map.next_value::<Option<String>>()?.unwrap_or_default()
                        }
                        Field::Kind => r.kind = map.next_value()?,
                        Field::Resource => r.resource = map.next_value()?,
                        Field::SubResource => r.sub_resource = map.next_value()?,
                        Field::Name => r.name = map.next_value()?,
                        Field::Namespace => r.namespace = map.next_value()?,
                        Field::Operation => r.operation = map.next_value()?,
                        Field::DryRun => r.dry_run = map.next_value()?,
                        Field::Object => {
                            r.object = if r.surely_not_a_pod_create() {
                                map.next_value::<IgnoredAny>()?;
                                Object::Skipped
                            } else if r.likely_a_pod_create() {
                                Object::Lite(map.next_value()?)
                            } else {
                                Object::Raw(map.next_value()?)
                            }
                        }
                        Field::Other => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(r)
            }
        }
        deserializer.deserialize_map(RequestVisitor(std::marker::PhantomData))
    }
}

impl Gvk<'_> {
    fn is_pod(&self) -> bool {
        self.group.is_empty() && self.version == "v1" && self.kind == "Pod"
    }
}

/// The names of the variables a profile injects (none for an unknown profile, which rendering refuses).
fn injected_env<'c>(config: &'c Config, profile: &str) -> Vec<&'c str> {
    let Some(p) = config.profiles.get(profile) else {
        return Vec::new();
    };
    let n = &p.env_names;
    let mut names = vec![n.host.as_str(), n.address.as_str(), n.socket.as_str()];
    names.extend(n.port.as_deref());
    // The profile's fixed variables are injected like the others: an app that defines one keeps its value.
    names.extend(p.app_env.iter().map(|e| e.name.as_str()));
    names
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

fn is_pod_create(
    kind: Option<&Gvk<'_>>,
    resource: Option<&Gvr<'_>>,
    sub_resource: Option<&str>,
    operation: Option<&str>,
) -> bool {
    kind.is_some_and(Gvk::is_pod)
        && resource.is_none_or(|r| r.resource == "pods")
        && sub_resource.is_none_or(str::is_empty)
        && operation == Some("CREATE")
}

const NOT_A_POD_CREATE: Outcome = Outcome::Skipped {
    reason: Reason::NotAPodCreate,
    warnings: vec![],
};

/// Answers one AdmissionReview body. `namespace` turns a namespace name into what the core needs to know of it.
///
/// One pass decodes the envelope and the parts of the Pod that are read; see the module documentation for when
/// [`review_reference`] answers instead.
pub fn review(
    body: &[u8],
    config: &Config,
    namespace: &dyn Fn(&str) -> NamespaceInfo,
) -> Result<(Vec<u8>, ReviewSummary), ReviewError> {
    let Ok(input) = serde_json::from_slice::<ReviewIn<'_, FastRequest<'_>>>(body) else {
        // Malformed in some way: the reference path finds out exactly how.
        return review_reference(body, config, namespace);
    };
    let request = match checked(input) {
        Ok(r) if !r.uid.is_empty() => r,
        _ => return review_reference(body, config, namespace),
    };
    let head = RequestHead {
        uid: &request.uid,
        namespace: request.namespace.clone().unwrap_or_default(),
        name: request.name.as_deref(),
        operation: request.operation.as_deref(),
        dry_run: request.dry_run,
    };
    let pod_create = is_pod_create(
        request.kind.as_ref(),
        request.resource.as_ref(),
        request.sub_resource,
        head.operation,
    );
    let outcome = match request.object {
        _ if !pod_create => NOT_A_POD_CREATE,
        Object::Absent | Object::Skipped => invalid_object("the request carries no object".into()),
        Object::Raw(raw) => answer_pod(raw.get(), &namespace(&head.namespace), config),
        Object::Lite(lite) => {
            let (pod, envs) = lite.into_pod();
            let ns = namespace(&head.namespace);
            match decide(&pod, &ns, config) {
                Decision::Skip(reason, warnings) => Outcome::Skipped { reason, warnings },
                Decision::Deny(denial) => Outcome::Denied(denial),
                Decision::Inject(plan) => {
                    // A comma list of profiles renders more than this profile's variables: whole-Pod path.
                    let several = pod
                        .metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(crate::names::ANNOTATION_PROFILE))
                        .is_some_and(|v| v.contains(','));
                    if several || !envs.render_exactly(&injected_env(config, &plan.profile)) {
                        return review_reference(body, config, namespace);
                    }
                    let outcome = wire(&pod, *plan, config);
                    if let Outcome::Injected(done) = &outcome
                        && !lite_patch_is_exact(&done.patch)
                    {
                        return review_reference(body, config, namespace);
                    }
                    outcome
                }
            }
        }
    };
    Ok(respond(&head, &outcome))
}

/// Answers one AdmissionReview body by parsing the envelope with the object as a raw slice, deciding from the
/// Pod's head and parsing the Pod whole to inject it. Slower than [`review`] and the reference it is checked
/// against; it answers whatever the one-pass decoder cannot.
pub fn review_reference(
    body: &[u8],
    config: &Config,
    namespace: &dyn Fn(&str) -> NamespaceInfo,
) -> Result<(Vec<u8>, ReviewSummary), ReviewError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ReviewError::Empty);
    }
    let input: ReviewIn<'_, RequestIn<'_>> =
        serde_json::from_slice(body).map_err(|e| ReviewError::Malformed(e.to_string()))?;
    let request = checked(input)?;
    if request.uid.is_empty() {
        return Err(ReviewError::MissingUid);
    }
    let head = request.head();
    let outcome = if !is_pod_create(
        request.kind.as_ref(),
        request.resource.as_ref(),
        request.sub_resource,
        head.operation,
    ) {
        NOT_A_POD_CREATE
    } else {
        match request.object {
            Some(raw) => answer_pod(raw.get(), &namespace(&head.namespace), config),
            None => invalid_object("the request carries no object".into()),
        }
    };
    Ok(respond(&head, &outcome))
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
    let input: ReviewIn<'_, RequestIn<'_>> =
        serde_json::from_slice(body).map_err(|e| ReviewError::Malformed(e.to_string()))?;
    let request = checked(input)?;
    let pod_create = is_pod_create(
        request.kind.as_ref(),
        request.resource.as_ref(),
        request.sub_resource,
        request.operation.as_deref(),
    );
    if request.uid.is_empty() || !pod_create {
        return review(body, config, namespace);
    }
    let head = request.head();
    Ok(respond(&head, &Outcome::Denied(denial)))
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
    let mut response = ResponseOut {
        uid: request.uid,
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
    match outcome {
        Outcome::Injected(injected) => {
            summary.patch_ops = injected.patch.0.len();
            let json = serde_json::to_vec(&injected.patch).expect("a JSON Patch serializes");
            response.patch = Some(base64::engine::general_purpose::STANDARD.encode(json));
            response.patch_type = Some("JSONPatch");
        }
        Outcome::Skipped { .. } => {}
        Outcome::Denied(denial) => {
            response.allowed = false;
            // The Pod is fine and a retry may succeed: say so, as the apiserver's own errors do.
            let (code, reason) = match denial.reason {
                Reason::NamespaceUnreadable => (503, "ServiceUnavailable"),
                _ => (400, "BadRequest"),
            };
            response.status = Some(StatusOut {
                code,
                reason,
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
    (bytes, summary)
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
    Outcome::Denied(Denial {
        reason: Reason::InvalidObject,
        message,
    })
}
