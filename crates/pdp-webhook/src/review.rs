//! The admission path of the webhook: one request from its first byte to its answer. Bounds are taken before
//! anything is read, the body is read within its budget, and [`review`] runs each stage once: decode, the
//! namespace by one policy ([`resolve`]), decide and render, encode. Every error answer is an [`ApiError`],
//! counted once where it is turned into a response.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, Version, header};
use axum::response::{IntoResponse, Response};
use tracing::{Instrument, Span, error, info, info_span, warn};

use super::metrics::{ErrorKind, Metrics};
use crate::state::AppState;
use pdp_cluster::namespaces::NamespaceSource;
use pdp_core::admission;
use pdp_core::config::Config;
use pdp_core::core::{Denial, NamespaceInfo, Outcome};
use pdp_core::duration::parse_duration;

/// What a review gives: the AdmissionReview answer's bytes and what to log.
type Answered = (Vec<u8>, admission::ReviewSummary);

/// An error answer: its status and its metric come from its kind. [`AppState::refuse`] is the one place that
/// counts it and renders it.
#[derive(Debug)]
pub(super) struct ApiError {
    kind: ErrorKind,
    message: String,
}

impl ApiError {
    fn new(kind: ErrorKind, message: impl Into<String>) -> ApiError {
        ApiError {
            kind,
            message: message.into(),
        }
    }

    fn overloaded(message: &str) -> ApiError {
        ApiError::new(ErrorKind::Overloaded, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        json_error(self.kind.status(), &self.message)
    }
}

impl AppState {
    /// The answer for an error, counted in the metrics once.
    fn refuse(&self, e: ApiError) -> Response {
        self.metrics.error(e.kind);
        e.into_response()
    }
}

/// A JSON error body, `{"error": ..., "code": ...}`.
pub(super) fn json_error(status: StatusCode, message: &str) -> Response {
    let body = serde_json::json!({"error": message, "code": status.as_u16()});
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn query_timeout(uri: &Uri) -> Option<Duration> {
    uri.query()?
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == "timeout")
        .and_then(|(_, v)| parse_duration(v))
}

fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"))
}

struct InFlight<'a>(&'a Metrics);
impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight(-1);
    }
}

enum BodyError {
    TooLarge,
    OverBudget,
    Read(axum::Error),
}

/// Reads a body within the size limit and the shared byte budget. A declared length is reserved before the
/// first byte is read, so a body that cannot fit is refused at once; a body without one reserves as it arrives.
async fn read_body(
    state: &AppState,
    body: &mut Body,
    declared: Option<usize>,
) -> Result<(Vec<u8>, Option<tokio::sync::OwnedSemaphorePermit>), BodyError> {
    use http_body_util::BodyExt;
    let reserve = |n: usize| {
        let n = u32::try_from(n).map_err(|_| BodyError::TooLarge)?;
        state
            .body_budget
            .clone()
            .try_acquire_many_owned(n)
            .map_err(|_| BodyError::OverBudget)
    };
    let mut held = match declared {
        Some(n) if n > state.body_limit => return Err(BodyError::TooLarge),
        Some(n) => Some(reserve(n)?),
        None => None,
    };
    let mut reserved = declared.unwrap_or(0);
    let mut buf = Vec::with_capacity(reserved);
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(BodyError::Read)?.into_data() else {
            continue;
        };
        let len = buf.len() + data.len();
        if len > state.body_limit {
            return Err(BodyError::TooLarge);
        }
        if len > reserved {
            let more = reserve(len - reserved)?;
            match &mut held {
                Some(h) => h.merge(more),
                None => held = Some(more),
            }
            reserved = len;
        }
        buf.extend_from_slice(&data);
    }
    Ok((buf, held))
}

/// The path of the webhook entry for namespaces labelled to opt in (`failurePolicy: Fail`): the apiserver
/// matched the namespace's label, so the handler knows the Pod must not be let through from doubt.
pub const OPTED_IN_PATH: &str = "/mutate/opted-in";

/// Which webhook entry of the MutatingWebhookConfiguration sent a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    /// `pods.pdp-injector.io` (`/mutate`): any namespace; the Pod's own annotation or label decides.
    Pods,
    /// `namespaces.pdp-injector.io` ([`OPTED_IN_PATH`]): the apiserver saw the namespace opted in.
    OptedIn,
}

pub(super) async fn mutate_pods(state: State<Arc<AppState>>, request: Request) -> Response {
    mutate(state, Entry::Pods, request).await
}

pub(super) async fn mutate_opted_in(state: State<Arc<AppState>>, request: Request) -> Response {
    mutate(state, Entry::OptedIn, request).await
}

async fn mutate(State(state): State<Arc<AppState>>, entry: Entry, request: Request) -> Response {
    // Check the bound before reading anything: under a flood, refusing costs no body buffering.
    let Ok(_reader) = state.readers.clone().try_acquire_owned() else {
        return state.refuse(ApiError::overloaded(
            "too many admission requests in flight; retry",
        ));
    };
    state.metrics.in_flight(1);
    let _in_flight = InFlight(&state.metrics);
    let started = Instant::now();
    let span = admission_span();
    let http1 = request.version() < Version::HTTP_2;
    let deadline = query_timeout(request.uri())
        .map(|t| t.min(state.request_timeout))
        .unwrap_or(state.request_timeout);
    let mut response = match tokio::time::timeout(deadline, answer(&state, entry, request))
        .instrument(span.clone())
        .await
    {
        Ok(Ok(response)) => response,
        Ok(Err(e)) => state.refuse(e),
        Err(_) => {
            let _entered = span.enter();
            warn!(?deadline, "request did not complete within its deadline");
            state.refuse(ApiError::new(ErrorKind::Timeout, "request timed out"))
        }
    };
    state
        .metrics
        .observe(started.elapsed(), response.status() == StatusCode::OK);
    if http1 && state.shutting_down.load(Ordering::Relaxed) {
        // Draining: the client closes this connection after the answer, rather than racing our close of an
        // idle keep-alive connection with its next POST (which it would not retry). HTTP/2 gets GOAWAY instead.
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

async fn answer(state: &AppState, entry: Entry, request: Request) -> Result<Response, ApiError> {
    let (body, body_budget) = receive(state, request).await?;
    // The review itself holds a permit; a request whose body is still arriving does not.
    let permit = state
        .permits
        .clone()
        .try_acquire_owned()
        .map_err(|_| ApiError::overloaded("too many admission requests in flight; retry"))?;
    let config = state.config();
    let body = Arc::new(body);
    let held = Arc::new((permit, body_budget));
    let answered = off_thread(state, entry, &held, &body, &config).await?;
    // The review is over: its permit and its body's budget go back (the answer counts on its own below).
    drop(held);
    review_response(state, answered)
}

/// The request's body, read within the size limit and the memory budget, with the budget it holds.
async fn receive(
    state: &AppState,
    request: Request,
) -> Result<(Vec<u8>, Option<tokio::sync::OwnedSemaphorePermit>), ApiError> {
    if !is_json(request.headers()) {
        return Err(ApiError::new(
            ErrorKind::UnsupportedMediaType,
            "content type must be application/json",
        ));
    }
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    let mut incoming = request.into_body();
    // The body's bytes stay accounted in the shared budget until the review ends (`held` in `answer`).
    let read = read_body(state, &mut incoming, declared).await;
    if read.is_err() {
        // A client still sending a body we refused must get the answer, not a reset stream (HTTP/2: curl and Go's
        // net/http in the apiserver report a stream error) nor a connection closed under it (HTTP/1.1: a client
        // that writes its whole body before reading, as Python's urllib does, sees an EOF instead of the 413):
        // read the rest and throw it away in the background, bounded in time and bytes. No byte of it is kept.
        let (deadline, most) = (state.request_timeout, state.body_limit.saturating_mul(2));
        tokio::spawn(async move {
            use http_body_util::BodyExt;
            let _ = tokio::time::timeout(deadline, async {
                let mut thrown = 0usize;
                while let Some(Ok(frame)) = incoming.frame().await {
                    thrown += frame.data_ref().map_or(0, |d| d.len());
                    if thrown > most {
                        break;
                    }
                }
            })
            .await;
        });
    }
    read.map_err(|e| match e {
        BodyError::TooLarge => {
            ApiError::new(ErrorKind::PayloadTooLarge, "body exceeds the size limit")
        }
        BodyError::OverBudget => {
            ApiError::overloaded("the memory budget for request bodies is in use; retry")
        }
        BodyError::Read(e) => {
            ApiError::new(ErrorKind::BadRequest, format!("cannot read body: {e}"))
        }
    })
}

/// One review, each stage once: decode, the namespace when the answer depends on it ([`resolve`]), decide and
/// render, encode.
async fn review(
    namespaces: &dyn NamespaceSource,
    entry: Entry,
    body: &[u8],
    config: &Config,
) -> Result<Answered, ApiError> {
    let request = admission::decode(body).map_err(|e| {
        warn!(error = %e, "bad admission request");
        ApiError::new(ErrorKind::BadRequest, e.to_string())
    })?;
    let outcome = match request.namespace_needed(config) {
        None => request.decide(config, None),
        Some(name) => match resolve(namespaces, entry, name).await? {
            Namespace::Known(info) => request.decide(config, Some(&info)),
            Namespace::Refused(denial) => Outcome::Denied(denial),
        },
    };
    Ok(request.answer(&outcome))
}

/// What [`resolve`] settles of a namespace.
enum Namespace {
    Known(NamespaceInfo),
    /// The namespace could not be read for an opted-in entry's Pod: the Pod is refused.
    Refused(Denial),
}

/// The namespace-doubt policy, for a request whose answer depends on its namespace's labels. The watch's cache
/// answers when it can vouch (it knows the namespace, and shows the opt-in label when the apiserver matched
/// one); otherwise the apiserver is asked once. When it cannot be read, never a guessed skip: the opted-in
/// entry refuses the Pod (`namespace_unreadable`), and the generic entry answers an HTTP error so that its
/// failure policy decides (`Ignore` admits as before, `Fail` refuses).
async fn resolve(
    namespaces: &dyn NamespaceSource,
    entry: Entry,
    name: &str,
) -> Result<Namespace, ApiError> {
    match namespaces.lookup(name) {
        Some(info) if entry == Entry::Pods || info.opted_in() => return Ok(Namespace::Known(info)),
        _ => {}
    }
    let why = match namespaces.fetch(name).await {
        Ok(Some(info)) => return Ok(Namespace::Known(info)),
        Ok(None) => "it does not exist".to_string(),
        Err(e) => e,
    };
    if entry == Entry::Pods {
        let denial = Denial::namespace_doubt(name, &why);
        error!(namespace = %name, reason = denial.reason.code(), "{}", denial.message);
        return Err(ApiError::new(
            ErrorKind::NamespaceUnreadable,
            denial.to_string(),
        ));
    }
    let denial = Denial::namespace_unreadable(name, &why);
    error!(namespace = %name, reason = denial.reason.code(), "{}", denial.message);
    Ok(Namespace::Refused(denial))
}

/// The answer to a review, with its log line and metrics.
fn review_response(state: &AppState, (bytes, summary): Answered) -> Result<Response, ApiError> {
    state.metrics.review(summary.reason);
    record_summary(&Span::current(), &summary);
    info!(
        dry_run = summary.dry_run,
        patch_ops = summary.patch_ops,
        warnings = summary.warnings,
        "admission review answered"
    );
    // The answer stays in memory until the client has read it: it counts in the same budget as bodies.
    let counted = u32::try_from(bytes.len())
        .map_err(drop)
        .and_then(|n| {
            state
                .body_budget
                .clone()
                .try_acquire_many_owned(n)
                .map_err(drop)
        })
        .map_err(|()| {
            ApiError::overloaded("the memory budget for requests and answers is in use; retry")
        })?;
    Ok((
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        counted_body(bytes, counted),
    )
        .into_response())
}

/// The span of one admission request; [`record_summary`] fills its fields once the review is answered.
pub fn admission_span() -> Span {
    info_span!(
        "admission",
        uid = tracing::field::Empty,
        namespace = tracing::field::Empty,
        pod = tracing::field::Empty,
        operation = tracing::field::Empty,
        decision = tracing::field::Empty,
        reason = tracing::field::Empty,
    )
}

/// Records the review's six fields on the `admission` span in one call: one `on_record` of the subscriber instead
/// of six (BENCHMARKS.md, "Per-request costs outside the core").
pub fn record_summary(span: &Span, summary: &admission::ReviewSummary) {
    let Some(meta) = span.metadata() else {
        return;
    };
    let fields = meta.fields();
    let field = |name| fields.field(name);
    let (Some(uid), Some(namespace), Some(pod), Some(operation), Some(decision), Some(reason)) = (
        field("uid"),
        field("namespace"),
        field("pod"),
        field("operation"),
        field("decision"),
        field("reason"),
    ) else {
        return;
    };
    let reason_code = summary.reason.code();
    span.record_all(&fields.value_set(&[
        (&uid, Some(&summary.uid.as_str() as &dyn tracing::Value)),
        (
            &namespace,
            Some(&summary.namespace.as_str() as &dyn tracing::Value),
        ),
        (&pod, Some(&summary.name.as_str() as &dyn tracing::Value)),
        (
            &operation,
            Some(&summary.operation.as_str() as &dyn tracing::Value),
        ),
        (&decision, Some(&summary.decision as &dyn tracing::Value)),
        (&reason, Some(&reason_code as &dyn tracing::Value)),
    ]));
}

/// Bodies up to this size are reviewed on the async worker that read them, saving the hand-off to the blocking
/// pool (BENCHMARKS.md, "Measured choices"); even the slowest review per KiB holds a worker
/// under a millisecond at this size. A larger body could run to the deadline: only on the pool is a 504 on time.
const INLINE_REVIEW_BYTES: usize = 128 * 1024;

/// Keeps a review's memory in the process from one request to the next: freeing one mapped block of twice the
/// inline bound raises glibc's mmap and trim thresholds (mallopt(3), "dynamic mmap threshold"), so freed bodies
/// are not given back and faulted in again (BENCHMARKS.md, "Measured choices"; tunables win).
pub fn keep_review_memory() {
    drop(std::hint::black_box(vec![0u8; 2 * INLINE_REVIEW_BYTES]));
}

/// Runs the [`review`] of the request's body. A larger body goes to the blocking pool: a review's cost grows with
/// the Pod, and on an async worker the request's deadline could not cut it off (the 504 waits for it) nor could
/// other requests run meanwhile. `held` (the review's permit and the body's budget) is kept until the review
/// ends, also when the deadline answered first, so the in-flight bound and the memory budget still count what
/// runs. A review that panicked (a bug) answers a 500, inline or not.
async fn off_thread<H: Send + Sync + 'static>(
    state: &AppState,
    entry: Entry,
    held: &Arc<H>,
    body: &Arc<Vec<u8>>,
    config: &Arc<Config>,
) -> Result<Answered, ApiError> {
    use futures_util::FutureExt;
    if body.len() <= INLINE_REVIEW_BYTES {
        let run = std::panic::AssertUnwindSafe(review(&*state.namespaces, entry, body, config));
        return run
            .catch_unwind()
            .await
            .unwrap_or_else(|_| Err(review_failed()));
    }
    let (held, body, config) = (held.clone(), body.clone(), config.clone());
    let namespaces = state.namespaces.clone();
    // The pool's thread runs the review to its end, the namespace's fetch included when it needs one.
    let runtime = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || {
        let _held = held;
        runtime.block_on(review(&*namespaces, entry, &body, &config))
    })
    .await
    .unwrap_or_else(|_| Err(review_failed()))
}

fn review_failed() -> ApiError {
    error!("the review failed (a bug: see the panic above)");
    ApiError::new(ErrorKind::Internal, "the review failed")
}

/// An answer's bytes with their share of the memory budget, given back when the server is done with the body.
fn counted_body(bytes: Vec<u8>, counted: tokio::sync::OwnedSemaphorePermit) -> Body {
    Body::new(Counted {
        bytes: http_body_util::Full::new(axum::body::Bytes::from(bytes)),
        _counted: counted,
    })
}

/// A whole answer that holds its budget permit. It says its exact size (and that it has ended), so hyper sends
/// it with a `Content-Length` in one write: a body of unknown size is sent chunked, which costs a chunk header, a
/// terminator and, when its end comes in a later poll, another TLS record and write.
struct Counted {
    bytes: http_body_util::Full<axum::body::Bytes>,
    _counted: tokio::sync::OwnedSemaphorePermit,
}

impl http_body::Body for Counted {
    type Data = axum::body::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.bytes).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.bytes.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.bytes.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeout_comes_from_the_query() {
        let uri: Uri = "/mutate?timeout=3s".parse().unwrap();
        assert_eq!(query_timeout(&uri), Some(Duration::from_secs(3)));
        let uri: Uri = "/mutate".parse().unwrap();
        assert_eq!(query_timeout(&uri), None);
    }

    #[test]
    fn every_error_kind_has_its_status() {
        for (kind, status) in [
            (ErrorKind::BadRequest, 400),
            (ErrorKind::PayloadTooLarge, 413),
            (ErrorKind::UnsupportedMediaType, 415),
            (ErrorKind::Overloaded, 503),
            (ErrorKind::Timeout, 504),
            (ErrorKind::NamespaceUnreadable, 503),
            (ErrorKind::Internal, 500),
        ] {
            let response = ApiError::new(kind, "x").into_response();
            assert_eq!(response.status().as_u16(), status, "{kind:?}");
        }
    }
}
