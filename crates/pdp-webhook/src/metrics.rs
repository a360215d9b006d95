//! Prometheus metrics, exposed with `prometheus-client` in the Prometheus text format (0.0.4). The request path
//! only increments atomics on handles fetched once at start (one per reason code and error kind) and records
//! durations in a fixed-bucket histogram of atomics; label lookups and text encoding happen on scrape.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use pdp_cluster::{ClusterCounters, ResultLabel, result};
use pdp_core::core::Reason;

/// The `Content-Type` of what [`Metrics::render`] returns.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Kinds of request the webhook could not answer with an AdmissionReview.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// 400: not an AdmissionReview we can answer.
    BadRequest,
    /// 413: body over the limit.
    PayloadTooLarge,
    /// 415: not JSON.
    UnsupportedMediaType,
    /// 503: concurrency bound or memory budget reached, or shutting down.
    Overloaded,
    /// 504: the request did not complete within its deadline.
    Timeout,
    /// 503: the generic entry could not read the Pod's namespace (its failure policy decides).
    NamespaceUnreadable,
    /// 500: the review itself failed (a bug).
    Internal,
}

impl ErrorKind {
    /// The HTTP status of an answer of this kind.
    pub fn status(self) -> axum::http::StatusCode {
        use axum::http::StatusCode;
        match self {
            ErrorKind::BadRequest => StatusCode::BAD_REQUEST,
            ErrorKind::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorKind::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ErrorKind::Overloaded | ErrorKind::NamespaceUnreadable => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ErrorKind::Timeout => StatusCode::GATEWAY_TIMEOUT,
            ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    const ALL: [ErrorKind; 7] = [
        ErrorKind::BadRequest,
        ErrorKind::PayloadTooLarge,
        ErrorKind::UnsupportedMediaType,
        ErrorKind::Overloaded,
        ErrorKind::Timeout,
        ErrorKind::NamespaceUnreadable,
        ErrorKind::Internal,
    ];

    /// Label value.
    pub fn code(self) -> &'static str {
        match self {
            ErrorKind::BadRequest => "bad_request",
            ErrorKind::PayloadTooLarge => "payload_too_large",
            ErrorKind::UnsupportedMediaType => "unsupported_media_type",
            ErrorKind::Overloaded => "overloaded",
            ErrorKind::Timeout => "timeout",
            ErrorKind::NamespaceUnreadable => "namespace_unreadable",
            ErrorKind::Internal => "internal",
        }
    }
}

/// Upper bounds of the request-duration histograms, in seconds: from 100 us (a skip) to 10 s (past the
/// apiserver's longest webhook timeout), so that slow answers are seen, not lumped into +Inf.
const BUCKETS: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

/// A fixed-bucket histogram of atomics (prometheus-client's own takes a lock per observation).
#[derive(Debug, Default)]
struct AtomicHistogram {
    buckets: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_nanos: AtomicU64,
}

impl AtomicHistogram {
    fn observe(&self, elapsed: Duration) {
        let secs = elapsed.as_secs_f64();
        if let Some(i) = BUCKETS.iter().position(|b| secs <= *b) {
            self.buckets[i].fetch_add(1, Relaxed);
        }
        self.count.fetch_add(1, Relaxed);
        self.sum_nanos.fetch_add(
            u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX),
            Relaxed,
        );
    }
}

/// The two request-duration histograms, as one family labelled by what the request got.
#[derive(Debug, Default)]
struct Durations {
    reviews: AtomicHistogram,
    errors: AtomicHistogram,
}

impl Collector for Durations {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let mut family = encoder.encode_descriptor(
            "pdp_injector_request_duration_seconds",
            "Time to answer a request to /mutate, by result: review (an AdmissionReview) or error (an HTTP \
             error status).",
            None,
            MetricType::Histogram,
        )?;
        for (result, h) in [("review", &self.reviews), ("error", &self.errors)] {
            // Per-bucket counts: the encoder makes them cumulative and adds +Inf from the count.
            let buckets: Vec<(f64, u64)> = BUCKETS
                .iter()
                .zip(&h.buckets)
                .map(|(b, c)| (*b, c.load(Relaxed)))
                .collect();
            let labels = [("result", result)];
            family
                .encode_family(&labels)?
                .encode_histogram::<prometheus_client::encoding::NoLabelSet>(
                    h.sum_nanos.load(Relaxed) as f64 / 1e9,
                    h.count.load(Relaxed),
                    &buckets,
                    None,
                )?;
        }
        Ok(())
    }
}

/// The process's own resources, read from /proc on each scrape (memory is the webhook's known limit).
#[derive(Debug)]
struct Process;

impl Collector for Process {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let Some(stat) = ProcessStat::read() else {
            return Ok(());
        };
        let gauges: [(&str, &str, f64); 4] = [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                stat.rss_bytes as f64,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
                stat.vsize_bytes as f64,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors.",
                stat.open_fds as f64,
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since the Unix epoch in seconds.",
                stat.start_time_seconds,
            ),
        ];
        for (name, help, value) in gauges {
            let gauge = ConstGauge::new(value);
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        let cpu = ConstCounter::new(stat.cpu_seconds);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds.",
            None,
            cpu.metric_type(),
        )?)?;
        if let Some(max) = stat.max_fds {
            let gauge = ConstGauge::new(max as f64);
            gauge.encode(encoder.encode_descriptor(
                "process_max_fds",
                "Maximum number of open file descriptors.",
                None,
                gauge.metric_type(),
            )?)?;
        }
        Ok(())
    }
}

/// What /proc says of this process.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessStat {
    /// Resident set size.
    pub rss_bytes: u64,
    /// Virtual size.
    pub vsize_bytes: u64,
    /// User plus system CPU time.
    pub cpu_seconds: f64,
    /// Start time, seconds since the epoch.
    pub start_time_seconds: f64,
    /// Open descriptors.
    pub open_fds: u64,
    /// The soft limit on descriptors.
    pub max_fds: Option<u64>,
}

impl ProcessStat {
    /// Reads /proc/self; `None` where there is no /proc (the metrics are then left out, not faked).
    pub fn read() -> Option<ProcessStat> {
        // Linux reports CPU times in clock ticks and memory in pages; both are 100 Hz and 4 KiB on every
        // platform this webhook ships for (linux/amd64, linux/arm64).
        const TICKS: f64 = 100.0;
        const PAGE: u64 = 4096;
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // Fields after the command name, which is in parentheses and may contain spaces.
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        let field = |n: usize| fields.get(n - 3).and_then(|v| v.parse::<u64>().ok());
        let (utime, stime, start) = (field(14)?, field(15)?, field(22)?);
        let (vsize, rss_pages) = (field(23)?, field(24)?);
        let uptime: f64 = std::fs::read_to_string("/proc/uptime")
            .ok()?
            .split_whitespace()
            .next()?
            .parse()
            .ok()?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .ok()?
            .as_secs_f64();
        let max_fds = std::fs::read_to_string("/proc/self/limits")
            .ok()?
            .lines()
            .find(|l| l.starts_with("Max open files"))
            .and_then(|l| l.split_whitespace().nth(3))
            .and_then(|v| v.parse().ok());
        Some(ProcessStat {
            rss_bytes: rss_pages * PAGE,
            vsize_bytes: vsize,
            cpu_seconds: (utime + stime) as f64 / TICKS,
            start_time_seconds: now - uptime + start as f64 / TICKS,
            open_fds: std::fs::read_dir("/proc/self/fd").ok()?.count() as u64,
            max_fds,
        })
    }
}

/// Gauges the server sets from its own state: the memory budget and what is in use of it.
#[derive(Debug, Clone, Default)]
pub struct Capacity {
    /// The budget every bound derives from.
    pub memory_budget_bytes: Gauge,
    /// Open connections.
    pub connections_open: Gauge,
    /// Connections allowed at once.
    pub connections_max: Gauge,
    /// Connections closed at accept because the bound was reached.
    pub connections_refused: Counter,
    /// Bytes of request bodies held now.
    pub body_bytes_held: Gauge,
    /// Bytes of request bodies allowed at once.
    pub body_bytes_max: Gauge,
}

/// All metrics of one process.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    reviews: Vec<Counter>,
    denials: Vec<Option<Counter>>,
    errors: Vec<Counter>,
    durations: Arc<Durations>,
    in_flight: Gauge,
    cert_expiry: Gauge,
    config_reloads: [Counter; 2],
    cert_reloads: [Counter; 2],
    ready: Gauge,
    /// Set by the server on each scrape.
    pub capacity: Capacity,
    /// Counted by the background tasks.
    pub cluster: ClusterCounters,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::with_cluster(ClusterCounters::default())
    }
}

fn reason_index(reason: Reason) -> usize {
    Reason::ALL
        .iter()
        .position(|r| *r == reason)
        .expect("every reason is in Reason::ALL")
}

impl Metrics {
    /// Metrics that also expose the counters of the cluster tasks.
    pub fn with_cluster(cluster: ClusterCounters) -> Metrics {
        let mut registry = Registry::default();
        registry.register(
            "pdp_injector_build",
            "Version of the running injector",
            Info::new([("version", pdp_core::names::VERSION)]),
        );

        let reviews_family = Family::<[(&'static str, &'static str); 2], Counter>::default();
        let reviews = Reason::ALL
            .iter()
            .map(|r| {
                reviews_family
                    .get_or_create(&[("decision", r.decision()), ("reason", r.code())])
                    .clone()
            })
            .collect();
        registry.register(
            "pdp_injector_admission_reviews",
            "Admission reviews answered, by decision and reason code",
            reviews_family,
        );
        let denials_family = Family::<[(&'static str, &'static str); 1], Counter>::default();
        let denials = Reason::ALL
            .iter()
            .map(|r| {
                (r.decision() == "deny").then(|| {
                    denials_family
                        .get_or_create(&[("reason", r.code())])
                        .clone()
                })
            })
            .collect();
        registry.register(
            "pdp_injector_denials",
            "Pods refused, by reason code",
            denials_family,
        );
        let errors_family = Family::<[(&'static str, &'static str); 1], Counter>::default();
        let errors = ErrorKind::ALL
            .iter()
            .map(|k| errors_family.get_or_create(&[("kind", k.code())]).clone())
            .collect();
        registry.register(
            "pdp_injector_request_errors",
            "Requests answered with an HTTP error instead of a review",
            errors_family,
        );
        let durations = Arc::new(Durations::default());
        registry.register_collector(Box::new(durations.clone()));

        let in_flight = Gauge::default();
        registry.register(
            "pdp_injector_in_flight_requests",
            "Admission requests being answered now",
            in_flight.clone(),
        );
        let cert_expiry = Gauge::default();
        registry.register(
            "pdp_injector_certificate_expiry_timestamp_seconds",
            "Expiry of the serving certificate",
            cert_expiry.clone(),
        );
        let reloads = |registry: &mut Registry, name: &str, help: &str| {
            let family = Family::<ResultLabel, Counter>::default();
            // One statement each: the guard get_or_create returns lives to the end of its statement, and a
            // second insertion while it is held would wait for it forever.
            let success = family.get_or_create(&result(true)).clone();
            let failure = family.get_or_create(&result(false)).clone();
            let handles = [success, failure];
            registry.register(name, help, family);
            handles
        };
        let config_reloads = reloads(
            &mut registry,
            "pdp_injector_config_reloads",
            "Config file reloads, by result",
        );
        let cert_reloads = reloads(
            &mut registry,
            "pdp_injector_certificate_reloads",
            "Serving certificate reloads, by result",
        );
        let ready = Gauge::default();
        registry.register(
            "pdp_injector_ready",
            "1 when the webhook is ready to answer",
            ready.clone(),
        );

        let capacity = Capacity::default();
        for (name, help, gauge) in [
            (
                "pdp_injector_memory_budget_bytes",
                "The memory budget every bound derives from (--memory-budget)",
                &capacity.memory_budget_bytes,
            ),
            (
                "pdp_injector_connections_open",
                "Open connections",
                &capacity.connections_open,
            ),
            (
                "pdp_injector_connections_max",
                "Open connections allowed by the memory budget",
                &capacity.connections_max,
            ),
            (
                "pdp_injector_request_body_bytes_held",
                "Bytes of request bodies held now, across all requests",
                &capacity.body_bytes_held,
            ),
            (
                "pdp_injector_request_body_bytes_max",
                "Bytes of request bodies that may be held at once (beyond: 503)",
                &capacity.body_bytes_max,
            ),
        ] {
            registry.register(name, help, gauge.clone());
        }
        registry.register(
            "pdp_injector_connections_refused",
            "Connections closed at accept because the connection bound was reached",
            capacity.connections_refused.clone(),
        );
        cluster.register(&mut registry);
        registry.register_collector(Box::new(Process));

        Metrics {
            registry,
            reviews,
            denials,
            errors,
            durations,
            in_flight,
            cert_expiry,
            config_reloads,
            cert_reloads,
            ready,
            capacity,
            cluster,
        }
    }

    /// Counts one answered review.
    pub fn review(&self, reason: Reason) {
        let i = reason_index(reason);
        self.reviews[i].inc();
        if let Some(denials) = &self.denials[i] {
            denials.inc();
        }
    }

    /// Counts one request answered with an error status.
    pub fn error(&self, kind: ErrorKind) {
        let i = ErrorKind::ALL.iter().position(|k| *k == kind).unwrap_or(0);
        self.errors[i].inc();
    }

    /// Records how long a request to /mutate took: `review` when it was answered with an AdmissionReview,
    /// otherwise it got an HTTP error.
    pub fn observe(&self, elapsed: Duration, review: bool) {
        if review {
            self.durations.reviews.observe(elapsed)
        } else {
            self.durations.errors.observe(elapsed)
        }
    }

    /// A request started (+1) or ended (-1).
    pub fn in_flight(&self, delta: i64) {
        self.in_flight.inc_by(delta);
    }

    /// The serving certificate's expiry, seconds since the epoch.
    pub fn set_cert_expiry(&self, unix: i64) {
        self.cert_expiry.set(unix);
    }

    /// A config reload succeeded or failed.
    pub fn config_reload(&self, ok: bool) {
        self.config_reloads[usize::from(!ok)].inc();
    }

    /// A certificate reload succeeded or failed.
    pub fn cert_reload(&self, ok: bool) {
        self.cert_reloads[usize::from(!ok)].inc();
    }

    /// Mirrors readiness.
    pub fn set_ready(&self, ready: bool) {
        self.ready.set(i64::from(ready));
    }

    /// Reviews counted for one reason (for tests and the log).
    pub fn reviews(&self, reason: Reason) -> u64 {
        self.reviews[reason_index(reason)].get()
    }

    /// The Prometheus text exposition (format 0.0.4, [`CONTENT_TYPE`]).
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(8192);
        // Writing to a String cannot fail, and every metric here encodes.
        prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry)
            .expect("metrics encode");
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
        m.observe(Duration::from_micros(300), true);
        m.observe(Duration::from_secs(3), false);
        m.config_reload(false);
        m.cluster.namespace_fetch(false);
        let text = m.render();
        for line in [
            "pdp_injector_build_info{version=\"",
            "pdp_injector_admission_reviews_total{decision=\"inject\",reason=\"injected_sidecar\"} 2\n",
            "pdp_injector_admission_reviews_total{decision=\"skip\",reason=\"not_opted_in\"} 0\n",
            "pdp_injector_denials_total{reason=\"invalid_annotation\"} 1\n",
            "pdp_injector_request_errors_total{kind=\"payload_too_large\"} 1\n",
            "pdp_injector_request_duration_seconds_bucket{result=\"review\",le=\"0.00025\"} 0\n",
            "pdp_injector_request_duration_seconds_bucket{result=\"review\",le=\"0.0005\"} 1\n",
            "pdp_injector_request_duration_seconds_bucket{result=\"review\",le=\"+Inf\"} 1\n",
            "pdp_injector_request_duration_seconds_bucket{result=\"error\",le=\"2.5\"} 0\n",
            "pdp_injector_request_duration_seconds_bucket{result=\"error\",le=\"5\"} 1\n",
            "pdp_injector_request_duration_seconds_count{result=\"error\"} 1\n",
            "pdp_injector_config_reloads_total{result=\"failure\"} 1\n",
            "pdp_injector_namespace_fetches_total{result=\"failure\"} 1\n",
            "pdp_injector_watch_errors_total{resource=\"secrets\"} 0\n",
            "# TYPE process_resident_memory_bytes gauge\n",
            "# TYPE process_cpu_seconds_total counter\n",
        ] {
            assert!(text.contains(line), "missing {line:?} in:\n{text}");
        }
    }

    #[test]
    fn process_stat_reads_this_process() {
        let s = ProcessStat::read().expect("/proc exists here");
        assert!(s.rss_bytes > 1024 * 1024, "{s:?}");
        assert!(s.open_fds >= 3, "{s:?}");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!(
            s.start_time_seconds <= now + 1.0 && s.start_time_seconds > now - 86_400.0,
            "{s:?}"
        );
    }
}
