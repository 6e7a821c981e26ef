//! The record's versioned byte format: `Record::encode` and `Record::decode`.

use bytes::Bytes;

use std::sync::Arc;

use super::{
    FencingToken, Holder, OwnerToken, Record, RecordError, RecordState, ResultKind, StoredResult,
};
use crate::fingerprint::Fingerprint;

pub(super) const MAGIC: &[u8; 3] = b"IDK";
pub(super) const VERSION: u8 = 1;
/// Version 2: version 1 with a holder block after the fingerprint.
pub(super) const VERSION_HOLDER: u8 = 2;
pub(super) const STATE_RESERVED: u8 = 1;
pub(super) const STATE_COMPLETED: u8 = 2;
pub(super) const FLAG_FINGERPRINT: u8 = 1;
// magic(3) version(1) state(1) flags(1) owner(16) fencing(8) created(8) expires(8)
pub(super) const HEADER: usize = 3 + 1 + 1 + 1 + 16 + 8 + 8 + 8;

impl Record {
    /// Encodes version 1 of the format:
    /// `"IDK" 01 state flags owner:u128 fencing:u64 created:u64 expires:u64 [fingerprint:16]
    /// [kind:u8 len:u32 bytes]`, integers big-endian; or, for a record with a
    /// [`holder`](Record::holder), version 2, the same with the holder block after the
    /// fingerprint: `lease_ms:u64 pid:u32 host_len:u8 host name_len:u8 name`. A reader of
    /// version 1 only (idemkit before 0.2) refuses version 2 as `UnsupportedVersion`, never
    /// misreads it.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::{FencingToken, OwnerToken, Record, RecordState};
    /// let r = Record { state: RecordState::Reserved, owner: OwnerToken::from_u128(1),
    ///     fencing: FencingToken::new(1), fingerprint: None, created_at_ms: 0, expires_at_ms: 0,
    ///     holder: None, lease_ms: None };
    /// assert_eq!(&r.encode()[..4], b"IDK\x01");
    /// ```
    pub fn encode(&self) -> Vec<u8> {
        let outcome_len = match &self.state {
            RecordState::Reserved => 0,
            RecordState::Completed(o) => 5 + o.bytes.len(),
        };
        let mut out = Vec::with_capacity(HEADER + 16 + 80 + outcome_len);
        out.extend_from_slice(MAGIC);
        out.push(if self.holder.is_some() {
            VERSION_HOLDER
        } else {
            VERSION
        });
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
        if let Some(holder) = &self.holder {
            out.extend_from_slice(&self.lease_ms.unwrap_or(0).to_be_bytes());
            holder.encode_into(&mut out);
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
        Self::decode_with(b, Bytes::copy_from_slice, true)
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
    ///     created_at_ms: 0, expires_at_ms: 0, holder: None, lease_ms: None };
    /// assert_eq!(Record::decode_shared(r.encode().into())?, r);
    /// # Ok::<(), idemkit_core::RecordError>(())
    /// ```
    pub fn decode_shared(bytes: Bytes) -> Result<Record, RecordError> {
        Self::decode_with(&bytes, |part| bytes.slice_ref(part), true)
    }

    /// Like [`decode_shared`](Record::decode_shared), every byte checked the same, but
    /// without building the [`holder`](Record::holder) (`holder` and `lease_ms` are `None`):
    /// for a store answering a `begin`, whose replay or in-flight claim never uses it, on
    /// the path of every replay (building it is two strings and an `Arc`, a sixth of a
    /// Redis replay's client instructions).
    ///
    /// # Errors
    ///
    /// [`RecordError`] for foreign or damaged bytes, as `decode_shared`.
    ///
    /// # Example
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use idemkit_core::{FencingToken, OwnerToken, Record, RecordState};
    /// # use idemkit_core::record::Holder;
    /// let r = Record { state: RecordState::Reserved, owner: OwnerToken::from_u128(1),
    ///     fencing: FencingToken::new(1), fingerprint: None, created_at_ms: 0, expires_at_ms: 0,
    ///     holder: Some(Arc::new(Holder::new("h", 7, "n"))), lease_ms: Some(1_000) };
    /// let back = Record::decode_without_holder(r.encode().into())?;
    /// assert_eq!((back.fencing, back.holder), (r.fencing, None));
    /// # Ok::<(), idemkit_core::RecordError>(())
    /// ```
    pub fn decode_without_holder(bytes: Bytes) -> Result<Record, RecordError> {
        Self::decode_with(&bytes, |part| bytes.slice_ref(part), false)
    }

    fn decode_with(
        b: &[u8],
        share: impl FnOnce(&[u8]) -> Bytes,
        with_holder: bool,
    ) -> Result<Record, RecordError> {
        if b.len() >= 3 && &b[..3] != MAGIC {
            return Err(RecordError::BadMagic);
        }
        if b.len() < HEADER {
            return Err(RecordError::TooShort(b.len()));
        }
        let version = b[3];
        if version != VERSION && version != VERSION_HOLDER {
            return Err(RecordError::UnsupportedVersion(version));
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
        let (holder, lease_ms) = if version == VERSION_HOLDER && with_holder {
            let (holder, lease, r) = Holder::from_block(rest)?;
            rest = r;
            (Some(Arc::new(holder)), Some(lease))
        } else if version == VERSION_HOLDER {
            rest = Holder::skip_block(rest)?;
            (None, None)
        } else {
            (None, None)
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
            holder,
            lease_ms,
        })
    }
}
