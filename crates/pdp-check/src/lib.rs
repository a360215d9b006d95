//! The cluster reads of `pdp-injector check` and the opt-in reconciler `heal` built on them.
//!
//! [`gather`] does every read (list/get only) and the live TLS probe; the judging is pure and lives in the core
//! crate (`pdp_core::check`), which turns what was read into a [`Report`](pdp_core::check::Report). [`heal`]
//! evicts the Pods that report finds unwired, when an admin turns it on.

pub mod gather;
pub mod heal;
