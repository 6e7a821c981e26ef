//! Completion elsewhere: a call whose result is stored by a [`Completer`] (inside the caller's
//! own database transaction) instead of by [`Store::complete`]. ARCHITECTURE.md row 30.

use std::future::Future;
use std::sync::Arc;

use super::call::{Attempt, Call, Receipt};
use super::drive::{AfterAction, Effective};
use super::errors::ErrorPolicy;
use super::lease::{LeaseState, Pending, after, bounded};
use crate::StorageKey;
use crate::clock::now;
use crate::codec::Codec;
use crate::error::{Error, Phase};
use crate::store::{CompleteRequest, Ownership, Store, StoreError};

/// Stores a call's result in place of [`Store::complete`]: for a store that can write the
/// completion inside the caller's own transaction, so that the record and the action's
/// database effect commit or roll back together (idemkit-postgres's transactional call).
///
/// Used with [`Call::run_completing`]. The reservation is made and renewed through the store
/// as usual (so a concurrent duplicate sees it in flight); once the action has returned,
/// renewals stop and `complete` is called once (no retries: a failed statement ends a
/// transaction). A failed completion fails the call with
/// [`Error::Store`] (phase `Complete`): the completer's side must then not commit the effect.
/// A call dropped during the action leaves its reservation to its lease (or releases it,
/// under [`OnCancel::Release`](crate::OnCancel::Release)); one dropped during the completion
/// leaves it to the completer's transaction (committed: completed; rolled back: the
/// reservation ends with its lease).
///
/// # Example
///
/// ```
/// use idemkit_core::*;
///
/// /// Completes through the store itself: what `run` does, without its retries.
/// struct Direct(MemoryStore);
///
/// impl Completer for Direct {
///     async fn complete(&mut self, key: &StorageKey, ownership: &Ownership,
///         request: &CompleteRequest) -> Result<(), StoreError> {
///         self.0.complete(key, ownership, request).await
///     }
/// }
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
/// let store = MemoryStore::new();
/// let c = Coordinator::new(store.clone());
/// let (op, key) = (Operation::new("op")?, Key::new("k")?);
/// let out = c.call(&op, &key)
///     .run_completing(Direct(store), |_| async { Ok::<_, std::io::Error>(7) })
///     .await?;
/// assert_eq!(out.source, Source::Fresh);
/// let again = c.call(&op, &key).run(|_| async { Ok::<_, std::io::Error>(8) }).await?;
/// assert_eq!(again.value, 7);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait Completer: Send {
    /// Store `request` for `ownership`, checking (as [`Store::complete`] does) that it still
    /// owns a live reservation.
    fn complete(
        &mut self,
        key: &StorageKey,
        ownership: &Ownership,
        request: &CompleteRequest,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// The completer of an ordinary call: never called (the store completes).
pub(super) enum ByStore {}

impl Completer for ByStore {
    async fn complete(
        &mut self,
        _: &StorageKey,
        _: &Ownership,
        _: &CompleteRequest,
    ) -> Result<(), StoreError> {
        match *self {}
    }
}

impl<S: Store, C> Call<'_, S, C> {
    /// Runs the action as the key's owner with the lease renewed, then completes through
    /// `completer` once, after the renewals stopped.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn run_owned_completing<T, E, F, Fut, P, K>(
        &self,
        key: &StorageKey,
        lease: Ownership,
        reserved_at: tokio::time::Instant,
        effective: &Effective,
        action: F,
        errors: &P,
        mut completer: K,
    ) -> Result<Receipt<T>, Error<E>>
    where
        C: Codec<T>,
        P: ErrorPolicy<C, E>,
        K: Completer,
        F: FnOnce(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let op: &crate::Operation = &self.operation;
        let policy = &effective.policy;
        let state = Arc::new(LeaseState::new(after(reserved_at, policy.lease)));
        let keeper = self.keeper(key, lease, reserved_at, policy, &state);
        let mut guard = self.guard(key, lease);
        let attempt = Attempt {
            fencing: Some(lease.fencing),
            lease: Some(state.clone()),
            downstream: Some(self.downstream(key)),
        };
        let started = now();
        let result = match keeper
            .keep_while(crate::unwind::catch(action(attempt)))
            .await
        {
            Ok(result) => result,
            Err(panic) => {
                // As in `run_owned`: a panic is a failed action, its key released.
                guard.pending = Pending::Done;
                self.release(key, &lease, policy).await;
                std::panic::resume_unwind(panic);
            }
        };
        op.metrics().timing(Phase::Action, started);
        let (completion, answer) = match self.after_action(result, &lease, effective, errors) {
            AfterAction::Store(completion, answer) => (completion, answer),
            AfterAction::Release(e) => {
                guard.pending = Pending::Done;
                self.release(key, &lease, policy).await;
                return Err(Error::Action(e));
            }
        };
        // From here the completion belongs to the completer's transaction: a dropped call
        // must neither release nor complete from outside it.
        guard.pending = Pending::Done;
        let started = now();
        let stored = bounded(
            policy.store_timeout,
            None,
            completer.complete(key, &lease, &completion),
        )
        .await;
        op.metrics().timing(Phase::Complete, started);
        match (stored, answer) {
            (Ok(()), Ok(receipt)) => Ok(receipt),
            (Ok(()), Err(e)) => Err(Error::ActionStored(e)),
            (Err(source), _) => {
                op.metrics().store_error(Phase::Complete);
                if source.is_lease_lost() {
                    op.metrics().lease_lost.increment(1);
                    state.lose();
                }
                tracing::warn!(operation = %op, key = %self.key, error = %source,
                    "completion in the caller's transaction failed; the transaction must roll back");
                Err(Error::Store {
                    phase: Phase::Complete,
                    source,
                })
            }
        }
    }
}
