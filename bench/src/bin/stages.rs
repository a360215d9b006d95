//! Where the core path's time goes, stage by stage, on the criterion benchmark's inputs (benches/reviews.rs):
//! the same steps as `admission::review`, timed one at a time. A criterion program kept as a binary of the bench
//! crate so that it needs no `[[bench]]` entry (criterion reads its own arguments):
//!
//! ```text
//! cargo run --release -p pdp-injector-bench --bin stages -- --bench            # every stage, 2, 22 and 80 KiB
//! cargo run --release -p pdp-injector-bench --bin stages -- --bench 22KiB      # a filter, as with cargo bench
//! ```
//! `review` is all of it, as in benches/core.rs. `scan` is the floor of any parse: skipping the whole body
//! without building anything (`scan_text`: the same after one UTF-8 check of the body, as the review reads it;
//! `scan_fast`: the same with the webhook's own reader, `pdp_core::json`).
//! The other stages are the steps of `review`: `decode` (its one pass: the AdmissionReview and the core's
//! `PodView` of the Pod, `admission::decode`), `view` (the `PodView` alone, from the Pod's slice),
//! `decide`, `render` (the wiring as a patch, which parses the lists it extends), `encode` (patch JSON, base64,
//! the response envelope: `admission::encode_stage`); and `parse_pod`, the whole typed Pod, for comparison (no
//! production path parses it).

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use k8s_openapi::api::core::v1::Pod;
use pdp_core::admission::{self, review};
use pdp_core::config::Config;
use pdp_core::core::decide::plan_profile;
use pdp_core::core::render::render;
use pdp_core::core::{Decision, Form, NamespaceInfo, PodView, decide, inject_view};
use serde::Deserialize;
use serde_json::value::RawValue;

use pdp_injector_bench::reviews::{Class, SIZES, body};

/// The Pod of a review as a slice of the body: the input of the `view` and `parse_pod` stages.
fn raw_object(input: &[u8]) -> &str {
    #[derive(Deserialize)]
    struct Review<'a> {
        #[serde(borrow)]
        request: Request<'a>,
    }
    #[derive(Deserialize)]
    struct Request<'a> {
        #[serde(borrow)]
        object: &'a RawValue,
    }
    let review: Review<'_> = serde_json::from_slice(input).expect("a review with an object");
    review.request.object.get()
}

fn stages(c: &mut Criterion) {
    let config = Config::builtin();
    let ns = NamespaceInfo::named("payments");
    let lookup = |n: &str| NamespaceInfo::named(n);
    let mut group = c.benchmark_group("stage");
    for (label, size) in SIZES {
        for class in [
            Class::Inject,
            Class::OptedOut,
            Class::AlreadyInjected,
            Class::Bare,
        ] {
            let input = body(size, class);
            let id = |stage: &str| BenchmarkId::new(format!("{class:?}/{stage}"), label);
            group.bench_function(id("decode"), |b| {
                b.iter(|| {
                    admission::decode(std::hint::black_box(&input))
                        .map(drop)
                        .unwrap()
                })
            });
            let raw = raw_object(&input);
            group.bench_function(id("view"), |b| {
                b.iter(|| PodView::parse(std::hint::black_box(raw)).unwrap())
            });
            let view = PodView::parse(raw).unwrap();
            group.bench_function(id("decide"), |b| {
                b.iter(|| decide(std::hint::black_box(&view), &ns, &config))
            });
            group.bench_function(id("review"), |b| {
                b.iter(|| review(std::hint::black_box(&input), &config, &lookup).unwrap())
            });
            group.bench_function(id("scan"), |b| {
                b.iter(|| {
                    serde_json::from_slice::<serde::de::IgnoredAny>(std::hint::black_box(&input))
                        .unwrap()
                })
            });
            // The same skip over text already checked to be UTF-8, as `admission::review` reads the body.
            group.bench_function(id("scan_text"), |b| {
                b.iter(|| {
                    let text = std::str::from_utf8(std::hint::black_box(&input)).unwrap();
                    serde_json::from_str::<serde::de::IgnoredAny>(text).unwrap()
                })
            });
            group.bench_function(id("scan_fast"), |b| {
                b.iter(|| {
                    let text = std::str::from_utf8(std::hint::black_box(&input)).unwrap();
                    pdp_core::json::read::<serde::de::IgnoredAny>(text).unwrap()
                })
            });
            if class != Class::Inject {
                continue;
            }
            group.bench_function(id("parse_pod"), |b| {
                b.iter(|| serde_json::from_str::<Pod>(std::hint::black_box(raw)).unwrap())
            });
            let Decision::Inject(plan) = decide(&view, &ns, &config) else {
                panic!("the inject class injects")
            };
            let profile =
                plan_profile(&view, &plan, &config).expect("the inject class has a profile");
            group.bench_function(id("render"), |b| {
                b.iter(|| {
                    render(
                        std::hint::black_box(&view),
                        &plan,
                        profile,
                        &config,
                        Form::Wire,
                    )
                    .unwrap()
                })
            });
            let outcome = inject_view(&view, &ns, &config);
            group.bench_function(id("encode"), |b| {
                b.iter(|| {
                    admission::encode_stage(
                        "705ab4f5-6393-11e8-b7cc-42010a800002",
                        std::hint::black_box(&outcome),
                    )
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, stages);
criterion_main!(benches);
