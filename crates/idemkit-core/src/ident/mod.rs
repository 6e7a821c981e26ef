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

mod key;
mod operation;
mod scope;
mod storage_key;

pub use key::Key;
pub use operation::Operation;
pub use scope::Scope;
pub use storage_key::StorageKey;

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

pub(super) fn check_text(s: &str, ident: IdentKind, max: usize) -> Result<(), KeyError> {
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
