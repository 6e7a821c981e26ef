//! The transactional call on MySQL and MariaDB: reserve through the store, run the action in
//! the caller's transaction, and complete in that same transaction, so that the database
//! effect and its idempotency record commit or roll back together. The call itself is
//! `idemkit-sql`'s, shared with PostgreSQL; this is MySQL's side of it.

use idemkit_core::options::ReleaseErrors;
use idemkit_core::{CompleteRequest, JsonCodec, Ownership, StorageKey, StoreError};
pub use idemkit_sql::InTransaction;
use idemkit_sql::{Transactional, Unfit};
use sqlx::{Executor as _, MySqlConnection};

use crate::MySqlStore;

/// A call whose action runs in your transaction and whose result is stored in it: the
/// database effect and the idempotency record commit together or not at all. Crash before
/// the commit and neither exists (the redelivery runs the action again); after it, both do
/// (the redelivery replays).
///
/// How it runs, and what a concurrent duplicate sees:
///
/// 1. The key is reserved through the store's pool, outside your transaction, with the
///    usual lease (renewed while the action runs). A concurrent duplicate sees it in
///    flight: with [`InFlight::Wait`](idemkit_core::InFlight) it re-reads the row (MySQL
///    has no notifications) and replays the committed result once your transaction commits;
///    with `Reject` it gets [`Error::InFlight`](idemkit_core::Error::InFlight).
/// 2. The action runs on your transaction's connection.
/// 3. The result is written in your transaction by one owner-checked `UPDATE`. Until your
///    commit nobody else sees it: a waiter still reads the reservation, and a duplicate's
///    `begin` waits on the row lock until your commit (then it replays) or rollback (then it
///    finds the reservation in flight, until its lease ends).
/// 4. You commit. If you roll back instead (or crash), the reservation ends with its lease
///    and the next delivery runs the action again, in a new transaction.
///
/// **Isolation.** Unlike PostgreSQL, any isolation level works, REPEATABLE READ (InnoDB's
/// default) included: the completion is a locking `UPDATE`, which InnoDB runs on the latest
/// committed row, so it sees the reservation and its renewals committed outside your
/// transaction even when your transaction's snapshot is older. Your action's own plain
/// `SELECT`s still read that snapshot.
///
/// **Locks on the records table.** The reservation is made outside your transaction, so it
/// waits on any lock your transaction holds on the records table: a read of it under
/// SERIALIZABLE (shared next-key locks), a `SELECT ... FOR UPDATE` or `LOCK IN SHARE MODE`
/// on it. Such a call fails with an `Unavailable` [`Error::Store`](idemkit_core::Error::Store) in the begin phase once
/// the coordinator's [`store_timeout`](idemkit_core::Policy::store_timeout) passes, and its
/// action does not run. Do not read the records table in the transaction.
///
/// **When the call fails after the action ran** (the action's own error, or a completion
/// refused because the lease was lost, a database failure or a completion that timed out),
/// your **whole transaction** is rolled back (what you wrote before the call too) and left
/// **read-only** before `run` returns: MySQL cannot make a transaction fail its `COMMIT`, so
/// the call sends `ROLLBACK` and `START TRANSACTION READ ONLY` on your connection. Every
/// later write in it fails (error 1792), and a `COMMIT` commits nothing: an effect can never
/// commit without its record. A `run` future dropped before it returns (a `timeout` around
/// it) cannot do that: roll the transaction back (drop it uncommitted). Do not make the call
/// in a nested transaction (a savepoint): the `ROLLBACK` ends the outer one. A replay, a rejection, a key reused for
/// another request or a store failure before the action leave the transaction untouched.
///
/// It exists on a `Coordinator<MySqlStore>` only: the store's table must be in the database
/// your transaction writes to.
///
/// # Example
///
/// ```no_run
/// use idemkit_core::{Coordinator, Key, Operation};
/// use idemkit_mysql::{InTransaction, MySqlStore};
///
/// # async fn f(store: MySqlStore) -> Result<(), Box<dyn std::error::Error>> {
/// let c = Coordinator::new(store.clone());
/// let (op, key) = (Operation::new("ledger.credit")?, Key::new("order-9")?);
/// let mut tx = store.pool().begin().await?;
/// let receipt = c.call(&op, &key)
///     .in_transaction(&mut tx)
///     .run(|conn, _attempt| Box::pin(async move {
///         let done = sqlx::query("INSERT INTO ledger (order_id) VALUES ('order-9')")
///             .execute(conn).await?;
///         Ok::<_, sqlx::Error>(done.last_insert_id())
///     }))
///     .await?;
/// tx.commit().await?;
/// println!("ledger row {} ({:?})", receipt.value, receipt.source);
/// # Ok(()) }
/// ```
pub type TxCall<'a, 'c, C = JsonCodec, P = ReleaseErrors> =
    idemkit_sql::TxCall<'a, 'c, MySqlStore, C, P>;

impl Transactional for MySqlStore {
    type Conn = MySqlConnection;

    /// Any isolation level works (see [`TxCall`]): nothing to check.
    async fn check<'c>(&'c self, _conn: &'c mut MySqlConnection) -> Result<(), Unfit> {
        Ok(())
    }

    async fn complete_on<'c>(
        &'c self,
        conn: &'c mut MySqlConnection,
        key: &'c StorageKey,
        ownership: &'c Ownership,
        request: &'c CompleteRequest,
    ) -> Result<(), StoreError> {
        MySqlStore::complete_on(self, conn, key, ownership, request).await
    }

    /// Rolls the action's writes back and leaves the transaction read-only.
    async fn spoil(conn: &mut MySqlConnection) {
        let _ = conn.execute("ROLLBACK").await;
        let _ = conn.execute("START TRANSACTION READ ONLY").await;
    }
}
