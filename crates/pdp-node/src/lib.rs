//! The node-local front (`pdp-injector node-proxy`): a small, stable process per node that owns the
//! PDP's node endpoints and forwards each connection to the newest ready PDP instance, so the PDP itself can be
//! replaced without a moment where the node has no PDP (docs/deployment-models.md, "The node-local front").
//!
//! - `pdp_core::route`: which instance a connection goes to; pure, in the core crate;
//! - [`proxy`]: the listeners, the stable socket, the forwarding, the drain (one file per concern);
//! - [`groups`]: several listener pairs in one process (`--group`), one front for every node-local PDP.
//! - [`slots`]: the memory budget, the connection bounds derived from it, the places of open connections.

pub mod groups;
pub mod proxy;
pub mod slots;
