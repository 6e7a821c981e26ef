//! Listing and fenced removal for operators' tools ([`Scan`]): keyset pagination on the
//! table's primary key, one statement per page; a removal is one transaction.

use idemkit_core::scan::{Scan, ScanCursor, ScanPage};
use idemkit_core::{FencingToken, Operation, StorageKey, StoreError};
use idemkit_sql::scan::{self, Page};
use sqlx::Row as _;

use crate::MySqlStore;
use crate::row::read_record;
use crate::store::fencing_i64;

/// The state of a released row: an ended reservation kept only for its fencing token.
const RELEASED: i16 = 3;

impl MySqlStore {
    /// The table's and its fencing table's size on disk with their indexes, in bytes, as
    /// `information_schema.tables` estimates it: what `idemkit stats` reports as the bytes
    /// used.
    ///
    /// # Errors
    ///
    /// The store's errors.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn f(store: idemkit_mysql::MySqlStore) -> Result<(), idemkit_core::StoreError> {
    /// println!("{} bytes", store.table_bytes().await?);
    /// # Ok(()) }
    /// ```
    pub async fn table_bytes(&self) -> Result<u64, StoreError> {
        let bytes: i64 = sqlx::query_scalar(&self.inner.sql.table_bytes)
            .bind(&self.inner.table)
            .bind(format!("{}_fencing", self.inner.table))
            .fetch_one(&self.inner.pool)
            .await
            .map_err(|e| self.err(e))?;
        Ok(bytes.max(0) as u64)
    }
}

/// Pages in key order; the cursor is the last key of the page. Lists only this store's
/// table, and not the rows that only keep a released reservation's fencing token (they are
/// expired; [`MySqlStore::purge_expired`] removes them).
impl Scan for MySqlStore {
    async fn scan(
        &self,
        operation: Option<&Operation>,
        cursor: Option<&ScanCursor>,
        count: usize,
    ) -> Result<ScanPage, StoreError> {
        let mut page = Page::new(count);
        let (from, until) = scan::range(operation);
        let rows = sqlx::query(&self.inner.sql.scan)
            .bind(cursor.map_or("", ScanCursor::as_str))
            .bind(&from)
            .bind(until.as_deref())
            .bind(until.as_deref())
            .bind(page.limit() as i64)
            .fetch_all(&self.inner.pool)
            .await
            .map_err(|e| self.err(e))?;
        let get = |e| self.err(e);
        let mut now_ms = None;
        for row in &rows {
            let bytes: Vec<u8> = row.try_get(0).map_err(get)?;
            now_ms = Some(row.try_get::<i64, _>(12).map_err(get)?);
            let size: i64 = row.try_get(11).map_err(get)?;
            let state: i16 = row.try_get(2).map_err(get)?;
            // Keys are written from `&str`: one that is not UTF-8 was not written by idemkit
            // (it is not listed; the cursor moves past it as text).
            let key = match String::from_utf8(bytes) {
                Ok(text) => page.row(text),
                Err(e) => {
                    page.skip(String::from_utf8_lossy(e.as_bytes()).into_owned());
                    None
                }
            };
            // Not a key idemkit wrote, or a row kept only for its fencing token.
            let Some(key) = key.filter(|_| state != RELEASED) else {
                continue;
            };
            let record = read_record(row, 1, &key).map_err(get)?.ok();
            page.list(key, record, size);
        }
        let now_ms = match now_ms {
            Some(n) => n,
            None => sqlx::query_scalar(&self.inner.sql.now_ms)
                .fetch_one(&self.inner.pool)
                .await
                .map_err(|e| self.err(e))?,
        };
        Ok(page.finish(now_ms))
    }

    async fn remove(&self, key: &StorageKey, fencing: FencingToken) -> Result<bool, StoreError> {
        // No notification to send: a waiter sees the row gone at its next re-check.
        let n = self
            .keeping_tokens(&self.inner.sql.keep_token, Some(key.as_str()), |_| {
                sqlx::query(&self.inner.sql.remove)
                    .bind(key.as_str())
                    .bind(fencing_i64(fencing))
            })
            .await?;
        Ok(n > 0)
    }
}
