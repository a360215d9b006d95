//! Benchmark tooling of pdp-injector: the programs `scripts/bench.sh` runs (BENCHMARKS.md says what each figure
//! means). Kept out of the main package so that a plain `cargo test` at the root does not build them; CI lints
//! them with `cargo clippy --workspace --all-targets`.
//!
//! - `loadgen`: HTTPS load generator (closed or open loop), one JSON line per run;
//! - `null-server`: the floor, a handler that does nothing on the webhook's exact HTTPS stack;
//! - `gen-reviews`: the AdmissionReview bodies and the YAML stream the runs send;
//! - `stages`: the core path stage by stage (criterion);
//! - `bench-report`: the tables, ratios and pass/miss per target from the runs' results;
//! - `sync-fanout`: the flag sync source's fan-out to many subscribed streams;
//! - `request-costs`: what a request costs outside the core (spans, log lines).

/// The AdmissionReview bodies of the criterion benchmark (`benches/reviews.rs`, shared through `#[path]`), so that
/// every figure is measured on the same inputs.
#[path = "../../benches/reviews.rs"]
pub mod reviews;
