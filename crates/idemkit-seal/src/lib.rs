//! Encryption at rest and hashed key names, for any idemkit store.
//!
//! [`Sealed`] wraps a [`Store`] (MemoryStore, Redis, PostgreSQL, or anything else that
//! implements the contract) and is one itself, so the coordinator, the HTTP layer and the
//! runners use it unchanged. Two options, each off until asked for:
//!
//! - **[`encrypt`](Sealed::encrypt)**: every stored result (and stored error) is sealed with
//!   XChaCha20-Poly1305 under the [`Keyring`]'s current key, with a random 24-byte nonce; the
//!   key's id is stored beside the ciphertext, so keys rotate: a new current key encrypts,
//!   the old ones still decrypt. The operation, scope and key (the storage key) and the
//!   result's kind are the associated data: a record copied under another key does not
//!   decrypt. A record that does not open (a wrong or unknown key, a flipped byte, a record
//!   moved, plaintext where a sealed result is expected) is reported as a typed error,
//!   [`StoreErrorKind::Corrupt`](idemkit_core::StoreErrorKind::Corrupt) with a [`SealError`]
//!   as its source: the call fails closed, and the action never runs again because of it.
//! - **[`hash_keys`](Sealed::hash_keys)**: the inner store sees `operation` and a keyed hash
//!   (HMAC-SHA-256, hex) of the scope and key instead of the key itself: no personal data
//!   (`user-42.email`) in Redis key names or PostgreSQL rows. [`Sealed::stored_key`] gives
//!   the stored name, which the operator tool computes from the key and the secret
//!   (`idemkit inspect ... --key-secret-env VAR`).
//!
//! What neither protects: the record's metadata (state, owner and fencing tokens, times,
//! the reserving process, the request fingerprint, which is an unkeyed hash), the
//! operation's name, and the result's length (within the 40 bytes a sealed result adds).
//! The seal binds a result to its storage key and kind, not to the record's fingerprint or
//! generation: someone who writes the store can restore an older result of the same key, or
//! rewrite the fingerprint a result is replayed for. See SECURITY.md.
//!
//! # Example
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
//! use idemkit_core::{Coordinator, Key, MemoryStore, Operation};
//! use idemkit_seal::{KeySecret, Keyring, Sealed};
//!
//! // Keys from your secret manager: 32 random bytes each, with a one-byte id.
//! let keys = Keyring::new(2, [7; 32]).decrypt_also(1, [3; 32]);
//! let store = Sealed::new(MemoryStore::new())
//!     .encrypt(keys)
//!     .hash_keys(KeySecret::new(*b"another secret of 32 bytes......")?);
//! let coordinator = Coordinator::new(store);
//! let (op, key) = (Operation::new("mail.welcome")?, Key::new("user-42.email")?);
//! let sent = coordinator
//!     .call(&op, &key)
//!     .run(|_| async { Ok::<_, std::io::Error>("em_1".to_string()) })
//!     .await?;
//! assert_eq!(sent.into_value(), "em_1");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use hmac::{Hmac, Mac};
use idemkit_core::{
    BeginRequest, Claim, CompleteRequest, FencingToken, Key, Ownership, RawStore, Record,
    RecordState, Replay, ResultKind, StorageKey, Store, StoreError, StoredResult,
};
use sha2::Sha256;

/// A sealed result's head: magic, format version, key id; then the nonce.
const MAGIC: &[u8; 3] = b"IKS";
const VERSION: u8 = 1;
const NONCE: usize = 24;
const HEAD: usize = MAGIC.len() + 2 + NONCE;

/// Why a stored result did not open.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SealError {
    /// It was sealed under a key id the keyring does not have (a key retired too early,
    /// or another deployment's store).
    #[error("the result was sealed with key id {0}, which this keyring does not have")]
    UnknownKey(u8),
    /// The ciphertext does not authenticate: a wrong key under a known id, a changed byte,
    /// or a record moved under another key.
    #[error("the sealed result does not authenticate (wrong key, tampered, or moved)")]
    Tampered,
    /// Plaintext where a sealed result is expected (written before encryption was on, or
    /// by a writer without it); see [`Sealed::accept_plaintext`].
    #[error("the result is not sealed")]
    NotSealed,
    /// The operating system's generator gave no nonce.
    #[error("no random nonce: {0}")]
    Random(String),
}

/// The encryption keys: the current one (it seals) and older ones (they only open).
#[derive(Clone)]
pub struct Keyring {
    current: u8,
    ciphers: Vec<(u8, XChaCha20Poly1305)>,
}

impl Keyring {
    /// A keyring whose key `id` seals and opens.
    pub fn new(id: u8, key: [u8; 32]) -> Self {
        Keyring {
            current: id,
            ciphers: vec![(id, XChaCha20Poly1305::new(&key.into()))],
        }
    }

    /// Also opens results sealed with an older key `id` (it seals nothing). An id already in
    /// the keyring is replaced.
    pub fn decrypt_also(mut self, id: u8, key: [u8; 32]) -> Self {
        self.ciphers.retain(|(i, _)| *i != id || id == self.current);
        if id != self.current {
            self.ciphers.push((id, XChaCha20Poly1305::new(&key.into())));
        }
        self
    }

    fn cipher(&self, id: u8) -> Option<&XChaCha20Poly1305> {
        self.ciphers.iter().find(|(i, _)| *i == id).map(|(_, c)| c)
    }
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the keys.
        let ids: Vec<u8> = self.ciphers.iter().map(|(i, _)| *i).collect();
        f.debug_struct("Keyring")
            .field("current", &self.current)
            .field("ids", &ids)
            .finish()
    }
}

/// The secret of [`Sealed::hash_keys`]: at least 16 bytes.
#[derive(Clone)]
pub struct KeySecret(Hmac<Sha256>);

/// A [`KeySecret`] shorter than 16 bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a key-hashing secret needs at least 16 bytes, got {0}")]
pub struct SecretTooShort(pub usize);

impl KeySecret {
    /// The secret.
    ///
    /// # Errors
    ///
    /// [`SecretTooShort`] under 16 bytes.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Self, SecretTooShort> {
        let bytes = bytes.into();
        if bytes.len() < 16 {
            return Err(SecretTooShort(bytes.len()));
        }
        // Keyed once, with the domain prefix: each key name then clones this state.
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&bytes).expect("HMAC takes any key");
        mac.update(b"idemkit-key/1");
        Ok(KeySecret(mac))
    }
}

impl fmt::Debug for KeySecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeySecret(..)")
    }
}

/// A store whose results are sealed and/or whose key names are hashed. See the
/// [crate docs](crate).
#[derive(Clone)]
pub struct Sealed<S> {
    inner: S,
    keys: Option<Arc<Keyring>>,
    names: Option<Arc<KeySecret>>,
    plaintext: bool,
}

impl<S: fmt::Debug> fmt::Debug for Sealed<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sealed")
            .field("inner", &self.inner)
            .field("keys", &self.keys)
            .field("hashed_keys", &self.names.is_some())
            .finish()
    }
}

impl<S> Sealed<S> {
    /// `inner`, nothing sealed or hashed yet.
    pub fn new(inner: S) -> Self {
        Sealed {
            inner,
            keys: None,
            names: None,
            plaintext: false,
        }
    }

    /// Seals every stored result under `keys`.
    pub fn encrypt(mut self, keys: Keyring) -> Self {
        self.keys = Some(Arc::new(keys));
        self
    }

    /// Stores keys as their keyed hash under `secret`.
    pub fn hash_keys(mut self, secret: KeySecret) -> Self {
        self.names = Some(Arc::new(secret));
        self
    }

    /// While switching encryption on over a store that holds plaintext results: replay
    /// them instead of failing (off by default; turn it off again once the plaintext
    /// records' retention has passed).
    pub fn accept_plaintext(mut self, accept: bool) -> Self {
        self.plaintext = accept;
        self
    }

    /// The store inside.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// The name the inner store keeps `key` under: the key itself, or with
    /// [`hash_keys`](Self::hash_keys) the operation and the hex HMAC-SHA-256 of the whole
    /// storage key (scope included).
    pub fn stored_key(&self, key: &StorageKey) -> StorageKey {
        match &self.names {
            None => key.clone(),
            Some(secret) => hashed(secret, key),
        }
    }

    fn seal(&self, key: &StorageKey, kind: ResultKind, plain: &Bytes) -> Result<Bytes, StoreError> {
        let Some(keys) = &self.keys else {
            return Ok(plain.clone());
        };
        let cipher = keys
            .cipher(keys.current)
            .expect("the current key is in the keyring");
        let mut nonce = [0u8; NONCE];
        getrandom::fill(&mut nonce)
            .map_err(|e| StoreError::corrupt(SealError::Random(e.to_string())))?;
        let aad = associated(key, kind);
        let sealed = cipher
            .encrypt(
                XNonce::from_slice(&nonce),
                Payload {
                    msg: plain,
                    aad: &aad,
                },
            )
            .map_err(|_| StoreError::corrupt(SealError::Tampered))?;
        let mut out = BytesMut::with_capacity(HEAD + sealed.len());
        out.put_slice(MAGIC);
        out.put_u8(VERSION);
        out.put_u8(keys.current);
        out.put_slice(&nonce);
        out.put_slice(&sealed);
        Ok(out.freeze())
    }

    fn open(&self, key: &StorageKey, result: StoredResult) -> Result<StoredResult, StoreError> {
        let Some(keys) = &self.keys else {
            return Ok(result);
        };
        let bytes = result.bytes();
        let sealed = bytes.len() >= HEAD + 16
            && &bytes[..MAGIC.len()] == MAGIC
            && bytes[MAGIC.len()] == VERSION;
        if !sealed {
            return if self.plaintext {
                Ok(result)
            } else {
                Err(StoreError::corrupt(SealError::NotSealed))
            };
        }
        let id = bytes[MAGIC.len() + 1];
        let cipher = keys
            .cipher(id)
            .ok_or_else(|| StoreError::corrupt(SealError::UnknownKey(id)))?;
        let aad = associated(key, result.kind());
        let plain = cipher
            .decrypt(
                XNonce::from_slice(&bytes[MAGIC.len() + 2..HEAD]),
                Payload {
                    msg: &bytes[HEAD..],
                    aad: &aad,
                },
            )
            .map_err(|_| StoreError::corrupt(SealError::Tampered))?;
        Ok(StoredResult::new(result.kind(), plain))
    }

    fn open_claim(&self, key: &StorageKey, claim: Claim) -> Result<Claim, StoreError> {
        match claim {
            // The inner store's word on durability goes with the opened result.
            Claim::Replay(r) => Ok(Claim::Replay(
                Replay::new(r.fencing, self.open(key, r.outcome)?).with_confirmed(r.confirmed),
            )),
            other => Ok(other),
        }
    }
}

/// The associated data: what the ciphertext is bound to (format, kind, storage key).
fn associated(key: &StorageKey, kind: ResultKind) -> Vec<u8> {
    let mut aad = Vec::with_capacity(24 + key.as_str().len());
    aad.extend_from_slice(b"idemkit-seal/1");
    aad.push(match kind {
        ResultKind::Value => 1,
        ResultKind::PermanentError => 2,
        _ => 3,
    });
    aad.extend_from_slice(key.as_str().as_bytes());
    aad
}

fn hashed(secret: &KeySecret, key: &StorageKey) -> StorageKey {
    let mut mac = secret.0.clone();
    mac.update(key.as_str().as_bytes());
    let digest = mac.finalize().into_bytes();
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut hex = String::with_capacity(64);
    for b in digest {
        hex.push(HEX[usize::from(b >> 4)] as char);
        hex.push(HEX[usize::from(b & 15)] as char);
    }
    let hashed = Key::new(hex).expect("64 hex digits are a valid key");
    match StorageKey::parse(key.as_str()) {
        Some((operation, _, _)) => StorageKey::new(&operation, None, &hashed),
        // Every StorageKey parses; were one not to, hash it under a fixed operation.
        None => StorageKey::new(
            &idemkit_core::Operation::new("idemkit.hashed").expect("a valid operation"),
            None,
            &hashed,
        ),
    }
}

impl<S: Store> Store for Sealed<S> {
    fn max_ttl(&self) -> Duration {
        self.inner.max_ttl()
    }

    fn call_timeout(&self) -> Option<Duration> {
        self.inner.call_timeout()
    }

    fn uses_reservation(&self) -> bool {
        self.inner.uses_reservation()
    }

    async fn begin(&self, req: &BeginRequest<'_>) -> Result<Claim, StoreError> {
        let stored = self.stored_key(req.key);
        let inner = BeginRequest::new(&stored, req.owner, req.lease)
            .with_fingerprint(req.fingerprint)
            .with_holder(req.holder);
        let claim = self.inner.begin(&inner).await?;
        self.open_claim(req.key, claim)
    }

    async fn begin_many(&self, reqs: &[BeginRequest<'_>]) -> Vec<Result<Claim, StoreError>> {
        let stored: Vec<StorageKey> = reqs.iter().map(|r| self.stored_key(r.key)).collect();
        let inner: Vec<BeginRequest<'_>> = reqs
            .iter()
            .zip(&stored)
            .map(|(r, k)| {
                BeginRequest::new(k, r.owner, r.lease)
                    .with_fingerprint(r.fingerprint)
                    .with_holder(r.holder)
            })
            .collect();
        let claims = self.inner.begin_many(&inner).await;
        claims
            .into_iter()
            .zip(reqs)
            .map(|(c, r)| c.and_then(|c| self.open_claim(r.key, c)))
            .collect()
    }

    async fn renew(
        &self,
        key: &StorageKey,
        ownership: &Ownership,
        lease: Duration,
    ) -> Result<(), StoreError> {
        self.inner
            .renew(&self.stored_key(key), ownership, lease)
            .await
    }

    async fn complete(
        &self,
        key: &StorageKey,
        ownership: &Ownership,
        request: &CompleteRequest,
    ) -> Result<(), StoreError> {
        let sealed = CompleteRequest::new(
            request.kind,
            self.seal(key, request.kind, &request.bytes)?,
            request.ttl,
        )
        .with_reservation(request.reservation.clone());
        self.inner
            .complete(&self.stored_key(key), ownership, &sealed)
            .await
    }

    async fn release(&self, key: &StorageKey, ownership: &Ownership) -> Result<(), StoreError> {
        self.inner.release(&self.stored_key(key), ownership).await
    }

    async fn wait(
        &self,
        key: &StorageKey,
        seen: FencingToken,
        timeout: Duration,
    ) -> Result<(), StoreError> {
        self.inner.wait(&self.stored_key(key), seen, timeout).await
    }

    async fn get(&self, key: &StorageKey) -> Result<Option<Record>, StoreError> {
        let Some(mut record) = self.inner.get(&self.stored_key(key)).await? else {
            return Ok(None);
        };
        if let RecordState::Completed(result) = record.state {
            record.state = RecordState::Completed(self.open(key, result)?);
        }
        Ok(Some(record))
    }
}

/// Raw bytes go in as the sealed store would hold them: a record's result is sealed on the
/// way in; bytes that are not a record pass as they are (and are reported corrupt).
impl<S: RawStore> RawStore for Sealed<S> {
    async fn put_raw(
        &self,
        key: &StorageKey,
        bytes: Bytes,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let bytes = match Record::decode(&bytes) {
            Ok(mut record) => {
                if let RecordState::Completed(result) = &record.state {
                    let sealed = self.seal(key, result.kind(), result.bytes())?;
                    record.state = RecordState::Completed(StoredResult::new(result.kind(), sealed));
                }
                Bytes::from(record.encode())
            }
            Err(_) => bytes,
        };
        self.inner.put_raw(&self.stored_key(key), bytes, ttl).await
    }

    async fn purge(&self, key: &StorageKey) -> Result<bool, StoreError> {
        self.inner.purge(&self.stored_key(key)).await
    }
}
