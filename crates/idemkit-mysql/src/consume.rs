//! The seed's consumer as one runner handler on MySQL: [`Inbox::handler`] makes the runner
//! crate's [`idemkit_sql::InboxHandler`] on this crate's inbox (the same order of effects
//! as PostgreSQL's), for a [`Processor`] under the effect's key, on the Kafka, JetStream or
//! RabbitMQ runner.
//!
//! [`Processor`]: idemkit_runner::Processor

use std::future::Future;

use idemkit_core::Attempt;
use idemkit_sql::InboxTx;
use idemkit_sql::{InboxError, Seen, TxFuture};
use sqlx::{MySql, MySqlConnection, MySqlPool, Transaction};

use crate::inbox::Inbox;

/// A runner handler in the seed's order of effects (see [`Inbox::handler`]).
pub type InboxHandler<C, D, X> = idemkit_sql::InboxHandler<PooledInbox, C, D, X>;

/// Why an [`InboxHandler`] did not finish.
pub use idemkit_sql::HandlerError;

/// The inbox and the pool its handler's transactions run on: what [`InboxHandler`] claims
/// and commits through.
#[derive(Debug, Clone)]
pub struct PooledInbox {
    inbox: Inbox,
    pool: MySqlPool,
}

impl InboxTx for PooledInbox {
    type Tx = Transaction<'static, MySql>;
    type Conn = MySqlConnection;

    async fn begin(&self) -> Result<Self::Tx, InboxError> {
        self.pool
            .begin()
            .await
            .map_err(|e| InboxError::Store(self.inbox.err(e)))
    }

    fn conn(tx: &mut Self::Tx) -> &mut MySqlConnection {
        tx
    }

    async fn claim<'a>(
        &'a self,
        tx: &'a mut Self::Tx,
        consumer: &'a str,
        id: &'a str,
    ) -> Result<Seen, InboxError> {
        self.inbox.claim(tx, consumer, id).await
    }

    async fn commit(&self, tx: Self::Tx) -> Result<(), InboxError> {
        tx.commit()
            .await
            .map_err(|e| InboxError::Store(self.inbox.err(e)))
    }
}

impl Inbox {
    /// The seed's consumer as a runner handler, for a [`Processor`] on the effect's key (the
    /// same for the Kafka, JetStream and RabbitMQ runners), as PostgreSQL's
    /// `Inbox::handler`. Each run of it, in the only order that neither repeats nor loses an
    /// effect:
    ///
    /// 1. one transaction on `pool`: [`claim`](Inbox::claim) `claim(&message)` for
    ///    `consumer`, and if it is new, `database(&message, conn)` (the invoice row);
    /// 2. commit (a claim already committed skips the database effect: an earlier run
    ///    committed it and died after);
    /// 3. `external(message, attempt)` (the email), on every run, with the attempt whose
    ///    [`downstream_key`](Attempt::downstream_key) the receiving API should get;
    /// 4. its value is the call's result: stored under the key and replayed to every later
    ///    delivery, which then runs nothing; the runner acknowledges the message only after.
    ///
    /// `claim` names the **effect**, as the key does (pass the processor's key function;
    /// `()` claims the message's dedupe id, `idemkit_runner::DedupeId`, issue 52).
    /// InnoDB specifics (a claim queued behind a transaction that rolls back may end in a
    /// deadlock: an `Unavailable` error, retried by the runner) are [`Inbox::claim`]'s.
    ///
    /// # Errors
    ///
    /// [`InboxError::InvalidId`] if `consumer` is not a valid name (checked here, once).
    ///
    /// # Example
    ///
    /// ```no_run
    /// use idemkit_core::{Coordinator, Key, KeyError, Operation};
    /// use idemkit_mysql::{Inbox, MySqlStore};
    /// use idemkit_runner::Processor;
    ///
    /// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = MySqlStore::connect("mysql://root@127.0.0.1:3306/test").await?;
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
    ///         sqlx::query("INSERT INTO invoices (order_id) VALUES (?)")
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
    /// // RabbitRunner::new(uri, "orders.paid", processor), KafkaRunner::new(..) or JetStreamRunner::new(..)
    /// # let _ = processor; Ok(()) }
    /// ```
    ///
    /// [`Processor`]: idemkit_runner::Processor
    pub fn handler<M, C, D, X, Fut, T, E>(
        self,
        pool: MySqlPool,
        consumer: &str,
        claim: C,
        database: D,
        external: X,
    ) -> Result<InboxHandler<C, D, X>, InboxError>
    where
        // The handler's bounds, here too: they give the closures their signatures.
        C: idemkit_runner::KeyOf<M> + Send + Sync,
        D: for<'t> Fn(&'t M, &'t mut MySqlConnection) -> TxFuture<'t, Result<(), E>> + Send + Sync,
        X: Fn(M, Attempt) -> Fut + Send + Sync,
        Fut: Future<Output = Result<T, E>> + Send,
    {
        InboxHandler::new(
            PooledInbox { inbox: self, pool },
            consumer,
            claim,
            database,
            external,
        )
    }
}
