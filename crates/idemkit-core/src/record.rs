//! What a store keeps under a key, and its versioned byte format.
//!
//! A stored record is an IPC boundary between versions of idemkit (a record written today is
//! replayed by next month's deploy), so the byte format starts with a magic and a version and
//! [`Record::decode`] refuses anything else with a typed [`RecordError`], never a panic.

use std::fmt;

use bytes::Bytes;

use crate::Fingerprint;

/// Identifies one reservation attempt. Only the holder of the token that reserved a key may
/// renew, complete or release it.
///
/// Tokens are 128 random bits: unique, not secret (they only tell owners apart).
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

const MAGIC: &[u8; 3] = b"IDK";
const VERSION: u8 = 1;
const STATE_RESERVED: u8 = 1;
const STATE_COMPLETED: u8 = 2;
const FLAG_FINGERPRINT: u8 = 1;
// magic(3) version(1) state(1) flags(1) owner(16) fencing(8) created(8) expires(8)
const HEADER: usize = 3 + 1 + 1 + 1 + 16 + 8 + 8 + 8;

impl Record {
    /// Encodes version 1 of the format:
    /// `"IDK" 01 state flags owner:u128 fencing:u64 created:u64 expires:u64 [fingerprint:16]
    /// [kind:u8 len:u32 bytes]`, integers big-endian.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::{FencingToken, OwnerToken, Record, RecordState};
    /// let r = Record { state: RecordState::Reserved, owner: OwnerToken::from_u128(1),
    ///     fencing: FencingToken::new(1), fingerprint: None, created_at_ms: 0, expires_at_ms: 0 };
    /// assert_eq!(&r.encode()[..4], b"IDK\x01");
    /// ```
    pub fn encode(&self) -> Vec<u8> {
        let outcome_len = match &self.state {
            RecordState::Reserved => 0,
            RecordState::Completed(o) => 5 + o.bytes.len(),
        };
        let mut out = Vec::with_capacity(HEADER + 16 + outcome_len);
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        out.push(match self.state {
            RecordState::Reserved => STATE_RESERVED,
            RecordState::Completed(_) => STATE_COMPLETED,
        });
        out.push(if self.fingerprint.is_some() {
            FLAG_FINGERPRINT
        } else {
            0
        });
        out.extend_from_slice(&self.owner.as_u128().to_be_bytes());
        out.extend_from_slice(&self.fencing.get().to_be_bytes());
        out.extend_from_slice(&self.created_at_ms.to_be_bytes());
        out.extend_from_slice(&self.expires_at_ms.to_be_bytes());
        if let Some(fp) = self.fingerprint {
            out.extend_from_slice(&fp.to_bytes());
        }
        if let RecordState::Completed(o) = &self.state {
            out.push(o.kind.to_byte());
            out.extend_from_slice(&(o.bytes.len() as u32).to_be_bytes());
            out.extend_from_slice(&o.bytes);
        }
        out
    }

    /// Decodes a record, refusing anything that is not exactly one of our format.
    ///
    /// # Errors
    ///
    /// [`RecordError`] for foreign or damaged bytes.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::{Record, RecordError};
    /// assert_eq!(Record::decode(b"IDK\x07"), Err(RecordError::TooShort(4)));
    /// ```
    pub fn decode(b: &[u8]) -> Result<Record, RecordError> {
        Self::decode_with(b, Bytes::copy_from_slice)
    }

    /// Like [`decode`](Record::decode), but the outcome shares `bytes` instead of copying
    /// it: for a store that already owns the reply buffer.
    ///
    /// # Errors
    ///
    /// [`RecordError`] for foreign or damaged bytes.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::{FencingToken, ResultKind, OwnerToken, Record, RecordState, StoredResult};
    /// let r = Record { state: RecordState::Completed(StoredResult::new(ResultKind::Value, "1")),
    ///     owner: OwnerToken::from_u128(1), fencing: FencingToken::new(1), fingerprint: None,
    ///     created_at_ms: 0, expires_at_ms: 0 };
    /// assert_eq!(Record::decode_shared(r.encode().into())?, r);
    /// # Ok::<(), idemkit_core::RecordError>(())
    /// ```
    pub fn decode_shared(bytes: Bytes) -> Result<Record, RecordError> {
        Self::decode_with(&bytes, |part| bytes.slice_ref(part))
    }

    fn decode_with(b: &[u8], share: impl FnOnce(&[u8]) -> Bytes) -> Result<Record, RecordError> {
        if b.len() >= 3 && &b[..3] != MAGIC {
            return Err(RecordError::BadMagic);
        }
        if b.len() < HEADER {
            return Err(RecordError::TooShort(b.len()));
        }
        if b[3] != VERSION {
            return Err(RecordError::UnsupportedVersion(b[3]));
        }
        let state = b[4];
        let flags = b[5];
        if flags & !FLAG_FINGERPRINT != 0 {
            return Err(RecordError::InvalidField("flags"));
        }
        let u64_at = |i: usize| u64::from_be_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let owner = OwnerToken::from_u128(u128::from_be_bytes(b[6..22].try_into().expect("16")));
        let fencing = FencingToken::new(u64_at(22));
        let created_at_ms = u64_at(30);
        let expires_at_ms = u64_at(38);
        let mut rest = &b[HEADER..];
        let fingerprint = if flags & FLAG_FINGERPRINT != 0 {
            let (fp, r) = rest
                .split_at_checked(16)
                .ok_or(RecordError::LengthMismatch)?;
            rest = r;
            Some(Fingerprint::from_bytes(fp.try_into().expect("16 bytes")))
        } else {
            None
        };
        let state = match state {
            STATE_RESERVED => RecordState::Reserved,
            STATE_COMPLETED => {
                let (&kind, r) = rest.split_first().ok_or(RecordError::LengthMismatch)?;
                let kind = ResultKind::from_byte(kind).ok_or(RecordError::InvalidField("kind"))?;
                let (len, r) = r.split_at_checked(4).ok_or(RecordError::LengthMismatch)?;
                let len = u32::from_be_bytes(len.try_into().expect("4 bytes")) as usize;
                let (bytes, r) = r.split_at_checked(len).ok_or(RecordError::LengthMismatch)?;
                rest = r;
                RecordState::Completed(StoredResult::new(kind, share(bytes)))
            }
            _ => return Err(RecordError::InvalidField("state")),
        };
        if !rest.is_empty() {
            return Err(RecordError::LengthMismatch);
        }
        Ok(Record {
            state,
            owner,
            fencing,
            fingerprint,
            created_at_ms,
            expires_at_ms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn record() -> impl Strategy<Value = Record> {
        (
            proptest::option::of(proptest::collection::vec(any::<u8>(), 0..64)),
            any::<u128>(),
            any::<u64>(),
            proptest::option::of(any::<[u8; 16]>()),
            any::<u64>(),
            any::<u64>(),
            0u8..3,
        )
            .prop_map(|(bytes, owner, fencing, fp, c, e, k)| Record {
                state: match bytes {
                    None => RecordState::Reserved,
                    Some(b) => RecordState::Completed(StoredResult::new(
                        [
                            ResultKind::Value,
                            ResultKind::PermanentError,
                            ResultKind::Unavailable,
                        ][k as usize],
                        b,
                    )),
                },
                owner: OwnerToken::from_u128(owner),
                fencing: FencingToken::new(fencing),
                fingerprint: fp.map(Fingerprint::from_bytes),
                created_at_ms: c,
                expires_at_ms: e,
            })
    }

    proptest! {
        #[test]
        fn roundtrip(r in record()) {
            prop_assert_eq!(Record::decode(&r.encode()), Ok(r.clone()));
            prop_assert_eq!(Record::decode_shared(r.encode().into()), Ok(r));
        }

        #[test]
        fn garbage_is_an_error_not_a_panic(b in proptest::collection::vec(any::<u8>(), 0..120)) {
            // No panic; and whatever decodes is exactly what it encodes back to, so no two
            // byte strings are read as the same record.
            if let Ok(r) = Record::decode(&b) {
                prop_assert_eq!(r.encode(), b);
            }
        }

        #[test]
        fn truncation_and_extension_are_detected(r in record(), cut in 1usize..8) {
            let enc = r.encode();
            let cut = cut.min(enc.len());
            prop_assert!(Record::decode(&enc[..enc.len() - cut]).is_err());
            let mut longer = enc.clone();
            longer.push(0);
            prop_assert_eq!(Record::decode(&longer), Err(RecordError::LengthMismatch));
        }
    }

    #[test]
    fn foreign_and_future_records_are_typed() {
        assert_eq!(Record::decode(b"{\"json\":1}"), Err(RecordError::BadMagic));
        let mut r = Record {
            state: RecordState::Reserved,
            owner: OwnerToken::from_u128(1),
            fencing: FencingToken::new(1),
            fingerprint: None,
            created_at_ms: 0,
            expires_at_ms: 0,
        }
        .encode();
        r[3] = 2;
        assert_eq!(Record::decode(&r), Err(RecordError::UnsupportedVersion(2)));
        r[3] = 1;
        r[4] = 9;
        assert_eq!(Record::decode(&r), Err(RecordError::InvalidField("state")));
    }
}
