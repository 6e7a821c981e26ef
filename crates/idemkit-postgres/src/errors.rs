//! PostgreSQL errors and rows, mapped to what the coordinator must do about them.

use bytes::Bytes;
use idemkit_core::record::Holder;
use idemkit_core::{
    FencingToken, Fingerprint, OwnerToken, Record, RecordState, ResultKind, StorageKey, StoreError,
    StoreErrorKind, StoredResult,
};

use crate::names::Table;

/// Maps a driver error. Lost or refused connections, a server shutting down or starting,
/// too many connections, a pool that timed out, serialization failures and deadlocks are
/// [`StoreErrorKind::Unavailable`] (retrying later can work; fail-open applies). A missing
/// table, column or schema is [`StoreErrorKind::Rejected`] with a message that names the
/// migration call.
pub(crate) fn map_err(e: sqlx::Error, table: &Table, migrate: &str) -> StoreError {
    match &e {
        sqlx::Error::Database(db) => {
            let code = db.code().unwrap_or_default();
            match &*code {
                // undefined_table, undefined_column, invalid_schema_name, undefined_object
                // (the sequence), undefined_function: not migrated (or an older version).
                "42P01" | "42703" | "3F000" | "42704" => StoreError::new(
                    StoreErrorKind::Rejected,
                    format!(
                        "the table {table} is missing or not migrated: call {migrate} once \
                         before use ({e})"
                    ),
                ),
                c if c.starts_with("08") // connection exception
                    || c.starts_with("57P") // admin shutdown, crash shutdown, cannot connect now
                    || c.starts_with("53") // insufficient resources, too many connections
                    || c == "40001" // serialization failure
                    || c == "40P01" // deadlock detected
                    || c == "55P03" // lock not available
                    || c == "25006" =>
                // read-only transaction (a standby after a failover)
                {
                    StoreError::unavailable(e)
                }
                // Data exceptions (a value over a limit): the same request cannot succeed.
                c if c.starts_with("22") || c.starts_with("54") => {
                    StoreError::new(StoreErrorKind::Rejected, e)
                }
                _ => StoreError::new(StoreErrorKind::Other, e),
            }
        }
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Protocol(_) => StoreError::unavailable(e),
        sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) => StoreError::corrupt(e),
        _ => StoreError::new(StoreErrorKind::Other, e),
    }
}

/// A record's columns as `get` and `scan` select them, from column `first` on: `version,
/// state, owner, fencing, fingerprint, kind, result`, then the creation and expiry times in
/// Unix ms: the row checked against `key`, and the two times.
pub(crate) fn read_record(
    row: &sqlx::postgres::PgRow,
    first: usize,
    key: &StorageKey,
) -> Result<Result<Record, StoreError>, sqlx::Error> {
    use sqlx::Row as _;
    let checked = Row {
        version: row.try_get(first)?,
        state: row.try_get(first + 1)?,
        owner: row.try_get(first + 2)?,
        fencing: row.try_get(first + 3)?,
        fingerprint: row.try_get(first + 4)?,
        kind: row.try_get(first + 5)?,
        result: row.try_get(first + 6)?,
    }
    .check(key);
    let (created, expires) = (row.try_get(first + 7)?, row.try_get(first + 8)?);
    // The holder column (migration 2), selected last by `get` and `scan`.
    let holder: Option<Vec<u8>> = row.try_get("holder")?;
    Ok(checked.and_then(|c| {
        let mut record = c.into_record(created, expires);
        if let Some(block) = holder {
            let (h, lease, rest) = Holder::from_block(&block)
                .ok()
                .filter(|(_, _, rest)| rest.is_empty())
                .ok_or_else(|| {
                    StoreError::corrupt(format!(
                        "the row under {:?} has a holder column that is not a holder",
                        key.as_str()
                    ))
                })?;
            let _ = rest;
            record.holder = Some(std::sync::Arc::new(h));
            record.lease_ms = Some(lease);
        }
        Ok(record)
    }))
}

/// The columns of one row, as read.
pub(crate) struct Row {
    pub(crate) version: i16,
    pub(crate) state: i16,
    pub(crate) owner: Option<Vec<u8>>,
    pub(crate) fencing: i64,
    pub(crate) fingerprint: Option<Vec<u8>>,
    pub(crate) kind: Option<i16>,
    pub(crate) result: Option<Vec<u8>>,
}

/// A row in one of our states, checked field by field.
pub(crate) enum Checked {
    Reserved {
        owner: OwnerToken,
        fencing: FencingToken,
        fingerprint: Option<Fingerprint>,
    },
    Completed {
        owner: OwnerToken,
        fencing: FencingToken,
        fingerprint: Option<Fingerprint>,
        result: StoredResult,
    },
}

impl Row {
    /// Checks every field; a row that no writer of this version produces is `Corrupt`,
    /// with what is wrong and where.
    pub(crate) fn check(self, key: &StorageKey) -> Result<Checked, StoreError> {
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
}

impl Checked {
    pub(crate) fn into_record(self, created_at_ms: i64, expires_at_ms: i64) -> Record {
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
