//! The seed's consumer as one runner handler, for any database with a transactional inbox:
//! [`InboxHandler`] claims the inbox and writes the database effect in one transaction,
//! commits, then runs the external effect; a [`Processor`](crate::Processor) runs it under
//! the effect's key. PostgreSQL's and MySQL's `Inbox::handler` make one, each giving its
//! transactions through [`InboxTx`]: one order of effects, written once.

use std::fmt;
use std::future::Future;

use idemkit_core::fault::{self, FaultPoint};
use idemkit_runner::Handle;

use crate::inbox::{InboxError, Seen, TxFuture};
use idemkit_core::{Attempt, Operation};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// A database's transactional inbox on its pool, as [`InboxHandler`] uses it: a
/// transaction, the claim in it, the connection the database effect writes on, the commit.
/// Implemented by `idemkit_postgres::PooledInbox` and `idemkit_mysql::PooledInbox`.
pub trait InboxTx: Send + Sync {
    /// An open transaction (rolled back when dropped).
    type Tx: Send;
    /// The connection a transaction's statements run on.
    type Conn: Send;

    /// Begins a transaction.
    fn begin(&self) -> impl Future<Output = Result<Self::Tx, InboxError>> + Send;

    /// The transaction's connection.
    fn conn(tx: &mut Self::Tx) -> &mut Self::Conn;

    /// Claims `(consumer, id)` in the transaction.
    fn claim<'a>(
        &'a self,
        tx: &'a mut Self::Tx,
        consumer: &'a str,
        id: &'a str,
    ) -> impl Future<Output = Result<Seen, InboxError>> + Send + 'a;

    /// Commits the transaction.
    fn commit(&self, tx: Self::Tx) -> impl Future<Output = Result<(), InboxError>> + Send;
}

/// A runner handler in the seed's order of effects (see `Inbox::handler` of
/// `idemkit-postgres` and `idemkit-mysql`).
pub struct InboxHandler<I, C, D, X> {
    inbox: I,
    consumer: Operation,
    claim: C,
    database: D,
    external: X,
}

impl<I, C, D, X> fmt::Debug for InboxHandler<I, C, D, X> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InboxHandler")
            .field("consumer", &self.consumer)
            .finish_non_exhaustive()
    }
}

/// Why an [`InboxHandler`] did not finish. A database effect either committed with its inbox
/// row or not at all; the runner retries the delivery (then dead-letters it, by its retry
/// policy), and a retry finds the committed part as it left it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HandlerError<E> {
    /// The inbox failed (the database down, a missing table): nothing ran.
    #[error(transparent)]
    Inbox(#[from] InboxError),
    /// The database effect failed; its transaction (and the inbox row) rolled back.
    #[error("the database effect failed: {0}")]
    Database(E),
    /// The database effect is committed (now or by an earlier delivery); the external
    /// effect failed.
    #[error("the external effect failed: {0}")]
    External(E),
}

impl<I, C, D, X> InboxHandler<I, C, D, X> {
    /// The handler; see `Inbox::handler` of `idemkit-postgres` or `idemkit-mysql`, which
    /// call this with their inbox on a pool.
    ///
    /// # Errors
    ///
    /// [`InboxError::InvalidId`] if `consumer` is not a valid name (checked here, once).
    ///
    /// # Example
    ///
    /// See `idemkit_postgres::Inbox::handler`.
    pub fn new(
        inbox: I,
        consumer: &str,
        claim: C,
        database: D,
        external: X,
    ) -> Result<Self, InboxError> {
        Ok(InboxHandler {
            inbox,
            consumer: Operation::new(consumer)?,
            claim,
            database,
            external,
        })
    }
}

impl<M, I, C, D, X, Fut, T, E> Handle<M> for InboxHandler<I, C, D, X>
where
    M: Send + Sync,
    I: InboxTx,
    C: idemkit_runner::KeyOf<M> + Send + Sync,
    D: for<'t> Fn(&'t M, &'t mut I::Conn) -> TxFuture<'t, Result<(), E>> + Send + Sync,
    X: Fn(M, Attempt) -> Fut + Send + Sync,
    Fut: Future<Output = Result<T, E>> + Send,
    T: Serialize + DeserializeOwned + Send,
    E: fmt::Display + Send,
{
    type Output = T;
    type Error = HandlerError<E>;

    async fn handle(&self, message: M, attempt: Attempt) -> Result<T, HandlerError<E>> {
        let id = self.claim.key_of(&message).map_err(InboxError::InvalidId)?;
        let mut tx = self.inbox.begin().await?;
        let seen = self
            .inbox
            .claim(&mut tx, self.consumer.as_str(), id.as_str())
            .await?;
        if seen == Seen::New {
            // An error drops `tx`: the inbox row and the effect roll back together.
            (self.database)(&message, I::conn(&mut tx))
                .await
                .map_err(HandlerError::Database)?;
            self.inbox.commit(tx).await?;
            // A test's crash point: committed, the external effect not sent.
            fault::hit(FaultPoint::AfterInboxCommit);
        } else {
            drop(tx);
        }
        (self.external)(message, attempt)
            .await
            .map_err(HandlerError::External)
    }
}
