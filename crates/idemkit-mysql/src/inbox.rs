//! The transactional inbox on MySQL and MariaDB, and [`Inbox::deliver`]: the seed's order
//! of effects.

use std::future::Future;
use std::time::Duration;

use idemkit_core::{Attempt, Call, Codec, Key, Operation, Store, StoreError};
use idemkit_sql::{DeliverError, Delivered, InboxError, Seen, TxFuture};
use sqlx::{MySqlConnection, MySqlPool};

use crate::row::map_err;
use crate::sql::NOW;
use crate::store::{NameError, check_name};

/// The transactional inbox: one row per (consumer, claim), inserted in the handler's own
/// transaction, so it commits or rolls back with the handler's database effects. A
/// redelivered message finds the row and its effects committed.
///
/// **Claim the effect, not the message**: `order-9.invoice`, the identity of what the
/// message asks for, not its transport id (a producer that retries sends the same order as a
/// new message).
///
/// The claim is one `INSERT ... ON DUPLICATE KEY UPDATE`, a locking statement: InnoDB runs it
/// on the latest committed rows whatever the transaction's isolation level, so it behaves the
/// same under REPEATABLE READ (InnoDB's default), READ COMMITTED and SERIALIZABLE, and a read
/// the transaction made before it changes nothing. Concurrent deliveries of one message: the
/// second transaction's claim waits on the first's row lock, then sees [`Seen::Duplicate`]
/// if the first committed, or [`Seen::New`] if it rolled back. When several wait on one that
/// rolls back, InnoDB may end one of the waiters with a deadlock (its gap and insert-intention
/// locks): that claim fails with an `Unavailable` [`StoreError`] and **InnoDB has rolled back
/// its whole transaction**; drop the transaction and deliver again (the error's disposition
/// is a retry). A claim that waits longer than `innodb_lock_wait_timeout` fails the same way.
///
/// Rows are kept for the retention (default 7 days; pick it to outlive the latest
/// redelivery), after which a delivery counts as new again;
/// [`purge_expired`](Inbox::purge_expired) deletes them.
///
/// An inbox protects *database* effects only: give an external effect (an email) its own key
/// and run it after the commit on every delivery, duplicates included, as
/// [`deliver`](Inbox::deliver) does.
///
/// # Example
///
/// ```no_run
/// use idemkit_mysql::Inbox;
/// use idemkit_sql::Seen;
///
/// # async fn f(pool: sqlx::MySqlPool) -> Result<(), Box<dyn std::error::Error>> {
/// let inbox = Inbox::new();
/// inbox.migrate(&pool).await?;
/// let mut tx = pool.begin().await?;
/// if inbox.claim(&mut tx, "billing", "order-9.invoice").await? == Seen::New {
///     sqlx::query("INSERT INTO ledger (order_id) VALUES ('order-9')").execute(&mut *tx).await?;
/// }
/// tx.commit().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Inbox {
    table: String,
    retention: Duration,
    create: String,
    claim_sql: String,
    purge_sql: String,
}

impl Default for Inbox {
    fn default() -> Self {
        Inbox::with_table("idemkit_inbox".into(), Duration::from_secs(7 * 24 * 3600))
    }
}

const MIGRATE: &str = "Inbox::migrate(&pool)";

impl Inbox {
    /// The inbox in the table `idemkit_inbox` of the pool's database, rows kept 7 days.
    ///
    /// # Example
    ///
    /// See [`Inbox`].
    pub fn new() -> Self {
        Self::default()
    }

    fn with_table(table: String, retention: Duration) -> Self {
        let t = format!("`{table}`");
        Inbox {
            create: format!(
                "CREATE TABLE IF NOT EXISTS {t} ( \
                   consumer VARBINARY(128) NOT NULL, \
                   message_id VARBINARY(1024) NOT NULL, \
                   received_us BIGINT NOT NULL, \
                   expires_us BIGINT NOT NULL, \
                   PRIMARY KEY (consumer, message_id), \
                   INDEX expiry (expires_us) \
                 ) ENGINE = InnoDB"
            ),
            // Inserted, or an expired row renewed: the statement leaves LAST_INSERT_ID at 1
            // (New); a live row is left as it is and LAST_INSERT_ID at 0 (Duplicate). The
            // answer travels in the OK packet: one round trip. Binds: consumer, message,
            // retention in µs.
            claim_sql: format!(
                "INSERT INTO {t} (consumer, message_id, received_us, expires_us) \
                 SELECT ?, ?, n.now, n.now + ? + LAST_INSERT_ID(1) - 1 \
                 FROM (SELECT {NOW} AS now) AS n \
                 ON DUPLICATE KEY UPDATE \
                   received_us = IF({t}.expires_us <= VALUES(received_us), VALUES(received_us), \
                     {t}.received_us), \
                   expires_us = IF({t}.expires_us <= VALUES(received_us), \
                     VALUES(expires_us) + LAST_INSERT_ID(1) - 1, {t}.expires_us + LAST_INSERT_ID(0))"
            ),
            purge_sql: format!(
                "DELETE FROM {t} WHERE expires_us <= {NOW} ORDER BY expires_us LIMIT ?"
            ),
            table,
            retention,
        }
    }

    /// Another table (default `idemkit_inbox`), in the pool's database.
    ///
    /// # Errors
    ///
    /// [`NameError`] unless it is 1 to 48 of `a-z`, `0-9` and `_`, not starting with a digit.
    ///
    /// # Example
    ///
    /// ```
    /// let inbox = idemkit_mysql::Inbox::new().table("inbox")?;
    /// assert_eq!(inbox.name(), "inbox");
    /// # Ok::<(), idemkit_mysql::NameError>(())
    /// ```
    pub fn table(self, table: &str) -> Result<Self, NameError> {
        check_name(table)?;
        Ok(Inbox::with_table(table.into(), self.retention))
    }

    /// How long a message's row is kept, exactly (default 7 days, at least 1 ms).
    ///
    /// # Example
    ///
    /// ```
    /// # use std::time::Duration;
    /// let inbox = idemkit_mysql::Inbox::new().retention(Duration::from_secs(86400));
    /// # drop(inbox);
    /// ```
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention
            .max(Duration::from_millis(1))
            .min(idemkit_core::Policy::MAX_DURATION);
        self
    }

    /// The table's name.
    ///
    /// # Example
    ///
    /// ```
    /// assert_eq!(idemkit_mysql::Inbox::new().name(), "idemkit_inbox");
    /// ```
    pub fn name(&self) -> &str {
        &self.table
    }

    /// Creates the inbox table if it does not exist. Idempotent, safe to run from every
    /// replica.
    ///
    /// # Errors
    ///
    /// [`StoreError`] if the database refuses or cannot be reached.
    ///
    /// # Example
    ///
    /// See [`Inbox`].
    pub async fn migrate(&self, pool: &MySqlPool) -> Result<(), StoreError> {
        sqlx::query(&self.create)
            .execute(pool)
            .await
            .map(drop)
            .map_err(|e| self.err(e))
    }

    pub(crate) fn err(&self, e: sqlx::Error) -> StoreError {
        map_err(e, &self.table, MIGRATE)
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
    /// [`InboxError`]. An `Unavailable` store error (a deadlock, a lock wait timeout, a lost
    /// connection) may have rolled the whole transaction back: drop it and start again.
    ///
    /// # Example
    ///
    /// See [`Inbox`].
    pub async fn claim(
        &self,
        conn: &mut MySqlConnection,
        consumer: &str,
        message_id: &str,
    ) -> Result<Seen, InboxError> {
        let consumer = Operation::new(consumer)?;
        let message = Key::new(message_id)?;
        let done = sqlx::query(&self.claim_sql)
            .bind(consumer.as_str())
            .bind(message.as_str())
            .bind(i64::try_from(self.retention.as_micros()).unwrap_or(i64::MAX))
            .execute(conn)
            .await
            .map_err(|e| self.err(e))?;
        Ok(if done.last_insert_id() == 1 {
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
    /// # async fn f(pool: sqlx::MySqlPool) -> Result<(), idemkit_core::StoreError> {
    /// let n = idemkit_mysql::Inbox::new().purge_expired(&pool, 1000).await?;
    /// # let _ = n; Ok(()) }
    /// ```
    pub async fn purge_expired(&self, pool: &MySqlPool, batch: u32) -> Result<u64, StoreError> {
        let batch = u64::from(batch.max(1));
        let mut total = 0;
        loop {
            let n = sqlx::query(&self.purge_sql)
                .bind(batch)
                .execute(pool)
                .await
                .map_err(|e| self.err(e))?
                .rows_affected();
            total += n;
            if n < batch {
                return Ok(total);
            }
        }
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
    /// use idemkit_mysql::{Inbox, MySqlStore};
    ///
    /// # async fn f(pool: sqlx::MySqlPool, keys: Coordinator<MySqlStore>) -> Result<(), Box<dyn std::error::Error>> {
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
    /// println!("email {}", done.external.value);
    /// # Ok(()) }
    /// ```
    #[allow(clippy::too_many_arguments)]
    pub async fn deliver<S, C, T, E, D, X, XFut>(
        &self,
        pool: &MySqlPool,
        consumer: &str,
        message_id: &str,
        database: D,
        external: Call<'_, S, C>,
        action: X,
    ) -> Result<Delivered<T>, DeliverError<E>>
    where
        S: Store,
        C: Codec<T>,
        D: for<'t> FnOnce(&'t mut MySqlConnection) -> TxFuture<'t, Result<(), E>>,
        X: FnOnce(Attempt) -> XFut,
        XFut: Future<Output = Result<T, E>>,
    {
        let seen = {
            let mut tx = pool
                .begin()
                .await
                .map_err(|e| InboxError::Store(self.err(e)))?;
            let seen = self.claim(&mut tx, consumer, message_id).await?;
            if seen == Seen::New {
                // An error drops `tx`: the inbox row and the effects roll back together.
                database(&mut tx).await.map_err(DeliverError::Database)?;
                tx.commit()
                    .await
                    .map_err(|e| InboxError::Store(self.err(e)))?;
            }
            seen
        };
        let external = external.run(action).await.map_err(DeliverError::External)?;
        Ok(Delivered::new(seen, external))
    }
}
