//! [`StorageKey`]: the injective name a record is stored under.

use std::fmt;

use super::{Key, Operation, Scope};

/// The text a store files a record under: operation, scope and key in one injective string.
///
/// The layout is `{operation}:{scope length}:{scope}:{key}`, with length `0` and an empty
/// scope when there is none (a real scope is never empty). The operation has no `:`, the
/// scope is length-prefixed and the key is the rest, so [`StorageKey::parse`] recovers the
/// exact triple: two different triples never meet. Stores add their own namespace prefix in
/// front; they must not otherwise alter or reject it.
///
/// # Example
///
/// ```
/// use idemkit_core::{Key, Operation, Scope, StorageKey};
///
/// let op = Operation::new("mail.invoice")?;
/// let key = Key::new("order-9:invoice")?;
/// assert_eq!(StorageKey::new(&op, None, &key).as_str(), "mail.invoice:0::order-9:invoice");
/// let t = Scope::new("t1")?;
/// assert_eq!(StorageKey::new(&op, Some(&t), &key).as_str(), "mail.invoice:2:t1:order-9:invoice");
/// # Ok::<(), idemkit_core::KeyError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StorageKey(String);

impl StorageKey {
    /// Encodes a triple. One allocation, sized exactly.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::{Key, Operation, StorageKey};
    /// let sk = StorageKey::new(&Operation::new("op")?, None, &Key::new("k")?);
    /// assert_eq!(sk.as_str(), "op:0::k");
    /// # Ok::<(), idemkit_core::KeyError>(())
    /// ```
    pub fn new(operation: &Operation, scope: Option<&Scope>, key: &Key) -> Self {
        let scope = scope.map_or("", Scope::as_str);
        let mut s =
            String::with_capacity(operation.as_str().len() + scope.len() + key.as_str().len() + 8);
        s.push_str(operation.as_str());
        s.push(':');
        // The scope's length in decimal, without the formatting machinery (hot path).
        let mut digits = [0u8; 20];
        let (mut n, mut at) = (scope.len(), digits.len());
        loop {
            at -= 1;
            digits[at] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        s.push_str(std::str::from_utf8(&digits[at..]).expect("ASCII digits"));
        s.push(':');
        s.push_str(scope);
        s.push(':');
        s.push_str(key.as_str());
        StorageKey(s)
    }

    /// Decodes a storage key back into its triple; `None` when the text is not one.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::StorageKey;
    /// let (op, scope, key) = StorageKey::parse("mail.invoice:2:t1:a:b").unwrap();
    /// assert_eq!((op.as_str(), scope.unwrap().as_str(), key.as_str()), ("mail.invoice", "t1", "a:b"));
    /// assert!(StorageKey::parse("no-colons").is_none());
    /// ```
    pub fn parse(text: &str) -> Option<(Operation, Option<Scope>, Key)> {
        let (op, rest) = text.split_once(':')?;
        let (len, rest) = rest.split_once(':')?;
        // Reject "007" and "+7": the encoder only writes canonical decimal.
        if len.is_empty() || (len.len() > 1 && len.starts_with('0')) {
            return None;
        }
        if !len.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let len: usize = len.parse().ok()?;
        let scope = rest.get(..len)?;
        let key = rest.get(len..)?.strip_prefix(':')?;
        let scope = if len == 0 {
            None
        } else {
            Some(Scope::new(scope).ok()?)
        };
        Some((Operation::new(op).ok()?, scope, Key::new(key).ok()?))
    }

    /// The encoded text.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::{Key, Operation, StorageKey};
    /// let sk = StorageKey::new(&Operation::new("op")?, None, &Key::new("k")?);
    /// assert!(sk.as_str().ends_with(":k"));
    /// # Ok::<(), idemkit_core::KeyError>(())
    /// ```
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for StorageKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for StorageKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&self.0)
    }
}
