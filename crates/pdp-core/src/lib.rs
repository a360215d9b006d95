//! The pure core of pdp-injector (docs/architecture.md). Its `Cargo.toml` has no async runtime, web framework,
//! Kubernetes client, logging or command line: whatever needs them lives in the binary crate, which uses this
//! one. Layers, each using only those above it:
//! - [`names`], [`duration`], [`size`], [`flag_sets`]: the names of the contract and the syntax of durations,
//!   sizes and flag set selectors;
//! - [`json`]: the reader of JSON text (serde_json's answers, sooner);
//! - [`config`]: the admin's configuration, its built-ins, its validation, and its fit to one cluster;
//! - [`core`]: decide, render, patch, pure and synchronous ([`core::inject`]);
//! - [`admission`]: AdmissionReview bytes in, bytes out, around the core;
//! - [`pki`]: certificate generation (the binary writes the files);
//! - [`offline`]: the `inject` command's transformation of a YAML stream;
//! - [`check`]: `check`'s judging of what the binary read from the cluster;
//! - [`route`]: the node-local front's choice of a PDP instance;
//! - [`peer`]: the Pod of a socket caller, from its process's cgroup;
//! - [`h2frame`]: HTTP/2 frame headers, read by the node front and the CSI plugin.

pub mod admission;
pub mod check;
pub mod config;
pub mod core;
pub mod duration;
pub mod flag_sets;
pub mod h2frame;
pub mod json;
pub mod names;
pub mod offline;
pub mod peer;
pub mod pki;
pub mod route;
pub mod size;
