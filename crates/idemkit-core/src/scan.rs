//! Listing a store's records page by page, for operators' tools (`idemkit list`, `purge`,
//! `stats` and the status page). Not used by the coordinator.
//!
//! A scan is cursor-based and bounded: each [`Scan::scan`] call reads about `count` entries
//! and returns a cursor for the next page, so walking a large production store never blocks
//! it (Redis `SCAN`, node by node on a Cluster, never `KEYS`; keyset pagination on
//! PostgreSQL). A record written or removed during a walk may or may not be seen; a record
//! that lives through the whole walk is seen: exactly once on MemoryStore and PostgreSQL, at
//! least once on Redis, whose `SCAN` may return a key twice (a purge then counts the second
//! removal as "changed meanwhile").
//!
//! Removal is fenced: [`Scan::remove`] deletes a record only if its fencing token is still
//! the one the scan saw, so a purge never deletes a reservation taken after the listing
//! (fencing tokens are never reused for a key).
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use idemkit_core::scan::Scan;
//! use idemkit_core::*;
//!
//! # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
//! let store = MemoryStore::new();
//! let op = Operation::new("mail.invoice")?;
//! let key = StorageKey::new(&op, None, &Key::new("order-9")?);
//! let Claim::Reserved { ownership, .. } =
//!     store.begin(&BeginRequest::new(&key, OwnerToken::random(), Duration::from_secs(30))).await?
//! else { unreachable!() };
//!
//! let mut cursor = None;
//! let mut seen = Vec::new();
//! loop {
//!     let page = store.scan(Some(&op), cursor.as_ref(), 100).await?;
//!     seen.extend(page.entries);
//!     match page.next {
//!         Some(next) => cursor = Some(next),
//!         None => break,
//!     }
//! }
//! assert_eq!(seen.len(), 1);
//! let record = seen[0].record.as_ref().unwrap();
//! assert_eq!(record.state, RecordState::Reserved);
//! // Fenced: removed only while it is still that reservation.
//! assert!(store.remove(&seen[0].key, ownership.fencing).await?);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::future::Future;

use crate::ident::{Operation, StorageKey};
use crate::record::{FencingToken, Record};
use crate::store::{RawStore, StoreError};

/// Where the next page of a scan starts. Opaque: its text is the store's own (a `SCAN`
/// cursor, a last key) and is only meant to be given back to the same store.
///
/// # Example
///
/// ```
/// let c = idemkit_core::scan::ScanCursor::new("0:17");
/// assert_eq!(c.as_str(), "0:17");
/// assert_eq!(c.to_string(), "0:17");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanCursor(String);

impl ScanCursor {
    /// A cursor with the store's text.
    pub fn new(text: impl Into<String>) -> Self {
        ScanCursor(text.into())
    }

    /// The store's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ScanCursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One entry found by a scan.
///
/// # Example
///
/// ```
/// use idemkit_core::{scan::Listed, Key, Operation, StorageKey};
/// let key = StorageKey::new(&Operation::new("op")?, None, &Key::new("k")?);
/// let foreign = Listed::new(key, None, 12);
/// assert!(foreign.record.is_none());
/// # Ok::<(), idemkit_core::KeyError>(())
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Listed {
    /// The record's address.
    pub key: StorageKey,
    /// The record; `None` when the bytes under the key are not a record of ours (written by
    /// something else, or corrupted).
    pub record: Option<Record>,
    /// The stored size in bytes (the encoded record, or the row's key and result).
    pub size: u64,
}

impl Listed {
    /// An entry.
    pub fn new(key: StorageKey, record: Option<Record>, size: u64) -> Self {
        Listed { key, record, size }
    }
}

/// One page of a scan.
///
/// # Example
///
/// ```
/// let page = idemkit_core::scan::ScanPage::new(Vec::new(), None, 1_700_000_000_000);
/// assert!(page.entries.is_empty() && page.next.is_none());
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ScanPage {
    /// The entries of this page (possibly none, even when more pages follow).
    pub entries: Vec<Listed>,
    /// The next page's cursor; `None` when the walk is over.
    pub next: Option<ScanCursor>,
    /// The store's clock when the page was read, in Unix milliseconds: ages and the time
    /// left are measured against it, not against the caller's clock.
    pub now_ms: u64,
}

impl ScanPage {
    /// A page.
    pub fn new(entries: Vec<Listed>, next: Option<ScanCursor>, now_ms: u64) -> Self {
        ScanPage {
            entries,
            next,
            now_ms,
        }
    }
}

/// A store whose records can be listed and removed by operators' tools.
///
/// Stores that keep expired records until a sweep (MemoryStore, PostgreSQL) list them too,
/// with an `expires_at_ms` in the past; Redis removes them itself and never lists them.
pub trait Scan: RawStore {
    /// One page of about `count` entries (a hint: a page may hold fewer, or more on Redis),
    /// starting at `cursor` (`None`: the first page), of `operation` only when given.
    fn scan(
        &self,
        operation: Option<&Operation>,
        cursor: Option<&ScanCursor>,
        count: usize,
    ) -> impl Future<Output = Result<ScanPage, StoreError>> + Send;

    /// Removes the record under `key` if its fencing token is still `fencing`, waking its
    /// waiters; `false` when it is gone or has become another reservation meanwhile. The
    /// next reservation of the key still gets a larger fencing token.
    fn remove(
        &self,
        key: &StorageKey,
        fencing: FencingToken,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;
}
