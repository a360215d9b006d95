//! pdp-injector: a Kubernetes mutating admission webhook that wires Pods to a policy decision point, as a native
//! sidecar or through the node-local PDP of a DaemonSet.
//!
//! Two crates (docs/architecture.md). The pure core, `pdp-core`, holds the names, the config, the decision and
//! the patch, admission bytes in and out, the offline transformation, check's judging and the front's routing; it
//! is re-exported here under the same names ([`names`], [`duration`], [`size`], [`config`], [`core`],
//! [`admission`], [`offline`]). This crate adds the I/O, each layer using only those above it:
//! - [`tls`]: the rustls serving configuration, its reload, certificate files;
//! - [`h2frame`]: HTTP/2 frame headers, read by the node front and the CSI plugin;
//! - [`cluster`]: what is kept in step with the cluster (namespaces, self-managed certificates);
//! - [`webhook`]: the HTTPS server;
//! - [`check`]: the `check` command's reads of the cluster (its judging is the core's);
//! - [`node`]: the node-local front (`node-proxy`) before the node's PDP instances;
//! - [`csi`]: the CSI node plugin (`csi-node`) that gives app Pods the node's socket as an inline volume;
//! - [`heal`]: the opt-in reconciler (`heal`) that replaces Pods not wired as the webhook would wire them;
//! - [`cli`]: the command line, each subcommand wiring the layers above (`main.rs` only calls it).

pub use pdp_core::{admission, config, core, duration, h2frame, names, offline, size};

pub mod check;
pub mod cli;
pub mod cluster;
pub mod heal;
pub mod webhook;
