//! Where the core path's time goes, stage by stage, on the criterion benchmark's inputs (benches/reviews.rs):
//! the same steps as `admission::review`, timed one at a time. A criterion program kept as a binary of the bench
//! crate so that it needs no `[[bench]]` entry (criterion reads its own arguments):
//!
//! ```text
//! cargo run --release -p pdp-injector-bench --bin stages -- --bench            # every stage, 2, 22 and 80 KiB
//! cargo run --release -p pdp-injector-bench --bin stages -- --bench 22KiB      # a filter, as with cargo bench
//! ```
//! `review` is all of it, as in benches/core.rs. `scan` is the floor of any parse: skipping the whole body
//! without building anything. The other stages are the steps of `review`: `envelope` (the AdmissionReview with
//! the Pod as a raw slice), `view` (the core's `PodView` of the Pod), `decide`, `render` (the wiring as a patch,
//! which parses the lists it extends), `encode` (patch JSON, base64, the response envelope); and `parse_pod`,
//! the whole typed Pod, for comparison (no production path parses it).

use std::collections::BTreeMap;

use base64::Engine;
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use k8s_openapi::api::core::v1::Pod;
use pdp_injector::admission::review;
use pdp_injector::config::Config;
use pdp_injector::core::render::render;
use pdp_injector::core::{Decision, NamespaceInfo, PodView, decide};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use pdp_injector_bench::reviews::{Class, body};

/// The envelope as `admission::review` decodes it (the same fields and borrowing).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)]
struct ReviewIn<'a> {
    #[serde(borrow, default)]
    api_version: Option<&'a str>,
    #[serde(borrow, default)]
    kind: Option<&'a str>,
    #[serde(borrow, default)]
    request: Option<RequestIn<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)]
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

#[derive(Deserialize)]
#[allow(dead_code)]
struct Gvk<'a> {
    #[serde(borrow, default)]
    group: &'a str,
    #[serde(borrow, default)]
    version: &'a str,
    #[serde(borrow, default)]
    kind: &'a str,
}

#[derive(Deserialize)]
#[allow(dead_code)]
struct Gvr<'a> {
    #[serde(borrow, default)]
    resource: &'a str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ResponseOut<'a> {
    uid: &'a str,
    allowed: bool,
    patch: Option<String>,
    patch_type: Option<&'static str>,
    audit_annotations: BTreeMap<&'static str, &'static str>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ReviewOut<'a> {
    api_version: &'static str,
    kind: &'static str,
    response: ResponseOut<'a>,
}

fn raw_object(input: &[u8]) -> &str {
    let envelope: ReviewIn<'_> = serde_json::from_slice(input).expect("a review");
    envelope
        .request
        .and_then(|r| r.object)
        .map(RawValue::get)
        .expect("an object")
}

fn stages(c: &mut Criterion) {
    let config = Config::builtin();
    let ns = NamespaceInfo::named("payments");
    let lookup = |n: &str| NamespaceInfo::named(n);
    let mut group = c.benchmark_group("stage");
    for (label, size) in [
        ("2KiB", 2 * 1024),
        ("22KiB", 22 * 1024),
        ("80KiB", 80 * 1024),
    ] {
        for class in [Class::Inject, Class::OptedOut] {
            let input = body(size, class);
            let id = |stage: &str| BenchmarkId::new(format!("{class:?}/{stage}"), label);
            group.bench_function(id("envelope"), |b| {
                b.iter(|| {
                    serde_json::from_slice::<ReviewIn<'_>>(std::hint::black_box(&input)).unwrap()
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
            if class != Class::Inject {
                continue;
            }
            group.bench_function(id("parse_pod"), |b| {
                b.iter(|| serde_json::from_str::<Pod>(std::hint::black_box(raw)).unwrap())
            });
            let Decision::Inject(plan) = decide(&view, &ns, &config) else {
                panic!("the inject class injects")
            };
            group.bench_function(id("render"), |b| {
                b.iter(|| render(std::hint::black_box(&view), &plan, &config).unwrap())
            });
            let patch = render(&view, &plan, &config).unwrap().patch;
            group.bench_function(id("encode"), |b| {
                b.iter(|| {
                    let json = serde_json::to_vec(std::hint::black_box(&patch)).unwrap();
                    let out = ReviewOut {
                        api_version: "admission.k8s.io/v1",
                        kind: "AdmissionReview",
                        response: ResponseOut {
                            uid: "705ab4f5-6393-11e8-b7cc-42010a800002",
                            allowed: true,
                            patch: Some(base64::engine::general_purpose::STANDARD.encode(json)),
                            patch_type: Some("JSONPatch"),
                            audit_annotations: BTreeMap::from([
                                ("decision", "inject"),
                                ("reason", "injected_daemonset"),
                            ]),
                        },
                    };
                    serde_json::to_vec(&out).unwrap()
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, stages);
criterion_main!(benches);
