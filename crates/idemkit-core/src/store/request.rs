//! What the store's calls take and answer.

use std::time::Duration;

use bytes::Bytes;

use crate::fingerprint::Fingerprint;
use crate::ident::StorageKey;
use crate::record::{FencingToken, OwnerToken, ResultKind, SharedHolder, StoredResult};

/// What [`Store::begin`](super::Store::begin) asks for.
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
    /// The reserving process, recorded with the reservation (record format version 2) with
    /// the lease, for operators (`Record::holder`, `Record::is_stale`).
    pub holder: Option<&'a SharedHolder>,
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
            holder: None,
        }
    }

    /// Sets the reserving process.
    ///
    /// # Example
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use std::time::Duration;
    /// # use idemkit_core::{BeginRequest, Key, Operation, OwnerToken, StorageKey};
    /// # use idemkit_core::record::Holder;
    /// # let key = StorageKey::new(&Operation::new("op")?, None, &Key::new("k")?);
    /// let me = Arc::new(Holder::this_process());
    /// let req = BeginRequest::new(&key, OwnerToken::random(), Duration::from_secs(1))
    ///     .with_holder(Some(&me));
    /// assert_eq!(req.holder.map(|h| h.pid), Some(std::process::id()));
    /// # Ok::<(), idemkit_core::KeyError>(())
    /// ```
    pub fn with_holder(mut self, holder: Option<&'a SharedHolder>) -> Self {
        self.holder = holder;
        self
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

    /// What this request reserves with, for the completion of its reservation
    /// ([`CompleteRequest::with_reservation`]).
    ///
    /// # Example
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use idemkit_core::{BeginRequest, Key, Operation, OwnerToken, StorageKey};
    /// # let key = StorageKey::new(&Operation::new("op")?, None, &Key::new("k")?);
    /// let req = BeginRequest::new(&key, OwnerToken::random(), Duration::from_secs(1));
    /// assert_eq!(req.reservation().lease, Duration::from_secs(1));
    /// # Ok::<(), idemkit_core::KeyError>(())
    /// ```
    pub fn reservation(&self) -> Reservation {
        Reservation {
            fingerprint: self.fingerprint,
            holder: self.holder.cloned(),
            lease: self.lease,
        }
    }
}

/// What a reservation was made with: its [`BeginRequest`]'s fingerprint, holder and lease.
///
/// A completion that carries it ([`CompleteRequest::reservation`]) lets a store write the
/// completed record without first reading the reservation's contents back (Redis sends the
/// record whole and compares the stored reservation with the one this describes, byte for
/// byte). It is a hint, never a proof of ownership: a store still checks the owner and
/// fencing tokens, and one that finds the reservation different from this (a caller that
/// reserved with other values, a store's own flags) completes from what it holds.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use idemkit_core::store::Reservation;
///
/// let r = Reservation::new(None, None, Duration::from_secs(15));
/// assert!(r.fingerprint.is_none());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Reservation {
    /// The fingerprint it was reserved with.
    pub fingerprint: Option<Fingerprint>,
    /// The reserving process it recorded.
    pub holder: Option<SharedHolder>,
    /// The lease it was reserved for (recorded with the holder).
    pub lease: Duration,
}

impl Reservation {
    /// Builds one.
    ///
    /// # Example
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use idemkit_core::{Fingerprint, store::Reservation};
    /// let r = Reservation::new(Some(Fingerprint::of(b"body")), None, Duration::from_secs(15));
    /// assert!(r.fingerprint.is_some());
    /// ```
    pub fn new(
        fingerprint: Option<Fingerprint>,
        holder: Option<SharedHolder>,
        lease: Duration,
    ) -> Self {
        Reservation {
            fingerprint,
            holder,
            lease,
        }
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
    /// Whether the store holds the record as durably as it holds its own acknowledged
    /// writes (`true` unless a store says otherwise). `false` from Redis' durability guard
    /// when the replicas did not acknowledge having the record in time: the value is still
    /// the stored one, and the replay's [`Receipt::stored`](crate::Receipt::stored) says
    /// `false`, as an unacknowledged completion's does.
    pub confirmed: bool,
}

impl Replay {
    /// Builds one, confirmed.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::{Replay, FencingToken, ResultKind, StoredResult};
    /// let r = Replay::new(FencingToken::new(1), StoredResult::new(ResultKind::Value, ""));
    /// assert!(r.confirmed);
    /// ```
    pub fn new(fencing: FencingToken, outcome: StoredResult) -> Self {
        Replay {
            fencing,
            outcome,
            confirmed: true,
        }
    }

    /// Sets [`confirmed`](Replay::confirmed).
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::{Replay, FencingToken, ResultKind, StoredResult};
    /// let r = Replay::new(FencingToken::new(1), StoredResult::new(ResultKind::Value, ""))
    ///     .with_confirmed(false);
    /// assert!(!r.confirmed);
    /// ```
    #[must_use]
    pub fn with_confirmed(mut self, confirmed: bool) -> Self {
        self.confirmed = confirmed;
        self
    }
}

/// The answer of [`Store::begin`](super::Store::begin).
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
        /// That reservation's fencing token, for [`Store::wait`](super::Store::wait).
        fencing: FencingToken,
        /// How long that owner has held the key, by the store's clock, if the store knows.
        held_for: Option<Duration>,
        /// The process holding it, as its reservation records it ([`Record::holder`]):
        /// every store of this workspace reads it with the claim (the
        /// [`MemoryStore`](crate::MemoryStore), Redis, PostgreSQL, MySQL); `None` when that
        /// reservation was made without one (a coordinator built
        /// [`without_holder`](crate::CoordinatorBuilder::without_holder)) or by a store that does
        /// not keep holders.
        ///
        /// [`Record::holder`]: crate::Record::holder
        holder: Option<SharedHolder>,
    },
    /// The key is in use (reserved or completed) with a different fingerprint.
    Mismatch,
}

/// What [`Store::complete`](super::Store::complete) writes.
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
    /// What the completed reservation was made with, if the caller says (the coordinator
    /// does): see [`Reservation`].
    pub reservation: Option<Reservation>,
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
            reservation: None,
        }
    }

    /// Says what the completed reservation was made with (see [`Reservation`]).
    ///
    /// # Example
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use idemkit_core::{BeginRequest, CompleteRequest, Key, Operation, OwnerToken, ResultKind, StorageKey};
    /// # let key = StorageKey::new(&Operation::new("op")?, None, &Key::new("k")?);
    /// let begin = BeginRequest::new(&key, OwnerToken::random(), Duration::from_secs(15));
    /// let c = CompleteRequest::new(ResultKind::Value, "1", Duration::from_secs(60))
    ///     .with_reservation(Some(begin.reservation()));
    /// assert_eq!(c.reservation.map(|r| r.lease), Some(Duration::from_secs(15)));
    /// # Ok::<(), idemkit_core::KeyError>(())
    /// ```
    pub fn with_reservation(mut self, reservation: Option<Reservation>) -> Self {
        self.reservation = reservation;
        self
    }
}
