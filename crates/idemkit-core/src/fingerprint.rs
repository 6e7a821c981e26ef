//! Request fingerprints: what a key was first used for.

use std::fmt;

use sha2::{Digest, Sha256};

/// A 128-bit digest of the request a key was first used with.
///
/// The store keeps it beside the record; a later call with the same key and a different
/// fingerprint is refused with [`Error::KeyReused`](crate::Error::KeyReused), never answered
/// with someone else's result. The digest is SHA-256 truncated to 16 bytes: stable across
/// processes and versions (it is stored), and 2^64 work to collide, which is far beyond what a
/// client that controls one key could gain from.
///
/// # Example
///
/// ```
/// use idemkit_core::Fingerprint;
///
/// let a = Fingerprint::of(b"POST /charges amount=100");
/// assert_eq!(a, Fingerprint::of(b"POST /charges amount=100"));
/// assert_ne!(a, Fingerprint::of(b"POST /charges amount=200"));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint([u8; 16]);

impl Fingerprint {
    /// The fingerprint of one byte string.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::Fingerprint;
    /// assert_eq!(Fingerprint::of(b"x").to_string().len(), 32);
    /// ```
    pub fn of(bytes: &[u8]) -> Self {
        Self::of_parts([bytes])
    }

    /// The fingerprint of several fields (method, path, body...). Each is length-prefixed, so
    /// `["ab", "c"]` and `["a", "bc"]` differ.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::Fingerprint;
    /// let a = Fingerprint::of_parts([&b"ab"[..], b"c"]);
    /// let b = Fingerprint::of_parts([&b"a"[..], b"bc"]);
    /// assert_ne!(a, b);
    /// ```
    pub fn of_parts<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> Self {
        let mut h = Sha256::new();
        for p in parts {
            h.update((p.len() as u64).to_be_bytes());
            h.update(p);
        }
        let digest = h.finalize();
        let mut out = [0; 16];
        out.copy_from_slice(&digest[..16]);
        Fingerprint(out)
    }

    /// A fingerprint from its 16 raw bytes (as read back from a store).
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::Fingerprint;
    /// let f = Fingerprint::of(b"x");
    /// assert_eq!(Fingerprint::from_bytes(f.to_bytes()), f);
    /// ```
    pub const fn from_bytes(bytes: [u8; 16]) -> Self {
        Fingerprint(bytes)
    }

    /// The 16 raw bytes.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::Fingerprint;
    /// assert_eq!(Fingerprint::from_bytes([7; 16]).to_bytes(), [7; 16]);
    /// ```
    pub const fn to_bytes(self) -> [u8; 16] {
        self.0
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({self})")
    }
}
