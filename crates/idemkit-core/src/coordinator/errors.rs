//! How a call treats the action's errors: release the key (the default), or store the
//! permanent ones.

use crate::codec::Codec;
use crate::store::BoxError;

/// What to do with an action's error, given the call's codec.
pub(super) trait ErrorPolicy<C, E> {
    /// `None`: release the key. `Some(Ok(bytes))`: store these bytes as a permanent error.
    fn encode(&self, codec: &C, error: &E) -> Option<Result<Vec<u8>, BoxError>>;
    /// Decodes a stored permanent error; `None` when this call cannot.
    fn decode(&self, codec: &C, bytes: &[u8]) -> Option<Result<E, BoxError>>;
}

/// [`Call::run`](super::Call::run): every error releases the key.
pub(super) struct ReleaseOnError;

impl<C, E> ErrorPolicy<C, E> for ReleaseOnError {
    fn encode(&self, _: &C, _: &E) -> Option<Result<Vec<u8>, BoxError>> {
        None
    }
    fn decode(&self, _: &C, _: &[u8]) -> Option<Result<E, BoxError>> {
        None
    }
}

/// [`Call::run_storing_errors`](super::Call::run_storing_errors): errors the predicate calls
/// permanent are stored with the call's codec.
pub(super) struct StorePermanent<P> {
    pub(super) is_permanent: P,
}

impl<C: Codec<E>, E, P: Fn(&E) -> bool> ErrorPolicy<C, E> for StorePermanent<P> {
    fn encode(&self, codec: &C, error: &E) -> Option<Result<Vec<u8>, BoxError>> {
        (self.is_permanent)(error).then(|| codec.encode(error))
    }
    fn decode(&self, codec: &C, bytes: &[u8]) -> Option<Result<E, BoxError>> {
        Some(codec.decode(bytes))
    }
}
