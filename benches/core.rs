//! The core path on realistic inputs: decode an AdmissionReview with a 2 KiB, 22 KiB and 80 KiB Pod, decide,
//! render, diff, encode the response. Run: `cargo bench --bench core`.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use pdp_core::admission::review;
use pdp_core::config::Config;
use pdp_core::core::NamespaceInfo;

#[path = "reviews.rs"]
mod reviews;
use reviews::{Class, SIZES, body};

fn core_path(c: &mut Criterion) {
    let config = Config::builtin();
    let lookup = |ns: &str| NamespaceInfo::named(ns);
    let mut group = c.benchmark_group("review");
    for (label, size) in SIZES {
        for class in [
            Class::Inject,
            Class::OptedOut,
            Class::AlreadyInjected,
            Class::Bare,
            Class::Update,
        ] {
            let input = body(size, class);
            group.throughput(Throughput::Bytes(input.len() as u64));
            group.bench_with_input(
                BenchmarkId::new(format!("{class:?}"), label),
                &input,
                |b, input| {
                    b.iter(|| review(std::hint::black_box(input), &config, &lookup).unwrap())
                },
            );
        }
    }
    group.finish();
}

criterion_group!(benches, core_path);
criterion_main!(benches);
