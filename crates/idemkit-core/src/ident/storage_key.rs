//! [`StorageKey`]: the injective name a record is stored under.

use std::fmt;
use std::sync::Arc;

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
pub struct StorageKey(Arc<str>);

impl StorageKey {
    /// Encodes a triple. One allocation, sized exactly; clones share it (a call clones its
    /// key for the attempt's downstream key, and MemoryStore keeps it as its table's key).
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
        let parts = [
            operation.as_str().as_bytes(),
            b":",
            &digits[at..],
            b":",
            scope.as_bytes(),
            b":",
            key.as_str().as_bytes(),
        ];
        let len: usize = parts.iter().map(|p| p.len()).sum();
        // Assembled on the stack when short (nearly always), so that the `Arc` is the one
        // allocation; a longer key goes through a `String` first.
        let mut buf = [0u8; 128];
        if let Some(dst) = buf.get_mut(..len) {
            let mut at = 0;
            for p in parts {
                dst[at..at + p.len()].copy_from_slice(p);
                at += p.len();
            }
            let text = std::str::from_utf8(dst).expect("joined from strings and ASCII");
            return StorageKey(Arc::from(text));
        }
        let mut s = String::with_capacity(len);
        for p in parts {
            s.push_str(std::str::from_utf8(p).expect("a string or ASCII"));
        }
        StorageKey(Arc::from(s))
    }

    /// The shared text, for a store that keeps the key (MemoryStore's table).
    pub(crate) fn shared(&self) -> &Arc<str> {
        &self.0
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
