//! What idemkit's SQL stores share (`idemkit-postgres`, `idemkit-mysql`), written once:
//!
//! - [`TxCall`]: the transactional call (reserve through the store, run the action in the
//!   caller's transaction, complete in it), over a store's [`Transactional`] side;
//! - the transactional inbox's shape: what a claim found ([`Seen`]), its errors
//!   ([`InboxError`]), what a delivery in the seed's order did ([`Delivered`],
//!   [`DeliverError`]), and the seed's consumer as one runner handler ([`InboxHandler`] over a
//!   database's [`InboxTx`]);
//! - the record as a row of columns ([`row`]) and the choice of a `begin`'s first statement
//!   ([`guess`]);
//! - what a coalesced call is ([`batch`]: the queued `begin` and `complete`, a store's two
//!   lanes, a failed batch's answer).
//!
//! An application uses these through its store's crate, which re-exports what it needs
//! (`idemkit_postgres::TxCall`, `idemkit_mysql::Seen`, ...).
//!
//! # Example
//!
//! ```
//! use idemkit_sql::Seen;
//!
//! // What an inbox's claim found: run the database effect only when it is new.
//! let seen = Seen::New;
//! assert!(matches!(seen, Seen::New));
//! ```
#![forbid(unsafe_code)]

pub mod batch;
pub mod guess;
mod handler;
mod inbox;
pub mod row;
pub mod scan;
mod tx;

pub use handler::{HandlerError, InboxHandler, InboxTx};
pub use inbox::{DeliverError, Delivered, InboxError, Seen, TxFuture};
pub use tx::{InTransaction, Transactional, TxCall, Unfit};
