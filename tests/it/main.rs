//! The integration tier: the library and the binaries driven from outside, one module per subject
//! (CONTRIBUTING.md lists what each proves). One test binary links the stack once.

#[path = "../common/mod.rs"]
mod common;

mod addresses;
mod admission;
mod csi;
mod fuzz_regressions;
mod golden;
mod layers;
mod manifests_security;
mod node_proxy;
mod node_proxy_groups;
mod precedence;
mod properties;
mod safe_output;
mod selfcerts;
mod server;
