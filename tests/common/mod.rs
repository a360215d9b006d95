//! Helpers shared by the integration tests. Each test file is a crate of its own that declares `mod common;` and
//! uses the part it needs, so what one file leaves unused is not dead code there.
#![allow(dead_code)]

pub mod contains;
pub mod golden;
pub mod lines;
pub mod process;
