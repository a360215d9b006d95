//! pdp-injector: a Kubernetes mutating admission webhook that wires Pods to a policy or flag decision point, as a
//! sidecar, through a node-local DaemonSet, or to a central Service.
//!
//! The work lives in the workspace's crates, by capability (docs/architecture.md): `pdp-core` (the pure core),
//! `pdp-tls`, `pdp-cluster`, `pdp-webhook`, `pdp-check`, `pdp-node`, `pdp-csi` and `pdp-flagsync`. This crate is
//! the command line only: [`cli`] wires those crates into each subcommand (`main.rs` only calls it).

pub mod cli;
