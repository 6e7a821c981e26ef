//! The `idemkit` command's logic, kept in a library so it can be tested without a process.
//!
//! - [`demo`] runs the seed's three experiments on any store.
//! - [`queue`] is the in-process at-least-once queue the demo runs on.

pub mod demo;
pub mod queue;
