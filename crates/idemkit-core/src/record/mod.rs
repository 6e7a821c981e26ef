//! What a store keeps under a key, and its versioned byte format.
//!
//! A stored record is an IPC boundary between versions of idemkit (a record written today is
//! replayed by next month's deploy), so the byte format starts with a magic and a version and
//! [`Record::decode`] refuses anything else with a typed [`RecordError`], never a panic.

use std::fmt;

use bytes::Bytes;

use crate::fingerprint::Fingerprint;

mod format;
mod holder;
#[cfg(test)]
mod tests;

pub use holder::{Holder, SharedHolder};

/// Identifies one reservation attempt. Only the holder of the token that reserved a key may
/// renew, complete or release it.
///
/// Tokens are 128 bits from a per-thread generator seeded from the OS (`fastrand`, with 64 bits
/// of state): unique in practice, not secret (they only tell
/// owners apart, and a token is checked together with its fencing token).
///
/// # Example
///
/// ```
/// use idemkit_core::OwnerToken;
///
/// assert_ne!(OwnerToken::random(), OwnerToken::random());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct OwnerToken(u128);

impl OwnerToken {
    /// A fresh random token.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::OwnerToken;
    /// let _ = OwnerToken::random();
    /// ```
    pub fn random() -> Self {
        OwnerToken(fastrand::u128(..))
    }

    /// A token from its raw value (as read back from a store).
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::OwnerToken;
    /// assert_eq!(OwnerToken::from_u128(5).as_u128(), 5);
    /// ```
    pub const fn from_u128(v: u128) -> Self {
        OwnerToken(v)
    }

    /// The raw value.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::OwnerToken;
    /// let t = OwnerToken::random();
    /// assert_eq!(OwnerToken::from_u128(t.as_u128()), t);
    /// ```
    pub const fn as_u128(self) -> u128 {
        self.0
    }
}

impl fmt::Debug for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OwnerToken({:032x})", self.0)
    }
}

impl fmt::Display for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// A number that strictly increases across successive reservations of one key on one store.
///
/// The action can read it ([`Attempt::fencing_token`](crate::Attempt::fencing_token)) and pass
/// it to a downstream system, which then refuses a write carrying a smaller token than one it
/// has seen: a stale owner whose lease expired cannot act after its successor has.
///
/// # Example
///
/// ```
/// use idemkit_core::FencingToken;
///
/// assert!(FencingToken::new(2) > FencingToken::new(1));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FencingToken(u64);

impl FencingToken {
    /// A token from its value.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::FencingToken;
    /// assert_eq!(FencingToken::new(3).get(), 3);
    /// ```
    pub const fn new(v: u64) -> Self {
        FencingToken(v)
    }

    /// The value.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::FencingToken;
    /// assert_eq!(FencingToken::new(9).get(), 9);
    /// ```
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// What a completed record holds.
///
/// # Example
///
/// ```
/// use idemkit_core::ResultKind;
///
/// assert_eq!(ResultKind::from_byte(ResultKind::Value.to_byte()), Some(ResultKind::Value));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ResultKind {
    /// The encoded result of a successful action.
    Value,
    /// The encoded error of an action that failed permanently (opt-in).
    PermanentError,
    /// The action succeeded but its result could not be kept (too large, or the codec failed).
    /// The bytes are a UTF-8 reason. The key stays completed so the action is never re-run.
    Unavailable,
}

impl ResultKind {
    /// The byte used in the record format.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::ResultKind;
    /// assert_eq!(ResultKind::Value.to_byte(), 1);
    /// ```
    pub const fn to_byte(self) -> u8 {
        match self {
            ResultKind::Value => 1,
            ResultKind::PermanentError => 2,
            ResultKind::Unavailable => 3,
        }
    }

    /// The kind for a format byte, if it is one.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::ResultKind;
    /// assert_eq!(ResultKind::from_byte(9), None);
    /// ```
    pub const fn from_byte(b: u8) -> Option<Self> {
        match b {
            1 => Some(ResultKind::Value),
            2 => Some(ResultKind::PermanentError),
            3 => Some(ResultKind::Unavailable),
            _ => None,
        }
    }
}

/// A stored outcome: its kind and bytes. Cloning shares the bytes.
///
/// # Example
///
/// ```
/// use idemkit_core::{ResultKind, StoredResult};
///
/// let o = StoredResult::new(ResultKind::Value, "\"em_1\"");
/// assert_eq!(&o.bytes()[..], b"\"em_1\"");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResult {
    kind: ResultKind,
    bytes: Bytes,
}

impl StoredResult {
    /// Builds an outcome.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::{ResultKind, StoredResult};
    /// let o = StoredResult::new(ResultKind::Unavailable, "too large");
    /// assert_eq!(o.kind(), ResultKind::Unavailable);
    /// ```
    pub fn new(kind: ResultKind, bytes: impl Into<Bytes>) -> Self {
        StoredResult {
            kind,
            bytes: bytes.into(),
        }
    }

    /// The kind.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::{ResultKind, StoredResult};
    /// assert_eq!(StoredResult::new(ResultKind::Value, "1").kind(), ResultKind::Value);
    /// ```
    pub fn kind(&self) -> ResultKind {
        self.kind
    }

    /// The bytes.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::{ResultKind, StoredResult};
    /// assert_eq!(StoredResult::new(ResultKind::Value, "1").bytes().len(), 1);
    /// ```
    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }
}

/// The state of a record.
///
/// # Example
///
/// ```
/// use idemkit_core::RecordState;
///
/// assert!(matches!(RecordState::Reserved, RecordState::Reserved));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecordState {
    /// Reserved by an owner whose action is running; `expires_at_ms` is the lease's end.
    Reserved,
    /// Replay; `expires_at_ms` is the end of the retention TTL.
    Completed(StoredResult),
}

/// One record as a store keeps it.
///
/// # Example
///
/// ```
/// use idemkit_core::{FencingToken, OwnerToken, Record, RecordState};
///
/// let r = Record {
///     state: RecordState::Reserved,
///     owner: OwnerToken::from_u128(1),
///     fencing: FencingToken::new(1),
///     fingerprint: None,
///     created_at_ms: 1_700_000_000_000,
///     expires_at_ms: 1_700_000_015_000,
///     holder: None,
///     lease_ms: None,
/// };
/// assert_eq!(Record::decode(&r.encode())?, r);
/// # Ok::<(), idemkit_core::RecordError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Reserved or completed.
    pub state: RecordState,
    /// The owner that reserved (and, if completed, completed) the key.
    pub owner: OwnerToken,
    /// The reservation's fencing token.
    pub fencing: FencingToken,
    /// The fingerprint of the request that reserved the key, if it gave one.
    pub fingerprint: Option<Fingerprint>,
    /// When the key was reserved, Unix milliseconds by the store's clock.
    pub created_at_ms: u64,
    /// When the lease (reserved) or the retention (completed) ends, Unix milliseconds by the
    /// store's clock.
    pub expires_at_ms: u64,
    /// The process that reserved the key (format version 2), if the reserving call said.
    pub holder: Option<SharedHolder>,
    /// The lease the key was reserved with, in milliseconds (version 2, with `holder`):
    /// each renewal extends the reservation to this long from the renewal.
    pub lease_ms: Option<u64>,
}

impl Record {
    /// When the reservation was last renewed (or reserved), Unix milliseconds by the
    /// store's clock: its expiry less its lease. `None` without a recorded lease.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::{FencingToken, OwnerToken, Record, RecordState};
    /// let r = Record { state: RecordState::Reserved, owner: OwnerToken::from_u128(1),
    ///     fencing: FencingToken::new(1), fingerprint: None, created_at_ms: 1_000,
    ///     expires_at_ms: 31_000, holder: None, lease_ms: Some(15_000) };
    /// assert_eq!(r.renewed_at_ms(), Some(16_000));
    /// ```
    pub fn renewed_at_ms(&self) -> Option<u64> {
        Some(self.expires_at_ms.saturating_sub(self.lease_ms?))
    }

    /// Whether a reservation's owner has stopped renewing it: a live owner renews every
    /// third of its lease, so a reservation not renewed for half a lease missed a renewal
    /// (its process is gone, stopped or stuck), and one stopped is flagged within two
    /// renewal intervals. `false` for a completed record or one without a recorded lease.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::{FencingToken, OwnerToken, Record, RecordState};
    /// let r = Record { state: RecordState::Reserved, owner: OwnerToken::from_u128(1),
    ///     fencing: FencingToken::new(1), fingerprint: None, created_at_ms: 0,
    ///     expires_at_ms: 30_000, holder: None, lease_ms: Some(30_000) };
    /// assert!(!r.is_stale(10_000)); // renewed 10 s ago: a third of the lease
    /// assert!(r.is_stale(15_001)); // over half a lease
    /// ```
    pub fn is_stale(&self, now_ms: u64) -> bool {
        match (&self.state, self.renewed_at_ms(), self.lease_ms) {
            (RecordState::Reserved, Some(renewed), Some(lease)) => {
                now_ms.saturating_sub(renewed) > lease / 2
            }
            _ => false,
        }
    }
}

/// A byte string that is not a record of a format this version reads.
///
/// # Example
///
/// ```
/// use idemkit_core::{Record, RecordError};
///
/// assert_eq!(Record::decode(b"hello"), Err(RecordError::BadMagic));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    /// Shorter than the fixed header.
    #[error("record is {0} bytes, shorter than the header")]
    TooShort(usize),
    /// Does not start with the idemkit magic: something else wrote under our key.
    #[error("not an idemkit record (bad magic)")]
    BadMagic,
    /// An idemkit record of a version this build does not read.
    #[error("unsupported record version {0}")]
    UnsupportedVersion(u8),
    /// A field holds a value no writer produces.
    #[error("invalid record field: {0}")]
    InvalidField(&'static str),
    /// The length fields do not match the bytes present.
    #[error("record length mismatch")]
    LengthMismatch,
}
