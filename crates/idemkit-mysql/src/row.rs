//! Rows and errors, mapped to what the coordinator must do about them.

use idemkit_core::{Record, StorageKey, StoreError, StoreErrorKind};
use idemkit_sql::row::{Columns, with_holder};
use sqlx::Row as _;
use sqlx::mysql::MySqlRow;

/// Maps a driver error. Lost or refused connections, a pool that timed out, deadlocks, lock
/// wait timeouts and a read-only server are [`StoreErrorKind::Unavailable`]; a missing
/// table is [`StoreErrorKind::Rejected`] with a message that names the migration call; a
/// value over a column's limit is `Rejected`; a column that does not decode is `Corrupt`.
/// `migrate` names the call that creates the table.
pub(crate) fn map_err(e: sqlx::Error, table: &str, migrate: &str) -> StoreError {
    match &e {
        sqlx::Error::Database(db) => {
            let code = db
                .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                .map(|m| m.number())
                .unwrap_or(0);
            match code {
                // ER_NO_SUCH_TABLE, ER_BAD_FIELD_ERROR
                1146 | 1054 => StoreError::new(
                    StoreErrorKind::Rejected,
                    format!(
                        "the table {table} is missing or not migrated: call \
                         {migrate} once before use ({e})"
                    ),
                ),
                // deadlock, lock wait timeout, read-only, too many connections, shutdown,
                // lost connection
                1213 | 1205 | 1290 | 1792 | 1040 | 1053 | 2006 | 2013 => StoreError::unavailable(e),
                // data too long, out of range, packet too large
                1406 | 1264 | 1153 | 1301 => StoreError::new(StoreErrorKind::Rejected, e),
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

/// The record's columns of a row, from column `at` on: `version, state, owner, fencing,
/// fingerprint, kind, result`.
pub(crate) fn columns(row: &MySqlRow, at: usize) -> Result<Columns, sqlx::Error> {
    Ok(Columns {
        version: row.try_get(at)?,
        state: row.try_get(at + 1)?,
        owner: row.try_get(at + 2)?,
        fencing: row.try_get(at + 3)?,
        fingerprint: row.try_get(at + 4)?,
        kind: row.try_get(at + 5)?,
        result: row.try_get(at + 6)?,
    })
}

/// A row as `get` and `scan` select it, from column `at` on: the record's columns, its
/// times in ms, its holder block.
pub(crate) fn read_record(
    row: &MySqlRow,
    at: usize,
    key: &StorageKey,
) -> Result<Result<Record, StoreError>, sqlx::Error> {
    let checked = columns(row, at)?.check(key);
    let created: i64 = row.try_get(at + 7)?;
    let expires: i64 = row.try_get(at + 8)?;
    let holder: Option<Vec<u8>> = row.try_get(at + 9)?;
    Ok(checked.and_then(|c| with_holder(c.into_record(created, expires), holder.as_deref(), key)))
}
