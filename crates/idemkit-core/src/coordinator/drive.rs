//! The state machine of one call. ARCHITECTURE.md, "The state machine", has the table of
//! interleavings; the row numbers below refer to it.
//!
//! ```text
//!            ┌───────────── begin ─────────────┐
//!            ▼                                 │
//!   Reserved ──▶ run the action while the      │   Replay    ──▶ replay (row 2)
//!   (rows 1, 4,  keeper renews (rows 5-9, 20,  │   Mismatch  ──▶ KeyReused (row 16)
//!    24)         25) ──▶                       │   InFlight  ──▶ Reject: InFlight
//!                Ok  ──▶ complete, retried     │                 Run: unprotected
//!                        while the lease lasts │                 Wait: store.wait, then
//!                        (rows 10, 21, 26)     │                 begin again (rows 11-14)
//!                Err ──▶ release (row 22), or store a permanent error (row 29)
//!   store error ──▶ fail closed, or run unprotected (fail-open; row 19)
//!   dropped ──▶ the guard leaves the key to its lease (or releases it), or completes
//!               (rows 17, 18, 27); a panicking action releases, then resumes the panic
//! ```

use std::future::Future;

use bytes::Bytes;
use tracing::Instrument as _;

use super::call::{Attempt, Call, Downstream, Receipt, Source};
use super::complete::Completer;
use super::errors::ErrorPolicy;
use super::lease::{Guard, Keeper, LeaseState, Pending, after, bounded};
use crate::StorageKey;
use crate::clock::now;
use crate::codec::Codec;
use crate::error::{Error, Phase};
use crate::policy::{InFlight, MIN_LEASE, OnStoreError, Policy};
use crate::record::{OwnerToken, ResultKind};
use crate::store::{BeginRequest, Claim, CompleteRequest, Ownership, Replay, Store, StoreError};

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

impl<S: Store, C> Call<'_, S, C> {
    /// What the attempt's downstream key is derived from (the effect, the secret).
    pub(super) fn downstream(&self, key: &StorageKey) -> Downstream {
        Downstream {
            key: key.clone(),
            secret: self.coordinator.downstream_secret().cloned(),
        }
    }

    fn storage_key(&self) -> StorageKey {
        StorageKey::new(&self.operation, self.scope.as_deref(), &self.key)
    }

    fn effective(&self) -> Result<Effective, &'static str> {
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

    /// Runs the call inside its span (`idemkit.call`, with `operation` and `key`).
    pub(super) async fn execute<T, E, F, Fut, P, K>(
        self,
        action: F,
        errors: P,
        completer: Option<K>,
        prepared: Option<Box<super::batch::Prepared<S>>>,
    ) -> Result<Receipt<T>, Error<E>>
    where
        C: Codec<T>,
        P: ErrorPolicy<C, E>,
        K: Completer,
        F: FnOnce(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let span = tracing::debug_span!(
            "idemkit.call",
            operation = %self.operation,
            key = %self.key,
        );
        let effective = match self.effective() {
            Ok(e) => e,
            Err(reason) => return Err(Error::Config { reason }),
        };
        // Without a subscriber that wants the span, skip the wrapper: instrumenting moves the
        // whole call's state into it, on every call.
        if span.is_disabled() {
            self.drive(&effective, action, &errors, completer, prepared)
                .await
        } else {
            self.drive(&effective, action, &errors, completer, prepared)
                .instrument(span)
                .await
        }
    }

    async fn drive<T, E, F, Fut, P, K>(
        &self,
        effective: &Effective,
        action: F,
        errors: &P,
        completer: Option<K>,
        prepared: Option<Box<super::batch::Prepared<S>>>,
    ) -> Result<Receipt<T>, Error<E>>
    where
        C: Codec<T>,
        P: ErrorPolicy<C, E>,
        K: Completer,
        F: FnOnce(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let store = self.coordinator.store();
        let op: &crate::Operation = &self.operation;
        let policy = &effective.policy;
        let key = StorageKey::new(op, self.scope.as_deref(), &self.key);
        // Row 31: a claim from a batch stands in for the first `begin` while it is fresh.
        let (owner, mut first) = match prepared {
            None => (OwnerToken::random(), None),
            Some(p) => self.take_prepared(*p, &key, policy),
        };
        let req = BeginRequest::new(&key, owner, policy.lease).with_fingerprint(self.fingerprint);
        let mut wait_deadline = None;

        loop {
            let (begin, started) = match first.take() {
                Some(taken) => *taken,
                None => {
                    let started = now();
                    let begin = bounded(
                        policy.store_timeout,
                        store.call_timeout(),
                        store.begin(&req),
                    )
                    .await;
                    op.metrics().timing(Phase::Begin, started);
                    (begin, started)
                }
            };
            match begin {
                // Rows 1, 4 and 24: ours, fresh, taken over from an expired owner, or our own
                // reservation answered again.
                Ok(Claim::Reserved {
                    ownership: lease,
                    took_over,
                }) => {
                    op.metrics().misses.increment(1);
                    if took_over {
                        op.metrics().takeovers.increment(1);
                        tracing::info!(operation = %op, key = %self.key, fencing = %lease.fencing,
                            "took over an expired lease");
                    }
                    return match completer {
                        None => {
                            self.run_owned(&key, lease, started, effective, action, errors)
                                .await
                        }
                        // Row 30: the caller's transaction completes. Boxed: a rare path.
                        Some(completer) => {
                            Box::pin(self.run_owned_completing(
                                &key, lease, started, effective, action, errors, completer,
                            ))
                            .await
                        }
                    };
                }
                // Row 2: replay.
                Ok(Claim::Replay(completed)) => {
                    op.metrics().hits.increment(1);
                    tracing::debug!(fencing = %completed.fencing, "replaying stored outcome");
                    return self.replay(completed, errors);
                }
                // Row 16: the same key for another request.
                Ok(Claim::Mismatch) => {
                    op.metrics().key_reuse.increment(1);
                    tracing::debug!("key reused with a different fingerprint");
                    return Err(Error::KeyReused);
                }
                // Rows 11-14: a live owner.
                Ok(Claim::InFlight {
                    retry_after: lease_left,
                    fencing,
                    held_for,
                }) => {
                    let in_flight = || Error::InFlight {
                        retry_after: policy.retry_after(lease_left, held_for),
                        lease_left,
                        held_for,
                    };
                    match policy.in_flight {
                        InFlight::Reject => {
                            op.metrics().rejections.increment(1);
                            return Err(in_flight());
                        }
                        InFlight::Run => {
                            op.metrics().unprotected_in_flight.increment(1);
                            tracing::warn!(operation = %op, key = %self.key,
                                "running unprotected beside a live owner (in_flight=run)");
                            return Box::pin(run_unprotected(action, self.downstream(&key))).await;
                        }
                        InFlight::Wait => {
                            let started = now();
                            let deadline =
                                *wait_deadline.get_or_insert(after(started, policy.wait_timeout));
                            if started >= deadline {
                                op.metrics().rejections.increment(1);
                                return Err(in_flight());
                            }
                            op.metrics().waits.increment(1);
                            // Wake on the owner's completion or release (pushed), at the end
                            // of its current lease at the latest (then `begin` reads the
                            // renewed lease, or takes an expired one over), or at our own
                            // deadline.
                            let timeout = lease_left.min(deadline - started);
                            let limit = timeout.saturating_add(policy.store_timeout);
                            // The store's own limit applies on top of the wait's timeout too.
                            let own = store.call_timeout().map(|t| t.saturating_add(timeout));
                            // Boxed, like the failure paths: rare, slow paths would otherwise
                            // enlarge every call's future, which is moved on every call.
                            let waited =
                                Box::pin(bounded(limit, own, store.wait(&key, fencing, timeout)))
                                    .await;
                            op.metrics().timing(Phase::Wait, started);
                            if let Err(source) = waited {
                                return Box::pin(self.store_failed(
                                    Phase::Wait,
                                    source,
                                    policy,
                                    action,
                                ))
                                .await;
                            }
                        }
                    }
                }
                Err(source) => {
                    if source.is_unavailable() {
                        // Row 19: the begin may have reserved before its answer was lost.
                        super::lease::release_orphan(
                            store,
                            &req,
                            after(started, policy.lease),
                            policy.store_timeout,
                        );
                    }
                    return Box::pin(self.store_failed(Phase::Begin, source, policy, action)).await;
                }
            }
        }
    }

    /// The owner token and first claim a batch's claim gives this call (row 31); a fresh
    /// token and no claim if it is not this call's (another key, or a fingerprint: a batch
    /// reserves without one). Out of line: unbatched calls never come here.
    #[cold]
    #[inline(never)]
    fn take_prepared(
        &self,
        prepared: super::batch::Prepared<S>,
        key: &StorageKey,
        policy: &Policy,
    ) -> (OwnerToken, super::batch::FirstClaim) {
        let taken = if self.fingerprint.is_some() {
            None
        } else {
            prepared.take_for(key, policy.renew_every())
        };
        match taken {
            Some(taken) => (taken.owner, taken.claim),
            None => (OwnerToken::random(), None),
        }
    }

    /// Row 19: the store failed before the action ran. Fail closed, or run unprotected
    /// when failing open and the store is merely unavailable (never on a corrupt record).
    async fn store_failed<T, E, F, Fut>(
        &self,
        phase: Phase,
        source: StoreError,
        policy: &Policy,
        action: F,
    ) -> Result<Receipt<T>, Error<E>>
    where
        F: FnOnce(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let op = &self.operation;
        op.metrics().store_error(phase);
        if source.is_unavailable() && policy.on_store_error == OnStoreError::FailOpen {
            op.metrics().unprotected_store_unavailable.increment(1);
            tracing::warn!(operation = %op, key = %self.key, %phase, error = %source,
                "store unavailable: running unprotected (fail-open)");
            return run_unprotected(action, self.downstream(&self.storage_key())).await;
        }
        Err(Error::Store { phase, source })
    }

    /// Runs the action as the key's owner, then completes or releases, with the lease kept
    /// alive until the store has answered (rows 5-10, 17-22, 25, 26, 29).
    async fn run_owned<T, E, F, Fut, P>(
        &self,
        key: &StorageKey,
        lease: Ownership,
        reserved_at: tokio::time::Instant,
        effective: &Effective,
        action: F,
        errors: &P,
    ) -> Result<Receipt<T>, Error<E>>
    where
        C: Codec<T>,
        P: ErrorPolicy<C, E>,
        F: FnOnce(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let op: &crate::Operation = &self.operation;
        let policy = &effective.policy;
        let state = std::sync::Arc::new(LeaseState::new(after(reserved_at, policy.lease)));
        let keeper = self.keeper(key, lease, reserved_at, policy, &state);
        let work = async {
            // Created before anything can be dropped mid-way: from here on a dropped call
            // leaves the key to its lease (or releases it, `OnCancel::Release`), or stores the
            // outcome once the action succeeded.
            let mut guard = self.guard(key, lease);
            let started = now();
            let attempt = Attempt {
                fencing: Some(lease.fencing),
                lease: Some(state.clone()),
                downstream: Some(self.downstream(key)),
            };
            let result = match crate::unwind::catch(action(attempt)).await {
                Ok(result) => result,
                Err(panic) => {
                    // A panic is a failed action: release the key (its retry runs at once,
                    // as after an error), then let the panic go on to the caller.
                    guard.pending = Pending::Done;
                    tracing::warn!(operation = %op, key = %self.key,
                        panic = crate::unwind::message(&*panic), "the action panicked; releasing its key");
                    Box::pin(self.release(key, &lease, policy)).await;
                    std::panic::resume_unwind(panic);
                }
            };
            op.metrics().timing(Phase::Action, started);
            let (completion, answer) = match self.after_action(result, &lease, effective, errors) {
                AfterAction::Store(completion, answer) => (completion, answer),
                AfterAction::Release(e) => {
                    guard.pending = Pending::Done;
                    // Boxed: only a failed action takes this path.
                    Box::pin(self.release(key, &lease, policy)).await;
                    return Err(Error::Action(e));
                }
            };
            guard.pending = Pending::Complete(completion.clone());
            let stored = keeper.complete(&completion).await;
            guard.pending = Pending::Done;
            match answer {
                Ok(receipt) => Ok(receipt.with_stored(stored)),
                Err(e) if stored => Err(Error::ActionStored(e)),
                // A permanent error that was not stored: the key expires with its lease,
                // and a retry runs the action again.
                Err(e) => Err(Error::Action(e)),
            }
        };
        keeper.keep_while(work).await
    }

    /// The keeper of an owner's lease: renewals, the lease-lost signal, the completion.
    #[inline]
    pub(super) fn keeper<'k>(
        &'k self,
        key: &'k StorageKey,
        lease: Ownership,
        reserved_at: tokio::time::Instant,
        policy: &'k Policy,
        state: &'k LeaseState,
    ) -> Keeper<'k, S> {
        Keeper {
            store: self.coordinator.store(),
            key,
            lease,
            policy,
            operation: &self.operation,
            state,
            reserved_at,
        }
    }

    /// The guard that finishes the reservation if the owner's call is dropped.
    #[inline]
    pub(super) fn guard<'k>(&'k self, key: &'k StorageKey, lease: Ownership) -> Guard<'k, S> {
        Guard {
            store: self.coordinator.store(),
            key,
            lease,
            operation: &self.operation,
            pending: Pending::Release,
            on_cancel: self.policy.on_cancel,
        }
    }

    /// What an owner does once its action returned (rows 10, 22, 29).
    pub(super) fn after_action<T, E, P>(
        &self,
        result: Result<T, E>,
        lease: &Ownership,
        effective: &Effective,
        errors: &P,
    ) -> AfterAction<T, E>
    where
        C: Codec<T>,
        P: ErrorPolicy<C, E>,
    {
        match result {
            Ok(value) => AfterAction::Store(
                self.encode_value(&value, effective),
                Ok(Receipt::new(value, Source::Fresh, Some(lease.fencing))),
            ),
            Err(e) => match self.permanent_error(&e, errors, effective) {
                Some(completion) => AfterAction::Store(completion, Err(e)),
                None => AfterAction::Release(e),
            },
        }
    }

    /// The completion that stores `e` as a permanent error, if the call's error policy says
    /// it is one and it can be stored (encodable, within `max_result_bytes`).
    pub(super) fn permanent_error<E, P>(
        &self,
        e: &E,
        errors: &P,
        effective: &Effective,
    ) -> Option<CompleteRequest>
    where
        P: ErrorPolicy<C, E>,
    {
        let max = effective.policy.max_result_bytes;
        match errors.encode(&self.codec, e)? {
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

    fn replay<T, E, P>(&self, completed: Replay, errors: &P) -> Result<Receipt<T>, Error<E>>
    where
        C: Codec<T>,
        P: ErrorPolicy<C, E>,
    {
        let bytes = completed.outcome.bytes();
        match completed.outcome.kind() {
            ResultKind::Value => match self.codec.decode(bytes) {
                Ok(value) => Ok(Receipt::new(
                    value,
                    Source::Replayed,
                    Some(completed.fencing),
                )),
                Err(e) => Err(Error::Decode(e)),
            },
            ResultKind::PermanentError => match errors.decode(&self.codec, bytes) {
                Some(Ok(e)) => Err(Error::ReplayedAction(e)),
                Some(Err(e)) => Err(Error::Decode(e)),
                None => Err(Error::Decode(
                    "a permanent error is stored under this key; use run_storing_errors to replay it"
                        .into(),
                )),
            },
            ResultKind::Unavailable => Err(Error::ResultUnavailable {
                reason: String::from_utf8_lossy(bytes).into_owned(),
            }),
        }
    }

    pub(super) async fn release(&self, key: &StorageKey, lease: &Ownership, policy: &Policy) {
        let store = self.coordinator.store();
        let started = now();
        let released = bounded(
            policy.store_timeout,
            store.call_timeout(),
            store.release(key, lease),
        )
        .await;
        self.operation.metrics().timing(Phase::Release, started);
        match released {
            Ok(()) => {}
            Err(e) if e.is_lease_lost() => {
                tracing::debug!("release found the lease already gone");
            }
            Err(e) => {
                self.operation.metrics().store_error(Phase::Release);
                tracing::warn!(operation = %self.operation, key = %self.key, error = %e,
                    "release failed; the key unlocks when its lease expires");
            }
        }
    }
}

async fn run_unprotected<T, E, F, Fut>(
    action: F,
    downstream: Downstream,
) -> Result<Receipt<T>, Error<E>>
where
    F: FnOnce(Attempt) -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let attempt = Attempt {
        downstream: Some(downstream),
        ..Attempt::unprotected()
    };
    match action(attempt).await {
        Ok(value) => Ok(Receipt::new(value, Source::Unprotected, None)),
        Err(e) => Err(Error::Action(e)),
    }
}
