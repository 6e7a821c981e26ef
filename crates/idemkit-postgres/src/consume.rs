//! The seed's consumer as one runner handler: [`Inbox::handler`] makes an
//! [`idemkit_runner::Handle`] that claims the inbox and writes the database effect in one
//! transaction, commits, then runs the external effect; a [`Processor`] runs it under the
//! effect's key, for the Kafka and the JetStream runner alike.
//!
//! [`Processor`]: idemkit_runner::Processor

use std::fmt;
use std::future::Future;

use idemkit_core::fault::{self, FaultPoint};
use idemkit_core::{Attempt, Key, KeyError, Operation};
use idemkit_runner::Handle;
use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::{PgConnection, PgPool};

use crate::errors::map_err;
use crate::inbox::Inbox;
use crate::tx::TxFuture;
use idemkit_core::inbox::{InboxError, Seen};

/// A runner handler in the seed's order of effects (see [`Inbox::handler`]).
pub struct InboxHandler<C, D, X> {
    inbox: Inbox,
    pool: PgPool,
    consumer: Operation,
    claim: C,
    database: D,
    external: X,
}

impl<C, D, X> fmt::Debug for InboxHandler<C, D, X> {
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

impl Inbox {
    /// The seed's consumer as a runner handler, for a [`Processor`] on the effect's key (the
    /// same for the Kafka and the JetStream runner). Each run of it, in the only order that
    /// neither repeats nor loses an effect:
    ///
    /// 1. one transaction on `pool`: [`claim`](Inbox::claim) `claim(&message)` for
    ///    `consumer`, and if it is new, `database(&message, conn)` (the invoice row);
    /// 2. commit (a claim already committed skips the database effect: an earlier run
    ///    committed it and died after);
    /// 3. `external(message, attempt)` (the email), on every run, with the attempt whose
    ///    [`downstream_key`](Attempt::downstream_key) the receiving API should get: a run
    ///    after a crash between the email and the completion sends it again with the same
    ///    downstream key, which such an API answers without a second email;
    /// 4. its value is the call's result: stored under the key and replayed to every later
    ///    delivery, which then runs nothing; the runner acknowledges the message only after.
    ///
    /// `claim` names the **effect**, as the key does (pass the processor's key function):
    /// a producer's retry of the same order arrives as another message (another offset, a
    /// new message id) and must find the order's claim, not a fresh one.
    ///
    /// # Errors
    ///
    /// [`InboxError::InvalidId`] if `consumer` is not a valid name (checked here, once).
    ///
    /// # Example
    ///
    /// ```no_run
    /// use idemkit_core::{Coordinator, Key, KeyError, Operation};
    /// use idemkit_postgres::{Inbox, PgStore};
    /// use idemkit_runner::Processor;
    ///
    /// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = PgStore::connect("postgres://postgres@127.0.0.1/test").await?;
    /// let pool = store.pool().clone();
    /// #[derive(Clone)]
    /// struct Paid { order: String }
    /// // One function names the effect, for the key and for the inbox claim.
    /// let effect = |m: &Paid| -> Result<Key, KeyError> { Key::compose([m.order.as_str(), "invoice"]) };
    /// let handler = Inbox::new().handler(
    ///     pool,
    ///     "billing",
    ///     effect,
    ///     |m: &Paid, conn| Box::pin(async move {
    ///         sqlx::query("INSERT INTO invoices (order_id) VALUES ($1)")
    ///             .bind(&m.order).execute(conn).await?;
    ///         Ok::<_, sqlx::Error>(())
    ///     }),
    ///     |m: Paid, attempt: idemkit_core::Attempt| async move {
    ///         // Send the email with `attempt.downstream_key()` as the mail API's own key.
    ///         let _ = attempt.downstream_key();
    ///         Ok::<_, sqlx::Error>(format!("em_{}", m.order))
    ///     },
    /// )?;
    /// let processor = Processor::new(Coordinator::new(store), Operation::new("invoice.send")?, effect, handler);
    /// // KafkaRunner::new(config, ["orders.paid"], processor) or JetStreamRunner::new(..)
    /// # let _ = processor; Ok(()) }
    /// ```
    ///
    /// [`Processor`]: idemkit_runner::Processor
    pub fn handler<M, C, D, X, Fut, T, E>(
        self,
        pool: PgPool,
        consumer: &str,
        claim: C,
        database: D,
        external: X,
    ) -> Result<InboxHandler<C, D, X>, InboxError>
    where
        // The handler's bounds, here too: they give the closures their signatures.
        C: Fn(&M) -> Result<Key, KeyError> + Send + Sync,
        D: for<'t> Fn(&'t M, &'t mut PgConnection) -> TxFuture<'t, Result<(), E>> + Send + Sync,
        X: Fn(M, Attempt) -> Fut + Send + Sync,
        Fut: Future<Output = Result<T, E>> + Send,
    {
        Ok(InboxHandler {
            inbox: self,
            pool,
            consumer: Operation::new(consumer)?,
            claim,
            database,
            external,
        })
    }
}

impl<M, C, D, X, Fut, T, E> Handle<M> for InboxHandler<C, D, X>
where
    M: Send + Sync,
    C: Fn(&M) -> Result<Key, KeyError> + Send + Sync,
    D: for<'t> Fn(&'t M, &'t mut PgConnection) -> TxFuture<'t, Result<(), E>> + Send + Sync,
    X: Fn(M, Attempt) -> Fut + Send + Sync,
    Fut: Future<Output = Result<T, E>> + Send,
    T: Serialize + DeserializeOwned + Send,
    E: fmt::Display + Send,
{
    type Output = T;
    type Error = HandlerError<E>;

    async fn handle(&self, message: M, attempt: Attempt) -> Result<T, HandlerError<E>> {
        let id = (self.claim)(&message).map_err(InboxError::InvalidId)?;
        let store = |e| InboxError::Store(map_err(e, &self.inbox.table, crate::inbox::MIGRATE));
        let mut tx = self.pool.begin().await.map_err(store)?;
        let seen = self
            .inbox
            .claim(&mut tx, self.consumer.as_str(), id.as_str())
            .await?;
        if seen == Seen::New {
            // An error drops `tx`: the inbox row and the effect roll back together.
            (self.database)(&message, &mut tx)
                .await
                .map_err(HandlerError::Database)?;
            tx.commit().await.map_err(store)?;
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
