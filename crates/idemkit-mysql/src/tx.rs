//! The transactional call on MySQL and MariaDB: reserve through the store, run the action in
//! the caller's transaction, and complete in that same transaction, so that the database
//! effect and its idempotency record commit or roll back together.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use idemkit_core::__sql::{Slot, act, put, take};
use idemkit_core::inbox::TxFuture;
use idemkit_core::options::{OnActionError, ReleaseErrors};
use idemkit_core::{
    Attempt, Call, Codec, CompleteRequest, Completer, Error, JsonCodec, Ownership, Receipt,
    StorageKey, StoreError,
};
use sqlx::{Executor as _, MySql, MySqlConnection, Transaction};

use crate::MySqlStore;

/// The transactional option of a [`Call`] on a [`MySqlStore`]: `in_transaction` makes it a
/// [`TxCall`], whose action gets your transaction's connection. Set the call's other options
/// ([`store_errors`](Call::store_errors) included) first.
///
/// # Example
///
/// See [`TxCall`].
pub trait InTransaction<'a, C, P>: Sized {
    /// The call, to run inside `tx`.
    fn in_transaction<'c, 'x>(self, tx: &'c mut Transaction<'x, MySql>) -> TxCall<'a, 'c, C, P>;
}

impl<'a, C, P> InTransaction<'a, C, P> for Call<'a, MySqlStore, C, P> {
    fn in_transaction<'c, 'x>(self, tx: &'c mut Transaction<'x, MySql>) -> TxCall<'a, 'c, C, P> {
        TxCall {
            call: self,
            conn: tx,
        }
    }
}

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
///    with `Reject` it gets [`Error::InFlight`].
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
/// on it. Such a call fails with an `Unavailable` [`Error::Store`] in the begin phase once
/// the coordinator's [`store_timeout`](idemkit_core::Policy::store_timeout) passes, and its
/// action does not run. Do not read the records table in the transaction.
///
/// **When the call fails after the action ran** (the action's own error, or a completion
/// refused because the lease was lost, or a database failure), the action's writes are
/// rolled back and the transaction is left **read-only**: MySQL cannot make a transaction
/// fail its `COMMIT`, so the call sends `ROLLBACK` and `START TRANSACTION READ ONLY` on your
/// connection. Every later write in it fails (error 1792), and a `COMMIT` commits nothing:
/// an effect can never commit without its record. A replay, a rejection, a key reused for
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
#[must_use = "a call does nothing until `run` is awaited"]
pub struct TxCall<'a, 'c, C = JsonCodec, P = ReleaseErrors> {
    call: Call<'a, MySqlStore, C, P>,
    conn: &'c mut MySqlConnection,
}

impl<C: std::fmt::Debug, P> std::fmt::Debug for TxCall<'_, '_, C, P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TxCall")
            .field("call", &self.call)
            .finish_non_exhaustive()
    }
}

/// The completer that writes in the caller's transaction.
struct InTx<'s, 'c> {
    store: MySqlStore,
    slot: &'s Slot<'c, MySqlConnection>,
}

impl Completer for InTx<'_, '_> {
    async fn complete(
        &mut self,
        key: &StorageKey,
        ownership: &Ownership,
        request: &CompleteRequest,
    ) -> Result<(), StoreError> {
        let conn = take(self.slot);
        let done = self.store.complete_on(conn, key, ownership, request).await;
        put(self.slot, conn);
        done
    }
}

/// After the call: if the action ran and its effect must not commit (the call failed after
/// it), roll its writes back and leave the transaction read-only.
async fn settle<T, E>(
    slot: Slot<'_, MySqlConnection>,
    ran: &AtomicBool,
    result: Result<Receipt<T>, Error<E>>,
) -> Result<Receipt<T>, Error<E>> {
    let keep = matches!(result, Ok(_) | Err(Error::ActionStored(_)));
    if ran.load(Ordering::SeqCst)
        && !keep
        && let Some(conn) = slot.into_inner().unwrap_or_else(PoisonError::into_inner)
    {
        // Errors are ignored: a connection that cannot run these is lost, and its
        // transaction with it.
        let _ = conn.execute("ROLLBACK").await;
        let _ = conn.execute("START TRANSACTION READ ONLY").await;
    }
    result
}

impl<C, P> TxCall<'_, '_, C, P> {
    /// Runs the action in the transaction at most once for this key (across every
    /// transaction that commits), and stores its value in the same transaction; or replays
    /// the committed value. With [`store_errors`](Call::store_errors) set on the call, the
    /// permanent errors are stored in the transaction too.
    ///
    /// # Errors
    ///
    /// As [`Call::run`]; [`Error::Store`] with phase `Complete` when the result could not be
    /// written in the transaction (then the transaction is rolled back and read-only).
    ///
    /// # Example
    ///
    /// See [`TxCall`].
    pub async fn run<T, E, F>(self, action: F) -> Result<Receipt<T>, Error<E>>
    where
        C: Codec<T>,
        P: OnActionError<C, E>,
        F: for<'t> FnOnce(&'t mut MySqlConnection, Attempt) -> TxFuture<'t, Result<T, E>>,
    {
        let store = self.call.store().clone();
        let slot = Mutex::new(Some(self.conn));
        let ran = AtomicBool::new(false);
        let completer = InTx { store, slot: &slot };
        let result = self
            .call
            .completer(completer)
            .run(|attempt| act(&slot, &ran, action, attempt))
            .await;
        settle(slot, &ran, result).await
    }
}
