//! [`Key`]: which effect.

use std::fmt;

use super::{IdentKind, KeyError, MAX_KEY_LEN, check_text};

/// The identity of one effect: `order-9.invoice`, not the id of the job that asked for it.
///
/// Any UTF-8 text of 1 to [`MAX_KEY_LEN`] bytes without control characters, `:` included,
/// that is not blank (only white space).
/// Build keys from the effect's own identity ([`Key::compose`]) so that two deliveries of the
/// same effect, even from two different jobs, share one key.
///
/// # Example
///
/// ```
/// use idemkit_core::Key;
///
/// let key = Key::new("order-9:invoice")?; // ':' is an ordinary character
/// assert_eq!(key.as_str(), "order-9:invoice");
/// # Ok::<(), idemkit_core::KeyError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(Box<str>);

impl Key {
    /// Validates and builds a key. A `String` argument is reused without copying.
    ///
    /// # Errors
    ///
    /// [`KeyError`] when the key is empty or blank (only white space), longer than
    /// [`MAX_KEY_LEN`] bytes or has a control character.
    ///
    /// # Example
    ///
    /// ```
    /// use idemkit_core::Key;
    ///
    /// assert!(Key::new("order-9.invoice").is_ok());
    /// assert!(Key::new("").is_err());
    /// assert!(Key::new("x".repeat(513)).is_err());
    /// ```
    pub fn new(key: impl Into<String>) -> Result<Self, KeyError> {
        let key = key.into();
        check_text(&key, IdentKind::Key, MAX_KEY_LEN)?;
        Ok(Key(key.into_boxed_str()))
    }

    /// Composes a key from the parts that identify an effect, such as an order id and an
    /// action: `["order-9", "invoice"]` becomes `order-9.invoice`.
    ///
    /// Parts are joined with `.`; a `.` or `\` inside a part is escaped with `\`, so the
    /// composition is injective: different part lists never give the same key.
    ///
    /// # Errors
    ///
    /// [`KeyError`] when there are no parts, a part is empty or blank or has a control
    /// character, or the result is longer than [`MAX_KEY_LEN`].
    ///
    /// # Example
    ///
    /// ```
    /// use idemkit_core::Key;
    ///
    /// assert_eq!(Key::compose(["order-9", "invoice"])?.as_str(), "order-9.invoice");
    /// assert_eq!(Key::compose(["v1.2", "7"])?.as_str(), "v1\\.2.7");
    /// # Ok::<(), idemkit_core::KeyError>(())
    /// ```
    pub fn compose<I>(parts: I) -> Result<Self, KeyError>
    where
        I: IntoIterator,
        I::Item: fmt::Display,
    {
        use fmt::Write as _;
        let mut out = String::new();
        let mut part = String::new();
        for (i, p) in parts.into_iter().enumerate() {
            part.clear();
            write!(part, "{p}").expect("writing to a String cannot fail");
            check_text(&part, IdentKind::KeyPart, MAX_KEY_LEN)?;
            if i > 0 {
                out.push('.');
            }
            for c in part.chars() {
                if c == '.' || c == '\\' {
                    out.push('\\');
                }
                out.push(c);
            }
        }
        Key::new(out)
    }

    /// The key text.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::Key;
    /// assert_eq!(Key::new("k")?.as_str(), "k");
    /// # Ok::<(), idemkit_core::KeyError>(())
    /// ```
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&self.0)
    }
}

impl std::str::FromStr for Key {
    type Err = KeyError;
    fn from_str(s: &str) -> Result<Self, KeyError> {
        Key::new(s)
    }
}
