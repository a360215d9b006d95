//! cargo-fuzz target `offline`: see fuzz/README.md and the properties in fuzz/src/checks.rs.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pdp_injector_fuzz::offline(data));
