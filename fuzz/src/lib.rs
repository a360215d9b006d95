//! The properties checked by the fuzz targets (shared with the main package's `tests/it/fuzz_regressions.rs`).

mod checks;

pub use checks::*;
