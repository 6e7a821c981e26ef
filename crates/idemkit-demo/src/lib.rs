//! The seed's experiments, reproduced: the `idemkit-demo` binary's logic, kept in a library so
//! it can be tested without a process.
//!
//! - [`demo`] runs the seed's three experiments on any store.
//! - [`consumer`] runs experiment 4: a consumer's database effect and email under each
//!   combination of inbox and key, on PostgreSQL or an in-memory stand-in.
//! - [`chain`] runs experiment 5: one effect key across three hops (issue 52).
//! - [`postgres`] is experiment 4's PostgreSQL database, [`mysql`] its MySQL one.
//! - [`queue`] is the in-process at-least-once queue the demo runs on.
#![forbid(unsafe_code)]

pub mod chain;
pub mod consumer;
pub mod demo;
pub mod mysql;
pub mod postgres;
pub mod queue;
