//! MySQL and MariaDB for idemkit.
//!
//! - [`MySqlStore`]: the idemkit [`Store`](idemkit_core::Store) on an InnoDB table of your
//!   database, with [`Scan`](idemkit_core::scan::Scan) for the operator's commands.
//! - [`Inbox`]: the transactional inbox, a row per (consumer, claim) written in your own
//!   transaction; [`Inbox::deliver`]: the seed's order of effects in one call.
//! - [`TxCall`] ([`InTransaction::in_transaction`]): a call whose result is stored in your
//!   transaction, committing or rolling back with the database effect it protects, under
//!   any isolation level (REPEATABLE READ, InnoDB's default, included).
//!
//! One statement per phase where a first delivery is concerned: a `begin` that reserves is
//! one `INSERT ... ON DUPLICATE KEY UPDATE` (the reservation, or the takeover of an expired
//! row, decided by the row's own expiry), a completion one owner-checked `UPDATE`. A `begin`
//! that meets a live row reads it with a second statement, unless most recent `begin`s met
//! live rows: then it reads first, and a replay is one statement (an absent key then costs
//! the read and the upsert). Under load, concurrent `begin`s and `complete`s are coalesced:
//! while two of a kind run, the rest queue and go out as one multi-row statement (and, for
//! `begin`s, one read) ([`MySqlStoreBuilder::coalesce`]). Fencing tokens come from the
//! server's clock in microseconds, never below the row's last token nor a token written by
//! hand. MySQL has no notifications: a waiter re-reads the row (see
//! [`MySqlStoreBuilder::recheck`]).

/// The database driver this crate is built on, so an application uses the same version.
pub use sqlx;

mod batch;
mod consume;
mod inbox;
mod row;
mod scan;
mod sql;
mod store;
mod tx;

pub use consume::{HandlerError, InboxHandler, PooledInbox};
pub use idemkit_sql::{DeliverError, Delivered, InboxError, Seen, TxFuture};
pub use inbox::Inbox;
pub use store::{MySqlStore, MySqlStoreBuilder, NameError};
pub use tx::{InTransaction, TxCall};
