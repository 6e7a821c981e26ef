//! The transactional call on PostgreSQL: reserve through the store, run the action in the
//! caller's transaction, and complete in that same transaction, so that the database effect
//! and its idempotency record commit or roll back together. The call itself is
//! `idemkit-sql`'s, shared with MySQL; this is PostgreSQL's side of it.

use idemkit_core::options::ReleaseErrors;
use idemkit_core::{CompleteRequest, JsonCodec, Ownership, StorageKey, StoreError};
pub use idemkit_sql::InTransaction;
use idemkit_sql::{Transactional, Unfit};
use sqlx::{Executor as _, PgConnection};

use crate::PgStore;

pub use idemkit_sql::TxFuture;

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
///    result; with `Reject` it gets [`Error::InFlight`](idemkit_core::Error::InFlight) with its retry hint.
/// 2. The action runs on your transaction's connection.
/// 3. The result is written in your transaction (owner-checked, like every completion).
///    Until your commit nobody else sees it: a duplicate still sees the reservation in
///    flight, and a waiter that flags the row now waits on your transaction's row lock,
///    until your commit (then it replays) or rollback.
/// 4. You commit. If you roll back instead (or crash), the reservation ends with its lease
///    and the next delivery runs the action again, in a new transaction.
///
/// Run it in a READ COMMITTED transaction (PostgreSQL's default): under REPEATABLE READ or
/// SERIALIZABLE the call is refused with [`Error::Config`](idemkit_core::Error::Config) before anything is reserved.
///
/// When the call fails after the action ran (the action's own error, or a completion that
/// could not be written because the lease was lost, the database failed or the completion
/// timed out), the transaction is poisoned before `run` returns: every later statement in
/// it fails and a `COMMIT` rolls back, so an effect can never commit without its record. A
/// `run` future dropped before it returns (a `timeout` around it) cannot do that: roll the
/// transaction back (drop it uncommitted). A replay, a rejection, a key reused for
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
pub type TxCall<'a, 'c, C = JsonCodec, P = ReleaseErrors> =
    idemkit_sql::TxCall<'a, 'c, PgStore, C, P>;

impl Transactional for PgStore {
    type Conn = PgConnection;

    /// The transactional call reserves and renews through the store's pool, outside the
    /// caller's transaction, and completes inside it: that needs each statement of the
    /// transaction to see rows committed after the transaction began (READ COMMITTED). Under
    /// REPEATABLE READ or SERIALIZABLE the completion cannot see its own reservation (or
    /// fails with a serialization error after a renewal), so the call is refused before
    /// anything is reserved. One statement, before the reservation.
    async fn check<'c>(&'c self, conn: &'c mut PgConnection) -> Result<(), Unfit> {
        let level: String = sqlx::query_scalar("SELECT current_setting('transaction_isolation')")
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| Unfit::Store(self.err(e)))?;
        if level == "read committed" {
            Ok(())
        } else {
            Err(Unfit::Config(
                "the transactional call needs a READ COMMITTED transaction (the reservation \
                 is committed outside it, and the completion in it must see it)",
            ))
        }
    }

    async fn complete_on<'c>(
        &'c self,
        conn: &'c mut PgConnection,
        key: &'c StorageKey,
        ownership: &'c Ownership,
        request: &'c CompleteRequest,
    ) -> Result<(), StoreError> {
        PgStore::complete_on(self, conn, key, ownership, request).await
    }

    /// Makes the transaction fail, so that a `COMMIT` rolls back.
    async fn spoil(conn: &mut PgConnection) {
        // Fails by design; its error is the point.
        let _ = conn
            .execute(
                "DO $$ BEGIN RAISE EXCEPTION 'idemkit: the idempotent call failed after its \
                 action ran; this transaction must roll back'; END $$",
            )
            .await;
    }
}
