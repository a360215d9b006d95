//! What one admission request costs the webhook outside the core (crates/pdp-webhook/src/review.rs, `mutate`), piece by
//! piece: the span and its fields, the log line, the deadline's timer, the clock and the metrics, the bounds'
//! permits, the body's copy and the response. A criterion program kept as a binary of the bench crate (as
//! `stages`), run pinned to one core:
//!
//! ```text
//! cargo build --release -p pdp-injector-bench --bin request-costs
//! taskset -c 1 target/release/request-costs --bench
//! ```
//! The subscriber is tracing-subscriber's stock one (an `info` EnvFilter, fmt, JSON with the event flattened and
//! the current span; the server writes that JSON with its own formatter, src/cli/logging.rs), writing to a sink
//! (`log/*/sink`: formatting only) or to /dev/null (`log/*/devnull`: with the write(2) that stderr costs per line).

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use pdp_core::admission::ReviewSummary;
use pdp_core::core::Reason;
use pdp_webhook::metrics::Metrics;
use pdp_webhook::{admission_span, record_summary};
use tracing::{Instrument, Span, info};
use tracing_subscriber::fmt::MakeWriter;

/// tracing-subscriber's stock subscriber, JSON or text, writing to `writer`.
fn subscriber<W>(json: bool, writer: W) -> Box<dyn tracing::Subscriber + Send + Sync>
where
    W: for<'a> MakeWriter<'a> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
        .with_writer(writer)
        .with_ansi(false);
    if json {
        Box::new(
            builder
                .json()
                .flatten_event(true)
                .with_current_span(true)
                .finish(),
        )
    } else {
        Box::new(builder.finish())
    }
}

/// The summary `review_response` records on it.
fn summary() -> ReviewSummary {
    ReviewSummary {
        uid: "705ab4f5-6393-11e8-b7cc-42010a800002".into(),
        namespace: "payments".into(),
        name: "checkout-7d9f8b6c5-x2x9q".into(),
        operation: "CREATE".into(),
        decision: "inject",
        reason: Reason::InjectedSidecar,
        dry_run: false,
        warnings: 0,
        patch_ops: 9,
    }
}

/// The fields recorded one call each, as before (for comparison: each call re-encodes the span's JSON).
fn record_one_by_one(span: &Span) {
    span.record("uid", "705ab4f5-6393-11e8-b7cc-42010a800002");
    span.record("namespace", "payments");
    span.record("pod", "checkout-7d9f8b6c5-x2x9q");
    span.record("operation", "CREATE");
    span.record("decision", "inject");
    span.record("reason", Reason::InjectedSidecar.code());
}

fn line() {
    info!(
        dry_run = false,
        patch_ops = 9usize,
        warnings = 0usize,
        "admission review answered"
    );
}

/// /dev/null, opened once, written a line at a time as stderr is.
struct DevNull(Arc<Mutex<std::fs::File>>);

impl<'a> MakeWriter<'a> for DevNull {
    type Writer = DevNullLine;
    fn make_writer(&'a self) -> DevNullLine {
        DevNullLine(self.0.clone())
    }
}

struct DevNullLine(Arc<Mutex<std::fs::File>>);

impl Write for DevNullLine {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn logging(c: &mut Criterion) {
    let mut group = c.benchmark_group("log");
    let devnull = Arc::new(Mutex::new(
        std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/null")
            .expect("/dev/null opens"),
    ));
    for (format, json) in [("json", true), ("text", false)] {
        for (to, sub) in [
            ("sink", subscriber(json, std::io::sink)),
            ("devnull", subscriber(json, DevNull(devnull.clone()))),
        ] {
            let summary = summary();
            tracing::subscriber::with_default(sub, || {
                // The span alone: opened, entered and left twice (the handler's polls), six fields, closed.
                group.bench_function(format!("{format}/{to}/span"), |b| {
                    b.iter(|| {
                        let span = admission_span();
                        drop(span.enter());
                        let _entered = span.enter();
                        record_summary(&span, &summary);
                    })
                });
                // The same with the six fields recorded one call each (what the webhook did before).
                group.bench_function(format!("{format}/{to}/span-six-records"), |b| {
                    b.iter(|| {
                        let span = admission_span();
                        drop(span.enter());
                        let _entered = span.enter();
                        record_one_by_one(&span);
                    })
                });
                // The span and the line the handler logs in it.
                group.bench_function(format!("{format}/{to}/span+line"), |b| {
                    b.iter(|| {
                        let span = admission_span();
                        drop(span.enter());
                        let _entered = span.enter();
                        record_summary(&span, &summary);
                        line();
                    })
                });
            });
        }
    }
    group.finish();
}

fn the_rest(c: &mut Criterion) {
    let mut group = c.benchmark_group("request");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime");
    // The deadline: `tokio::time::timeout` around a future that is ready at once, and the instrumented future.
    group.bench_function("timeout", |b| {
        b.iter(|| {
            // Built inside the runtime, as the handler's is: the timer needs its handle.
            runtime.block_on(async {
                tokio::time::timeout(Duration::from_secs(10), async { std::hint::black_box(1) })
                    .await
            })
        })
    });
    group.bench_function("block_on (the floor of the two above)", |b| {
        b.iter(|| runtime.block_on(async { std::hint::black_box(1) }))
    });
    group.bench_function("instrument (no subscriber)", |b| {
        b.iter(|| runtime.block_on(async { std::hint::black_box(1) }.instrument(admission_span())))
    });
    // The clock and the metrics of one request: in flight +1/-1, the duration, the reason.
    let metrics = Metrics::default();
    group.bench_function("clock+metrics", |b| {
        b.iter(|| {
            let started = Instant::now();
            metrics.in_flight(1);
            metrics.review(Reason::InjectedSidecar);
            metrics.observe(started.elapsed(), true);
            metrics.in_flight(-1);
        })
    });
    // The bounds: the reader and review permits, the body's and the answer's share of the byte budget.
    let readers = Arc::new(tokio::sync::Semaphore::new(1024));
    let budget = Arc::new(tokio::sync::Semaphore::new(64 << 20));
    group.bench_function("permits", |b| {
        b.iter(|| {
            let reader = readers.clone().try_acquire_owned().unwrap();
            let permit = readers.clone().try_acquire_owned().unwrap();
            let body = budget.clone().try_acquire_many_owned(22 * 1024).unwrap();
            let answer = budget.clone().try_acquire_many_owned(4 * 1024).unwrap();
            drop((reader, permit, body, answer));
        })
    });
    // The body's one copy: 22 KiB arriving as TLS records of 16 KiB.
    let frames = [bytes_of(16 * 1024), bytes_of(22 * 1024 - 16 * 1024)];
    group.bench_function("body copy 22KiB", |b| {
        b.iter(|| {
            let mut buf = Vec::with_capacity(22 * 1024);
            for f in &frames {
                buf.extend_from_slice(std::hint::black_box(f));
            }
            Arc::new(buf)
        })
    });
    group.finish();
}

fn bytes_of(n: usize) -> Vec<u8> {
    vec![b'x'; n]
}

criterion_group!(benches, logging, the_rest);
criterion_main!(benches);
