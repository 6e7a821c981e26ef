//! PostgreSQL errors and rows, mapped to what the coordinator must do about them.

use idemkit_core::{Record, StorageKey, StoreError, StoreErrorKind};
use idemkit_sql::row::{Columns, with_holder};

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
    let checked = columns(row, first)?.check(key);
    let (created, expires) = (row.try_get(first + 7)?, row.try_get(first + 8)?);
    // The holder column (migration 2), selected last by `get` and `scan`.
    let holder: Option<Vec<u8>> = row.try_get("holder")?;
    Ok(checked.and_then(|c| with_holder(c.into_record(created, expires), holder.as_deref(), key)))
}

/// The record's columns of a row, from column `first` on.
pub(crate) fn columns(row: &sqlx::postgres::PgRow, first: usize) -> Result<Columns, sqlx::Error> {
    use sqlx::Row as _;
    Ok(Columns {
        version: row.try_get(first)?,
        state: row.try_get(first + 1)?,
        owner: row.try_get(first + 2)?,
        fencing: row.try_get(first + 3)?,
        fingerprint: row.try_get(first + 4)?,
        kind: row.try_get(first + 5)?,
        result: row.try_get(first + 6)?,
    })
}
