//! The transactional inbox, and [`Inbox::deliver`]: the seed's order of effects.

use std::future::Future;
use std::time::Duration;

use idemkit_core::{Attempt, Call, Codec, Key, Operation, Store, StoreError};
use idemkit_sql::{DeliverError, Delivered, InboxError, Seen, TxFuture};
use sqlx::{PgConnection, PgPool};

use crate::errors::map_err;
use crate::names::{NameError, Table, check};

pub(crate) const MIGRATE: &str = "Inbox::migrate(&pool)";

/// The transactional inbox: one row per (consumer, claim), inserted in the handler's own
/// transaction, so it commits or rolls back with the handler's database effects. A
/// redelivered message finds the row and its effects committed.
///
/// **Claim the effect, not the message.** The claim is the identity of what the message asks
/// for (`order-9.invoice`, the same name as the effect's key), not the message's transport id
/// (`orders.paid/3/1042`, a partition and an offset): a producer that retries sends the same
/// order as a new message, at a new offset, which must find the order's claim. A transport id
/// only deduplicates the broker's redeliveries of one message. (The column is still called
/// `message_id`.)
///
/// Concurrent deliveries of one message: the second transaction's insert waits on the first
/// (the primary key), then sees [`Seen::Duplicate`] if the first committed, or
/// [`Seen::New`] (and goes on) if it rolled back. Rows are kept for the retention (default 7
/// days; pick it to outlive the latest redelivery, as for keys), after which a delivery counts
/// as new again; [`purge_expired`](Inbox::purge_expired) deletes them.
///
/// An inbox protects *database* effects only. An external effect (an email) is outside the
/// transaction: give it its own key and run it after the commit on every delivery, duplicates
/// included, which is what [`deliver`](Inbox::deliver) does, and
/// [`handler`](Inbox::handler) for a runner.
///
/// # Example
///
/// ```no_run
/// use idemkit_postgres::{Inbox, Seen};
///
/// # async fn f(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// let inbox = Inbox::new();
/// inbox.migrate(&pool).await?;
/// let mut tx = pool.begin().await?;
/// // The order's invoice, whichever message (offset) asked for it.
/// if inbox.claim(&mut tx, "billing", "order-9.invoice").await? == Seen::New {
///     sqlx::query("INSERT INTO ledger (order_id) VALUES ('order-9')").execute(&mut *tx).await?;
/// }
/// tx.commit().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Inbox {
    pub(crate) table: Table,
    retention: Duration,
    claim_sql: String,
    purge_sql: String,
}

impl Default for Inbox {
    fn default() -> Self {
        Inbox::with_table(Table {
            schema: "public".into(),
            name: "idemkit_inbox".into(),
        })
    }
}

impl Inbox {
    /// The inbox in `public.idemkit_inbox`, rows kept 7 days.
    ///
    /// # Example
    ///
    /// See [`Inbox`].
    pub fn new() -> Self {
        Self::default()
    }

    fn with_table(table: Table) -> Self {
        let t = table.quoted();
        Inbox {
            // Inserted, or an expired row renewed: New. A live row: Duplicate (no row back).
            // A concurrent uncommitted insert of the same message makes this wait for it.
            claim_sql: format!(
                "INSERT INTO {t} AS i (consumer, message_id, received_at, expires_at) \
                 VALUES ($1, $2, clock_timestamp(), clock_timestamp() + $3 * interval '1 microsecond') \
                 ON CONFLICT (consumer, message_id) DO UPDATE \
                   SET received_at = excluded.received_at, expires_at = excluded.expires_at \
                 WHERE i.expires_at <= excluded.received_at \
                 RETURNING true"
            ),
            purge_sql: format!(
                "WITH d AS ( \
                   DELETE FROM {t} WHERE (consumer, message_id) IN ( \
                     SELECT consumer, message_id FROM {t} WHERE expires_at <= clock_timestamp() \
                     ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED) \
                   RETURNING 1 \
                 ) SELECT count(*) FROM d"
            ),
            table,
            retention: Duration::from_secs(7 * 24 * 3600),
        }
    }

    /// Another schema (default `public`).
    ///
    /// # Errors
    ///
    /// [`NameError`] unless it is 1 to 30 of `a-z`, `0-9` and `_`, not starting with a digit.
    ///
    /// # Example
    ///
    /// ```
    /// let inbox = idemkit_postgres::Inbox::new().schema("billing")?.table("inbox")?;
    /// assert_eq!(inbox.name(), "billing.inbox");
    /// # Ok::<(), idemkit_postgres::NameError>(())
    /// ```
    pub fn schema(self, schema: &str) -> Result<Self, NameError> {
        let table = Table {
            schema: check("schema", schema)?,
            name: self.table.name,
        };
        Ok(Inbox {
            retention: self.retention,
            ..Inbox::with_table(table)
        })
    }

    /// Another table (default `idemkit_inbox`).
    ///
    /// # Errors
    ///
    /// [`NameError`] unless it is 1 to 30 of `a-z`, `0-9` and `_`, not starting with a digit.
    ///
    /// # Example
    ///
    /// See [`schema`](Inbox::schema).
    pub fn table(self, table: &str) -> Result<Self, NameError> {
        let table = Table {
            schema: self.table.schema,
            name: check("table", table)?,
        };
        Ok(Inbox {
            retention: self.retention,
            ..Inbox::with_table(table)
        })
    }

    /// How long a message's row is kept, exactly (default 7 days, at least 1 ms).
    ///
    /// # Example
    ///
    /// ```
    /// # use std::time::Duration;
    /// let inbox = idemkit_postgres::Inbox::new().retention(Duration::from_secs(86400));
    /// # drop(inbox);
    /// ```
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention
            .max(Duration::from_millis(1))
            .min(idemkit_core::Policy::MAX_DURATION);
        self
    }

    /// `schema.table`.
    ///
    /// # Example
    ///
    /// ```
    /// assert_eq!(idemkit_postgres::Inbox::new().name(), "public.idemkit_inbox");
    /// ```
    pub fn name(&self) -> String {
        self.table.to_string()
    }

    /// Creates the inbox table (and schema) if needed, from the SQL embedded in this crate
    /// (`migrations/inbox/`). Idempotent, safe to run from every replica.
    ///
    /// # Errors
    ///
    /// [`StoreError`] if the database refuses or cannot be reached.
    ///
    /// # Example
    ///
    /// See [`Inbox`].
    pub async fn migrate(&self, pool: &PgPool) -> Result<(), StoreError> {
        crate::migrate::apply(pool, &self.table, crate::migrate::INBOX)
            .await
            .map_err(|e| map_err(e, &self.table, MIGRATE))
    }

    /// Records `(consumer, message_id)` in the transaction `conn` is in and says whether it
    /// is new. Call it first in the handler's transaction, and run the database effects only
    /// for [`Seen::New`]; commit both together.
    ///
    /// `consumer` follows [`Operation`]'s rules (1 to 128 of `[A-Za-z0-9._/{}-]`), the
    /// message id [`Key`]'s (1 to 512 bytes of text without control characters); anything
    /// else is [`InboxError::InvalidId`] before anything is sent.
    ///
    /// # Errors
    ///
    /// [`InboxError`].
    ///
    /// # Example
    ///
    /// See [`Inbox`].
    pub async fn claim(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        message_id: &str,
    ) -> Result<Seen, InboxError> {
        let consumer = Operation::new(consumer)?;
        let message = Key::new(message_id)?;
        let row = sqlx::query(&self.claim_sql)
            .bind(consumer.as_str())
            .bind(message.as_str())
            .bind(i64::try_from(self.retention.as_micros()).unwrap_or(i64::MAX))
            .fetch_optional(conn)
            .await
            .map_err(|e| map_err(e, &self.table, MIGRATE))?;
        Ok(if row.is_some() {
            Seen::New
        } else {
            Seen::Duplicate
        })
    }

    /// Deletes rows past their retention, `batch` per statement, until none are left;
    /// returns how many.
    ///
    /// # Errors
    ///
    /// [`StoreError`] if the database cannot be reached.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn f(pool: sqlx::PgPool) -> Result<(), idemkit_core::StoreError> {
    /// let n = idemkit_postgres::Inbox::new().purge_expired(&pool, 1000).await?;
    /// # let _ = n; Ok(()) }
    /// ```
    pub async fn purge_expired(&self, pool: &PgPool, batch: u32) -> Result<u64, StoreError> {
        crate::store::purge_in_batches(pool, &self.purge_sql, batch)
            .await
            .map_err(|e| map_err(e, &self.table, MIGRATE))
    }

    /// Handles one delivery in the seed's order, the one that loses nothing:
    ///
    /// 1. in one transaction on `pool`: [`claim`](Inbox::claim) the message, and, if it is
    ///    new, run `database` (the handler's database effects) on that transaction;
    /// 2. commit (a duplicate's transaction has nothing to commit);
    /// 3. run the external effect through `external` (a call on the key of *that effect*,
    ///    `order-9.invoice`), on **every** delivery, duplicates included: if an earlier
    ///    delivery committed and died before its email, this one sends it; if it was sent,
    ///    the key replays it;
    /// 4. return: the caller acknowledges the message only now.
    ///
    /// Returning early on a duplicate (skipping step 3) is the trap this helper exists for:
    /// it loses the email whenever a delivery dies between its commit and its send.
    ///
    /// With the transactional call in place of the inbox the order is the same, in four
    /// lines of your own: begin a transaction, `call.in_transaction(&mut tx).run(..)`,
    /// commit, then the external effect's call (the crate's `consumer` example).
    ///
    /// # Errors
    ///
    /// [`DeliverError`]; its [`disposition`](DeliverError::disposition) says whether to
    /// retry or dead-letter. A failed database effect rolls its transaction back (the inbox
    /// row included) and skips the external effect.
    ///
    /// # Example
    ///
    /// ```no_run
    /// use idemkit_core::{Coordinator, Key, Operation};
    /// use idemkit_postgres::{Inbox, PgStore};
    ///
    /// # async fn f(pool: sqlx::PgPool, keys: Coordinator<PgStore>) -> Result<(), Box<dyn std::error::Error>> {
    /// let inbox = Inbox::new();
    /// let (mail, key) = (Operation::new("mail.invoice")?, Key::compose(["order-9", "invoice"])?);
    /// let done = inbox
    ///     .deliver(
    ///         &pool,
    ///         "billing",
    ///         "order-9.invoice",
    ///         |conn| Box::pin(async move {
    ///             sqlx::query("INSERT INTO ledger (order_id) VALUES ('order-9')")
    ///                 .execute(conn).await?;
    ///             Ok::<_, sqlx::Error>(())
    ///         }),
    ///         keys.call(&mail, &key),
    ///         |_attempt| async { Ok::<_, sqlx::Error>("em_1".to_string()) },
    ///     )
    ///     .await?;
    /// println!("first delivery: {}, email {}", done.seen == idemkit_postgres::Seen::New, done.external.value);
    /// # Ok(()) }
    /// ```
    #[allow(clippy::too_many_arguments)]
    pub async fn deliver<S, C, T, E, D, X, XFut>(
        &self,
        pool: &PgPool,
        consumer: &str,
        message_id: &str,
        database: D,
        external: Call<'_, S, C>,
        action: X,
    ) -> Result<Delivered<T>, DeliverError<E>>
    where
        S: Store,
        C: Codec<T>,
        D: for<'t> FnOnce(&'t mut PgConnection) -> TxFuture<'t, Result<(), E>>,
        X: FnOnce(Attempt) -> XFut,
        XFut: Future<Output = Result<T, E>>,
    {
        let seen = {
            let mut tx = pool
                .begin()
                .await
                .map_err(|e| InboxError::Store(map_err(e, &self.table, MIGRATE)))?;
            let seen = self.claim(&mut tx, consumer, message_id).await?;
            if seen == Seen::New {
                // An error drops `tx`: the inbox row and the effects roll back together.
                database(&mut tx).await.map_err(DeliverError::Database)?;
                tx.commit()
                    .await
                    .map_err(|e| InboxError::Store(map_err(e, &self.table, MIGRATE)))?;
            }
            seen
        };
        let external = external.run(action).await.map_err(DeliverError::External)?;
        Ok(Delivered::new(seen, external))
    }
}
