//! `pdp-injector check`: is the cluster wired as the config says, and which Pods are not?
//!
//! A layer of its own above the core (tests/layers.rs): it reads the cluster, so it cannot live in the core, and
//! it judges Pods with the core's own decision, so it cannot drift from the webhook. [`gather`] does every read
//! (list/get only) and the live TLS probe; everything else is pure and tested on fixtures: [`analyse`] turns what
//! was read into a [`report::Report`], [`pods`] compares one Pod with what the webhook would do now.

pub mod analyse;
pub mod certs;
pub mod gather;
pub mod pods;
pub mod report;
pub mod selectors;
pub mod workloads;

pub use analyse::{ClusterView, analyse};
pub use report::Report;
