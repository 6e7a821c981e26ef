//! The store contract: one atomic call per phase of the state machine.
//!
//! ```text
//!                begin                     complete(owner)
//!   absent ───────────────▶ reserved ─────────────────────▶ completed ──(ttl)──▶ absent
//!     ▲                      │  │ ▲                                   
//!     │     release(owner)   │  │ │ renew(owner)                    
//!     └──────────────────────┘  └─┘                                 
//!     ▲                      │
//!     └──(lease expires)─────┘   a later begin takes the key over with a higher fencing token
//! ```
//!
//! Stores make each transition atomic and hold no policy: they never decide whether to wait,
//! reject, run unprotected or store an error. That is the [`Coordinator`](crate::Coordinator)'s
//! job. Every write after `begin` carries the owner's [`Ownership`] (its owner token and
//! fencing token) and succeeds only while that owner still holds the key, so a stale owner can never extend, overwrite or delete its
//! successor's reservation or result. Expiry is decided by the store's own clock.

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;

use crate::ident::StorageKey;
use crate::record::{FencingToken, Record};

mod error;
mod request;

pub use error::{BoxError, StoreError, StoreErrorKind};
pub use request::{BeginRequest, Claim, CompleteRequest, Ownership, Replay, Reservation};

/// A backend that keeps idempotency records. One call per phase, each atomic in the store.
///
/// Handles are cheap to clone (a connection pool, an `Arc`): the coordinator clones one into
/// a background task when it must finish a reservation after its caller has gone (a dropped
/// call's completion, a lost `begin`'s reservation).
///
/// Implementations must pass the conformance suite in `idemkit-test`.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use idemkit_core::*;
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
/// let store = MemoryStore::new();
/// let key = StorageKey::new(&Operation::new("op")?, None, &Key::new("k")?);
/// let Claim::Reserved { ownership, .. } =
///     store.begin(&BeginRequest::new(&key, OwnerToken::random(), Duration::from_secs(15))).await?
/// else { unreachable!() };
/// store.complete(&key, &ownership, &CompleteRequest::new(ResultKind::Value, "1", Duration::from_secs(60))).await?;
/// let again = BeginRequest::new(&key, OwnerToken::random(), Duration::from_secs(15));
/// assert!(matches!(store.begin(&again).await?, Claim::Replay(_)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait Store: Clone + Send + Sync + 'static {
    /// The longest lease or TTL this store can keep. The coordinator clamps every duration it
    /// sends to it (and to [`Policy::MAX_DURATION`](crate::Policy::MAX_DURATION)), so a store
    /// never sees a duration it cannot represent. Default: 100 years.
    fn max_ttl(&self) -> Duration {
        crate::policy::Policy::MAX_DURATION
    }

    /// How long one call of this store can take at most, if the store enforces a limit
    /// itself (a response timeout; for `wait`, on top of its `timeout`). The coordinator
    /// bounds every store call by its policy's `store_timeout` (renewals by a third of the
    /// lease); when the store's own limit is within that, it skips its timer, which saves
    /// a timer per call. `complete` is timed whatever the store declares: a completion
    /// that never answers would otherwise hold its caller and its key for good. Default
    /// `None`: no limit of its own, the coordinator times every call that does not answer
    /// at once.
    fn call_timeout(&self) -> Option<Duration> {
        None
    }

    /// Whether [`complete`](Store::complete) makes use of a [`CompleteRequest::reservation`]
    /// (see [`Reservation`]): the coordinator attaches one only for a store that says so, so
    /// that the others do not pay for it. Default: no.
    fn uses_reservation(&self) -> bool {
        false
    }

    /// Reserve the key for `req.lease`, or return the completed record, or report the live
    /// owner, or report a fingerprint mismatch; atomically. An expired reservation or record
    /// counts as absent. A new reservation's fencing token is greater than every earlier one
    /// of this key. A live reservation held by `req.owner` with the same fingerprint is
    /// returned as `Reserved` with its existing fencing token, and its lease is extended to
    /// `req.lease` from now, as [`renew`](Store::renew) would: a `begin` whose reply was lost
    /// and that is sent again must not make its caller wait on its own reservation, and a
    /// claim confirmed late (a batch's, [`begin_many`](Store::begin_many)) must run on a
    /// lease that starts when its caller thinks it does.
    fn begin(
        &self,
        req: &BeginRequest<'_>,
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send;

    /// [`begin`](Store::begin) for several keys at once: the claim of each request, in the
    /// order given, each exactly what `begin` would have answered for it alone. The keys must
    /// be distinct (the coordinator never sends one twice in a batch). Stores that can do it
    /// in one round trip override this (Redis: one script call per slot; PostgreSQL: one
    /// statement); the default sends one `begin` after the other.
    ///
    /// # Example
    ///
    /// ```
    /// use std::time::Duration;
    /// use idemkit_core::{BeginRequest, Claim, Key, MemoryStore, Operation, OwnerToken, StorageKey, Store};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
    /// let store = MemoryStore::new();
    /// let op = Operation::new("op")?;
    /// let keys = [StorageKey::new(&op, None, &Key::new("a")?), StorageKey::new(&op, None, &Key::new("b")?)];
    /// let reqs: Vec<_> = keys.iter().map(|k| BeginRequest::new(k, OwnerToken::random(), Duration::from_secs(15))).collect();
    /// let claims = store.begin_many(&reqs).await;
    /// assert!(claims.iter().all(|c| matches!(c, Ok(Claim::Reserved { .. }))));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn begin_many(
        &self,
        reqs: &[BeginRequest<'_>],
    ) -> impl Future<Output = Vec<Result<Claim, StoreError>>> + Send {
        async move {
            let mut claims = Vec::with_capacity(reqs.len());
            for req in reqs {
                claims.push(self.begin(req).await);
            }
            claims
        }
    }

    /// Extend the lease to `lease` from now, only if `ownership` (owner token *and* fencing
    /// token) still owns a live reservation; otherwise [`StoreErrorKind::LeaseLost`] and
    /// nothing changes. If `ownership` has already completed the key (a renewal that
    /// crossed its own completion), succeed and change nothing: the lease was not lost.
    fn renew(
        &self,
        key: &StorageKey,
        ownership: &Ownership,
        lease: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Replace the reservation with a completed record kept for `request.ttl`, only if
    /// `ownership` (owner token and fencing token) still owns a live reservation; otherwise [`StoreErrorKind::LeaseLost`] and
    /// nothing changes. Completing again with the same ownership is a no-op success, so a retried
    /// completion is harmless. Wakes waiters.
    fn complete(
        &self,
        key: &StorageKey,
        ownership: &Ownership,
        request: &CompleteRequest,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Delete the reservation, only if `ownership` (owner token and fencing token) still owns a
    /// live one; otherwise
    /// [`StoreErrorKind::LeaseLost`] and nothing changes. Wakes waiters.
    fn release(
        &self,
        key: &StorageKey,
        ownership: &Ownership,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Resolve when the reservation with fencing token `seen` is no longer the live state of
    /// the key (completed, released, expired, taken over), or after `timeout`, whichever is
    /// first. Returns at once if it already changed. Push-based where the store can notify;
    /// a spurious early return is allowed (the caller calls `begin` again).
    fn wait(
        &self,
        key: &StorageKey,
        seen: FencingToken,
        timeout: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The live record under the key, for inspection; `None` when absent or expired.
    fn get(
        &self,
        key: &StorageKey,
    ) -> impl Future<Output = Result<Option<Record>, StoreError>> + Send;
}

/// Raw access to the bytes under a key: for tests (corrupted or foreign records) and for
/// operators' tools. Not used by the coordinator.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use idemkit_core::*;
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
/// let store = MemoryStore::new();
/// let key = StorageKey::new(&Operation::new("op")?, None, &Key::new("k")?);
/// store.put_raw(&key, b"not a record".as_slice().into(), Duration::from_secs(60)).await?;
/// let err = store.get(&key).await.unwrap_err();
/// assert_eq!(err.kind(), StoreErrorKind::Corrupt);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait RawStore: Store {
    /// Write `bytes` under the key as they are, replacing whatever is there, kept for `ttl`.
    ///
    /// A store may refuse, with [`StoreErrorKind::Rejected`], a record it could not honour
    /// (MySQL: a fencing token above 2^62 - 1), leaving the key as it was.
    fn put_raw(
        &self,
        key: &StorageKey,
        bytes: Bytes,
        ttl: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Delete whatever is under the key, whoever owns it. For operators only: this is the
    /// one way around the owner check.
    fn purge(&self, key: &StorageKey) -> impl Future<Output = Result<bool, StoreError>> + Send;
}
