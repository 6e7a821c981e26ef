//! Result codecs: how a result becomes the bytes a store keeps, and back.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::store::BoxError;

/// Encodes results (and, when stored, permanent errors) for the store, and decodes them on
/// replay. Pluggable per call with [`Call::codec`](crate::Call::codec).
///
/// # Example
///
/// ```
/// use idemkit_core::{Codec, JsonCodec};
///
/// let bytes = JsonCodec.encode(&vec![1, 2])?;
/// let back: Vec<i32> = JsonCodec.decode(&bytes)?;
/// assert_eq!(back, [1, 2]);
/// # Ok::<(), idemkit_core::BoxError>(())
/// ```
pub trait Codec<T>: Send + Sync {
    /// Encodes a value.
    ///
    /// # Errors
    ///
    /// Whatever the format refuses. The coordinator then keeps the key completed with a
    /// "result unavailable" record rather than letting a retry run the action again.
    fn encode(&self, value: &T) -> Result<Vec<u8>, BoxError>;

    /// Decodes a stored value.
    ///
    /// # Errors
    ///
    /// Bytes that are not a `T` (a changed type, a foreign writer): the caller gets
    /// [`Error::Decode`](crate::Error::Decode), and the action does not run.
    fn decode(&self, bytes: &[u8]) -> Result<T, BoxError>;
}

/// The default codec: serde JSON.
///
/// # Example
///
/// ```
/// use idemkit_core::{Codec, JsonCodec};
///
/// assert_eq!(Codec::<String>::encode(&JsonCodec, &"em_1".to_string())?, b"\"em_1\"");
/// # Ok::<(), idemkit_core::BoxError>(())
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct JsonCodec;

impl<T: Serialize + DeserializeOwned> Codec<T> for JsonCodec {
    fn encode(&self, value: &T) -> Result<Vec<u8>, BoxError> {
        Ok(serde_json::to_vec(value)?)
    }

    fn decode(&self, bytes: &[u8]) -> Result<T, BoxError> {
        Ok(serde_json::from_slice(bytes)?)
    }
}

/// Raw bytes, stored as they are: for response bodies and payloads that are already bytes
/// (`JsonCodec` would store a `Vec<u8>` as a JSON array of numbers).
///
/// # Example
///
/// ```
/// use bytes::Bytes;
/// use idemkit_core::{BytesCodec, Codec};
///
/// let body = Bytes::from_static(b"\x00\xffbody");
/// assert_eq!(BytesCodec.encode(&body)?, b"\x00\xffbody");
/// let back: Vec<u8> = BytesCodec.decode(b"abc")?;
/// assert_eq!(back, b"abc");
/// # Ok::<(), idemkit_core::BoxError>(())
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct BytesCodec;

impl Codec<Vec<u8>> for BytesCodec {
    fn encode(&self, value: &Vec<u8>) -> Result<Vec<u8>, BoxError> {
        Ok(value.clone())
    }

    fn decode(&self, bytes: &[u8]) -> Result<Vec<u8>, BoxError> {
        Ok(bytes.to_vec())
    }
}

impl Codec<bytes::Bytes> for BytesCodec {
    fn encode(&self, value: &bytes::Bytes) -> Result<Vec<u8>, BoxError> {
        Ok(value.to_vec())
    }

    fn decode(&self, bytes: &[u8]) -> Result<bytes::Bytes, BoxError> {
        Ok(bytes::Bytes::copy_from_slice(bytes))
    }
}
