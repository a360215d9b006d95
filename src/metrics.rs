//! Prometheus metrics in the text exposition format, kept in atomics so that recording costs a few
//! nanoseconds on the request path and nothing allocates.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use crate::decision::Reason;

/// Kinds of request the webhook could not answer with an AdmissionReview.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// 400: not an AdmissionReview we can answer.
    BadRequest,
    /// 413: body over the limit.
    PayloadTooLarge,
    /// 415: not JSON.
    UnsupportedMediaType,
    /// 503: concurrency bound reached, or shutting down.
    Overloaded,
    /// 504: the request did not complete within its deadline.
    Timeout,
}

impl ErrorKind {
    const ALL: [ErrorKind; 5] = [
        ErrorKind::BadRequest,
        ErrorKind::PayloadTooLarge,
        ErrorKind::UnsupportedMediaType,
        ErrorKind::Overloaded,
        ErrorKind::Timeout,
    ];

    /// Label value.
    pub fn code(self) -> &'static str {
        match self {
            ErrorKind::BadRequest => "bad_request",
            ErrorKind::PayloadTooLarge => "payload_too_large",
            ErrorKind::UnsupportedMediaType => "unsupported_media_type",
            ErrorKind::Overloaded => "overloaded",
            ErrorKind::Timeout => "timeout",
        }
    }
}

/// Upper bounds of the request-duration histogram, in seconds.
const BUCKETS: [f64; 12] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0,
];

/// What the webhook's background work against the cluster counts: the certificate reconcile loop and the
/// namespace cache. Shared with those tasks; the server renders them.
#[derive(Debug, Default)]
pub struct ClusterCounters {
    cert_reconcile_ok: AtomicU64,
    cert_reconcile_failed: AtomicU64,
    secret_watch_errors: AtomicU64,
    namespace_watch_errors: AtomicU64,
    namespace_fetch_ok: AtomicU64,
    namespace_fetch_failed: AtomicU64,
}

impl ClusterCounters {
    /// A self-managed certificate reconcile pass succeeded or failed.
    pub fn cert_reconcile(&self, ok: bool) {
        if ok {
            &self.cert_reconcile_ok
        } else {
            &self.cert_reconcile_failed
        }
        .fetch_add(1, Relaxed);
    }

    /// The watch of the certificate Secret failed (it retries with backoff).
    pub fn watch_error(&self) {
        self.secret_watch_errors.fetch_add(1, Relaxed);
    }

    /// The namespace watch failed (it retries with backoff).
    pub fn namespace_watch_error(&self) {
        self.namespace_watch_errors.fetch_add(1, Relaxed);
    }

    /// A namespace was fetched from the apiserver because the cache could not answer.
    pub fn namespace_fetch(&self, ok: bool) {
        if ok {
            &self.namespace_fetch_ok
        } else {
            &self.namespace_fetch_failed
        }
        .fetch_add(1, Relaxed);
    }
}

/// All metrics of one process.
#[derive(Debug, Default)]
pub struct Metrics {
    reasons: [AtomicU64; Reason::ALL.len()],
    errors: [AtomicU64; ErrorKind::ALL.len()],
    buckets: [AtomicU64; BUCKETS.len()],
    duration_count: AtomicU64,
    duration_sum_nanos: AtomicU64,
    in_flight: AtomicI64,
    cert_expiry: AtomicI64,
    config_reload_ok: AtomicU64,
    config_reload_failed: AtomicU64,
    cert_reload_ok: AtomicU64,
    cert_reload_failed: AtomicU64,
    ready: AtomicI64,
    /// Counted by the background tasks.
    pub cluster: std::sync::Arc<ClusterCounters>,
}

fn reason_index(reason: Reason) -> usize {
    Reason::ALL
        .iter()
        .position(|r| *r == reason)
        .expect("every reason is in Reason::ALL")
}

impl Metrics {
    /// Metrics that also render the counters of the cluster tasks.
    pub fn with_cluster(cluster: std::sync::Arc<ClusterCounters>) -> Metrics {
        Metrics {
            cluster,
            ..Metrics::default()
        }
    }

    /// Counts one answered review.
    pub fn review(&self, reason: Reason) {
        self.reasons[reason_index(reason)].fetch_add(1, Relaxed);
    }

    /// Counts one request answered with an error status.
    pub fn error(&self, kind: ErrorKind) {
        self.errors[ErrorKind::ALL.iter().position(|k| *k == kind).unwrap_or(0)]
            .fetch_add(1, Relaxed);
    }

    /// Records how long a review took.
    pub fn observe(&self, elapsed: Duration) {
        let secs = elapsed.as_secs_f64();
        if let Some(i) = BUCKETS.iter().position(|b| secs <= *b) {
            self.buckets[i].fetch_add(1, Relaxed);
        }
        self.duration_count.fetch_add(1, Relaxed);
        self.duration_sum_nanos.fetch_add(
            u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX),
            Relaxed,
        );
    }

    /// A request started (+1) or ended (-1).
    pub fn in_flight(&self, delta: i64) {
        self.in_flight.fetch_add(delta, Relaxed);
    }

    /// The serving certificate's expiry, seconds since the epoch.
    pub fn set_cert_expiry(&self, unix: i64) {
        self.cert_expiry.store(unix, Relaxed);
    }

    /// A config reload succeeded or failed.
    pub fn config_reload(&self, ok: bool) {
        if ok {
            &self.config_reload_ok
        } else {
            &self.config_reload_failed
        }
        .fetch_add(1, Relaxed);
    }

    /// A certificate reload succeeded or failed.
    pub fn cert_reload(&self, ok: bool) {
        if ok {
            &self.cert_reload_ok
        } else {
            &self.cert_reload_failed
        }
        .fetch_add(1, Relaxed);
    }

    /// Mirrors readiness.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(i64::from(ready), Relaxed);
    }

    /// Reviews counted for one reason (for tests and the log).
    pub fn reviews(&self, reason: Reason) -> u64 {
        self.reasons[reason_index(reason)].load(Relaxed)
    }

    /// The Prometheus text exposition (format 0.0.4).
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(4096);
        let _ = writeln!(
            out,
            "# HELP pdp_injector_build_info Version of the running injector."
        );
        let _ = writeln!(out, "# TYPE pdp_injector_build_info gauge");
        let _ = writeln!(
            out,
            "pdp_injector_build_info{{version=\"{}\"}} 1",
            crate::names::VERSION
        );

        let _ = writeln!(
            out,
            "# HELP pdp_injector_admission_reviews_total Admission reviews answered, by decision and reason code."
        );
        let _ = writeln!(out, "# TYPE pdp_injector_admission_reviews_total counter");
        for r in Reason::ALL {
            let _ = writeln!(
                out,
                "pdp_injector_admission_reviews_total{{decision=\"{}\",reason=\"{}\"}} {}",
                r.decision(),
                r.code(),
                self.reviews(r)
            );
        }
        let _ = writeln!(
            out,
            "# HELP pdp_injector_denials_total Pods refused, by reason code."
        );
        let _ = writeln!(out, "# TYPE pdp_injector_denials_total counter");
        for r in Reason::ALL.into_iter().filter(|r| r.decision() == "deny") {
            let _ = writeln!(
                out,
                "pdp_injector_denials_total{{reason=\"{}\"}} {}",
                r.code(),
                self.reviews(r)
            );
        }
        let _ = writeln!(
            out,
            "# HELP pdp_injector_request_errors_total Requests answered with an HTTP error instead of a review."
        );
        let _ = writeln!(out, "# TYPE pdp_injector_request_errors_total counter");
        for (k, c) in ErrorKind::ALL.iter().zip(&self.errors) {
            let _ = writeln!(
                out,
                "pdp_injector_request_errors_total{{kind=\"{}\"}} {}",
                k.code(),
                c.load(Relaxed)
            );
        }
        let _ = writeln!(
            out,
            "# HELP pdp_injector_request_duration_seconds Time to answer an admission review."
        );
        let _ = writeln!(
            out,
            "# TYPE pdp_injector_request_duration_seconds histogram"
        );
        let mut cumulative = 0;
        for (b, c) in BUCKETS.iter().zip(&self.buckets) {
            cumulative += c.load(Relaxed);
            let _ = writeln!(
                out,
                "pdp_injector_request_duration_seconds_bucket{{le=\"{b}\"}} {cumulative}"
            );
        }
        let count = self.duration_count.load(Relaxed);
        let _ = writeln!(
            out,
            "pdp_injector_request_duration_seconds_bucket{{le=\"+Inf\"}} {count}"
        );
        let _ = writeln!(
            out,
            "pdp_injector_request_duration_seconds_sum {}",
            self.duration_sum_nanos.load(Relaxed) as f64 / 1e9
        );
        let _ = writeln!(out, "pdp_injector_request_duration_seconds_count {count}");
        let _ = writeln!(
            out,
            "# HELP pdp_injector_in_flight_requests Admission requests being answered now."
        );
        let _ = writeln!(out, "# TYPE pdp_injector_in_flight_requests gauge");
        let _ = writeln!(
            out,
            "pdp_injector_in_flight_requests {}",
            self.in_flight.load(Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP pdp_injector_certificate_expiry_timestamp_seconds Expiry of the serving certificate."
        );
        let _ = writeln!(
            out,
            "# TYPE pdp_injector_certificate_expiry_timestamp_seconds gauge"
        );
        let _ = writeln!(
            out,
            "pdp_injector_certificate_expiry_timestamp_seconds {}",
            self.cert_expiry.load(Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP pdp_injector_config_reloads_total Config file reloads, by result."
        );
        let _ = writeln!(out, "# TYPE pdp_injector_config_reloads_total counter");
        let _ = writeln!(
            out,
            "pdp_injector_config_reloads_total{{result=\"success\"}} {}",
            self.config_reload_ok.load(Relaxed)
        );
        let _ = writeln!(
            out,
            "pdp_injector_config_reloads_total{{result=\"failure\"}} {}",
            self.config_reload_failed.load(Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP pdp_injector_certificate_reloads_total Serving certificate reloads, by result."
        );
        let _ = writeln!(out, "# TYPE pdp_injector_certificate_reloads_total counter");
        let _ = writeln!(
            out,
            "pdp_injector_certificate_reloads_total{{result=\"success\"}} {}",
            self.cert_reload_ok.load(Relaxed)
        );
        let _ = writeln!(
            out,
            "pdp_injector_certificate_reloads_total{{result=\"failure\"}} {}",
            self.cert_reload_failed.load(Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP pdp_injector_ready 1 when the webhook is ready to answer."
        );
        let _ = writeln!(out, "# TYPE pdp_injector_ready gauge");
        let _ = writeln!(out, "pdp_injector_ready {}", self.ready.load(Relaxed));
        let c = &self.cluster;
        for (name, help, series) in [
            (
                "pdp_injector_certificate_reconciles_total",
                "Self-managed certificate reconcile passes (Secret and caBundle), by result.",
                [
                    ("result=\"success\"", &c.cert_reconcile_ok),
                    ("result=\"failure\"", &c.cert_reconcile_failed),
                ],
            ),
            (
                "pdp_injector_namespace_fetches_total",
                "Namespaces read from the apiserver because the cache could not answer, by result.",
                [
                    ("result=\"success\"", &c.namespace_fetch_ok),
                    ("result=\"failure\"", &c.namespace_fetch_failed),
                ],
            ),
            (
                "pdp_injector_watch_errors_total",
                "Errors of the watches the webhook keeps (they retry with backoff), by watched resource.",
                [
                    ("resource=\"namespaces\"", &c.namespace_watch_errors),
                    ("resource=\"secrets\"", &c.secret_watch_errors),
                ],
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for (labels, value) in series {
                let _ = writeln!(out, "{name}{{{labels}}} {}", value.load(Relaxed));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_and_histogram_render() {
        let m = Metrics::default();
        m.review(Reason::InjectedSidecar);
        m.review(Reason::InjectedSidecar);
        m.review(Reason::InvalidAnnotation);
        m.error(ErrorKind::PayloadTooLarge);
        m.observe(Duration::from_micros(300));
        m.config_reload(false);
        let text = m.render();
        assert!(text.contains("pdp_injector_admission_reviews_total{decision=\"inject\",reason=\"injected_sidecar\"} 2\n"));
        assert!(text.contains("pdp_injector_denials_total{reason=\"invalid_annotation\"} 1\n"));
        assert!(text.contains("pdp_injector_request_errors_total{kind=\"payload_too_large\"} 1\n"));
        assert!(text.contains("pdp_injector_request_duration_seconds_bucket{le=\"0.00025\"} 0\n"));
        assert!(text.contains("pdp_injector_request_duration_seconds_bucket{le=\"0.0005\"} 1\n"));
        assert!(text.contains("pdp_injector_request_duration_seconds_bucket{le=\"+Inf\"} 1\n"));
        assert!(text.contains("pdp_injector_config_reloads_total{result=\"failure\"} 1\n"));
    }
}
