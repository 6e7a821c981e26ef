//! The type-state of a call's options: how the action's errors are treated, who stores the
//! result, and whether a batch's claim stands in for the first `begin`. A
//! [`Call`](super::Call) starts with [`ReleaseErrors`], [`StoreCompletes`] and [`NoBatch`];
//! [`Call::store_errors`](super::Call::store_errors),
//! [`Call::completer`](super::Call::completer) and [`Call::prepared`](super::Call::prepared)
//! change them. Name these types only to name a call's full type. Each option is a type so
//! that a call without it carries nothing for it (no field, no drop glue on the hot path).

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;

use super::batch::Prepared;
use crate::codec::Codec;
use crate::ident::StorageKey;
use crate::store::{BoxError, CompleteRequest, Ownership, Store, StoreError};

mod sealed {
    pub trait Sealed {}
}

/// What a call does with its action's error, given the call's codec: implemented by
/// [`ReleaseErrors`] and [`StoreErrors`] only.
pub trait OnActionError<C, E>: sealed::Sealed {
    /// `None`: release the key. `Some(Ok(bytes))`: store these bytes as a permanent error.
    #[doc(hidden)]
    fn encode(&self, codec: &C, error: &E) -> Option<Result<Vec<u8>, BoxError>>;
    /// Decodes a stored permanent error; `None` when this call cannot.
    #[doc(hidden)]
    fn decode(&self, codec: &C, bytes: &[u8]) -> Option<Result<E, BoxError>>;
}

/// The default: every action error releases the key, so the next delivery runs again.
///
/// # Example
///
/// ```
/// use idemkit_core::options::ReleaseErrors;
///
/// assert_eq!(format!("{ReleaseErrors:?}"), "ReleaseErrors");
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct ReleaseErrors;

impl sealed::Sealed for ReleaseErrors {}

impl<C, E> OnActionError<C, E> for ReleaseErrors {
    fn encode(&self, _: &C, _: &E) -> Option<Result<Vec<u8>, BoxError>> {
        None
    }
    fn decode(&self, _: &C, _: &[u8]) -> Option<Result<E, BoxError>> {
        None
    }
}

/// Set by [`Call::store_errors`](super::Call::store_errors): the errors its predicate calls
/// permanent are stored with the call's codec and replayed.
///
/// # Example
///
/// See [`Call::store_errors`](super::Call::store_errors).
pub struct StoreErrors<Q, E> {
    pub(super) is_permanent: Q,
    pub(super) error: PhantomData<fn(&E) -> bool>,
}

impl<Q, E> fmt::Debug for StoreErrors<Q, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreErrors").finish_non_exhaustive()
    }
}

impl<Q, E> sealed::Sealed for StoreErrors<Q, E> {}

impl<C: Codec<E>, E, Q: Fn(&E) -> bool> OnActionError<C, E> for StoreErrors<Q, E> {
    fn encode(&self, codec: &C, error: &E) -> Option<Result<Vec<u8>, BoxError>> {
        (self.is_permanent)(error).then(|| codec.encode(error))
    }
    fn decode(&self, codec: &C, bytes: &[u8]) -> Option<Result<E, BoxError>> {
        Some(codec.decode(bytes))
    }
}

/// Stores a call's result in place of [`Store::complete`](crate::store::Store::complete):
/// for a store that can write the completion inside the caller's own transaction, so that
/// the record and the action's database effect commit or roll back together
/// (idemkit-postgres's transactional call).
///
/// Set with [`Call::completer`](super::Call::completer). The reservation is made and renewed
/// through the store as usual (so a concurrent duplicate sees it in flight); once the action
/// has returned, renewals stop and `complete` is called once (no retries: a failed
/// statement ends a transaction). A failed completion fails the call with
/// [`Error::Store`](crate::Error::Store) (phase `Complete`): the completer's side must then
/// not commit the effect. A call dropped during the action leaves its reservation to its
/// lease (or releases it, under [`OnCancel::Release`](crate::OnCancel::Release)); one
/// dropped during the completion leaves it to the completer's transaction (committed:
/// completed; rolled back: the reservation ends with its lease).
///
/// # Example
///
/// ```
/// use idemkit_core::*;
///
/// /// Completes through the store itself: what a call does by default, without its retries.
/// struct Direct(MemoryStore);
///
/// impl Completer for Direct {
///     async fn complete(&mut self, key: &StorageKey, ownership: &Ownership,
///         request: &CompleteRequest) -> Result<(), StoreError> {
///         self.0.complete(key, ownership, request).await
///     }
/// }
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
/// let store = MemoryStore::new();
/// let c = Coordinator::new(store.clone());
/// let (op, key) = (Operation::new("op")?, Key::new("k")?);
/// let out = c.call(&op, &key)
///     .completer(Direct(store))
///     .run(|_| async { Ok::<_, std::io::Error>(7) })
///     .await?;
/// assert_eq!(out.source, Source::Fresh);
/// let again = c.call(&op, &key).run(|_| async { Ok::<_, std::io::Error>(8) }).await?;
/// assert_eq!(again.value, 7);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait Completer: Send {
    /// Store `request` for `ownership`, checking (as
    /// [`Store::complete`](crate::store::Store::complete) does) that it still owns a live
    /// reservation.
    fn complete(
        &mut self,
        key: &StorageKey,
        ownership: &Ownership,
        request: &CompleteRequest,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// The default completer: the store completes (with retries while the lease lasts). It has
/// no value: a call that keeps it holds none.
///
/// # Example
///
/// ```
/// use idemkit_core::{Call, MemoryStore, JsonCodec};
/// use idemkit_core::options::{NoBatch, ReleaseErrors, StoreCompletes};
///
/// // A call's full type, with its default options spelled out.
/// type Plain<'a> = Call<'a, MemoryStore, JsonCodec, ReleaseErrors, StoreCompletes, NoBatch>;
/// ```
#[derive(Debug)]
pub enum StoreCompletes {}

impl Completer for StoreCompletes {
    async fn complete(
        &mut self,
        _: &StorageKey,
        _: &Ownership,
        _: &CompleteRequest,
    ) -> Result<(), StoreError> {
        match *self {}
    }
}

/// Whether a call has a batch's claim: [`NoBatch`] or [`FromBatch`] only.
pub trait Batch<S: Store>: sealed::Sealed {
    /// The claim, once.
    #[doc(hidden)]
    fn take(&mut self) -> Option<Prepared<S>>;
}

/// The default: the call sends its own first `begin`.
///
/// # Example
///
/// See [`StoreCompletes`].
#[derive(Debug, Clone, Copy, Default)]
pub struct NoBatch;

impl sealed::Sealed for NoBatch {}

impl<S: Store> Batch<S> for NoBatch {
    #[inline]
    fn take(&mut self) -> Option<Prepared<S>> {
        None
    }
}

/// Set by [`Call::prepared`](super::Call::prepared): a claim from
/// [`Coordinator::prepare`](super::Coordinator::prepare) stands in for the call's first
/// `begin`.
///
/// # Example
///
/// See [`Coordinator::prepare`](super::Coordinator::prepare).
#[derive(Debug)]
pub struct FromBatch<S: Store>(pub(super) Option<Prepared<S>>);

impl<S: Store> sealed::Sealed for FromBatch<S> {}

impl<S: Store> Batch<S> for FromBatch<S> {
    fn take(&mut self) -> Option<Prepared<S>> {
        self.0.take()
    }
}
