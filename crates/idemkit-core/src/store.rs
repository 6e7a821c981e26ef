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

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::time::Duration;

use bytes::Bytes;

use crate::record::{FencingToken, OwnerToken, Record, ResultKind, StoredResult};
use crate::{Fingerprint, StorageKey};

/// A boxed error from a backend or a codec, kept opaque so that core names no backend type.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// What [`Store::begin`] asks for.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use idemkit_core::{BeginRequest, Key, Operation, OwnerToken, StorageKey};
///
/// let key = StorageKey::new(&Operation::new("op")?, None, &Key::new("k")?);
/// let req = BeginRequest::new(&key, OwnerToken::random(), Duration::from_secs(15));
/// assert_eq!(req.lease, Duration::from_secs(15));
/// # Ok::<(), idemkit_core::KeyError>(())
/// ```
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct BeginRequest<'a> {
    /// The record's key.
    pub key: &'a StorageKey,
    /// The token the caller will prove ownership with.
    pub owner: OwnerToken,
    /// How long the reservation holds without renewal.
    pub lease: Duration,
    /// The request's fingerprint; compared exactly (absent counts as a value) with the stored one.
    pub fingerprint: Option<Fingerprint>,
}

impl<'a> BeginRequest<'a> {
    /// A request without a fingerprint.
    ///
    /// # Example
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use idemkit_core::{BeginRequest, Key, Operation, OwnerToken, StorageKey};
    /// # let key = StorageKey::new(&Operation::new("op")?, None, &Key::new("k")?);
    /// let req = BeginRequest::new(&key, OwnerToken::random(), Duration::from_secs(1));
    /// assert!(req.fingerprint.is_none());
    /// # Ok::<(), idemkit_core::KeyError>(())
    /// ```
    pub fn new(key: &'a StorageKey, owner: OwnerToken, lease: Duration) -> Self {
        BeginRequest {
            key,
            owner,
            lease,
            fingerprint: None,
        }
    }

    /// Sets the fingerprint.
    ///
    /// # Example
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use idemkit_core::{BeginRequest, Fingerprint, Key, Operation, OwnerToken, StorageKey};
    /// # let key = StorageKey::new(&Operation::new("op")?, None, &Key::new("k")?);
    /// let req = BeginRequest::new(&key, OwnerToken::random(), Duration::from_secs(1))
    ///     .with_fingerprint(Some(Fingerprint::of(b"body")));
    /// assert!(req.fingerprint.is_some());
    /// # Ok::<(), idemkit_core::KeyError>(())
    /// ```
    pub fn with_fingerprint(mut self, fingerprint: Option<Fingerprint>) -> Self {
        self.fingerprint = fingerprint;
        self
    }
}

/// The proof that a caller holds a reservation: its owner token and the reservation's fencing
/// token, both checked by every write. (The *lease* is how long the reservation lasts without
/// renewal: a [`Duration`].)
///
/// # Example
///
/// ```
/// use idemkit_core::{FencingToken, Ownership, OwnerToken};
///
/// let ownership = Ownership::new(OwnerToken::from_u128(1), FencingToken::new(7));
/// assert_eq!(ownership.fencing.get(), 7);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Ownership {
    /// The owner's token.
    pub owner: OwnerToken,
    /// The reservation's fencing token.
    pub fencing: FencingToken,
}

impl Ownership {
    /// Builds one (stores do, when `begin` reserves).
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::{FencingToken, Ownership, OwnerToken};
    /// let _ = Ownership::new(OwnerToken::random(), FencingToken::new(1));
    /// ```
    pub fn new(owner: OwnerToken, fencing: FencingToken) -> Self {
        Ownership { owner, fencing }
    }
}

/// A completed record as `begin` returns it for replay.
///
/// # Example
///
/// ```
/// use idemkit_core::{Replay, FencingToken, ResultKind, StoredResult};
///
/// let c = Replay::new(FencingToken::new(1), StoredResult::new(ResultKind::Value, "1"));
/// assert_eq!(c.outcome.kind(), ResultKind::Value);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Replay {
    /// The fencing token of the reservation that completed.
    pub fencing: FencingToken,
    /// What it stored.
    pub outcome: StoredResult,
}

impl Replay {
    /// Builds one.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::{Replay, FencingToken, ResultKind, StoredResult};
    /// let _ = Replay::new(FencingToken::new(1), StoredResult::new(ResultKind::Value, ""));
    /// ```
    pub fn new(fencing: FencingToken, outcome: StoredResult) -> Self {
        Replay { fencing, outcome }
    }
}

/// The answer of [`Store::begin`].
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use idemkit_core::{Claim, BeginRequest, Key, MemoryStore, Operation, OwnerToken, StorageKey, Store};
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
/// let store = MemoryStore::new();
/// let key = StorageKey::new(&Operation::new("op")?, None, &Key::new("k")?);
/// let req = BeginRequest::new(&key, OwnerToken::random(), Duration::from_secs(15));
/// assert!(matches!(store.begin(&req).await?, Claim::Reserved { .. }));
/// let other = BeginRequest::new(&key, OwnerToken::random(), Duration::from_secs(15));
/// assert!(matches!(store.begin(&other).await?, Claim::InFlight { .. }));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Claim {
    /// The caller now owns the key.
    Reserved {
        /// The caller's proof of ownership (owner token and fencing token).
        ownership: Ownership,
        /// Whether this took over a reservation whose lease had expired (its owner died or
        /// stalled past its lease).
        took_over: bool,
    },
    /// The key was completed; here is what to replay.
    Replay(Replay),
    /// Another owner holds a live lease.
    InFlight {
        /// Time left on that lease, by the store's clock.
        retry_after: Duration,
        /// That reservation's fencing token, for [`Store::wait`].
        fencing: FencingToken,
        /// How long that owner has held the key, by the store's clock, if the store knows.
        held_for: Option<Duration>,
    },
    /// The key is in use (reserved or completed) with a different fingerprint.
    Mismatch,
}

/// What [`Store::complete`] writes.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use idemkit_core::{CompleteRequest, ResultKind};
///
/// let c = CompleteRequest::new(ResultKind::Value, "\"em_1\"", Duration::from_millis(1500));
/// assert_eq!(c.ttl, Duration::from_millis(1500));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CompleteRequest {
    /// What kind of outcome.
    pub kind: ResultKind,
    /// The encoded outcome.
    pub bytes: Bytes,
    /// How long to keep the completed record, exactly (stores round up only to their own
    /// resolution: milliseconds for Redis).
    pub ttl: Duration,
}

impl CompleteRequest {
    /// Builds one.
    ///
    /// # Example
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use idemkit_core::{CompleteRequest, ResultKind};
    /// let c = CompleteRequest::new(ResultKind::Value, vec![1, 2], Duration::from_secs(1));
    /// assert_eq!(&c.bytes[..], &[1, 2]);
    /// ```
    pub fn new(kind: ResultKind, bytes: impl Into<Bytes>, ttl: Duration) -> Self {
        CompleteRequest {
            kind,
            bytes: bytes.into(),
            ttl,
        }
    }
}

/// What the caller of a failed store call should do about it.
///
/// # Example
///
/// ```
/// use idemkit_core::{StoreError, StoreErrorKind};
///
/// assert_eq!(StoreError::lease_lost().kind(), StoreErrorKind::LeaseLost);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// The store could not be reached or timed out; the call may succeed later. The only kind
    /// on which a fail-open coordinator runs an action unprotected.
    Unavailable,
    /// The caller's token no longer owns the key (its lease expired, and maybe another owner
    /// took it over). Nothing was written.
    LeaseLost,
    /// The bytes under the key are not a record this version reads (damaged, or written by
    /// something else). Nothing was changed; an operator must look (read it with
    /// [`Store::get`], remove it with [`RawStore::purge`]).
    Corrupt,
    /// The store refused the request itself (say, a value over a server limit). Retrying the
    /// same request will not help.
    Rejected,
    /// Anything else.
    Other,
}

/// An error from a [`Store`]: a [`StoreErrorKind`] and an opaque source.
///
/// # Example
///
/// ```
/// use idemkit_core::StoreError;
///
/// let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
/// let e = StoreError::unavailable(io);
/// assert!(e.is_unavailable());
/// assert_eq!(e.to_string(), "store unavailable: refused");
/// ```
#[derive(Debug)]
pub struct StoreError {
    kind: StoreErrorKind,
    source: Option<BoxError>,
}

impl StoreError {
    /// An error of a kind, with a source.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::{StoreError, StoreErrorKind};
    /// let e = StoreError::new(StoreErrorKind::Rejected, "value too large");
    /// assert_eq!(e.kind(), StoreErrorKind::Rejected);
    /// ```
    pub fn new(kind: StoreErrorKind, source: impl Into<BoxError>) -> Self {
        StoreError {
            kind,
            source: Some(source.into()),
        }
    }

    /// The store could not be reached.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::StoreError;
    /// assert!(StoreError::unavailable("timed out").is_unavailable());
    /// ```
    pub fn unavailable(source: impl Into<BoxError>) -> Self {
        Self::new(StoreErrorKind::Unavailable, source)
    }

    /// The caller's lease is gone.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::StoreError;
    /// assert!(StoreError::lease_lost().is_lease_lost());
    /// ```
    pub fn lease_lost() -> Self {
        StoreError {
            kind: StoreErrorKind::LeaseLost,
            source: None,
        }
    }

    /// The record under the key cannot be read.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::{StoreError, StoreErrorKind};
    /// assert_eq!(StoreError::corrupt("bad magic").kind(), StoreErrorKind::Corrupt);
    /// ```
    pub fn corrupt(source: impl Into<BoxError>) -> Self {
        Self::new(StoreErrorKind::Corrupt, source)
    }

    /// The kind.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::{StoreError, StoreErrorKind};
    /// assert_eq!(StoreError::unavailable("x").kind(), StoreErrorKind::Unavailable);
    /// ```
    pub fn kind(&self) -> StoreErrorKind {
        self.kind
    }

    /// Whether the store was unreachable.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::StoreError;
    /// assert!(!StoreError::lease_lost().is_unavailable());
    /// ```
    pub fn is_unavailable(&self) -> bool {
        self.kind == StoreErrorKind::Unavailable
    }

    /// Whether the caller's lease was lost.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::StoreError;
    /// assert!(!StoreError::unavailable("x").is_lease_lost());
    /// ```
    pub fn is_lease_lost(&self) -> bool {
        self.kind == StoreErrorKind::LeaseLost
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            StoreErrorKind::Unavailable => "store unavailable",
            StoreErrorKind::LeaseLost => "lease lost: the key is no longer owned by this caller",
            StoreErrorKind::Corrupt => "corrupt or foreign record under the key",
            StoreErrorKind::Rejected => "store rejected the request",
            StoreErrorKind::Other => "store error",
        };
        match &self.source {
            Some(s) => write!(f, "{what}: {s}"),
            None => f.write_str(what),
        }
    }
}

impl StdError for StoreError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static))
    }
}

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
        crate::Policy::MAX_DURATION
    }

    /// How long one call of this store can take at most, if the store enforces a limit
    /// itself (a response timeout; for `wait`, on top of its `timeout`). The coordinator
    /// bounds every store call by its policy's `store_timeout` (renewals by a third of the
    /// lease); when the store's own limit is within that, it skips its timer, which saves
    /// a timer per call. Default `None`: no limit of its own, the coordinator times every
    /// call that does not answer at once.
    fn call_timeout(&self) -> Option<Duration> {
        None
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
