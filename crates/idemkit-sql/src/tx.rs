//! The transactional call, for any SQL store: reserve through the store, run the action in
//! the caller's transaction, and complete in that same transaction, so that the database
//! effect and its idempotency record commit or roll back together. Each store says how it
//! writes a completion on a given connection and how it makes a transaction unable to commit
//! an action whose call failed ([`Transactional`]); the order of the steps, and the
//! connection lent in turn to the action and the completion, are here once.

use std::future::Future;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use idemkit_core::options::{OnActionError, ReleaseErrors};
use idemkit_core::{
    Attempt, Call, Codec, CompleteRequest, Completer, Error, JsonCodec, Ownership, Phase, Receipt,
    StorageKey, Store, StoreError,
};

use crate::inbox::TxFuture;

/// Why a store refuses a transaction before anything is reserved.
#[derive(Debug)]
#[non_exhaustive]
pub enum Unfit {
    /// The transaction cannot hold the call (PostgreSQL: not READ COMMITTED).
    Config(&'static str),
    /// The check itself failed.
    Store(StoreError),
}

/// What a SQL store gives the transactional call.
pub trait Transactional: Store + Clone {
    /// The connection a transaction runs on.
    type Conn: Send;

    /// Checks, before anything is reserved, that the transaction can hold the call.
    fn check<'c>(
        &'c self,
        conn: &'c mut Self::Conn,
    ) -> impl Future<Output = Result<(), Unfit>> + Send + 'c;

    /// Writes the completion on `conn`, in its transaction, checking ownership as
    /// [`Store::complete`] does.
    fn complete_on<'c>(
        &'c self,
        conn: &'c mut Self::Conn,
        key: &'c StorageKey,
        ownership: &'c Ownership,
        request: &'c CompleteRequest,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'c;

    /// Leaves the transaction on `conn` unable to commit what the action wrote (PostgreSQL:
    /// a failed statement, so that a `COMMIT` rolls back; MySQL: `ROLLBACK` and a read-only
    /// transaction). Its errors are ignored: a connection that cannot run it is lost, and its
    /// transaction with it.
    fn spoil(conn: &mut Self::Conn) -> impl Future<Output = ()> + Send + '_;
}

/// The caller's connection, lent in turn to the action and to the completion. A loan comes
/// back when it is dropped, on every path: a completion the coordinator timed out (its
/// future dropped mid-statement) or an action that panicked gives the connection back, so
/// that the call can always spoil the transaction afterwards (review M4 of `e047556`: the
/// connection was taken out and put back by hand, and a dropped completion lost it, so a
/// failed call left the action's writes committable).
struct Lender<'c, Conn> {
    slot: Mutex<Option<&'c mut Conn>>,
}

/// One use of the lent connection; gives it back when dropped.
struct Lent<'l, 'c, Conn> {
    lender: &'l Lender<'c, Conn>,
    conn: Option<&'c mut Conn>,
}

impl<'c, Conn> Lender<'c, Conn> {
    fn new(conn: &'c mut Conn) -> Self {
        Lender {
            slot: Mutex::new(Some(conn)),
        }
    }

    fn lend(&self) -> Lent<'_, 'c, Conn> {
        let conn = self
            .slot
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .expect("the action and the completion use the connection in turn");
        Lent {
            lender: self,
            conn: Some(conn),
        }
    }

    fn into_inner(self) -> &'c mut Conn {
        self.slot
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner)
            .expect("every loan comes back when dropped")
    }
}

impl<Conn> Drop for Lent<'_, '_, Conn> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            *self
                .lender
                .slot
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(conn);
        }
    }
}

impl<Conn> Deref for Lent<'_, '_, Conn> {
    type Target = Conn;
    fn deref(&self) -> &Conn {
        self.conn.as_deref().expect("lent until dropped")
    }
}

impl<Conn> DerefMut for Lent<'_, '_, Conn> {
    fn deref_mut(&mut self) -> &mut Conn {
        self.conn.as_deref_mut().expect("lent until dropped")
    }
}

/// The transactional option of a [`Call`] on a SQL store: `in_transaction` makes it a
/// [`TxCall`], whose action gets your transaction's connection (give it `&mut tx`, a sqlx
/// `Transaction`). Set the call's other options ([`store_errors`](Call::store_errors)
/// included) first. Each SQL store re-exports it.
pub trait InTransaction<'a, S: Transactional, C, P>: Sized {
    /// The call, to run inside the transaction on `conn`.
    fn in_transaction<'c>(self, conn: &'c mut S::Conn) -> TxCall<'a, 'c, S, C, P>;
}

impl<'a, S: Transactional, C, P> InTransaction<'a, S, C, P> for Call<'a, S, C, P> {
    fn in_transaction<'c>(self, conn: &'c mut S::Conn) -> TxCall<'a, 'c, S, C, P> {
        TxCall::new(self, conn)
    }
}

/// A call whose action runs in the caller's transaction and whose result is stored in it.
/// Each SQL store names it for its own connection and documents what its database does
/// (`idemkit_postgres::TxCall`, `idemkit_mysql::TxCall`), and makes it with its
/// `InTransaction::in_transaction`.
#[must_use = "a call does nothing until `run` is awaited"]
pub struct TxCall<'a, 'c, S: Transactional, C = JsonCodec, P = ReleaseErrors> {
    call: Call<'a, S, C, P>,
    conn: &'c mut S::Conn,
}

impl<S: Transactional, C: std::fmt::Debug, P> std::fmt::Debug for TxCall<'_, '_, S, C, P>
where
    S: std::fmt::Debug,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TxCall")
            .field("call", &self.call)
            .finish_non_exhaustive()
    }
}

/// The completer that writes in the caller's transaction.
struct InTx<'l, 'c, S: Transactional> {
    store: S,
    lender: &'l Lender<'c, S::Conn>,
}

impl<S: Transactional> Completer for InTx<'_, '_, S> {
    async fn complete(
        &mut self,
        key: &StorageKey,
        ownership: &Ownership,
        request: &CompleteRequest,
    ) -> Result<(), StoreError> {
        let mut conn = self.lender.lend();
        self.store
            .complete_on(&mut conn, key, ownership, request)
            .await
    }
}

impl<'a, 'c, S: Transactional, C, P> TxCall<'a, 'c, S, C, P> {
    /// `call`, to run in the transaction on `conn`.
    pub fn new(call: Call<'a, S, C, P>, conn: &'c mut S::Conn) -> Self {
        TxCall { call, conn }
    }

    /// Runs the action in the transaction at most once for this key (across every
    /// transaction that commits), and stores its value in the same transaction; or replays
    /// the committed value. With [`store_errors`](Call::store_errors) set on the call, the
    /// permanent errors are stored in the transaction too.
    ///
    /// When the call fails after the action ran (the action's own error, a completion
    /// refused because the lease was lost, a completion that failed or timed out), the
    /// transaction is left unable to commit the action's writes before this returns, as the
    /// store's `TxCall` documents. A `run` future dropped before it returns cannot do that:
    /// roll the transaction back (drop it uncommitted).
    ///
    /// # Errors
    ///
    /// As [`Call::run`]; [`Error::Store`] with phase `Complete` when the result could not be
    /// written in the transaction; [`Error::Config`] when the store refuses the transaction
    /// (before anything is reserved).
    pub async fn run<T, E, F>(self, action: F) -> Result<Receipt<T>, Error<E>>
    where
        C: Codec<T>,
        P: OnActionError<C, E>,
        F: for<'t> FnOnce(&'t mut S::Conn, Attempt) -> TxFuture<'t, Result<T, E>>,
    {
        let store = self.call.store().clone();
        store.check(self.conn).await.map_err(|e| match e {
            Unfit::Config(reason) => Error::Config { reason },
            Unfit::Store(source) => Error::Store {
                phase: Phase::Begin,
                source,
            },
        })?;
        let lender = Lender::new(self.conn);
        // Whether the action ran: a failed call then holds its writes in the transaction.
        let ran = AtomicBool::new(false);
        let result = self
            .call
            .completer(InTx {
                store,
                lender: &lender,
            })
            .run(|attempt| async {
                ran.store(true, Ordering::SeqCst);
                let mut conn = lender.lend();
                action(&mut conn, attempt).await
            })
            .await;
        let keep = matches!(result, Ok(_) | Err(Error::ActionStored(_)));
        if ran.load(Ordering::SeqCst) && !keep {
            S::spoil(lender.into_inner()).await;
        }
        result
    }
}
