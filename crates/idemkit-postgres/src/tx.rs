//! The transactional call: reserve through the store, run the action in the caller's
//! transaction, and complete in that same transaction, so that the database effect and its
//! idempotency record commit or roll back together.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use idemkit_core::__sql::{Slot, act, put, take};
use idemkit_core::options::{OnActionError, ReleaseErrors};
use idemkit_core::{
    Attempt, Call, Codec, CompleteRequest, Completer, Error, JsonCodec, Ownership, Phase, Receipt,
    StorageKey, StoreError,
};
use sqlx::{Executor as _, PgConnection, Postgres, Transaction};

use crate::PgStore;

pub use idemkit_core::inbox::TxFuture;

/// The transactional option of a [`Call`] on a [`PgStore`]: `in_transaction` makes it a
/// [`TxCall`], whose action gets your transaction's connection. Set the call's other options
/// ([`store_errors`](Call::store_errors) included) first.
///
/// # Example
///
/// See [`TxCall`].
pub trait InTransaction<'a, C, P>: Sized {
    /// The call, to run inside `tx`.
    fn in_transaction<'c, 'x>(self, tx: &'c mut Transaction<'x, Postgres>) -> TxCall<'a, 'c, C, P>;
}

impl<'a, C, P> InTransaction<'a, C, P> for Call<'a, PgStore, C, P> {
    fn in_transaction<'c, 'x>(self, tx: &'c mut Transaction<'x, Postgres>) -> TxCall<'a, 'c, C, P> {
        TxCall {
            call: self,
            conn: tx,
        }
    }
}

/// A call whose action runs in your transaction and whose result is stored in it: the
/// database effect and the idempotency record commit together or not at all. No crash
/// window for database effects: crash before the commit and neither exists (the
/// redelivery runs the action again); after it, both do (the redelivery replays).
///
/// How it runs, and what a concurrent duplicate sees:
///
/// 1. The key is reserved through the store's pool, outside your transaction, with the
///    usual lease (renewed while the action runs). A concurrent duplicate sees it in
///    flight: with [`InFlight::Wait`](idemkit_core::InFlight) it is woken when your
///    transaction commits (the notification is sent at commit) and replays the committed
///    result; with `Reject` it gets [`Error::InFlight`] with its retry hint.
/// 2. The action runs on your transaction's connection.
/// 3. The result is written in your transaction (owner-checked, like every completion).
///    Until your commit nobody else sees it: a duplicate still sees the reservation in
///    flight, and a waiter that flags the row now waits on your transaction's row lock,
///    until your commit (then it replays) or rollback.
/// 4. You commit. If you roll back instead (or crash), the reservation ends with its lease
///    and the next delivery runs the action again, in a new transaction.
///
/// Run it in a READ COMMITTED transaction (PostgreSQL's default): under REPEATABLE READ or
/// SERIALIZABLE the call is refused with [`Error::Config`] before anything is reserved.
///
/// When the call fails after the action ran (the action's own error, or a completion that
/// could not be written because the lease was lost or the database failed), the
/// transaction is poisoned: every later statement in it fails and a `COMMIT` rolls back, so
/// an effect can never commit without its record. A replay, a rejection, a key reused for
/// another request or a store failure before the action leave the transaction untouched.
///
/// It exists on a `Coordinator<PgStore>` only (not on `DynStore`): the record must live in
/// the database your transaction writes to, and the store's table must be reachable from
/// that transaction (same database; the store's pool and yours may differ).
///
/// Compose it with a separate key for an external effect (an email) by calling the
/// coordinator again *after* the commit, on every delivery: see the README's "Which
/// protection" table and [`Inbox::deliver`](crate::Inbox::deliver).
///
/// # Example
///
/// ```no_run
/// use idemkit_core::{Coordinator, Key, Operation};
/// use idemkit_postgres::{InTransaction, PgStore};
///
/// # async fn f(store: PgStore) -> Result<(), Box<dyn std::error::Error>> {
/// let c = Coordinator::new(store.clone());
/// let (op, key) = (Operation::new("ledger.credit")?, Key::new("order-9")?);
/// let mut tx = store.pool().begin().await?;
/// let receipt = c.call(&op, &key)
///     .in_transaction(&mut tx)
///     .run(|conn, _attempt| Box::pin(async move {
///         let id: i64 = sqlx::query_scalar("INSERT INTO ledger (order_id) VALUES ('order-9') RETURNING id")
///             .fetch_one(conn).await?;
///         Ok::<_, sqlx::Error>(id)
///     }))
///     .await?;
/// tx.commit().await?;
/// println!("ledger row {} ({:?})", receipt.value, receipt.source);
/// # Ok(()) }
/// ```
#[must_use = "a call does nothing until `run` is awaited"]
pub struct TxCall<'a, 'c, C = JsonCodec, P = ReleaseErrors> {
    call: Call<'a, PgStore, C, P>,
    conn: &'c mut PgConnection,
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
    store: PgStore,
    slot: &'s Slot<'c, PgConnection>,
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
/// it), make the transaction fail, so that a `COMMIT` rolls back.
async fn settle<T, E>(
    slot: Slot<'_, PgConnection>,
    ran: &AtomicBool,
    result: Result<Receipt<T>, Error<E>>,
) -> Result<Receipt<T>, Error<E>> {
    let keep = matches!(result, Ok(_) | Err(Error::ActionStored(_)));
    if ran.load(Ordering::SeqCst)
        && !keep
        && let Some(conn) = slot.into_inner().unwrap_or_else(PoisonError::into_inner)
    {
        // Fails by design; its error is the point.
        let _ = conn
            .execute(
                "DO $$ BEGIN RAISE EXCEPTION 'idemkit: the idempotent call failed after its \
                 action ran; this transaction must roll back'; END $$",
            )
            .await;
    }
    result
}

/// The transactional call reserves and renews through the store's pool, outside the
/// caller's transaction, and completes inside it: that needs each statement of the
/// transaction to see rows committed after the transaction began (READ COMMITTED). Under
/// REPEATABLE READ or SERIALIZABLE the completion cannot see its own reservation (or fails
/// with a serialization error after a renewal), so the call is refused before anything is
/// reserved. One statement, before the reservation.
async fn check_isolation<E>(conn: &mut PgConnection, store: &PgStore) -> Result<(), Error<E>> {
    let level: String = sqlx::query_scalar("SELECT current_setting('transaction_isolation')")
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| Error::Store {
            phase: Phase::Begin,
            source: store.err(e),
        })?;
    if level == "read committed" {
        Ok(())
    } else {
        Err(Error::Config {
            reason: "the transactional call needs a READ COMMITTED transaction (the reservation \
                     is committed outside it, and the completion in it must see it)",
        })
    }
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
    /// written in the transaction (then the transaction is poisoned: roll it back).
    ///
    /// # Example
    ///
    /// See [`TxCall`].
    pub async fn run<T, E, F>(self, action: F) -> Result<Receipt<T>, Error<E>>
    where
        C: Codec<T>,
        P: OnActionError<C, E>,
        F: for<'t> FnOnce(&'t mut PgConnection, Attempt) -> TxFuture<'t, Result<T, E>>,
    {
        let store = self.call.store().clone();
        check_isolation(self.conn, &store).await?;
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
