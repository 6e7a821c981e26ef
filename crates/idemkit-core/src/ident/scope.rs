//! [`Scope`]: whose effect.

use std::fmt;

use super::{IdentKind, KeyError, MAX_SCOPE_LEN, check_text};

/// Whose effect a key names: a tenant, an API principal. Two scopes never share records, even
/// when their callers pick the same key.
///
/// Any UTF-8 text of 1 to [`MAX_SCOPE_LEN`] bytes without control characters, not blank.
///
/// # Example
///
/// ```
/// use idemkit_core::Scope;
///
/// let tenant = Scope::new("tenant-42")?;
/// assert_eq!(tenant.as_str(), "tenant-42");
/// # Ok::<(), idemkit_core::KeyError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Scope(Box<str>);

impl Scope {
    /// Validates and builds a scope.
    ///
    /// # Errors
    ///
    /// [`KeyError`] when empty or blank, too long or holding a control character.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::Scope;
    /// assert!(Scope::new("").is_err());
    /// ```
    pub fn new(scope: impl Into<String>) -> Result<Self, KeyError> {
        let scope = scope.into();
        check_text(&scope, IdentKind::Scope, MAX_SCOPE_LEN)?;
        Ok(Scope(scope.into_boxed_str()))
    }

    /// The scope text.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::Scope;
    /// assert_eq!(Scope::new("t")?.as_str(), "t");
    /// # Ok::<(), idemkit_core::KeyError>(())
    /// ```
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&self.0)
    }
}

/// Parses like [`Scope::new`].
///
/// # Example
///
/// ```
/// let tenant: idemkit_core::Scope = "tenant-42".parse()?;
/// assert_eq!(tenant.as_str(), "tenant-42");
/// # Ok::<(), idemkit_core::KeyError>(())
/// ```
impl std::str::FromStr for Scope {
    type Err = KeyError;
    fn from_str(s: &str) -> Result<Self, KeyError> {
        Scope::new(s)
    }
}
