//! pdp-injector: a Kubernetes mutating admission webhook that wires Pods to a policy decision point, as a native
//! sidecar or through the node-local PDP of a DaemonSet.
//!
//! The core ([`inject::inject`]) is pure and synchronous; the webhook, the offline `inject` command and the tests
//! all call it.

pub mod admission;
pub mod certs;
pub mod cluster;
pub mod config;
pub mod decision;
pub mod inject;
pub mod limits;
pub mod lite;
pub mod metrics;
pub mod names;
pub mod namespaces;
pub mod offline;
pub mod patch;
pub mod render;
pub mod selfcerts;
pub mod server;
pub mod tls;
