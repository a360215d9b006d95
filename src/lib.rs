//! pdp-injector: a Kubernetes mutating admission webhook that wires Pods to a policy decision point, as a native
//! sidecar or through the node-local PDP of a DaemonSet.
//!
//! Layers, each using only those above it (docs/architecture.md):
//! - [`names`]: the names of the contract (annotations, labels, volumes);
//! - [`duration`]: the duration syntax of the flags and of `?timeout=`;
//! - [`config`]: the admin's configuration, its built-ins and validation;
//! - [`core`]: decide, render, patch; pure and synchronous ([`core::inject`]);
//! - [`admission`]: AdmissionReview bytes in, bytes out, around the core;
//! - [`tls`]: certificates and the rustls serving configuration;
//! - [`cluster`]: what is kept in step with the cluster (namespaces, self-managed certificates);
//! - [`webhook`]: the HTTPS server;
//! - [`offline`]: the `inject` command;
//! - [`check`]: the `check` command (reads the cluster, judges Pods with the core).
//! - [`node`]: the node-local front (`node-proxy`) before the node's PDP instances.

pub mod admission;
pub mod check;
pub mod cluster;
pub mod config;
pub mod core;
pub mod duration;
pub mod names;
pub mod node;
pub mod offline;
pub mod size;
pub mod tls;
pub mod webhook;
