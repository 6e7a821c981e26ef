//! [`Operation`]: the kind of effect.

use std::fmt;
use std::sync::{Arc, OnceLock};

use super::{IdentKind, KeyError, MAX_OPERATION_LEN};
use crate::observe::OpMetrics;

/// The kind of effect a key protects, such as `mail.invoice` or `payment.charge`.
///
/// Names are 1 to [`MAX_OPERATION_LEN`] bytes of `[A-Za-z0-9._/{}-]` and spaces (not at
/// either end), so a route can name its operation (`POST /orders/{id}/pay`): they are code
/// constants, metric labels and log fields, so a small alphabet keeps them readable
/// everywhere. Never `:`, which separates the parts of a [`StorageKey`](super::StorageKey). Cloning is a
/// reference-count increment.
///
/// Each `Operation` caches its metric handles, registered on its first call (see
/// [`observe`](crate::observe)); two equal operations built separately register separately,
/// so build each once and clone it.
///
/// # Example
///
/// ```
/// use idemkit_core::Operation;
///
/// let op = Operation::new("mail.invoice")?;
/// assert_eq!(op.as_str(), "mail.invoice");
/// # Ok::<(), idemkit_core::KeyError>(())
/// ```
#[derive(Clone)]
pub struct Operation(Arc<OperationInner>);

struct OperationInner {
    name: Arc<str>,
    /// Metric handles, registered on first use (see `observe::OpMetrics`).
    metrics: OnceLock<OpMetrics>,
}

impl PartialEq for Operation {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Operation {}

impl std::hash::Hash for Operation {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl PartialOrd for Operation {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Operation {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl Operation {
    /// Validates and builds an operation name.
    ///
    /// # Errors
    ///
    /// [`KeyError`] when the name is empty, too long or has a character outside the alphabet.
    ///
    /// # Example
    ///
    /// ```
    /// use idemkit_core::Operation;
    ///
    /// assert!(Operation::new("payment.charge").is_ok());
    /// assert!(Operation::new("POST /orders/{id}/pay").is_ok());
    /// assert!(Operation::new("payment:charge").is_err());
    /// assert!(Operation::new(" padded").is_err());
    /// ```
    pub fn new(name: impl AsRef<str>) -> Result<Self, KeyError> {
        let name = name.as_ref();
        let ident = IdentKind::Operation;
        if name.trim_start().is_empty() {
            return Err(KeyError::Empty { ident });
        }
        // Inner spaces only: " x" and "x " would look like "x" in every log and label.
        if name.starts_with(' ') || name.ends_with(' ') {
            let index = if name.starts_with(' ') {
                0
            } else {
                name.len() - 1
            };
            return Err(KeyError::InvalidChar {
                ident,
                ch: ' ',
                index,
            });
        }
        if name.len() > MAX_OPERATION_LEN {
            return Err(KeyError::TooLong {
                ident,
                len: name.len(),
                max: MAX_OPERATION_LEN,
            });
        }
        if let Some((index, ch)) = name.char_indices().find(|(_, c)| {
            !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '/' | '-' | ' ' | '{' | '}'))
        }) {
            return Err(KeyError::InvalidChar { ident, ch, index });
        }
        Ok(Operation(Arc::new(OperationInner {
            name: Arc::from(name),
            metrics: OnceLock::new(),
        })))
    }

    /// The name.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::Operation;
    /// assert_eq!(Operation::new("a.b")?.as_str(), "a.b");
    /// # Ok::<(), idemkit_core::KeyError>(())
    /// ```
    pub fn as_str(&self) -> &str {
        &self.0.name
    }

    /// This operation's metric handles.
    pub(crate) fn metrics(&self) -> &OpMetrics {
        self.0.metrics.get_or_init(|| {
            OpMetrics::register(metrics::SharedString::from_shared(self.0.name.clone()))
        })
    }
}

impl fmt::Debug for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

impl std::str::FromStr for Operation {
    type Err = KeyError;
    fn from_str(s: &str) -> Result<Self, KeyError> {
        Operation::new(s)
    }
}
