//! Identity types: what an idempotency record is stored under.
//!
//! A record is named by three things: the [`Operation`] (what kind of effect, e.g.
//! `mail.invoice`), an optional [`Scope`] (whose effect: a tenant or principal) and the
//! [`Key`] (which effect: `order-9.invoice`). [`StorageKey`] joins them with an injective
//! encoding, so two different triples can never share a record.
//!
//! Every check happens when one of these values is built. A value that exists is storable:
//! no store may refuse it later, and so no path can run an action "unprotected" because its
//! key turned out to be unstorable (the seed's bug, where a `:` in a key made the record fail
//! validation inside the store and the action ran anyway).

use std::fmt;
use std::sync::{Arc, OnceLock};

use crate::observe::OpMetrics;

/// The longest [`Key`], in bytes of UTF-8.
pub const MAX_KEY_LEN: usize = 512;
/// The longest [`Operation`] name, in bytes.
pub const MAX_OPERATION_LEN: usize = 128;
/// The longest [`Scope`], in bytes of UTF-8.
pub const MAX_SCOPE_LEN: usize = 256;

/// Which identity value failed validation.
///
/// # Example
///
/// ```
/// use idemkit_core::{Key, KeyError, IdentKind};
///
/// let err = Key::new("").unwrap_err();
/// assert_eq!(err.ident(), IdentKind::Key);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum IdentKind {
    /// An [`Operation`] name.
    Operation,
    /// A [`Key`].
    Key,
    /// A [`Scope`].
    Scope,
    /// One part given to [`Key::compose`].
    KeyPart,
}

impl fmt::Display for IdentKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            IdentKind::Operation => "operation",
            IdentKind::Key => "key",
            IdentKind::Scope => "scope",
            IdentKind::KeyPart => "key part",
        })
    }
}

/// An invalid operation, key or scope. Returned when the value is built, before any store is
/// touched or any action runs.
///
/// # Example
///
/// ```
/// use idemkit_core::{Key, KeyError};
///
/// assert!(matches!(Key::new("order-9\ninvoice"), Err(KeyError::ControlChar { .. })));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The value was empty, or only white space.
    #[error("{ident} is empty or blank")]
    Empty {
        /// Which value.
        ident: IdentKind,
    },
    /// The value was longer than its limit.
    #[error("{ident} is {len} bytes long, the limit is {max}")]
    TooLong {
        /// Which value.
        ident: IdentKind,
        /// Its length in bytes.
        len: usize,
        /// The limit in bytes.
        max: usize,
    },
    /// The value held a control character (they corrupt logs and headers).
    #[error("{ident} has a control character at byte {index}")]
    ControlChar {
        /// Which value.
        ident: IdentKind,
        /// Byte offset of the character.
        index: usize,
    },
    /// An operation name held a character outside `[A-Za-z0-9._/{}-]` and inner spaces.
    #[error(
        "{ident} has {ch:?} at byte {index}; allowed are A-Z a-z 0-9 . _ / {{ }} - and inner spaces"
    )]
    InvalidChar {
        /// Which value.
        ident: IdentKind,
        /// The character.
        ch: char,
        /// Byte offset of the character.
        index: usize,
    },
}

impl KeyError {
    /// Which value failed.
    ///
    /// # Example
    ///
    /// ```
    /// use idemkit_core::{IdentKind, Operation};
    ///
    /// assert_eq!(Operation::new("mail:invoice").unwrap_err().ident(), IdentKind::Operation);
    /// ```
    pub fn ident(&self) -> IdentKind {
        match self {
            KeyError::Empty { ident }
            | KeyError::TooLong { ident, .. }
            | KeyError::ControlChar { ident, .. }
            | KeyError::InvalidChar { ident, .. } => *ident,
        }
    }
}

fn check_text(s: &str, ident: IdentKind, max: usize) -> Result<(), KeyError> {
    // Blank counts as empty: an id field that came through as spaces must not become a
    // key that every other blank id shares.
    // A printable ASCII first byte cannot start a blank value: most keys stop there.
    let printable = s.as_bytes().first().is_some_and(u8::is_ascii_graphic);
    if !printable && s.trim_start().is_empty() {
        return Err(KeyError::Empty { ident });
    }
    if s.len() > max {
        return Err(KeyError::TooLong {
            ident,
            len: s.len(),
            max,
        });
    }
    if let Some((index, _)) = s.char_indices().find(|(_, c)| c.is_control()) {
        return Err(KeyError::ControlChar { ident, index });
    }
    Ok(())
}

// ===== Operation =====

/// The kind of effect a key protects, such as `mail.invoice` or `payment.charge`.
///
/// Names are 1 to [`MAX_OPERATION_LEN`] bytes of `[A-Za-z0-9._/{}-]` and spaces (not at
/// either end), so a route can name its operation (`POST /orders/{id}/pay`): they are code
/// constants, metric labels and log fields, so a small alphabet keeps them readable
/// everywhere. Never `:`, which separates the parts of a [`StorageKey`]. Cloning is a
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

// ===== Key =====

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

// ===== Scope =====

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

// ===== StorageKey =====

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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn text(max: usize) -> impl Strategy<Value = String> {
        // Any non-control characters, ':' and digits over-represented to stress the encoding.
        proptest::collection::vec(
            prop_oneof![
                Just(':'),
                Just('0'),
                Just('1'),
                Just('\\'),
                Just('.'),
                any::<char>()
            ],
            1..12,
        )
        .prop_map(|cs| {
            cs.into_iter()
                .filter(|c| !c.is_control())
                .collect::<String>()
        })
        .prop_filter("not blank, within limit", move |s| {
            !s.trim().is_empty() && s.len() <= max
        })
    }

    fn op() -> impl Strategy<Value = String> {
        "[a-z0-9._/{} -]{1,12}".prop_filter("no space at either end", |s| {
            !s.starts_with(' ') && !s.ends_with(' ')
        })
    }

    proptest! {
        #[test]
        fn storage_key_is_injective(
            a in (op(), proptest::option::of(text(MAX_SCOPE_LEN)), text(MAX_KEY_LEN)),
            b in (op(), proptest::option::of(text(MAX_SCOPE_LEN)), text(MAX_KEY_LEN)),
        ) {
            let build = |(o, s, k): &(String, Option<String>, String)| {
                let o = Operation::new(o).unwrap();
                let s = s.as_ref().map(|s| Scope::new(s.clone()).unwrap());
                let k = Key::new(k.clone()).unwrap();
                (StorageKey::new(&o, s.as_ref(), &k), (o, s, k))
            };
            let (ska, ta) = build(&a);
            let (skb, tb) = build(&b);
            // Injective: equal storage keys only for equal triples...
            prop_assert_eq!(ska == skb, ta == tb);
            // ...because the encoding can be decoded back to the exact triple.
            prop_assert_eq!(StorageKey::parse(ska.as_str()), Some(ta));
        }

        #[test]
        fn every_valid_key_is_storable(k in text(MAX_KEY_LEN)) {
            // A key that builds always yields a storage key that decodes to it: there is no
            // second validation anywhere that could refuse it later.
            let key = Key::new(k).unwrap();
            let sk = StorageKey::new(&Operation::new("op").unwrap(), None, &key);
            prop_assert_eq!(StorageKey::parse(sk.as_str()).unwrap().2, key);
        }

        #[test]
        fn compose_is_injective(
            a in proptest::collection::vec(text(40), 1..4),
            b in proptest::collection::vec(text(40), 1..4),
        ) {
            let ka = Key::compose(&a).unwrap();
            let kb = Key::compose(&b).unwrap();
            prop_assert_eq!(ka == kb, a == b);
        }
    }

    #[test]
    fn colliding_naive_joins_stay_apart() {
        // With a naive "op:scope:key" join these two would collide.
        let op = Operation::new("op").unwrap();
        let a = StorageKey::new(
            &op,
            Some(&Scope::new("a:b").unwrap()),
            &Key::new("c").unwrap(),
        );
        let b = StorageKey::new(
            &op,
            Some(&Scope::new("a").unwrap()),
            &Key::new("b:c").unwrap(),
        );
        assert_ne!(a, b);
        assert_ne!(
            Key::compose(["a.b", "c"]).unwrap(),
            Key::compose(["a", "b.c"]).unwrap()
        );
    }

    #[test]
    fn invalid_values_are_typed_errors() {
        assert_eq!(
            Key::new(""),
            Err(KeyError::Empty {
                ident: IdentKind::Key
            })
        );
        assert_eq!(
            Key::new("a".repeat(MAX_KEY_LEN + 1)),
            Err(KeyError::TooLong {
                ident: IdentKind::Key,
                len: MAX_KEY_LEN + 1,
                max: MAX_KEY_LEN
            })
        );
        assert!(Key::new("a".repeat(MAX_KEY_LEN)).is_ok());
        assert_eq!(
            Key::new("ab\u{7f}"),
            Err(KeyError::ControlChar {
                ident: IdentKind::Key,
                index: 2
            })
        );
        assert_eq!(
            Operation::new("mail:invoice"),
            Err(KeyError::InvalidChar {
                ident: IdentKind::Operation,
                ch: ':',
                index: 4
            })
        );
        assert_eq!(Scope::new("\t").unwrap_err().ident(), IdentKind::Scope);
        assert_eq!(
            Key::compose(["a", ""]).unwrap_err(),
            KeyError::Empty {
                ident: IdentKind::KeyPart
            }
        );
        assert_eq!(
            Key::compose(Vec::<&str>::new()).unwrap_err(),
            KeyError::Empty {
                ident: IdentKind::Key
            }
        );
    }
}
