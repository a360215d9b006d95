//! The HTTPS webhook around the core: the server and its handlers, the memory budget that bounds what it holds,
//! and its metrics.

pub mod limits;
pub mod metrics;
mod review;

pub use review::{admission_span, record_summary};
pub mod server;
