//! The HTTPS webhook around the core: the server (`server`), one request's admission path (`review`), the state
//! every request shares (`state`), the memory budget that bounds what it holds (`limits`), and its metrics.

pub mod limits;
pub mod metrics;
mod review;

pub mod server;
mod state;

pub use review::{admission_span, record_summary};
