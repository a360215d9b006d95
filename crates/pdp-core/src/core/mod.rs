//! The core: decide whether and how a Pod is wired, render the wiring, and express it as a JSON Patch. Pure and
//! synchronous: no I/O, no async runtime, no Kubernetes client (tests/it/layers.rs keeps it so). The webhook, the
//! offline `inject` command and the tests all call it.

pub mod codes;
pub mod decide;
pub mod patch;
pub mod pipeline;
pub mod render;
pub mod status;
pub mod view;

pub use codes::{Denial, Reason, Warning, WarningCode};
pub use decide::{Decision, NamespaceInfo, Plan, decide, decide_pod, reads_namespace};
pub use patch::Form;
pub use pipeline::{
    Injected, Outcome, inject, inject_as, inject_json, inject_view, inject_view_as, patched, wire,
};
pub use status::Status;
pub use view::PodView;
