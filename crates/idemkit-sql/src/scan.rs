//! What the SQL stores' `Scan` shares: the key range of an operation, and a page built from
//! rows in key order (which rows are listed, where the next page starts).

use idemkit_core::scan::{Listed, ScanCursor, ScanPage};
use idemkit_core::{Operation, Record, StorageKey};

/// The most rows a page asks for, whatever the caller asked.
pub const MAX_PAGE: usize = 10_000;

/// The range of storage keys a scan reads, `[from, until)`: an operation's keys, or (no
/// operation) every key from the start. `':' + 1` is `';'`, so the keys of `op` are
/// `[op:, op;)`.
///
/// ```
/// use idemkit_core::Operation;
///
/// let op = Operation::new("mail.invoice").unwrap();
/// let (from, until) = idemkit_sql::scan::range(Some(&op));
/// assert_eq!((from.as_str(), until.as_deref()), ("mail.invoice:", Some("mail.invoice;")));
/// assert_eq!(idemkit_sql::scan::range(None), (String::new(), None));
/// ```
pub fn range(operation: Option<&Operation>) -> (String, Option<String>) {
    match operation {
        Some(op) => (
            format!("{}:", op.as_str()),
            Some(format!("{};", op.as_str())),
        ),
        None => (String::new(), None),
    }
}

/// A page of a scan, built row by row in key order: each row's key text moves the cursor,
/// whether or not it is listed (a key idemkit did not write, a row kept only for its fencing
/// token), and a page as long as was asked for has a next one.
///
/// ```
/// use idemkit_sql::scan::Page;
///
/// let mut page = Page::new(2);
/// assert!(page.row("not a storage key".into()).is_none(), "read past, not listed");
/// let done = page.finish(1_700_000_000_000);
/// assert!(done.entries.is_empty());
/// assert!(done.next.is_none(), "fewer rows than asked: the last page");
/// ```
#[derive(Debug)]
pub struct Page {
    count: usize,
    rows: usize,
    entries: Vec<Listed>,
    last: Option<String>,
}

impl Page {
    /// A page of at most `count` rows (1 to [`MAX_PAGE`]); [`limit`](Self::limit) is what
    /// to ask the database for.
    pub fn new(count: usize) -> Self {
        let count = count.clamp(1, MAX_PAGE);
        Page {
            count,
            rows: 0,
            entries: Vec::with_capacity(count.min(256)),
            last: None,
        }
    }

    /// How many rows to read.
    pub fn limit(&self) -> usize {
        self.count
    }

    /// The next row's key, as text: the storage key to list it under, or `None` when it is
    /// not one idemkit wrote (not listed).
    pub fn row(&mut self, text: String) -> Option<StorageKey> {
        self.rows += 1;
        let parsed = StorageKey::parse(&text);
        self.last = Some(text);
        let (op, scope, key) = parsed?;
        Some(StorageKey::new(&op, scope.as_ref(), &key))
    }

    /// A key that is not text was not written by idemkit: read past (the cursor moves past
    /// it as text), not listed.
    pub fn skip(&mut self, text: String) {
        self.rows += 1;
        self.last = Some(text);
    }

    /// Lists `key` with its record (`None`: unreadable) and its row's size.
    pub fn list(&mut self, key: StorageKey, record: Option<Record>, size: i64) {
        self.entries
            .push(Listed::new(key, record, size.max(0) as u64));
    }

    /// Whether no row was read (the page's clock must then be asked for).
    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// The page, as of `now_ms` (the database's clock).
    pub fn finish(self, now_ms: i64) -> ScanPage {
        let next = (self.rows == self.count)
            .then(|| self.last.map(ScanCursor::new))
            .flatten();
        ScanPage::new(self.entries, next, now_ms.max(0) as u64)
    }
}
