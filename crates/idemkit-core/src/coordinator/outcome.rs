//! What a call's outcome becomes: the effective policy, the completion that stores a value
//! or a permanent error, and the answer a replay gives (ARCHITECTURE.md rows 2, 10, 22, 29).

use bytes::Bytes;

use super::call::Call;
use super::options::OnActionError;
use super::receipt::{Receipt, Source};
use crate::codec::Codec;
use crate::error::Error;
use crate::ident::StorageKey;
use crate::policy::{MIN_LEASE, Policy};
use crate::record::ResultKind;
use crate::store::{CompleteRequest, Ownership, Replay, Store};

/// What an owner does once its action returned.
pub(super) enum AfterAction<T, E> {
    /// Store this completion, then answer this (the value, or the permanent error stored).
    Store(CompleteRequest, Result<Receipt<T>, E>),
    /// Release the key and answer `Error::Action` with this error.
    Release(E),
}

/// A call's policy once checked against its store: every duration positive and within
/// what the store can keep.
pub(super) struct Effective {
    pub(super) policy: Policy,
    pub(super) ttl: std::time::Duration,
}

impl<S: Store, C, P, K, B> Call<'_, S, C, P, K, B> {
    pub(super) fn storage_key(&self) -> StorageKey {
        StorageKey::new(&self.operation, self.scope.as_deref(), &self.key)
    }

    pub(super) fn effective(&self) -> Result<Effective, &'static str> {
        let mut policy = self.policy;
        let ttl = self.ttl.unwrap_or(policy.ttl).min(Policy::MAX_DURATION);
        if ttl.is_zero() {
            return Err("the TTL must be positive");
        }
        if policy.lease < MIN_LEASE {
            return Err("the lease must be at least 3 ms");
        }
        if policy.store_timeout.is_zero() {
            return Err("the store timeout must be positive");
        }
        let max = self.coordinator.store().max_ttl();
        policy.lease = policy.lease.min(max);
        Ok(Effective {
            policy,
            ttl: ttl.min(max),
        })
    }

    /// What an owner does once its action returned (rows 10, 22, 29).
    pub(super) fn after_action<T, E>(
        &self,
        result: Result<T, E>,
        lease: &Ownership,
        effective: &Effective,
    ) -> AfterAction<T, E>
    where
        C: Codec<T>,
        P: OnActionError<C, E>,
    {
        match result {
            Ok(value) => AfterAction::Store(
                self.encode_value(&value, effective),
                Ok(Receipt::new(value, Source::Fresh, Some(lease.fencing))),
            ),
            Err(e) => match self.permanent_error(&e, effective) {
                Some(completion) => AfterAction::Store(completion, Err(e)),
                None => AfterAction::Release(e),
            },
        }
    }

    /// The completion that stores `e` as a permanent error, if the call's error policy says
    /// it is one and it can be stored (encodable, within `max_result_bytes`).
    pub(super) fn permanent_error<E>(&self, e: &E, effective: &Effective) -> Option<CompleteRequest>
    where
        P: OnActionError<C, E>,
    {
        let max = effective.policy.max_result_bytes;
        match self.errors.encode(&self.codec, e)? {
            Ok(bytes) if bytes.len() <= max => Some(CompleteRequest::new(
                ResultKind::PermanentError,
                bytes,
                effective.ttl,
            )),
            Ok(bytes) => {
                tracing::warn!(operation = %self.operation, key = %self.key, len = bytes.len(), max,
                    "permanent error too large to store; releasing the key");
                None
            }
            Err(encode_error) => {
                tracing::warn!(operation = %self.operation, key = %self.key, error = %encode_error,
                    "permanent error could not be encoded; releasing the key");
                None
            }
        }
    }

    /// Encodes a successful value, or explains why it cannot be kept. Never fails: once the
    /// action succeeded the key must end completed, whatever happens to its bytes.
    pub(super) fn encode_value<T>(&self, value: &T, effective: &Effective) -> CompleteRequest
    where
        C: Codec<T>,
    {
        let unavailable = |reason: String| {
            self.operation.metrics().results_unavailable.increment(1);
            tracing::warn!(operation = %self.operation, key = %self.key, %reason,
                "result not stored; replays will get ResultUnavailable");
            CompleteRequest::new(ResultKind::Unavailable, reason, effective.ttl)
        };
        let max = effective.policy.max_result_bytes;
        match self.codec.encode(value) {
            Ok(bytes) if bytes.len() <= max => {
                CompleteRequest::new(ResultKind::Value, Bytes::from(bytes), effective.ttl)
            }
            Ok(bytes) => unavailable(format!(
                "result of {} bytes exceeds the limit of {max} bytes",
                bytes.len(),
            )),
            Err(e) => unavailable(format!("result could not be encoded: {e}")),
        }
    }

    pub(super) fn replay<T, E>(&self, completed: Replay) -> Result<Receipt<T>, Error<E>>
    where
        C: Codec<T>,
        P: OnActionError<C, E>,
    {
        let bytes = completed.outcome.bytes();
        match completed.outcome.kind() {
            ResultKind::Value => match self.codec.decode(bytes) {
                Ok(value) => Ok(
                    Receipt::new(value, Source::Replayed, Some(completed.fencing))
                        .with_stored(completed.confirmed),
                ),
                Err(e) => Err(Error::Decode(e)),
            },
            ResultKind::PermanentError => match self.errors.decode(&self.codec, bytes) {
                Some(Ok(e)) => Err(Error::ReplayedAction(e)),
                Some(Err(e)) => Err(Error::Decode(e)),
                None => Err(Error::Decode(
                    "a permanent error is stored under this key; set store_errors on the call to replay it"
                        .into(),
                )),
            },
            ResultKind::Unavailable => Err(Error::ResultUnavailable {
                reason: String::from_utf8_lossy(bytes).into_owned(),
            }),
        }
    }
}
