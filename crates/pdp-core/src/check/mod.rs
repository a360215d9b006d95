//! `check`'s judging: what the binary's `check::gather` read from the cluster ([`ClusterView`]) becomes a
//! [`Report`]. Every judgement about a Pod comes from the core's own decision ([`pods`]), so `check` cannot drift
//! from the webhook; certificates are verified as a TLS client would ([`certs`]).

pub mod analyse;
pub mod certs;
pub mod classic_sidecars;
pub mod codes;
pub mod heal;
pub mod pods;
pub mod pre;
pub mod report;
pub mod selectors;
pub mod workloads;

pub use analyse::{ClusterView, analyse};
pub use codes::FindingCode;
pub use report::Report;
