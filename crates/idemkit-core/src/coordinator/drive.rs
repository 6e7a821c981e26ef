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

use tracing::Instrument as _;

use super::attempt::{Attempt, Downstream};
use super::batch::{FirstClaim, Prepared};
use super::call::Call;
use super::lease::{
    Guard, Held, Keeper, LeaseState, OrphanGuard, Pending, bounded, release_orphan,
};
use super::options::{Batch, Completer, OnActionError};
use super::outcome::{AfterAction, Effective};
use super::receipt::{Receipt, Source};
use crate::clock::{after, now};
use crate::codec::Codec;
use crate::error::Error;
use crate::ident::{Operation, StorageKey};
use crate::phase::Phase;
use crate::policy::{InFlight, OnStoreError, Policy};
use crate::record::OwnerToken;
use crate::store::{BeginRequest, Claim, Ownership, Reservation, Store, StoreError};
use crate::unwind;

impl<S: Store, C, P, K, B> Call<'_, S, C, P, K, B> {
    /// What the attempt's downstream key is derived from (the effect, the secret).
    pub(super) fn downstream(&self, key: &StorageKey) -> Downstream {
        Downstream {
            key: key.clone(),
            secret: self.coordinator.downstream_secret().cloned(),
        }
    }

    /// Runs the call inside its span (`idemkit.call`, with `operation` and `key`).
    pub(super) async fn execute<T, E, F, Fut>(mut self, action: F) -> Result<Receipt<T>, Error<E>>
    where
        C: Codec<T>,
        P: OnActionError<C, E>,
        K: Completer,
        B: Batch<S>,
        F: FnOnce(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let span = tracing::debug_span!(
            "idemkit.call",
            operation = %self.operation,
            key = %self.key,
        );
        let completer = self.completer.take();
        let prepared = self.batch.take();
        let effective = match self.effective() {
            Ok(e) => e,
            Err(reason) => return Err(Error::Config { reason }),
        };
        // Without a subscriber that wants the span, skip the wrapper: instrumenting moves the
        // whole call's state into it, on every call.
        if span.is_disabled() {
            self.drive(&effective, action, completer, prepared).await
        } else {
            self.drive(&effective, action, completer, prepared)
                .instrument(span)
                .await
        }
    }

    async fn drive<T, E, F, Fut>(
        &self,
        effective: &Effective,
        action: F,
        completer: Option<K>,
        prepared: Option<Prepared<S>>,
    ) -> Result<Receipt<T>, Error<E>>
    where
        C: Codec<T>,
        P: OnActionError<C, E>,
        K: Completer,
        F: FnOnce(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let store = self.coordinator.store();
        let op: &Operation = &self.operation;
        let policy = &effective.policy;
        let key = StorageKey::new(op, self.scope.as_deref(), &self.key);
        // Row 31: a claim from a batch stands in for the first `begin` while it is fresh.
        let (owner, mut first) = match prepared {
            None => (OwnerToken::random(), None),
            Some(p) => self.take_prepared(p, &key, policy),
        };
        let req = BeginRequest::new(&key, owner, policy.lease)
            .with_fingerprint(self.fingerprint)
            .with_holder(self.coordinator.holder());
        let mut wait_deadline = None;

        loop {
            // `held`: how long from `started` the owner counts on a reservation this answers,
            // and how long the store may hold it.
            let (begin, started, held) = match first.take() {
                Some(taken) => *taken,
                None => {
                    let started = now();
                    // Review L4: a call dropped while its `begin` is on the wire may leave
                    // a reservation that nobody owns; the guard hands it to the lost-begin
                    // cleanup (row 19) instead of leaving it to its lease.
                    let mut orphan = OrphanGuard {
                        store,
                        req: &req,
                        until: after(started, policy.lease),
                        store_timeout: policy.store_timeout,
                        armed: true,
                    };
                    let begin = bounded(
                        policy.store_timeout,
                        store.call_timeout(),
                        store.begin(&req),
                    )
                    .await;
                    orphan.armed = false;
                    op.metrics().timing(Phase::Begin, started);
                    (begin, started, Held::same(policy.lease))
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
                            // Only for a store that builds the completed record from it
                            // (Redis): an `Arc` clone a call on MemoryStore need not pay.
                            let reservation = store.uses_reservation().then(|| req.reservation());
                            self.run_owned(
                                &key,
                                lease,
                                (started, held),
                                effective,
                                action,
                                reservation,
                            )
                            .await
                        }
                        // Row 30: the caller's transaction completes. Boxed: a rare path.
                        Some(completer) => {
                            Box::pin(self.run_owned_completing(
                                &key,
                                lease,
                                (started, held),
                                effective,
                                action,
                                completer,
                            ))
                            .await
                        }
                    };
                }
                // Row 2: replay.
                Ok(Claim::Replay(completed)) => {
                    op.metrics().hits.increment(1);
                    tracing::debug!(fencing = %completed.fencing, "replaying stored outcome");
                    return self.replay(completed);
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
                    holder,
                }) => {
                    // The pointer to the original (issue 52): its attempt and its holder.
                    let in_flight = || Error::InFlight {
                        retry_after: policy.retry_after(lease_left, held_for),
                        lease_left,
                        held_for,
                        attempt: Some(fencing),
                        holder: holder.clone(),
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
                        release_orphan(
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
        prepared: Prepared<S>,
        key: &StorageKey,
        policy: &Policy,
    ) -> (OwnerToken, FirstClaim) {
        let taken = if self.fingerprint.is_some() {
            None
        } else {
            prepared.take_for(key, policy.lease)
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
    async fn run_owned<T, E, F, Fut>(
        &self,
        key: &StorageKey,
        lease: Ownership,
        (reserved_at, held): (tokio::time::Instant, Held),
        effective: &Effective,
        action: F,
        reservation: Option<Reservation>,
    ) -> Result<Receipt<T>, Error<E>>
    where
        C: Codec<T>,
        P: OnActionError<C, E>,
        F: FnOnce(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let op: &Operation = &self.operation;
        let policy = &effective.policy;
        let state = std::sync::Arc::new(LeaseState::reserved(reserved_at, held));
        let keeper = self.keeper(key, lease, reserved_at, policy, &state);
        let work = async {
            // Created before anything can be dropped mid-way: from here on a dropped call
            // leaves the key to its lease (or releases it, `OnCancel::Release`), or stores the
            // outcome once the action succeeded.
            let mut guard = self.guard(key, lease);
            let started = op.metrics().start();
            let attempt = Attempt {
                fencing: Some(lease.fencing),
                lease: Some(state.clone()),
                downstream: Some(self.downstream(key)),
            };
            let result = match unwind::catch(action(attempt)).await {
                Ok(result) => result,
                Err(panic) => {
                    // A panic is a failed action: release the key (its retry runs at once,
                    // as after an error), then let the panic go on to the caller.
                    guard.pending = Pending::Done;
                    tracing::warn!(operation = %op, key = %self.key,
                        panic = unwind::message(&*panic), "the action panicked; releasing its key");
                    Box::pin(self.release(key, &lease, policy)).await;
                    std::panic::resume_unwind(panic);
                }
            };
            op.metrics().timing(Phase::Action, started);
            let (completion, answer) = match self.after_action(result, &lease, effective) {
                AfterAction::Store(completion, answer) => {
                    (completion.with_reservation(reservation), answer)
                }
                AfterAction::Release(e) => {
                    guard.pending = Pending::Done;
                    // Boxed: only a failed action takes this path.
                    Box::pin(self.release(key, &lease, policy)).await;
                    return Err(Error::Action(e));
                }
            };
            // A test's crash point: the effect happened, nothing is stored yet.
            crate::fault::hit(crate::fault::FaultPoint::AfterAction);
            let stored = keeper.complete(guard.completing(completion)).await;
            guard.pending = Pending::Done;
            match answer {
                Ok(receipt) => Ok(receipt.with_stored(stored)),
                Err(e) if stored => Err(Error::ActionStored(e)),
                // A permanent error that was not stored: the key expires with its lease,
                // and a retry runs the action again.
                Err(e) => Err(Error::Action(e)),
            }
        };
        keeper.keep_while(std::pin::pin!(work)).await
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

    pub(super) async fn release(&self, key: &StorageKey, lease: &Ownership, policy: &Policy) {
        let store = self.coordinator.store();
        let started = self.operation.metrics().start();
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
