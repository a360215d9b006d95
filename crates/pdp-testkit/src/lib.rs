//! What the tests, the benchmark tools and the fuzz checks share, so each has one definition: scratch
//! directories, child processes, ports, /proc readings, percentiles, the CI skip rule and a TLS client.

pub mod dir;
pub mod net;
pub mod proc;
pub mod process;
pub mod skip;
pub mod stats;
pub mod tls;
