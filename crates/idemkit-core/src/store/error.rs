//! A store's errors: what the caller should do about them, and an opaque source.

use std::error::Error as StdError;
use std::fmt;

/// A boxed error from a backend or a codec, kept opaque so that core names no backend type.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// What the caller of a failed store call should do about it.
///
/// # Example
///
/// ```
/// use idemkit_core::{StoreError, StoreErrorKind};
///
/// assert_eq!(StoreError::lease_lost().kind(), StoreErrorKind::LeaseLost);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// The store could not be reached or timed out; the call may succeed later. The only kind
    /// on which a fail-open coordinator runs an action unprotected.
    Unavailable,
    /// The caller's token no longer owns the key (its lease expired, and maybe another owner
    /// took it over). Nothing was written.
    LeaseLost,
    /// The bytes under the key are not a record this version reads (damaged, or written by
    /// something else). Nothing was changed; an operator must look (read it with
    /// [`Store::get`](super::Store::get), remove it with [`RawStore::purge`](super::RawStore::purge)).
    Corrupt,
    /// The store refused the request itself (say, a value over a server limit). Retrying the
    /// same request will not help.
    Rejected,
    /// Anything else.
    Other,
}

/// An error from a [`Store`](super::Store): a [`StoreErrorKind`] and an opaque source.
///
/// # Example
///
/// ```
/// use idemkit_core::StoreError;
///
/// let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
/// let e = StoreError::unavailable(io);
/// assert!(e.is_unavailable());
/// assert_eq!(e.to_string(), "store unavailable: refused");
/// ```
#[derive(Debug)]
pub struct StoreError {
    kind: StoreErrorKind,
    source: Option<BoxError>,
}

impl StoreError {
    /// An error of a kind, with a source.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::{StoreError, StoreErrorKind};
    /// let e = StoreError::new(StoreErrorKind::Rejected, "value too large");
    /// assert_eq!(e.kind(), StoreErrorKind::Rejected);
    /// ```
    pub fn new(kind: StoreErrorKind, source: impl Into<BoxError>) -> Self {
        StoreError {
            kind,
            source: Some(source.into()),
        }
    }

    /// The store could not be reached.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::StoreError;
    /// assert!(StoreError::unavailable("timed out").is_unavailable());
    /// ```
    pub fn unavailable(source: impl Into<BoxError>) -> Self {
        Self::new(StoreErrorKind::Unavailable, source)
    }

    /// The caller's lease is gone.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::StoreError;
    /// assert!(StoreError::lease_lost().is_lease_lost());
    /// ```
    pub fn lease_lost() -> Self {
        StoreError {
            kind: StoreErrorKind::LeaseLost,
            source: None,
        }
    }

    /// The record under the key cannot be read.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::{StoreError, StoreErrorKind};
    /// assert_eq!(StoreError::corrupt("bad magic").kind(), StoreErrorKind::Corrupt);
    /// ```
    pub fn corrupt(source: impl Into<BoxError>) -> Self {
        Self::new(StoreErrorKind::Corrupt, source)
    }

    /// The kind.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::{StoreError, StoreErrorKind};
    /// assert_eq!(StoreError::unavailable("x").kind(), StoreErrorKind::Unavailable);
    /// ```
    pub fn kind(&self) -> StoreErrorKind {
        self.kind
    }

    /// Whether the store was unreachable.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::StoreError;
    /// assert!(!StoreError::lease_lost().is_unavailable());
    /// ```
    pub fn is_unavailable(&self) -> bool {
        self.kind == StoreErrorKind::Unavailable
    }

    /// Whether the caller's lease was lost.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::StoreError;
    /// assert!(!StoreError::unavailable("x").is_lease_lost());
    /// ```
    pub fn is_lease_lost(&self) -> bool {
        self.kind == StoreErrorKind::LeaseLost
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            StoreErrorKind::Unavailable => "store unavailable",
            StoreErrorKind::LeaseLost => "lease lost: the key is no longer owned by this caller",
            StoreErrorKind::Corrupt => "corrupt or foreign record under the key",
            StoreErrorKind::Rejected => "store rejected the request",
            StoreErrorKind::Other => "store error",
        };
        match &self.source {
            Some(s) => write!(f, "{what}: {s}"),
            None => f.write_str(what),
        }
    }
}

impl StdError for StoreError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static))
    }
}
