//! The downstream key: what an action passes to a receiver that deduplicates (a payment or
//! mail provider's `Idempotency-Key`, another service behind idemkit's HTTP layer), so that
//! the one window no reservation can close (the send happened, the worker died before
//! storing its result, the redelivery sends again) is closed by the receiver.
//!
//! It is derived from the effect's identity alone (operation, scope, key), so every attempt
//! of one effect, on every machine and store and in every version of idemkit, passes the same
//! key; the [fencing token](crate::FencingToken) changes on every attempt by design (it
//! orders writers) and is the wrong thing to deduplicate on.
//!
//! # Format (version 1)
//!
//! `idk1_` followed by the 52-character lowercase base32 (RFC 4648 alphabet, `a-z2-7`, no
//! padding) of SHA-256 over `"idemkit downstream key v1"`, one zero byte, and the effect's
//! [`StorageKey`] text (`{operation}:{scope length}:{scope}:{key}`, an injective encoding).
//! With a secret ([`DownstreamSecret`]): `idk1s_` and HMAC-SHA-256 keyed with the secret over
//! the same bytes, so the receiver learns nothing of private keys (an unkeyed digest of a
//! guessable key can be confirmed by guessing). 57 or 58 characters of `[a-z0-9_]`: within
//! every provider's limit we know of, and safe in HTTP headers, URLs and JSON. Two different
//! effects share a key only if SHA-256 collides. docs/downstream-key.md has test vectors.
//!
//! # Example
//!
//! ```
//! use idemkit_core::{DownstreamKey, Key, Operation};
//! let k = DownstreamKey::of(&Operation::new("mail.invoice")?, None, &Key::new("order-9.invoice")?);
//! assert!(k.as_str().starts_with("idk1_") && k.as_str().len() == 57);
//! # Ok::<(), idemkit_core::KeyError>(())
//! ```

use std::fmt;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::ident::{Key, Operation, Scope, StorageKey};

/// The domain separator: no other SHA-256 input of idemkit starts with it.
const DOMAIN: &[u8] = b"idemkit downstream key v1\0";

/// The domain separator of a child key ([`DownstreamKey::child`]).
const CHILD_DOMAIN: &[u8] = b"idemkit downstream child key v1\0";

/// A stable idempotency key for a receiver, derived from an effect's identity (see the
/// [module docs](crate::downstream) for the format).
///
/// # Example
///
/// ```
/// use idemkit_core::{DownstreamKey, Key, Operation, Scope};
/// let op = Operation::new("mail.invoice")?;
/// let key = Key::new("order-9.invoice")?;
/// let t1 = Scope::new("tenant-1")?;
/// assert_eq!(DownstreamKey::of(&op, None, &key), DownstreamKey::of(&op, None, &key));
/// assert_ne!(DownstreamKey::of(&op, None, &key), DownstreamKey::of(&op, Some(&t1), &key));
/// # Ok::<(), idemkit_core::KeyError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct DownstreamKey(String);

impl DownstreamKey {
    /// The unkeyed key of an effect.
    pub fn of(operation: &Operation, scope: Option<&Scope>, key: &Key) -> Self {
        Self::of_storage_key(&StorageKey::new(operation, scope, key), None)
    }

    /// The key of an effect under a secret: reveals nothing of the effect's key.
    ///
    /// # Example
    ///
    /// ```
    /// use idemkit_core::{DownstreamKey, DownstreamSecret, Key, Operation};
    /// let secret = DownstreamSecret::new(b"0123456789abcdef0123456789abcdef".to_vec())?;
    /// let k = DownstreamKey::keyed(&secret, &Operation::new("op")?, None, &Key::new("k")?);
    /// assert!(k.as_str().starts_with("idk1s_"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn keyed(
        secret: &DownstreamSecret,
        operation: &Operation,
        scope: Option<&Scope>,
        key: &Key,
    ) -> Self {
        Self::of_storage_key(&StorageKey::new(operation, scope, key), Some(secret))
    }

    /// The key of the effect filed under `key`, keyed when `secret` is given.
    ///
    /// # Example
    ///
    /// ```
    /// use idemkit_core::{DownstreamKey, Key, Operation, StorageKey};
    /// let (op, key) = (Operation::new("op")?, Key::new("k")?);
    /// let sk = StorageKey::new(&op, None, &key);
    /// assert_eq!(DownstreamKey::of_storage_key(&sk, None), DownstreamKey::of(&op, None, &key));
    /// # Ok::<(), idemkit_core::KeyError>(())
    /// ```
    pub fn of_storage_key(key: &StorageKey, secret: Option<&DownstreamSecret>) -> Self {
        let (prefix, digest): (&str, [u8; 32]) = match secret {
            None => {
                let mut h = Sha256::new();
                h.update(DOMAIN);
                h.update(key.as_str().as_bytes());
                ("idk1_", h.finalize().into())
            }
            Some(secret) => (
                "idk1s_",
                hmac_sha256(&secret.0, &[DOMAIN, key.as_str().as_bytes()]),
            ),
        };
        let mut out = String::with_capacity(prefix.len() + 52);
        out.push_str(prefix);
        base32(&digest, &mut out);
        DownstreamKey(out)
    }

    /// The key of one of several messages or calls one effect makes (issue 52): the `part`th
    /// message it publishes, the line of an order it charges. The same parent and part give
    /// the same key on every attempt, different parts different keys; the format is the
    /// parent's (`idk1_` or `idk1s_` and 52 base32 characters: SHA-256 over a domain of its
    /// own, the parent's text, a zero byte and `part`), so a receiver that takes the parent
    /// takes a child too, and a child reveals nothing of its parent's effect that the parent
    /// does not. An effect that sends one message uses the key itself.
    ///
    /// # Example
    ///
    /// ```
    /// use idemkit_core::{DownstreamKey, Key, Operation};
    /// let k = DownstreamKey::of(&Operation::new("orders.ship")?, None, &Key::new("order-9")?);
    /// let (a, b) = (k.child("shipped"), k.child("invoice-requested"));
    /// assert_eq!(a, k.child("shipped"));
    /// assert_ne!(a, b);
    /// assert!(a.as_str().starts_with("idk1_") && a.as_str().len() == k.as_str().len());
    /// # Ok::<(), idemkit_core::KeyError>(())
    /// ```
    pub fn child(&self, part: &str) -> DownstreamKey {
        let prefix = if self.0.starts_with("idk1s_") {
            "idk1s_"
        } else {
            "idk1_"
        };
        let mut h = Sha256::new();
        h.update(CHILD_DOMAIN);
        h.update(self.0.as_bytes());
        h.update([0]);
        h.update(part.as_bytes());
        let digest: [u8; 32] = h.finalize().into();
        let mut out = String::with_capacity(prefix.len() + 52);
        out.push_str(prefix);
        base32(&digest, &mut out);
        DownstreamKey(out)
    }

    /// The key's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key's text, owned.
    pub fn into_string(self) -> String {
        self.0
    }
}

/// Lowercase RFC 4648 base32, no padding.
fn base32(bytes: &[u8], out: &mut String) {
    const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";
    let (mut buffer, mut bits) = (0u32, 0u32);
    for &b in bytes {
        buffer = (buffer << 8) | u32::from(b);
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(ALPHABET[((buffer >> bits) & 31) as usize] as char);
        }
    }
    if bits > 0 {
        out.push(ALPHABET[((buffer << (5 - bits)) & 31) as usize] as char);
    }
}

impl fmt::Display for DownstreamKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for DownstreamKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DownstreamKey({})", self.0)
    }
}

/// The secret of keyed downstream keys ([`CoordinatorBuilder::downstream_secret`]): at
/// least 16 bytes. Every service that must derive the same keys (all workers of one
/// consumer) needs the same secret; changing it changes every key. Its `Debug` hides it.
///
/// [`CoordinatorBuilder::downstream_secret`]: crate::CoordinatorBuilder::downstream_secret
///
/// # Example
///
/// ```
/// use idemkit_core::DownstreamSecret;
/// assert!(DownstreamSecret::new(b"short".to_vec()).is_err());
/// assert!(DownstreamSecret::new(vec![7; 32]).is_ok());
/// ```
#[derive(Clone)]
pub struct DownstreamSecret(Arc<[u8]>);

impl DownstreamSecret {
    /// The shortest secret accepted, in bytes.
    pub const MIN_LEN: usize = 16;

    /// A secret of at least [`MIN_LEN`](Self::MIN_LEN) bytes.
    ///
    /// # Errors
    ///
    /// [`SecretTooShort`] for fewer bytes.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Self, SecretTooShort> {
        let bytes = bytes.into();
        if bytes.len() < Self::MIN_LEN {
            return Err(SecretTooShort(bytes.len()));
        }
        Ok(DownstreamSecret(bytes.into()))
    }
}

impl fmt::Debug for DownstreamSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DownstreamSecret(..)")
    }
}

/// A downstream secret shorter than [`DownstreamSecret::MIN_LEN`] bytes.
///
/// # Example
///
/// ```
/// let e = idemkit_core::DownstreamSecret::new(vec![1; 3]).unwrap_err();
/// assert!(e.to_string().contains("3 bytes"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretTooShort(usize);

impl fmt::Display for SecretTooShort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a downstream secret of {} bytes: at least {} are needed",
            self.0,
            DownstreamSecret::MIN_LEN
        )
    }
}

impl std::error::Error for SecretTooShort {}

/// HMAC-SHA-256 (RFC 2104) of the concatenated `parts`: SHA-256 of the key padded with
/// `opad`, then of the key padded with `ipad` and the message. Written here over `sha2` (a
/// dozen lines) rather than pulling the `hmac` crate into the core for one call.
fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    const BLOCK: usize = 64;
    let mut block = [0u8; BLOCK];
    if key.len() > BLOCK {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha256::new();
    inner.update(block.map(|b| b ^ 0x36));
    for part in parts {
        inner.update(part);
    }
    let mut outer = Sha256::new();
    outer.update(block.map(|b| b ^ 0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_matches_rfc_4231() {
        let hex = |d: [u8; 32]| d.iter().map(|b| format!("{b:02x}")).collect::<String>();
        // Test case 2: a short key, the message given in two parts.
        assert_eq!(
            hex(hmac_sha256(
                b"Jefe",
                &[b"what do ya want ", b"for nothing?"]
            )),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        // Test case 6: a key longer than the block is hashed first.
        assert_eq!(
            hex(hmac_sha256(
                &[0xaa; 131],
                &[b"Test Using Larger Than Block-Size Key - Hash Key First"]
            )),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    #[test]
    fn base32_matches_rfc_4648() {
        // RFC 4648, section 10, lowercased and unpadded.
        for (input, want) in [
            ("", ""),
            ("f", "my"),
            ("fo", "mzxq"),
            ("foo", "mzxw6"),
            ("foob", "mzxw6yq"),
            ("fooba", "mzxw6ytb"),
            ("foobar", "mzxw6ytboi"),
        ] {
            let mut out = String::new();
            base32(input.as_bytes(), &mut out);
            assert_eq!(out, want, "{input:?}");
        }
    }
}
