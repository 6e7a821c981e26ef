//! PostgreSQL for idemkit.
//!
//! - [`PgStore`]: the idemkit [`Store`](idemkit_core::Store) on a table of your database, with
//!   the same semantics as the Redis store (one statement per phase, fencing, push wake-ups).
//! - [`Inbox`]: the transactional inbox, a row per (consumer, claim) written in your own
//!   transaction, so that a redelivered message finds its database effects already committed.
//!   The claim names the effect (`order-9.invoice`), as a key does, not the message.
//! - [`TxCall`]: a call whose result is stored in your transaction, committing or rolling back
//!   with the database effect it protects.
//! - [`Inbox::deliver`]: the seed's order of effects in one call: database effect and inbox
//!   row, commit, then the external effect under its own key on every delivery.
//! - [`Inbox::handler`]: the same order as a runner's handler ([`InboxHandler`]), under a
//!   `Processor` on the effect's key, for the Kafka and the JetStream runner alike.
//!
//! See the README's "Which protection" table for when to use which.

/// The database driver this crate is built on (its pool, transactions and queries), so an
/// application uses the same version as the store without naming it in its manifest.
pub use sqlx;

mod batch;
mod builder;
mod consume;
mod errors;
mod fence;
mod inbox;
mod migrate;
mod names;
mod scan;
mod sql;
mod store;
mod tx;
mod wake;

pub use builder::PgStoreBuilder;
pub use consume::{HandlerError, InboxHandler, PooledInbox};
pub use fence::Fences;
pub use idemkit_sql::{DeliverError, Delivered, InboxError, Seen};
pub use inbox::Inbox;
pub use names::{MAX_NAME_LEN, NameError};
pub use store::{PgStore, Purger};
pub use tx::{InTransaction, TxCall, TxFuture};
