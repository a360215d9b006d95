//! `pdp-injector check`: is the cluster wired as the config says, and which Pods are not?
//!
//! [`gather`] does every read (list/get only) and the live TLS probe; the judging is pure and lives in the core
//! crate (`pdp_core::check`): it turns what was read into a [`Report`](pdp_core::check::Report), comparing each Pod with
//! what the webhook would do now.

pub mod gather;
