//! The record as the SQL stores keep it: a row of columns. For store authors: the row
//! shape both SQL stores write, checked field by field when read.
//!
//! A row has `version` (1), `state` (1 reserved, 2 completed), `owner` (16 bytes),
//! `fencing` (positive), `fingerprint` (16 bytes or none), `kind` and `result` (completed);
//! the times and the holder are each store's own. A row that no writer of this version
//! produces is `Corrupt`, with what is wrong and where.

use std::time::Duration;

use bytes::Bytes;

use idemkit_core::Fingerprint;
use idemkit_core::StorageKey;
use idemkit_core::record::{
    FencingToken, Holder, OwnerToken, Record, RecordState, ResultKind, SharedHolder, StoredResult,
};
use idemkit_core::store::{BeginRequest, Claim, Ownership, Replay, StoreError};

/// A row's record columns, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Columns {
    /// The row format's version: 1 (0: foreign bytes written by `put_raw`).
    pub version: i16,
    /// 1 reserved, 2 completed.
    pub state: i16,
    /// The owner token, 16 bytes big-endian.
    pub owner: Option<Vec<u8>>,
    /// The fencing token, positive.
    pub fencing: i64,
    /// The request fingerprint, 16 bytes, if the call had one.
    pub fingerprint: Option<Vec<u8>>,
    /// The stored result's kind (completed rows).
    pub kind: Option<i16>,
    /// The stored result's bytes (completed rows).
    pub result: Option<Vec<u8>>,
}

/// A row in one of our states, checked field by field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checked {
    /// A reservation.
    Reserved {
        /// Its owner.
        owner: OwnerToken,
        /// Its fencing token.
        fencing: FencingToken,
        /// The reserving call's fingerprint.
        fingerprint: Option<Fingerprint>,
    },
    /// A stored result.
    Completed {
        /// The owner that completed it.
        owner: OwnerToken,
        /// Its fencing token.
        fencing: FencingToken,
        /// The call's fingerprint.
        fingerprint: Option<Fingerprint>,
        /// The result.
        result: StoredResult,
    },
}

/// The columns a `put_raw` writes for `bytes`: a record's fields when they decode as one, or
/// a version-0 row holding the bytes in `result` (read back as `Corrupt`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// The record's columns.
    pub columns: Columns,
    /// The record's holder block, if it has a holder.
    pub holder: Option<Vec<u8>>,
    /// The decoded record's fencing token (raises the store's high-water mark), if it decoded.
    pub fencing: Option<FencingToken>,
}

impl Columns {
    /// Checks every field.
    pub fn check(self, key: &StorageKey) -> Result<Checked, StoreError> {
        let bad = |what: &str| {
            StoreError::corrupt(format!(
                "the row under {:?} is not a record this version reads: {what}",
                key.as_str()
            ))
        };
        if self.version != 1 {
            return Err(bad(&format!("row version {}", self.version)));
        }
        let owner = self
            .owner
            .as_deref()
            .and_then(|o| <[u8; 16]>::try_from(o).ok())
            .map(|o| OwnerToken::from_u128(u128::from_be_bytes(o)))
            .ok_or_else(|| bad("owner is not 16 bytes"))?;
        let fencing = u64::try_from(self.fencing)
            .ok()
            .filter(|&f| f > 0)
            .map(FencingToken::new)
            .ok_or_else(|| bad("fencing token is not positive"))?;
        let fingerprint = match self.fingerprint.as_deref() {
            None => None,
            Some(f) => Some(Fingerprint::from_bytes(
                <[u8; 16]>::try_from(f).map_err(|_| bad("fingerprint is not 16 bytes"))?,
            )),
        };
        match self.state {
            1 => Ok(Checked::Reserved {
                owner,
                fencing,
                fingerprint,
            }),
            2 => {
                let kind = self
                    .kind
                    .and_then(|k| u8::try_from(k).ok())
                    .and_then(ResultKind::from_byte)
                    .ok_or_else(|| bad("result kind"))?;
                let bytes = self
                    .result
                    .ok_or_else(|| bad("completed without a result"))?;
                Ok(Checked::Completed {
                    owner,
                    fencing,
                    fingerprint,
                    result: StoredResult::new(kind, Bytes::from(bytes)),
                })
            }
            s => Err(bad(&format!("state {s}"))),
        }
    }

    /// What `put_raw` writes for `bytes`.
    pub fn written(bytes: &[u8]) -> Written {
        let foreign = || Written {
            columns: Columns {
                version: 0,
                state: 0,
                owner: Some(vec![0; 16]),
                fencing: 0,
                fingerprint: None,
                kind: None,
                result: Some(bytes.to_vec()),
            },
            holder: None,
            fencing: None,
        };
        let Ok(r) = Record::decode(bytes) else {
            return foreign();
        };
        let (state, kind, result) = match &r.state {
            RecordState::Reserved => (1, None, None),
            RecordState::Completed(o) => (
                2,
                Some(i16::from(o.kind().to_byte())),
                Some(o.bytes().to_vec()),
            ),
            // A state this version cannot write as columns: kept as foreign bytes.
            _ => return foreign(),
        };
        Written {
            columns: Columns {
                version: 1,
                state,
                owner: Some(r.owner.as_u128().to_be_bytes().to_vec()),
                // A token beyond the column's range cannot match any row.
                fencing: i64::try_from(r.fencing.get()).unwrap_or(-1),
                fingerprint: r.fingerprint.map(|f| f.to_bytes().to_vec()),
                kind,
                result,
            },
            holder: r.holder.as_ref().map(|h| h.block(r.lease_ms.unwrap_or(0))),
            fencing: Some(r.fencing),
        }
    }
}

impl Checked {
    /// The claim a `begin` that met this live row answers: a replay, a mismatch, the caller's
    /// own reservation (asked for twice), or another owner's in flight (`left` of its lease,
    /// `held` since it was reserved, `holder` from its holder column: [`holder`]).
    pub fn claim(
        self,
        req: &BeginRequest<'_>,
        left: Duration,
        held: Duration,
        holder: Option<SharedHolder>,
    ) -> Claim {
        match self {
            Checked::Reserved { fingerprint, .. } | Checked::Completed { fingerprint, .. }
                if fingerprint != req.fingerprint =>
            {
                Claim::Mismatch
            }
            Checked::Completed {
                fencing, result, ..
            } => Claim::Replay(Replay::new(fencing, result)),
            Checked::Reserved { owner, fencing, .. } if owner == req.owner => Claim::Reserved {
                ownership: Ownership::new(owner, fencing),
                took_over: false,
            },
            // A rejected duplicate is told the original's attempt and the process running it.
            Checked::Reserved { fencing, .. } => Claim::InFlight {
                retry_after: left,
                fencing,
                held_for: Some(held),
                holder,
            },
        }
    }

    /// The record, with its times in Unix ms (a negative time reads as 0).
    pub fn into_record(self, created_at_ms: i64, expires_at_ms: i64) -> Record {
        let ms = |v: i64| u64::try_from(v).unwrap_or(0);
        let (state, owner, fencing, fingerprint) = match self {
            Checked::Reserved {
                owner,
                fencing,
                fingerprint,
            } => (RecordState::Reserved, owner, fencing, fingerprint),
            Checked::Completed {
                owner,
                fencing,
                fingerprint,
                result,
            } => (RecordState::Completed(result), owner, fencing, fingerprint),
        };
        Record {
            state,
            owner,
            fencing,
            fingerprint,
            created_at_ms: ms(created_at_ms),
            expires_at_ms: ms(expires_at_ms),
            holder: None,
            lease_ms: None,
        }
    }
}

/// Attaches a holder column's block to `record`; bytes that are not one holder block are
/// `Corrupt`.
pub fn with_holder(
    mut record: Record,
    block: Option<&[u8]>,
    key: &StorageKey,
) -> Result<Record, StoreError> {
    if let Some((h, lease)) = holder_block(block, key)? {
        record.holder = Some(std::sync::Arc::new(h));
        record.lease_ms = Some(lease);
    }
    Ok(record)
}

/// The holder a holder column names (`None` for `NULL`), for [`Checked::claim`]; bytes that
/// are not one holder block are `Corrupt`, as when the row is read whole.
pub fn holder(block: Option<&[u8]>, key: &StorageKey) -> Result<Option<SharedHolder>, StoreError> {
    Ok(holder_block(block, key)?.map(|(h, _)| std::sync::Arc::new(h)))
}

fn holder_block(
    block: Option<&[u8]>,
    key: &StorageKey,
) -> Result<Option<(Holder, u64)>, StoreError> {
    let Some(block) = block else {
        return Ok(None);
    };
    Holder::from_block(block)
        .ok()
        .filter(|(_, _, rest)| rest.is_empty())
        .map(|(h, lease, _)| Some((h, lease)))
        .ok_or_else(|| {
            StoreError::corrupt(format!(
                "the row under {:?} has a holder column that is not a holder",
                key.as_str()
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> StorageKey {
        let op = idemkit_core::Operation::new("sql").unwrap();
        StorageKey::new(&op, None, &idemkit_core::Key::new("k").unwrap())
    }

    #[test]
    fn a_record_round_trips_through_its_columns_and_foreign_bytes_are_corrupt() {
        let record = Record {
            state: RecordState::Completed(StoredResult::new(ResultKind::Value, &b"v"[..])),
            owner: OwnerToken::from_u128(7),
            fencing: FencingToken::new(9),
            fingerprint: Some(Fingerprint::from_bytes([3; 16])),
            created_at_ms: 0,
            expires_at_ms: 0,
            holder: None,
            lease_ms: None,
        };
        let written = Columns::written(&record.encode());
        assert_eq!(written.fencing, Some(FencingToken::new(9)));
        let back = written.columns.check(&key()).unwrap().into_record(0, 0);
        assert_eq!(back, record);
        let foreign = Columns::written(b"not a record");
        assert_eq!(foreign.fencing, None);
        assert_eq!(
            foreign.columns.check(&key()).unwrap_err().kind(),
            idemkit_core::store::StoreErrorKind::Corrupt
        );
        let mut bad_owner = Columns::written(&record.encode()).columns;
        bad_owner.owner = Some(vec![1, 2, 3]);
        let e = bad_owner.check(&key()).unwrap_err();
        assert!(e.to_string().contains("owner is not 16 bytes"), "{e}");
    }
}
