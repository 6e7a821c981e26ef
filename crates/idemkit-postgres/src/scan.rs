//! Listing and fenced removal for operators' tools ([`Scan`]): keyset pagination on the
//! records table's primary key, one statement per page; removal is one statement.

use idemkit_core::scan::{Scan, ScanCursor, ScanPage};
use idemkit_core::{FencingToken, Operation, StorageKey, StoreError};
use idemkit_sql::scan::{self, Page};
use sqlx::Row as _;

use crate::PgStore;
use crate::errors::read_record;

impl PgStore {
    /// The records table's size on disk with its indexes and TOAST, in bytes
    /// (`pg_total_relation_size`): what `idemkit stats` reports as the bytes used.
    ///
    /// # Errors
    ///
    /// The store's errors.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn f(store: idemkit_postgres::PgStore) -> Result<(), idemkit_core::StoreError> {
    /// println!("{} bytes", store.table_bytes().await?);
    /// # Ok(()) }
    /// ```
    pub async fn table_bytes(&self) -> Result<u64, StoreError> {
        let bytes: i64 = sqlx::query_scalar(&self.inner.sql.table_bytes)
            .fetch_one(&self.inner.pool)
            .await
            .map_err(|e| self.err(e))?;
        Ok(bytes.max(0) as u64)
    }
}

/// Pages in key order; the cursor is the last key of the page. Lists only this store's table.
impl Scan for PgStore {
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
            .bind(page.limit() as i64)
            .fetch_all(&self.inner.pool)
            .await
            .map_err(|e| self.err(e))?;
        let get = |e| self.err(e);
        let mut now_ms = None;
        for row in &rows {
            let text: String = row.try_get(0).map_err(get)?;
            now_ms = Some(row.try_get::<i64, _>(11).map_err(get)?);
            let size: i64 = row.try_get(10).map_err(get)?;
            // A row whose key is not a storage key was not written by idemkit: not listed.
            let Some(key) = page.row(text) else {
                continue;
            };
            let record = read_record(row, 1, &key).map_err(get)?.ok();
            page.list(key, record, size);
        }
        let now_ms = match now_ms {
            Some(n) => n,
            None => sqlx::query_scalar(&self.inner.sql.now)
                .fetch_one(&self.inner.pool)
                .await
                .map_err(|e| self.err(e))?,
        };
        Ok(page.finish(now_ms))
    }

    async fn remove(&self, key: &StorageKey, fencing: FencingToken) -> Result<bool, StoreError> {
        let row = sqlx::query(&self.inner.sql.remove)
            .bind(key.as_str())
            .bind(fencing.get() as i64)
            .fetch_one(&self.inner.pool)
            .await
            .map_err(|e| self.err(e))?;
        let deleted: i64 = row.try_get(0).map_err(|e| self.err(e))?;
        Ok(deleted > 0)
    }
}
